"""Device codes with an offload store (activation_offload/device_offload.py): records
round-trip within their bound through the pinned pool and through files, leave the
device's memory, and read nothing back to the host; tensors too small for the codes'
launches are kept exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression, TieredStore
from tensorpress.activation_offload.device_offload import DEVICE_MIN_ELEMENTS
from test_device_activations import mlp, step
from test_device_codes import refuse_host_reads

CUDA = torch.cuda.is_available()


def _batch(n=128, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    return x.to(device), torch.randint(0, 10, (n,), generator=g).to(device)


def _store(tier: str, tmp_path) -> TieredStore:
    if tier == "pool":
        return TieredStore(1 << 24)
    return TieredStore(0, nvme_dir=tmp_path)  # no pool: every record goes to a file


@pytest.mark.parametrize("tier", ["pool", "files"])
def test_round_trip_through_a_store_within_the_bound(tier, tmp_path):
    model = mlp("cpu")
    x, y = _batch()
    plain = ActivationCompression(
        "block", rel=1e-2, min_bytes=0, device_path=True, device_layout="fixed"
    )
    _, gx0, grads0 = step(model, plain, x, y)
    with _store(tier, tmp_path) as store:
        # debug: every restored tensor is checked against its bound, element by element
        ac = ActivationCompression(
            "block", rel=1e-2, min_bytes=0, device_path=True, offload=store, debug=True
        )
        _, gx, grads = step(model, ac, x, y)
        assert ac.stats.records["OffloadedCodes"] == plain.stats.records["DeviceCompressed"]
        assert store.stats.prefetched_gets == store.stats.puts  # every record came back
        if tier == "files":
            assert store.stats.spilled_bytes > 0 and store.stats.read_bytes > 0
        else:
            assert store.stats.spilled_bytes == 0 and store.stats.peak_cpu_bytes > 0
        assert len(store) == 0  # every record let go once backward used it
    # the same codes as without a store: the same gradients, bit for bit
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
    assert held["device"] > 20 * held["store"]


def test_pack_and_unpack_with_a_store_read_nothing_back(monkeypatch):
    model = mlp("cpu")
    x, y = _batch(64)
    with TieredStore(1 << 24) as store:
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=True, offload=store)
        x = x.requires_grad_(True)
        refuse_host_reads(monkeypatch)
        with ac:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        monkeypatch.undo()
        assert ac.stats.records["OffloadedCodes"] >= 3
        assert store.stats.gets == store.stats.puts > 0
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
    coded = "OffloadedCodes" if store else "BlockCodes"
    assert stats.records == {coded: 1}
    assert stats.stored_bytes < stats.saved_bytes / 4
    assert not torch.equal(grad, exact)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_offloaded_codes_round_trip():
    model = mlp("cuda")
    x, y = _batch(512, device="cuda")
    plain = ActivationCompression("block", rel=1e-2, min_bytes=0)
    _, gx0, _ = step(model, plain, x, y)
    with TieredStore(1 << 26) as store:
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, offload=store, debug=True)
        _, gx, _ = step(model, ac, x, y)
        assert ac.stats.records["OffloadedCodes"] >= 3
        assert store.stats.prefetched_gets > 0
    assert torch.equal(gx0, gx)
