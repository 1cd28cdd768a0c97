"""A GELU's output on the device path, held as the residual from GELU of its held input.

A transformer's MLP saves its GELU's input ``x`` (for GELU's backward) and its output
``y = GELU(x)`` (for the next linear layer's): two tensors of the MLP's width. The host
path restores ``y`` as GELU of ``x``'s record when ``x`` is held tightly enough
(``derived.py``), which needs the host to know both records' absolute bounds. Here the
bounds stay device scalars, so ``y`` is held as block codes of a residual instead::

    p = clamp(GELU(x'), lo, hi) (lo where NaN) if use else 0   in y's dtype
    r = float32(y) - float32(p)                                 one float32 rounding
    r' = block codes of r within the absolute tolerance t_r     (a device scalar)
    y' = round(clamp(float64(p) + float64(r'), lo, hi))         to y's dtype

``x'`` is what backward restores for GELU's input, ``[lo, hi]`` is ``y``'s finite range
and ``T`` its tolerance (``rel (hi - lo)``, or the learned one held between the bound and
the ceiling: the kernel's ``tolerance``), all computed on the device at pack time. As
``x'`` is within a few steps of ``x`` and GELU's slope is at most 1.13, ``r`` spans a few
of ``y``'s steps, so its blocks take a few bits where ``y``'s take the bits of its
range (the LM of ``benchmarks/activations.py`` shows the difference). The pair is found
as the host path finds it (``derived.py``): the input's record is noted by its autograd
node, and the output's node (or the reshape a linear layer saves) leads to it.

The residual's slot. Under ``rel``, ``p`` and a finite ``y`` lie in ``[lo, hi]``, so
``r`` spans at most ``2 (1 + 2**-24) (hi - lo)`` (where not ``use``, ``r = y``: at most
``hi - lo``), and ``t_r >= rel (hi - lo) (1 - 2**-7) / 2``. Codes made under
``rel / 5`` of ``r``'s own range with ``t_r`` as a learned tolerance (held at least at
that bound, which stays below ``t_r``) therefore keep ``t_r``, and their slot is
``rel / 5``'s: two or three bits more than the output's own, known before the kernel
runs. Under ``abs`` the residual takes the raw fallback's slot, as the output would.

The bound, with ``M = max(|lo|, |hi|)``, for a finite ``y`` (a dtype value):

- ``|p| <= M`` (clamped, or 0), so ``|y - p| <= 2M``, and the float32 subtraction is
  off by at most ``2**-24 * 2M`` (subnormal differences are exact; ``M <= 2**126``
  keeps it finite).
- ``|r' - r| <= t_r`` (block codes' bound, with their own rounding).
- the float64 sum is off by at most ``2**-53 (|p| + |r'|) <= 2**-53 (3M + T)``;
  clamping to ``[lo, hi]``, which holds ``y``, only moves it closer to ``y``.
- so ``v`` is within ``t_r + d`` of ``y``, ``d <= M (2**-23 + 2**-51) + 2**-53 T``, and
  where ``use`` (``M <= 2**14 T``) that is at most ``t_r + 2**-9 T + 2**-36 T``.
- rounding to the dtype: where the dtype's half unit at ``max(M, tiny)`` is at most
  ``2**-8 T`` (the block codes' ``coarse`` test), ``t_r = T (1 - 2**-7)`` and the error is
  at most ``T (1 - 2**-7) + 2**-8 T + 2**-8 T = T``. Elsewhere ``t_r = T/2 (1 - 2**-7)``:
  rounding to nearest moves ``v`` no farther than ``y`` is (``y`` is a dtype value), so
  the error is at most ``2 (t_r + d) <= T``.
- where not ``use``, ``p = 0``: ``r = y`` exactly and ``d = 0``, the same cases hold.

Non-finite values: ``p`` is finite, so a NaN or infinite ``y`` gives a NaN or infinite
``r`` of the same kind (block codes hold those exactly) and ``p + r'`` restores it.

Determinism: backward computes ``p`` again from the same ``x'`` (the same record restored
by the same op on the same device: the codes' restore reads the record and nothing else)
with the same ``F.gelu`` in the same dtype. An elementwise op computes each element with
the same instructions each time on CUDA; on the CPU the split into vector runs follows
the element count and the thread count, which are the same in forward and backward.
So ``p`` is bit-identical at pack and restore, which the proof needs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..compress.device_blocks import compress_blocks, restore_blocks
from ..compress.kernels.device_blocks_torch import coarse, tolerance
from ..compress.kernels.device_codes_layout import supports
from ..compress.kernels.device_codes_torch import finite_range, round_to
from .derived import GELU_NODE, RESHAPES

#: the residual's step margin: the block codes' room for rounding to the dtype
MARGIN = 1 - 2**-7
#: the prediction is used where ``M <= USE_SPAN * T`` (the float32 residual's rounding,
#: at most ``2**-23 M``, then stays within ``2**-9 T``)
USE_SPAN = 2.0**14
#: the largest ``M`` for which ``y - p`` stays finite in float32
FINITE_SPAN = 2.0**126
#: under ``rel``, the residual's codes are made under ``rel / RESIDUAL_SHARE`` of its own
#: range: ``y - p`` spans at most twice ``y``'s range and ``t_r`` is at least half of
#: ``rel`` of it, so that bound stays under ``t_r`` (which the codes then keep) and sizes
#: the slot
RESIDUAL_SHARE = 5
#: the ceiling the residual's codes are given: large enough never to cut below ``t_r``,
#: finite so that a constant residual (range 0) keeps a zero tolerance
RESIDUAL_CEILING = 2.0**60


def gelu_input(inputs, t: torch.Tensor):
    """(record noted in ``inputs`` for GELU's input, GELU's ``approximate``) when ``t`` is
    a GELU's output (or the reshape of it a linear layer saves) and that input is noted,
    still at the version it was saved at and of ``t``'s size and dtype; else None."""
    if inputs is None:
        return None
    fn = t.grad_fn
    if type(fn).__name__ in RESHAPES:  # a linear layer flattens its input
        fn = fn.next_functions[0][0]
    if type(fn).__name__ != GELU_NODE:
        return None
    node, nr = fn.next_functions[0]
    rec, source_nr, _, _ = inputs._by_node.get(node, (None,) * 4)
    if rec is None or source_nr != nr or rec.current_version() != rec.version:
        return None
    if rec.dtype != t.dtype or math.prod(rec.shape) != t.numel():
        return None
    return rec, fn._saved_approximate


