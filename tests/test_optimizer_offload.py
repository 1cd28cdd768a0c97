"""Optimizer state in a TieredStore: bit-identical training, checkpoints, schedulers, remove."""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from tensorpress.activation_offload import (
    Handle,
    OptimizerOffload,
    TieredStore,
    offload_optimizer_state,
)

KIB = 1 << 10
MIN_BYTES = 4096
OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
}


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # weights 16 KiB..32 KiB (offloaded), biases 128..512 B (kept: < MIN_BYTES)
    return nn.Sequential(
        nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 8)
    )


def _batches(n: int = 10):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(n)]


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch) -> None:
    x, y = batch
    opt.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _adam_pair():
    """Two equal models, each with its own Adam: (ref, model, plain, opt)."""
    ref, model = _model(), _model()
    return ref, model, torch.optim.Adam(ref.parameters()), torch.optim.Adam(model.parameters())


def _step_both(ref, plain, model, opt, batches) -> None:
    """Train ``ref`` with ``plain`` and ``model`` with ``opt`` on the same batches; the
    two must stay equal after every step."""
    for b in batches:
        _step(ref, plain, b)
        _step(model, opt, b)
        assert _same_params(ref, model)


@contextlib.contextmanager
def _offloaded_adam(tmp_path):
    """(ref, model, plain, opt, store, off, batches): Adam with its state offloaded,
    three steps into six batches, beside plain Adam on an equal model."""
    ref, model, plain, opt = _adam_pair()
    batches = _batches(6)
    with _store(tmp_path) as store:
        off = offload_optimizer_state(opt, store)
        _step_both(ref, plain, model, opt, batches[:3])
        yield ref, model, plain, opt, store, off, batches


def _same_params(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def _state_nbytes(opt, min_bytes=MIN_BYTES) -> int:
    """Bytes of the state tensors an offload of a plain optimizer would hold."""
    return sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.numel() * v.element_size() >= min_bytes
    )


def _store(tmp_path, cpu_bytes=32 * KIB, **kw) -> TieredStore:
    return TieredStore(cpu_bytes, nvme_dir=tmp_path, **kw)


def _check_offloaded(opt, plain, off, store) -> None:
    """Big state are our handles holding the plain run's values; small state are tensors."""
    for p, q in zip(opt.state, plain.state, strict=True):
        s, ref = opt.state[p], plain.state[q]
        assert s.keys() == ref.keys()
        for key, v in s.items():
            r = ref[key]
            if r.dim() > 0 and r.numel() * r.element_size() >= MIN_BYTES:
                assert isinstance(v, Handle), key
                assert torch.equal(store.get(v), r), key
            else:
                assert isinstance(v, torch.Tensor) and torch.equal(v, r), key
    assert off.state_bytes == _state_nbytes(plain) > 0


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_bit_identical_to_plain_training_with_spilling(tmp_path, name):
    make = OPTIMIZERS[name]
    ref, model = _model(), _model()
    plain, opt = make(ref.parameters()), make(model.parameters())
    with _store(tmp_path) as store:
        off = offload_optimizer_state(opt, store)
        assert isinstance(off, OptimizerOffload) and off.optimizer is opt and off.store is store
        assert off.state_bytes == 0 and len(store) == 0  # the first step starts from nothing
        for batch in _batches():
            _step(ref, plain, batch)
            _step(model, opt, batch)
            assert _same_params(ref, model)
            _check_offloaded(opt, plain, off, store)
        assert _state_nbytes(plain) > store.pool.capacity  # the state does not fit
        assert store.stats.spilled_bytes > 0
        assert store.stats.peak_cpu_bytes <= store.pool.capacity
        n_big = sum(isinstance(v, Handle) for s in opt.state.values() for v in s.values())
        assert len(store) == n_big  # the old records were deleted
        off.remove()


