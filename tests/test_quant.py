"""The ``quant`` codec: numba and torch write the same bytes, and its error claims hold.

Every array is cut into chunks of rows as the container cuts it; the numba
stream is the concatenation of ``encode`` per chunk (with the chunk's element
offset) and must equal ``encode_tensor``'s bytes, and each path must decode
the other's bytes to the same bits. Errors are checked element by element in
float64 against the payload's own ``lo``/``scale``/codes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorpress as tp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress._util.hashing import hash32, hash32_torch
from tensorpress.compress.kernels.rounding import PREC_FLOAT16
from tensorpress.compress.kernels.rounding import round_via_float32 as to_storage
from tensorpress.compress.quant import codec as quant_module
from tensorpress.compress.quant.codec import MODE_QUANT, MODE_RAW, QuantCodec
from tensorpress.compress.registry import get_codec

FAST = settings(
    max_examples=40,
    deadline=None,  # numba compiles on the first call
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DTYPES = (np.float16, np.float32, np.float64)
TORCH_DTYPE = {np.float16: torch.float16, np.float32: torch.float32, np.float64: torch.float64}
SHAPES = [(), (0,), (1,), (7,), (300,), (33, 17), (5, 4, 3, 2), (3, 0)]
M32 = 0xFFFFFFFF


# -- helpers -------------------------------------------------------------------------


def _chunks(a: np.ndarray, rows: int):
    """(chunk, element offset) pairs as the container cuts ``a`` (chunks of ``rows`` rows)."""
    if a.size == 0:
        return []
    if a.ndim == 0:
        return [(a, 0)]
    row_size = math.prod(a.shape[1:])
    return [(a[s : s + rows], s * row_size) for s in range(0, a.shape[0], rows)]


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64).reshape(-1)


@np.errstate(invalid="ignore")  # NaN - NaN in the raw chunks
def _both_paths(codec: QuantCodec, a: np.ndarray, rows: int) -> list[bytes]:
    """Check byte identity and cross decoding of the two paths; return the chunk payloads."""
    a = np.ascontiguousarray(a)
    chunks = _chunks(a, rows)
    payloads = [codec.encode(c, None, offset=off) for c, off in chunks]
    decoded = []
    for host in (False, True):  # the torch ops, then the numba kernels CPU tensors take
        quant_module.HOST_KERNELS[0] = host
        try:
            tp_bytes, lengths = codec.encode_tensor(torch.from_numpy(a), None, rows)
            assert tp_bytes.dtype == torch.uint8
            assert lengths == [len(p) for p in payloads]
            assert tp_bytes.numpy().tobytes() == b"".join(payloads)
            # torch decodes the numba bytes, numba decodes the torch bytes (they are the same
            # bytes, so this compares the two decoders)
            stream = torch.tensor(list(b"".join(payloads)), dtype=torch.uint8)
            dtype = TORCH_DTYPE[a.dtype.type]
            t_dec = codec.decode_tensor(stream, lengths, a.shape, dtype, None, rows)
        finally:
            quant_module.HOST_KERNELS[0] = True
        assert t_dec.shape == a.shape and t_dec.dtype == TORCH_DTYPE[a.dtype.type]
        decoded.append(t_dec.numpy().reshape(-1))
    assert np.array_equal(_bits(decoded[0]), _bits(decoded[1]))
    t_flat = decoded[0]
    for (c, off), p in zip(chunks, payloads, strict=True):
        d = codec.decode(p, c.shape, a.dtype, None)
        assert d.shape == c.shape and d.dtype == a.dtype
        assert np.array_equal(_bits(d), _bits(t_flat[off : off + c.size]))
        # the recorded max error is the true one, exactly
        err = np.abs(_f64(d) - _f64(c)).max(initial=0.0)
        if p[0] == MODE_RAW:
            assert np.array_equal(_bits(d), _bits(c))
            assert QuantCodec.payload_max_error(p) == 0.0
        else:
            assert QuantCodec.payload_max_error(p) == err
    return payloads


def _parse(codec: QuantCodec, payload: bytes, n: int, dtype):
    """(max_error, lo, scale, codes) of a mode-0 payload, parsed independently of the codec."""
    pdt = np.dtype("<f8" if np.dtype(dtype) == np.float64 else "<f4")
    ngroups = -(-n // codec.group)
    ncodes = ngroups * codec.group if codec.hadamard else n
    assert payload[0] == MODE_QUANT
    err = np.frombuffer(payload, "<f8", 1, 1)[0]
    lo = np.frombuffer(payload, pdt, ngroups, 9).astype(np.float64)
    scale = np.frombuffer(payload, pdt, ngroups, 9 + ngroups * pdt.itemsize).astype(np.float64)
    packed = np.frombuffer(payload, np.uint8, offset=9 + 2 * ngroups * pdt.itemsize)
    assert packed.size == (ncodes * codec.bits + 7) // 8
    per = 8 // codec.bits
    shifts = np.arange(per, dtype=np.uint8) * codec.bits
    codes = ((packed[:, None] >> shifts) & ((1 << codec.bits) - 1)).reshape(-1)
    assert not codes[ncodes:].any()  # zero padding
    return err, lo, scale, codes[:ncodes].astype(np.float64)


def _hash_ref(key: int, i: int) -> int:
    x = (key * 0x9E3779B1 + (i & M32) + (i >> 32) * 0x632BE5AB) & M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def _storage(v: np.ndarray, dtype) -> np.ndarray:
    """numpy's rounding of float64 ``v`` to ``dtype`` (float16 via float32), as float64."""
    if np.dtype(dtype) == np.float64:
        return v
    return v.astype(np.float32).astype(dtype).astype(np.float64)


