"""``block`` with ``entropy="zstd"``: zstd over a chunk's packed blocks where it pays.

The payloads never outgrow the plain mode's, the values decoded are the plain mode's,
the arrays never take more bytes than quantize+zstd (int32 codes, zstd level 3), the
tensor path writes the same bytes, and damaged mode-3 payloads are refused.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import tensorpress as tp
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tensorpress.compress import compress_tensor, decompress_tensor, get_codec
from tensorpress.compress.bounds import ErrorBound
from tensorpress.formats import read_header

ENTROPY = {"id": "block", "entropy": "zstd"}
DATA = pathlib.Path(__file__).parent / "data"


def _payloads(blob) -> list[bytes]:
    h = read_header(blob)
    return [bytes(blob[o : o + n]) for o, n in zip(h.offsets, h.lengths, strict=True)]


def _quantize_zstd_bytes(x: np.ndarray, rel: float) -> int:
    """The naive baseline: rint(x / 2e) as int32, zstd level 3 (finite values only)."""
    x = x.astype(np.float64)
    finite = x[np.isfinite(x)]
    eb = rel * (finite.max() - finite.min())
    codes = np.rint(finite / (2 * eb)).astype(np.int32)
    return len(zstandard.ZstdCompressor(level=3).compress(codes.tobytes()))


def _activations() -> dict[str, np.ndarray]:
    """Skewed tensors like a ViT block's, and a few fields."""
    rng = np.random.default_rng(3)
    h = rng.standard_normal((256, 384))
    logits = rng.standard_normal((4, 64, 64)) * 2.5
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    walk = np.cumsum(np.cumsum(rng.standard_normal((300, 300)), 0), 1)
    return {
        "gelu": 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h**3))),
        "attention": attn,
        "layernorm": (h - h.mean(-1, keepdims=True)) / h.std(-1, keepdims=True) * 0.8 + 0.1,
        "relu": np.maximum(h, 0),
        "gaussian": h,
        "uniform": rng.random(100_000),
        "smooth": walk,
        "heavy_tailed": rng.standard_t(2, 100_000),
        "spikes": np.where(rng.random(100_000) < 1e-3, 1e3, rng.standard_normal(100_000)),
    }


ARRAYS = _activations()


@pytest.mark.parametrize("rel", [1e-2, 1e-3, 1e-4])
@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_never_more_bytes_than_quantize_zstd(name, rel):
    x = ARRAYS[name].astype(np.float32)
    blob = tp.compress(x, rel=rel, codec=ENTROPY)
    plain = tp.compress(x, rel=rel, codec="block")
    payload = sum(len(p) for p in _payloads(blob))
    assert payload <= _quantize_zstd_bytes(x, rel)
    # per chunk never more than the plain mode's payload; same values back
    for a, b in zip(_payloads(blob), _payloads(plain), strict=True):
        assert len(a) <= len(b)
    np.testing.assert_array_equal(tp.decompress(blob), tp.decompress(plain))


def test_skewed_activations_take_the_zstd_mode():
    x = ARRAYS["gelu"].astype(np.float32)
    blob = tp.compress(x, rel=1e-2, codec=ENTROPY)
    modes = {p[0] for p in _payloads(blob)}
    assert 3 in modes
    assert len(blob) < 0.9 * len(tp.compress(x, rel=1e-2, codec="block"))


