"""The ``zstd`` codec for data that must stay exact: a byte shuffle, then the zstd stage."""

from __future__ import annotations

import numpy as np

from .codec import Codec, deliver
from .registry import register_codec
from .stages import check_level, zstd_compress, zstd_decompress


def byte_shuffle(a: np.ndarray) -> bytes:
    """Bytes of ``a`` grouped by significance (all first bytes, then all second, ...)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.dtype.itemsize == 1:
        return flat.tobytes()
    return flat.view(np.uint8).reshape(-1, flat.dtype.itemsize).T.tobytes()


def byte_unshuffle(raw: bytes, dtype: np.dtype, count: int) -> np.ndarray:
    """Inverse of :func:`byte_shuffle`: a 1-d array of ``count`` elements."""
    dtype = np.dtype(dtype)
    if len(raw) != count * dtype.itemsize:
        raise ValueError(f"expected {count * dtype.itemsize} bytes, found {len(raw)}")
    planes = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, count)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(-1)


@register_codec
class ZstdCodec(Codec):
    """Lossless: byte shuffle (optional) then zstd. Accepts any numeric or bool dtype."""

    name = "zstd"
    lossy = False
    bounded = False
    dtypes = (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )

    def __init__(self, level: int = 3, shuffle: bool = True):
        self.level = check_level(level)
        self.shuffle = bool(shuffle)

    def parameters(self) -> dict:
        return {"level": self.level, "shuffle": self.shuffle}

    def encode(self, chunk, bound=None, threads=1, offset=0) -> bytes:
        raw = byte_shuffle(chunk) if self.shuffle else np.ascontiguousarray(chunk).tobytes()
        return zstd_compress(raw, self.level)

    def decode(self, payload, shape, dtype, bound=None, out=None, threads=1) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        raw = zstd_decompress(payload, count * dtype.itemsize)
        if self.shuffle:
            flat = byte_unshuffle(raw, dtype, count)
        else:
            if len(raw) != count * dtype.itemsize:
                raise ValueError("zstd payload has the wrong size for its chunk")
            flat = np.frombuffer(raw, dtype).copy()
        return deliver(flat, shape, out)
