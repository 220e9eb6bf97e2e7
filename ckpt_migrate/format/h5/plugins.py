"""HDF5's filter plugins: none from the environment, and of hdf5plugin's, LZ4 alone.

Checkpoints use one filter plugin, LZ4 (filter 32004, ``boundary.ALLOWED_FILTERS``).
``import hdf5plugin`` loads each filter it ships, twelve shared libraries, and registers them:
5.8 MiB of every command's memory and 9 ms of its start (issue 33). Its LZ4 library is
registered here by itself (0.1 MiB, 0.6 ms) as hdf5plugin's ``register_filter`` does it: the
library loaded, its ``H5PLget_plugin_info`` handed to ``H5Zregister``. Where that cannot be
done (another platform or layout of the package), hdf5plugin is imported as before.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path
from typing import Any

import h5py

LZ4_FILTER_ID = 32004
_LOADED: list[ctypes.CDLL] = []


def forbid_plugin_loading() -> None:
    """Remove every directory from HDF5's filter-plugin search path (set from
    ``HDF5_PLUGIN_PATH`` when the library starts), so that no filter code is ever loaded
    from the environment. Idempotent and cheap."""
    while h5py.h5pl.size():
        h5py.h5pl.remove(0)


def register_lz4() -> None:
    """Register hdf5plugin's LZ4 filter with HDF5, once. The search path is emptied first:
    HDF5 looks there for a filter it lacks."""
    forbid_plugin_loading()
    if _LOADED or _registered_alone():
        return
    import hdf5plugin  # noqa: F401  (registers every filter it ships)


def lz4_options() -> dict[str, Any]:
    """Dataset-creation options of the real writers: hdf5plugin's ``LZ4()``, cd_values (0,)."""
    return {"compression": LZ4_FILTER_ID, "compression_opts": (0,)}


def _registered_alone() -> bool:
    spec = importlib.util.find_spec("hdf5plugin")
    if not sys.platform.startswith("linux") or spec is None or not spec.submodule_search_locations:
        return False
    library = Path(spec.submodule_search_locations[0]) / "plugins" / "libh5lz4.so"
    try:
        lib = ctypes.CDLL(str(library))
        init = getattr(lib, "init_filter", None)  # (builds that bind HDF5 at run time)
        if init is not None:
            init.argtypes, init.restype = [ctypes.c_char_p], ctypes.c_int
            if init(h5py.h5z.__file__.encode()) < 0:
                return False
        lib.H5PLget_plugin_info.restype = ctypes.c_void_p
        h5py.h5z.register_filter(lib.H5PLget_plugin_info())
    except (OSError, AttributeError, RuntimeError, ValueError):
        return False
    _LOADED.append(lib)
    return True
