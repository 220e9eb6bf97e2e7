"""The LZ4 filter registered alone (``format/h5/plugins.py``): files hdf5plugin's own encoder
wrote, as the old writers laid them out (auto-chunked LZ4, bf16 stored as int16), decode
the same in a process that never imports hdf5plugin, and what that process writes, hdf5plugin
reads."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import hdf5plugin
import numpy as np
import xxhash

from ckpt_migrate.format.h5.plugins import LZ4_FILTER_ID, lz4_options

_READER = """
import json, sys
import h5py, numpy as np, xxhash
from ckpt_migrate.format.h5 import plugins
{setup}
from ckpt_migrate.format.h5.io import open_read
with open_read(sys.argv[1]) as f:
    digests = {{n: xxhash.xxh3_64_hexdigest(f[n][()].tobytes()) for n in sorted(f)}}
with h5py.File(sys.argv[2], "w") as f:
    f.create_dataset("w", data=np.arange(5000, dtype=np.float32), chunks=(512,),
                     **plugins.lz4_options())
print(json.dumps({{"hdf5plugin": "hdf5plugin" in sys.modules, "digests": digests,
                  "lz4": bool(h5py.h5z.filter_avail(plugins.LZ4_FILTER_ID))}}))
"""


def _old_writers_file(path):
    """Tensors as the 1.x ``H5Saver`` wrote them (``tests/real_layout.py``): hdf5plugin's
    ``LZ4()``, h5py's own chunking, bf16 bits as int16."""
    rng = np.random.default_rng(33)
    arrays = {
        "model.w": rng.standard_normal((96, 160)).astype(np.float32),
        "model.bf16": rng.integers(-(2**15), 2**15, (300, 70), dtype=np.int16),
        "model.ramp": np.repeat(np.arange(40, dtype=np.float32), 400),  # (compresses)
    }
    with h5py.File(path, "w") as f:
        for name, array in arrays.items():
            f.create_dataset(name, data=array, chunks=True, **hdf5plugin.LZ4())
    return {n: xxhash.xxh3_64_hexdigest(a.tobytes()) for n, a in sorted(arrays.items())}


def _run(tmp_path, setup=""):
    src, out = tmp_path / "old.h5", tmp_path / "ours.h5"
    want = _old_writers_file(src)
    code = _READER.format(setup=setup)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["digests"] == want and seen["lz4"]
    with h5py.File(out, "r") as f:  # (this process: hdf5plugin's own registration)
        dset = f["w"]
        assert dset._filters == {str(LZ4_FILTER_ID): (0,)}
        np.testing.assert_array_equal(dset[()], np.arange(5000, dtype=np.float32))
    return seen


def test_lz4_alone_decodes_and_encodes_as_hdf5plugin_does(tmp_path):
    assert lz4_options() == dict(hdf5plugin.LZ4())
    assert _run(tmp_path)["hdf5plugin"] is False


def test_where_lz4_cannot_be_registered_alone_hdf5plugin_is_imported(tmp_path):
    setup = "plugins._registered_alone = lambda: False"
    assert _run(tmp_path, setup)["hdf5plugin"] is True
