"""Activation compression on the device path (activation_offload/device/code_records.py):
the whole pack/unpack path on meta tensors, gradients on the CPU when asked for, no
reads back to the host, and the settings that keep the existing path."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression, Adaptive
from tensorpress.activation_offload.device import tiles
from tensorpress.activation_offload.device.codes import code_bits, payload_bytes
from tensorpress.activation_offload.device.tiles import worst_size
from test_device_codes import refuse_host_reads

CUDA = torch.cuda.is_available()


def mlp(device, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256),
        nn.LayerNorm(256),
        nn.GELU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    ).to(device, dtype)


def step(model, ac, x, y):
    """One forward and backward under ``ac``: (loss, input gradient, parameter gradients)."""
    model.zero_grad()
    x = x.detach().requires_grad_(True)
    if ac is None:
        loss = F.cross_entropy(model(x), y)
    else:
        with ac:
            loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss, x.grad, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("layout", ["fixed", "blocks"])
def test_the_whole_hook_path_runs_on_meta_tensors(layout):
    model = mlp("meta")
    x = torch.empty(128, 64, device="meta")
    y = torch.empty(128, dtype=torch.long, device="meta")
    ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_layout=layout)
    loss, gx, grads = step(model, ac, x, y)
    assert gx.shape == x.shape and gx.device.type == "meta"
    assert all(g is not None and g.device.type == "meta" for g in grads)
    rows = ac.stats.rows
    # Linear 0 saves its input: held as 7-bit codes (and three float64 scalars); block
    # codes stay in their worst-case slot (a meta tensor's size never arrives)
    held = payload_bytes(128 * 64, code_bits(1e-2)) + 24
    assert rows["0"].stored_bytes == (held if layout == "fixed" else worst_size(128 * 64, 1e-2))
    assert rows["0"].tolerance is None  # a device scalar: never read by the host
    assert rows["1"].stored_bytes < rows["1"].saved_bytes / 4
    assert ac.stats.stored_bytes < ac.stats.saved_bytes / 3


@pytest.mark.parametrize(
    "dtype, rel, cosine", [(torch.float32, 1e-3, 0.995), (torch.bfloat16, 1e-2, 0.98)]
)
def test_gradients_on_the_cpu_when_asked(dtype, rel, cosine):
    model = mlp("cpu", dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 64, generator=g).to(dtype)
    y = torch.randint(0, 10, (256,), generator=g)
    _, gx0, grads0 = step(model, None, x, y)
    ac = ActivationCompression("block", rel=rel, min_bytes=0, device_path=True, debug=True)
    _, gx, grads = step(model, ac, x, y)  # debug: every restored tensor within its bound
    assert ac.stats.rows["3"].tolerance is None
    for a, b in zip([gx0, *grads0], [gx, *grads], strict=True):
        cos = F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0)
        assert float(cos) > cosine


@pytest.mark.parametrize("layout", ["fixed", "blocks"])
def test_pack_and_unpack_read_nothing_back(monkeypatch, layout):
    model = mlp("cpu")
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    ac = ActivationCompression(
        "block", rel=1e-2, min_bytes=0, device_path=True, device_layout=layout
    )
    x = x.requires_grad_(True)
    tolist = torch.Tensor.tolist

    def lagged_read(host):
        # the one read allowed: a block record's size, copied to the host (pinned memory
        # behind an event on CUDA; on the CPU, where the device is the host, at once)
        assert host.device.type == "cpu" and host.dtype == torch.int64 and host.numel() == 1
        assert host.grad_fn is None and not host.requires_grad
        return int(tolist(host)[0])

    monkeypatch.setattr(tiles, "read_host", lagged_read)
    refuse_host_reads(monkeypatch)
    with ac:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    monkeypatch.undo()
    assert ac.stats.rows["0"].tolerance is None  # held as device codes
    assert ac.stats.stored_bytes < ac.stats.saved_bytes / 2
    assert math.isfinite(float(x.grad.abs().sum()))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rel": 1e-2},  # a CPU tensor, device_path not asked for
        {"rel": 1e-2, "device_path": False},
        {"abs": 1e-3, "device_path": True, "device_layout": "fixed"},  # rel codes only
        {"rel": 1e-2, "adaptive": True, "device_path": True, "device_layout": "fixed"},
        {"pw_rel": 1e-2, "device_path": True},
    ],
)
def test_what_the_device_codes_cannot_hold_keeps_the_existing_path(kwargs):
    model = mlp("cpu")
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    ac = ActivationCompression("block", min_bytes=0, **kwargs)
    step(model, ac, x, y)
    assert ac.stats.rows["0"].tolerance is not None  # the host knows the bound


def test_the_setting_is_checked_and_travels_in_the_state():
    with pytest.raises(ValueError, match="device_path"):
        ActivationCompression("block", rel=1e-2, device_path="yes")
    with pytest.raises(ValueError, match="device_layout"):
        ActivationCompression("block", rel=1e-2, device_layout="packed")
    ac = ActivationCompression("block", rel=1e-2, device_path=True, device_layout="fixed")
    other = ActivationCompression("block", rel=1e-2)
    other.load_state_dict(ac.state_dict())
    assert other.state_dict()["config"]["device_path"] is True
    assert other.state_dict()["config"]["device_layout"] == "fixed"


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("layout", ["fixed", "blocks"])
def test_cuda_step_never_synchronizes(layout):
    model = mlp("cuda")
    x = torch.randn(512, 64, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")
    ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_layout=layout)
    step(model, ac, x, y)  # warm-up: kernels compiled, caches filled
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, gx, _ = step(model, ac, x, y)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ac.stats.rows["0"].tolerance is None
    assert math.isfinite(float(loss)) and math.isfinite(float(gx.abs().sum()))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize(
    "bound",
    [{"rel": 1e-2, "adaptive": Adaptive(update_every=1)}, {"abs": 1e-2}],
    ids=["adaptive", "abs"],
)
def test_cuda_adaptive_and_abs_steps_never_synchronize(bound):
    model = mlp("cuda")
    x = torch.randn(512, 64, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")
    ac = ActivationCompression("block", min_bytes=0, **bound)
    step(model, ac, x, y)  # warm-up; adaptive: tolerances learned on the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # adaptive: an update step, held under the learned tolerances
        loss, gx, _ = step(model, ac, x, y)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(float(loss)) and math.isfinite(float(gx.abs().sum()))
    assert ac.stats.stored_bytes < ac.stats.saved_bytes / 3


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_block_records_are_compacted_once_their_sizes_arrive():
    held = {}
    for device in ("meta", "cuda"):  # meta: every record stays in its worst-case slot
        model = mlp(device)
        x = torch.randn(512, 64).to(device).requires_grad_(True)
        y = torch.randint(0, 10, (512,)).to(device)
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_layout="blocks")
        with ac:
            loss = F.cross_entropy(model(x), y)
            if device == "cuda":
                torch.cuda.synchronize()  # every size has reached the host now
            # a save after it compacts every record made before it
            extra = torch.sin(torch.zeros(8192, device=device, requires_grad=True))
        held[device] = (ac.stats.stored_bytes, ac.stats.live_bytes)
        (loss + extra.sum()).backward()
    stored, live = held["cuda"]
    assert stored == live < held["meta"][0]


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_block_codes_match_the_torch_reference(dtype):
    from tensorpress.activation_offload.device import tiles_torch as reference
    from tensorpress.activation_offload.device.codes_layout import STEP_MARGIN, steps
    from tensorpress.activation_offload.device.tiles import compress_blocks, restore_blocks

    x = torch.randn(3 * 256 + 37, device="cuda").to(dtype)
    x[::5], x[3], x[4] = 0.0, math.nan, -math.inf
    slot, used = compress_blocks(x, 1e-2)  # Triton kernels where triton is installed
    ref, ref_used = reference.compress(x, 1e-2, steps(1e-2), code_bits(1e-2), STEP_MARGIN, 256)
    n = int(ref_used)
    assert int(used) == n and torch.equal(slot[:n], ref[:n])
    y = restore_blocks(slot[:n].clone(), x.shape, dtype)
    z = reference.restore(ref[:n].clone(), x.shape, dtype, 256)
    nan = z.isnan()
    assert torch.equal(nan, y.isnan()) and torch.equal(y[~nan], z[~nan])
