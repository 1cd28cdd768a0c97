"""Stochastic rounding (``stochastic=True``): the bound on every element, the same bytes
for the same seed, and errors that average out where nearest rounding's do not.

The statistics: for a value a fraction ``p`` of a step ``s`` above a level, a
stochastic code errs by ``(1 - p) s`` with probability ``p`` and by ``-p s`` otherwise:
mean 0, variance ``p (1 - p) s**2 <= s**2 / 4``. The mean of ``M`` independent draws
is then within ``4 s / (2 sqrt(M))`` of 0 but for one time in 15,000; nearest rounding
errs by the same ``b`` every time, so its mean is ``b``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorpress as tp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_edits import rewrite_header
from tensorpress.compress import ErrorBound, compress_tensor, decompress_tensor, get_codec
from tensorpress.compress.block.stochastic import stochastic_steps
from tensorpress.formats import FormatError, tensor_to_stream

FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DTYPES = ("float16", "bfloat16", "float32", "float64")


def roundtrip(x: torch.Tensor, seed: int = 0, **bound) -> torch.Tensor:
    """``x`` through the block codec with stochastic rounding: numpy streams for the
    numpy dtypes, the tensor path for bfloat16."""
    if x.dtype == torch.bfloat16:
        ct = compress_tensor(x, "block", stochastic=True, seed=seed, **bound)
        return decompress_tensor(ct)
    blob = tp.compress(x.numpy(), codec="block", stochastic=True, seed=seed, **bound)
    return torch.from_numpy(tp.decompress(blob))


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    flat = x.view(-1)
    for special in draw(st.lists(st.sampled_from([math.nan, math.inf, -math.inf, 0.0]))):
        flat[draw(st.integers(0, flat.numel() - 1))] = special
    bound = draw(st.sampled_from([{"abs": 1e-3}, {"abs": 0.05}, {"rel": 1e-2}, {"rel": 1e-4}]))
    return x.to(getattr(torch, dtype)), bound, seed


@FAST
@given(case=arrays())
def test_every_element_within_the_bound(case):
    x, bound, seed = case
    y = roundtrip(x, seed, **bound)
    assert y.dtype == x.dtype and y.shape == x.shape
    xd, yd = x.double(), y.double()
    finite = xd.isfinite()
    if "abs" in bound:
        tol = bound["abs"]
    else:
        vals = xd[finite]
        tol = bound["rel"] * float(vals.max() - vals.min()) if vals.numel() else 0.0
    assert bool(((yd - xd).abs()[finite] <= tol).all())
    assert torch.equal(xd.isnan(), yd.isnan())
    assert torch.equal(xd[xd.isinf()], yd[xd.isinf()])


def test_same_seed_same_bytes_and_the_noise_follows_the_element():
    x = np.random.default_rng(1).standard_normal((400, 300)).astype(np.float32)
    one = tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=7)
    assert one == tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=7)
    assert one != tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=8)
    assert tp.info(one)["config"] == {"id": "block", "stochastic": True, "seed": 7}
    # keyed on each element's index in the whole array: any chunking, the same values
    small = tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=7, chunk_bytes=4096)
    assert tp.info(small)["chunks"] > tp.info(one)["chunks"]
    assert np.array_equal(tp.decompress(small), tp.decompress(one))


def test_tensor_path_writes_the_chunks_the_numpy_path_writes():
    codec = get_codec("block", stochastic=True, seed=3)
    bound = ErrorBound("abs", 2e-2).resolve(None)
    x = torch.randn(100, 70, generator=torch.Generator().manual_seed(0))
    payload, lengths = codec.encode_tensor(x, bound, chunk_rows=30)
    starts = np.cumsum([0, *lengths])
    flat = x.numpy().reshape(-1)
    for i, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        chunk = flat[i * 30 * 70 : (i + 1) * 30 * 70]
        assert codec.encode(chunk, bound, offset=i * 30 * 70) == payload[a:b].numpy().tobytes()
    y = codec.decode_tensor(payload, lengths, x.shape, x.dtype, bound, chunk_rows=30)
    assert float((y - x).abs().max()) <= 2e-2


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_mean_error_over_seeds_is_zero_where_nearest_has_a_bias(dtype):
    """A constant between two levels: nearest rounding's mean error is its bias b; the
    stochastic mean over 64 seeds x 4096 elements is within 4 sigma of 0 and below |b|."""
    eb = 1e-2
    step = stochastic_steps(eb)[0]
    c = dtype(0.37 * step)  # 0.37 of a step above the level 0
    x = np.full(4096, c, dtype)
    nearest = tp.decompress(tp.compress(x, codec="block", abs=eb)).astype(np.float64)
    b = float((nearest - float(c)).mean())
    assert abs(b) > 0.1 * eb
    errs = [
        tp.decompress(tp.compress(x, codec="block", abs=eb, stochastic=True, seed=s)) - float(c)
        for s in range(64)
    ]
    errs = np.stack(errs).astype(np.float64)
    assert np.abs(errs).max() <= eb
    sigma = step / 2 / math.sqrt(errs.size)  # p (1 - p) <= 1/4
    assert abs(errs.mean()) < 4 * sigma < abs(b)


def test_each_element_averages_out_over_seeds():
    """Per element, the mean over N seeds is unbiased: its mean square is about
    p (1 - p) s**2 / N; noise not renewed with the seed would leave p (1 - p) s**2."""
    eb, n_seeds = 1e-2, 48
    step = stochastic_steps(eb)[0]
    x = np.random.default_rng(2).uniform(-1, 1, 20000).astype(np.float64)
    total = np.zeros_like(x)
    for s in range(n_seeds):
        total += tp.decompress(tp.compress(x, codec="block", abs=eb, stochastic=True, seed=s)) - x
    p = (x / step) % 1.0
    expected = float((p * (1 - p)).mean()) * step**2 / n_seeds
    assert float(((total / n_seeds) ** 2).mean()) < 1.5 * expected


def test_bad_settings_say_what_to_pass():
    with pytest.raises(ValueError, match="not pw_rel"):
        get_codec("block", stochastic=True, pw_rel=1e-2)
    with pytest.raises(ValueError, match="not pw_rel"):
        tp.compress(np.ones(10, np.float32), codec="block", pw_rel=1e-2, stochastic=True)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*31\)"):
        get_codec("block", stochastic=True, seed=-1)
    with pytest.raises(ValueError, match="stochastic must be True or False"):
        get_codec("block", stochastic="yes")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_header_giving_stochastic_codes_a_pw_rel_bound_is_refused(dtype):
    """The encoder never writes stochastic codes under a pw_rel bound; a header that says
    so (stochastic added to a pw_rel stream, or a stochastic stream's bound turned
    pw_rel) is refused at decode as the config is at construction, never decoded."""
    x = torch.linspace(-1, 1, 1000).to(getattr(torch, dtype)).reshape(10, 100)
    if dtype == "bfloat16":
        pw = tensor_to_stream(compress_tensor(x, "block", pw_rel=1e-2))
        st = tensor_to_stream(compress_tensor(x, "block", abs=1e-2, stochastic=True))
    else:
        pw = tp.compress(x.numpy(), codec="block", pw_rel=1e-2)
        st = tp.compress(x.numpy(), codec="block", abs=1e-2, stochastic=True)
    assert tp.decompress(pw).shape == tp.decompress(st).shape == (10, 100)  # unedited: fine
    for bad in (
        rewrite_header(pw, lambda h: h["codec"].update(stochastic=True, seed=1)),
        rewrite_header(st, lambda h: h["bound"].update(mode="pw_rel")),
    ):
        with pytest.raises(FormatError, match="stochastic rounding a pw_rel bound"):
            tp.decompress(bad)


def linear_weight_grads(seeds, **settings) -> torch.Tensor:
    """The weight gradients of ``x @ w`` under compressed activations, one per seed
    (``x``: 4096 x 8, every value 0.3 of the bound, 128 KiB: compressed)."""
    from tensorpress.activation_offload import ActivationCompression, Rules

    g = torch.Generator().manual_seed(0)
    x = torch.full((4096, 8), 0.3 * 1e-2)
    w = torch.randn(8, 8, generator=g, requires_grad=True)
    up = 1 + 0.1 * torch.randn(4096, 8, generator=g)  # upstream gradients near 1
    out = []
    for seed in seeds:
        w.grad = None
        ac = ActivationCompression("block", abs=1e-2, rules=Rules(()), seed=seed, **settings)
        with ac:
            y = x @ w
        (y * up).sum().backward()
        out.append(w.grad.clone())
    return torch.stack(out), x.T @ up


def test_activation_gradients_are_unbiased_over_seeds():
    """Nearest rounding takes the 0.3 eb inputs to 0 (a step is 2 eb): the gradient is
    lost. Stochastic codes (a step of eb) keep it on average: the mean over 32 seeds is
    within 5 sigma of the exact gradient in every entry, sigma from the codes' variance
    (at most s**2 / 4 a value)."""
    nearest, exact = linear_weight_grads([0], stochastic=False)
    stochastic, _ = linear_weight_grads(range(32), stochastic=True)
    step = stochastic_steps(1e-2)[0]
    g = torch.Generator().manual_seed(0)
    torch.randn(8, 8, generator=g)
    up = 1 + 0.1 * torch.randn(4096, 8, generator=g)
    sigma = (step / 2) * up.square().sum(0).sqrt() / math.sqrt(32)  # per output column
    err = (stochastic.mean(0) - exact).abs()
    assert bool((err <= 5 * sigma).all())
    assert bool(((nearest[0] - exact).abs() > 10 * sigma).all())
    assert not torch.equal(stochastic[0], stochastic[1])  # each seed its own noise


def test_activation_noise_repeats_with_the_seed():
    one, _ = linear_weight_grads([5, 5, 6], stochastic=True)
    assert torch.equal(one[0], one[1]) and not torch.equal(one[0], one[2])


# -- the device codes (activation_offload/device/stochastic.py) ------------------------

_TRITON_STOCHASTIC = """
import math, torch
from tensorpress.activation_offload.device.codes_layout import STEP_MARGIN, code_bits, steps
from tensorpress.activation_offload.device import codes_triton as T, stochastic as S
g = torch.Generator().manual_seed(5)
bad = []
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for n in (1, 9, 1003, 4100):
        x = (torch.randn(n, generator=g) * 7).to(dtype)
        if n > 8:
            x[1], x[2], x[3], x[4] = math.nan, 0.0, math.inf, -math.inf
        for rel in (1e-3, 1e-2, 0.5):
            key = torch.tensor(2**40 + 977 * n, dtype=torch.int64)
            half = rel / 2
            p1, s1 = T.compress(x, half, steps(half), code_bits(half), STEP_MARGIN, key)
            p2, s2 = S.compress(x, rel, key)
            if not (torch.equal(p1, p2) and torch.equal(s1, s2)):
                bad.append((str(dtype), n, rel))
