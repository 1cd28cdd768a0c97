"""The models and tasks of benchmarks/activations.py: a CNN and two ViT-style image
transformers (one the compression path was tuned on, one held out) on scikit-learn's
digits, and a byte-level transformer LM on the standard library's source.

Each keeps its repeated part in ``stages`` and takes ``checkpointed``: then every stage
runs under ``torch.utils.checkpoint`` (BatchNorm running stats are not updated again by
the recomputation).
"""

from __future__ import annotations

import contextlib
import statistics
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

SEED = 0
CNN_TEST = 360  # last digits images held out
LM_BYTES = 2_000_000
LM_CONTEXT, LM_BATCH, LM_VAL_BATCHES = 128, 32, 20
#: the ViT-style models: ``vit`` the CPU path was tuned on, ``vit-b`` held out (other
#: width, depth, heads and sequence: 64 tokens of 4x4 patches vs 144 of 2x2; since used
#: to set one threshold), ``vit-c`` held out from everything (100 tokens of 3x3 patches,
#: 10 heads of 16, MLP ratio 2: less compute per saved byte than either)
VIT_SHAPES = {
    "vit": {"image": 32, "patch": 4, "dim": 128, "depth": 4, "heads": 4, "batch": 64},
    "vit-b": {"image": 24, "patch": 2, "dim": 192, "depth": 3, "heads": 6, "batch": 32},
    "vit-c": {"image": 30, "patch": 3, "dim": 160, "depth": 2, "heads": 10, "batch": 40, "mlp": 2},
}


def _run_stages(stages: nn.ModuleList, x: torch.Tensor, checkpointed: bool) -> torch.Tensor:
    for stage in stages:
        if checkpointed:
            x = checkpoint(stage, x, use_reentrant=False, context_fn=lambda s=stage: _bn_frozen(s))
        else:
            x = stage(x)
    return x


def _bn_frozen(stage: nn.Module) -> tuple[contextlib.AbstractContextManager, ...]:
    """Checkpoint contexts (forward, recompute): the recompute leaves BN running stats."""

    @contextlib.contextmanager
    def frozen():
        norms = [m for m in stage.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.momentum = 0.0  # running = 1 * running + 0 * batch: unchanged
        try:
            yield
        finally:
            for m, momentum in zip(norms, momenta, strict=True):
                m.momentum = momentum

    return contextlib.nullcontext(), frozen()


class CNN(nn.Module):
    def __init__(self, channels: Sequence[int] = (32, 32, 64, 64), classes: int = 10):
        super().__init__()
        stages, cin = [], 1
        for i, cout in enumerate(channels):
            stride = 2 if i % 2 else 1  # downsample by strided convolution, as ResNets do
            layers = [nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False), nn.BatchNorm2d(cout)]
            stages.append(nn.Sequential(*layers, nn.ReLU(inplace=True)))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(cin, classes)
        self.checkpointed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _run_stages(self.stages, x, self.checkpointed)
        return self.head(x.mean(dim=(2, 3)))


class Block(nn.Module):
    """Pre-LN transformer block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    def __init__(self, blocks: int = 3, dim: int = 128, heads: int = 4, context: int = 128):
        super().__init__()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.stages = nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)
        self.checkpointed = False

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        x = _run_stages(self.stages, x, self.checkpointed)
        return self.head(self.ln(x))


class ViTBlock(nn.Module):
    """Pre-LN ViT block: softmax attention written out as timm's ``Attention`` without
    fused kernels does (scores, softmax, weighted sum), then a GELU MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        hidden = mlp_ratio * dim
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Patch embedding (a strided convolution, flattened and transposed as timm does: the
    residual stream is laid out token-fastest), learned positions, ``depth`` pre-LN
    blocks, a final LayerNorm, mean pooling and a linear head."""

    def __init__(
        self,
        image: int = 32,
        patch: int = 4,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        channels: int = 1,
        classes: int = 10,
        mlp: int = 4,
    ):
        super().__init__()
        self.embed = nn.Conv2d(channels, dim, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, dim) * 0.02)
        self.stages = nn.ModuleList(ViTBlock(dim, heads, mlp) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.checkpointed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        x = _run_stages(self.stages, x, self.checkpointed)
        return self.head(self.ln(x).mean(dim=1))


# --------------------------------------------------------------------------- tasks


@dataclass
class Task:
    name: str
    metric: str  # column head of the final metric
    delta: str  # column head of its change vs uncompressed
    make_model: Callable[[], nn.Module]
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]  # same every call
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module], float]
    change: Callable[[float, float], float]  # (value, uncompressed value) -> delta


def load_digits(path: str | None) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (images [1797, 8, 8], labels), or the copy at ``path`` that
    ``--export-digits`` wrote (for machines without scikit-learn)."""
    if path:
        with np.load(path) as f:
            return f["images"], f["target"]
    from sklearn.datasets import load_digits as sk_digits

    digits = sk_digits()
    return digits.images, digits.target


