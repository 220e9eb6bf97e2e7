"""TensorFlow saver checkpoints ↔ H5: tensorflow-to-h5 / h5-to-tensorflow (issue 7).

The TensorFlow tests need the ``[tensorflow]`` extra and are skipped without it; the tests at the
end (install hint, --help, size parsing) run everywhere. Checkpoints are made by real TensorFlow:
a small Keras model trained two steps with Adam (one layer in bfloat16) saved with
``tf.train.Checkpoint``, a ``tf.compat.v1`` Saver checkpoint with Adam slots and ``global_step``,
and ``SaveV2`` files with every dtype and edge-case bit patterns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from conftest import REAL, one_line_error, written_to_after
from real_cstorch import real_digest, unavailable_reason

import ckpt_migrate as cm
from ckpt_migrate.errors import CkptError, UnsupportedContentError, UsageError
from ckpt_migrate.tf.from_h5 import h5_to_tf
from ckpt_migrate.tf.saver import INSTALL_HINT, parse_size
from ckpt_migrate.tf.to_h5 import tf_to_h5

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


# --------------------------------------------------------------------------- helpers


def tf_contents(tf, prefix) -> dict:
    """name -> (dtype, shape, exact bytes) of every entry of a TF checkpoint."""
    reader = tf.train.load_checkpoint(str(prefix))
    out = {}
    for name, dtype in reader.get_variable_to_dtype_map().items():
        value = reader.get_tensor(name)
        if dtype == tf.string:
            out[name] = ("string", (), value)
        else:
            a = np.asarray(value)
            out[name] = (dtype.name, a.shape, a.tobytes())
    return out


def run_script(script: str, *args: str, hide_tf: bool = False) -> subprocess.CompletedProcess:
    """A console script (``tensorflow-to-h5``/``h5-to-tensorflow``) or ``ckpt-migrate`` as a
    process; ``hide_tf`` makes ``import tensorflow`` fail as if it were not installed."""
    entry = {
        "tensorflow-to-h5": "from ckpt_migrate.cli.tf import tensorflow_to_h5 as main",
        "h5-to-tensorflow": "from ckpt_migrate.cli.tf import h5_to_tensorflow as main",
        "ckpt-migrate": "from ckpt_migrate.cli.main import main",
    }[script]
    hide = "sys.modules['tensorflow'] = None\n" if hide_tf else ""
    code = f"import sys\n{hide}{entry}\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def save_v2(tf, prefix: Path, tensors: dict) -> str:
    """A checkpoint written directly by TF's SaveV2 op (what every TF saver runs)."""
    names = sorted(tensors)
    tf.raw_ops.SaveV2(
        prefix=str(prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tensors[n] for n in names],
    )
    return str(prefix)


def no_temp_files(directory: Path) -> bool:
    return not any(".tmp" in p.name for p in directory.iterdir())


# --------------------------------------------------------------------------- fixtures


def _keras_model(tf):
    import keras

    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, name="hidden"),
            keras.layers.Dense(2, dtype="bfloat16", name="out"),
        ]
    )
    return model, keras.optimizers.Adam(1e-2)


@pytest.fixture(scope="module")
def keras_ckpt(tf, tmp_path_factory):
    """A Keras model trained two steps with Adam, saved by tf.train.Checkpoint with a step."""
    import keras

    keras.utils.set_random_seed(0)
    model, opt = _keras_model(tf)
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.random((8, 4)), rng.random((8, 2)), epochs=1, batch_size=4, verbose=0)
    step = tf.Variable(7, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, step=step)
    prefix = ckpt.save(str(tmp_path_factory.mktemp("keras") / "ckpt"))
    weights = [w.numpy() for w in model.weights]
    slots = [np.asarray(v) for v in opt.variables]
    return {"prefix": prefix, "weights": weights, "slots": slots}


