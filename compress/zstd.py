"""zstd, once: every zstd frame tensorpress writes, the ``zstd`` stage and the ``zstd`` codec.

:func:`zstd_compress` and :func:`zstd_decompress` are the one place zstd runs: the ``sz``
payloads, the ``block`` entropy stage, the ``zstd`` stage after any codec, the ``zstd``
codec (a byte shuffle, then zstd, for data that must stay exact) and the activation
store's second stage all write and read their frames here. The bytes of a frame depend
only on the data, the level and whether it carries a checksum.
"""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from .codec import Codec, deliver
from .registry import register_codec
from .stages import Stage, register_stage

# -- frames ----------------------------------------------------------------------------


def check_level(level) -> int:
    """Validate a zstd compression level (an integer in -7..22)."""
    if isinstance(level, bool) or not isinstance(level, int) or not -7 <= level <= 22:
        raise ValueError(f"zstd level must be an integer in -7..22, got {level!r}")
    return level


def zstd_compress(data, level: int = 3, checksum: bool = False) -> bytes:
    """One zstd frame of the bytes-like ``data``; the frame records its decompressed size
    and, with ``checksum``, a checksum of its bytes that :func:`zstd_decompress` checks."""
    return _compressor(level, checksum).compress(data)


def zstd_decompress(data, max_size: int) -> bytes:
    """Inverse of :func:`zstd_compress`; refuses output larger than ``max_size`` bytes.

    A frame's header declares its size, and zstd would allocate that much whatever
    ``max_size`` says: a declared size over ``max_size`` is refused before anything
    is allocated.
    """
    try:
        declared = zstandard.frame_content_size(data)
        if declared > max_size:
            raise ValueError(
                f"corrupted zstd stream: a frame of {declared} bytes where at most "
                f"{max_size} can be"
            )
        return _decompressor().decompress(data, max_output_size=max_size)
    except zstandard.ZstdError as exc:
        raise ValueError(f"corrupted zstd stream: {exc}") from None


_local = threading.local()  # zstd contexts are not shared between threads


def _compressor(level: int, checksum: bool) -> zstandard.ZstdCompressor:
    """This thread's context for ``level``: made once, since making one costs more than
    compressing a small payload."""
    contexts = _local.__dict__.setdefault("compressors", {})
    key = (check_level(level), bool(checksum))
    if key not in contexts:
        contexts[key] = zstandard.ZstdCompressor(level=level, write_checksum=bool(checksum))
    return contexts[key]


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "decompressor"):
        _local.decompressor = zstandard.ZstdDecompressor()
    return _local.decompressor


# -- the stage: zstd after any codec ------------------------------------------------------


@register_stage
class Zstd(Stage):
    """zstd at ``level``; with ``checksum`` each frame carries a checksum of its bytes."""

    name = "zstd"

    def __init__(self, level: int = 3, checksum: bool = False):
        self.level = check_level(level)
        if not isinstance(checksum, bool):
            raise ValueError(f"zstd checksum must be True or False, got {checksum!r}")
        self.checksum = checksum

    def parameters(self) -> dict:
        return {"level": self.level, "checksum": self.checksum}

    def encode(self, data) -> bytes:
        return zstd_compress(data, self.level, self.checksum)

    def decode(self, data, max_size: int) -> bytes:
        return zstd_decompress(data, max_size)


# -- the codec: a byte shuffle, then zstd ---------------------------------------------------


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