# -- byte identity -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("hadamard", [False, True])
def test_numba_and_torch_write_the_same_bytes(dtype, bits, stochastic, hadamard):
    rng = np.random.default_rng(bits + 10 * stochastic + 100 * hadamard)
    for group, shapes, chunk_rows in [(16, SHAPES, (2, 1000)), (128, [(300,), (5, 70)], (2,))]:
        codec = QuantCodec(bits=bits, group=group, stochastic=stochastic, seed=7, hadamard=hadamard)
        for shape in shapes:
            a = np.asarray(rng.standard_normal(shape) * 10.0 + 3.0).astype(dtype)
            for rows in chunk_rows:
                _both_paths(codec, a, rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(dtype):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((40, 30, 4)).astype(dtype)
    views = [base[::2, ::3, 1], base.transpose(2, 1, 0), base[:, 5, :].T, base[1:, :, ::2]]
    for hadamard in (False, True):
        codec = QuantCodec(bits=4, group=32, stochastic=True, seed=3, hadamard=hadamard)
        for v in views:
            assert not v.flags.c_contiguous
            _both_paths(codec, np.ascontiguousarray(v), rows=3)
            # the torch caller makes it contiguous the same way
            t = torch.from_numpy(v).contiguous()
            assert codec.encode_tensor(t, None, 3)[0].numpy().tobytes() == b"".join(
                codec.encode(c, None, offset=o) for c, o in _chunks(np.ascontiguousarray(v), 3)
            )


_KINDS = ("normal", "wide", "tiny", "constant", "few", "signed_zeros", "huge", "outliers")


def _make(kind: str, dtype, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    big = {np.float16: 6e4, np.float32: 3e38, np.float64: 1.7e308}[dtype]
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "wide":
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5, n)
    elif kind == "tiny":  # subnormals of the dtype
        x = rng.standard_normal(n) * float(np.finfo(dtype).smallest_subnormal) * 8
    elif kind == "constant":
        x = np.full(n, rng.standard_normal())
    elif kind == "few":
        x = rng.choice([-1.5, 0.0, 2.25, 1e3], n)
    elif kind == "signed_zeros":
        x = rng.choice([-0.0, 0.0], n)
    elif kind == "huge":  # near the top of the range: the range may overflow (stored raw)
        x = rng.uniform(-1.0, 1.0, n) * big  # (uniform(-big, big) overflows for float64)
    else:
        x = rng.standard_normal(n)
        x[rng.random(n) < 0.02] *= 1e4
    return np.asarray(x.reshape(shape)).astype(dtype)


@FAST
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.sampled_from([(), (1,), (5,), (130,), (257,), (9, 31), (4, 3, 50)]),
    kind=st.sampled_from(_KINDS),
    seed=st.integers(0, 2**31 - 1),
    bits=st.sampled_from([2, 4, 8]),
    group=st.sampled_from([16, 32, 128]),
    stochastic=st.booleans(),
    hadamard=st.booleans(),
    rows=st.integers(1, 6),
    offset_rows=st.integers(0, 3),
)
def test_property_byte_identity_and_exact_max_error(
    dtype, shape, kind, seed, bits, group, stochastic, hadamard, rows, offset_rows
):
    codec = QuantCodec(bits, group, stochastic, seed, hadamard)
    a = _make(kind, dtype, shape, seed)
    payloads = _both_paths(codec, a, rows)
    if kind == "constant" and not hadamard:
        assert all(QuantCodec.payload_max_error(p) == 0.0 for p in payloads)