@pytest.fixture(scope="module")
def v1_ckpt(tf, tmp_path_factory):
    """A tf.compat.v1 Saver checkpoint: Adam slots (``w`` and ``w/Adam``), a bf16 variable and
    ``global_step``, after two training steps."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4])
        w = v1.get_variable("dense/kernel", [4, 3], initializer=v1.glorot_uniform_initializer(1))
        b = v1.get_variable("dense/bias", [3], dtype=tf.bfloat16, initializer=v1.ones_initializer())
        step = v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.matmul(x, w) * tf.cast(b, tf.float32))
        train = v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step, var_list=[w])
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(2):
                sess.run(train, {x: np.ones((2, 4), np.float32)})
            prefix = saver.save(
                sess, str(tmp_path_factory.mktemp("v1") / "model.ckpt"), global_step=step
            )
    return prefix


def _v1_restore(tf, prefix: str) -> dict:
    """Restore ``prefix`` with a fresh tf.compat.v1 graph and Saver; the variables' values."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        w = v1.get_variable("dense/kernel", [4, 3])
        b = v1.get_variable("dense/bias", [3], dtype=tf.bfloat16)
        step = v1.train.get_or_create_global_step()
        v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(w), global_step=step, var_list=[w])
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as sess:
            saver.restore(sess, prefix)
            return {v.op.name: sess.run(v) for v in v1.global_variables()} | {
                "dense/bias": sess.run(b)
            }


# --------------------------------------------------------------------------- round trips


def test_keras_round_trip_is_exact(tf, keras_ckpt, tmp_path):
    h5 = tmp_path / "keras.h5"
    rep = tf_to_h5(keras_ckpt["prefix"], h5, verify="full")
    assert rep.release.name == "2.10" and rep.notes == []
    assert rep.global_step == 7 and rep.global_step_variable == "step/.ATTRIBUTES/VARIABLE_VALUE"
    back = tmp_path / "back" / "ckpt-1"
    back.parent.mkdir()
    out = h5_to_tf(h5, back, verify="full")
    assert [o.prefix for o in out.outputs] == [str(back)] and out.global_step == 7

    original, restored = tf_contents(tf, keras_ckpt["prefix"]), tf_contents(tf, back)
    assert restored == original  # names, dtypes, shapes and every byte, object graph included
    assert {v[0] for v in original.values()} >= {"bfloat16", "float32", "int64", "string"}

    # The object graph came along, so tf.train.Checkpoint restores into a fresh model.
    model, opt = _keras_model(tf)
    opt.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    status = tf.train.Checkpoint(model=model, optimizer=opt, step=step).restore(str(back))
    status.assert_consumed()
    assert int(step.numpy()) == 7
    for want, got in zip(keras_ckpt["weights"], model.weights, strict=True):
        assert want.dtype == got.numpy().dtype and want.tobytes() == got.numpy().tobytes()
    for want, got in zip(keras_ckpt["slots"], opt.variables, strict=True):
        assert want.tobytes() == np.asarray(got).tobytes()
    # the state file beside a single output lets TF find it by directory
    assert out.state_file == str(back.parent / "checkpoint")
    assert tf.train.latest_checkpoint(str(back.parent)) == str(back)


def test_an_object_graph_ending_in_nul_round_trips_and_restores(tf, tmp_path):
    """A ``tf.train.Checkpoint`` whose last object-graph node holds nothing serializes its graph
    ending in ``\\x00``; read through a numpy ``S`` array, the NUL was cut off, and the round
    trip's graph was "corrupt" to TF. The directory's state file names the checkpoint in raw
    UTF-8 (``modèle-1``), which was read as Latin-1 escapes."""

    def net():
        m = tf.Module()
        m.v = tf.Variable([1.0, 2.0])
        m.sub = tf.Module()
        m.sub.deeper = tf.Module()  # a node without values, last in the graph
        return m

    run = tmp_path / "run"
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=net()), str(run), max_to_keep=1, checkpoint_name="modèle"
    )
    prefix = manager.save()
    graph = tf_contents(tf, prefix)[OBJECT_GRAPH][2]
    assert graph.endswith(b"\x00")
    h5 = tmp_path / "x.h5"
    tf_to_h5(prefix, h5, verify="full")
    assert cm.load(h5)[OBJECT_GRAPH] == graph
    back = tmp_path / "back" / "ckpt-1"
    back.parent.mkdir()
    h5_to_tf(h5, back)
    assert tf_contents(tf, back) == tf_contents(tf, prefix)
    fresh = net()
    tf.train.Checkpoint(model=fresh).restore(str(back)).assert_consumed()
    assert fresh.v.numpy().tolist() == [1.0, 2.0]
    by_directory = tmp_path / "y.h5"
    assert tf_to_h5(run, by_directory).sources == [prefix]


