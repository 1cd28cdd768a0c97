"""A GELU's output on the device path, held as the residual from GELU of its held input.

A transformer's MLP saves its GELU's input ``x`` (for GELU's backward) and its output
``y = GELU(x)`` (for the next linear layer's): two tensors of the MLP's width. The host
path restores ``y`` as GELU of ``x``'s record when ``x`` is held tightly enough
(``derived.py``), which needs the host to know both records' absolute bounds. Here the
bounds stay device scalars, so ``y`` is held as block codes of a residual instead::

    p = clamp(float32(g(x')), lo, hi) (lo where NaN) if use else 0
    r = float32(y) - p                                          one float32 rounding
    r' = block codes of r within the absolute tolerance t_r     (a device scalar)
    y' = round(clamp(float64(p) + float64(r'), lo, hi))         to y's dtype

``x'`` is what backward restores for GELU's input, ``g`` GELU in float64 basic operations
(``gelu_torch.py``: the same bits in the Triton kernels and the
torch reference, at pack and at restore, on any device; within ``2e-8`` of GELU),
``[lo, hi]`` is ``y``'s finite range and ``T`` its tolerance (``rel (hi - lo)``, or the
learned one held between the bound and the ceiling: the kernel's ``tolerance``), all
computed on the device at pack time. As ``x'`` is within a few steps of ``x`` and GELU's
slope is at most 1.13, ``r`` spans a few of ``y``'s steps, so its blocks take a few bits
where ``y``'s take the bits of its range (the LM of ``benchmarks/activations.py`` shows
the difference). The pair is found as the host path finds it (``derived.py``): the
input's record is noted by its autograd node, and the output's node (or the reshape a
linear layer saves) leads to it. Packing is two launches on CUDA (``y``'s range, then one
kernel that restores ``x'`` from its record and writes ``r``'s codes), restoring two
(``gelu_ops.py``).

The residual's range, from ``y``'s alone. Where ``use``, ``p`` and a finite ``y`` lie in
``[lo, hi]`` (dtype values), so ``|y - p| <= hi - lo`` exactly and, float32 rounding
being monotone, ``|r| <= float32(hi - lo) <= (hi - lo)(1 + 2**-24)``; ``D = (hi - lo)
(1 + 2**-20)`` computed in float64 (two roundings of ``2**-53``) is at least that, so
``[-D, D]`` holds every finite ``r``. Where not ``use``, ``p = 0`` and ``r = y`` exactly:
``[lo, hi]`` holds it. The residual's codes take that range as their ``lo``, ``hi``
(``device_blocks_torch.quantize``'s ``span``): its proof needs only a range that holds
every finite element (codes count steps from ``lo``; the restore clamps to the range,
which only moves a value towards its element), and a wider ``M`` makes the ``coarse``
and ``ABS_SPAN`` tests only more cautious. So one reduction over ``y`` gives every scalar,
and no pass over ``r`` is needed before its codes are written.

The residual's slot. Under ``rel``, its codes are made under ``rel / 5`` of that range
with ``t_r`` as a learned tolerance (held at least at that bound): the range spans at most
``2 D = 2 (1 + 2**-20)(hi - lo)`` (``hi - lo`` where not ``use``), so that bound is at most
``0.41 rel (hi - lo)``, below ``t_r >= rel (hi - lo) (1 - 2**-7) / 2``: the codes keep
``t_r``, and their slot is ``rel / 5``'s: two or three bits more than the output's own,
known before the kernel runs. Under ``abs`` the residual takes the raw fallback's slot,
as the output would (where ``use``, ``D <= 2**15 T``: no block goes raw by its steps).

The bound, with ``M = max(|lo|, |hi|)``, for a finite ``y`` (a dtype value):

- ``|p| <= M`` (clamped, or 0), so ``|y - p| <= 2M``, and the float32 subtraction is
  off by at most ``2**-24 * 2M`` (subnormal differences are exact; ``M <= 2**126``
  keeps it finite).
- ``|r' - r| <= t_r`` (block codes' bound, with their own rounding), plus ``2**-149``
  where a zero ``r`` is held as ``2**-149`` (only where ``t_r >= 2**-100``: at most
  ``2**-49 T``, inside the ``2**-10 T`` the sums below leave to spare).
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

Determinism: the proof needs ``p`` bit-identical at pack and restore. ``x'`` is the same
record restored by the same arithmetic (the packing kernel restores it as the block
codes' restore does, multiplications and additions each rounded once), and ``g`` is a
fixed sequence of correctly rounded float64 operations: the same bits wherever it runs.
"""

from __future__ import annotations

import math

import torch

from ...compress.bounds import tensor_range
from ..derived import GELU_NODE, RESHAPES
from . import gelu_ops
from .ops import eager
from .tiles_torch import tolerance


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


def output_tolerance(y: torch.Tensor, bound: float, absolute: bool, learned, ceiling) -> float:
    """``T`` of ``y`` as a host float (reads ``y``: for checks outside the training step)."""
    lo, hi = tensor_range(y.reshape(-1))
    return float(tolerance(lo, hi, bound, absolute, learned, ceiling))


def pack_output(y: torch.Tensor, source, source_shape, approximate: str, rel, abs, settings):
    """Hold GELU's output ``y`` as its residual from GELU of the input restored from the
    block record ``source`` (of ``source_shape``, ``y``'s dtype and element count):
    (scalars float64 ``[lo, hi, use]``, the residual's block record, its used bytes as a
    device scalar). ``settings`` are (bound, absolute, learned, ceiling) of ``y``'s bound
    (``rel`` or ``abs``, which ``bound`` and ``absolute`` repeat)."""
    bound, absolute, learned, ceiling = settings
    if math.prod(source_shape) != y.numel():
        raise ValueError(f"GELU's input holds {list(source_shape)}, its output {list(y.shape)}")
    args = (y.detach(), source, approximate, float(bound), bool(absolute), learned, float(ceiling))
    return eager(gelu_ops.gelu_residual, gelu_ops.pack, *args)


def unpack_output(x: torch.Tensor, record, approximate: str, scalars, shape, dtype):
    """GELU's output of ``shape`` and ``dtype`` (``x``'s) from the restored input ``x`` and
    the residual's block record."""
    if x.dtype != dtype:
        raise ValueError(f"GELU's input restores as {x.dtype}, its output is {dtype}")
    args = (x, record, scalars, approximate, list(shape))
    return eager(gelu_ops.gelu_residual_restore, gelu_ops.restore, *args)
