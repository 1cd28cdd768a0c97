"""The ``block`` codec (fixed-length bit packing per block of 32 values, CPU and GPU
paths producing the same bytes) and ``int8`` (one byte per value on block's steps).

``codec`` frames the chunks, ``entropy`` is the optional zstd stage over the packed
blocks, ``int8`` the one-byte codec; the kernels (numba, numba.cuda, torch) live in
``kernels/``, the layout they share in ``kernels/layout.py``.
"""

from . import int8  # noqa: F401  (registers the codec)
from .codec import BlockCodec, encode_values, encode_values_into, payload_capacity, steps_for
from .int8 import Int8Codec, int8_decode, int8_encode

__all__ = [
    "BlockCodec",
    "Int8Codec",
    "encode_values",
    "encode_values_into",
    "int8_decode",
    "int8_encode",
    "payload_capacity",
    "steps_for",
]
