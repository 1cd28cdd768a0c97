"""The ``block`` decoder: what it relies on, and its values against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import float32, njit
from tensorpress.compress.kernels.rounding import (
    PREC_BFLOAT16,
    PREC_FLOAT16,
    round_via_float32,
)


@njit(cache=True)
def _rounded(x, prec, out):
    for i in range(x.size):
        out[i] = float32(round_via_float32(float(x[i]), prec))


def _hard_float32s() -> np.ndarray:
    """float32 values where a cast to 16 bits is easy to get wrong: exact ties and their
    neighbours at the float16 and bfloat16 cuts, subnormals of both, values near the
    overflow thresholds, zeros and infinities of both signs, and random bits."""
    rng = np.random.default_rng(7)
    hi = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    ties = [(hi & ~np.uint32(0x1FFF)) | 0x1000, (hi & ~np.uint32(0xFFFF)) | 0x8000]
    bits = np.concatenate([hi, *ties, *[t + 1 for t in ties], *[t - 1 for t in ties]])
    x = bits.view(np.float32)
    special = np.array(
        [65504, 65519.99, 65520, 65536, 3.4e38, 6e-8, 3e-8, 2.9e-8, 1e-40, 1e-45, 0.0, np.inf],
        np.float32,
    )
    x = np.concatenate([x, special, -special, np.exp2(np.arange(-149.0, 128.0)).astype(np.float32)])
    return x[np.isfinite(x) | np.isinf(x)]


def test_16bit_values_are_a_cast_of_their_float32_values():
    """The decoder writes 16-bit values as float32 and casts them: that must round as
    the encoder's check does (round_via_float32), ties to even, subnormals and overflow
    included."""
    x = _hard_float32s()
    via = np.empty_like(x)
    _rounded(x, PREC_FLOAT16, via)
    with np.errstate(over="ignore"):
        assert np.array_equal(
            via.astype(np.float16).view(np.uint16), x.astype(np.float16).view(np.uint16)
        )
    _rounded(x, PREC_BFLOAT16, via)
    as_bf16 = [torch.from_numpy(a).to(torch.bfloat16).view(torch.int16) for a in (via, x)]
    assert torch.equal(*as_bf16)


def _block_payload(codec, x: np.ndarray) -> tuple:
    bound = codec.require_bound().resolve(x)
    return codec.encode_chunk(x, bound), bound


@pytest.mark.parametrize(
    "dtype, params",
    [
        (np.float32, {"abs": 1e-3}),
        (np.float64, {"abs": 1e-6}),
        (np.float32, {"pw_rel": 1e-2}),
        (np.float32, {"abs": 1e-3, "entropy": "zstd"}),
        (np.float32, {"abs": 0.0}),  # stored raw
        (np.float16, {"abs": 1e-2}),
    ],
)
def test_chunk_decoder_writes_what_decode_writes(dtype, params):
    """The decoder made once per kind of chunk gives decode's bytes, into the caller's
    array, for every mode of payload."""
    from tensorpress.compress import get_codec

    codec = get_codec("block", **params)
    rng = np.random.default_rng(1)
    for seed in range(3):
        x = np.cumsum(np.random.default_rng(seed).normal(size=(3, 1000)), axis=1).astype(dtype)
        x[0, 5:9] = [np.nan, np.inf, -np.inf, 0.0]
        payload, bound = _block_payload(codec, x)
        decode = codec.chunk_decoder(x.shape, x.dtype, bound)
        out = np.asarray(rng.normal(size=x.shape), dtype)
        decode(payload, out)
        want = codec.decode_chunk(payload, x.shape, x.dtype, bound)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))


def test_chunk_decoder_refuses_an_inconsistent_payload():
    from tensorpress.compress import get_codec

    codec = get_codec("block", abs=1e-3)
    x = np.cumsum(np.random.default_rng(0).normal(size=4096)).astype(np.float32)
    payload, bound = _block_payload(codec, x)
    decode = codec.chunk_decoder(x.shape, x.dtype, bound)
    with pytest.raises(ValueError, match="inconsistent"):
        decode(payload[: len(payload) // 2], np.empty_like(x))
