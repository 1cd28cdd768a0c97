"""The ``block`` decoder: what it relies on, and its values against a plain reference."""

from __future__ import annotations

import numpy as np
import torch
from numba import float32, njit
from tensorpress.compress.kernels.rounding import (
    PREC_BFLOAT16,
    PREC_FLOAT16,
    round_via_float32,
)


@njit(cache=True)
def _rounded(x, prec, out):
    for i in range(x.size):
        out[i] = float32(round_via_float32(float(x[i]), prec))


def _hard_float32s() -> np.ndarray:
    """float32 values where a cast to 16 bits is easy to get wrong: exact ties and their
    neighbours at the float16 and bfloat16 cuts, subnormals of both, values near the
    overflow thresholds, zeros and infinities of both signs, and random bits."""
    rng = np.random.default_rng(7)
    hi = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    ties = [(hi & ~np.uint32(0x1FFF)) | 0x1000, (hi & ~np.uint32(0xFFFF)) | 0x8000]
    bits = np.concatenate([hi, *ties, *[t + 1 for t in ties], *[t - 1 for t in ties]])
    x = bits.view(np.float32)
    special = np.array(
        [65504, 65519.99, 65520, 65536, 3.4e38, 6e-8, 3e-8, 2.9e-8, 1e-40, 1e-45, 0.0, np.inf],
        np.float32,
    )
    x = np.concatenate([x, special, -special, np.exp2(np.arange(-149.0, 128.0)).astype(np.float32)])
    return x[np.isfinite(x) | np.isinf(x)]


def test_16bit_values_are_a_cast_of_their_float32_values():
    """The decoder writes 16-bit values as float32 and casts them: that must round as
    the encoder's check does (round_via_float32), ties to even, subnormals and overflow
    included."""
    x = _hard_float32s()
    via = np.empty_like(x)
    _rounded(x, PREC_FLOAT16, via)
    with np.errstate(over="ignore"):
        assert np.array_equal(
            via.astype(np.float16).view(np.uint16), x.astype(np.float16).view(np.uint16)
        )
    _rounded(x, PREC_BFLOAT16, via)
    as_bf16 = [torch.from_numpy(a).to(torch.bfloat16).view(torch.int16) for a in (via, x)]
    assert torch.equal(*as_bf16)
