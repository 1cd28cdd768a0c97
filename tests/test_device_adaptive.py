"""Adaptive and ``abs`` bounds on the device path (activation_offload/device/bounds.py):
no host read in a training step (an update step of the adaptive bounds included), the
whole hook path on meta tensors, every restored tensor within its bound (debug mode),
gradients close to the host path's, a loss's log-probabilities held under ``abs``, and
a record made under a learned tolerance held under the bound when saved again."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression, Adaptive
from tensorpress.activation_offload.device import tiles
from tensorpress.activation_offload.device.tile_records import BlockCodes, Compactor
from tensorpress.activation_offload.device.tiles import worst_size
from tensorpress.activation_offload.stats import ActivationStats
from test_device_activations import mlp, step
from test_device_blocks import assert_within
from test_device_codes import refuse_host_reads

ADAPTIVE = {"rel": 1e-2, "adaptive": Adaptive(update_every=1, ceiling=0.1, gradient_error=0.1)}
BOUNDS = [ADAPTIVE, {"abs": 1e-2}]


def batch(n: int = 128):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def allow_lagged_reads(monkeypatch) -> None:
    """The one read allowed: a block record's size, copied to the host behind an event
    (on the CPU, where the device is the host, at once)."""
    tolist = torch.Tensor.tolist

    def lagged_read(host):
        assert host.device.type == "cpu" and host.dtype == torch.int64 and host.numel() == 1
        return int(tolist(host)[0])

    monkeypatch.setattr(tiles, "read_host", lagged_read)


@pytest.mark.parametrize("bound", BOUNDS, ids=["adaptive", "abs"])
def test_a_training_step_reads_nothing_back(monkeypatch, bound):
    model, (x, y) = mlp("cpu"), batch()
    ac = ActivationCompression("block", min_bytes=0, device_path=True, **bound)
    step(model, ac, x, y)  # adaptive: the first update step learns the tolerances
    allow_lagged_reads(monkeypatch)
    refuse_host_reads(monkeypatch)
    loss, gx, _ = step(model, ac, x, y)  # an update step again, held under what it learned
    monkeypatch.undo()
    assert math.isfinite(float(gx.abs().sum()))
    assert ac.stats.stored_bytes < ac.stats.saved_bytes / 3
    if "adaptive" in bound:
        tols = ac.bounds.tolerances  # read back here, outside the step
        assert {"0", "3", "5"} <= tols.keys() and all(t > 0 for t in tols.values())


def test_learned_tolerances_hold_fewer_bytes_than_the_bound_alone():
    model, (x, y) = mlp("cpu"), batch()
    held = {}
    for name, bound in (("rel", {"rel": 1e-2}), ("adaptive", ADAPTIVE)):
        ac = ActivationCompression("block", min_bytes=0, device_path=True, debug=True, **bound)
        for _ in range(2):  # debug: every restored tensor checked against its bound
            step(model, ac, x, y)
        held[name] = ac.stats.rows["3"].stored_bytes  # a linear layer's input
    assert held["adaptive"] < held["rel"]


@pytest.mark.parametrize("bound", BOUNDS, ids=["adaptive", "abs"])
def test_the_whole_hook_path_runs_on_meta_tensors(bound):
    model = mlp("meta")
    x = torch.empty(128, 64, device="meta")
    y = torch.empty(128, dtype=torch.long, device="meta")
    ac = ActivationCompression("block", min_bytes=0, **bound)
    for _ in range(2):  # adaptive: the second step holds under learned (meta) tolerances
        _, gx, grads = step(model, ac, x, y)
    assert gx.device.type == "meta" and all(g.device.type == "meta" for g in grads)
    # Linear 0's input stays in its worst-case slot (a meta tensor's size never arrives)
    kind = {"abs": 1e-2} if "abs" in bound else {"rel": 1e-2}
    assert ac.stats.rows["0"].stored_bytes == worst_size(128 * 64, **kind)


@pytest.mark.parametrize(
    "bound", [{"rel": 1e-2, "adaptive": Adaptive(update_every=1)}, {"abs": 1e-2}]
)
def test_gradients_close_to_the_host_path(bound):
    model, (x, y) = mlp("cpu"), batch(256)
    _, gx0, grads0 = step(model, None, x, y)
    cosines = {}
    for device_path in (False, True):
        ac = ActivationCompression("block", min_bytes=0, device_path=device_path, **bound)
        for _ in range(2):
            _, gx, grads = step(model, ac, x, y)
        cosines[device_path] = [
            float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))
            for a, b in zip([gx0, *grads0], [gx, *grads], strict=True)
        ]
    for host, device in zip(cosines[False], cosines[True], strict=True):
        assert device > 0.95 and device > host - 0.01, (host, device)


@pytest.mark.parametrize("adaptive", [False, True])
def test_log_probabilities_are_held_under_abs(adaptive):
    # cross entropy's log-softmax output: the absolute bound rel (the ceiling when
    # adaptive), as on the host path; the fixed codes (rel only) keep it as it is
    torch.manual_seed(0)
    logits = (torch.randn(512, 256) * 4).requires_grad_(True)
    target = torch.randint(0, 256, (512,))
    exact = torch.autograd.grad(F.cross_entropy(logits, target), logits)[0]
    for layout in ("fixed", "blocks"):
        kw = {"adaptive": Adaptive(ceiling=0.05)} if adaptive else {}
        ac = ActivationCompression(
            "block", rel=1e-2, min_bytes=0, device_path=True, device_layout=layout, **kw
        )
        with ac:
            loss = F.cross_entropy(logits, target)
        stats = ac.stats
        (g,) = torch.autograd.grad(loss, logits)
        tol = 0.05 if adaptive else 1e-2  # each probability within about tol of itself
        assert float((g - exact).abs().max()) <= 1.1 * tol / 512
        full = logits.numel() * logits.element_size()  # the log-probabilities' bytes
        if layout == "blocks":
            assert stats.stored_bytes < full / 2
        elif not adaptive:
            assert stats.stored_bytes >= full


def test_a_record_under_a_learned_tolerance_is_tightened_when_saved_again():
    x = torch.randn(50, 300)
    span = float(x.max() - x.min())
    stats = ActivationStats()
    loose = torch.tensor([0.3 * span], dtype=torch.float64)
    rec = BlockCodes(x, 1e-2, stats, "lin", False, learned=loose, ceiling=0.5)
    assert rec.tighten(x, {"rel": 1e-2, "learned": loose}, Compactor()) == 0  # the same
    loose_bytes = rec.nbytes
    # another weighted layer with a smaller learned tolerance: the smaller one holds
    finer = torch.tensor([0.05 * span], dtype=torch.float64)
    grew = rec.tighten(x, {"rel": 1e-2, "learned": finer, "ceiling": 0.5}, Compactor())
    assert grew > 0 and rec.nbytes == loose_bytes + grew
    assert_within(x, rec.restore(), 0.05)
    # an op the learned tolerance does not apply to: the bound alone
    assert rec.tighten(x, {"rel": 1e-2}, Compactor()) > 0
    assert_within(x, rec.restore(), 1e-2)
    assert rec.tighten(x, {"rel": 1e-2}, Compactor()) == 0  # nothing tighter left
