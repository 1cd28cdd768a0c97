"""``sz``'s row-match predictor (``predictor="match"``): the bound on every element
(hypothesis over dtypes, bounds, layouts and special values on rows that repeat, and
over the property cases), the kernel's decoder reproducing the encoder's
reconstruction under any references, the bytes it saves where rows repeat and the
search declining where they do not, and damaged references refused."""

import dataclasses

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from tensorpress.compress.sz import match as sz_match
from tensorpress.compress.sz.kernels.match import match_decode, match_encode
from test_bound_properties import FAST, LAYOUTS, bounds, cases, run_case, run_values
from test_sz_predictors import assert_flipped_bytes_handled


def tokens(shape, vocab=12, spread=0.03, seed=0, dtype=np.float32):
    """Rows (the last dimension) drawn from ``vocab`` random token rows plus a small
    position term of ``spread`` times their scale: the rows repeat, nearly."""
    rng = np.random.default_rng(seed)
    width = shape[-1]
    rows = int(np.prod(shape[:-1]))
    table = rng.standard_normal((vocab, width))
    x = table[rng.integers(0, vocab, rows)] + spread * rng.standard_normal((rows, width))
    return x.reshape(shape).astype(dtype)


@FAST
@given(case=cases())
def test_bound_holds_on_every_element(case):
    run_case(dataclasses.replace(case, predictor="match"))


@FAST
@given(
    rows=st.sampled_from([(5,), (3, 7), (2, 2, 9), (40,)]),
    width=st.sampled_from([256, 300, 517]),
    dtype=st.sampled_from(["float16", "float32", "float64"]),
    bound=bounds(),
    specials=st.sampled_from([0.0, 0.0, 0.01, 0.2]),
    layout=st.sampled_from(LAYOUTS),
    predictor=st.sampled_from(["match", "auto"]),
    radius=st.sampled_from([32768, 64, 2]),
    seed=st.integers(0, 2**31),
)
def test_bound_holds_where_rows_repeat(
    rows, width, dtype, bound, specials, layout, predictor, radius, seed
):
    """Rows the search matches, with NaN, +-Inf, denormals and +-max among them, in
    every layout and under every kind of bound: each element within the bound, and
    the same bytes again."""
    x = tokens((*rows, width), vocab=3, seed=seed, dtype=np.dtype(dtype))
    run_values(x, seed, "tokens", dtype, bound, specials, layout, radius, predictor)


@FAST
@given(
    shape=st.sampled_from([(1, 1), (4, 1), (6, 5), (9, 17), (3, 64)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    radius=st.sampled_from([4, 32768]),
    seed=st.integers(0, 2**31),
)
def test_decoder_reproduces_the_encoder(shape, dtype, radius, seed):
    """Any references, even poor ones (far rows: outliers at a small radius): the decoder
    returns values within the bound, bit for bit the encoder's reconstruction, and
    refuses a stream short of an outlier."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 100.0], shape)).astype(dtype)
    refs = np.array([rng.integers(0, t + 1) for t in range(shape[0])], np.int64)
    eb, c = 1e-2, float(rng.normal())
    prec = PREC_FLOAT64 if dtype == np.float64 else PREC_FLOAT32
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size, dtype)
    rec = np.empty_like(x)
    k = match_encode(x, refs, c, eb, radius, prec, codes, outliers, rec)
    out = np.empty_like(x)
    assert match_decode(codes, outliers[:k], refs, c, eb, radius, prec, out) == k
    assert np.all(np.abs(out.astype(np.float64) - x) <= eb)
    referred = np.unique(np.arange(shape[0])[refs > 0] - refs[refs > 0])
    np.testing.assert_array_equal(out[referred], rec[referred])
    if k:
        with pytest.raises(ValueError, match="outlier"):
            match_decode(codes, outliers[: k - 1], refs, c, eb, radius, prec, out)


def test_repeating_rows_code_smaller():
    """Rows that nearly repeat: the references cost far fewer bytes than constant
    prediction, ``auto`` takes them, and nearly every row refers to an earlier row of
    its own token."""
    rng = np.random.default_rng(4)
    vocab = rng.standard_normal((40, 512))
    token = rng.integers(0, 40, 1024)
    x = (vocab[token] + 0.02 * rng.standard_normal((1024, 512))).astype(np.float32)
    x = x.reshape(4, 256, 512)
    eb = 1e-3 * float(x.max() - x.min())
    size = {
        p: len(tp.compress(x, abs=eb, predictor=p, workers=1))
        for p in ("constant", "match", "auto")
    }
    assert size["match"] < 0.6 * size["constant"]
    assert abs(size["auto"] - size["match"]) <= 8  # the container names the config
    refs, _, _ = sz_match.references(x.reshape(1024, 512), 0.0, eb)
    row = np.arange(1024)
    repeats = np.array([t for t in range(1024) if token[t] in token[:t]])
    same = token[repeats - refs[repeats]] == token[repeats]
    assert np.mean((refs[repeats] > 0) & same) > 0.95
    assert np.all(refs[[t for t in row if t not in repeats]] == 0)  # first of its token
    y = tp.decompress(tp.compress(x, abs=eb, workers=1))
    assert np.all(np.abs(y.astype(np.float64) - x) <= eb)


def test_rows_that_do_not_repeat_keep_constant_prediction():
    """Noise rows: the search declines, and ``match`` writes what ``constant`` does."""
    x = np.random.default_rng(5).standard_normal((512, 300)).astype(np.float32)
    assert sz_match.references(x, 0.0, 1e-3) is None
    match = tp.compress(x, rel=1e-3, predictor="match", workers=1)
    constant = tp.compress(x, rel=1e-3, predictor="constant", workers=1)
    assert abs(len(match) - len(constant)) <= 8
    np.testing.assert_array_equal(tp.decompress(match), tp.decompress(constant))


@pytest.mark.parametrize(
    ("blob", "rows"),
    [
        (b"", 3),
        (sz_match.pack(np.arange(20) % 3), 40),  # too few fields for the rows
        (sz_match.pack(np.arange(20) % 3)[:-1], 20),  # truncated
        (sz_match.pack(np.array([1, 0, 0])), 3),  # the first row has no earlier row
        (sz_match.pack(np.array([0, 1, 3])), 3),  # before the first row
        (bytes([33]) + bytes(13), 3),  # wider than any reference
    ],
)
def test_damaged_references_are_refused(blob, rows):
    with pytest.raises(ValueError, match="row references|earlier row"):
        sz_match.unpack(blob, rows)


def test_damaged_payloads_raise():
    blob = tp.compress(tokens((64, 256)), rel=1e-3, predictor="match")
    assert_flipped_bytes_handled(blob, "match")
