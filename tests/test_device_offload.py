"""Device codes with an offload store (activation_offload/device/tile_offload.py):
block records hold their slot until their size arrives, then their used bytes go to the
store; they round-trip within their bound through the pinned pool and through files,
restore from the slot when asked before their put, leave the device's memory, and read
nothing back to the host but their sizes; tensors too small for the codes' launches are
kept exactly. Each bound's records, element by element: tests/test_store_bounds.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression, Offload, TieredStore
from tensorpress.activation_offload.device import tiles
from tensorpress.activation_offload.device.code_offload import DEVICE_MIN_ELEMENTS
from tensorpress.activation_offload.device.tiles import LaggedSize, worst_size
from test_device_activations import mlp, step
from test_device_codes import refuse_host_reads

CUDA = torch.cuda.is_available()


def allow_size_reads(monkeypatch) -> None:
    """Let through the one host read the block records make: their size, copied to the
    host (pinned memory behind an event on CUDA; at once on the CPU, where the device
    is the host)."""
    tolist = torch.Tensor.tolist

    def lagged_read(host):
        assert host.device.type == "cpu" and host.dtype == torch.int64 and host.numel() == 1
        return int(tolist(host)[0])

    monkeypatch.setattr(tiles, "read_host", lagged_read)


def lag_sizes(monkeypatch) -> dict:
    """The device lagging behind the host, on the CPU: no record's size arrives while
    ``arrived["now"]`` is False."""
    arrived = {"now": False}
    ready = LaggedSize.ready
    monkeypatch.setattr(LaggedSize, "ready", lambda self: arrived["now"] and ready(self))
    return arrived


def _batch(n=128, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    return x.to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def _store(tier: str, tmp_path) -> TieredStore:
    if tier == "pool":
        return TieredStore(1 << 24)
    return TieredStore(0, nvme_dir=tmp_path)  # no pool: every record goes to a file


@pytest.mark.parametrize("tier, prefetch", [("pool", 2), ("files", 2), ("pool", 0)])
def test_round_trip_through_a_store_within_the_bound(tier, prefetch, tmp_path):
    model = mlp("cpu")
    x, y = _batch()
    plain = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=True)
    _, gx0, grads0 = step(model, plain, x, y)
    with _store(tier, tmp_path) as store:
        # debug: every restored tensor is checked against its bound, element by element
        offload = Offload(store, prefetch)
        ac = ActivationCompression(
            "block", rel=1e-2, min_bytes=0, device_path=True, offload=offload, debug=True
        )
        _, gx, grads = step(model, ac, x, y)
        # the same block records as without a store: block codes, the GELU's residual,
        # and the loss's log-probabilities under abs
        for kind in ("BlockCodes", "GeluResidual"):
            assert ac.stats.records[kind] == plain.stats.records[kind] > 0
        # every record came back, prefetched where asked (debug reads each once more)
        assert store.stats.gets >= store.stats.puts
        # each prefetched once (the GELU's pack read its input's record back once more)
        assert store.stats.prefetched_gets == (store.stats.puts if prefetch else 0)
        if tier == "files":
            assert store.stats.spilled_bytes > 0 and store.stats.read_bytes > 0
        else:
            assert store.stats.spilled_bytes == 0 and store.stats.peak_cpu_bytes > 0
        assert len(store) == 0  # every record let go once backward used it
    # the same block codes as without a store: the same gradients, bit for bit
    for a, b in zip([gx0, *grads0], [gx, *grads], strict=True):
        assert torch.equal(a, b)
    assert ac.stats.stored_bytes == plain.stats.stored_bytes


def test_the_fixed_layout_puts_fixed_width_codes_at_once():
    """device_layout="fixed" with a store: the fixed-width codes, put as they are made
    (their size follows from the element count), within the bound, the same gradients as
    without a store."""
    model = mlp("cpu")
    x, y = _batch()
    kwargs = {"rel": 1e-2, "min_bytes": 0, "device_path": True, "device_layout": "fixed"}
    plain = ActivationCompression("block", **kwargs)
    _, gx0, grads0 = step(model, plain, x, y)
    with TieredStore(1 << 24) as store:
        ac = ActivationCompression("block", offload=store, debug=True, **kwargs)
        _, gx, grads = step(model, ac, x, y)
        assert ac.stats.records["OffloadedCodes"] == plain.stats.records["DeviceCompressed"]
        assert len(store) == 0
    for a, b in zip([gx0, *grads0], [gx, *grads], strict=True):
        assert torch.equal(a, b)
    assert ac.stats.stored_bytes == plain.stats.stored_bytes


def test_offloaded_codes_leave_the_device_memory(tmp_path):
    model = mlp("cpu")
    x, y = _batch()
    x = x.requires_grad_(True)
    held = {}
    for name, store in (("device", None), ("store", TieredStore(1 << 24))):
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=True, offload=store)
        with ac:
            loss = F.cross_entropy(model(x), y)
        held[name] = ac.stats.device_bytes  # what stays on the device until backward
        loss.backward()
        if store is not None:
            store.close()
    # with a store only tensors under DEVICE_MIN_ELEMENTS stay: the 128 x 10 log-probs
    # and the layer norm's statistics (128 means and 128 inverse deviations), and the
    # loss's scalar
    assert held["store"] <= (128 * 10 + 2 * 128 + 1) * 4
    assert held["device"] > 10 * held["store"]


@pytest.mark.parametrize("lag", [False, True])
def test_pack_and_unpack_with_a_store_read_nothing_back(monkeypatch, lag):
    """Records put as they are made, or (``lag``) held in their slots through the forward
    pass and put by backward's unpacks once their sizes arrive."""
    model = mlp("cpu")
    x, y = _batch(64)
    with TieredStore(1 << 24) as store:
        # one record prefetched ahead: backward puts the records that far from its use
        offload = Offload(store, 1)
        ac = ActivationCompression(
            "block", rel=1e-2, min_bytes=0, device_path=True, offload=offload
        )
        x = x.requires_grad_(True)
        arrived = lag_sizes(monkeypatch)
        arrived["now"] = not lag
        allow_size_reads(monkeypatch)
        refuse_host_reads(monkeypatch)
        with ac:
            loss = F.cross_entropy(model(x), y)
        puts = store.stats.puts
        arrived["now"] = True
        loss.backward()
        monkeypatch.undo()
        assert ac.stats.records["BlockCodes"] >= 3
        assert store.stats.gets >= store.stats.puts > 0
        assert (store.stats.puts > puts) == lag  # the unpacks put what the forward held
    assert bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("store", [False, True])
