"""The device codes' layout, named once for every implementation: the step margin, the
code width a ``rel`` bound fixes, the payload's size (``codes.py`` says
what the fields mean and why the bound holds)."""

from __future__ import annotations

import math

import torch

#: the step is this much under the bound, which leaves room for the float64 arithmetic
STEP_MARGIN = 1.0 - 2.0**-7
#: the smallest rel bound the float64 arithmetic keeps (see codes.py)
MIN_REL = 1e-6
#: the dtypes a payload holds: every value of them is exact in float64 and float32
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SPECIAL_CODES = 4  # NaN, +Inf, -Inf and an exact zero after the finite codes
N_SCALARS = 3  # lo, hi, step (float64)


def steps(rel: float) -> int:
    """The largest finite code under ``rel``: steps across the tensor's range."""
    return math.ceil(1.0 / (rel * STEP_MARGIN))


def code_bits(rel: float) -> int:
    """Bits a code takes under ``rel`` (codes 0..steps, then NaN, +Inf, -Inf)."""
    return max(1, math.ceil(math.log2(steps(rel) + 1 + SPECIAL_CODES)))


def payload_bytes(numel: int, bits: int) -> int:
    """Bytes of the packed codes of ``numel`` elements at ``bits`` a code."""
    return (numel * bits + 7) // 8


def supports(dtype: torch.dtype, rel) -> bool:
    """Whether the layout keeps ``rel`` for tensors of ``dtype``."""
    ok = isinstance(rel, (int, float)) and math.isfinite(rel) and rel >= MIN_REL
    return dtype in DTYPES and ok