def test_keras_h5_is_a_flat_checkpoint_with_exact_names(tf, keras_ckpt, tmp_path):
    import torch

    h5 = tmp_path / "keras.h5"
    tf_to_h5(keras_ckpt["prefix"], h5)
    state = cm.load(h5, objects_mode="data")
    reader = tf.train.load_checkpoint(keras_ckpt["prefix"])
    types = reader.get_variable_to_dtype_map()
    assert list(state) == sorted(types)
    for name, dtype in types.items():
        value = reader.get_tensor(name)
        if dtype == tf.string:
            assert state[name] == value  # bytes, kept exactly
            continue
        t = state[name]
        assert str(t.dtype) == f"torch.{dtype.name}" and tuple(t.shape) == value.shape
        if dtype == tf.bfloat16:
            assert t.view(torch.int16).numpy().tobytes() == value.view(np.int16).tobytes()
        else:
            assert t.numpy().tobytes() == np.asarray(value).tobytes()
    with cm.read_checkpoint(h5) as ckpt:
        assert ckpt.format == 0.5
        (record,) = ckpt.provenance
        assert record["conversion"] == "tensorflow-to-h5" and record["global_step"] == 7


def test_v1_saver_round_trip_keeps_slots_and_global_step(tf, v1_ckpt, tmp_path):
    h5 = tmp_path / "v1.h5"
    rep = tf_to_h5(v1_ckpt, h5)
    # "dense/kernel" and "dense/kernel/Adam" cannot both be 0.5 dataset names: auto picks 0.4
    assert rep.release.name == "2.4" and "dense/kernel" in rep.notes[0]
    assert rep.global_step == 2 and rep.global_step_variable == "global_step"
    state = cm.load(h5)
    assert {"dense/kernel", "dense/kernel/Adam", "dense/kernel/Adam_1", "global_step"} <= set(state)
    assert int(state["global_step"]) == 2

    back = tmp_path / "back.ckpt"
    h5_to_tf(h5, back, verify="full")
    assert tf_contents(tf, back) == tf_contents(tf, v1_ckpt)
    restored, original = _v1_restore(tf, str(back)), _v1_restore(tf, v1_ckpt)
    assert restored.keys() == original.keys() and "global_step" in restored
    for name, value in original.items():
        assert np.asarray(value).tobytes() == np.asarray(restored[name]).tobytes(), name


def test_v1_names_refused_for_an_explicit_05_release(tf, v1_ckpt, tmp_path):
    with pytest.raises(UnsupportedContentError, match=r"--release 2\.4"):
        tf_to_h5(v1_ckpt, tmp_path / "v1.h5", release="2.10")
    assert not (tmp_path / "v1.h5").exists() and no_temp_files(tmp_path)


