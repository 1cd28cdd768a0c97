"""A GELU's output on the device path held as the residual from GELU of its held input
(activation_offload/device/gelu.py): every element of the restored output within the
output's own bound for float16, bfloat16 and float32 of odd sizes with NaN and infinities,
whatever the output (also not GELU of the input); the hook path on meta tensors and with
no host reads; gradients close to the host path's; fewer bytes than the output's own
codes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression, Rules
from tensorpress.activation_offload.device import tiles
from tensorpress.activation_offload.device.tile_records import (
    BlockCodes,
    Compactor,
    GeluResidual,
)
from tensorpress.activation_offload.stats import ActivationStats
from test_device_activations import mlp, step
from test_device_blocks import tensors
from test_device_codes import refuse_host_reads


def assert_within_tol(y: torch.Tensor, z: torch.Tensor, tol: float) -> None:
    """Every finite element of ``z`` within ``tol`` of ``y`` (in float64); NaN where ``y``
    is NaN and the same infinities."""
    assert z.shape == y.shape and z.dtype == y.dtype
    a, b = y.double().reshape(-1), z.double().reshape(-1)
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    inf = torch.isinf(a)
    assert torch.equal(a[inf], b[inf])
    fin = torch.isfinite(a)
    if bool(fin.any()):
        err = float((a[fin] - b[fin]).abs().max())
        assert err <= tol, (err, tol)


def bound_of(y: torch.Tensor, rel=None, abs=None, learned=None, ceiling=None) -> float:
    """The output's absolute bound, computed here in float64 from its finite range."""
    a = y.double().reshape(-1)
    a = a[torch.isfinite(a)]
    span = float(a.max() - a.min()) if a.numel() else 0.0
    scale, base = (1.0, abs) if abs is not None else (span, rel)
    tol = base * scale
    if learned is not None and not math.isnan(float(learned)):
        tol = min(max(float(learned), tol), ceiling * scale)
    return tol


def held_pair(x, y, approximate="none", x_rel=1e-2, **bound):
    """(the input's block codes, the output's residual record) as the hooks make them."""
    stats = ActivationStats()
    src = BlockCodes(x, x_rel, stats, "gelu", False)
    rel = bound.pop("rel", None)
    return src, GeluResidual(y, src, approximate, rel, stats, "next", False, **bound)


BOUNDS = st.one_of(
    st.builds(dict, rel=st.sampled_from([1e-1, 1e-2, 1e-3, 1e-5])),
    st.builds(dict, abs=st.sampled_from([0.0, 1e-6, 1e-3, 0.1, 1e30])),
    st.builds(
        dict,
        rel=st.sampled_from([1e-2, 1e-3]),
        learned=st.sampled_from([math.nan, 0.0, 1e-3, 0.05, 1e3]),
        ceiling=st.just(0.05),
    ),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=tensors(),
    bound=BOUNDS,
    approximate=st.sampled_from(["none", "tanh"]),
    kind=st.sampled_from(["gelu", "other", "itself"]),
    x_rel=st.sampled_from([1e-1, 1e-2, 1e-4]),
)
def test_every_element_of_the_output_within_its_bound(x, bound, approximate, kind, x_rel):
    if kind == "gelu":  # what the hooks see: GELU's output in the dtype
        y = F.gelu(x, approximate=approximate)
    elif kind == "other":  # any output at all keeps the bound, held or not predicted well
        y = torch.flip(x, (0,)) * 3
    else:
        y = x.clone()
    if "learned" in bound:
        bound["learned"] = torch.tensor([bound["learned"]], dtype=torch.float64)
    tol = bound_of(y, **bound)
    _, rec = held_pair(x, y, approximate, x_rel, **bound)
    z = rec.restore()
    assert_within_tol(y, z, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_residual_holds_fewer_bytes_than_the_output_and_restores_the_same(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4099, generator=g) * 2).to(dtype)
    y = F.gelu(x)
    src, rec = held_pair(x, y, rel=1e-2)
    own = BlockCodes(y, 1e-2, ActivationStats(), "own", False)
    assert rec.nbytes < own.nbytes * 0.7
    first, second = rec.restore(), rec.restore()  # the same bits each time
    ints = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(first.view(ints), second.view(ints))
    assert_within_tol(y, first, bound_of(y, rel=1e-2))