finite_or_special = st.one_of(
    st.floats(-1e3, 1e3, width=16),
    st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 7.5]),
)


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        st.sampled_from([np.float16, np.float32, np.float64]),
        hnp.array_shapes(min_dims=1, max_dims=5, min_side=1, max_side=7),
        elements=finite_or_special,
    ),
    bound=st.sampled_from([("rel", 1e-2), ("abs", 0.3), ("pw_rel", 1e-2), ("abs", 0.0)]),
    chunk_bytes=st.sampled_from([64, 700, 1 << 20]),
)
def test_bound_and_specials_on_any_array(x, bound, chunk_bytes):
    mode, value = bound
    blob = tp.compress(x, codec=ENTROPY, chunk_bytes=chunk_bytes, **{mode: value})
    plain = tp.compress(x, codec="block", chunk_bytes=chunk_bytes, **{mode: value})
    y = tp.decompress(blob)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, tp.decompress(plain))
    assert len(blob) - len(plain) <= len(str(ENTROPY))  # the config in the header
    tol = tp.info(blob)["bound"]["tolerance"]
    finite = np.isfinite(x)
    err = np.abs(x[finite].astype(np.float64) - y[finite].astype(np.float64))
    limit = tol * np.abs(x[finite].astype(np.float64)) if mode == "pw_rel" else tol
    assert np.all(err <= limit)
    np.testing.assert_array_equal(y[~finite], x[~finite])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tensor_path_writes_the_same_bytes(dtype):
    x = torch.from_numpy(ARRAYS["gelu"][:64].astype(np.float32)).to(dtype)
    codec = get_codec(ENTROPY, rel=1e-2)
    ct = compress_tensor(x, codec, chunk_bytes=4096)
    plain = compress_tensor(x, get_codec("block", rel=1e-2), chunk_bytes=4096)
    assert 3 in {int(ct.payload[o]) for o in np.cumsum([0, *ct.lengths[:-1]])}
    assert ct.payload.numel() < plain.payload.numel()
    assert torch.equal(decompress_tensor(ct), decompress_tensor(plain))
    if dtype != torch.bfloat16:  # the numpy path writes the same chunk payloads
        blob = tp.compress(x.numpy(), codec=codec, chunk_bytes=4096)
        assert b"".join(_payloads(blob)) == ct.payload.numpy().tobytes()


def test_config_round_trips_and_the_default_is_unchanged():
    assert get_codec("block", rel=1e-2).get_config() == {"id": "block", "rel": 1e-2}
    codec = get_codec(ENTROPY, rel=1e-2)
    assert codec.get_config() == {"id": "block", "entropy": "zstd", "rel": 1e-2}
    assert get_codec(codec.get_config()) == codec
    with pytest.raises(ValueError, match="entropy"):
        get_codec({"id": "block", "entropy": "huffman"}, rel=1e-2)


def test_damaged_zstd_chunks_are_refused():
    codec = get_codec(ENTROPY, abs=1e-2)
    x = ARRAYS["gelu"][:32].astype(np.float32)
    bound = ErrorBound("abs", 1e-2).resolve(x)
    payload = codec.encode(x, bound)
    assert payload[0] == 3
    for bad in (payload[:-5], payload[:1], payload[:9] + bytes(len(payload) - 9)):
        with pytest.raises(ValueError):
            codec.decode(bad, x.shape, x.dtype, bound)


def test_golden_stream_is_still_written():
    """The mode-3 golden stream: this encoder writes its bytes, so every implementation
    that reads them reads what this one writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", DATA / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x, kw = {name: (x, kw) for name, x, kw in module.cases()}["block_entropy_f32"]
    blob = tp.compress(x, **kw)
    assert blob == (DATA / "v2" / "block_entropy_f32.tp").read_bytes()
    assert {p[0] for p in _payloads(blob)} >= {2, 3}


@pytest.mark.parametrize("rel", [1e-2, 1e-3])
@pytest.mark.parametrize("name", ["gelu", "gaussian", "uniform"])
def test_long_chunks_are_probed_and_still_never_lose(name, rel):
    """Chunks whose payloads are long enough to be probed (a sample decides the zstd
    level, or no zstd): still no more bytes than quantize+zstd or the plain mode, the
    same values back; packed uniform noise stays in the plain mode."""
    rng = np.random.default_rng(5)
    h = rng.standard_normal(1 << 20)
    x = {
        "gelu": 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h**3))),
        "gaussian": h,
        "uniform": rng.random(1 << 20),
    }[name].astype(np.float32)
    blob = tp.compress(x, rel=rel, codec=ENTROPY)
    plain = tp.compress(x, rel=rel, codec="block")
    assert max(len(p) for p in _payloads(plain)) >= 1 << 17  # long enough to be probed
    assert sum(len(p) for p in _payloads(blob)) <= _quantize_zstd_bytes(x, rel)
    for a, b in zip(_payloads(blob), _payloads(plain), strict=True):
        assert len(a) <= len(b)
    np.testing.assert_array_equal(tp.decompress(blob), tp.decompress(plain))
    if name == "uniform":
        assert {p[0] for p in _payloads(blob)} == {2}