def test_every_dtype_and_bit_pattern_survives(tf, tmp_path):
    import ml_dtypes
    import torch

    bf16_bits = np.array(
        [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001, 0x3F80, 0xC2F7], np.uint16
    )
    f32 = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, 3.4e38], np.float32)
    f32_nan = np.array([0x7FC00001, 0xFFBFFFFF], np.uint32).view(np.float32)  # NaN payloads
    values = {
        "b/bf16": bf16_bits.view(ml_dtypes.bfloat16).reshape(2, 4),
        "f/f16": np.array([0.5, -0.0, np.inf, 6.1e-5], np.float16),
        "f/f32": np.concatenate([f32, f32_nan]),
        "f/f64": np.array([[np.pi, -1e-308], [np.nan, 2.0]], np.float64),
        "i/i8": np.array([-128, 127], np.int8),
        "i/i16": np.array([-(2**15), 2**15 - 1], np.int16),
        "i/i32": np.array([[-(2**31)], [2**31 - 1]], np.int32),
        "i/i64": np.array(-(2**63), np.int64),
        "u/u8": np.array([0, 255], np.uint8),
        "u/u16": np.array([0, 2**16 - 1], np.uint16),
        "u/u32": np.array([0, 2**32 - 1], np.uint32),
        "u/u64": np.array([0, 2**64 - 1], np.uint64),
        "z/bool": np.array([[True, False, True]]),
        "z/empty": np.zeros((0, 3), np.float32),
        "z/text": np.array(b"\x00\xffbytes, not text"),
    }
    src = save_v2(tf, tmp_path / "all", {k: tf.constant(v) for k, v in values.items()})
    h5 = tmp_path / "all.h5"
    tf_to_h5(src, h5, verify="full")
    back = tmp_path / "back"
    h5_to_tf(h5, back, verify="full", max_shard_bytes=8)  # shards of 8 bytes: most get sliced
    assert tf_contents(tf, back) == tf_contents(tf, src)
    state = cm.load(h5, objects_mode="data")
    assert str(state["b/bf16"].dtype) == "torch.bfloat16"
    bits = state["b/bf16"].view(torch.int16).numpy().view(np.uint16)
    assert bits.ravel().tolist() == bf16_bits.tolist()
    assert state["z/text"] == b"\x00\xffbytes, not text"


def test_legacy_release_output_round_trips(tf, keras_ckpt, tmp_path):
    h5 = tmp_path / "keras-2.0.h5"
    rep = tf_to_h5(keras_ckpt["prefix"], h5, release="2.0")
    assert rep.release.name == "2.0"
    with cm.read_checkpoint(h5) as ckpt:
        assert ckpt.format == 0.4
    h5_to_tf(h5, tmp_path / "back")
    assert tf_contents(tf, tmp_path / "back") == tf_contents(tf, keras_ckpt["prefix"])


# --------------------------------------------------------------------------- sharding


def test_max_shard_size_splits_into_data_files_and_slices(tf, tmp_path):
    rng = np.random.default_rng(1)
    values = {
        "big/kernel": rng.standard_normal((1000, 64)).astype(np.float32),  # 256,000 bytes
        "mid/kernel": rng.standard_normal((100, 100)).astype(np.float32),  # 40,000 bytes
        "small/bias": rng.standard_normal(7).astype(np.float32),
        "global_step": np.array(12, np.int64),
    }
    src = save_v2(tf, tmp_path / "src", {k: tf.constant(v) for k, v in values.items()})
    h5 = tmp_path / "src.h5"
    tf_to_h5(src, h5)
    back = tmp_path / "back"
    rep = h5_to_tf(h5, back, max_shard_bytes="50KB", verify="full")
    (out,) = rep.outputs
    assert out.sliced == ["big/kernel"] and out.data_files == len(
        list(tmp_path.glob("back.data-*"))
    )
    assert out.data_files >= 6
    for data in tmp_path.glob("back.data-*"):
        assert data.stat().st_size <= 50_000 + 4096  # the shard bound, plus TF's framing
    assert tf_contents(tf, back) == tf_contents(tf, src)
    assert rep.global_step == 12
    (t,) = tf.raw_ops.RestoreV2(  # what tf.train.Checkpoint.restore runs: reassembles slices
        prefix=str(back), tensor_names=["big/kernel"], shape_and_slices=[""], dtypes=[tf.float32]
    )
    assert t.numpy().tobytes() == values["big/kernel"].tobytes()


