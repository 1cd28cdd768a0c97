"""The device path under ``torch.compile(fullgraph=True)``: the pack and unpack hooks are
inlined into the compiled forward and backward graphs
(activation_offload/device/code_offload.py), the step compiles once, and its gradients are
the eager device path's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

# 128 x 64 float32 inputs are 32 KiB: under min_bytes they are kept in eager mode too, as
# a compiled graph keeps its inputs (AOTAutograd applies the hooks to intermediates)
MIN_BYTES = 1 << 16


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g)


def _grads(model, ac, fn, x, y) -> list:
    model.zero_grad()
    if ac is None:
        loss = fn(x, y)
    else:
        with ac:
            loss = fn(x, y)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


class _Recording:
    """An aot_eager backend that keeps the graphs it compiles and counts compilations."""

    def __init__(self):
        self.graphs, self.compiles = [], 0

    def _keep(self, gm, example_inputs):
        self.graphs.append(gm)
        return make_boxed_func(gm.forward)

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        return aot_autograd(fw_compiler=self._keep, bw_compiler=self._keep)(gm, example_inputs)

    def ops(self) -> str:
        return "\n".join(str(g.graph) for g in self.graphs)


def test_fullgraph_step_holds_device_codes_and_matches_eager():
    model = _mlp()
    x, y = _batch()

    def step(x, y):
        return F.cross_entropy(model(x), y)

    plain = _grads(model, None, step, x, y)
    settings = {"rel": 1e-2, "min_bytes": MIN_BYTES, "device_path": True, "model": model}
    # compiled graphs hold fixed-width codes (the eager hooks' default is block codes)
    eager_ac = ActivationCompression("block", device_layout="fixed", **settings)
    eager = _grads(model, eager_ac, step, x, y)
    backend = _Recording()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    ac = ActivationCompression("block", **settings)
    for _ in range(3):
        grads = _grads(model, ac, compiled, x, y)
        for a, b in zip(eager, grads, strict=True):
            assert torch.equal(a, b)  # the same codes, restored the same way
    assert backend.compiles == 1  # later steps reuse the graph: the hooks are the same
    # the forward graph makes the codes, the backward graph restores them
    made = backend.ops().count("tensorpress.device_codes")
    assert made >= 3  # the 128 x 256 tensors (the graph may save one more than eager)
    assert backend.ops().count("tensorpress.device_restore") == made
    assert not torch.equal(plain[0], grads[0])  # lossy codes: not the uncompressed ones
    for a, b in zip(plain, grads, strict=True):
        cos = F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0)
        assert float(cos) > 0.99


def test_without_the_device_path_compiled_graphs_keep_the_eager_hooks():
    """``device_path=False``: the saved tensors of a compiled graph go through the eager
    hooks at run time (the host path), and no code op is traced."""
    model = _mlp()
    x, y = _batch()
    backend = _Recording()
    compiled = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend=backend)
    ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=False, model=model)
    _grads(model, ac, compiled, x, y)
    assert "tensorpress" not in backend.ops()
    assert ac.stats.records.get("Compressed", 0) >= 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fullgraph_step_matches_eager():
    model = _mlp().cuda()
    x, y = (t.cuda() for t in _batch())

    def step(x, y):
        return F.cross_entropy(model(x), y)

    settings = {"rel": 1e-2, "min_bytes": MIN_BYTES, "model": model}
    # compiled graphs hold fixed-width codes (the eager hooks' default is block codes)
    eager_ac = ActivationCompression("block", device_layout="fixed", **settings)
    eager = _grads(model, eager_ac, step, x, y)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    ac = ActivationCompression("block", **settings)
    for _ in range(2):
        grads = _grads(model, ac, compiled, x, y)
    for a, b in zip(eager, grads, strict=True):
        assert torch.equal(a, b)