print("mismatches:", bad)
assert not bad
"""


def test_triton_stochastic_codes_match_the_torch_ops_under_the_interpreter():
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", _TRITON_STOCHASTIC],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def device_roundtrip(x: torch.Tensor, rel: float, key: int) -> torch.Tensor:
    from tensorpress.activation_offload.device.codes import restore_codes
    from tensorpress.activation_offload.device.stochastic import compress_stochastic

    return restore_codes(compress_stochastic(x, rel, torch.tensor(key)))


@FAST
@given(case=arrays())
def test_device_codes_keep_the_bound_on_every_element(case):
    x, bound, seed = case
    if x.dtype == torch.float64:
        x = x.float()
    rel = bound.get("rel", 1e-2)
    y = device_roundtrip(x, rel, seed)
    xd, yd = x.double(), y.double()
    finite = xd.isfinite()
    vals = xd[finite]
    tol = rel * float(vals.max() - vals.min()) if vals.numel() else 0.0
    assert bool(((yd - xd).abs()[finite] <= tol).all())
    assert torch.equal(xd.isnan(), yd.isnan())
    assert torch.equal(xd[xd.isinf()], yd[xd.isinf()])


def test_device_codes_are_unbiased_and_repeat_with_the_key():
    """0 and 1 set the range; the other values sit 0.37 of a nearest step above a level:
    nearest codes err by the same b each, the stochastic mean over 32 keys is within 4
    sigma of 0 (sigma from the step of rel / 2) and below |b|."""
    from tensorpress.activation_offload.device.codes import compress_codes, restore_codes

    rel = 1e-2
    step = rel * 1.0 * (1 - 2**-7)  # codes_layout.STEP_MARGIN
    x = torch.full((8192,), 0.37 * step, dtype=torch.float32)
    x[0], x[1] = 0.0, 1.0
    b = float((restore_codes(compress_codes(x, rel))[2:].double() - x[2:].double()).mean())
    assert abs(b) > 0.1 * step
    errs = torch.stack(
        [device_roundtrip(x, rel, k)[2:].double() - x[2:].double() for k in range(32)]
    )
    assert bool((errs.abs() <= rel).all())
    sigma = (step / 2) / 2 / math.sqrt(errs.numel())
    assert abs(float(errs.mean())) < 4 * sigma < abs(b)
    assert torch.equal(device_roundtrip(x, rel, 3), device_roundtrip(x, rel, 3))
    assert not torch.equal(device_roundtrip(x, rel, 3), device_roundtrip(x, rel, 4))


def test_device_codes_op_has_a_faithful_fake():
    from tensorpress.activation_offload.device.stochastic import device_codes_stochastic

    x = torch.randn(3000)
    torch.library.opcheck(device_codes_stochastic, (x, 1e-2, torch.tensor(5)))


def test_activations_on_the_device_path_take_stochastic_codes():
    from tensorpress.activation_offload import ActivationCompression, TieredStore

    x = torch.randn(256, 256, requires_grad=True)
    records = []
    for _ in range(2):
        ac = ActivationCompression(
            "block", rel=1e-2, device_path=True, stochastic=True, seed=9, debug=True
        )
        with ac:
            y = (x * 3).sin()
        y.sum().backward()
        records.append(ac.stats.records)
    assert records[0] == records[1] == {"StochasticCompressed": 1}
    ac = ActivationCompression(
        "block", rel=1e-2, device_path=True, stochastic=True, offload=TieredStore(1 << 24)
    )
    with pytest.raises(ValueError, match="pass device_path=False"), ac:
        (x * 3).sin()


def test_a_resumed_run_repeats_the_step():
    """The noise is keyed on (seed, step, index): a compression loaded from the state of
    step 1 draws step 1's noise, whatever it ran before."""
    from tensorpress.activation_offload import ActivationCompression

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=g)
    w = torch.randn(256, 8, generator=g, requires_grad=True)

    def step(ac):
        w.grad = None
        with ac:
            y = x @ w
        y.square().sum().backward()
        return w.grad.clone()

    first = ActivationCompression("block", rel=1e-2, stochastic=True, seed=4)
    step(first)
    state = first.state_dict()
    again = step(first)
    resumed = ActivationCompression("block", rel=1e-2, stochastic=True, seed=4)
    resumed.load_state_dict(state)
    assert torch.equal(step(resumed), again)
    fresh = ActivationCompression("block", rel=1e-2, stochastic=True, seed=4)
    assert not torch.equal(step(fresh), again)  # step 0 draws other noise