# -- error claims --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_nearest_error_is_half_a_step_plus_storage_rounding(dtype, bits):
    """Nearest mode, no hadamard: with ``lo``/``s`` a group's stored parameters, ``c`` a code,
    ``v = lo + c*s`` (float64) and ``x' = R(v)``, each element satisfies

    * ``x' == R(v)`` exactly (numpy's rounding; float16 via float32), so
      ``|x' - v| <= ulp(x')/2`` (plus half a float32 ulp for float16: double rounding);
    * ``|v - x| <= s/2 + 2**-50 * (|x| + 2|lo| + (2**bits) * s)``: floor(d/s + 0.5) is within
      1/2 of d/s = (x - lo)/s up to three float64 roundings of the quotient path and two of
      the reconstruction (|lo| < 2**-52 relative each); lo == x's group min exactly, so no
      code is clamped at 0, and the top code is off by at most 2**-23 * maxc steps from
      P's rounding of s.
    """
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal(5000) * 10.0 ** rng.integers(-3, 4, 5000)).astype(dtype)
    x[:7] = np.finfo(dtype).max / 1024  # a group with a huge value
    codec = QuantCodec(bits=bits, group=64)
    p = codec.encode(x)
    y = _f64(codec.decode(p, x.shape, dtype))
    err, lo, scale, codes = _parse(codec, p, x.size, dtype)
    g = np.arange(x.size) // codec.group
    xf = _f64(x)
    assert np.array_equal(lo, np.minimum.reduceat(xf, np.arange(0, x.size, codec.group)))
    v = lo[g] + codes * scale[g]
    assert np.array_equal(y, _storage(v, dtype))
    spacing = np.spacing(np.abs(y).astype(dtype)).astype(np.float64)
    if dtype == np.float16:
        spacing = spacing + np.spacing(np.abs(v).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(y - v) <= spacing / 2)
    step_bound = scale[g] / 2 + 2.0**-50 * (np.abs(xf) + 2 * np.abs(lo[g]) + 2**bits * scale[g])
    assert np.all(np.abs(v - xf) <= step_bound)
    assert np.all(np.abs(y - xf) <= step_bound + np.abs(y - v))
    assert err == np.abs(y - xf).max()
    assert err > 0


