"""``ActivationCompression()`` with no arguments: the block codec at the documented
default bound, rel=1e-2 of each tensor's value range (docs/activations.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorpress as tp
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression
from tensorpress.compress import ErrorBound


def _mlp_grads(ctx) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.Tanh())
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1))
    with ctx:
        loss = F.mse_loss(model(x), torch.zeros(512, 64))
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_no_arguments_compress_at_the_default_bound():
    ac = ActivationCompression(debug=True, min_bytes=0)  # debug: unpack checks the bound
    assert ac.config["codec"] == "block" and ac.config["rel"] == 1e-2
    assert ac.config["abs"] is None and ac.config["pw_rel"] is None
    got = _mlp_grads(ac)
    assert ac.stats.ratio > 1.5
    exact = _mlp_grads(ActivationCompression(None))
    for name, g in exact.items():
        assert torch.linalg.norm(got[name] - g) <= 0.2 * torch.linalg.norm(g), name


def test_the_default_is_the_bound_written_out():
    default, written = ActivationCompression("sz"), ActivationCompression("sz", rel=1e-2)
    assert default.config == written.config


def test_a_given_bound_or_an_unbounded_codec_takes_no_default():
    assert ActivationCompression(abs=1e-3).config["rel"] is None
    assert ActivationCompression("quant", bits=4).config["rel"] is None
    with pytest.raises(ValueError, match="give exactly one error bound"):
        ActivationCompression(abs=1e-3, rel=1e-2)


@pytest.mark.parametrize(
    "bound", [{"rel": True}, {"rel": float("inf")}, {"abs": math.nan}, {"pw_rel": -1e-3}]
)
def test_a_bound_tp_compress_refuses_is_refused_here_too(bound):
    """The bound is an ErrorBound, checked once as tp.compress checks it: a flag or an
    infinity given as a bound raises, with the same message."""
    x = np.linspace(0, 1, 64, dtype=np.float32)
    with pytest.raises(ValueError, match="bound must be") as compress_error:
        tp.compress(x, codec="block", **bound)
    with pytest.raises(ValueError, match="bound must be") as hooks_error:
        ActivationCompression("block", **bound)
    assert str(hooks_error.value) == str(compress_error.value)


def test_the_bound_is_held_as_an_error_bound():
    assert ActivationCompression("sz").bound == ErrorBound("rel", 1e-2)
    assert ActivationCompression(pw_rel=0.1).bound == ErrorBound("pw_rel", 0.1)
    assert ActivationCompression("quant", bits=4).bound is None
