"""The device codes of a float32 tensor as plain tensor ops that inductor fuses.

``partition.py`` traces :func:`encode` into the forward graph right after a saved
tensor's producer and :func:`decode` into the backward graph before its first use, so
inductor compiles them into its own kernels (a range reduction, one quantize-and-pack
kernel; one unpack-and-restore kernel, fused into the consumer where the restored
tensor is contiguous) instead of calling an opaque op: nothing is read back to the host
and the record's size is fixed by the element count and the bound, on the CPU and CUDA.

The codes are the device codes' (``device/codes.py``: the same range, step, codes and
restored values, so the same bound: every finite element within ``rel * (hi - lo)``)
taken in the tensor's memory order, so that a dense tensor of any strides is read and
restored as one flat buffer. The record: float64 ``[lo, hi, step]`` (24 bytes), then
the codes in groups of eight, each group ``bits`` bytes (``bits`` <= 8: ``rel`` >=
about 4e-3), LSB first; the last group is padded with zero codes.
"""

from __future__ import annotations

import math

import torch

from ..device.codes_layout import N_SCALARS, STEP_MARGIN, code_bits, steps

HEADER = N_SCALARS * 8  # bytes of the float64 scalars before the codes
GROUP = 8  # codes a group holds: eight codes of ``bits`` fill ``bits`` whole bytes
MAX_BITS = 8  # a code spans at most two bytes, a byte at most two codes' bits and more


def supports(rel: float) -> bool:
    """Whether codes under ``rel`` fit the byte layout (at most 8 bits a code)."""
    return code_bits(rel) <= MAX_BITS


def record_bytes(numel: int, rel: float) -> int:
    """Bytes of the record of ``numel`` elements under ``rel``."""
    return HEADER + math.ceil(numel / GROUP) * code_bits(rel)


def memory_order(size, stride) -> list:
    """The dims of a dense tensor from the largest stride to the smallest: permuted so,
    its elements are in memory order and reshape to a flat view."""
    return sorted(range(len(size)), key=lambda d: (-stride[d], d))


def _pieces(bits: int):
    """(byte j, code k, shift) for each overlap of byte j's bits with code k's, shift =
    where code k's bits start relative to byte j's (``bits * k - 8 * j``)."""
    for j in range(bits):
        for k in range(GROUP):
            shift = bits * k - 8 * j
            if -bits < shift < 8:
                yield j, k, shift


def _shift(v, by: int):
    return v << by if by >= 0 else v >> -by


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 ``codes`` (each below ``2**bits``), GROUP-aligned, as uint8 bytes."""
    groups = codes.view(-1, GROUP)
    columns = [None] * bits
    for j, k, shift in _pieces(bits):
        part = _shift(groups[:, k], shift) & 0xFF
        columns[j] = part if columns[j] is None else columns[j] | part
    return torch.stack(columns, 1).to(torch.uint8).reshape(-1)


def unpack(payload: torch.Tensor, bits: int) -> torch.Tensor:
    """The int32 codes of ``payload`` (see :func:`pack`), GROUP-aligned."""
    groups = payload.view(-1, bits).to(torch.int32)
    columns = [None] * GROUP
    for j, k, shift in _pieces(bits):
        part = _shift(groups[:, j], -shift)
        columns[k] = part if columns[k] is None else columns[k] | part
    return (torch.stack(columns, 1) & ((1 << bits) - 1)).reshape(-1)


def _range(flat: torch.Tensor):
    """float64 (lo, hi) of the finite values of float32 ``flat``, (0, 0) when none is:
    taken in float32, where a min and a max are exact (a float64 pass costs more)."""
    fin = flat.isfinite()
    lo, hi = flat.where(fin, math.inf).amin(), flat.where(fin, -math.inf).amax()
    none = lo > hi
    return lo.where(~none, 0.0).double(), hi.where(~none, 0.0).double()


def quantize(flat: torch.Tensor, rel: float) -> tuple:
    """(int32 codes, float64 ``[lo, hi, step]``) of float32 ``flat``: the device codes'
    (``codes_torch.quantize``)."""
    nsteps = steps(rel)
    lo, hi = _range(flat)
    step = rel * (hi - lo) * STEP_MARGIN
    x = flat.double()
    q = torch.where(step > 0, (x - lo) / step, 0.0).round().clamp(0, nsteps).to(torch.int32)
    q = torch.where(torch.isnan(x), nsteps + 1, q)
    q = torch.where(x == math.inf, nsteps + 2, q)
    q = torch.where(x == -math.inf, nsteps + 3, q)
    q = torch.where(x == 0, nsteps + 4, q)
    return q, torch.stack([lo, hi, step])


def encode(x: torch.Tensor, rel: float, order=None) -> torch.Tensor:
    """The uint8 record of dense float32 ``x`` (non-empty) under ``rel``; ``order``:
    :func:`memory_order` of ``x``, given where ``x``'s strides are not plain ints."""
    order = memory_order(x.shape, x.stride()) if order is None else order
    flat = x.permute(order).reshape(-1)
    codes, scalars = quantize(flat, rel)
    codes = torch.nn.functional.pad(codes, (0, -flat.numel() % GROUP))
    return torch.cat([scalars.view(torch.uint8), pack(codes, code_bits(rel))])


def decode(record: torch.Tensor, size, stride, rel: float, order=None) -> torch.Tensor:
    """The float32 tensor of ``size`` and ``stride`` that ``record`` holds (``order``:
    as for :func:`encode`)."""
    n, nsteps = math.prod(size), steps(rel)
    scalars = record[:HEADER].view(torch.float64)
    lo, hi, step = scalars[0], scalars[1], scalars[2]
    codes = unpack(record[HEADER:], code_bits(rel))[:n]
    # float64 to float32 rounds once (the device codes' restore, ``codes_torch``)
    y = torch.minimum(torch.maximum(lo + codes.double() * step, lo), hi).float()
    y = torch.where(codes == nsteps + 1, math.nan, y)
    y = torch.where(codes == nsteps + 2, math.inf, y)
    y = torch.where(codes == nsteps + 3, -math.inf, y)
    y = torch.where(codes == nsteps + 4, 0.0, y)
    order = memory_order(size, stride) if order is None else order
    y = y.view([size[d] for d in order]).permute([order.index(d) for d in range(len(size))])
    if tuple(y.stride()) != tuple(stride):  # size-1 dims: any stride is dense
        y = torch.as_strided(y, size, stride)
    return y