def gelu_rows(ac):
    """(bytes held for GELU's input, for its output) in ``mlp``'s rows."""
    return ac.stats.rows["2"].stored_bytes, ac.stats.rows["3"].stored_bytes


def test_the_hook_path_holds_the_residual_and_gradients_stay_close():
    model = mlp("cpu")
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)
    _, gx0, grads0 = step(model, None, x, y)
    kw = {"rel": 1e-3, "min_bytes": 0, "device_path": True}
    ac = ActivationCompression("block", debug=True, **kw)  # debug: every bound checked
    _, gx, grads = step(model, ac, x, y)
    assert ac.stats.records.get("GeluResidual") == 1
    host = ActivationCompression("block", debug=True, **{**kw, "device_path": False})
    _, gxh, gradsh = step(model, host, x, y)
    for a, b, c in zip([gx0, *grads0], [gx, *grads], [gxh, *gradsh], strict=True):
        cos = F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0)
        cos_host = F.cosine_similarity(a.double().flatten(), c.double().flatten(), dim=0)
        assert float(cos) > 0.995 and float(cos) > float(cos_host) - 0.002
    plain = ActivationCompression("block", rules=Rules(()), **kw)
    step(model, plain, x, y)
    assert "GeluResidual" not in plain.stats.records  # the rule is opt-in with the others
    held_in, held_out = gelu_rows(ac)
    assert held_in == gelu_rows(plain)[0]
    assert held_out < gelu_rows(plain)[1] * 0.7


def test_no_host_reads_over_a_gelu_mlp(monkeypatch):
    model = mlp("cpu")
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=True)
    tolist = torch.Tensor.tolist

    def lagged_read(host):  # the one read allowed: a record's size (``LaggedSize``)
        assert host.device.type == "cpu" and host.dtype == torch.int64 and host.numel() == 1
        return int(tolist(host)[0])

    monkeypatch.setattr(tiles, "read_host", lagged_read)
    refuse_host_reads(monkeypatch)
    with ac:
        loss = F.cross_entropy(model(x.requires_grad_(True)), y)
    loss.backward()
    monkeypatch.undo()
    assert ac.stats.records.get("GeluResidual") == 1
    assert math.isfinite(float(x.grad.abs().sum()))


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_hook_path_on_meta_tensors(adaptive):
    model = mlp("meta")
    x = torch.empty(128, 64, device="meta")
    y = torch.empty(128, dtype=torch.long, device="meta")
    ac = ActivationCompression("block", rel=1e-2, min_bytes=0, adaptive=adaptive)
    _, gx, grads = step(model, ac, x, y)
    assert gx.shape == x.shape and gx.device.type == "meta"
    assert all(g is not None and g.device.type == "meta" for g in grads)
    assert ac.stats.records.get("GeluResidual") == 1
    # the residual's slot, known before its kernel runs: rel / 5's codes and 24 bytes
    slot = tiles.worst_size(128 * 256, 1e-2 / 5) + 24
    assert ac.stats.rows["3"].stored_bytes == slot


def test_an_input_modified_in_place_after_saving_is_not_a_source():
    x = torch.randn(64, 300, requires_grad=True)
    ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=True)
    with ac:
        h = x * 2
        a = F.gelu(h)
        h.add_(1)  # GELU's backward would raise; its output must not be derived from h
        b = a * a
    assert "GeluResidual" not in ac.stats.records
    with pytest.raises(RuntimeError, match="inplace"):
        b.sum().backward()


def test_saved_again_under_the_bound_alone_the_residual_is_made_again_within_it():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3001, generator=g)
    y = F.gelu(x)
    learned = torch.tensor([0.04 * float(y.max() - y.min())], dtype=torch.float64)
    _, rec = held_pair(x, y, rel=1e-3, learned=learned, ceiling=0.05)
    loose = rec.nbytes
    assert_within_tol(y, rec.restore(), float(learned))
    grown = rec.tighten(y, {"rel": 1e-3}, Compactor())  # another op saves y: rel alone
    assert grown == rec.nbytes - loose > 0
    assert_within_tol(y, rec.restore(), bound_of(y, rel=1e-3))
