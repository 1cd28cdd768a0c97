"""The benchmark corpus: float32 arrays from real data, simulations and deep learning.

Every array is built deterministically (fixed seeds) and cached as ``.npy`` under
``benchmarks/.cache/corpus-v<N>/``; later runs load the cached files. Arrays built
together (the two Gray-Scott fields, the CNN tensors, the transformer tensors) are
built and cached as a group.

    from corpus import load_corpus, CATEGORIES
    data = load_corpus(["aero", "kolmogorov_grf"])   # dict name -> np.ndarray

Run ``python benchmarks/corpus.py`` to build the whole corpus and list it.

Real data (from installed packages, no download):
  aero            PyWavelets ``pywt.data.aero()``, 8-bit grey image
  hubble_grey     scikit-image ``hubble_deep_field()``, grey in [0, 1]
  retina_grey     scikit-image ``retina()``, grey in [0, 1]
  motorcycle_disp scikit-image ``stereo_motorcycle()`` disparity map (non-finite -> 0)
  jacksboro_dem   matplotlib sample ``jacksboro_fault_dem.npz`` elevation model
Simulated:
  grayscott_u/v   3-d Gray-Scott reaction-diffusion, 96^3, periodic, labyrinth regime
  kolmogorov_grf  128^3 Gaussian random field, power spectrum k^-11/3
  smooth_2d       1024^2 sum of low-frequency sinusoids and Gaussians
  turbulence_u    256^3 velocity component, k^-5/3 energy spectrum (``corpus_fields.py``)
  climate_t2m     1800x3600 temperature-like field: gradients, waves, fronts, coastlines
  interface_rho   192^3 two-phase density with sharp interfaces and smooth interiors
  grf_2d          2048^2 Gaussian random field, power spectrum k^-4 (``corpus_fields.py``)
Deep learning (torch on CPU, a few training steps on random data, then one more
forward/backward whose tensors are captured):
  cnn_conv1_out   conv output of block 1 (saved for BatchNorm backward), N,C,H,W
  cnn_relu1_out   ReLU output of block 1 (saved for ReLU backward)
  cnn_relu2_out   ReLU output of block 2 (stride 2)
  cnn_conv3_wgrad weight gradient of the block-3 convolution
  tf_ln1_out      LayerNorm output feeding the QKV projection (saved for its backward)
  tf_attn_probs   causal softmax attention probabilities, B,H,T,T
  tf_mlp_pre_gelu MLP fc1 output (GELU input)
  tf_mlp_post_gelu GELU output (fc2 input)
  tf_fc1_wgrad    weight gradient of the MLP fc1 projection
  vit_patch_embed ViT patch embedding (16x16 patches of smooth images, plus position)
  vit_ln1_out     ViT LayerNorm output feeding the QKV projection
  vit_attn_probs  ViT softmax attention probabilities (not causal), B,H,T,T
  vit_mlp_post_gelu ViT GELU output of the MLP
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

try:
    from corpus_fields import build_climate, build_grf_2d, build_interface, build_turbulence
except ImportError:  # imported as benchmarks.corpus
    from benchmarks.corpus_fields import (
        build_climate,
        build_grf_2d,
        build_interface,
        build_turbulence,
    )

CORPUS_VERSION = 1
CACHE_DIR = Path(__file__).resolve().parent / ".cache" / f"corpus-v{CORPUS_VERSION}"


# --------------------------------------------------------------------------- real data


def _grey(rgb: np.ndarray) -> np.ndarray:
    from skimage.color import rgb2gray

    return rgb2gray(rgb).astype(np.float32)


def _build_aero() -> dict[str, np.ndarray]:
    import pywt

    return {"aero": pywt.data.aero().astype(np.float32)}


def _build_hubble() -> dict[str, np.ndarray]:
    from skimage import data

    return {"hubble_grey": _grey(data.hubble_deep_field())}


def _build_retina() -> dict[str, np.ndarray]:
    from skimage import data

    return {"retina_grey": _grey(data.retina())}


def _build_motorcycle() -> dict[str, np.ndarray]:
    from skimage import data

    disp = np.asarray(data.stereo_motorcycle()[2], dtype=np.float32)
    # Pixels without a disparity are stored as inf; 0 is the usual "no data" value.
    return {"motorcycle_disp": np.where(np.isfinite(disp), disp, np.float32(0))}


def _build_jacksboro() -> dict[str, np.ndarray]:
    from matplotlib import cbook

    with cbook.get_sample_data("jacksboro_fault_dem.npz") as dem:
        return {"jacksboro_dem": np.asarray(dem["elevation"], dtype=np.float32)}


# --------------------------------------------------------------------------- simulations


def _laplacian(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Periodic 7-point Laplacian of a 3-d array (grid spacing 1)."""
    np.multiply(a, np.float32(-6.0), out=out)
    for axis in range(3):
        out += np.roll(a, 1, axis=axis)
        out += np.roll(a, -1, axis=axis)
    return out


