"""Fixed-width codes for tensors under a ``rel`` bound, made and restored on the device.

Inside a training step nothing may wait on the host, so a payload's size must be known
before a kernel runs. Under ``rel`` it is: the number of quantization steps across a
tensor's range is fixed by the bound alone, so the code width is too, and the range
itself (the finite min and max) is computed on the device and never read by the host.

The layout (one tensor of ``n`` elements, bound ``rel``):

- ``step = rel * (hi - lo) * STEP_MARGIN`` with ``lo``/``hi`` the finite min/max, all
  float64 device scalars; ``nsteps = ceil(1 / (rel * STEP_MARGIN))``.
- code ``q = rint((x - lo) / step)`` in ``0..nsteps`` for a finite ``x``;
  ``nsteps + 1`` NaN, ``nsteps + 2`` +Inf, ``nsteps + 3`` -Inf (restored as NaN, +Inf,
  -Inf; a NaN's payload bits are not kept), ``nsteps + 4`` zero (restored as +0.0: a
  ReLU's backward reads which of its saved outputs are zero, and ``lo + q * step``
  is exactly zero only where ``lo`` is).
- ``bits = ceil(log2(nsteps + 5))``; the codes of the elements in C order form one
  bitstream, each code LSB first, packed LSB first into ``ceil(n * bits / 8)`` uint8
  bytes (``payload``). ``scalars`` = float64 ``[lo, hi, step]`` on the same device.
- restore: ``r = lo + q * step`` in float64, clamped to ``[lo, hi]``, rounded to the
  nearest value of the dtype (ties to even). A constant tensor (``step`` 0) restores
  exactly.

Why every element keeps ``|x' - x| <= rel * (hi - lo)``: ``|r - x| <= step / 2`` plus
float64 error; ``x`` is a value of the dtype, so the nearest one to ``r`` is no
farther from ``r`` than ``x`` is, and ``|round(r) - x| <= 2 |r - x| <= step`` plus twice
the float64 error. A non-constant tensor's range is at least one unit in the last place
of its values, so for ``rel >= MIN_REL`` that error is below ``tol * 2**-9``, inside the
``2**-7`` margin. The clamp keeps ``r`` inside the range (no overflow to infinity at the
dtype's largest values) and can only bring it nearer to ``x``. float64 tensors are
refused: their own rounding is as fine as the arithmetic's.

What this layout refuses: ``abs`` and ``pw_rel`` bounds, per-layer bounds that change
step to step (adaptive), float64 and integer tensors, ``rel`` below ``MIN_REL``. The block
codes (``tiles.py``) hold ``abs`` and adaptive bounds; the rest keep the
callers' existing paths.

Why the width is the worst case the bound allows, and stays so. A payload sized before
the kernel runs must hold the worst tensor, and under ``rel`` that tensor needs every
code: about ``1 / rel`` neighbouring values of the dtype's grid whose spacing exceeds
``rel`` times their range must each come back exactly (float32 values near ``2**20``,
one unit in their last place apart, say; ``tests/test_device_codes.py`` builds one per
dtype). So ``32 / bits`` (``16 / bits`` for 16-bit dtypes) is this layout's ceiling,
and every lever that holds fewer bytes is data-dependent: widths per block from each
block's local range; a step twice as coarse for float32, whose rounding is negligible
next to most ranges; GELU's and layer norms' outputs restored from their inputs (as
``activation_offload/derived.py`` does), which needs the input held within the
output's range over the function's gain, a ratio of two ranges that the data sets
(for a transformer's GELU and layer norms, about one or two bits more); a loss's
log-probabilities under their absolute bound; ``abs`` bounds, whose ``range / abs``
steps have no ceiling at all. Each fits a slot of fixed size only with a fallback for
the tensor that does not fit, and a fallback of fixed capacity is as large as the
worst case it covers. A sound fallback therefore needs the host to learn, before a
tensor's memory is released, whether its compact form kept the bound: one read per
batch of saved tensors (their originals kept until then, which raises peak memory by
the batch), not per tensor. That read stops CUDA-graph capture and a fullgraph trace
of the forward pass, which this path exists to keep, so it belongs to a path of its
own, not to these ops. Where such a path learns widths from the previous step of the
same tensor kind (``abs``, adaptive bounds), a tensor that needs more than its slot is
still caught only by that read.

The kernels: a torch reference (``codes_torch.py``, any device, and what
``torch.compile`` fuses) and Triton kernels (``codes_triton.py``, CUDA:
one launch for the range, one to quantize and pack, one to restore). They produce the
same bytes and the same restored values. ``compress_codes`` / ``restore_codes`` go
through the ``torch.library`` custom ops ``tensorpress::device_codes`` and
``tensorpress::device_restore`` (``ops.py``), whose fake implementations give the
shapes from the layout alone: the path runs on meta tensors and traces under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops
from .codes_layout import (
    DTYPES,
    MIN_REL,
    N_SCALARS,
    SPECIAL_CODES,
    STEP_MARGIN,
    code_bits,
    payload_bytes,
    steps,
    supports,
)

__all__ = [
    "DTYPES",
    "MIN_REL",
    "STEP_MARGIN",
    "SPECIAL_CODES",
    "DeviceCodes",
    "code_bits",
    "compress_codes",
    "payload_bytes",
    "restore_codes",
    "steps",
    "supports",
]


@dataclass(frozen=True)
class DeviceCodes:
    """A tensor held as fixed-width codes on its device.

    ``payload``: uint8, ``payload_bytes(numel, bits)`` bytes; ``scalars``: float64
    ``[lo, hi, step]``; ``shape``/``dtype``: the tensor's; ``rel``: the bound."""

    payload: torch.Tensor
    scalars: torch.Tensor
    shape: tuple
    dtype: torch.dtype
    rel: float

    @property
    def bits(self) -> int:
        return code_bits(self.rel)

    @property
    def nbytes(self) -> int:
        """Bytes held on the device: the codes and the three scalars."""
        return self.payload.numel() + N_SCALARS * 8

    @property
    def device(self) -> torch.device:
        return self.payload.device


def compress_codes(x: torch.Tensor, rel: float) -> DeviceCodes:
    """``x`` (float16, bfloat16 or float32, any device) as codes within ``rel`` of its
    finite range; nothing is read back to the host."""
    if not supports(x.dtype, rel):
        raise ValueError(
            f"device codes hold {', '.join(str(d) for d in DTYPES)} under rel >= {MIN_REL}, "
            f"got {x.dtype} with rel={rel!r}"
        )
    payload, scalars = ops.eager(ops.device_codes, ops.codes, x.detach(), float(rel))
    return DeviceCodes(payload, scalars, tuple(x.shape), x.dtype, float(rel))


def restore_codes(codes: DeviceCodes) -> torch.Tensor:
    """The tensor ``codes`` hold, on their device."""
    args = (codes.payload, codes.scalars, list(codes.shape), codes.dtype, codes.rel)
    return ops.eager(ops.device_restore, ops.restore, *args)
