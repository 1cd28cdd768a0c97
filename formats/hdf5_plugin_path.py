"""Where the compiled HDF5 filter plugin is: the folder other programs (h5dump, HDFView,
netCDF-C, C and Fortran codes, h5py without tensorpress) need in ``HDF5_PLUGIN_PATH``.

The plugin (``hdf5_plugin/``, C) is built when tensorpress is installed, where a C
compiler is found; it decodes the codecs :data:`DECODES` names. Nothing here imports
HDF5 or the rest of tensorpress.
"""

from __future__ import annotations

from pathlib import Path

#: the folder to put in ``HDF5_PLUGIN_PATH``
PLUGIN_PATH = str(Path(__file__).resolve().parent / "hdf5_plugin")
#: the shared library HDF5 loads from it
LIBRARY = "libh5tensorpress.so"
#: the filter codecs the plugin decodes today (``sz`` chunks make it fail: HDF5 says so)
DECODES = ("zstd", "block", "int8")
#: what to say where the plugin is missing
NOT_BUILT = (
    "the tensorpress HDF5 plugin was not built (no C compiler when tensorpress was "
    "installed): install cc, gcc or clang and reinstall tensorpress; until then only "
    "Python processes that import tensorpress read its filter datasets"
)


def plugin_library() -> Path | None:
    """The plugin's shared library, or None where it was not built."""
    path = Path(PLUGIN_PATH, LIBRARY)
    return path if path.is_file() else None
