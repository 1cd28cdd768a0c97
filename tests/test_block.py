"""The ``block`` codec: the error bound on every element, and the numba and torch
implementations writing the same bytes (and decoding each other's).

Inputs come from the same generator as the ``sz`` property tests (dtypes,
shapes 0-d to 5-d, empty and size-1 axes, layouts, NaN/±Inf/denormals/1e±30,
constants, bounds from 1e-12 to 1e300 and zero).
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager

import numpy as np
import pytest
import tensorpress as tp
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress import ErrorBound, compress_tensor, decompress_tensor, get_codec
from tensorpress.formats import FormatError, tensor_from_stream, tensor_to_stream
from test_bound_properties import FAST, assert_contract, cases, native_copy

BLOCK_CASES = cases().map(lambda c: c.__class__(**{**c.__dict__, "predictor": "auto"}))


def block_kwargs(case, x) -> dict:
    return {
        case.mode: case.bound_value(x),
        "codec": "block",
        "chunk_bytes": case.chunk_bytes,
        "workers": case.workers,
    }


@FAST
@given(case=BLOCK_CASES)
def test_bound_holds_on_every_element(case):
    x = case.array()
    blob = tp.compress(x, **block_kwargs(case, x))
    assert_contract(x, tp.decompress(blob), blob)


@contextmanager
def torch_ops_on_cpu():
    """CPU tensors through the torch ops (what CUDA tensors fall back to) instead of
    the numba kernels."""
    from tensorpress.compress.block import codec as block
    from tensorpress.compress.block.kernels import torch_codec as block_torch

    saved = block.HOST_KERNELS[0]
    block.HOST_KERNELS[0] = block_torch
    try:
        yield
    finally:
        block.HOST_KERNELS[0] = saved


@FAST
@given(case=BLOCK_CASES)
def test_torch_path_writes_the_same_bytes_and_values(case):
    x = native_copy(case.array())
    kw = block_kwargs(case, x)
    kw.pop("workers")
    blob = tp.compress(x, **kw)
    ct = compress_tensor(torch.from_numpy(x), **kw)
    assert tensor_to_stream(ct) == blob
    with torch_ops_on_cpu():
        ct_ops = compress_tensor(torch.from_numpy(x), **kw)
        assert tensor_to_stream(ct_ops) == blob
        y_torch = decompress_tensor(ct)
    y_host = decompress_tensor(ct_ops)
    assert torch.equal(y_host.reshape(-1).view(torch.uint8), y_torch.reshape(-1).view(torch.uint8))
    y_numba = tp.decompress(blob)
    assert y_torch.shape == x.shape and y_torch.dtype == torch.from_numpy(x).dtype
    assert np.array_equal(
        y_torch.numpy().reshape(-1).view(np.uint8), y_numba.reshape(-1).view(np.uint8)
    )
    # either implementation decodes the other's stream
    back = decompress_tensor(tensor_from_stream(blob)).reshape(-1).view(torch.uint8)
    assert torch.equal(back, y_torch.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("delta", [False, True])
def test_every_bit_width_packs_as_the_torch_ops_do(dtype, delta):
    """Blocks of every code width, 1 to 29 bits (the numba packer has one path up to 8
    bits, one up to 16 and one above), written byte for byte as the torch ops write
    them and decoded back within the bound."""
    rng = np.random.default_rng(5)
    widths = range(1, 24 if dtype == np.float32 else 30)
    codes = []
    for w in widths:  # three blocks a width, with the top bit of the width used
        c = (
            rng.integers(-(2 ** (w - 1)), 2 ** (w - 1), 3 * 64) // 2
            if w > 1
            else rng.integers(0, 2, 192)
        )
        c[::37] = -(2 ** (w - 1)) // 2 if w > 1 else 1
        codes.append(np.cumsum(c) if delta else c)
    x = (np.concatenate(codes) * 2.0).astype(dtype)[:-5]  # a short last block too
    blob = tp.compress(x, abs=1.0, codec="block")
    with torch_ops_on_cpu():
        assert (
            tensor_to_stream(compress_tensor(torch.from_numpy(x), abs=1.0, codec="block")) == blob
        )
    assert np.max(np.abs(tp.decompress(blob) - x)) <= 1.0


@pytest.mark.parametrize("mode", ["rel", "abs", "pw_rel"])
def test_bfloat16_tensors_keep_the_bound(mode):
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(70, 33, generator=g) * 100).to(torch.bfloat16)
    t[3, 4], t[5, 6], t[7, 8] = math.nan, math.inf, 0.0
    ct = compress_tensor(t, **{mode: 1e-2})
    y = decompress_tensor(ct)
    assert y.dtype == torch.bfloat16 and y.shape == t.shape
    x64, y64 = t.double(), y.double()
    fin = torch.isfinite(x64)
    assert torch.equal(torch.isnan(x64), torch.isnan(y64))
    assert torch.equal(x64[torch.isinf(x64)], y64[torch.isinf(x64)])
    err = (x64 - y64).abs()[fin]
    lim = ct.bound.tolerance * (x64.abs()[fin] if mode == "pw_rel" else 1.0)
    assert bool((err <= lim).all())


def test_non_contiguous_tensor_and_moves():
    t = torch.randn(16, 9, 5).transpose(0, 2)[:, ::2]
    ct = compress_tensor(t, rel=1e-3)
    y = decompress_tensor(ct)
    assert y.shape == t.shape and y.is_contiguous()
    assert float((y - t).abs().max()) <= ct.bound.tolerance
    assert ct.to("cpu").payload.device.type == "cpu" and ct.nbytes == ct.payload.numel()
    assert tensor_to_stream(ct) == tp.compress(t.contiguous().numpy(), codec="block", rel=1e-3)


def test_to_stream_names_the_layout_a_reader_hands_back():
    """``tensor_to_stream(ct, "F")`` is ``tp.compress`` of the same values in Fortran order: the
    reader hands back an F-ordered array; a layout other than C or F is refused."""
    a = np.asfortranarray(np.random.default_rng(3).standard_normal((7, 5)).astype(np.float32))
    ct = compress_tensor(torch.from_numpy(np.ascontiguousarray(a)), rel=1e-3)
    assert tensor_to_stream(ct) == tensor_to_stream(ct, "C")
    blob = tensor_to_stream(ct, "F")
    assert blob == tp.compress(a, codec="block", rel=1e-3)
    back = tp.decompress(blob)
    assert back.flags.f_contiguous and np.abs(back - a).max() <= ct.bound.tolerance
    with pytest.raises(ValueError, match="'C' or 'F'"):
        tensor_to_stream(ct, "K")


def test_constant_and_zero_blocks_cost_next_to_nothing():
    zeros, const = np.zeros(1 << 20, np.float32), np.full(1 << 20, 3.25, np.float32)
    for x, bound in ((zeros, {"rel": 1e-3}), (const, {"abs": 1e-3}), (zeros, {"abs": 0})):
        blob = tp.compress(x, codec="block", **bound)
        assert len(blob) < x.nbytes / 200
        assert np.abs(tp.decompress(blob) - x).max() <= tp.info(blob)["bound"]["tolerance"]


def test_nan_filled_regions_are_cheap():
    x = np.full(1 << 16, np.nan, np.float32)
    x[:100] = np.linspace(0, 1, 100)
    blob = tp.compress(x, codec="block", rel=1e-3)
    assert len(blob) < x.nbytes / 30
    y = tp.decompress(blob)
    assert np.array_equal(np.isnan(y), np.isnan(x))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_corrupted_payloads_raise(dtype):
    codec = get_codec("block")
    rng = np.random.default_rng(5)
    x = np.cumsum(rng.standard_normal(1000)).astype(dtype)
    bound = ErrorBound("rel", 1e-3).resolve(x)
    payload = codec.encode(x, bound)
    for bad in (payload[:-1], payload + b"\0", payload[:1], b""):
        with pytest.raises(ValueError):
            codec.decode(bad, x.shape, x.dtype, bound)
        with pytest.raises(ValueError):
            codec.decode_tensor(
                torch.frombuffer(bytearray(bad or b"\0"), dtype=torch.uint8)[: len(bad)],
                [len(bad)],
                x.shape,
                torch.from_numpy(x).dtype,
                bound,
                x.shape[0],
            )
    wide = bytearray(payload)
    wide[1] = 30  # a block header claiming 30-bit codes: the lengths no longer add up
    with pytest.raises(ValueError):
        codec.decode(bytes(wide), x.shape, x.dtype, bound)


def test_corrupted_stream_raises_format_error():
    blob = bytearray(tp.compress(np.arange(5000, dtype=np.float32), codec="block", abs=0.1))
    blob[-3] ^= 0x40
    with pytest.raises(FormatError):
        tp.decompress(bytes(blob))
    with pytest.raises(FormatError):
        tensor_from_stream(bytes(blob))


def test_tensor_api_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="no torch path"):
        compress_tensor(torch.randn(10), codec="sz", rel=1e-3)
    with pytest.raises(TypeError, match="float16, bfloat16"):
        compress_tensor(torch.arange(10), rel=1e-3)
    with pytest.raises(ValueError, match="exactly one error bound"):
        compress_tensor(torch.randn(10))


@given(st.integers(1, 300), st.integers(1, 5))
@FAST
def test_multi_chunk_layouts_match(n, rows_per_chunk):
    x = np.random.default_rng(n).standard_normal((n, 7)).astype(np.float32)
    chunk_bytes = rows_per_chunk * 7 * 4
    blob = tp.compress(x, codec="block", rel=1e-2, chunk_bytes=chunk_bytes)
    assert (
        tensor_to_stream(compress_tensor(torch.from_numpy(x), rel=1e-2, chunk_bytes=chunk_bytes))
        == blob
    )


@pytest.mark.parametrize("mode", ["rel", "pw_rel"])
def test_bfloat16_kernels_write_the_torch_bytes(mode):
    """numpy has no bfloat16: the numba kernels take float32 values and the bf16 bytes."""
    from tensorpress.compress.block.codec import encode_values
    from tensorpress.compress.kernels.rounding import PREC_BFLOAT16

    g = torch.Generator().manual_seed(1)
    t = (torch.randn(300, 7, generator=g) * 10).to(torch.bfloat16)
    t[0, 0], t[5, 5] = math.nan, -math.inf
    ct = compress_tensor(t, chunk_bytes=700, **{mode: 1e-2})
    with torch_ops_on_cpu():
        ct_ops = compress_tensor(t, chunk_bytes=700, **{mode: 1e-2})
        y_ops = decompress_tensor(ct)
    assert torch.equal(ct.payload, ct_ops.payload) and ct.lengths == ct_ops.lengths
    assert torch.equal(decompress_tensor(ct).view(torch.int16), y_ops.view(torch.int16))
    got, pos = bytes(ct.payload.numpy()), 0
    rows = ct.chunk_rows
    for i, length in enumerate(ct.lengths):
        chunk = t[i * rows : (i + 1) * rows].reshape(-1)
        raw = chunk.view(torch.int16).numpy().view(np.uint8)
        want = encode_values(chunk.float().numpy(), raw, PREC_BFLOAT16, ct.bound)
        assert got[pos : pos + length] == want
        pos += length
    assert pos == len(got) and len(ct.lengths) > 1


def test_cuda_kernels_fall_back_to_torch_ops(monkeypatch):
    """Where the CUDA kernels cannot run, the torch ops write the same bytes (one warning)."""
    from tensorpress.compress.block import codec as block

    class Broken:  # what a numba without a working CUDA target does at the first call
        def encode(*args):
            raise RuntimeError("CUDA driver not found")

    class OnCuda(torch.Tensor):  # host memory that takes the CUDA tensors' path
        is_cuda = property(lambda self: True)

    monkeypatch.setattr(block, "CUDA_KERNELS", [Broken])
    x = torch.randn(500, 7, generator=torch.Generator().manual_seed(2))
    codec, bound = get_codec("block"), ErrorBound("abs", 1e-2).resolve(None)
    want = codec.encode_tensor(x, bound, 100)
    with pytest.warns(RuntimeWarning, match="torch tensor ops instead"):
        got = codec.encode_tensor(x.as_subclass(OnCuda), bound, 100)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    assert block.CUDA_KERNELS == [None]
    with warnings.catch_warnings():  # given up once: not retried, no second warning
        warnings.simplefilter("error")
        payload = got[0].as_subclass(OnCuda)
        again = codec.decode_tensor(payload, got[1], x.shape, x.dtype, bound, 100)
    assert torch.equal(again, codec.decode_tensor(*want, x.shape, x.dtype, bound, 100))


def test_last_marked_is_the_running_max_of_marked_positions():
    from tensorpress.compress.block.kernels.torch_codec import last_marked

    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 1000):
        mark = torch.from_numpy(rng.random(n) < 0.2)
        mark[0] = True
        idx = torch.arange(n)
        want = torch.cummax(torch.where(mark, idx, -1), 0).values
        assert torch.equal(last_marked(mark), want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_loose_pw_rel_near_the_largest_value_stays_finite(dtype):
    """Under pw_rel 10, tol * |x| overflows to inf near the dtype's largest value, so
    every code would pass the bound check: a reconstruction that overflows must not."""
    big = np.finfo(dtype).max
    # blocks of large values only: a block's step follows its smallest value
    x = np.repeat(np.array([-0.97, 0.97, 1.0, -1.0], dtype) * big, 64)
    x = np.concatenate([x, np.array([1.0, -2.5], dtype)])
    blob = tp.compress(x, codec="block", pw_rel=10.0)
    y = tp.decompress(blob)
    assert np.isfinite(y).all() and (np.sign(y) == np.sign(x)).all()
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert (np.abs(y64 - x64) / np.abs(x64) <= 10.0).all()  # no overflow in the check
    with torch_ops_on_cpu():
        assert (
            tensor_to_stream(compress_tensor(torch.from_numpy(x), codec="block", pw_rel=10.0))
            == blob
        )
