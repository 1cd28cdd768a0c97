"""``rel`` and ``abs`` bounds, learned (adaptive) tolerances and GELU residuals through an offload
store (activation_offload/device/tile_offload.py): every element within its bound after
the round trip, from the store or from the slot, for float16, bfloat16 and float32 of
odd sizes with NaN and infinities; the store holds each record's used bytes; the hook
path on meta tensors and with no host read; a resumed adaptive run reads nothing back."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression, Adaptive, TieredStore
from tensorpress.activation_offload.device.tile_records import BlockCodes, GeluResidual
from tensorpress.activation_offload.device.tiles import worst_size
from tensorpress.activation_offload.stats import ActivationStats
from test_device_activations import mlp, step
from test_device_blocks import bits, tensors
from test_device_codes import refuse_host_reads
from test_device_gelu import assert_within_tol, bound_of
from test_device_offload import allow_size_reads, lag_sizes

CUDA = torch.cuda.is_available()
ADAPTIVE = {"rel": 1e-2, "adaptive": Adaptive(update_every=1, ceiling=0.1, gradient_error=0.1)}
BOUNDS = [ADAPTIVE, {"abs": 1e-2}]
IDS = ["adaptive", "abs"]

RECORD_BOUNDS = st.one_of(
    st.builds(dict, rel=st.sampled_from([1e-1, 1e-2, 1e-4])),
    st.builds(dict, abs=st.sampled_from([0.0, 1e-6, 1e-3, 0.1, 1e30])),
    st.builds(
        dict,
        rel=st.sampled_from([1e-2, 1e-3]),
        learned=st.sampled_from([math.nan, 0.0, 1e-3, 0.05, 1e3]),
        ceiling=st.just(0.05),
    ),
)


def _batch(n: int = 128):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def _record(kind: str, x: torch.Tensor, bound: dict, stats, store):
    """(source record or None, the record) made as the hooks make them: block codes of
    ``x``, or GELU's output held as its residual from the block codes of ``x``."""
    bound = dict(bound)
    rel = bound.pop("rel", None)
    if kind == "blocks":
        return None, BlockCodes(x, rel, stats, "x", False, store=store, **bound)
    src = BlockCodes(x, 1e-2, stats, "gelu", False, store=store)
    y = F.gelu(x)
    return src, GeluResidual(y, src, "none", rel, stats, "next", False, store=store, **bound)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=tensors(),
    bound=RECORD_BOUNDS,
    kind=st.sampled_from(["blocks", "gelu"]),
    how=st.sampled_from(["store", "prefetch", "slot"]),
)
def test_every_element_within_its_bound_through_a_store(x, bound, kind, how):
    """Back from the store (prefetched or not), or from the slot when restored before the
    size arrives; the store then holds the record's used bytes: what the same record
    holds without a store."""
    if "learned" in bound:
        bound["learned"] = torch.tensor([bound["learned"]], dtype=torch.float64)
    y = x if kind == "blocks" else F.gelu(x)
    tol = bound_of(y, **bound)
    _, plain = _record(kind, x, bound, ActivationStats(), None)  # compact on the CPU
    stats = ActivationStats()
    with TieredStore(1 << 20) as store:
        with pytest.MonkeyPatch.context() as mp:
            if how == "slot":  # the sizes have not arrived: nothing is put
                lag_sizes(mp)
            src, rec = _record(kind, x, bound, stats, store)
            records = 1 if src is None else 2
            assert rec.compact == (how != "slot")
            assert len(store) == (0 if how == "slot" else records)
            if how == "slot" and src is None:  # the worst case's slot, on the device
                kw = {"abs": bound["abs"]} if "abs" in bound else {"rel": bound["rel"]}
                assert stats.device_bytes == worst_size(x.numel(), dtype=x.dtype, **kw)
            if how == "prefetch":
                rec.prefetch()  # the residual's source first
            z = rec.restore()
        assert_within_tol(y, z, tol)
        if how == "slot":  # the size arrives: the same record, from the store now
            assert rec.try_compact() and (src is None or src.try_compact())
            assert torch.equal(bits(rec.restore()), bits(z))
        if how == "prefetch":
            assert store.stats.prefetched_gets == store.stats.puts
        put = store.stats.put_bytes - (0 if src is None else src.nbytes)
        assert put == plain.record.numel()  # the used bytes, not the slot's
        assert stats.device_bytes == 0
        del rec, src
        assert len(store) == 0 and stats.live_bytes == 0


@pytest.mark.parametrize("bound", BOUNDS, ids=IDS)
def test_a_step_through_a_store_gives_the_gradients_held_without_one(bound):
    """Every block record (the GELU's residual too) goes to the store, each restored
    tensor within its bound (debug), and the gradients are those of the same records held
    on the device, bit for bit."""
    model, (x, y) = mlp("cpu"), _batch(64)
    kw = {"min_bytes": 0, "device_path": True, **bound}
    plain = ActivationCompression("block", **kw)
    with TieredStore(1 << 24) as store:
        ac = ActivationCompression("block", offload=store, debug=True, **kw)
        for _ in range(2):  # adaptive: the second step holds under what the first learned
            _, gx0, grads0 = step(model, plain, x, y)
            _, gx, grads = step(model, ac, x, y)
            for a, b in zip([gx0, *grads0], [gx, *grads], strict=True):
                assert torch.equal(a, b)
        assert ac.stats.stored_bytes == plain.stats.stored_bytes
        kinds = ac.stats.records
        assert kinds["GeluResidual"] == 1 and kinds["BlockCodes"] >= 4
        assert len(store) == 0 and ac.stats.live_bytes == 0
    if "adaptive" in bound:
        assert ac.bounds.tolerances == plain.bounds.tolerances != {}


