"""Downgrades (issue #20): ``upgrade --to`` an older release walks the hops backwards, as Model
Zoo's bidirectional CS <-> CS converters do, and refuses where information would be lost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import one_line_error, release_of, run_cli

import ckpt_migrate as cm
from ckpt_migrate.cli.commands import verify
from ckpt_migrate.config.upgrade import upgrade_config_text
from ckpt_migrate.engine.upgrade import UpgradeOptions, upgrade
from ckpt_migrate.errors import UnsupportedContentError, UsageError
from ckpt_migrate.format import releases
from ckpt_migrate.format.read import read_checkpoint
from ckpt_migrate.format.tree import DictNode, MemoryData, SeqNode, TensorLeaf, ValueLeaf
from ckpt_migrate.format.write import write_checkpoint
from ckpt_migrate.hops import graph
from ckpt_migrate.models.keys import KeyRename

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "fixtures" / "models"
REAL = ROOT / "fixtures" / "real-cstorch-2.10"


def _upgrade(src: Path, to: str, out: Path) -> Path:
    """The engine in this process (the CLI's own path is tested below, by its messages)."""
    result = upgrade(src, UpgradeOptions(target=to, output_dir=out))
    assert result.status in ("upgraded", "current"), result.error
    return out / src.name


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_a_model_goes_down_to_every_reversible_release_as_the_upgrade_wrote_it(family, tmp_path):
    """2.0 -> 2.10 -> back down to 2.5, 2.4, 2.1 and 2.0: each file equals, leaf for leaf and
    key for key, what upgrading the 2.0 original straight to that release writes (the 2.1 key
    renames undone on the way to 2.0)."""
    src = MODELS / f"{family}-2.0" / "checkpoint_100.mdl"
    newest = _upgrade(src, "2.10", tmp_path / "up")
    for to in ("2.5", "2.4", "2.1", "2.0"):
        down = _upgrade(newest, to, tmp_path / f"down-{to}")
        direct = src if to == "2.0" else _upgrade(src, to, tmp_path / f"direct-{to}")
        assert release_of(down) == to
        result = verify(direct, down)
        assert result["identical"], (to, result["differences"][:5])
        assert result["tensors_compared"] > 40


def test_the_2_1_renames_are_undone_with_the_report_naming_each(tmp_path):
    src = MODELS / "t5-2.0" / "checkpoint_100.mdl"
    newest = _upgrade(src, "2.10", tmp_path / "up")
    proc = run_cli("upgrade", newest, "--to", "2.0", "--output-dir", tmp_path / "d", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hops"][0] == "2.10→2.9" and result["hops"][-1] == "2.1→2.0"
    moved = [c for c in result["changes"] if "undoes" in c]
    assert any(
        "encoder_embeddings.position_embed_helper.relative_attention_bias.weight → "
        "model.model.relative_position_encoder.relative_attention_bias.weight" in c
        for c in moved
    ), moved


@pytest.mark.parametrize("name", ["basic", "tied", "nested", "dtypes"])
def test_real_2_10_files_go_down_to_format_0_4_with_ties_kept(name, tmp_path):
    src = REAL / f"{name}.mdl"
    for to in ("2.4", "2.3" if name == "dtypes" else "2.0"):  # (uint16-64: 2.3 and later)
        down = _upgrade(src, to, tmp_path / to)
        assert release_of(down) == to
        result = verify(src, down)
        assert result["identical"], (to, result["differences"][:5])
    if name == "tied":
        with read_checkpoint(tmp_path / "2.0" / src.name) as ckpt, read_checkpoint(src) as orig:
            assert len(ckpt.root.keys()) == len(orig.root.keys())


def test_what_format_0_4_cannot_hold_is_refused_before_writing(tmp_path):
    """An empty key is a leaf name only format 0.5 can store (FORMAT.md): no 0.4 file."""
    src = REAL / "scalars_misc.mdl"
    proc = run_cli("upgrade", src, "--to", "2.4", "--output-dir", tmp_path)
    one_line_error(proc, 2, "empty leaf name", "format 0.4", "2.5 or newer")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("to", ["2.2", "2.0"])
def test_uint16_to_64_tensors_are_refused_below_2_3_whose_torch_lacks_them(to, tmp_path):
    """The real 2.10 writer's uint16/uint32/uint64 tensors: no release before 2.3 runs on a
    torch that has them (Model Zoo pins torch 2.2.1 at Release_2.2.1), so no file is written;
    a dry run says so too."""
    for extra in ((), ("--dry-run",)):
        proc = run_cli("upgrade", REAL / "dtypes.mdl", "--to", to, "-o", tmp_path, *extra)
        words = ("tensor 'uint16' is uint16", f"release {to}'s torch", "release 2.3 or later")
        one_line_error(proc, 2, "dtypes.mdl", *words)
    assert list(tmp_path.iterdir()) == []


def test_no_writer_of_a_release_before_2_3_writes_a_uint16_to_64_tensor(tmp_path):
    """The same fact where a file is written at an old release directly: ``from-torch
    --release``, ``save``."""
    import torch

    state = {"model": {"u": torch.from_numpy(np.arange(3, dtype=np.uint64))}}
    torch.save(state, tmp_path / "u.pt")
    proc = run_cli("from-torch", tmp_path / "u.pt", tmp_path / "u.mdl", "--release", "2.1")
    one_line_error(proc, 2, "tensor 'model.u' is uint64", "release 2.1's torch")
    with pytest.raises(UnsupportedContentError, match=r"release 2\.0's torch does not have"):
        cm.save(state, tmp_path / "v.mdl", "2.0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.pt"]
    cm.save(state, tmp_path / "w.mdl", "2.3")
    assert cm.load(tmp_path / "w.mdl")["model"]["u"].dtype == torch.uint64


def test_a_0_4_file_with_a_uint32_tensor_goes_to_2_3_not_2_2(tmp_path):
    root = DictNode([("model", DictNode([("w", _tensor([1.0])), ("n", _uint32([7, 9]))]))])
    src = tmp_path / "src.mdl"
    write_checkpoint(root, src, "2.4")
    down = _upgrade(src, "2.3", tmp_path / "ok")
    assert verify(src, down)["identical"]
    proc = run_cli("upgrade", src, "--to", "2.2", "--output-dir", tmp_path / "no")
    one_line_error(proc, 2, "tensor 'model.n' is uint32", "int64 for uint32")
    assert not (tmp_path / "no").exists()


def _uint32(values) -> TensorLeaf:
    data = np.asarray(values, dtype=np.uint32)
    return TensorLeaf("uint32", data.shape, MemoryData(data))


def test_a_dry_run_downgrade_shows_the_backward_hops_and_writes_nothing(tmp_path):
    proc = run_cli("upgrade", REAL / "basic.mdl", "--to", "2.3", "-n", "-o", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert "2.10 → 2.3" in proc.stdout + proc.stderr
    assert not (tmp_path / "o" / "basic.mdl").exists()


def test_below_2_0_is_refused_naming_the_hop_and_the_oldest_target(tmp_path):
    proc = run_cli("upgrade", REAL / "basic.mdl", "--to", "1.9", "--output-dir", tmp_path)
    one_line_error(
        proc, 2, "cannot downgrade from 2.10 to 1.9", "2.0 → 1.9", "release 2.0 or a later one"
    )
    assert list(tmp_path.iterdir()) == []


def _tensor(values) -> TensorLeaf:
    data = np.asarray(values, dtype=np.float32)
    return TensorLeaf("float32", data.shape, MemoryData(data))


def test_2_2_sparsity_state_is_not_taken_down_to_2_1(tmp_path):
    """2.1 kept masks with optimizer settings 2.2 dropped: refused, exit 2, nothing written."""
    root = DictNode(
        [
            ("model", DictNode([("w", _tensor([1, 2])), ("w_mask", _tensor([1, 0]))])),
            ("sparsity", DictNode([("step", _tensor(3))])),
            ("global_step", ValueLeaf(3)),
        ]
    )
    src = tmp_path / "sparse.mdl"
    write_checkpoint(root, src, "2.2")
    out = tmp_path / "out"
    proc = run_cli("upgrade", src, "--to", "2.1", "--output-dir", out)
    one_line_error(proc, 2, "cannot downgrade to 2.1", "model.w_mask", "2.2 or later")
    assert not (out / src.name).exists()
    assert release_of(_upgrade(src, "2.2", tmp_path / "same")) == "2.2"  # current: placed


def test_metadata_records_the_older_release(tmp_path):
    """Model Zoo stamps the target in either direction (``update_ckpt_metadata``)."""
    entry = DictNode([("version", ValueLeaf("2.10.0")), ("model_name", ValueLeaf("gpt2"))])
    root = DictNode(
        [
            ("model", DictNode([("w", _tensor([1.0]))])),
            ("__metadata__", SeqNode("list", [entry])),
        ]
    )
    src = tmp_path / "m.mdl"
    write_checkpoint(root, src, "2.10")
    down = _upgrade(src, "2.3", tmp_path / "d")
    with read_checkpoint(down) as ckpt:
        meta = ckpt.root.get("__metadata__")
        assert isinstance(meta, SeqNode)
        versions = [e.get("version").value for e in meta.items]
    assert versions == ["2.10.0", "2.3.0"]


def test_every_reversible_hop_is_reversible_and_the_rest_say_why():
    g = graph.load()
    down = {f"{h.target}→{h.source}" for h in g.hops if h.down_operations is not None}
    assert down == {
        f"{b}→{a}"
        for a, b in zip(
            [r.name for r in releases.RELEASES], [r.name for r in releases.RELEASES][1:]
        )
        if releases.get(a).version >= releases.get("2.0").version
    }
    assert g.oldest_down(releases.get("2.10")) == "2.0"
    one_way = [h for h in g.hops if h.down_operations is None and h.source == "1.9"]
    assert one_way and "dataloader state" in one_way[0].down_refusal


@pytest.mark.parametrize(
    "rule",
    [
        KeyRename("{a,b}.x.weight", "$1.x.embed.weight", ("gpt2",), ""),
        KeyRename("h.#.{q,k}.*", "layers.$1.$3.$2", ("gpt2",), ""),
        KeyRename("p.**", "q.$1", ("gpt2",), ""),
    ],
)
def test_a_rename_rule_and_its_inverse_are_a_round_trip(rule):
    inverse = rule.inverse()
    for key in ("a.x.weight", "model.h.3.k.bias", "p.r.s.t"):
        new = rule.apply(key)
        if new is not None:
            assert inverse.apply(new) == key


def test_config_downgrades_where_each_step_can_be_undone():
    text = (ROOT / "fixtures" / "configs" / "gpt2-2.0.to-2.10.expected.yaml").read_text()
    res = upgrade_config_text(text, "2.10", "2.3", family="gpt2")
    down = yaml.safe_load(res.text)
    up = yaml.safe_load(upgrade_config_text(text, "2.10", "2.10").text)
    model = down["trainer"]["init"]["model"]
    assert "name" not in model
    assert any(c.kind == "removed" and c.key.endswith("model.name") for c in res.report)
    precision = up["trainer"]["init"]["precision"]
    assert model.get("mixed_precision") == precision.get("enabled")
    # every other field is the 2.10 config's, as a 2.3 config
    rest = {k: v for k, v in model.items() if k not in ("mixed_precision", "fp16_type")}
    assert rest == {k: v for k, v in up["trainer"]["init"]["model"].items() if k != "name"}
    with pytest.raises(UsageError, match=r"config from 2\.10 to 2\.2: the 2\.3 → 2\.2"):
        upgrade_config_text(text, "2.10", "2.2", family="gpt2")


def test_a_legacy_layout_config_goes_back_across_the_trainer_layout_unchanged():
    """Model Zoo 2.3.0 shipped its configs in the legacy layout (``params_gpt2_small.yaml``
    there is the 2.2 file's layout): nothing of the trainer layout to undo, yet 2.3 → 2.2
    was refused."""
    text = (ROOT / "fixtures" / "configs" / "modelzoo-gpt2-small-2.2.yaml").read_text()
    res = upgrade_config_text(text, "2.3", "2.2", family="gpt2")
    assert res.text == text
    assert [c.kind for c in res.report] == ["note"] and "legacy layout" in res.report[0].why
    trainer = upgrade_config_text(text, "2.2", "2.3", family="gpt2").text
    with pytest.raises(UsageError, match=r"config from 2\.3 to 2\.2"):
        upgrade_config_text(trainer, "2.3", "2.2", family="gpt2")


def test_upgrade_dir_downgrades_a_directory(tmp_path):
    src = tmp_path / "run"
    src.mkdir()
    shutil.copy(REAL / "basic.mdl", src / "checkpoint_10.mdl")
    proc = run_cli("upgrade-dir", src, "--to", "2.4", "--output-dir", tmp_path / "o", "--json")
    assert proc.returncode == 0, proc.stderr
    assert release_of(tmp_path / "o" / "checkpoint_10.mdl") == "2.4"


def test_check_says_downgrading(tmp_path):
    proc = run_cli("check", REAL / "basic.mdl", "--to", "2.0")
    assert proc.returncode == 10
    assert "2.10 needs downgrading to 2.0" in proc.stdout
