"""``sz``'s Huffman code fitted to the codes outside long runs (sz/runs.py): the run
counts, the stream decoding to the same codes, the payload taking it only where it
pays, the bound on every element, the compiled plugin reading it, and the choice's
price of runs."""

import itertools

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from plugin_tools import c_verdict, decode_driver
from tensorpress.compress.sz import choice, runs
from tensorpress.compress.sz.huffman import huffman_decode, huffman_encode
from tensorpress.compress.sz.ids import CONSTANT, LORENZO, REGRESSION
from tensorpress.compress.sz.kernels.runs import long_runs
from tensorpress.compress.sz.steps import huffman_bits
from tensorpress.compress.zstd import zstd_compress
from test_bound_properties import FAST, LAYOUTS, bounds, run_values


def causal_attention(heads=8, t=128, seed=0, dtype=np.float32):
    """Softmax rows of a causal mask: row i has i + 1 nonzero probabilities, the rest of
    the row (the upper triangle, half the values) exact zeros."""
    rng = np.random.default_rng(seed)
    logits = 2.0 * rng.standard_normal((heads, t, t))
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)).astype(dtype)


def run_codes(seed, rows=100, width=200, symbols=40):
    """uint16 codes as causal attention's: rows of noise around 1000 (``symbols`` codes
    from 1000 on), each ending in a run of the code 1000 of random length."""
    rng = np.random.default_rng(seed)
    codes = (1000 + rng.integers(0, symbols, (rows, width))).astype(np.uint16)
    for row, start in zip(codes, rng.integers(0, width, rows), strict=True):
        row[start:] = 1000
    return codes.reshape(-1)


def reference_runs(codes, lo, width, min_run):
    """``long_runs`` by itertools: per code, what its long runs hold beyond one code."""
    beyond, in_runs, count = np.zeros(width, np.int64), 0, 0
    for c, group in itertools.groupby(codes.tolist()):
        length = len(list(group))
        if length >= min_run:
            beyond[c - lo] += length - 1
            in_runs += length
            count += 1
    return beyond, in_runs, count


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("min_run", [1, 2, 16])
def test_long_runs_match_a_reference(seed, min_run):
    codes = run_codes(seed)
    codes[-40:] = codes[-41]  # a long run at the end too
    lo, width = int(codes.min()), int(codes.max()) - int(codes.min()) + 1
    got = long_runs(codes, lo, width, min_run)
    want = reference_runs(codes, lo, width, min_run)
    assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]
    assert long_runs(np.zeros(0, np.uint16), 0, 1, min_run)[1:] == (0, 0)


@pytest.mark.parametrize("seed", range(4))
def test_the_weighted_stream_decodes_to_the_codes_and_zstd_shortens_it(seed):
    codes = run_codes(seed)
    stream = runs.weighted_stream(codes)
    assert stream is not None and stream != huffman_encode(codes)
    assert np.array_equal(huffman_decode(stream, codes.size), codes)
    plain = len(zstd_compress(huffman_encode(codes), 1))
    assert len(zstd_compress(stream, 1)) <= runs.RUN_GAIN * plain


def test_no_runs_no_weighted_stream():
    codes = (1000 + np.random.default_rng(0).integers(0, 40, 20000)).astype(np.uint16)
    counts = np.bincount(codes - 1000)
    assert runs.weighted_stream(codes) is None
    assert runs.run_bits(codes, counts, 1000) is None
    assert runs.weighted_stream(np.zeros(0, np.uint16)) is None
    assert runs.weighted_stream(np.full(100, 7, np.uint16)) is None  # one symbol: 0 bits


def test_run_bits_prices_long_runs_below_their_huffman_bits():
    codes = run_codes(0)
    counts = np.bincount(codes - 1000)
    priced = runs.run_bits(codes, counts, 1000)
    assert priced is not None and priced < 0.9 * huffman_bits(codes - 1000)