def test_tensors_too_small_for_a_launch_are_kept_exactly(store):
    """sin saves its input: one element under DEVICE_MIN_ELEMENTS it is kept as it is
    (and counted), at DEVICE_MIN_ELEMENTS it is held as codes."""
    results = {}
    with TieredStore(1 << 24) as s:
        for n in (DEVICE_MIN_ELEMENTS - 1, DEVICE_MIN_ELEMENTS):
            x = torch.randn(n, generator=torch.Generator().manual_seed(n)).requires_grad_(True)
            ac = ActivationCompression(
                "block", rel=1e-2, min_bytes=0, device_path=True, offload=s if store else None
            )
            with ac:
                y = torch.sin(x)
            y.sum().backward()
            results[n] = (ac.stats, x.grad, torch.cos(x.detach()))
    stats, grad, exact = results[DEVICE_MIN_ELEMENTS - 1]
    assert stats.records == {"Kept": 1}
    assert stats.saved_bytes == stats.stored_bytes == (DEVICE_MIN_ELEMENTS - 1) * 4
    assert torch.equal(grad, exact)  # sin's backward read the saved input exactly
    stats, grad, exact = results[DEVICE_MIN_ELEMENTS]
    assert stats.records == {"BlockCodes": 1}
    assert stats.stored_bytes < stats.saved_bytes / 4
    assert not torch.equal(grad, exact)