def test_a_step_through_a_store_reads_nothing_back(monkeypatch):
    """Under ``abs``; adaptive bounds: test_a_resumed_adaptive_run_reads_nothing_back."""
    model, (x, y) = mlp("cpu"), _batch(64)
    with TieredStore(1 << 24) as store:
        kw = {"min_bytes": 0, "device_path": True, "abs": 1e-2}
        ac = ActivationCompression("block", offload=store, **kw)
        allow_size_reads(monkeypatch)
        refuse_host_reads(monkeypatch)
        _, gx, _ = step(model, ac, x, y)
        monkeypatch.undo()
        assert store.stats.puts > 0 and len(store) == 0
        assert ac.stats.records["GeluResidual"] == 1
    assert math.isfinite(float(gx.abs().sum()))


@pytest.mark.parametrize("bound", BOUNDS, ids=IDS)
def test_the_hook_path_with_a_store_runs_on_meta_tensors(bound):
    model = mlp("meta")
    x = torch.empty(128, 64, device="meta")
    y = torch.empty(128, dtype=torch.long, device="meta")
    with TieredStore(1 << 20) as store:
        # min_bytes keeps the int64 targets (put as they are) out of the store here
        ac = ActivationCompression("block", min_bytes=2048, offload=store, **bound)
        for _ in range(2):  # adaptive: the second step holds under learned (meta) tolerances
            _, gx, grads = step(model, ac, x, y)
        assert store.stats.puts == 0  # a meta tensor's size never arrives
        assert ac.stats.records["GeluResidual"] == 1
    assert gx.device.type == "meta" and all(g.device.type == "meta" for g in grads)
    kind = {"abs": 1e-2} if "abs" in bound else {"rel": 1e-2}
    assert ac.stats.rows["0"].stored_bytes == worst_size(128 * 64, **kind)


def _resumed(store=None, update_every: int = 1):
    """An adaptive ActivationCompression resumed after one update step on the CPU (so at
    step 1), and the tolerances that step learned."""
    model, (x, y) = mlp("cpu"), _batch()
    adaptive = Adaptive(update_every=update_every, ceiling=0.1, gradient_error=0.1)
    kw = {"min_bytes": 0, "device_path": True, "rel": 1e-2, "adaptive": adaptive}
    first = ActivationCompression("block", **kw)
    step(model, first, x, y)
    state = first.state_dict()
    resumed = ActivationCompression("block", offload=store, **kw)
    resumed.load_state_dict(state)
    return resumed, state["bounds"]["tolerances"]


def test_a_resumed_adaptive_run_reads_nothing_back(monkeypatch):
    """Through a store, an update step held under the loaded tolerances."""
    model, (x, y) = mlp("cpu"), _batch(64)
    with TieredStore(1 << 24) as store:
        ac, learned = _resumed(store)
        assert ac.bounds.tolerances == learned != {}
        allow_size_reads(monkeypatch)
        refuse_host_reads(monkeypatch)
        _, gx, _ = step(model, ac, x, y)
        monkeypatch.undo()
        assert store.stats.puts > 0 and ac.stats.records["GeluResidual"] == 1
    assert math.isfinite(float(gx.abs().sum()))
    assert ac.bounds.tolerances.keys() == learned.keys()


def test_a_resumed_run_moves_its_tolerances_to_the_device_at_first_use():
    ac, learned = _resumed(update_every=2)  # step 1 does not update them
    model = mlp("meta")
    x = torch.empty(128, 64, device="meta")
    y = torch.empty(128, dtype=torch.long, device="meta")
    assert ac.bounds.learned("3", "weighted").device.type == "cpu"  # as loaded
    _, gx, _ = step(model, ac, x, y)
    assert gx.device.type == "meta"
    for name in learned:  # every tolerance on the model's device now
        assert ac.bounds.learned(name, "weighted").device.type == "meta"


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("with_store", [False, True])
def test_cuda_resumed_adaptive_step_never_synchronizes(with_store):
    """A resumed run's first step on CUDA under sync debug mode "error": the loaded
    tolerances reach the device in one copy from pinned memory, not waited for."""
    model, (x, y) = mlp("cuda"), _batch(512)
    x, y = x.cuda(), y.cuda()
    with TieredStore(1 << 26) as store:
        ac, _ = _resumed(store if with_store else None)
        warm = ActivationCompression("block", min_bytes=0, **ADAPTIVE)
        step(model, warm, x, y)  # kernels compiled, caches filled
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with ac:
                loss = F.cross_entropy(model(x.requires_grad_(True)), y)
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()  # every size has reached the host now
            torch.cuda.set_sync_debug_mode("error")
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(float(x.grad.abs().sum()))
