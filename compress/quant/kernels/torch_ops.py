"""Torch tensor ops of group quantization (any device): parameter dtypes, the
Walsh-Hadamard transform, random signs and rounding noise, bit packing. The
arithmetic is defined in ``compress/quant/groups.py``; ``kernels/quant.py`` is
the numba twin the ``quant`` codec runs on numpy chunks.
"""

from __future__ import annotations

import torch

from ...._util.hashing import hash32_torch


def param_dtype(dtype):
    """Parameter dtype (float64 or float32) for a torch value dtype; TypeError if unsupported."""
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(
        f"codec 'quant' takes float16, bfloat16, float32 or float64 tensors, not {dtype}"
    )


def bytes_as(b, dtype):
    """uint8 tensor (any offset, rows may be strided) reinterpreted as ``dtype`` along its
    last dim (a fresh contiguous copy, so the view is aligned)."""
    return b.clone(memory_format=torch.contiguous_format).view(dtype)


def to_storage(v, dtype):
    """float64 tensor rounded to ``dtype`` (16-bit types via float32)."""
    if dtype == torch.float64:
        return v
    return v.to(torch.float32).to(dtype)


def positions(base: int, nch: int, m: int, width: int, device):
    """int64 ``[nch, width]``: base + c*m + j, the element index of slot j of chunk c."""
    first = base + torch.arange(nch, device=device, dtype=torch.int64)[:, None] * m
    return first + torch.arange(width, device=device, dtype=torch.int64)[None, :]


def signs(seed: int, pos):
    """+1.0/-1.0 (float64) from bit 0 of hash32(2*seed + 1, pos)."""
    bit = hash32_torch(2 * seed + 1, pos).bitwise_and_(1).to(torch.float64)
    return bit.mul_(-2.0).add_(1.0)


def uniform_noise(seed: int, pos):
    """float64 draws in [0, 1) keyed on ``pos``: ``(hash32(2*seed, pos) >> 8) * 2**-24``,
    exact in float64 (24 bits), so adding one rounds once, as the numba kernel does."""
    return hash32_torch(2 * seed, pos).bitwise_right_shift_(8).to(torch.float64).mul_(2.0**-24)


def fwht(v):
    """Unnormalised Walsh-Hadamard transform along the last dim (a power of 2); reuses
    ``v``'s memory (pass a temporary)."""
    *lead, size = v.shape
    src = v.reshape(-1, size)
    dst = torch.empty_like(src)
    h = 1
    while h < size:
        a = src.view(-1, size // (2 * h), 2, h)
        b = dst.view(-1, size // (2 * h), 2, h)
        torch.add(a[:, :, 0], a[:, :, 1], out=b[:, :, 0])
        torch.sub(a[:, :, 0], a[:, :, 1], out=b[:, :, 1])
        src, dst = dst, src
        h *= 2
    return src.view(*lead, size)


def pack(codes, bits: int):
    """uint8 codes ``[rows, k]`` packed LSB-first, ``[rows, ceil(k*bits/8)]``."""
    per = 8 // bits
    if per == 1:
        return codes
    rows, k = codes.shape
    if k % per:
        codes = torch.nn.functional.pad(codes, (0, per - k % per))
    c = codes.view(rows, -1, per)
    out = c[..., 0].clone()
    for s in range(1, per):
        out |= c[..., s] << (s * bits)
    return out


def unpack(packed, bits: int, k: int):
    """Inverse of :func:`pack`: uint8 ``[rows, k]``."""
    per = 8 // bits
    if per == 1:
        return packed[:, :k]
    mask = (1 << bits) - 1
    parts = [(packed >> (s * bits)) & mask for s in range(per)]
    return torch.stack(parts, -1).reshape(packed.shape[0], -1)[:, :k]
