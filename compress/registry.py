"""The codec interface and the one registry every part of tensorpress uses.

A codec turns one chunk (a C-contiguous numpy array) into bytes and back. Its
identity is its config: ``get_config()`` returns JSON values including
``"id"`` (the codec's name), and ``get_codec(config)`` rebuilds an equal
codec. Shape, dtype, chunking and checksums are the container's business.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from .bounds import ErrorBound

_REGISTRY: dict[str, type[Codec]] = {}


class Codec:
    """Base class: subclasses set ``name``, ``lossy`` and implement encode/decode."""

    name: ClassVar[str] = ""
    #: whether decoding may return values other than the input
    lossy: ClassVar[bool] = True
    #: whether the codec takes an error bound (abs/rel/pw_rel); lossless codecs
    #: and bits-bounded quantizers take none
    bounded: ClassVar[bool] = True
    #: dtypes the codec accepts
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "float32", "float64")
    #: input bytes per chunk when the caller does not choose
    default_chunk_bytes: ClassVar[int] = 4 << 20
    #: whether ``encode_tensor``/``decode_tensor`` exist (torch, any device)
    has_tensor_path: ClassVar[bool] = False

    def get_config(self) -> dict:
        """JSON-serialisable parameters, with ``"id"`` first."""
        return {"id": self.name}

    @classmethod
    def from_config(cls, config: dict) -> Codec:
        params = {k: v for k, v in config.items() if k != "id"}
        try:
            return cls(**params)
        except TypeError as exc:
            raise ValueError(f"invalid config for codec {cls.name!r}: {exc}") from None

    def encode(
        self, chunk: np.ndarray, bound: ErrorBound | None, threads: int = 1, offset: int = 0
    ) -> bytes:
        """Compress one C-contiguous chunk under a resolved bound (None if unbounded).

        ``threads``: how many threads the codec may use inside the chunk; the
        bytes must not depend on it. ``offset``: index (elements, C order) of
        the chunk's first element in the whole array, for codecs whose bytes
        depend on position (seeded noise).
        """
        raise NotImplementedError

    def decode(
        self,
        payload: bytes,
        shape: tuple,
        dtype: np.dtype,
        bound,
        out: np.ndarray | None = None,
        threads: int = 1,
    ) -> np.ndarray:
        """Rebuild the chunk of ``shape`` and ``dtype`` from ``payload``.

        With ``out`` (a C-contiguous array of that shape and dtype) the chunk is
        written there and ``out`` is returned. ``threads``: how many threads the
        codec may use inside the chunk.
        """
        raise NotImplementedError

    def encode_tensor(self, t, bound: ErrorBound | None, chunk_rows: int):
        """Compress a C-contiguous torch tensor on its own device, ``chunk_rows`` rows a chunk.

        Returns ``(payload, lengths)``: the chunk payloads concatenated in one
        uint8 tensor on ``t.device`` and their lengths (bytes), each payload
        equal byte for byte to what :meth:`encode` writes for that chunk.
        """
        raise NotImplementedError(f"codec {self.name!r} has no torch tensor path")

    def decode_tensor(self, payload, lengths: list, shape: tuple, dtype, bound, chunk_rows: int):
        """Inverse of :meth:`encode_tensor`: a tensor of ``shape`` and torch ``dtype``
        on ``payload.device``."""
        raise NotImplementedError(f"codec {self.name!r} has no torch tensor path")

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self):
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"


def deliver(flat: np.ndarray, shape: tuple, out: np.ndarray | None) -> np.ndarray:
    """``flat`` as ``shape``, copied into ``out`` when the caller gave one (decode helper)."""
    if out is None:
        return flat.reshape(shape)
    out[...] = flat.reshape(shape)
    return out


def chunk_rows_for(shape: tuple, itemsize: int, chunk_bytes: int) -> int:
    """Rows per chunk so a chunk holds about ``chunk_bytes`` bytes (at least one row)."""
    if not shape:
        return 1
    row_bytes = math.prod(shape[1:]) * itemsize
    if row_bytes == 0:
        return max(shape[0], 1)
    return max(1, min(shape[0], chunk_bytes // row_bytes))


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Class decorator: make ``cls`` findable by its ``name``."""
    if not cls.name:
        raise ValueError("a codec class needs a name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"codec name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def available_codecs() -> list[str]:
    """Names of the registered codecs, sorted."""
    return sorted(_REGISTRY)


def codec_class(name: str) -> type[Codec]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown codec {name!r}; available codecs: {', '.join(available_codecs())}"
        ) from None


def get_codec(spec: str | dict | Codec, **params) -> Codec:
    """A codec from a name (plus parameters), a config dict, or a codec instance."""
    if isinstance(spec, Codec):
        if params:
            raise ValueError("parameters cannot be given with a codec instance")
        return spec
    if isinstance(spec, dict):
        if "id" not in spec:
            raise ValueError("a codec config needs an 'id' key naming the codec")
        return codec_class(spec["id"]).from_config({**spec, **params})
    if isinstance(spec, str):
        return codec_class(spec).from_config(params)
    raise TypeError(f"codec must be a name, a config dict or a Codec, got {type(spec).__name__}")