def test_shard_by_prefixes_and_regex_then_merge_back(tf, keras_ckpt, tmp_path):
    h5 = tmp_path / "keras.h5"
    tf_to_h5(keras_ckpt["prefix"], h5)
    rep = h5_to_tf(h5, tmp_path / "p", shard_by=["optimizer/_variables/", "optimizer/"])
    prefixes = [o.prefix for o in rep.outputs]
    assert prefixes == [str(tmp_path / f"p-{x}") for x in ("optimizer__variables", "optimizer")] + [
        str(tmp_path / "p-rest")
    ]
    assert rep.state_file is None  # several checkpoints: no single "latest"
    parts = [tf_contents(tf, p) for p in prefixes]
    original = tf_contents(tf, keras_ckpt["prefix"])
    assert sum(len(p) for p in parts) == len(original)
    merged = {k: v for p in parts for k, v in p.items()}
    assert merged == original
    assert all(n.startswith("optimizer/_variables/") for n in parts[0])
    assert OBJECT_GRAPH in parts[2]

    # tensorflow-to-h5 takes the pieces back into one H5 with the same contents
    again = tmp_path / "again.h5"
    tf_to_h5(prefixes, again)
    h5_back = tmp_path / "again"
    h5_to_tf(again, h5_back)
    assert tf_contents(tf, h5_back) == original

    rx = h5_to_tf(h5, tmp_path / "r", shard_by=[r"re:^optimizer/_(\w+)/"])
    labels = [Path(o.prefix).name for o in rx.outputs]
    kinds = ["iterations", "learning_rate", "trainable_variables", "variables", "rest"]
    assert labels == [f"r-{k}" for k in kinds]

    with pytest.raises(UsageError, match="matches no variable"):
        h5_to_tf(h5, tmp_path / "none", shard_by=["model/"])
    with pytest.raises(UsageError, match="not both"):
        h5_to_tf(h5, tmp_path / "none", shard_by=["a/", "re:b"])
    assert not list(tmp_path.glob("none*"))


# --------------------------------------------------------------------------- safety and refusals