def test_stochastic_rounding_is_unbiased():
    """Values below half a step above each group's minimum: nearest rounding takes them all
    down (mean error about -0.075), stochastic rounding is off by 0 on average within 5
    standard errors (1e5 values; the 2**-24 grid of the noise biases by < 2**-24 steps)."""
    n, group = 100_000, 128
    x = np.random.default_rng(5).uniform(0.0, 0.15, n)
    x[::group] = 0.0
    x[1::group] = 1.0  # every group spans [0, 1]: 2 bits give steps of 1/3
    rest = np.ones(n, bool)
    rest[::group] = rest[1::group] = False
    for stochastic, seed in [(False, 0), (True, 0), (True, 12345)]:
        codec = QuantCodec(bits=2, group=group, stochastic=stochastic, seed=seed)
        e = (codec.decode(codec.encode(x), x.shape, x.dtype) - x)[rest]
        if stochastic:
            assert abs(e.mean()) <= 5 * e.std() / math.sqrt(e.size)
            assert np.abs(e).max() < (1 / 3) * (1 + 1e-12)  # never more than one step
        else:
            assert e.mean() < -0.07
    # with hadamard the rounding is unbiased in the rotated domain, hence in the data domain
    y = np.random.default_rng(6).standard_normal(n) * 1e-3
    codec = QuantCodec(bits=2, group=group, stochastic=True, hadamard=True)
    e = codec.decode(codec.encode(y), y.shape, y.dtype) - y
    assert abs(e.mean()) <= 5 * e.std() / math.sqrt(n)


def test_seeds_and_offsets_decide_the_noise():
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    for hadamard in (False, True):
        a = QuantCodec(stochastic=True, seed=1, hadamard=hadamard)
        b = QuantCodec(stochastic=True, seed=1, hadamard=hadamard)
        c = QuantCodec(stochastic=True, seed=2, hadamard=hadamard)
        assert a.encode(x) == b.encode(x)
        assert a.encode(x) != c.encode(x)
        assert a.encode(x, offset=0) != a.encode(x, offset=x.size)
        ta = a.encode_tensor(torch.from_numpy(x), None, 16)[0]
        assert torch.equal(ta, b.encode_tensor(torch.from_numpy(x), None, 16)[0])
        assert not torch.equal(ta, c.encode_tensor(torch.from_numpy(x), None, 16)[0])
    # hadamard alone: the seed picks the signs
    h1, h2 = QuantCodec(hadamard=True, seed=1), QuantCodec(hadamard=True, seed=2)
    assert h1.encode(x) != h2.encode(x)
    assert QuantCodec().encode(x) == QuantCodec(seed=9).encode(x)  # nearest: seed unused


def test_hadamard_spreads_an_outlier():
    x = np.random.default_rng(2).standard_normal(4096)
    x[::256] = 1e3  # one outlier per 256 values: plain 4-bit groups waste their range
    plain = QuantCodec(bits=4, group=256)
    rot = QuantCodec(bits=4, group=256, hadamard=True)
    e_plain = np.abs(plain.decode(plain.encode(x), x.shape, x.dtype) - x)
    e_rot = np.abs(rot.decode(rot.encode(x), x.shape, x.dtype) - x)
    assert np.sqrt((e_rot**2).mean()) < 0.5 * np.sqrt((e_plain**2).mean())


# -- special values and degenerate data ----------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hadamard", [False, True])
def test_non_finite_chunks_are_stored_raw_and_exact(dtype, hadamard):
    x = np.random.default_rng(3).standard_normal((6, 50)).astype(dtype)
    nan_payload = _bits(np.array([np.nan], dtype))[0] | 1  # a NaN with a payload bit
    x[1, 3] = np.array([nan_payload], _bits(x).dtype).view(dtype)[0]
    x[3, 0] = np.inf
    x[3, 1] = -np.inf
    x[5, 49] = -np.nan
    codec = QuantCodec(bits=2, group=16, hadamard=hadamard, stochastic=True)
    payloads = _both_paths(codec, x, rows=1)
    assert [p[0] for p in payloads] == [0, 1, 0, 1, 0, 1]
    assert len(payloads[1]) == 1 + x[1].nbytes


