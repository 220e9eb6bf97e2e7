"""The named operations of the BERT-like families' config tables (``catalogue/bert_config.py``:
ESM-2), each a pair as in ``config_ops.py``: (exporting, importing). Model Zoo (tag
Release_2.10.0, ``src/cerebras/modelzoo/tools/checkpoint_converters/``): ``bert.py``,
``esm2.py``.
"""

from __future__ import annotations

from ckpt_migrate.catalogue.config import CS
from ckpt_migrate.hf.config_ops import Fn, State
from ckpt_migrate.hf.mapping import MappingError


def _esm_heads(s: State) -> None:
    """esm2.py lines 372-375, bert.py lines 864-867: HF's MLM transform is GELU, its pooler
    tanh."""
    for key, wanted in (("mlm_nonlinearity", "gelu"), ("pooler_nonlinearity", "tanh")):
        if s.src.get(key) not in (None, wanted):
            raise MappingError(f"{key}={s.src[key]!r}: only {wanted!r} converts to HF")


def _token_dropout(s: State) -> None:
    """esm2.py lines 478-492: token dropout needs the mask token's id."""
    src = s.src
    missing = src.get("mask_token_id") is None if s.side == CS else src["mask_token_id"] is None
    if src["token_dropout"] and missing:
        raise MappingError("mask_token_id: required when token_dropout is true")


def _esm_rotary_dim(s: State) -> None:
    """esm2.py lines 457-476: a rotary model converts only when ``rotary_dim`` is the head size.
    Ours: an absent ``rotary_dim`` fails too (CS then rotates a quarter of each head,
    bert_model.py lines 293-294, which HF cannot)."""
    cs = s.src
    if cs["position_embedding_type"] != "rotary":
        return
    if cs.get("rotary_dim") != cs["hidden_size"] // cs["num_heads"]:
        raise MappingError(
            f"rotary_dim={cs.get('rotary_dim')!r}: must be hidden_size // num_heads for HF"
        )


def _encoder_nonlinearity(s: State) -> None:
    """bert.py lines 856-859: ``hidden_act`` is the encoder's nonlinearity (ESM's rule only
    asserts gelu, so there is no HF field written back)."""
    s.out["encoder_nonlinearity"] = s.src["hidden_act"]


def _esm_positions_to_hf(s: State) -> None:
    """esm2.py lines 494-569: rotary stays rotary; learned needs
    ``mask_padding_in_positional_embed`` and becomes absolute, whose table HF sizes MSL +
    ``pad_token_id`` + 1."""
    cs = s.src
    kind, msl = cs["position_embedding_type"], cs["max_position_embeddings"]
    if kind == "rotary":
        s.out.update(position_embedding_type="rotary", max_position_embeddings=msl)
        return
    if kind != "learned":
        raise MappingError(f"position_embedding_type={kind!r}: HF ESM has rotary or absolute")
    if cs["mask_padding_in_positional_embed"] is not True:
        raise MappingError(
            "mask_padding_in_positional_embed: must be true for learned positions (HF ESM)"
        )
    table = msl + cs["pad_token_id"] + 1
    s.out.update(position_embedding_type="absolute", max_position_embeddings=table)


def _esm_positions_to_cs(s: State) -> None:
    """esm2.py lines 494-545 and 590-594: absolute positions become ``learned`` with
    ``mask_padding_in_positional_embed`` and a table of ``max_position_embeddings`` -
    ``pad_token_id`` - 1; rotary ones get ``rotary_dim`` = head size."""
    hf = s.src
    kind, table = hf["position_embedding_type"], hf["max_position_embeddings"]
    if kind == "rotary":
        s.out.update(position_embedding_type="rotary", max_position_embeddings=table)
        s.out["rotary_dim"] = hf["hidden_size"] // hf["num_attention_heads"]
    elif kind == "absolute":
        if hf["pad_token_id"] is None:
            raise MappingError("pad_token_id: required to size CS's position table")
        s.out.update(
            position_embedding_type="learned",
            mask_padding_in_positional_embed=True,
            max_position_embeddings=table - hf["pad_token_id"] - 1,
        )
    else:
        raise MappingError(f"position_embedding_type={kind!r}: CS ESM-2 has rotary or learned")


def _rope_theta(s: State, default: float) -> None:
    """``rope_theta`` carried each way as a float (``default`` when absent)."""
    s.out["rope_theta"] = float(s.src.get("rope_theta", default))


OPS: dict[str, tuple[Fn, Fn]] = {
    "esm heads": (_esm_heads, None),
    "token dropout needs a mask token": (_token_dropout, _token_dropout),
    "esm rotary dim": (_esm_rotary_dim, None),
    "esm encoder nonlinearity": (None, _encoder_nonlinearity),
    "esm positions": (_esm_positions_to_hf, _esm_positions_to_cs),
    "rope theta": (_rope_theta, _rope_theta),
}