def residual_bound(rel, abs) -> dict:
    """The keywords of ``compress_blocks`` (but ``learned``) for the residual of an output
    held under ``rel`` or ``abs``: under ``rel`` a slot of ``rel / RESIDUAL_SHARE``'s codes;
    under ``abs`` (whose steps have no ceiling) the raw fallback's slot."""
    if abs is None and supports(torch.float32, rel / RESIDUAL_SHARE):
        return {"rel": rel / RESIDUAL_SHARE, "ceiling": RESIDUAL_CEILING}
    return {"rel": None, "abs": 0.0, "ceiling": math.inf}


def output_scalars(y: torch.Tensor, bound: float, absolute: bool, learned, ceiling: float):
    """(scalars float64 ``[lo, hi, use]`` of ``y``, the residual's tolerance ``t_r`` as a
    float64 tensor of one element), on the device; ``bound`` and the rest as the block
    codes' ``tolerance`` takes them."""
    lo, hi = finite_range(y.reshape(-1))
    tol = tolerance(lo, hi, bound, absolute, learned, ceiling)
    top = torch.maximum(lo.abs(), hi.abs())
    use = (top <= tol * USE_SPAN) & (top <= FINITE_SPAN)
    fine = coarse(lo, hi, tol, y.dtype)
    t_r = torch.where(fine, tol, tol * 0.5) * MARGIN
    return torch.stack([lo, hi, use.to(torch.float64)]), t_r.reshape(1)


def prediction(x: torch.Tensor, approximate: str, scalars: torch.Tensor) -> torch.Tensor:
    """``p``: GELU of the restored input ``x`` clamped to the output's finite range
    (``lo`` where NaN), or 0 everywhere where the prediction is not used; flat, in
    ``x``'s dtype."""
    g = F.gelu(x.reshape(-1), approximate=approximate)
    lo, hi = scalars[0].to(g.dtype), scalars[1].to(g.dtype)  # dtype values: exact
    p = torch.minimum(torch.maximum(g, lo), hi)  # NaN stays NaN, infinities clamp
    p = torch.where(torch.isnan(p), lo, p)
    return torch.where(scalars[2] > 0, p, torch.zeros_like(p))


def residual(y: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``r = float32(y) - float32(p)``, flat: one rounding."""
    return y.reshape(-1).float() - p.float()


def restore_output(p: torch.Tensor, r: torch.Tensor, scalars: torch.Tensor, shape, dtype):
    """``y'`` of ``shape`` and ``dtype`` from the prediction ``p`` and the restored
    residual ``r`` (both flat)."""
    v = p.double() + r.reshape(-1).double()
    lo, hi = scalars[0], scalars[1]
    finite = torch.isfinite(v)
    v = torch.where(finite, round_to(torch.minimum(torch.maximum(v, lo), hi), dtype), v)
    return v.to(dtype).reshape(shape)


def output_tolerance(y: torch.Tensor, bound: float, absolute: bool, learned, ceiling) -> float:
    """``T`` of ``y`` as a host float (reads ``y``: for checks outside the training step)."""
    lo, hi = finite_range(y.reshape(-1))
    return float(tolerance(lo, hi, bound, absolute, learned, ceiling))


def pack_output(y: torch.Tensor, source, source_shape, approximate: str, rel, abs, settings):
    """Hold GELU's output ``y`` as its residual from GELU of the input restored from the
    block record ``source`` (of ``source_shape``, ``y``'s dtype): (scalars, the residual's
    block record, its used bytes as a device scalar). ``settings`` are ``output_scalars``'s
    (bound, absolute, learned, ceiling)."""
    x = restore_blocks(source, source_shape, y.dtype)  # what backward restores
    scalars, t_r = output_scalars(y, *settings)
    r = residual(y, prediction(x, approximate, scalars))
    record, used = compress_blocks(r, learned=t_r, **residual_bound(rel, abs))
    return scalars, record, used


def unpack_output(x: torch.Tensor, record, approximate: str, scalars, shape, dtype):
    """GELU's output of ``shape`` and ``dtype`` from the restored input ``x`` and the
    residual's block record."""
    p = prediction(x, approximate, scalars)
    r = restore_blocks(record, (p.numel(),), torch.float32)
    return restore_output(p, r, scalars, shape, dtype)