def test_range_overflow_is_stored_raw():
    """A finite chunk whose reconstruction would not be finite goes raw (and comes back exact);
    a range that still fits is quantized."""
    big64 = np.array([-1.7e308, 1.7e308, 0.0])  # hi - lo overflows float64
    big32 = np.full(64, 3e38, np.float32)  # the rotated sums overflow float32 parameters
    for x, codec, mode in [
        (big64, QuantCodec(bits=2, group=16), MODE_RAW),
        (big32, QuantCodec(bits=2, group=16, hadamard=True), MODE_RAW),
        (np.array([-3e38, 3e38] * 20, np.float32), QuantCodec(bits=2, group=16), MODE_QUANT),
    ]:
        [p] = _both_paths(codec, x, rows=x.shape[0])
        assert p[0] == mode
        assert math.isfinite(QuantCodec.payload_max_error(p))


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_groups_are_exact(dtype):
    rng = np.random.default_rng(4)
    consts = rng.standard_normal(20).astype(dtype)
    consts[3] = 0.0
    consts[4] = np.finfo(dtype).max
    consts[5] = np.finfo(dtype).smallest_subnormal
    for group in (16, 64):
        x = np.repeat(consts, group)[: 20 * group - 5]  # short last group too
        for bits in (2, 4, 8):
            codec = QuantCodec(bits=bits, group=group, stochastic=bits == 4)
            [p] = _both_paths(codec, x, rows=x.size)
            y = codec.decode(p, x.shape, dtype)
            assert np.array_equal(y, x)
            assert QuantCodec.payload_max_error(p) == 0.0
    zeros = np.zeros((3, 100), dtype)
    codec = QuantCodec(hadamard=True, group=32)
    for p in _both_paths(codec, zeros, rows=1):
        assert QuantCodec.payload_max_error(p) == 0.0


def test_empty_and_scalar_chunks():
    codec = QuantCodec()
    p = codec.encode(np.zeros(0, np.float32))
    assert p == bytes([0]) + bytes(8)
    assert codec.decode(p, (0, 3), np.float32).shape == (0, 3)
    for shape in [(0,), (3, 0), (0, 2, 2)]:
        t, lengths = codec.encode_tensor(torch.zeros(shape), None, 2)
        assert t.numel() == 0 and t.dtype == torch.uint8 and lengths == []
        assert codec.decode_tensor(t, [], shape, torch.float32, None, 2).shape == shape
    s = np.array(2.5, np.float64)
    [p] = _both_paths(QuantCodec(hadamard=True), s, rows=1)
    assert codec.decode(codec.encode(s), (), np.float64).shape == ()
    out = np.empty((), np.float64)
    assert codec.decode(codec.encode(s), (), np.float64, out=out) is out
    assert out == 2.5  # one value: lo = x, scale 0


def test_decode_into_out():
    codec = QuantCodec(bits=8)
    x = np.linspace(-1, 1, 600).reshape(20, 30).astype(np.float32)
    out = np.full_like(x, np.nan)
    r = codec.decode(codec.encode(x), x.shape, x.dtype, out=out)
    assert r is out and np.abs(out - x).max() <= (2 / 255) / 2 * 1.0001


def test_bfloat16_tensors():
    codec = QuantCodec(bits=4, group=16, stochastic=True)
    t = torch.linspace(-3, 5, 1000).reshape(10, 100).to(torch.bfloat16)
    t[7, 3] = float("nan")
    payload, lengths = codec.encode_tensor(t, None, 2)
    y = codec.decode_tensor(payload, lengths, t.shape, torch.bfloat16, None, 2)
    assert y.dtype == torch.bfloat16
    starts = np.cumsum([0, *lengths])
    blob = payload.numpy().tobytes()
    for c in range(5):
        p = blob[starts[c] : starts[c + 1]]
        rows = slice(2 * c, 2 * c + 2)
        if c == 3:
            assert p[0] == MODE_RAW
            assert torch.equal(y[rows].view(torch.int16), t[rows].view(torch.int16))
        else:
            true = (y[rows].double() - t[rows].double()).abs().max().item()
            assert QuantCodec.payload_max_error(p) == true
            assert len(p) == 9 + 2 * 13 * 4 + 100  # float32 parameters, 13 groups


