"""Compress torch tensors where they live: ``compress_tensor`` / ``decompress_tensor``.

The work runs on the tensor's own device — codec kernels (numba on the CPU,
numba.cuda on CUDA) or torch tensor ops — with no copy of the data to the host.
The host learns only small things — the value range for a ``rel`` bound, the
payload sizes, where the few values that need a second look sit — in a few
small synchronisations per call.
``tensorpress.formats.tensor_to_stream(ct)`` is the same container stream that
``tensorpress.compress`` writes for the same array, byte for byte.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from .._util.optional_torch import check_device, import_torch
from .bounds import ErrorBound, tensor_ends, tensor_finite_range
from .codec import Codec, chunk_rows_for
from .registry import get_codec

torch = import_torch("tensorpress.compress.tensor (compress_tensor, decompress_tensor)")

_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class CompressedTensor:
    """A compressed tensor whose payload stays on a device.

    ``payload``: the chunk payloads concatenated (uint8 tensor); ``lengths``:
    bytes of each; ``shape``/``dtype``: the original tensor's.
    """

    payload: torch.Tensor
    lengths: tuple
    shape: tuple
    dtype: torch.dtype
    codec: Codec
    bound: ErrorBound | None
    chunk_rows: int

    @property
    def device(self) -> torch.device:
        return self.payload.device

    @property
    def nbytes(self) -> int:
        """Bytes of compressed payload held."""
        return int(self.payload.numel())

    @property
    def original_nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def ratio(self) -> float:
        return self.original_nbytes / max(self.nbytes, 1)

    @property
    def max_error(self) -> float | None:
        """The largest |error| the chunks record (bits-bounded codecs such as ``quant``);
        None for codecs whose error bound is the contract instead."""
        if not self.codec.reports_max_error:
            return None
        if not self.lengths:
            return 0.0
        starts = torch.tensor([0, *self.lengths[:-1]]).cumsum(0)
        head = torch.arange(self.codec.payload_head_bytes)
        idx = (starts[:, None] + head).clamp(max=self.nbytes - 1)
        heads = self.payload[idx.to(self.device)].cpu().numpy()
        return max(self.codec.payload_max_error(bytes(h)) for h in heads)

    def to(self, device, non_blocking: bool = False) -> CompressedTensor:
        """The same compressed tensor with its payload on ``device``."""
        check_device(device)
        return replace(self, payload=self.payload.to(device, non_blocking=non_blocking))


def compress_tensor(
    t: torch.Tensor,
    codec="block",
    *,
    abs=None,
    rel=None,
    pw_rel=None,
    chunk_bytes: int | None = None,
    **codec_params,
) -> CompressedTensor:
    """Compress ``t`` on its own device (any layout; read as C order).

    Bounds and codecs as in :func:`tensorpress.compress`; the codec needs a
    torch path (``block``, ``quant``).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"compress_tensor takes a torch.Tensor, got {type(t).__name__}")
    codec = get_codec(codec, abs=abs, rel=rel, pw_rel=pw_rel, **codec_params)
    if not codec.has_tensor_path or codec.stages:
        raise ValueError(
            f"codec {codec.get_config()} has no torch path (stages run on host bytes); use "
            "'block' or 'quant' without stages, or tensorpress.compress on a CPU array"
        )
    if t.dtype not in _TORCH_DTYPES:
        raise TypeError(
            f"compress_tensor takes float16, bfloat16, float32 or float64 tensors, got {t.dtype}"
        )
    t = t.detach().contiguous()
    shape = tuple(t.shape)
    bound = None
    if codec.bounded:
        bound = codec.require_bound().resolve_tensor(t)
    chunk_bytes = codec.default_chunk_bytes if chunk_bytes is None else chunk_bytes
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    rows = chunk_rows_for(shape, t.element_size(), chunk_bytes)
    payload, lengths = codec.encode_tensor(t, bound, rows)
    return CompressedTensor(payload, tuple(lengths), shape, t.dtype, codec, bound, rows)


def decompress_tensor(ct, device=None) -> torch.Tensor:
    """The tensor back: same shape and dtype, on ``ct``'s device (or ``device``).

    A container stream (bytes) becomes a :class:`CompressedTensor` through
    :func:`tensorpress.formats.tensor_from_stream`.
    """
    if not isinstance(ct, CompressedTensor):
        raise TypeError(
            f"decompress_tensor takes a CompressedTensor, got {type(ct).__name__}; for a "
            "stream use tensorpress.formats.tensor_from_stream(blob) first"
        )
    if device is not None:
        ct = ct.to(device)
    return ct.codec.decode_tensor(
        ct.payload, list(ct.lengths), ct.shape, ct.dtype, ct.bound, ct.chunk_rows
    )


def bytes_tensor(raw, device=None) -> torch.Tensor:
    """A uint8 tensor holding a copy of the bytes-like ``raw`` (a payload read from a
    stream), for a codec's torch path: on the CPU, or on ``device``."""
    check_device(device)
    raw = bytearray(raw)
    t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)
    return t if device is None else t.to(device)


class ValueRange:
    """The ends of a tensor's values, each computed at most once: ``ends`` over all
    elements (NaN and infinities count), ``finite`` over the finite ones (as
    :func:`~.bounds.tensor_finite_range`), as Python floats."""

    def __init__(self, t: torch.Tensor):
        self._t = t

    @functools.cached_property
    def ends(self) -> tuple[float, float]:
        if self._t.numel() == 0:
            return 0.0, 0.0
        return tensor_ends(self._t)

    @functools.cached_property
    def finite(self) -> tuple[float, float]:
        lo, hi = self.ends
        return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else tensor_finite_range(self._t)