def test_targets_are_never_overwritten_and_failures_leave_nothing(
    tf, keras_ckpt, tmp_path, monkeypatch
):
    h5 = tmp_path / "keras.h5"
    tf_to_h5(keras_ckpt["prefix"], h5)
    with pytest.raises(UsageError, match="already exists"):
        tf_to_h5(keras_ckpt["prefix"], h5)
    h5_to_tf(h5, tmp_path / "out")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UsageError, match="already exists"):
        h5_to_tf(h5, tmp_path / "out")

    # a stray data file of a crashed foreign run also counts as "exists"
    (tmp_path / "stray.data-00000-of-00001").write_bytes(b"x")
    with pytest.raises(UsageError, match="already exists"):
        h5_to_tf(h5, tmp_path / "stray")

    # A failure half-way (the second SaveV2 call) leaves no output and no temporary files.
    real = tf.raw_ops.SaveV2
    calls = []

    def failing(**kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return real(**kwargs)

    monkeypatch.setattr(tf.raw_ops, "SaveV2", failing)
    with pytest.raises(CkptError, match="no space left"):
        h5_to_tf(h5, tmp_path / "crash", max_shard_bytes=64)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [*before, "stray.data-00000-of-00001"]
    assert no_temp_files(tmp_path)


def test_an_h5_on_a_full_disk_is_one_line(tf, tmp_path, small_disk):
    """``tf-to-h5`` writes its H5 as ``save`` does: the room taken before HDF5 writes a byte,
    so a full disk is one line, exit 5, and nothing on it (HDF5 meeting it part way through
    the tensors crashed the process at exit, 139)."""
    weights = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    prefix = save_v2(tf, tmp_path / "model.ckpt", {"dense/kernel": tf.constant(weights)})
    disk = small_disk(1 << 20)
    proc = run_script("ckpt-migrate", "tf-to-h5", prefix, str(disk / "model.h5"))
    one_line_error(proc, 5, "no space left on the device")
    assert list(disk.iterdir()) == []


def test_unconvertible_values_are_refused_or_excluded_never_dropped(tf, tmp_path):
    src = save_v2(
        tf,
        tmp_path / "odd",
        {
            "w": tf.constant(np.ones(3, np.float32)),
            "c": tf.constant(np.array([1 + 2j], np.complex64)),
            "names": tf.constant([b"a", b"b"]),
        },
    )
    with pytest.raises(UnsupportedContentError) as err:
        tf_to_h5(src, tmp_path / "odd.h5")
    assert "c (complex64)" in str(err.value) and "names (string[2])" in str(err.value)
    assert "--exclude" in str(err.value) and not (tmp_path / "odd.h5").exists()
    rep = tf_to_h5(src, tmp_path / "odd.h5", exclude=["^c$", "^names$"])
    assert rep.excluded == ["c", "names"] and rep.variables == 1
    assert list(cm.load(tmp_path / "odd.h5")) == ["w"]


def test_a_variable_no_format_can_name_is_refused_in_one_line(tf, tmp_path):
    """A variable named '.' (a TF1 ``Saver`` with ``{".": v}`` writes one): auto saw that 0.5
    cannot hold it, fell back to 2.4, whose quoting keeps '.', and ended in h5py's "name
    already exists" as an "internal error" (exit 1). Both formats are tried before anything
    is written, and the refusal names the checkpoint read and an option that leaves it out."""
    src = save_v2(tf, tmp_path / "dot", {".": tf.constant([1.0]), "w": tf.constant([2.0])})
    proc = run_script("ckpt-migrate", "tf-to-h5", src, str(tmp_path / "dot.h5"))
    line = one_line_error(proc, 2, f"{src}: format 0.5 cannot", "'.'", "format 0.4", "--exclude")
    assert "dot.h5" not in line and not (tmp_path / "dot.h5").exists()
    assert no_temp_files(tmp_path)
    assert tf_to_h5(src, tmp_path / "dot.h5", exclude=[r"^\.$"]).variables == 1


@pytest.mark.parametrize("release", ["1.7", "1.8"])
def test_an_object_graph_refused_by_an_old_release_names_the_source_and_a_fix(
    tf, keras_ckpt, tmp_path, release
):
    """Formats 0.1 and 0.2 hold no pickled object: the refusal of the object graph named the
    H5 being written, not the TF checkpoint, and gave no fix."""
    src, out = keras_ckpt["prefix"], tmp_path / "old.h5"
    proc = run_script("ckpt-migrate", "tf-to-h5", src, str(out), "--release", release)
    words = f"{src}: leaf '{OBJECT_GRAPH}' is a pickled object"
    line = one_line_error(proc, 2, words, "--exclude", "newer --release")
    assert "old.h5" not in line and not out.exists() and no_temp_files(tmp_path)


def test_any_cerebras_checkpoint_converts_under_its_leaf_names(tf, tmp_path):
    from ckpt_migrate.format.tree import TensorLeaf, iter_leaves

    # ties: every name gets its own copy of the data
    rep = h5_to_tf(REAL / "tied.mdl", tmp_path / "tied")
    assert any("copies.0 is tied to model.embed.weight" in n for n in rep.notes)
    contents = tf_contents(tf, tmp_path / "tied")
    with cm.read_checkpoint(REAL / "tied.mdl") as ckpt:
        refs = list(iter_leaves(ckpt.root))
        assert sorted(contents) == sorted(r.name for r in refs)
        for r in refs:
            assert isinstance(r.leaf, TensorLeaf)
            assert contents[r.name][2] == np.ascontiguousarray(r.leaf.data.read()).tobytes()

    # None, an int beyond 64 bits and an empty name cannot be TF variables: refused by name...
    with pytest.raises(UnsupportedContentError) as err:
        h5_to_tf(REAL / "scalars_misc.mdl", tmp_path / "s")
    for what in ("none (None)", "huge_int (int 1180591620717411303424 beyond 64 bits)", "<root>"):
        assert what in str(err.value)
    # ...and converted once left out on purpose; Python scalars become 0-d tensors
    rep = h5_to_tf(
        REAL / "scalars_misc.mdl", tmp_path / "s", exclude=["^none$", "^huge_int$", "^$"]
    )
    assert rep.excluded == ["none", "huge_int", ""]
    got = tf_contents(tf, tmp_path / "s")
    assert got["int"] == ("int64", (), np.int64(42).tobytes())
    assert got["neg_zero"] == ("float64", (), np.float64(-0.0).tobytes())
    assert got["true"] == ("bool", (), np.True_.tobytes())
    assert got["unicode_str"] == ("string", (), "значение ✓ 日本".encode())
    assert got["key/with/slash"][:2] == ("float32", (2,))


# --------------------------------------------------------------------------- the command line


def test_cli_round_trip_and_json(tf, keras_ckpt, tmp_path):
    h5 = tmp_path / "k.h5"
    proc = run_script("tensorflow-to-h5", str(Path(keras_ckpt["prefix"]).parent), str(h5))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and "release 2.10" in proc.stdout and "global step 7" in proc.stdout
    proc = run_script("ckpt-migrate", "h5-to-tf", str(h5), str(tmp_path / "b"), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["outputs"][0]["prefix"] == str(tmp_path / "b") and data["global_step"] == 7
    proc = run_script(
        "h5-to-tensorflow",
        str(h5),
        str(tmp_path / "c"),
        "--shard-by",
        "optimizer/",
        "--verify",
        "full",
    )
    assert proc.returncode == 0, proc.stderr
    assert "c-optimizer [optimizer/]" in proc.stdout and "c-rest" in proc.stdout
    proc = run_script("ckpt-migrate", "tf-to-h5", str(tmp_path / "b"), str(tmp_path / "k2.h5"))
    assert proc.returncode == 0, proc.stderr
    assert tf_contents(tf, tmp_path / "b") == tf_contents(tf, keras_ckpt["prefix"])


def test_cli_errors_are_one_line(tf, tmp_path):
    missing = run_script("tensorflow-to-h5", str(tmp_path / "nope"), str(tmp_path / "x.h5"))
    one_line_error(missing, 2, "nope", "no TensorFlow checkpoint", "prefix")

    (tmp_path / "junk.index").write_bytes(b"this is not a checkpoint index" * 3)
    junk = run_script("tensorflow-to-h5", str(tmp_path / "junk"), str(tmp_path / "x.h5"))
    one_line_error(junk, 2, "junk.index", "not a TensorFlow checkpoint")

    h5_given = run_script("tensorflow-to-h5", str(REAL / "basic.mdl"), str(tmp_path / "x.h5"))
    one_line_error(h5_given, 2, "HDF5", "h5-to-tensorflow")

    (tmp_path / "notes.txt").write_text("hello")
    text = run_script(
        "ckpt-migrate", "tf-to-h5", str(tmp_path / "notes.txt"), str(tmp_path / "x.h5")
    )
    one_line_error(text, 2, "notes.txt", "not a readable TensorFlow checkpoint")

    src = save_v2(tf, tmp_path / "cplx", {"c": tf.constant(np.array([1j], np.complex128))})
    dtype = run_script("tensorflow-to-h5", src, str(tmp_path / "x.h5"))
    one_line_error(dtype, 2, "c (complex128)", "--exclude")

    not_h5 = run_script("h5-to-tensorflow", str(tmp_path / "notes.txt"), str(tmp_path / "o"))
    one_line_error(not_h5, 2, "notes.txt", "not an HDF5 file")

    size = run_script("h5-to-tensorflow", str(REAL / "basic.mdl"), "o", "--max-shard-size", "big")
    one_line_error(size, 2, "--max-shard-size")
    assert not (tmp_path / "x.h5").exists() and no_temp_files(tmp_path)


# --------------------------------------------------------------------------- the real library


def test_real_cstorch_loads_the_h5_we_write(tf, keras_ckpt, v1_ckpt, tmp_path):
    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    from digest import digest

    files = [tmp_path / "keras.h5", tmp_path / "v1.h5"]
    tf_to_h5(keras_ckpt["prefix"], files[0])  # format 0.5
    tf_to_h5(v1_ckpt, files[1])  # format 0.4 (TF1 slot names)
    results = real_digest(files)
    for path in files:
        result = results[path]
        assert result["ok"], result
        assert result["digest"] == digest(cm.load(path, objects_mode="data")), path


# --------------------------------------------------------------------------- without TensorFlow


@pytest.mark.parametrize(
    "script, args",
    [
        ("tensorflow-to-h5", ["some/model.ckpt", "out.h5"]),
        ("h5-to-tensorflow", [str(REAL / "basic.mdl"), "out"]),
        ("ckpt-migrate", ["tf-to-h5", "some/model.ckpt", "out.h5"]),
        ("ckpt-migrate", ["h5-to-tf", str(REAL / "basic.mdl"), "out"]),
    ],
)
def test_without_tensorflow_the_commands_say_how_to_install_it(script, args, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nsys.modules['tensorflow'] = None\n"
            + {
                "tensorflow-to-h5": "from ckpt_migrate.cli.tf import tensorflow_to_h5 as main",
                "h5-to-tensorflow": "from ckpt_migrate.cli.tf import h5_to_tensorflow as main",
                "ckpt-migrate": "from ckpt_migrate.cli.main import main",
            }[script]
            + f"\nsys.exit(main({args!r}))",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    one_line_error(proc, 2, "TensorFlow", "not installed", INSTALL_HINT)
    assert list(tmp_path.iterdir()) == []


def test_help_and_import_never_load_tensorflow():
    code = (
        "import sys\nimport ckpt_migrate\nckpt_migrate.tf_to_h5, ckpt_migrate.h5_to_tf\n"
        "from ckpt_migrate.cli.main import main\nfrom ckpt_migrate.cli.tf import tensorflow_to_h5\n"
        "for argv in (['--help'], ['tf-to-h5', '--help'], ['h5-to-tf', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "try:\n    tensorflow_to_h5(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED' if {'tensorflow', 'torch'} & set(sys.modules) else 'CLEAN')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().endswith("CLEAN"), out.stdout + out.stderr
    assert "tf-to-h5" in out.stdout and "h5-to-tf" in out.stdout
    assert "usage: tensorflow-to-h5 [-h]" in out.stdout and "saver_path" in out.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="the [tensorflow] extra: without it the missing TensorFlow is said first "
    "(test_without_tensorflow_the_commands_say_how_to_install_it)",
)
def test_refusals_of_the_inputs_come_before_tensorflow_is_loaded(tmp_path):
    """Installed, TensorFlow is imported (3-5 s) only once the inputs are known to be good."""
    code = (
        "import sys\nimport ckpt_migrate as cm\nfrom ckpt_migrate.errors import CkptError\n"
        f"for call in (lambda: cm.tf_to_h5({str(tmp_path / 'nope')!r}, 'x.h5'),\n"
        f"             lambda: cm.h5_to_tf({str(tmp_path / 'notes.txt')!r}, 'o')):\n"
        "    try:\n        call()\n    except CkptError as exc:\n        print(exc)\n"
        "print('LOADED' if 'tensorflow' in sys.modules else 'CLEAN')"
    )
    (tmp_path / "notes.txt").write_text("hello")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert lines[-1] == "CLEAN", out.stdout + out.stderr
    assert "no TensorFlow checkpoint here" in lines[0] and "not an HDF5 file" in lines[1]


def test_parse_size():
    assert parse_size("4096") == 4096
    assert parse_size("256MB") == parse_size("256M") == 256_000_000
    assert parse_size("1GiB") == 1 << 30 and parse_size("1.5kib") == 1536
    assert parse_size(17) == 17
    for bad in ("", "big", "-1", "0", "1XB"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_sources_written_to_while_they_are_converted_publish_nothing(
    tf, keras_ckpt, tmp_path, monkeypatch
):
    """Both converters read the variables as they write them: a job writing over the source
    meanwhile gave an output of parts of two versions. A Keras model saved by TensorFlow, and
    the real 2.10 library's file, each written to (its modification time moved) before the
    output is published."""
    import shutil

    from ckpt_migrate.errors import VerificationError
    from ckpt_migrate.tf import from_h5, to_h5

    prefix = Path(keras_ckpt["prefix"])
    saver = tmp_path / "saver"
    saver.mkdir()
    for f in prefix.parent.glob(prefix.name + ".*"):
        shutil.copyfile(f, saver / f.name)
    (data,) = saver.glob("*.data-*")
    written_to_after(monkeypatch, to_h5, "check_written", data)
    with pytest.raises(VerificationError, match="was written to while it was read"):
        tf_to_h5([saver / prefix.name], tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists()

    src = tmp_path / "basic.mdl"
    shutil.copyfile(REAL / "basic.mdl", src)
    written_to_after(monkeypatch, from_h5, "stage", src)
    with pytest.raises(VerificationError, match="was written to while it was read"):
        h5_to_tf(src, tmp_path / "tf", exclude=["none_val"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic.mdl", "saver"]
