"""Codecs: error bounds, predictors, quantizers, encoders and their kernels.

Importing this package registers the built-in codecs.
"""

from . import block, quant, sz, zstd  # noqa: F401  (registers the codecs)
from .bounds import ErrorBound
from .codec import Codec
from .registry import available_codecs, get_codec, register_codec

__all__ = [
    "Codec",
    "CompressedTensor",
    "ErrorBound",
    "available_codecs",
    "compress_tensor",
    "decompress_tensor",
    "get_codec",
    "register_codec",
]

_TENSOR_API = ("CompressedTensor", "compress_tensor", "decompress_tensor")


def __getattr__(name):  # the tensor API imports torch: only on first use
    if name in _TENSOR_API:
        from . import tensor

        return getattr(tensor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
