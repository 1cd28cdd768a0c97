"""Activation compression on a device: exactness and the bound, for a GPU machine.

On a small model (conv, BatchNorm, ReLU, GELU, LayerNorm, attention) on ``--device``
(default cuda when there is one), with deterministic kernels: gradients with
``codec=None`` must be bit-identical to plain training (and plain training to itself);
each codec runs with ``debug=True`` (every restored tensor checked against its bound)
and prints its reduction and the relative error of the gradients. Saved activations
offloaded to a TieredStore's pinned CPU tier and its file tier must give bit-identical
gradients too, and tensors of each dtype must round-trip exactly through each tier
(within the bound with the block codec). Exit status 1 when a check fails.

    python benchmarks/activations_check.py [--device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from tensorpress.activation_offload import ActivationCompression, Adaptive, TieredStore

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

CODECS = (
    {"codec": "block", "rel": 1e-2},
    {"codec": "block", "rel": 1e-2, "adaptive": Adaptive(update_every=1)},
    {"codec": "quant", "bits": 2},
    {"codec": "sz", "rel": 1e-2},
)


DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.proj, self.norm = nn.Linear(32, 64), nn.LayerNorm(64)
        self.qkv, self.head = nn.Linear(64, 192), nn.Linear(64, 5)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x))).flatten(2).transpose(1, 2)
        h = F.gelu(self.proj(h))
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm(h)).view(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        h = h + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        return self.head(h).mean(1)


def grads(model, ctx, x, y) -> dict:
    model.zero_grad(set_to_none=True)
    with ctx:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def check_store(dev: torch.device, nvme_dir: str) -> bool:
    """Tensors of every float dtype (and a non-contiguous one) through each tier of a
    TieredStore on ``dev``: bit-exact with codec=None, within the bound with block."""
    g = torch.Generator(device=dev).manual_seed(1)
    xs = [torch.randn(1000, 517, device=dev, generator=g).to(d) for d in DTYPES]
    xs.append(xs[2].t())
    ok = True
    for tier, cpu_bytes in (("cpu", 64 << 20), ("nvme", 0), ("evicted", 3 << 20)):
        with TieredStore(cpu_bytes, nvme_dir=None if tier == "cpu" else nvme_dir) as store:
            hs = [store.put(x) for x in xs]
            store.prefetch(hs[0])
            back = [store.get(h) for h in hs]
            exact = all(
                y.device == x.device and y.dtype == x.dtype and torch.equal(y, x)
                for x, y in zip(xs, back, strict=True)
            )
            where = sorted({store.tier(h) for h in hs})
        with TieredStore(
            cpu_bytes, None if tier == "cpu" else nvme_dir, "block", abs=1e-2
        ) as store:
            hs = [store.put(x) for x in xs]
            errs = [
                float((store.get(h).double() - x.double()).abs().max())
                for h, x in zip(hs, xs, strict=True)
            ]
        bounded = max(errs) <= 1e-2
        print(
            f"store on {dev}, tier {tier} ({', '.join(where)}): exact {exact}; "
            f"block max error {max(errs):.2e} (bound 1e-2): {bounded}"
        )
        ok = ok and exact and bounded
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(p.parse_args(argv).device)
    torch.manual_seed(0)
    model = Small().to(dev)
    x = torch.randn(64, 3, 16, 16, device=dev)
    y = torch.randint(0, 5, (64,), device=dev)
    # bit-identity needs deterministic kernels (cuDNN's and attention's backward
    # accumulate with atomics otherwise); the math attention backend is deterministic
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    spill = tempfile.TemporaryDirectory(prefix="tp-check-")
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = grads(model, contextlib.nullcontext(), x, y)
        again = grads(model, contextlib.nullcontext(), x, y)
        got = grads(model, ActivationCompression(None), x, y)
        offloaded = {}
        for tier, (cpu_bytes, nvme) in {"cpu": (64 << 20, None), "nvme": (0, spill.name)}.items():
            with TieredStore(cpu_bytes, nvme_dir=nvme) as store:
                ac = ActivationCompression(None, offload=store, min_bytes=0)
                offloaded[tier] = (
                    grads(model, ac, x, y),
                    store.pool.pinned,
                    dict(vars(store.stats)),
                )
    torch.use_deterministic_algorithms(False)
    same = all(torch.equal(want[k], again[k]) for k in want)
    exact = all(torch.equal(want[k], got[k]) for k in want)
    print(f"device {dev}: plain training is reproducible: {same}")
    print(f"device {dev}: codec=None gives bit-identical gradients: {exact}")
    ok = same and exact
    for tier, (g, pinned, stats) in offloaded.items():
        tier_exact = all(torch.equal(want[k], g[k]) for k in want)
        print(
            f"offload to {tier} (pinned pool: {pinned}): bit-identical gradients: {tier_exact}; "
            f"gets {stats['gets']}, prefetched {stats['prefetched_gets']}, "
            f"spilled {stats['spilled_bytes']} B, read {stats['read_bytes']} B"
        )
        ok = ok and tier_exact
    ok = check_store(dev, spill.name) and ok
    spill.cleanup()
    for kw in CODECS:
        ac = ActivationCompression(min_bytes=0, debug=True, **kw)
        try:
            for _ in range(2):
                got = grads(model, ac, x, y)
        except AssertionError as exc:  # the debug check: a bound was broken
            print(f"{kw}: FAILED {exc}")
            ok = False
            continue
        num = sum(float((want[k] - got[k]).pow(2).sum()) for k in want)
        err = math.sqrt(num / sum(float(want[k].pow(2).sum()) for k in want))
        print(f"{kw}: reduction {ac.stats.ratio:.2f}x, gradient relative error {err:.4f}, bound ok")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
