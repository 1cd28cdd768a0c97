"""Codecs: error bounds, predictors, quantizers, encoders and their kernels.

Importing this package registers the built-in codecs.
"""

from . import block, lossless, sz  # noqa: F401  (registers the codecs)
from .bounds import ErrorBound
from .registry import Codec, available_codecs, get_codec, register_codec

__all__ = ["Codec", "ErrorBound", "available_codecs", "get_codec", "register_codec"]
