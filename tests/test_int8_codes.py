"""Tensors held as int8 codes under an absolute bound (activation_offload/codec.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression
from tensorpress.activation_offload.codec import (
    INT8_MIN_STEPS,
    INT8_MIN_STEPS_SPILLED,
    ActivationCodec,
    Int8Codes,
)
from tensorpress.activation_offload.records import Compressed
from tensorpress.activation_offload.stats import ActivationStats
from tensorpress.compress.block.codec import steps_for
from tensorpress.compress.tensor import ValueRange

_SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 1e30]


@settings(max_examples=80, deadline=None)
@given(
    shape=st.sampled_from([(), (1,), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 8)]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    spread=st.floats(0.01, 300.0),
    tol=st.floats(1e-3, 1.0),
    special=st.sampled_from([None, *_SPECIALS]),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_codes_restore_within_the_bound_or_are_not_made(
    shape, dtype, spread, tol, special, strided, seed
):
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=g, dtype=dtype) - 0.3) * spread
    if special is not None and t.numel():
        t.view(-1)[0] = special
    if strided and t.dim() >= 2:
        t = t.transpose(0, -1)  # not contiguous
    codes = Int8Codes.of(t, tol, ValueRange(t))
    lo, hi = ValueRange(t).ends
    step, inv = steps_for(tol)
    fits = (hi - lo) * inv >= INT8_MIN_STEPS and max(-lo, hi) * inv <= 126
    if codes is None:  # only where the codes cannot fit, or the bound fails
        assert not fits or not bool(torch.isfinite(t).all())
        return
    assert fits and codes.nbytes == t.numel() and codes.payload.dtype == torch.int8
    y = codes.restore()
    assert y.shape == t.shape and y.dtype == dtype
    assert bool(((y.double() - t.double()).abs() <= tol).all())
    want = (codes.payload.double() * codes.step).to(dtype).reshape(t.shape)
    assert torch.equal(y, want)  # q * step rounded to the dtype, as the block codec's


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_are_left_to_the_codec(dtype):
    t = torch.linspace(-3, 3, 1000).to(dtype)
    assert Int8Codes.of(t, 0.02, ValueRange(t)) is None


def test_a_layer_input_whose_codes_need_6_to_8_bits_is_held_in_one_byte_a_value(monkeypatch):
    """A linear layer's input spanning about 130 steps of the bound: int8 codes, restored
    within the bound (debug check), the same weight gradient as with the codec."""
    torch.manual_seed(0)
    layer = nn.Linear(256, 8)
    x = (torch.rand(64, 256) * 8 - 4).requires_grad_()  # range 8, step 0.06

    def weight_grad():
        ac = ActivationCompression(codec="block", abs=0.03, zstd=None, debug=True)
        with ac:
            out = layer(x)
        out.square().sum().backward()
        grad, layer.weight.grad = layer.weight.grad, None
        return grad, ac.stats.rows["(top)"].stored_bytes

    with_int8, held = weight_grad()
    assert held == x.numel()
    monkeypatch.setattr(Int8Codes, "of", staticmethod(lambda *args: None))
    with_codec, held = weight_grad()
    assert held != x.numel()  # (the codec: about 8 bits a value on these uniform values)
    assert torch.allclose(with_int8, with_codec, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nvme", [False, True])
def test_records_bound_for_a_stores_files_take_int8_codes_from_fewer_steps(tmp_path, nvme):
    """A tensor spanning about 45 steps: the codec in host memory and in a store without a
    file tier; int8 codes, parked in the store, where its records go to files. Either way
    the values restored are the ones the codec restores."""
    from tensorpress.activation_offload import TieredStore
    from tensorpress.compress import compress_tensor, decompress_tensor

    tol = 0.1
    step, inv = steps_for(tol)
    t = torch.rand(64, 256, generator=torch.Generator().manual_seed(1)) * 9 - 4.5
    steps = float(t.max() - t.min()) * inv
    assert INT8_MIN_STEPS_SPILLED <= steps < INT8_MIN_STEPS
    want = decompress_tensor(compress_tensor(t, "block", abs=tol))
    codec, stats = ActivationCodec("block", {}, zstd=None), ActivationStats()
    in_memory = Compressed(t, codec, "abs", tol, stats, "x", False, None, ValueRange(t))
    assert not isinstance(in_memory.payload, Int8Codes)
    with TieredStore(0 if nvme else 1 << 20, nvme_dir=tmp_path if nvme else None) as store:
        rec = Compressed(t, codec, "abs", tol, stats, "x", False, store, ValueRange(t))
        assert isinstance(rec.payload, Int8Codes) == nvme
        if nvme:
            store.wait(rec.handle)
            assert store.tier(rec.handle) == "nvme" and rec.payload.payload is None
            assert rec.nbytes == t.numel()  # one byte a value, in the store's file
        assert torch.equal(rec.restore(), want)
        assert bool(((rec.restore() - t).abs() <= tol).all())


def test_records_bound_for_files_take_int8_codes_where_zstd_does_not_pay(tmp_path, monkeypatch):
    """With the zstd stage on, a kind's first payload is the codec's, tried through zstd;
    while the stage skips the kind (zstd saved too little), int8 codes hold it, and
    after ``RETRY_AFTER`` of those the codec and zstd are tried again."""
    from tensorpress.activation_offload import TieredStore, zstd_stage

    monkeypatch.setattr(zstd_stage, "RETRY_AFTER", 3)
    tol = 0.1
    t = torch.rand(64, 256, generator=torch.Generator().manual_seed(2)) * 9 - 4.5  # noise
    codec, stats = ActivationCodec("block", {}, zstd=1), ActivationStats()
    kinds = []
    with TieredStore(0, nvme_dir=tmp_path) as store:
        for _ in range(6):
            rec = Compressed(t, codec, "abs", tol, stats, "x", False, store, ValueRange(t))
            kinds.append(isinstance(rec.payload, Int8Codes))
            assert bool(((rec.restore() - t).abs() <= tol).all())
    assert kinds == [False, True, True, True, False, True]
