"""Rows of a ``block`` chunk decoded on their own give exactly the whole chunk's rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.compress import ErrorBound, get_codec
from tensorpress.compress.block.kernels.layout import DELTA, MODE_BLOCKS, MODE_RAW, SPARSE

KINDS = ("smooth", "sparse", "noise", "specials", "constant", "steps")


def _values(kind: str, n: int, dtype, rng) -> np.ndarray:
    """``n`` values that make the encoder pick ``kind``'s packings: delta blocks (smooth,
    steps), sparse ones, wide codes, raw blocks (NaN, inf), one-value blocks."""
    t = np.arange(n, dtype=np.float64)
    if kind == "smooth":
        x = np.sin(t / 37.0) * 100 + t * 0.01
    elif kind == "sparse":
        x = np.where(rng.random(n) < 0.05, rng.normal(0, 50, n), 0.0)
    elif kind == "noise":
        x = rng.normal(0, 1e3, n)
    elif kind == "specials":
        x = rng.normal(0, 1, n)
        x[rng.random(n) < 0.02] = np.nan
        x[rng.random(n) < 0.01] = np.inf
    elif kind == "constant":
        x = np.full(n, 3.25)
    else:
        x = np.floor(t / 50.0) * 7.0 + np.where(rng.random(n) < 0.3, 1.0, 0.0)
    return x.astype(dtype)


def _pages(payload: np.ndarray, page: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """The payload laid in pages of ``page`` bytes in a shuffled order, among spare
    pages of junk: (pages, ids of the payload's pages in order)."""
    count = -(-payload.size // page)
    spare = count + 3
    pages = rng.integers(0, 256, (spare, page), dtype=np.uint8)
    ids = rng.permutation(spare)[:count].astype(np.int64)
    for k, p in enumerate(ids):
        part = payload[k * page : (k + 1) * page]
        pages[p, : part.size] = part
    return pages, ids


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from([np.float32, np.float64]),
    rows=st.integers(1, 7),
    row_shape=st.sampled_from([(1,), (5,), (64,), (3, 50), (129,), (2, 64), (700,)]),
    mode=st.sampled_from(["abs", "rel", "pw_rel", "stochastic"]),
    page=st.sampled_from([0, 8, 64, 4096]),
    data=st.data(),
)
def test_rows_decode_to_what_the_whole_chunk_decodes_to(
    kind, dtype, rows, row_shape, mode, page, data
):
    """Every row range (empty ones, the first and last rows, the whole chunk), from a
    contiguous payload or from shuffled pages, decodes bit for bit to the whole-chunk
    decode's rows."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    shape = (rows, *row_shape)
    x = _values(kind, math.prod(shape), dtype, rng).reshape(shape)
    extra = {"stochastic": True, "seed": 5} if mode == "stochastic" else {}
    mode = "abs" if extra else mode
    codec = get_codec("block", **{mode: 1e-2}, **extra)
    bound = ErrorBound(mode, 1e-2).resolve(x)
    payload = np.frombuffer(codec.encode(x, bound), np.uint8)
    full = codec.decode(payload.tobytes(), shape, x.dtype, bound)
    dec = codec.rows_decoder(shape, x.dtype, bound)
    index = dec.index(payload)
    r0 = data.draw(st.integers(0, rows))
    r1 = data.draw(st.integers(r0, rows))
    if page:
        pages, ids = _pages(payload, page, rng)
    else:
        pages, ids = payload.reshape(1, -1), np.zeros(1, np.int64)
    out = np.full((r1 - r0, *row_shape), -7.0, dtype)
    dec.decode(pages, ids, payload.size, index, r0, r1, out)
    assert np.array_equal(_bits(out), _bits(np.ascontiguousarray(full[r0:r1])))


def _chunk(kind: str, shape, dtype=np.float32, mode="abs"):
    rng = np.random.default_rng(3)
    x = _values(kind, math.prod(shape), dtype, rng).reshape(shape)
    codec = get_codec("block", **{mode: 1e-2})
    bound = ErrorBound(mode, 1e-2).resolve(x)
    payload = np.frombuffer(codec.encode(x, bound), np.uint8)
    return codec, bound, x, payload


def test_the_cases_the_property_relies_on_are_made():
    """The generated chunks hold delta, sparse and raw blocks, and whole raw payloads."""
    _, _, _, smooth = _chunk("smooth", (4, 640))
    _, _, _, sparse = _chunk("sparse", (4, 640))
    _, _, _, specials = _chunk("specials", (4, 640))
    heads = lambda p: p[1 : 1 + 40]  # noqa: E731
    assert smooth[0] == MODE_BLOCKS and (heads(smooth) & DELTA).all()
    assert (heads(sparse) & SPARSE).any()
    assert ((heads(specials) & 0x1F) == 31).any()
    x = np.random.default_rng(1).random((3, 33)).astype(np.float32)
    raw = get_codec("block", abs=0.0).encode(x, ErrorBound("abs", 0.0).resolve(x))
    assert raw[0] == MODE_RAW


def test_each_row_of_a_delta_chunk_alone():
    """A chunk of delta blocks only (each row's first block carries a code in), rows
    decoded one at a time in reverse order."""
    codec, bound, x, payload = _chunk("smooth", (6, 100))
    full = codec.decode(payload.tobytes(), x.shape, x.dtype, bound)
    dec = codec.rows_decoder(x.shape, x.dtype, bound)
    index = dec.index(payload)
    assert (index[1:-1, 2] != 0).any()  # codes are carried into rows' first blocks
    for r in reversed(range(6)):
        out = np.empty((1, 100), np.float32)
        one = (payload.reshape(1, -1), np.zeros(1, np.int64), payload.size, index)
        dec.decode(*one, r, r + 1, out)
        assert np.array_equal(out, full[r : r + 1])


def test_bad_payloads_and_arguments_are_refused_with_a_clear_error():
    codec, bound, x, payload = _chunk("noise", (4, 64))
    dec = codec.rows_decoder(x.shape, x.dtype, bound)
    with pytest.raises(ValueError, match="inconsistent"):
        dec.index(payload[:-3])
    with pytest.raises(ValueError, match="inconsistent"):
        dec.index(np.concatenate([payload, np.zeros(2, np.uint8)]))
    index = dec.index(payload)
    one = (payload.reshape(1, -1), np.zeros(1, np.int64), payload.size, index)
    with pytest.raises(ValueError, match="outside"):
        dec.decode(*one, 3, 5, np.empty((2, 64), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        dec.decode(*one, 0, 2, np.empty((2, 64), np.float64))


def test_codecs_that_cannot_decode_rows_say_so():
    bound = ErrorBound("abs", 1e-2).resolve(np.zeros(1))
    zstd = get_codec("block", abs=1e-2, entropy="zstd")
    assert zstd.rows_decoder((4, 8), np.float32, bound) is None
    assert get_codec("block", abs=1e-2).rows_decoder((4, 8), np.float16, bound) is None
    assert get_codec("sz", abs=1e-2).rows_decoder((4, 8), np.float32, bound) is None
