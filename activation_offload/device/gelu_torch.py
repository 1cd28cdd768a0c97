"""The torch reference of a GELU output's residual codes: the output ``y`` held as block
codes (``tiles_torch.py``) of ``r = y - p``, ``p`` a prediction from the restored
input ``x'``. Static-shape tensor ops on any device that read nothing back to the host;
the Triton kernels (``gelu_triton.py``) write the same bytes and restore the same
values. Why the residual keeps the output's bound is proved in
``gelu.py``; this module is the arithmetic.

The prediction. ``g(x)`` is GELU built from float64 additions, multiplications and
divisions alone, each rounded once (no fused multiply-add, no library ``exp`` or
``erf``, whose last bits differ between torch's CPU and CUDA kernels and Triton's): so
``p`` is the same bits in the torch reference and the Triton kernels, at pack and at
restore, on any device. Every constant is a float32 value, which a Triton literal keeps
exactly. ``exp`` takes ``k = rint(v / ln 2)`` and a degree-9 Taylor polynomial of
``v - k ln 2`` (ln 2 in two parts), scaled by ``2**k`` built from its bits; the exact
form, ``approximate="none"``, is ``x Phi(x)`` with ``erfc`` as Numerical Recipes'
``erfcc`` (relative error under ``1.2e-7``), the ``tanh`` form ``x / (1 + exp(-2u))``,
``u = sqrt(2/pi) (x + 0.044715 x**3)``. ``p`` is ``g(x')`` rounded to float32, clamped
to the output's finite range ``[lo, hi]`` (``lo`` where NaN), or 0 where not ``use``.

The residual's codes use a range derived from ``y``'s, ``[-D, D]`` with
``D = (hi - lo) (1 + 2**-20)`` where ``use`` (else ``[lo, hi]``, where ``r = y``), instead
of a reduction over ``r``: so one pass over ``y`` gives every scalar the codes need. In
such a range an exact zero's code (0) lies far from the codes of values near 0 and would
widen its block; a zero residual is held as ``2**-149`` instead (where ``t_r`` is at least
``2**-100``, so the change is far inside the bound's margins).
"""

from __future__ import annotations

import functools
import math
import struct

import torch

from ...compress.bounds import tensor_range
from . import tiles_torch as blocks
from .codes_layout import STEP_MARGIN, code_bits, steps, supports
from .codes_torch import round_to

BLOCK = 256  # the residual's blocks: the input's, element for element
#: the residual's step margin: the block codes' room for rounding to the dtype
MARGIN = 1 - 2**-7
#: the prediction is used where ``M <= USE_SPAN * T``
USE_SPAN = 2.0**14
#: the largest ``M`` for which ``y - p`` stays finite in float32
FINITE_SPAN = 2.0**126
#: ``D = (hi - lo) * WIDEN`` holds ``|float32(y - p)|`` for ``y``, ``p`` in ``[lo, hi]``
WIDEN = 1 + 2.0**-20
#: under ``rel``, the residual's codes are made under ``rel / RESIDUAL_SHARE`` of its range
RESIDUAL_SHARE = 5
#: the ceiling the residual's codes are given: never below ``t_r``, finite so that a
#: constant residual (range 0) keeps a zero tolerance
RESIDUAL_CEILING = 2.0**60
APPROXIMATIONS = ("none", "tanh")
#: a residual of exactly 0 is held as ``SMALLEST`` (float32's smallest subnormal) where
#: ``t_r >= ZERO_TOLERANCE``
SMALLEST = 2.0**-149
ZERO_TOLERANCE = 2.0**-100


def _f32(c: float) -> float:
    """``c`` rounded to float32 (the constants of ``g``: Triton keeps them exactly)."""
    return struct.unpack("<f", struct.pack("<f", c))[0]