# -- threads, container, chunking inference ------------------------------------------


def test_threads_do_not_change_the_bytes(monkeypatch):
    x = np.random.default_rng(6).standard_normal(10_000).astype(np.float16)
    for hadamard in (False, True):
        codec = QuantCodec(bits=2, group=64, stochastic=True, hadamard=hadamard)
        one = codec.encode(x, threads=1, offset=123)
        monkeypatch.setattr(quant_module, "_PARALLEL_MIN_ELEMENTS", 100)
        assert codec.encode(x, threads=3, offset=123) == one
        assert codec.encode(x, threads=64, offset=123) == one
        monkeypatch.undo()


def test_through_the_container():
    x = np.random.default_rng(7).standard_normal((300, 40)).astype(np.float32)
    blob = tp.compress(x, codec="quant", bits=8, group=64, chunk_bytes=4096)
    y = tp.decompress(blob)
    assert tp.info(blob)["chunks"] > 1
    assert np.abs(y - x).max() <= (x.max() - x.min()) / 255


def test_hadamard_through_the_container():
    x = np.random.default_rng(7).standard_normal((300, 40)).astype(np.float32)
    blob = tp.compress(x, codec="quant", bits=8, hadamard=True, chunk_bytes=4096)
    assert np.abs(tp.decompress(blob) - x).max() < 0.1


# -- bad payloads and parameters -----------------------------------------------------


@pytest.mark.parametrize("hadamard", [False, True])
def test_truncated_or_padded_payloads_raise(hadamard):
    codec = QuantCodec(bits=4, group=16, hadamard=hadamard)
    x = np.random.default_rng(8).standard_normal(50)
    raw = x.copy()
    raw[0] = np.nan
    for a in (x, raw):
        p = codec.encode(a)
        for bad in (p[:-1], p + b"\0", p[:1], p[:9], b""):
            with pytest.raises(ValueError):
                codec.decode(bad, a.shape, a.dtype)
            t = torch.tensor(list(bad), dtype=torch.uint8)
            with pytest.raises(ValueError):
                codec.decode_tensor(t, [len(bad)], a.shape, torch.float64, None, 50)
        with pytest.raises(ValueError, match="expected"):
            codec.decode(p, (50 + codec.group,), a.dtype)  # the message says what it expected
        with pytest.raises(ValueError):
            codec.decode(p, a.shape, np.float32)  # float32 parameters: another length
    with pytest.raises(ValueError, match="mode"):
        codec.decode(b"\x07" + bytes(8), (0,), np.float64)
    with pytest.raises(ValueError):
        QuantCodec.payload_max_error(b"")
    assert QuantCodec.payload_max_error(codec.encode(raw)) == 0.0
    with pytest.raises(ValueError, match="add up"):
        codec.decode_tensor(torch.zeros(5, dtype=torch.uint8), [4], (3,), torch.float64, None, 3)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"bits": 3}, "bits must be 2, 4 or 8"),
        ({"bits": True}, "bits must be an integer"),
        ({"bits": 4.0}, "bits must be an integer"),
        ({"group": 100}, "power of two from 16 to 4096"),
        ({"group": 8}, "power of two"),
        ({"group": 8192}, "power of two"),
        ({"stochastic": 1}, "stochastic must be true or false"),
        ({"hadamard": "yes"}, "hadamard must be true or false"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*31\)"),
        ({"seed": 2**31}, "seed must be in"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"level": 3}, "invalid config for codec 'quant'"),
    ],
)
def test_invalid_params(params, match):
    with pytest.raises(ValueError, match=match):
        get_codec("quant", **params)


