"""Per-block activation compression (``apply_activation_compression``): which modules it
takes, how it composes with ``torch.utils.checkpoint`` (full and selective) and with
FSDP2 ``fully_shard`` on two gloo processes."""

from __future__ import annotations

import functools
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from dist_workers import end_worker, free_port
from tensorpress.activation_offload import apply_activation_compression
from tensorpress.activation_offload.selective import selective_checkpoint_contexts
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

REL = 1e-2
WIDTH, HEADS, SEQ, BATCH = 64, 4, 64, 8
MATMULS = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)


def save_matmuls(ctx, op, *args, **kwargs):
    """A selective policy: keep the linear layers' outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


class Block(nn.Module):
    """A pre-LayerNorm transformer block; ``checkpointing``: None, ``"reentrant"``, ``"full"``,
    ``"torch"`` (torch's selective contexts) or ``"selective"`` (tensorpress's)."""

    def __init__(self, checkpointing=None):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )
        self.checkpointing = checkpointing

    def body(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.n1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(*qkv, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.n2(x))

    def forward(self, x):
        if self.checkpointing is None:
            return self.body(x)
        if self.checkpointing == "reentrant":
            return checkpoint(self.body, x, use_reentrant=True)
        contexts = {
            "full": None,
            "torch": functools.partial(create_selective_checkpoint_contexts, save_matmuls),
            "selective": functools.partial(selective_checkpoint_contexts, save_matmuls),
        }[self.checkpointing]
        kw = {} if contexts is None else {"context_fn": contexts}
        return checkpoint(self.body, x, use_reentrant=False, **kw)


class Net(nn.Module):
    def __init__(self, blocks=3, checkpointing=None):
        super().__init__()
        self.embed = nn.Linear(16, WIDTH)
        self.layers = nn.ModuleList(Block(checkpointing) for _ in range(blocks))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).mean(1)


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SEQ, 16, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def grads(model, seed=0):
    model.zero_grad()
    x, y = batch(seed)
    F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def compressed_bytes(bc) -> int:
    return bc.stats.records.get("Compressed", 0)


def test_default_policy_takes_the_repeated_blocks():
    model = Net()
    bc = apply_activation_compression(model, rel=REL)
    assert list(bc.blocks) == ["layers.0", "layers.1", "layers.2"]
    grads(model)
    # only the blocks' saves are counted: the embedding's and the head's are not seen
    assert bc.stats.rows and all(name.startswith("layers.") for name in bc.stats.rows)
    assert bc.stats.stored_bytes * 4 < bc.stats.saved_bytes


@pytest.mark.parametrize(
    "policy, chosen",
    [
        (lambda name, m: isinstance(m, Block) and name != "layers.1", ["layers.0", "layers.2"]),
        (["layers.1"], ["layers.1"]),
        (["layers.*"], ["layers.0", "layers.1", "layers.2"]),
        (("Block",), ["layers.0", "layers.1", "layers.2"]),
        ([Block, nn.GELU], ["layers.0", "layers.1", "layers.2"]),  # GELUs are inside blocks
        (["head"], ["head"]),
    ],
)
def test_policy_picks_the_outermost_matching_modules(policy, chosen):
    assert list(apply_activation_compression(Net(), policy, rel=REL).blocks) == chosen


def test_policy_and_settings_errors_say_what_to_pass():
    with pytest.raises(ValueError, match="no submodule matches policy"):
        apply_activation_compression(Net(), ["nothing.*"])
    with pytest.raises(ValueError, match="no repeated blocks"):
        apply_activation_compression(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    with pytest.raises(TypeError, match="policy lists module names or classes"):
        apply_activation_compression(Net(), [3])


def saved_activation_bytes(model) -> int:
    """Bytes of the tensors the blocks save that are not parameters (nor views of them),
    seen by a plain saved-tensor hook pair inside each block."""
    seen = []

    def pack(t):
        if not isinstance(t, nn.Parameter) and not isinstance(t._base, nn.Parameter):
            seen.append(t.numel() * t.element_size())
        return t

    def enter(m, args):
        m._hooks_cm = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        m._hooks_cm.__enter__()

    def leave(m, args, out):
        m._hooks_cm.__exit__(None, None, None)

    handles = [
        h
        for b in model.layers
        for h in (b.register_forward_pre_hook(enter), b.register_forward_hook(leave))
    ]
    grads(model)
    for h in handles:
        h.remove()
    return sum(seen)


def max_relative_error(got, want) -> float:
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True))


def test_parameters_are_kept_and_only_activations_counted():
    torch.manual_seed(0)
    model = Net()
    expected = saved_activation_bytes(model)
    bc = apply_activation_compression(model, rel=REL, min_bytes=0)
    grads(model)
    assert bc.stats.saved_bytes == expected
    # held while needed, released by backward: nothing outlives the step
    assert bc.stats.peak_stored_bytes == bc.stats.stored_bytes > 0
    assert bc.stats.live_bytes == 0


def encodes(bc) -> int:
    """Tensors the blocks' codecs encoded in the last step."""
    return bc.stats.records.get("Compressed", 0)


