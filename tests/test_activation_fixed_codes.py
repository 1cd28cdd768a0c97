"""Kinds of tensor held in fixed-width codes (activation_offload/codec.py, kernels.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression
from tensorpress.activation_offload.codec import (
    FIXED_MIN_GAIN,
    FIXED_RETRY_AFTER,
    FixedChoice,
    FixedCodes,
)
from tensorpress.compress import compress_tensor, decompress_tensor
from tensorpress.compress.block.codec import steps_for
from tensorpress.compress.block.kernels.encode import check_free_codes
from tensorpress.compress.kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.tensor import ValueRange

_SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 1e30]


@settings(max_examples=120, deadline=None)
@given(
    n=st.sampled_from([1, 7, 8, 9, 63, 8191, 8192, 8193, 20_011]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    spread=st.floats(0.01, 300.0),
    offset=st.floats(-50.0, 50.0),
    steps=st.floats(0.5, 300.0),
    special=st.sampled_from([None, *_SPECIALS]),
    seed=st.integers(0, 2**16),
)
def test_codes_restore_the_block_codecs_values_or_are_not_made(
    n, dtype, spread, offset, steps, special, seed
):
    g = torch.Generator().manual_seed(seed)
    t = ((torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * spread + offset).to(dtype)
    if special is not None:
        t[n // 2] = special
    tol = spread / steps / 2
    plan = FixedCodes.plan(t, tol, ValueRange(t))
    lo, hi = ValueRange(t).ends
    if plan is None:  # a value that is not finite, codes of more than 8 bits or unproven
        step, inv = steps_for(tol)
        prec = PREC_FLOAT32 if dtype == torch.float32 else PREC_FLOAT64
        free = check_free_codes(prec, False, tol, step)
        finite = bool(torch.isfinite(t).all())
        assert not finite or (hi - lo) * inv > 2**8 - 2 or max(-lo, hi) * inv > free - 1
        return
    low, width = plan
    codes = FixedCodes.of(t, tol, low, width)
    assert 1 <= width <= 8 and codes.nbytes == (n * width + 7) // 8 + 8
    y = codes.restore()
    assert y.shape == t.shape and y.dtype == dtype
    assert bool(((y.double() - t.double()).abs() <= tol).all())  # every element
    assert torch.equal(y, decompress_tensor(compress_tensor(t, "block", abs=tol)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_are_left_to_the_codec(dtype):
    t = torch.linspace(-3, 3, 1000).to(dtype)
    assert FixedCodes.plan(t, 0.05, ValueRange(t)) is None


def test_codes_past_the_proven_ones_are_left_to_the_codec():
    """Values far from zero: their codes need a check the fixed codes do not make."""
    t = torch.linspace(3000.0, 3001.0, 1000)
    assert FixedCodes.plan(t, 0.01, ValueRange(t)) is None
    assert FixedCodes.plan(t.double(), 0.01, ValueRange(t.double())) is not None


def test_a_kind_goes_to_fixed_codes_while_the_codec_saves_little():
    choice = FixedChoice()
    fixed = 1000
    assert not choice.take("a")
    choice.note("a", int(fixed * (1 - FIXED_MIN_GAIN)) + 1, fixed)  # saves too little
    assert all(choice.take("a") for _ in range(FIXED_RETRY_AFTER))
    assert not choice.take("a")  # then the codec is measured again
    choice.note("a", int(fixed * (1 - FIXED_MIN_GAIN)) - 1, fixed)  # it pays
    assert not choice.take("a") and not choice.take("a")


def test_a_layer_input_the_codec_packs_no_tighter_goes_to_fixed_codes_on_the_next_pass():
    """A linear layer's input of uniform values over about 40 steps: the codec's
    packings save little over 6 bits, so the second pass holds it in fixed-width codes,
    restored within the bound (debug check), the same gradient as the codec's."""
    torch.manual_seed(0)
    layer = nn.Linear(256, 8)
    x = (torch.rand(64, 256) * 8 - 4).requires_grad_()  # range 8, step about 0.2
    ac = ActivationCompression(codec="block", abs=0.1, zstd=None, debug=True)
    held, grads = [], []
    for _ in range(2):
        with ac:
            out = layer(x)
        out.square().sum().backward()
        grads.append(layer.weight.grad)
        layer.weight.grad = None
        held.append(ac.stats.rows["(top)"].stored_bytes)
    assert held[1] == FixedCodes.size(x.numel(), 6) and held[0] != held[1]
    assert held[1] <= held[0] / (1 - FIXED_MIN_GAIN)  # at most 5/3 of the codec's
    assert torch.equal(grads[0], grads[1])  # the same values restored either way