def test_offload_of_existing_state_and_min_bytes(tmp_path):
    ref, model, plain, opt = _adam_pair()
    batches = _batches(6)
    _step_both(ref, plain, model, opt, batches[:2])
    with _store(tmp_path) as store:
        # min_bytes=0: every tensor but the 0-d step counters goes to the store
        off = offload_optimizer_state(opt, store, min_bytes=0)
        for s in opt.state.values():
            assert isinstance(s["step"], torch.Tensor) and s["step"].dim() == 0
            assert isinstance(s["exp_avg"], Handle) and isinstance(s["exp_avg_sq"], Handle)
        assert off.state_bytes == _state_nbytes(plain, min_bytes=0)
        with pytest.raises(ValueError, match="offloaded already"):
            offload_optimizer_state(opt, store)
        for b in batches[2:]:
            _step(ref, plain, b)
            _step(model, opt, b)
            assert _same_params(ref, model)
        off.remove()
        # hooks gone: a second offload is allowed, and undone again
        offload_optimizer_state(opt, store).remove()


def test_state_dict_gives_tensors_and_keeps_handles(tmp_path):
    with _offloaded_adam(tmp_path) as (ref, model, plain, opt, store, off, batches):
        sd, want = opt.state_dict(), plain.state_dict()
        assert sd["param_groups"] == want["param_groups"]
        assert sd["state"].keys() == want["state"].keys()
        for k, s in sd["state"].items():
            assert s.keys() == want["state"][k].keys()
            for key, v in s.items():
                assert type(v) is torch.Tensor and torch.equal(v, want["state"][k][key]), key
        _check_offloaded(opt, plain, off, store)  # still handles in the optimizer
        records = len(store)
        sd2 = opt.state_dict()  # no records leak from reading them
        assert len(store) == records
        sd2["state"][0]["exp_avg"].zero_()  # a copy, not the stored state
        _step_both(ref, plain, model, opt, batches[3:])
        off.remove()


def test_load_state_dict_offloads_again_without_leaks(tmp_path):
    with _offloaded_adam(tmp_path) as (ref, model, plain, opt, store, off, batches):
        records = len(store)
        opt.load_state_dict(copy.deepcopy(plain.state_dict()))  # plain state_dict aliases
        assert len(store) == records  # the old records were deleted, the new ones put
        _check_offloaded(opt, plain, off, store)
        _step_both(ref, plain, model, opt, batches[3:])
        off.remove()


_RESUME = """
import sys
import torch
sys.path.insert(0, {tests!r})
from test_optimizer_offload import _batches, _model, _step
from tensorpress.activation_offload import Handle, TieredStore, offload_optimizer_state

model = _model(seed=123)  # different weights: the checkpoint must overwrite them
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
with TieredStore(32 * 1024, nvme_dir={nvme!r}) as store:
    off = offload_optimizer_state(opt, store)
    model.load_state_dict(torch.load({ckpt!r})["model"])
    opt.load_state_dict(torch.load({ckpt!r})["opt"])
    assert any(isinstance(v, Handle) for s in opt.state.values() for v in s.values())
    assert off.state_bytes > 0
    for batch in _batches()[5:]:
        _step(model, opt, batch)
    assert store.stats.spilled_bytes > 0
    off.remove()
torch.save([p.detach() for p in model.parameters()], {out!r})
"""


def test_checkpoint_resume_in_a_fresh_process(tmp_path):
    batches = _batches()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with _store(tmp_path) as store:
        off = offload_optimizer_state(opt, store)
        for b in batches[:5]:
            _step(model, opt, b)
        ckpt = tmp_path / "ckpt.pt"
        sd = opt.state_dict()
        assert all(type(v) is torch.Tensor for s in sd["state"].values() for v in s.values())
        torch.save({"model": model.state_dict(), "opt": sd}, ckpt)
        off.remove()
    out = tmp_path / "params.pt"
    script = _RESUME.format(
        tests=str(Path(__file__).parent),
        nvme=str(tmp_path),
        ckpt=str(ckpt),
        out=str(out),
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    ref = _model()
    plain = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for b in batches:
        _step(ref, plain, b)
    resumed = torch.load(out)
    assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), resumed, strict=True))