def plain_and_compressed(checkpointing, **settings):
    torch.manual_seed(0)
    model = Net(checkpointing=checkpointing)
    want = grads(model)
    bc = apply_activation_compression(model, rel=REL, **settings)
    return bc, grads(model), want


def test_recomputed_tensors_are_not_encoded_under_full_checkpoints():
    bc, got, want = plain_and_compressed(None)
    assert encodes(bc) > 6 * len(bc.blocks)
    bc, got, want = plain_and_compressed("full")
    # the checkpoint's own save (the block's input, which the block is recomputed from)
    # is encoded; everything the checkpoint recomputes is not
    assert encodes(bc) == len(bc.blocks)
    assert set(bc.stats.rows) == set(bc.blocks)
    assert 0 < max_relative_error(got, want) < 10 * REL


def test_selective_checkpoint_saves_are_encoded():
    linears = 4  # qkv, proj, mlp.0, mlp.2: the outputs save_matmuls keeps
    bc, got, want = plain_and_compressed("torch")
    assert encodes(bc) == len(bc.blocks)  # torch's cache holds the saves as they are
    bc, got_sac, want_sac = plain_and_compressed("selective")
    assert encodes(bc) == len(bc.blocks) * (1 + linears)
    for got_ in (got, got_sac):
        assert 0 < max_relative_error(got_, want) < 10 * REL
    saved = {name: row.saves for name, row in bc.stats.rows.items()}
    assert saved["layers.0.mlp.0"] == saved["layers.0.qkv"] == 1


def test_checkpoint_around_a_compressed_block_is_left_in_charge():
    """A block run under a checkpoint's hooks (forward) and inside backward (the
    recompute) encodes nothing: the checkpoint's gradients come out bit for bit."""
    torch.manual_seed(0)
    model = Net(checkpointing="full")
    want = grads(model)
    bc = apply_activation_compression(model, ["layers.*.mlp", "layers.*.n1"], rel=REL)
    assert len(bc.blocks) == 6
    got = grads(model)
    assert encodes(bc) == 0 and bc.stats.saved_bytes == 0
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_reentrant_checkpoint_recomputes_nothing_compressed():
    """The reentrant checkpoint runs the forward without grad and recomputes it inside
    backward: a compressed block inside it encodes nothing either time."""
    torch.manual_seed(0)
    model = Net(checkpointing="reentrant")
    want = grads(model)
    bc = apply_activation_compression(model, ["layers.*.mlp"], rel=REL)
    got = grads(model)
    assert encodes(bc) == 0 and bc.stats.saved_bytes == 0
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_remove_restores_plain_saving_and_state_round_trips():
    bc, got, want = plain_and_compressed(None)
    state = bc.state_dict()
    assert set(state) == set(bc.blocks) and all(s["step"] == 1 for s in state.values())
    bc.load_state_dict(state)
    with pytest.raises(KeyError, match="no state for blocks"):
        bc.load_state_dict({})
    bc.remove()
    model = Net()
    bc2 = apply_activation_compression(model, rel=REL)
    bc2.remove()
    torch.manual_seed(0)
    assert all(torch.equal(a, b) for a, b in zip(grads(model), grads(model), strict=True))
    assert encodes(bc2) == 0


STEPS = 6
LR = 0.05