def _without_weighted(x, **kw):
    """The stream of ``tp.compress(x, **kw)`` with the plain Huffman code only."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "weighted_stream", lambda codes: None)
        return tp.compress(x, **kw)


def test_causal_attention_takes_the_weighted_code_where_it_pays():
    """At rel 1e-4 the upper triangle's zeros are long runs: the payload is at least
    1 / RUN_GAIN smaller with the weighted code, and every element within the bound."""
    x = causal_attention()
    kw = {"rel": 1e-4, "codec": "sz", "workers": 1}
    weighted, plain = tp.compress(x, **kw), _without_weighted(x, **kw)
    assert len(weighted) <= runs.RUN_GAIN * len(plain)
    tol = tp.info(weighted)["bound"]["tolerance"]
    y = tp.decompress(weighted)
    assert np.all(np.abs(y.astype(np.float64) - x) <= tol)
    assert np.array_equal(y, tp.decompress(plain))  # the same codes, another code for them


@pytest.mark.parametrize("rel", [1e-2, 1e-3])
def test_a_weighted_code_that_saves_little_is_not_taken(rel):
    """Where the run-weighted code would save under 1 - RUN_GAIN of the bytes (or
    nothing: the zero code is one bit already), the payload keeps the plain code."""
    x = causal_attention()
    kw = {"rel": rel, "codec": "sz", "workers": 1}
    assert tp.compress(x, **kw) == _without_weighted(x, **kw)


@FAST
@given(
    heads=st.sampled_from([1, 3, 8]),
    t=st.sampled_from([17, 64, 130]),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    bound=bounds(),
    specials=st.sampled_from([0.0, 0.0, 0.01, 0.2]),
    layout=st.sampled_from(LAYOUTS),
    predictor=st.sampled_from(["auto", "constant", "lorenzo", "regression"]),
    radius=st.sampled_from([32768, 64, 2]),
    seed=st.integers(0, 2**31),
)
def test_bound_holds_with_the_weighted_code(
    heads, t, dtype, bound, specials, layout, predictor, radius, seed
):
    """With the weighted code taken wherever it is built (``RUN_GAIN`` raised), on
    values with long runs, NaN, +-Inf, denormals and +-max among them, in every layout
    and under every kind of bound: each element within the bound, the same bytes again."""
    x = causal_attention(heads, t, seed % 1000, np.dtype(dtype))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "RUN_GAIN", 2.0)
        run_values(x, seed, "causal attention", dtype, bound, specials, layout, radius, predictor)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_compiled_plugin_decodes_the_weighted_code_bit_for_bit(driver, tmp_path, dtype):
    x = causal_attention(dtype=dtype)
    stream = tp.compress(x, rel=1e-4, codec="sz", workers=1)
    assert len(stream) <= runs.RUN_GAIN * len(_without_weighted(x, rel=1e-4, codec="sz"))
    got, code = c_verdict(driver, tmp_path, stream)
    assert code == 0 and got == np.ascontiguousarray(tp.decompress(stream)).tobytes()


def _scored(*pairs):
    return [(cost, ((pred, 1.0, 1.0), (4, 4))) for cost, pred in pairs]


def test_regression_needs_a_clear_margin_over_constant_prediction():
    """Block-wise regression decodes slower than constant prediction: it stays first only
    where it samples at most _REGRESSION_GAIN of the constant's bits."""
    gain = choice._REGRESSION_GAIN
    close = _scored((gain * 1000 + 1, REGRESSION), (1100, LORENZO), (1000, CONSTANT))
    assert choice._regression_margin(close)[0][1][0][0] == CONSTANT
    assert len(choice._regression_margin(close)) == 3
    clear = _scored((gain * 1000, REGRESSION), (1000, CONSTANT))
    assert choice._regression_margin(clear) == clear
    alone = _scored((500, REGRESSION), (1000, LORENZO))
    assert choice._regression_margin(alone) == alone