def test_config_round_trip():
    codec = get_codec("quant", bits=2, group=256, stochastic=True, seed=99, hadamard=True)
    config = codec.get_config()
    assert config == {
        "id": "quant",
        "bits": 2,
        "group": 256,
        "stochastic": True,
        "seed": 99,
        "hadamard": True,
    }
    assert get_codec(config) == codec and QuantCodec.from_config(config) == codec
    assert get_codec("quant").get_config()["bits"] == 4
    assert codec.bounded is False and codec.lossy and codec.has_tensor_path
    with pytest.raises(TypeError):
        codec.encode(np.zeros(3, np.int32))


# -- building blocks -----------------------------------------------------------------


def test_hash32_numba_torch_and_reference_agree():
    rng = np.random.default_rng(9)
    idx = [int(i) for i in rng.integers(0, 2**63 - 1, 300)]
    idx += list(range(40)) + [2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**63 - 1]
    keys = [
        0,
        1,
        2,
        3,
        2**31 - 1,
        2**31,
        2**32 - 2,
        2**32 - 1,
        *map(int, rng.integers(0, 2**32, 5)),
    ]
    for key in keys:
        ref = [_hash_ref(key, i) for i in idx]
        assert [hash32(key, i) for i in idx] == ref
        assert hash32_torch(key, torch.tensor(idx, dtype=torch.int64)).tolist() == ref
    # the low bits used for signs and the high bits used for noise are balanced
    h = hash32_torch(7, torch.arange(100_000))
    assert abs((h & 1).double().mean().item() - 0.5) < 0.01
    assert abs((h >> 8).double().mean().item() / 2**24 - 0.5) < 0.01


@np.errstate(over="ignore")
def test_float16_storage_rounding_matches_numpy():
    rng = np.random.default_rng(10)
    f16 = rng.integers(0, 2**16, 20_000, dtype=np.uint16).view(np.float16)
    f16 = f16[np.isfinite(f16)].astype(np.float64)
    nxt = np.nextafter(f16.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    mid = (f16 + nxt) / 2  # ties (exact in float32 unless a subnormal float32 gap)
    v = np.concatenate(
        [
            f16,
            mid,
            np.nextafter(mid, np.inf),
            np.nextafter(mid, -np.inf),
            mid + np.spacing(mid.astype(np.float32)).astype(np.float64) / 4,  # float32 ties
            rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, 5000),
            [65504.0, 65519.99, 65520.0, 1e6, -1e6, 2.0**-25, 2.0**-24, 3 * 2.0**-26, 0.0, -0.0],
        ]
    )
    v = v[np.isfinite(v)]
    mine = np.array([to_storage(float(a), PREC_FLOAT16) for a in v])
    ref = _storage(v, np.float16)
    assert np.array_equal(_bits(mine), _bits(ref))
    t = torch.from_numpy(v).to(torch.float32).to(torch.float16).double().numpy()
    assert np.array_equal(_bits(t), _bits(ref))


def test_decode_tensor_refuses_chunk_rows_that_do_not_match():
    codec = QuantCodec(bits=2, group=16)
    payload, lengths = codec.encode_tensor(torch.arange(10.0), None, 7)
    with pytest.raises(ValueError, match="do not match"):
        codec.decode_tensor(payload, lengths, (10,), torch.float32, None, 3)


def test_compressed_tensor_reports_the_max_error():
    from tensorpress.compress import compress_tensor, decompress_tensor

    t = torch.randn(3000, 50, generator=torch.Generator().manual_seed(4))
    t[5, 5] = math.nan  # one chunk stored raw: it records no error
    ct = compress_tensor(t, codec="quant", bits=2, chunk_bytes=100_000)
    err = (decompress_tensor(ct).double() - t.double()).abs()
    assert len(ct.lengths) > 1
    assert ct.max_error == float(err[torch.isfinite(err)].max())
    assert compress_tensor(t, codec="block", rel=1e-2).max_error is None