def _train(rank: int, compress: bool) -> dict:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net(checkpointing="selective")
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    bc = apply_activation_compression(model, rel=REL) if compress else None
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = {"losses": [], "saved": [], "encodes": [], "live": [], "grad_norm2": []}
    for step in range(STEPS):
        x, y = batch(100 * step + rank)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        norm2 = sum(p.grad.to_local().square().sum() for p in model.parameters())
        dist.all_reduce(norm2)
        out["grad_norm2"].append(norm2.item())
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        out["losses"].append(mean.item() / dist.get_world_size())
        if bc is not None:
            out["saved"].append(bc.stats.saved_bytes)
            out["encodes"].append(encodes(bc))
            out["live"].append(bc.stats.live_bytes)
    return out


def _fsdp_worker(rank, world, port, outdir):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.set_num_threads(1)
    res = {}
    try:
        res["plain"] = _train(rank, False)
        res["compressed"] = _train(rank, True)
    finally:
        with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(res, f)
        dist.destroy_process_group()
    end_worker()


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("fsdp"))
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if method == "forkserver":  # import once, not once per process
        preload = ["torch", "torch.distributed.fsdp", "tensorpress.activation_offload"]
        mp.get_context(method).set_forkserver_preload(preload)
    mp.start_processes(_fsdp_worker, args=(2, free_port(), outdir), nprocs=2, start_method=method)
    results = []
    for r in range(2):
        with open(os.path.join(outdir, f"{r}.pkl"), "rb") as f:
            results.append(pickle.load(f))
    return results


@pytest.mark.slow  # two processes start (25 s): pytest -m slow tests/test_per_block.py
def test_fsdp2_with_selective_checkpoints_trains_like_its_uncompressed_run(fsdp):
    """Tolerance: each gradient is within 10 REL of plain (relative to its largest
    element; the in-process tests check it), so after k SGD steps the parameters differ
    by at most k LR 10 REL |g| and, to first order, the loss by k LR 10 REL |g|^2."""
    plain, comp = fsdp[0]["plain"], fsdp[0]["compressed"]
    assert fsdp[1]["compressed"]["losses"] == comp["losses"]  # the ranks' mean
    assert plain["losses"][0] == comp["losses"][0]  # the forward pass is untouched
    assert comp["losses"][-1] < comp["losses"][0] - 0.05
    g2 = max(plain["grad_norm2"])
    for k, (a, b) in enumerate(zip(plain["losses"], comp["losses"], strict=True)):
        assert abs(a - b) <= k * LR * 10 * REL * g2
    assert plain["losses"] != comp["losses"]  # compressed: the gradients did change


@pytest.mark.slow
def test_fsdp2_parameters_are_not_compressed_nor_held(fsdp):
    """Under FSDP2 the blocks see the bytes they see without it: the all-gathered
    parameters are neither counted nor encoded, and nothing is held after backward."""
    torch.manual_seed(0)
    model = Net(checkpointing="selective")
    bc = apply_activation_compression(model, rel=REL)
    model.zero_grad()
    x, y = batch(0)
    F.cross_entropy(model(x), y).backward()
    comp = fsdp[0]["compressed"]
    assert comp["saved"][0] == bc.stats.saved_bytes
    assert comp["encodes"] == [encodes(bc)] * STEPS == [len(bc.blocks) * 5] * STEPS
    assert comp["live"] == [0] * STEPS


def test_stochastic_blocks_draw_their_own_noise():
    bc = apply_activation_compression(Net(), rel=REL, stochastic=True, seed=3)
    seeds = [ac.config["codec_params"]["seed"] for ac in bc.blocks.values()]
    assert len(set(seeds)) == len(seeds)
    again = apply_activation_compression(Net(), rel=REL, stochastic=True, seed=3)
    assert seeds == [ac.config["codec_params"]["seed"] for ac in again.blocks.values()]


def test_blocks_share_one_store():
    from tensorpress.activation_offload import Offload

    torch.manual_seed(0)
    model = Net()
    want = grads(model)
    bc = apply_activation_compression(model, rel=REL, offload=Offload())
    stores = {id(ac.store) for ac in bc.blocks.values()}
    assert len(stores) == 1 and None not in {ac.store for ac in bc.blocks.values()}
    assert 0 < max_relative_error(grads(model), want) < 10 * REL
    assert encodes(bc) > 0
