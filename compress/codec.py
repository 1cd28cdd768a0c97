"""The codec interface: an abstract base class whose config is the codec's whole identity.

A codec turns one chunk (a C-contiguous numpy array) into bytes and back, and,
when it has a torch path, a tensor on any device into the same bytes. Its
config, ``get_config()``, holds JSON values: ``"id"`` (the codec's name), its
parameters and, for an error-bounded codec, its bound as one of ``abs``,
``rel`` or ``pw_rel`` (``{"id": "sz", "rel": 1e-3}``, as numcodecs' ZFPY keeps
its tolerance). ``get_codec(config)`` rebuilds an equal codec. What a codec can
do is declared on its class (``lossy``, ``bounded``, ``bound_modes``, ``dtypes``,
``devices``, ``keeps_zeros``, ``reports_max_error``), never found by name. Shape,
dtype, chunking and checksums are the container's business (``tensorpress.formats``), which
records a codec's config without its bound beside the bound resolved for the
data (see formats/SPEC.md).
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar

import numpy as np

from .bounds import MODES, ErrorBound
from .stages import Stage, get_stage


class Codec(abc.ABC):
    """Base class: subclasses set ``name`` and the capabilities, and implement
    :meth:`encode` and :meth:`decode` (and :meth:`parameters` when they have any).

    A bounded codec is built with at most one of ``abs``, ``rel``, ``pw_rel``
    (one is needed to compress; decoding needs none: a stream records its bound).
    """

    name: ClassVar[str] = ""
    #: whether decoding may return values other than the input
    lossy: ClassVar[bool] = True
    #: whether the codec takes an error bound (abs/rel/pw_rel); lossless codecs
    #: and bits-bounded quantizers take none
    bounded: ClassVar[bool] = True
    #: the bound modes a bounded codec takes
    bound_modes: ClassVar[tuple[str, ...]] = MODES
    #: whether an exact 0.0 always comes back as 0.0 (a saved ReLU output then needs no
    #: mask of its zeros)
    keeps_zeros: ClassVar[bool] = False
    #: dtypes the codec accepts
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "float32", "float64")
    #: input bytes per chunk when the caller does not choose
    default_chunk_bytes: ClassVar[int] = 4 << 20
    #: torch devices whose tensors :meth:`encode_tensor` takes where they are
    #: (empty: numpy arrays only)
    devices: ClassVar[tuple[str, ...]] = ()
    #: whether a payload records the largest error it made (:meth:`payload_max_error`):
    #: bits-bounded codecs, whose error is a result rather than a contract
    reports_max_error: ClassVar[bool] = False
    #: bytes at the start of a payload that :meth:`payload_max_error` reads
    payload_head_bytes: ClassVar[int] = 0
    #: whether ``encode_tensor``/``decode_tensor`` exist: set from ``devices`` for each
    #: subclass, so the two never disagree
    has_tensor_path: ClassVar[bool] = False
    #: the bound this codec compresses under, as given (unresolved), or None
    bound: ErrorBound | None = None
    #: bytes-to-bytes stages run on each chunk payload after :meth:`encode`, in order
    #: (config key ``"stages"``; see ``stages.py``)
    stages: tuple[Stage, ...] = ()
    #: whether :meth:`encode_into` writes a payload into the caller's memory (a stream
    #: writer then keeps one buffer for all its chunks instead of a bytes object each)
    writes_into: ClassVar[bool] = False

    def __init__(self, *, abs=None, rel=None, pw_rel=None):  # noqa: A002
        self.bound = bound_spec(type(self), {"abs": abs, "rel": rel, "pw_rel": pw_rel})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.has_tensor_path = bool(cls.devices)

    # -- identity ---------------------------------------------------------------

    def parameters(self) -> dict:
        """The codec's own parameters (JSON values), without its id and bound."""
        return {}

    def stream_config(self) -> dict:
        """``"id"``, the parameters and the stages: what a stream records beside its
        resolved bound."""
        config = {"id": self.name, **self.parameters()}
        if self.stages:
            config["stages"] = [stage.get_config() for stage in self.stages]
        return config

    def get_config(self) -> dict:
        """The whole identity: ``"id"`` first, the parameters, then the bound if any."""
        config = self.stream_config()
        if self.bound is not None:
            config[self.bound.mode] = self.bound.value
        return config

    @classmethod
    def from_config(cls, config: dict) -> Codec:
        params = {k: v for k, v in config.items() if k != "id"}
        bound = {k: params.pop(k) for k in MODES if k in params}
        if bound_spec(cls, bound) is not None:
            params.update((k, v) for k, v in bound.items() if v is not None)
        stages = params.pop("stages", ())
        if not isinstance(stages, (list, tuple)):
            raise ValueError(f"stages must be a list of stage configs, got {stages!r}")
        try:
            codec = cls(**params)
        except TypeError as exc:
            raise ValueError(f"invalid config for codec {cls.name!r}: {exc}") from None
        codec.stages = tuple(get_stage(s) for s in stages)
        return codec

    def with_bound(self, bound: ErrorBound | None) -> Codec:
        """The same codec under another bound (an unresolved :class:`ErrorBound`)."""
        config = self.stream_config()
        if bound is not None:
            config[bound.mode] = bound.value
        return type(self).from_config(config)

    def psnr_alternatives(self, bits_per_value: float) -> tuple[Codec, ...]:
        """Other configurations a ``psnr=`` target also searches when this one codes at
        ``bits_per_value`` there (the stream with fewest bytes is kept); none by default."""
        return ()

    # -- the bound --------------------------------------------------------------

    def require_bound(self) -> ErrorBound:
        """The bound to compress under; a bounded codec built without one cannot compress."""
        if self.bound is None:
            raise ValueError(
                f"codec {self.name!r} needs exactly one error bound: abs=..., rel=... or "
                "pw_rel=... (got none)"
            )
        return self.bound

    def resolve_bound(self, data: np.ndarray, threads: int = 1) -> ErrorBound | None:
        """The bound resolved for ``data`` (a rel bound reads its value range), or None
        for a codec that takes no bound."""
        return self.require_bound().resolve(data, threads) if self.bounded else None

    # -- numpy chunks -----------------------------------------------------------

    @abc.abstractmethod
    def encode(
        self, chunk: np.ndarray, bound: ErrorBound | None, threads: int = 1, offset: int = 0
    ) -> bytes:
        """Compress one C-contiguous chunk under a resolved bound (None if unbounded).

        ``threads``: how many threads the codec may use inside the chunk; the
        bytes must not depend on it. ``offset``: index (elements, C order) of
        the chunk's first element in the whole array, for codecs whose bytes
        depend on position (seeded noise).
        """

    @abc.abstractmethod
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

    # -- chunks through the pipeline: the codec, then its stages -----------------

    def encode_chunk(
        self, chunk: np.ndarray, bound: ErrorBound | None, threads: int = 1, offset: int = 0
    ) -> bytes:
        """:meth:`encode`, then each stage in order: a chunk payload of a stream."""
        payload = self.encode(chunk, bound, threads, offset)
        for stage in self.stages:
            payload = stage.encode(payload)
        return payload

    def unstage(self, payload, shape: tuple, dtype) -> bytes:
        """A chunk payload of a stream with the stages undone, in reverse order: what
        :meth:`decode` (or :meth:`decode_tensor`) reads."""
        if not self.stages:
            return payload
        limit = 2 * math.prod(shape) * np.dtype(dtype).itemsize + 4096  # no codec writes more
        for stage in reversed(self.stages):
            payload = stage.decode(payload, limit)
        return payload

    def payload_capacity(self, size: int, itemsize: int) -> int:
        """``writes_into`` codecs: the most bytes :meth:`encode_into` writes for a chunk of
        ``size`` elements of ``itemsize`` bytes."""
        raise NotImplementedError(f"codec {self.name!r} does not write into buffers")

    def encode_into(self, chunk: np.ndarray, bound: ErrorBound | None, out: np.ndarray) -> int:
        """``writes_into`` codecs: :meth:`encode`'s payload written to the uint8 array
        ``out`` (:meth:`payload_capacity` bytes at least); returns its length in bytes."""
        raise NotImplementedError(f"codec {self.name!r} does not write into buffers")

    def decode_chunk(self, payload, shape, dtype, bound, out=None, threads=1) -> np.ndarray:
        """Inverse of :meth:`encode_chunk`."""
        payload = self.unstage(payload, shape, dtype)
        return self.decode(payload, shape, dtype, bound, out=out, threads=threads)

    def chunk_decoder(self, shape: tuple, dtype: np.dtype, bound):
        """``decode(payload, out)``: :meth:`decode_chunk` of one chunk of ``shape`` and
        ``dtype`` under ``bound`` into ``out`` (C-contiguous, of that shape and dtype),
        made once for many chunks alike (a codec may work out its per-chunk set-up here).
        ValueError for a payload that does not decode."""

        def decode(payload, out: np.ndarray) -> None:
            self.decode_chunk(payload, shape, dtype, bound, out=out)

        return decode

    def rows_decoder(self, shape: tuple, dtype: np.dtype, bound):
        """An object whose ``index(payload)`` and ``decode(pages, ids, size, index, r0,
        r1, out)`` decode rows (along axis 0) of one chunk of ``shape`` without the
        others (``compress/block/rows.py``), or None: this codec decodes whole chunks."""
        return None

    # -- torch tensors (codecs with ``devices``) ----------------------------------

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

    def payload_max_error(self, payload) -> float:
        """The largest |error| a chunk payload records (``reports_max_error`` codecs)."""
        raise NotImplementedError(f"codec {self.name!r} does not record its error")

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self):
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"


def bound_spec(cls: type[Codec], given: dict) -> ErrorBound | None:
    """The one check of a codec's bound keywords: at most one of abs/rel/pw_rel, and
    none for a codec that takes no bound. Returns the unresolved bound, or None."""
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    if not cls.bounded:
        kind = "lossy but bits-bounded" if cls.lossy else "lossless"
        raise ValueError(f"codec {cls.name!r} is {kind} and takes no error bound")
    bound = ErrorBound.from_kwargs(**given)
    if bound.mode not in cls.bound_modes:
        raise ValueError(
            f"codec {cls.name!r} takes {' or '.join(cls.bound_modes)} bounds, not {bound.mode}"
        )
    return bound


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
