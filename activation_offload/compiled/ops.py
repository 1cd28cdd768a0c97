"""The custom ops a compiled graph saves and restores activations with:
``tensorpress::saved_encode`` and ``tensorpress::saved_decode``.

A record is one uint8 tensor: the device codes' three float64 scalars ``[lo, hi, step]``
(24 bytes, native byte order) followed by their payload (``device/codes.py``), so a
saved tensor becomes exactly one saved record and the graph's list of saved values
keeps its length and order. The fake implementations size the record from the element
count and the bound alone, and restore the tensor with the sizes and strides it was
saved with (the backward graph was compiled for them): nothing is read back to size
anything. On the CPU float32 tensors go through the numba kernels of ``cpu_codes``;
other dtypes and devices through ``device/ops.py`` (Triton on CUDA, the torch reference
elsewhere). Both produce the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch._prims_common import make_contiguous_strides_for

from ..device import ops as device_ops
from ..device.codes_layout import N_SCALARS, STEP_MARGIN, code_bits, payload_bytes, steps
from . import cpu_codes

HEADER = N_SCALARS * 8  # bytes of the scalars before the payload
_NUMBA_BITS = 56  # eight codes must fit a 64-bit accumulator with a byte to spare


def record_bytes(numel: int, rel: float) -> int:
    """Bytes of the record of ``numel`` elements under ``rel``."""
    return HEADER + payload_bytes(numel, code_bits(rel))


def _numba_path(device: torch.device, rel: float) -> bool:
    return device.type == "cpu" and code_bits(rel) <= _NUMBA_BITS


def encode(x: torch.Tensor, rel: float) -> torch.Tensor:
    """The body of ``tensorpress::saved_encode``."""
    if not _numba_path(x.device, rel):
        payload, scalars = device_ops.codes(x, rel)
        return torch.cat([scalars.view(torch.uint8), payload])
    flat = x.detach().reshape(-1).to(torch.float32).contiguous()
    out = torch.zeros(record_bytes(flat.numel(), rel), dtype=torch.uint8)
    lo = hi = 0.0
    if flat.numel():
        lo, hi = cpu_codes.finite_range(flat.numpy())
    step = rel * (hi - lo) * STEP_MARGIN  # as compress.bounds.range_tolerance, then the margin
    out[:HEADER] = torch.from_numpy(np.array([lo, hi, step]).view(np.uint8))
    if flat.numel():
        args = (lo, step, steps(rel), code_bits(rel))
        cpu_codes.pack_codes(flat.numpy(), *args, out[HEADER:].numpy())
    return out


@torch.library.custom_op("tensorpress::saved_encode", mutates_args=())
def saved_encode(x: torch.Tensor, rel: float) -> torch.Tensor:
    """``x`` (float16, bfloat16 or float32) as one uint8 record within ``rel`` of its
    finite range."""
    return encode(x, rel)


@saved_encode.register_fake
def _(x: torch.Tensor, rel: float) -> torch.Tensor:
    return x.new_empty(record_bytes(x.numel(), rel), dtype=torch.uint8)


def decode(record, size, stride, dtype, rel) -> torch.Tensor:
    """The body of ``tensorpress::saved_decode``."""
    size, stride = tuple(size), tuple(stride)
    n = math.prod(size)
    if _numba_path(record.device, rel) and dtype == torch.float32:
        lo, hi, step = record[:HEADER].view(torch.float64).tolist()
        flat = torch.empty(n, dtype=dtype)
        if n:
            args = (lo, hi, step, steps(rel), code_bits(rel))
            cpu_codes.unpack_values(record[HEADER:].numpy(), *args, flat.numpy())
    else:
        scalars = record[:HEADER].view(torch.float64)
        flat = device_ops.restore(record[HEADER:], scalars, (n,), dtype, rel)
    if stride == tuple(make_contiguous_strides_for(size)):
        return flat.view(size)
    out = torch.empty_strided(size, stride, dtype=dtype, device=record.device)
    return out.copy_(flat.view(size))


@torch.library.custom_op("tensorpress::saved_decode", mutates_args=())
def saved_decode(
    record: torch.Tensor,
    size: Sequence[int],
    stride: Sequence[int],
    dtype: torch.dtype,
    rel: float,
) -> torch.Tensor:
    """The tensor of ``size``, ``stride`` and ``dtype`` that ``record`` holds."""
    return decode(record, size, stride, dtype, rel)


@saved_decode.register_fake
def _(record, size, stride, dtype, rel) -> torch.Tensor:
    return torch.empty_strided(tuple(size), tuple(stride), dtype=dtype, device=record.device)