def digits_images(device, digits_file: str | None, size: int, batch: int):
    """(train batches (same every call), test images, test labels): the digits upsampled
    to ``size`` x ``size``, standardized by the training images' mean and std."""
    images, target = load_digits(digits_file)
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x - x[:-CNN_TEST].mean()) / x[:-CNN_TEST].std()
    x, y = x.to(device), torch.tensor(target).to(device)
    x_train, y_train, x_test, y_test = x[:-CNN_TEST], y[:-CNN_TEST], x[-CNN_TEST:], y[-CNN_TEST:]

    def batches():
        g = torch.Generator().manual_seed(SEED)
        while True:
            for idx in torch.randperm(len(x_train), generator=g).split(batch):
                if len(idx) == batch:
                    idx = idx.to(device)
                    yield x_train[idx], y_train[idx]

    return batches, x_test, y_test


def image_task(name, device, digits_file, make_model, make_optimizer, size, batch) -> Task:
    """Digits classification (test accuracy in %) with ``make_model``."""
    batches, x_test, y_test = digits_images(device, digits_file, size, batch)

    @torch.no_grad()
    def evaluate(model):
        model.eval()
        return 100.0 * (model(x_test).argmax(1) == y_test).float().mean().item()

    return Task(
        name,
        "test acc %",
        "delta pts",
        make_model,
        make_optimizer,
        batches,
        lambda m, x, y: F.cross_entropy(m(x), y),
        evaluate,
        lambda v, base: v - base,
    )


def cnn_task(device: torch.device, digits_file: str | None = None) -> Task:
    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    return image_task("cnn", device, digits_file, CNN, sgd, 32, 64)


def vit_task(name: str, device: torch.device, digits_file: str | None = None) -> Task:
    """``vit`` (the shapes the CPU path was tuned on), ``vit-b`` or ``vit-c`` (held out)."""
    shape = VIT_SHAPES[name]
    kwargs = {k: shape[k] for k in ("image", "patch", "dim", "depth", "heads")}
    kwargs["mlp"] = shape.get("mlp", 4)

    def adamw(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05)

    make = lambda: ViT(**kwargs)  # noqa: E731
    return image_task(name, device, digits_file, make, adamw, shape["image"], shape["batch"])


def stdlib_bytes(limit: int = LM_BYTES) -> torch.Tensor:
    """The first ``limit`` bytes of the stdlib's top-level ``*.py`` files, sorted by name."""
    chunks, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        chunks.append(path.read_bytes())
        size += len(chunks[-1])
        if size >= limit:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8)


def lm_task(device: torch.device, val_batches: int, batch: int = LM_BATCH) -> Task:
    data = stdlib_bytes().to(device)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    span = torch.arange(LM_CONTEXT + 1, device=device)

    def windows(source, g):
        starts = torch.randint(len(source) - LM_CONTEXT - 1, (batch, 1), generator=g)
        chunk = source[starts.to(device) + span].long()
        return chunk[:, :-1], chunk[:, 1:]

    def batches():
        g = torch.Generator().manual_seed(SEED)
        while True:
            yield windows(train, g)

    def loss(model, x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate(model):
        model.eval()
        g = torch.Generator().manual_seed(SEED + 1)
        return statistics.fmean(loss(model, *windows(val, g)).item() for _ in range(val_batches))

    return Task(
        "lm",
        "val loss",
        "delta %",
        ByteLM,
        lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01),
        batches,
        loss,
        evaluate,
        lambda v, base: 100.0 * (v - base) / base,
    )