def _build_grayscott(n: int = 96, steps: int = 1500) -> dict[str, np.ndarray]:
    """Gray-Scott reaction-diffusion (Pearson's parameters, labyrinthine regime)."""
    rng = np.random.default_rng(20240601)
    u = np.ones((n, n, n), np.float32)
    v = np.zeros((n, n, n), np.float32)
    for _ in range(40):  # seed 40 random cubes of reactant
        i, j, k = rng.integers(0, n - 6, size=3)
        u[i : i + 6, j : j + 6, k : k + 6] = 0.5
        v[i : i + 6, j : j + 6, k : k + 6] = 0.25
    u += (0.02 * rng.standard_normal(u.shape)).astype(np.float32)
    v += (0.02 * rng.standard_normal(v.shape)).astype(np.float32)

    du, dv, feed, kill = np.float32(0.16), np.float32(0.08), np.float32(0.035), np.float32(0.060)
    lu, lv, uvv = np.empty_like(u), np.empty_like(v), np.empty_like(u)
    for _ in range(steps):  # explicit Euler, dt = 1 (stable: 6 * D * dt < 1)
        _laplacian(u, lu)
        _laplacian(v, lv)
        np.multiply(v, v, out=uvv)
        uvv *= u
        lu *= du
        lu -= uvv
        lu += feed * (np.float32(1) - u)
        lv *= dv
        lv += uvv
        lv -= (feed + kill) * v
        u += lu
        v += lv
    return {"grayscott_u": u, "grayscott_v": v}


def _build_kolmogorov(n: int = 128) -> dict[str, np.ndarray]:
    """Gaussian random field whose power spectrum falls as k^-11/3 (Kolmogorov)."""
    rng = np.random.default_rng(11_3)
    noise = np.fft.rfftn(rng.standard_normal((n, n, n)))
    k1 = np.fft.fftfreq(n) * n
    kz = np.fft.rfftfreq(n) * n
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    amplitude = np.zeros_like(k)
    amplitude[k > 0] = k[k > 0] ** (-11.0 / 6.0)  # amplitude = sqrt(power)
    field = np.fft.irfftn(noise * amplitude, s=(n, n, n), axes=(0, 1, 2))
    field = (field - field.mean()) / field.std()
    return {"kolmogorov_grf": field.astype(np.float32)}


def _build_smooth(n: int = 1024) -> dict[str, np.ndarray]:
    """Smooth 2-d field: a few low-frequency sinusoids plus Gaussian bumps."""
    rng = np.random.default_rng(1024)
    y, x = np.meshgrid(np.linspace(0, 1, n), np.linspace(0, 1, n), indexing="ij")
    field = np.zeros((n, n))
    for _ in range(5):
        fx, fy = rng.uniform(0.5, 4.0, size=2)
        phase = rng.uniform(0, 2 * np.pi)
        field += rng.uniform(0.3, 1.0) * np.sin(2 * np.pi * (fx * x + fy * y) + phase)
    for _ in range(8):
        cx, cy = rng.uniform(0.1, 0.9, size=2)
        width = rng.uniform(0.03, 0.15)
        field += rng.uniform(-1.5, 1.5) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * width**2))
    return {"smooth_2d": field.astype(np.float32)}


# --------------------------------------------------------------------------- deep learning


class _torch_build:
    """Single-threaded, seeded torch for the duration of a build (same tensors each time)."""

    def __enter__(self):
        import torch

        self.torch = torch
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        torch.manual_seed(0)
        return torch

    def __exit__(self, *exc):
        self.torch.set_num_threads(self.threads)


def _to_numpy(t) -> np.ndarray:
    return t.detach().float().contiguous().numpy().copy()


