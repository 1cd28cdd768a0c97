"""The ``int8`` codec: one byte a value within an abs or rel bound, raw where codes do
not fit, and the same values ``block`` restores."""

from __future__ import annotations

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from tensorpress.formats import read_header
from test_block import block_kwargs
from test_bound_properties import FAST, assert_contract, cases

INT8_CASES = cases().filter(lambda c: c.dtype != "float16" and c.mode != "pw_rel")


def int8_kwargs(case, x) -> dict:
    return {**block_kwargs(case, x), "codec": "int8"}


@FAST
@given(case=INT8_CASES)
def test_bound_holds_on_every_element(case):
    x = case.array()
    blob = tp.compress(x, **int8_kwargs(case, x))
    lengths = read_header(blob).lengths
    assert sum(lengths) <= x.nbytes + len(lengths)  # never more than raw and a mode byte
    assert_contract(x, tp.decompress(blob), blob)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_codes_take_one_byte_a_value_and_restore_blocks_values(dtype):
    x = np.random.default_rng(3).uniform(-1, 1, (64, 100)).astype(dtype)  # 100 steps
    blob = tp.compress(x, codec="int8", abs=0.01)
    info = tp.info(blob)
    assert info["compressed_bytes"] - x.size < 400  # header, index and a mode byte a chunk
    y = tp.decompress(blob)
    assert np.abs(y.astype(np.float64) - x).max() <= 0.01
    assert np.array_equal(y, tp.decompress(tp.compress(x, codec="block", abs=0.01)))


@pytest.mark.parametrize(
    "x",
    [
        np.linspace(-5, 5, 1000, dtype=np.float32),  # 500 steps: codes past 127
        np.array([0.0, np.nan, 1.0], np.float32),
        np.array([np.inf, -1.0, 1.0], np.float64),
    ],
)
def test_values_without_a_code_are_stored_exactly(x):
    blob = tp.compress(x, codec="int8", abs=0.01)
    assert tp.info(blob)["compressed_bytes"] > x.nbytes  # raw
    assert np.array_equal(tp.decompress(blob), x, equal_nan=True)


def test_zero_bound_and_zeros():
    x = np.array([0.0, -0.0, 1.5], np.float32)
    y = tp.decompress(tp.compress(x, codec="int8", abs=0.0))
    assert np.array_equal(y.view(np.uint32), x.view(np.uint32))  # raw: the sign of zero kept
    z = np.zeros(50, np.float64)
    assert np.array_equal(tp.decompress(tp.compress(z, codec="int8", abs=1e-3)), z)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: tp.compress(np.ones(4), codec="int8", pw_rel=0.1), ValueError, "abs or rel"),
        (lambda: tp.compress(np.ones(4, np.float16), codec="int8", abs=0.1), TypeError, "int8"),
    ],
)
def test_refusals_say_what_to_do(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_corrupted_payload_raises():
    from tensorpress.compress import get_codec
    from tensorpress.compress.bounds import ErrorBound

    codec = get_codec("int8")
    bound = ErrorBound("abs", 0.1, 0.1)
    payload = codec.encode(np.linspace(-1, 1, 20), bound)
    assert payload[0] == 2  # codes
    for bad in (payload[:-1], payload + b"\0", bytes([9]) + payload[1:], b""):
        with pytest.raises(ValueError, match="int8"):
            codec.decode(bad, (20,), np.float64, bound)
    with pytest.raises(ValueError, match="zero tolerance"):
        codec.decode(payload, (20,), np.float64, ErrorBound("abs", 0.0, 0.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tol", [1e-3, 0.37, 2.0**-99, 1e-35])
def test_unchecked_codes_are_the_checked_ones(dtype, tol):
    """Where every code fits the proof (``check_free_codes``), the kernel skips the
    per-value check: its codes must be the checked rule's, and None where a code passes
    ±127 or a value is not finite."""
    from tensorpress.compress.block import int8_decode, int8_encode, steps_for

    step, inv = steps_for(tol)
    rng = np.random.default_rng(7)
    x = (rng.uniform(-127.45, 127.45, 50_000) * step).astype(dtype)
    x[:4] = np.array([126.5, -126.5, 127.45, -127.45]) * step  # ties and the edges
    t = np.rint(x.astype(np.float64) * inv)
    r = (t * step).astype(dtype).astype(np.float64)
    assert ((np.abs(t) <= 127) & (np.abs(r - x) <= tol)).all()  # the checked rule holds
    codes = int8_encode(x, tol)
    assert codes is not None and np.array_equal(codes, t.astype(np.int8))
    y = int8_decode(codes, tol, np.empty_like(x))
    assert np.abs(y.astype(np.float64) - x.astype(np.float64)).max() <= tol
    for bad in (np.nan, np.inf, 128.0 * step):
        z = x.copy()
        z[123] = bad
        assert int8_encode(z, tol) is None