def test_records_backward_reaches_soon_stay_in_their_slots(monkeypatch):
    """Sizes that arrive only in backward: the forward pass holds slots and puts nothing;
    backward puts the records whose use is far enough off (prefetched later, each got
    once), and restores the rest from their slots, never put: no copy out and straight
    back. This gives the gradients of records put at once, bit for bit."""
    model = mlp("cpu")
    x, y = _batch()
    arrived = lag_sizes(monkeypatch)
    result = {}
    for lag in (False, True):
        arrived["now"] = not lag
        with TieredStore(1 << 24) as store:
            ac = ActivationCompression(
                "block", rel=1e-2, min_bytes=0, device_path=True, offload=Offload(store, 1)
            )
            x_ = x.detach().requires_grad_(True)
            with ac:
                loss = F.cross_entropy(model(x_), y)
            kinds = ac.stats.records
            blocks = kinds["BlockCodes"] + kinds["GeluResidual"]
            exact = kinds["Offloaded"]  # the targets (int64), put as they are
            assert store.stats.puts == exact + (0 if lag else blocks)
            arrived["now"] = True  # every size is there when backward starts
            loss.backward()
            stored = store.stats
            result[lag] = (stored.puts - exact, stored.gets, stored.prefetched_gets, blocks)
            result[lag] += (stored.puts, x_.grad)
            assert len(store) == 0 and ac.stats.live_bytes == 0  # every record let go
    put, gets, prefetched, blocks, puts, gx = result[True]
    put0, _, _, blocks0, _, gx0 = result[False]
    assert blocks == blocks0 == put0 >= 5  # at once, every block record is put
    # backward puts the records far from its frontier: each comes back once, prefetched
    assert 0 < put < blocks and gets == prefetched == puts
    assert torch.equal(gx, gx0)


def test_the_hook_path_with_a_store_runs_on_meta_tensors():
    """A meta tensor's size never arrives: the slots stay on the device, nothing is put,
    and forward and backward run through with the shapes alone."""
    model = mlp("meta")
    x = torch.empty(128, 64, device="meta")
    y = torch.empty(128, dtype=torch.long, device="meta")
    with TieredStore(1 << 20) as store:
        # min_bytes keeps the log-probabilities (held exactly, so put as they are) here
        ac = ActivationCompression("block", rel=1e-2, min_bytes=8192, offload=store)
        _, gx, grads = step(model, ac, x, y)
        assert store.stats.puts == 0
        assert ac.stats.records["BlockCodes"] >= 3
        assert ac.stats.rows["0"].stored_bytes == worst_size(128 * 64, 1e-2)
    assert gx.shape == x.shape and gx.device.type == "meta"
    assert all(g is not None and g.device.type == "meta" for g in grads)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_offloaded_blocks_round_trip():
    model = mlp("cuda")
    x, y = _batch(512, device="cuda")
    plain = ActivationCompression("block", rel=1e-2, min_bytes=0)
    _, gx0, _ = step(model, plain, x, y)
    with TieredStore(1 << 26) as store:
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, offload=store, debug=True)
        _, gx, _ = step(model, ac, x, y)
        assert ac.stats.records["BlockCodes"] >= 3
        assert store.stats.gets >= store.stats.puts > 0
    assert torch.equal(gx0, gx)  # from a slot or from the store: the same block codes


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("prefetch", [0, 2])
def test_cuda_offloaded_step_never_synchronizes(prefetch):
    """Forward and backward with a store under sync debug mode "error": the forward pass
    holds slots and puts what has arrived; with every size arrived, backward's unpacks
    put the rest and get every record back, prefetched or not, all without a host wait
    (a worker's would fail its record, and the get raise it)."""
    model = mlp("cuda")
    x, y = _batch(512, device="cuda")
    plain = ActivationCompression("block", rel=1e-2, min_bytes=0)
    _, gx0, _ = step(model, plain, x, y)
    with TieredStore(1 << 26) as store:
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, offload=Offload(store, prefetch))
        step(model, ac, x, y)  # warm-up: kernels compiled, caches filled
        x = x.detach().requires_grad_(True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with ac:
                loss = F.cross_entropy(model(x), y)
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()  # every size has reached the host now
            torch.cuda.set_sync_debug_mode("error")
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        # the targets (int64), put as they are, are the last record saved
        assert (store.stats.prefetched_gets > 0) == (prefetch > 0)
        assert len(store) == 0
    assert torch.equal(gx0, x.grad)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_store_reuses_extents_only_once_their_copies_are_done():
    """Puts, gets (prefetched or not) and deletes through a pool with room for three
    records, the host running ahead of the device: extents are handed out again as
    their copies finish (or, the pool full, once the store has waited for them), and
    every tensor comes back with its own bytes."""
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(1 << 16, generator=g).cuda() for _ in range(24)]
    got = []
    with TieredStore(3 * (1 << 18)) as store:
        for i in range(0, len(xs), 3):
            hs = [store.put(x) for x in xs[i : i + 3]]
            store.prefetch(hs[1])
            got += [store.get(h) for h in hs]
            for h in hs:
                store.delete(h)
        assert store.stats.host_bytes == 0 and store.stats.peak_host_bytes == 0
    for x, y in zip(xs, got, strict=True):
        assert torch.equal(x, y)
