"""Value ranges the hooks take without a pass over a saved tensor (activation_offload)."""

from __future__ import annotations

import gc
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression, Adaptive
from tensorpress.activation_offload.derived import GeluInputs
from tensorpress.compress.tensor import ValueRange
from torch.multiprocessing.reductions import StorageWeakRef


def _held(t: torch.Tensor):
    """A stand-in for a record held for ``t`` under an absolute bound, with its range."""
    return SimpleNamespace(
        span=ValueRange(t), mode="abs", dtype=t.dtype, shape=tuple(t.shape),
        version=0, current_version=lambda: 0,
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    scale=st.floats(1e-3, 1e3),
    offset=st.floats(-20.0, 20.0),
    n=st.sampled_from([1, 2, 17, 1000]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    approximate=st.sampled_from(["none", "tanh"]),
    seed=st.integers(0, 2**16),
)
def test_a_gelu_outputs_stand_in_span_is_no_wider_than_its_range(
    scale, offset, n, dtype, approximate, seed
):
    g = torch.Generator().manual_seed(seed)
    w = torch.ones(1, 1, dtype=dtype, requires_grad=True)
    x = torch.randn(n, 1, generator=g, dtype=dtype) * scale + offset
    h = x @ w  # a node for GELU's input, as a layer's output has
    y = F.gelu(h, approximate=approximate)
    inputs = GeluInputs()
    inputs.add(h, _held(h.detach()), math.inf)
    span = inputs.output_span(y)
    assert span is not None
    lo, hi = span.finite
    true_lo, true_hi = ValueRange(y.detach()).finite
    assert 0.0 <= hi - lo <= true_hi - true_lo  # a bound relative to it is no looser


def test_a_tensor_that_is_not_a_gelus_output_has_no_stand_in():
    w = torch.ones(3, 3, requires_grad=True)
    h = torch.randn(4, 3) @ w
    inputs = GeluInputs()
    inputs.add(h, _held(h.detach()), math.inf)
    assert inputs.output_span(torch.relu(h)) is None
    assert inputs.output_span(F.gelu(torch.randn(4, 3, requires_grad=True))) is None


@pytest.mark.parametrize("rel", [1e-2, 5e-2])
def test_an_mlps_gelu_output_is_derived_without_a_pass_over_it(rel, monkeypatch):
    """Linear -> GELU -> Linear under rel: the GELU's output is restored as GELU of its
    input within its bound (debug check) and no range is taken of it."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 32))
    x = torch.randn(512, 32, requires_grad=True)
    ranged = []
    real = ValueRange.__init__

    def counting(self, t):
        ranged.append(t.numel())
        real(self, t)

    monkeypatch.setattr(ValueRange, "__init__", counting)
    ac = ActivationCompression(codec="block", rel=rel, min_bytes=0, debug=True)
    with ac:
        out = mlp(x)
    out.square().mean().backward()
    assert ac.stats.records.get("GeluOfInput") == 1
    assert ranged.count(512 * 256) == 1  # GELU's input only, not its output


@pytest.mark.parametrize(
    "kwargs",
    [{"rel": 1e-2}, {"rel": 5e-3}, {"rel": 1e-4}, {"rel": 2e-2, "adaptive": Adaptive()}],
)
def test_the_tensors_a_pass_holds_codes_for_are_freed_after_forward(kwargs):
    """A record keeps its tensor's range, never the tensor: each activation saved (block,
    int8 and fixed-width codes, GELU and view records over three passes) is freed when
    the forward pass lets go of it, and backward still restores it."""
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(32, 256), nn.Linear(256, 32)
    ac = ActivationCompression(codec="block", min_bytes=0, debug=True, **kwargs)
    for _ in range(3):  # fixed-width codes are chosen from a kind's second tensor on
        x = torch.randn(512, 32, requires_grad=True)
        with ac:
            h = fc1(x)
            g = F.gelu(h)
            t = torch.tanh(g * 3)  # tanh saves its output, fc2 its input: one record
            out = fc2(t)
        refs = [StorageWeakRef(v.untyped_storage()) for v in (h, g, t)]
        del h, g, t
        gc.collect()
        assert [r.expired() for r in refs] == [True, True, True]
        out.square().mean().backward()  # restored within the bound (debug=True checks)
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    assert ac.stats.records.get("Compressed", 0) >= 1


def test_attentions_probabilities_reshaped_for_a_product_take_no_second_range(monkeypatch):
    """Softmax saves its output, the batched product a reshaped view of the same memory:
    one range is taken of those values, and both are restored within the bound."""
    torch.manual_seed(0)
    b, h, t, d = 4, 4, 64, 32
    q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
    ranged = []
    real = ValueRange.__init__

    def counting(self, x):
        ranged.append(x.numel())
        real(self, x)

    monkeypatch.setattr(ValueRange, "__init__", counting)
    ac = ActivationCompression(codec="block", rel=1e-2, min_bytes=0, debug=True)
    with ac:
        att = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        out = att @ v
    out.square().mean().backward()
    assert ac.stats.records.get("ViewOfRegion", 0) >= 1  # the product's view of att
    assert ranged.count(b * h * t * t) == 1
    assert all(bool(torch.isfinite(x.grad).all()) for x in (q, k, v))