#: erfcc's polynomial in t, highest power first, and its constant term
ERFC = tuple(
    _f32(c)
    for c in (
        0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807,
        -0.18628806, 0.09678418, 0.37409196, 1.00002368,
    )
)  # fmt: skip
ERFC0 = _f32(-1.26551223)
#: exp's Taylor coefficients 1/k!, k = 9 down to 0 (``|v - k ln 2| <= 0.35``: the
#: remainder is under ``1e-11`` of the value, far below erfcc's error)
EXP = tuple(_f32(1 / math.factorial(k)) for k in range(9, -1, -1))
LN2_HI = _f32(math.log(2))
LN2_LO = _f32(math.log(2) - LN2_HI)
INV_LN2 = _f32(1 / math.log(2))
EXP_LIMIT = 700.0  # |v| beyond it: exp's argument clamped (2**k stays a normal float64)
SQRT_HALF = _f32(math.sqrt(0.5))
TANH_CUBE = _f32(0.044715)
TANH_SCALE = _f32(-2 * math.sqrt(2 / math.pi))


def residual_settings(bound: float, absolute: bool) -> tuple[float, bool, float]:
    """(bound, absolute, ceiling) of the residual's block codes for an output held under
    ``rel`` (``absolute`` False) or ``abs`` ``bound``: under ``rel`` a slot of
    ``rel / RESIDUAL_SHARE``'s codes; under ``abs`` (no ceiling on its steps) the raw
    fallback's slot (``abs`` 0, the learned ``t_r`` its tolerance)."""
    if not absolute and supports(torch.float32, bound / RESIDUAL_SHARE):
        return bound / RESIDUAL_SHARE, False, RESIDUAL_CEILING
    return 0.0, True, math.inf


@functools.cache
def residual_slot(bound: float, absolute: bool) -> tuple[int, int]:
    """(steps, slot bits) of the residual's codes (float32) under the output's bound."""
    rbound, rabs, _ = residual_settings(bound, absolute)
    if rabs:
        return blocks.RAW_LIMIT, blocks.slot_bits(torch.float32, None)
    return steps(rbound), blocks.slot_bits(torch.float32, code_bits(rbound))


def record_bytes(n: int, bound: float, absolute: bool) -> int:
    """Bytes of the residual's slot for ``n`` elements (not cached: under dynamic shapes
    the fake implementation passes a symbolic ``n``, which cannot be hashed)."""
    return blocks.worst_bytes(n, BLOCK, residual_slot(bound, absolute)[1])


def _exp(v: torch.Tensor) -> torch.Tensor:
    """``exp`` of float64 ``v`` in basic operations (see the module docstring)."""
    v = torch.where(v != v, 0.0, v).clamp_(-EXP_LIMIT, EXP_LIMIT)
    k = torch.round(v * INV_LN2)  # ties to even, as the kernels' 1.5 * 2**52 shift
    r = v.sub_(k * LN2_HI).sub_(k * LN2_LO)
    acc = (r * EXP[0]).add_(EXP[1])
    for c in EXP[2:]:
        acc.mul_(r).add_(c)
    return acc.mul_((k.to(torch.int64).add_(1023) << 52).view(torch.float64))


