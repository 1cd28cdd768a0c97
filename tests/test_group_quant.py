"""Group quantization: the quantizer (compress.group_quant) in both compute dtypes, and the
wire rows on top of it (distributed.wire): error bound per value, wire layout, rows,
stochastic rounding."""

from __future__ import annotations

import pytest
import torch
from tensorpress.compress.quant import groups as gq
from tensorpress.compress.quant.kernels import torch_ops as qt
from tensorpress.distributed.wire import (
    GroupQuantized,
    dequantize_groups,
    dequantize_rows,
    quantize_groups,
    quantize_rows,
    row_scales,
    wire_nbytes,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _outliers(n: int, seed: int = 0) -> torch.Tensor:
    """Gaussian values with one outlier of 200 sigma per 128 values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    x[torch.randperm(n, generator=g)[: n // 128]] *= 200.0
    return x


def _per_value_scale(q: GroupQuantized) -> torch.Tensor:
    return q.scale.repeat_interleave(q.group)[: q.n]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("n,group", [(1000, 128), (1000, 16), (77, 32), (5, 1), (130, 64)])
def test_round_trip_within_half_scale(device, bits, hadamard, n, group):
    x = _outliers(n, seed=bits + n).to(device)
    q = quantize_groups(x, bits=bits, group=group, hadamard=hadamard, seed=3)
    y = dequantize_groups(q)
    assert y.dtype == torch.float32 and y.shape == (n,) and y.device == x.device
    assert q.lo.shape == q.scale.shape == (-(-n // group),)
    half = _per_value_scale(q) / 2
    slack = 1e-6 * x.abs().max() * (group if hadamard else 1)  # float32 rounding
    assert ((y - x).abs() <= half + slack).all()
    assert q.nbytes == wire_nbytes(n, bits, group) == q.to_wire().numel()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_quantize_in_float32(dtype):
    x = torch.randn(3, 50).to(dtype)
    q = quantize_groups(x, bits=8, group=32)
    y = dequantize_groups(q)
    ref = x.reshape(-1).to(torch.float32)
    assert y.dtype == torch.float32 and q.n == 150
    assert ((y - ref).abs() <= _per_value_scale(q) / 2 + 1e-6).all()


def test_codes_are_packed_lsb_first_with_min_and_scale():
    q = quantize_groups(torch.tensor([0.0, 1.0, 2.0, 3.0]), bits=2, group=4)
    assert q.codes.tolist() == [0 | 1 << 2 | 2 << 4 | 3 << 6]
    assert q.lo.tolist() == [0.0] and q.scale.tolist() == [1.0]
    q = quantize_groups(torch.tensor([0.0, 1.0, 2.0, 3.0, 9.0]), bits=4, group=2)
    # groups [0, 1], [2, 3], [9 + padding]: codes 0 and 15 in each full group
    assert q.codes.tolist() == [0xF0, 0xF0, 0x00]
    assert q.lo.tolist() == [0.0, 2.0, 9.0]
    assert q.scale.tolist() == pytest.approx([1 / 15, 1 / 15, 0.0])


def test_constant_and_empty_inputs():
    q = quantize_groups(torch.full((300,), -2.5), bits=4, group=128, hadamard=False)
    assert torch.equal(dequantize_groups(q), torch.full((300,), -2.5))
    assert (q.scale == 0).all()
    q = quantize_groups(torch.empty(0), bits=4, group=128)
    assert q.nbytes == 0 and dequantize_groups(q).shape == (0,)
    back = GroupQuantized.from_wire(q.to_wire(), 0, 4, 128)
    assert dequantize_groups(back).shape == (0,)
    wire = quantize_rows(torch.empty(3, 0), bits=2, group=16, hadamard=True)
    assert wire.shape == (3, 0)
    assert dequantize_rows(wire, 0, 2, 16, hadamard=True).shape == (3, 0)


def test_non_finite_values_stay_non_finite():
    x = torch.randn(256)
    x[3] = float("inf")
    x[200] = float("nan")
    for hadamard in (False, True):
        y = dequantize_groups(quantize_groups(x, bits=4, group=64, hadamard=hadamard))
        assert not torch.isfinite(y[:64]).any() and not torch.isfinite(y[192:]).any()
        assert torch.isfinite(y[64:192]).all()


@pytest.mark.parametrize("bits", [2, 4])
def test_hadamard_lowers_error_on_outliers(bits):
    x = _outliers(1 << 14)
    err = {
        h: (dequantize_groups(quantize_groups(x, bits=bits, group=128, hadamard=h)) - x)
        .pow(2)
        .mean()
        .sqrt()
        for h in (False, True)
    }
    assert err[True] < 0.7 * err[False]


def test_stochastic_rounding_is_unbiased_and_within_one_scale():
    draws, m = 400, 256
    x = torch.randn(m)
    gen = torch.Generator().manual_seed(11)
    wire = quantize_rows(x.expand(draws, m), bits=2, group=128, stochastic=True, generator=gen)
    y = dequantize_rows(wire, m, bits=2, group=128)
    scale = row_scales(wire, m, bits=2, group=128)
    assert ((y - x).abs() < scale + 1e-6).all()
    # one draw errs up to a scale; the mean of 400 independent draws by ~scale / 40
    mean_err = (y.mean(0) - x).abs()
    assert (mean_err < 0.15 * scale[0]).all()
    nearest = dequantize_groups(quantize_groups(x, bits=2, group=128))
    assert mean_err.mean() < 0.25 * (nearest - x).abs().mean()


def test_stochastic_seed_reproduces_and_generator_advances():
    x = torch.randn(512)

    def wire(**kw):
        return quantize_groups(x, bits=4, group=64, stochastic=True, **kw).to_wire()

    assert torch.equal(wire(seed=5), wire(seed=5))
    assert not torch.equal(wire(seed=5), wire(seed=6))
    gen = torch.Generator().manual_seed(5)
    assert not torch.equal(wire(generator=gen), wire(generator=gen))


@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_wire_round_trip(bits, hadamard):
    x = _outliers(1000, seed=bits)
    q = quantize_groups(x, bits=bits, group=64, hadamard=hadamard, seed=9)
    buf = q.to_wire()
    assert buf.dtype == torch.uint8 and buf.shape == (q.nbytes,)
    back = GroupQuantized.from_wire(buf, 1000, bits, 64, hadamard=hadamard, seed=9)
    assert torch.equal(back.codes, q.codes) and torch.equal(back.lo, q.lo)
    assert torch.equal(back.scale, q.scale) and torch.equal(back.to_wire(), buf)
    assert torch.equal(dequantize_groups(back), dequantize_groups(q))


def test_wire_nbytes_formula():
    assert wire_nbytes(1000, 4, 128) == 8 * 128 // 2 + 8 * 8
    assert wire_nbytes(1024, 8, 128) == 1024 + 8 * 8
    assert wire_nbytes(5, 2, 3) == 2 + 2 * 8  # 6 codes of 2 bits: 12 bits, 2 bytes
    assert wire_nbytes(0, 4, 128) == 0
    for n in (1, 127, 128, 129, 4097):
        for bits in (2, 4, 8):
            got = quantize_groups(torch.randn(n), bits=bits, group=32).nbytes
            assert got == wire_nbytes(n, bits, 32)


@pytest.mark.parametrize("hadamard", [False, True])
def test_rows_match_one_tensor_at_a_time(hadamard):
    x = _outliers(5 * 300).view(5, 300)
    wire = quantize_rows(x, bits=4, group=64, hadamard=hadamard, seed=2)
    assert wire.shape == (5, wire_nbytes(300, 4, 64))
    y = dequantize_rows(wire, 300, bits=4, group=64, hadamard=hadamard, seed=2)
    for i in range(5):
        q = quantize_groups(x[i], bits=4, group=64, hadamard=hadamard, seed=2)
        assert torch.equal(wire[i], q.to_wire())
        assert torch.equal(y[i], dequantize_groups(q))
        assert torch.equal(row_scales(wire, 300, 4, 64)[i], _per_value_scale(q))


def test_wrong_seed_does_not_decode_hadamard():
    x = _outliers(512)
    q = quantize_groups(x, bits=8, group=128, hadamard=True, seed=1)
    other = GroupQuantized.from_wire(q.to_wire(), 512, 8, 128, hadamard=True, seed=2)
    assert (dequantize_groups(other) - x).abs().max() > 10 * (dequantize_groups(q) - x).abs().max()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"bits": 3}, "bits must be 2, 4 or 8"),
        ({"bits": 4.0}, "bits must be an integer"),
        ({"group": 0}, "group must be a positive"),
        ({"group": 96, "hadamard": True}, "power of two"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*31\)"),
        ({"hadamard": 1}, "hadamard must be true or false"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_groups(torch.randn(10), **kwargs)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="float tensor"):
        quantize_groups(torch.arange(10), bits=4)
    with pytest.raises(ValueError, match="float tensor"):
        quantize_groups([1.0, 2.0], bits=4)
    with pytest.raises(ValueError, match="2-d tensor"):
        quantize_rows(torch.randn(10))
    buf = quantize_groups(torch.randn(100), bits=4, group=32).to_wire()
    with pytest.raises(ValueError, match="expected"):
        GroupQuantized.from_wire(buf[:-1], 100, 4, 32)
    with pytest.raises(ValueError, match="uint8"):
        GroupQuantized.from_wire(buf.to(torch.int8), 100, 4, 32)
    with pytest.raises(ValueError, match="expected"):
        dequantize_rows(buf[None], 200, 4, 32)
    with pytest.raises(ValueError, match="n must be"):
        wire_nbytes(-1, 4, 32)


# -- the quantizer itself ------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
@pytest.mark.parametrize("hadamard", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantizer_round_trip_within_half_scale(device, compute, hadamard, bits):
    x = _outliers(3 * 300, seed=bits).view(3, 300).to(device)
    signs = qt.signs(5, torch.arange(64, device=device)) if hadamard else None
    arith = {"compute_dtype": compute, "signs": signs}
    codes, lo, scale = gq.quantize(x, bits, 64, param_dtype=torch.float32, **arith)
    assert codes.shape == (3, 320) and codes.dtype == compute
    assert lo.shape == scale.shape == (3, 5) and lo.dtype == scale.dtype == torch.float32
    maxc = (1 << bits) - 1
    assert ((codes == codes.floor()) & (codes >= 0) & (codes <= maxc)).all()
    packed = gq.pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 320 * bits // 8)
    assert torch.equal(gq.unpack(packed, bits, 320).to(compute), codes)
    y = gq.dequantize(gq.unpack(packed, bits, 320), lo, scale, 300, 64, **arith)
    assert y.shape == (3, 300) and y.dtype == compute
    assert torch.equal(gq.dequantize(codes, lo, scale, 300, 64, **arith), y)  # codes reused
    half = scale.double().repeat_interleave(64, 1)[:, :300] / 2
    eps = torch.finfo(compute).eps
    slack = 4 * eps * x.abs().amax(1, keepdim=True).double() * (64 if hadamard else 1)
    assert ((y.double() - x.double()).abs() <= half + slack).all()


def test_quantizer_rounding_noise_and_degenerate_groups():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 0.4, 0.4, 0.4, 0.4]], dtype=torch.float64)
    kw = {"param_dtype": torch.float64, "compute_dtype": torch.float64}
    codes, lo, scale = gq.quantize(x, 2, 4, **kw)
    # a constant group has scale 0 and codes 0; it rebuilds exactly from lo
    assert codes.tolist() == [[0, 1, 2, 3, 0, 0, 0, 0]] and scale.tolist() == [[1.0, 0.0]]
    assert torch.equal(gq.dequantize(codes, lo, scale, 8, 4, compute_dtype=torch.float64), x)
    # noise just below 1 rounds 0.4 steps up, noise 0 rounds it down
    x = torch.tensor([[0.0, 0.4, 3.0]], dtype=torch.float64)
    up = gq.quantize(x, 2, 4, noise=torch.full((1, 1, 4), 0.99, dtype=torch.float64), **kw)[0]
    down = gq.quantize(x, 2, 4, noise=torch.zeros(1, 1, 4, dtype=torch.float64), **kw)[0]
    assert up[0, :3].tolist() == [0, 1, 3] and down[0, :3].tolist() == [0, 0, 3]
    # the padding of a short group copies its last value: its codes are the last code's
    assert up[0, 3] == up[0, 2]


def test_quantizer_reads_nothing_back_to_the_host():
    """On meta tensors (shapes only) the whole path runs: no value is read on the host, so
    on CUDA it queues kernels without waiting for them."""
    x = torch.empty(4, 1000, device="meta")
    signs = qt.signs(3, torch.arange(128, device="meta"))
    noise = torch.empty(4, 8, 128, device="meta", dtype=torch.float64)
    arith = {"compute_dtype": torch.float64, "signs": signs}
    codes, lo, scale = gq.quantize(x, 2, 128, param_dtype=torch.float32, noise=noise, **arith)
    assert codes.shape == (4, 1024) and codes.device.type == "meta"
    assert gq.dequantize(codes, lo, scale, 1000, 128, **arith).shape == (4, 1000)
    wire = quantize_rows(x, bits=4, group=128, hadamard=True)
    assert wire.shape == (4, wire_nbytes(1000, 4, 128)) and wire.device.type == "meta"
    assert dequantize_rows(wire, 1000, 4, 128, hadamard=True).shape == (4, 1000)