def test_lr_scheduler(tmp_path):
    ref, model = _model(), _model()
    plain, opt = torch.optim.Adam(ref.parameters()), torch.optim.Adam(model.parameters())
    with _store(tmp_path) as store:
        off = offload_optimizer_state(opt, store)
        assert isinstance(opt, torch.optim.Optimizer)
        sched_ref = torch.optim.lr_scheduler.StepLR(plain, step_size=2, gamma=0.5)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for b in _batches(7):
            _step(ref, plain, b)
            _step(model, opt, b)
            sched_ref.step()
            sched.step()
            assert sched.get_last_lr() == sched_ref.get_last_lr()
            assert _same_params(ref, model)
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**3)
        off.remove()


def test_remove_restores_tensors(tmp_path):
    ref, model = _model(), _model()
    plain = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = _batches(8)
    with _store(tmp_path) as store:
        off = offload_optimizer_state(opt, store)
        for b in batches[:4]:
            _step(ref, plain, b)
            _step(model, opt, b)
        off.remove()
        off.remove()  # idempotent
        assert len(store) == 0 and off.state_bytes == 0
        for p, q in zip(opt.state, plain.state, strict=True):
            got = opt.state[p]["momentum_buffer"]
            assert type(got) is torch.Tensor and torch.equal(got, plain.state[q]["momentum_buffer"])
        for b in batches[4:]:
            _step(ref, plain, b)
            _step(model, opt, b)
            assert _same_params(ref, model)
            assert not any(isinstance(v, Handle) for s in opt.state.values() for v in s.values())
        assert len(store) == 0


@pytest.mark.parametrize(
    ("name", "bound"), [("sgd_momentum", {"rel": 1e-3}), ("adam", {"pw_rel": 1e-3})]
)
def test_codec_store_stays_close(tmp_path, name, bound):
    make = OPTIMIZERS[name]
    ref, model = _model(), _model()
    plain, opt = make(ref.parameters()), make(model.parameters())
    with _store(tmp_path, codec="block", **bound) as store:
        off = offload_optimizer_state(opt, store)
        for b in _batches():
            _step(ref, plain, b)
            _step(model, opt, b)
        off.remove()
    diff = max(
        (p - q).abs().max().item()
        for p, q in zip(ref.parameters(), model.parameters(), strict=True)
    )
    assert diff > 0  # the codec did run
    # measured ~1e-4 (SGD) and ~1e-5 (Adam); a state lost every step moves weights
    # ~1e-2..1e-1 away from the plain run, a stale or garbled one further
    assert diff < 1e-3


@pytest.mark.parametrize(
    "codec", [{"codec": "block", "rel": 1e-3}, {"codec": "quant", "bits": 8}], ids=["rel", "quant"]
)
def test_a_codec_that_garbles_second_moments_warns(tmp_path, codec):
    # a range-relative or bits-bounded codec decodes exp_avg_sq's small entries as ~0:
    # Adam's updates lr * m / (sqrt(v) + eps) then blow up
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with _store(tmp_path, **codec) as store:
        off = offload_optimizer_state(opt, store)
        with pytest.warns(RuntimeWarning, match="exp_avg_sq"):
            _step(model, opt, _batches(1)[0])
        off.remove()


def test_a_pointwise_bound_on_second_moments_does_not_warn(tmp_path):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with _store(tmp_path, codec="block", pw_rel=1e-3) as store:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with offload_optimizer_state(opt, store):
                _step(model, opt, _batches(1)[0])


def test_bad_arguments():
    model = _model()
    with TieredStore(1 << 20) as store:
        with pytest.raises(TypeError, match="register_step_pre_hook"):
            offload_optimizer_state(object(), store)
        opt = torch.optim.Adam(model.parameters())
        with pytest.raises(TypeError, match="TieredStore"):
            offload_optimizer_state(opt, {})
        with pytest.raises(ValueError, match="min_bytes"):
            offload_optimizer_state(opt, store, min_bytes=-1)
        with offload_optimizer_state(opt, store) as off:
            _step(model, opt, _batches(1)[0])
            assert off.state_bytes > 0
        assert len(store) == 0