def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``g(x)`` of float64 ``x`` (the module docstring's GELU), float64."""
    if approximate == "tanh":
        w = (x * x).mul_(TANH_CUBE).add_(1.0).mul_(x)
        return x / _exp(w.mul_(TANH_SCALE)).add_(1.0)
    a = torch.abs(x).mul_(SQRT_HALF)
    t = (a * 0.5).add_(1.0).reciprocal_()
    acc = (t * ERFC[0]).add_(ERFC[1])
    for c in ERFC[2:]:
        acc.mul_(t).add_(c)
    half_erfc = _exp(a.mul_(a).neg_().add_(ERFC0).add_(acc.mul_(t))).mul_(t).mul_(0.5)
    return x * torch.where(x > 0, 1.0 - half_erfc, half_erfc)


def prediction(x: torch.Tensor, approximate: str, scalars: torch.Tensor) -> torch.Tensor:
    """``p``, float32 and flat, from the restored input ``x`` (any float dtype) and the
    output's scalars ``[lo, hi, use]``."""
    p = gelu(x.reshape(-1).double(), approximate).float()
    lo, hi = scalars[0].float(), scalars[1].float()  # dtype values: exact
    p = torch.where(p < lo, lo, torch.where(p > hi, hi, p))
    p = torch.where(p != p, lo, p)
    return torch.where(scalars[2] > 0, p, torch.zeros_like(p))


def output_scalars(y: torch.Tensor, bound: float, absolute: bool, learned, ceiling: float):
    """(float64 ``[lo, hi, use]`` of ``y``, ``t_r``, the residual's range ``(lo_r, hi_r)``),
    device scalars; ``learned`` a float64 tensor of one element or None."""
    lo, hi = tensor_range(y.reshape(-1))
    lo, hi = lo + 0.0, hi + 0.0  # -0.0 as +0.0: the bytes do not depend on which zero
    tol = blocks.tolerance(lo, hi, bound, absolute, learned, ceiling)
    top = torch.maximum(lo.abs(), hi.abs())
    use = (top <= tol * USE_SPAN) & (top <= FINITE_SPAN)
    fine = blocks.coarse(lo, hi, tol, y.dtype)
    t_r = torch.where(fine, tol, tol * 0.5) * MARGIN
    d = (hi - lo) * WIDEN
    span = torch.where(use, -d, lo), torch.where(use, d, hi)
    return torch.stack([lo, hi, use.to(torch.float64)]), t_r.reshape(1), span


def pack(y, source, approximate: str, bound: float, absolute: bool, learned, ceiling: float):
    """(scalars float64 ``[lo, hi, use]``, the residual's record uint8 of
    :func:`record_bytes`, its bytes in use int64[1]) of non-empty ``y``, whose input's
    block record is ``source`` (blocks of ``BLOCK``, ``y``'s element count and dtype)."""
    x = blocks.restore(source, (y.numel(),), y.dtype, BLOCK)  # what backward restores
    scalars, t_r, span = output_scalars(y, bound, absolute, learned, ceiling)
    r = y.reshape(-1).float() - prediction(x, approximate, scalars)
    # an exact zero's code (0) is far from the codes of values near 0 in [-D, D]: held
    # as float32's smallest step instead, where the tolerance dwarfs it
    r = torch.where((r == 0) & (t_r >= ZERO_TOLERANCE), SMALLEST, r)
    rbound, rabs, rceiling = residual_settings(bound, absolute)
    nsteps, bits = residual_slot(bound, absolute)
    record, used = blocks.compress(
        r, rbound, nsteps, bits, STEP_MARGIN, BLOCK, rabs, t_r, rceiling, span
    )
    return scalars, record, used


def restore(x, record, scalars, approximate: str, shape, dtype) -> torch.Tensor:
    """``y'`` of ``shape`` and ``dtype`` from the restored input ``x`` and the residual's
    record (its slot, or the slot's used prefix)."""
    p = prediction(x, approximate, scalars)
    r = blocks.restore(record, (p.numel(),), torch.float32, BLOCK)
    v = p.double() + r.double()
    lo, hi = scalars[0], scalars[1]
    inside = torch.where(v < lo, lo, torch.where(v > hi, hi, v))
    v = torch.where(torch.isfinite(v), round_to(inside, dtype), v)
    return v.to(dtype).reshape(shape)


def empty_pack(y: torch.Tensor, bound: float, absolute: bool):
    """What :func:`pack` gives an empty ``y``: zero scalars, an empty record's header."""
    record = torch.zeros(record_bytes(0, bound, absolute), dtype=torch.uint8, device=y.device)
    used = torch.full((1,), blocks.header_bytes(0, BLOCK), dtype=torch.int64, device=y.device)
    return torch.zeros(3, dtype=torch.float64, device=y.device), record, used
