"""The torch reference of the device codes (``codes.py``): plain tensor
ops that run on any device, read nothing back to the host, and that ``torch.compile``
fuses. The Triton kernels (``codes_triton.py``) produce the same bytes and the
same restored values.
"""

from __future__ import annotations

import math

import torch

from ...compress.bounds import ErrorBound, range_tolerance, tensor_range

#: (mantissa bits, smallest normal exponent) of the dtypes the codes hold
_FORMATS = {torch.float16: (10, -14), torch.bfloat16: (7, -126), torch.float32: (23, -126)}
_ROUND_SHIFT = 1.5 * 2.0**52  # x + c - c rounds x to a multiple of c's unit (see round_to)


def quantize(flat: torch.Tensor, rel: float, nsteps: int, margin: float):
    """(codes int32, scalars float64 ``[lo, hi, step]``) of non-empty ``flat``."""
    lo, hi = tensor_range(flat)
    step = range_tolerance(ErrorBound("rel", rel), lo, hi) * margin
    x = flat.double()
    v = torch.where(step > 0, (x - lo) / step, 0.0)
    q = v.round().clamp(0, nsteps).to(torch.int32)
    q = torch.where(torch.isnan(x), nsteps + 1, q)
    q = torch.where(x == math.inf, nsteps + 2, q)
    q = torch.where(x == -math.inf, nsteps + 3, q)
    q = torch.where(x == 0, nsteps + 4, q)
    return q, torch.stack([lo, hi, step])


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``codes`` (int32, each below ``2**bits``) as one LSB-first bitstream: uint8,
    ``ceil(n * bits / 8)`` bytes."""
    n = codes.numel()
    shifts = torch.arange(bits, device=codes.device, dtype=torch.int32)
    stream = ((codes[:, None] >> shifts) & 1).to(torch.uint8).reshape(-1)
    stream = torch.nn.functional.pad(stream, (0, (-n * bits) % 8)).view(-1, 8)
    return (stream << torch.arange(8, device=codes.device, dtype=torch.uint8)).sum(
        1, dtype=torch.uint8
    )


def unpack(payload: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """The ``n`` int32 codes of ``bits`` each in ``payload`` (see :func:`pack`)."""
    byte_bits = torch.arange(8, device=payload.device, dtype=torch.uint8)
    stream = ((payload[:, None] >> byte_bits) & 1).reshape(-1)[: n * bits]
    shifts = torch.arange(bits, device=payload.device, dtype=torch.int32)
    return (stream.view(n, bits).to(torch.int32) << shifts).sum(1, dtype=torch.int32)


def round_to(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``r`` rounded to the nearest value of ``dtype`` (ties to even), still as
    float64: adding and taking away ``1.5 * 2**52`` units of the dtype's last place at
    ``r`` rounds once, where a cast through float32 would round twice (and the
    interpreter's bfloat16 cast does not round to nearest)."""
    mant, emin = _FORMATS[dtype]
    exponent = ((r.view(torch.int64) >> 52) & 0x7FF) - 1023
    unit = ((exponent.clamp_min(emin) - mant + 1023) << 52).view(torch.float64)
    shift = unit * _ROUND_SHIFT
    return (r + shift) - shift


def dequantize(codes, scalars, dtype: torch.dtype, nsteps: int) -> torch.Tensor:
    """The values of int32 ``codes`` under ``scalars`` (``[lo, hi, step]``), in ``dtype``."""
    lo, hi, step = scalars[0], scalars[1], scalars[2]
    r = torch.minimum(torch.maximum(lo + codes.double() * step, lo), hi)
    y = round_to(r, dtype)
    y = torch.where(codes == nsteps + 1, math.nan, y)
    y = torch.where(codes == nsteps + 2, math.inf, y)
    y = torch.where(codes == nsteps + 3, -math.inf, y)
    y = torch.where(codes == nsteps + 4, 0.0, y)
    return y.to(dtype)


def compress(x: torch.Tensor, rel: float, nsteps: int, bits: int, margin: float):
    """(payload uint8, scalars float64[3]) of ``x`` (see ``codes.py``)."""
    flat = x.reshape(-1)
    if flat.numel() == 0:
        empty = torch.empty(0, dtype=torch.uint8, device=x.device)
        return empty, torch.zeros(3, dtype=torch.float64, device=x.device)
    codes, scalars = quantize(flat, rel, nsteps, margin)
    return pack(codes, bits), scalars


def restore(payload, scalars, shape, dtype, nsteps: int, bits: int) -> torch.Tensor:
    """The tensor of ``shape`` and ``dtype`` that ``payload`` and ``scalars`` hold."""
    n = math.prod(shape)
    if n == 0:
        return torch.empty(shape, dtype=dtype, device=payload.device)
    codes = unpack(payload, n, bits)
    return dequantize(codes, scalars, dtype, nsteps).reshape(shape)