def _build_cnn(batch: int = 16, size: int = 64, steps: int = 5) -> dict[str, np.ndarray]:
    """A small CNN (3 conv/BN/ReLU blocks) trained a few SGD steps on smooth random images."""
    with _torch_build() as torch:
        nn = torch.nn

        def block(cin, cout, stride):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(),
            )

        net = nn.Sequential(
            block(3, 64, 1),
            block(64, 128, 2),
            block(128, 256, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(256, 10),
        )
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

        # Random images with natural-image-like correlation: white noise, low-passed.
        f = torch.fft.fftfreq(size)
        lowpass = torch.exp(-(f[:, None] ** 2 + f[None, :] ** 2) / (2 * 0.06**2))

        def images():
            noise = torch.randn(batch, 3, size, size)
            img = torch.fft.ifft2(torch.fft.fft2(noise) * lowpass).real
            return img / img.std()

        def step(capture=None):
            x, target = images(), torch.randint(0, 10, (batch,))
            loss = nn.functional.cross_entropy(net(x), target)
            opt.zero_grad()
            loss.backward()
            if capture is None:
                opt.step()

        for _ in range(steps):
            step()

        captured = {}

        def keep(name):
            def hook(module, inputs, output):
                captured[name] = output

            return hook

        hooks = [
            net[0][0].register_forward_hook(keep("cnn_conv1_out")),
            net[0][2].register_forward_hook(keep("cnn_relu1_out")),
            net[1][2].register_forward_hook(keep("cnn_relu2_out")),
        ]
        step(capture=True)
        for h in hooks:
            h.remove()
        out = {name: _to_numpy(t) for name, t in captured.items()}
        out["cnn_conv3_wgrad"] = _to_numpy(net[2][0].weight.grad)
        return out


def _build_transformer(
    batch: int = 8, seq: int = 256, dim: int = 512, heads: int = 8, steps: int = 5
) -> dict[str, np.ndarray]:
    """A pre-LayerNorm causal transformer block trained a few Adam steps on random tokens."""
    with _torch_build() as torch:
        nn = torch.nn
        vocab, hidden = 512, 4 * dim
        captured = {}

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
                self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
                self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
                mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
                self.register_buffer("mask", mask)
                self.capture = False

            def forward(self, x):
                b, t, _ = x.shape
                h = self.ln1(x)
                q, k, v = self.qkv(h).view(b, t, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
                scores = (q @ k.transpose(-2, -1)) / (dim // heads) ** 0.5
                probs = scores.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1)
                x = x + self.proj((probs @ v).transpose(1, 2).reshape(b, t, dim))
                pre = self.fc1(self.ln2(x))
                post = nn.functional.gelu(pre)
                if self.capture:
                    captured.update(
                        tf_ln1_out=h,
                        tf_attn_probs=probs,
                        tf_mlp_pre_gelu=pre,
                        tf_mlp_post_gelu=post,
                    )
                return x + self.fc2(post)

        embed, pos = nn.Embedding(vocab, dim), nn.Parameter(0.02 * torch.randn(seq, dim))
        block, ln_f, head = Block(), nn.LayerNorm(dim), nn.Linear(dim, vocab)
        params = [*embed.parameters(), pos, *block.parameters(), *ln_f.parameters()]
        params += [*head.parameters()]
        opt = torch.optim.Adam(params, lr=1e-3)

        def step(update=True):
            tokens = torch.randint(0, vocab, (batch, seq + 1))
            logits = head(ln_f(block(embed(tokens[:, :-1]) + pos)))
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            if update:
                opt.step()

        for _ in range(steps):
            step()
        block.capture = True
        step(update=False)
        out = {name: _to_numpy(t) for name, t in captured.items()}
        out["tf_fc1_wgrad"] = _to_numpy(block.fc1.weight.grad)
        return out


def _smooth_images(torch, n: int, size: int):
    """``n`` RGB images of smooth random structure (upsampled noise), N,3,H,W."""
    low = torch.randn(n, 3, size // 16, size // 16)
    return torch.nn.functional.interpolate(low, size=(size, size), mode="bicubic")


def _build_vit(
    batch: int = 16, size: int = 128, patch: int = 16, dim: int = 384, heads: int = 6
) -> dict[str, np.ndarray]:
    """A ViT-style encoder block (patch embedding, pre-LayerNorm attention over all tokens,
    GELU MLP) trained a few Adam steps to classify smooth random images."""
    with _torch_build() as torch:
        nn = torch.nn
        tokens = (size // patch) ** 2 + 1
        embed = nn.Conv2d(3, dim, patch, stride=patch)
        cls, pos = (
            nn.Parameter(torch.zeros(1, 1, dim)),
            nn.Parameter(0.02 * torch.randn(1, tokens, dim)),
        )
        ln1, ln2, ln_f = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        qkv, proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        fc1, fc2, head = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim), nn.Linear(dim, 10)
        modules = (embed, ln1, ln2, ln_f, qkv, proj, fc1, fc2, head)
        params = [cls, pos, *(p for m in modules for p in m.parameters())]
        opt = torch.optim.Adam(params, lr=1e-3)
        captured = {}

        def forward(images):
            x = embed(images).flatten(2).transpose(1, 2)
            x = torch.cat([cls.expand(len(x), -1, -1), x], 1) + pos
            h = ln1(x)
            b, t, _ = h.shape
            q, k, v = qkv(h).view(b, t, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            probs = ((q @ k.transpose(-2, -1)) / (dim // heads) ** 0.5).softmax(-1)
            y = x + proj((probs @ v).transpose(1, 2).reshape(b, t, dim))
            post = nn.functional.gelu(fc1(ln2(y)))
            captured.update(vit_patch_embed=x, vit_ln1_out=h, vit_attn_probs=probs)
            captured["vit_mlp_post_gelu"] = post
            return head(ln_f(y + fc2(post))[:, 0])

        for _ in range(5):
            loss = nn.functional.cross_entropy(
                forward(_smooth_images(torch, batch, size)), torch.randint(0, 10, (batch,))
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            forward(_smooth_images(torch, batch, size))
        return {name: _to_numpy(t) for name, t in captured.items()}


# --------------------------------------------------------------------------- registry

# name -> (category, builder); a builder returns every array of its group.
_DATASETS: dict[str, tuple[str, Callable[[], dict[str, np.ndarray]]]] = {
    "aero": ("real", _build_aero),
    "hubble_grey": ("real", _build_hubble),
    "retina_grey": ("real", _build_retina),
    "motorcycle_disp": ("real", _build_motorcycle),
    "jacksboro_dem": ("real", _build_jacksboro),
    "grayscott_u": ("simulated", _build_grayscott),
    "grayscott_v": ("simulated", _build_grayscott),
    "kolmogorov_grf": ("simulated", _build_kolmogorov),
    "smooth_2d": ("simulated", _build_smooth),
    "turbulence_u": ("simulated", build_turbulence),
    "climate_t2m": ("simulated", build_climate),
    "interface_rho": ("simulated", build_interface),
    "grf_2d": ("simulated", build_grf_2d),
    "cnn_conv1_out": ("dl", _build_cnn),
    "cnn_relu1_out": ("dl", _build_cnn),
    "cnn_relu2_out": ("dl", _build_cnn),
    "cnn_conv3_wgrad": ("dl", _build_cnn),
    "tf_ln1_out": ("dl", _build_transformer),
    "tf_attn_probs": ("dl", _build_transformer),
    "tf_mlp_pre_gelu": ("dl", _build_transformer),
    "tf_mlp_post_gelu": ("dl", _build_transformer),
    "tf_fc1_wgrad": ("dl", _build_transformer),
    "vit_patch_embed": ("dl", _build_vit),
    "vit_ln1_out": ("dl", _build_vit),
    "vit_attn_probs": ("dl", _build_vit),
    "vit_mlp_post_gelu": ("dl", _build_vit),
}

#: dataset name -> "real" / "simulated" / "dl", in corpus order
CATEGORIES: dict[str, str] = {name: cat for name, (cat, _) in _DATASETS.items()}
NAMES: tuple[str, ...] = tuple(_DATASETS)


def _path(name: str) -> Path:
    return CACHE_DIR / f"{name}.npy"


def _save(name: str, array: np.ndarray) -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = CACHE_DIR / f".{name}.{os.getpid()}.tmp.npy"
    np.save(tmp, np.ascontiguousarray(array, dtype=np.float32))
    os.replace(tmp, _path(name))


def load_corpus(names: Iterable[str] | None = None, verbose: bool = False) -> dict[str, np.ndarray]:
    """Return ``{name: float32 array}`` for ``names`` (all datasets if None), in corpus order.

    Missing arrays are built (with their whole group) and cached; cached ones are loaded.
    """
    wanted = list(NAMES) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in _DATASETS]
    if unknown:
        raise KeyError(f"unknown dataset(s) {unknown}; known: {', '.join(NAMES)}")
    for name in wanted:
        if _path(name).exists():
            continue
        builder = _DATASETS[name][1]
        t0 = time.perf_counter()
        built = builder()
        for built_name, array in built.items():
            _save(built_name, array)
        if verbose:
            print(
                f"built {', '.join(built)} in {time.perf_counter() - t0:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    order = [n for n in NAMES if n in wanted]
    return {name: np.load(_path(name)) for name in order}


def main() -> None:
    corpus = load_corpus(verbose=True)
    total = 0
    print(f"{'dataset':<18} {'category':<10} {'shape':<22} {'MB':>7} {'min':>11} {'max':>11}")
    for name, x in corpus.items():
        total += x.nbytes
        shape = "x".join(map(str, x.shape))
        print(
            f"{name:<18} {CATEGORIES[name]:<10} {shape:<22} {x.nbytes / 1e6:7.2f} "
            f"{float(x.min()):11.4g} {float(x.max()):11.4g}"
        )
    print(f"{len(corpus)} arrays, {total / 1e6:.1f} MB, cached in {CACHE_DIR}")


if __name__ == "__main__":
    main()
