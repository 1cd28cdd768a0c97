"""tensorpress: error-bounded compression of arrays and tensors.

>>> import numpy as np, tensorpress as tp
>>> x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
>>> blob = tp.compress(x, rel=1e-3)
>>> y = tp.decompress(blob)
>>> bool(np.abs(x - y).max() <= tp.info(blob)["bound"]["tolerance"])
True

The public face only: the names below are re-exported from the modules that hold them
(``formats/array_stream.py`` compresses arrays into streams and reads them back).
"""

import sys

from ._util.startup import guard_start

guard_start(__name__)  # the command: Ctrl-C while this imports is one line, not a traceback

from . import compress  # noqa: E402
from ._version import __version__  # noqa: E402
from .compress import ErrorBound, available_codecs, get_codec  # noqa: E402
from .formats import hdf5_filter as hdf5  # noqa: E402  tp.hdf5.filter(abs=...): hdf5plugin's style
from .formats import open_compressed as open  # noqa: A004, E402  (tp.open, as h5py.File reads)
from .formats import zarr_api as zarr  # noqa: E402  tp.zarr.SZ(...): loads zarr on first use
from .formats.array_stream import CallablePackage, decompress, info  # noqa: E402

# `tp.compress(x, rel=1e-3)` is the documented call and `tensorpress.compress` the codecs
# package (`import tensorpress.compress.sz`). A name holds one object, and a function
# bound here would hide the package from `import tensorpress.compress as c` and
# `tensorpress.compress.sz`, so the package itself is made callable (module __class__
# assignment, which Python documents for this): every import order meets the same object.
compress.__class__ = CallablePackage

# `import tensorpress.hdf5` and `from tensorpress.hdf5 import filter` work too (as os.path
# does), without a module file at the package root
sys.modules[__name__ + ".hdf5"] = hdf5
sys.modules[__name__ + ".zarr"] = zarr

__all__ = [
    "ErrorBound",
    "__version__",
    "available_codecs",
    "compress",
    "decompress",
    "get_codec",
    "hdf5",
    "info",
    "open",
    "zarr",
]
