"""Saved activations moved into a TieredStore: exact with codec=None, bounded with a codec."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensorpress.activation_offload import (
    ActivationCompression,
    Offload,
    TieredStore,
    offload_activations,
)
from tensorpress.activation_offload.identity import VersionWatch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.proj, self.norm = nn.Linear(16, 32), nn.LayerNorm(32)
        self.qkv, self.head = nn.Linear(32, 96), nn.Linear(32, 4)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)), inplace=True).flatten(2).transpose(1, 2)
        h = F.gelu(self.proj(h))
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm(h)).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        h = h + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        return self.head(h).mean(1)


def _grads(model, ctx, x, y):
    model.zero_grad(set_to_none=True)
    with ctx:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _data():
    torch.manual_seed(0)
    return Net(), torch.randn(8, 3, 12, 12), torch.randint(0, 4, (8,))


def test_nvme_offload_gives_bit_identical_gradients(tmp_path):
    model, x, y = _data()
    want = _grads(model, torch.enable_grad(), x, y)
    with TieredStore(32 * 1024, nvme_dir=tmp_path) as store:
        ac = offload_activations(store, min_bytes=0)
        for _ in range(2):  # and again on the same store
            got = _grads(model, ac, x, y)
            assert all(torch.equal(want[k], got[k]) for k in want)
        assert store.stats.spilled_bytes > 0 and store.stats.read_bytes > 0
        assert store.stats.prefetched_gets > 0
        assert len(store) == 0 and store.stats.nvme_bytes == 0  # all freed by backward
        assert ac.stats.peak_device_bytes < ac.stats.peak_stored_bytes


def test_prefetch_follows_the_reverse_save_order(tmp_path):
    """Prefetching one record ahead in the reverse save order, backward finds nearly
    every record on its way back when it asks (the store's ``prefetched_gets``); each
    record is read from its file once, the gradients are exact and all is freed."""
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(64, 64), nn.Tanh())]
    model, x, y = (
        nn.Sequential(*layers, nn.Linear(64, 4)),
        torch.randn(32, 64),
        torch.arange(32) % 4,
    )
    want = _grads(model, torch.enable_grad(), x, y)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        got = _grads(model, offload_activations(store, min_bytes=0, prefetch=1), x, y)
        s = store.stats
        assert s.puts >= 6 and s.gets == s.puts
        assert s.prefetched_gets >= s.gets - 2
        assert s.read_bytes == s.spilled_bytes == s.put_bytes  # none read twice
        assert len(store) == 0 and s.nvme_bytes == 0
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_block_codec_with_cpu_offload_keeps_the_bound():
    model, x, y = _data()
    with TieredStore(1 << 20) as store:
        ac = ActivationCompression("block", abs=1e-3, min_bytes=0, offload=store, debug=True)
        got = _grads(model, ac, x, y)
        assert ac.stats.ratio > 1 and ac.stats.peak_device_bytes < ac.stats.peak_stored_bytes
    want = _grads(model, torch.enable_grad(), x, y)
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=0.05, atol=1e-3)


def test_in_place_change_after_saving_still_raises(tmp_path):
    w = torch.randn(64, 64, requires_grad=True)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        with offload_activations(store, min_bytes=0):
            a = torch.randn(64, 64)
            out = (a @ w).sum()
        a.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()


def test_saving_a_view_never_moves_the_version_of_its_siblings():
    """q, k and v share one version counter; saving k must not change it even for a
    moment, or the store, still copying q in a worker, sees q "modified in place". Every
    Python event while k is watched reads q's version (a thread switch can fall there)."""
    base = torch.randn(8, 3, 2, 144, 16)
    q, k = base[:, 0], base[:, 1]
    seen = []
    sys.setprofile(lambda frame, event, arg: seen.append(q._version))
    try:
        watch = VersionWatch(k)
    finally:
        sys.setprofile(None)
    assert seen and set(seen) == {0}
    assert watch.current == 0 and watch.stride is not None
    base.add_(1)  # a real in-place change is still seen through the watch
    assert watch.current == q._version == 1


def test_offload_arguments(tmp_path):
    with pytest.raises(TypeError, match="offload takes"):
        ActivationCompression(None, offload="disk")
    with pytest.raises(TypeError, match="TieredStore"):
        Offload(store=object())
    with pytest.raises(ValueError, match="prefetch"):
        Offload(prefetch=-1)
    with TieredStore(1024) as store:
        ac = ActivationCompression(None, offload=store)
        assert ac.store is store and ac.prefetch == 2
    ac = ActivationCompression(None, offload=Offload(prefetch=3))
    assert ac.store is not None and ac.store.spill is None and ac.prefetch == 3
    ac.store.close()
