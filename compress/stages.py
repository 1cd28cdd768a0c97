"""Bytes-to-bytes stages: what runs on a codec's chunk payloads after the codec.

A stream is one array-to-bytes codec followed by zero or more stages, as in zarr 3's
codec pipeline: ``get_codec({"id": "block", "abs": 1e-3, "stages": [{"id": "zstd"}]})``
compresses each chunk with ``block`` and its payload with zstd; decoding runs the
stages in reverse, then the codec. A stage's config is its whole identity, as a
codec's is. The one stage today is zstd (the same frames every zstd in tensorpress
writes, :func:`zstd_compress`, which the ``sz`` and ``zstd`` codecs and the activation
store's second stage call too).
"""

from __future__ import annotations

import abc
import threading
from typing import ClassVar

import zstandard

_STAGES: dict[str, type[Stage]] = {}


class Stage(abc.ABC):
    """A bytes-to-bytes transform of chunk payloads; subclasses set ``name``."""

    name: ClassVar[str] = ""

    def parameters(self) -> dict:
        """The stage's own parameters (JSON values), without its id."""
        return {}

    def get_config(self) -> dict:
        return {"id": self.name, **self.parameters()}

    @abc.abstractmethod
    def encode(self, data) -> bytes:
        """The bytes-like ``data`` transformed."""

    @abc.abstractmethod
    def decode(self, data, max_size: int) -> bytes:
        """Inverse of :meth:`encode`; refuses output larger than ``max_size`` bytes."""

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self):
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.parameters().items())
        return f"{type(self).__name__}({params})"


def register_stage(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make ``cls`` findable by its ``name``."""
    if not cls.name or _STAGES.get(cls.name, cls) is not cls:
        raise ValueError(f"stage name {cls.name!r} is empty or already registered")
    _STAGES[cls.name] = cls
    return cls


def get_stage(spec) -> Stage:
    """A stage from a name, a config dict or a stage instance."""
    if isinstance(spec, Stage):
        return spec
    if isinstance(spec, str):
        spec = {"id": spec}
    if not isinstance(spec, dict) or spec.get("id") not in _STAGES:
        raise ValueError(
            f"unknown stage {spec!r}; a stage is one of {sorted(_STAGES)} (a name or a "
            "config dict such as {'id': 'zstd', 'level': 3})"
        )
    params = {k: v for k, v in spec.items() if k != "id"}
    try:
        return _STAGES[spec["id"]](**params)
    except TypeError as exc:
        raise ValueError(f"invalid config for stage {spec['id']!r}: {exc}") from None


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


# -- zstd: every zstd frame tensorpress writes ----------------------------------------


def check_level(level) -> int:
    """Validate a zstd compression level (an integer in -7..22)."""
    if isinstance(level, bool) or not isinstance(level, int) or not -7 <= level <= 22:
        raise ValueError(f"zstd level must be an integer in -7..22, got {level!r}")
    return level


def zstd_compress(data, level: int = 3, checksum: bool = False) -> bytes:
    """One zstd frame of the bytes-like ``data``; the frame records its decompressed size
    and, with ``checksum``, a checksum of its bytes that :func:`zstd_decompress` checks.

    This is the one zstd stage of tensorpress: the ``sz`` payloads, the ``zstd`` codec
    and the activation store's second stage all write their frames here. The bytes
    depend only on ``data``, ``level`` and ``checksum``.
    """
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
