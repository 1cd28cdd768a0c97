"""The lossless zstd stage for activation payloads in host memory."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression, TieredStore, zstd_stage
from tensorpress.activation_offload.zstd_stage import Squeezed, ZstdStage, squeeze, unsqueeze
from tensorpress.compress import compress_tensor, decompress_tensor


def _repetitive(rows: int = 512, width: int = 256) -> torch.Tensor:
    """Rows drawn from 16 distinct ones, as a token's activations repeat."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(16, width, generator=g)
    return table[torch.randint(0, 16, (rows,), generator=g)]


def _with_payload(payload: torch.Tensor):
    return replace(compress_tensor(torch.zeros(4), abs=0.1), payload=payload)


def test_round_trip_restores_every_payload_byte(monkeypatch):
    monkeypatch.setattr(zstd_stage, "PIECE_BYTES", 4096)
    x = _repetitive()
    ct = compress_tensor(x, "block", abs=1e-2)
    sq = squeeze(ct, 1)
    assert isinstance(sq, Squeezed) and sq.inner.payload is None
    assert len(sq.sizes) == -(-ct.nbytes // 4096) > 2
    assert sq.nbytes == sum(sq.sizes) < 0.8 * ct.nbytes
    back = unsqueeze(sq)
    assert torch.equal(back.payload, ct.payload) and back.lengths == ct.lengths
    assert torch.equal(decompress_tensor(back), decompress_tensor(ct))


def test_pieces_zstd_cannot_shrink_are_held_as_they_are(monkeypatch):
    monkeypatch.setattr(zstd_stage, "PIECE_BYTES", 1000)
    g = torch.Generator().manual_seed(1)
    noise = torch.randint(0, 256, (3000,), dtype=torch.uint8, generator=g)
    payload = torch.cat([noise[:1500], torch.zeros(1500, dtype=torch.uint8)])
    sq = squeeze(_with_payload(payload), 1)
    assert sq.raw_sizes == (1000, 1000, 1000)
    assert sq.sizes[0] == 1000 and sq.sizes[2] < 100  # noise as is; zeros squeezed
    assert torch.equal(unsqueeze(sq).payload, payload)
    assert squeeze(_with_payload(noise), 1).payload is noise  # nothing shrinks: unchanged


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.tuples(st.binary(min_size=1, max_size=300), st.integers(1, 40)), max_size=8),
    piece=st.integers(16, 4096),
)
def test_any_payload_round_trips(parts, piece):
    """Runs of repeated and random bytes, cut into pieces of any size: every byte back."""
    raw = b"".join(chunk * times for chunk, times in parts)
    payload = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.zeros(0, dtype=torch.uint8)
    )
    old, zstd_stage.PIECE_BYTES = zstd_stage.PIECE_BYTES, piece
    try:
        sq = squeeze(_with_payload(payload), 1)
    finally:
        zstd_stage.PIECE_BYTES = old
    assert sq.nbytes <= len(raw)
    assert bytes(unsqueeze(sq).payload.numpy()) == raw


@pytest.mark.parametrize("n", [1, 8, 13, 14, 15, 16, 17, 24, 40])
def test_tiny_payloads_round_trip(n):
    payload = torch.zeros(n, dtype=torch.uint8)
    sq = squeeze(_with_payload(payload), 1)
    assert sq.nbytes < n or sq.payload is payload
    assert torch.equal(unsqueeze(sq).payload, payload)


def test_empty_and_device_payloads_are_left_alone():
    empty = _with_payload(torch.zeros(0, dtype=torch.uint8))
    assert squeeze(empty, 1) is empty
    elsewhere = _with_payload(torch.zeros(1 << 16, dtype=torch.uint8, device="meta"))
    assert squeeze(elsewhere, 1) is elsewhere
    assert unsqueeze(elsewhere) is elsewhere


def test_the_stage_skips_kinds_zstd_does_not_pay_for_and_tries_them_again(monkeypatch):
    monkeypatch.setattr(zstd_stage, "RETRY_AFTER", 3)
    g = torch.Generator().manual_seed(2)
    noise = _with_payload(torch.randint(0, 256, (1 << 14,), dtype=torch.uint8, generator=g))
    zeros = _with_payload(torch.zeros(1 << 14, dtype=torch.uint8))
    half = torch.cat([noise.payload[: 1 << 13], torch.zeros(1 << 13, dtype=torch.uint8)])
    tried = []
    real = zstd_stage.squeeze
    monkeypatch.setattr(zstd_stage, "squeeze", lambda ct, lv: tried.append(ct) or real(ct, lv))
    stage = ZstdStage(1)
    for _ in range(9):
        assert stage.squeeze(noise, "noise") is noise
        assert isinstance(stage.squeeze(zeros, "zeros"), Squeezed)
    assert sum(ct is noise for ct in tried) == 3  # calls 1, 5 and 9: 3 skips after each
    assert sum(ct is zeros for ct in tried) == 9
    tried.clear()
    halves = [stage.squeeze(_with_payload(half), "noise") for _ in range(5)]
    assert [isinstance(h, Squeezed) for h in halves] == [False] * 3 + [True] * 2
    assert len(tried) == 2  # tried after 3 skips: it saves 1/2, so it stays on


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_payload_raises(damage):
    payload = (torch.arange(1 << 16) % 7).to(torch.uint8)
    sq = squeeze(_with_payload(payload), 1)
    held = sq.payload.clone()
    if damage == "flip":
        held[len(held) // 2] ^= 0x10
    else:
        held = held[:-1]
    with pytest.raises(ValueError, match="zstd stage"):
        unsqueeze(replace(sq, payload=held))


@pytest.mark.parametrize("tier", [None, "cpu", "nvme"])
def test_activation_compression_holds_fewer_bytes_and_the_same_gradients(tier, tmp_path):
    """zstd is lossless: the same gradients, from memory and through each store tier."""
    x = _repetitive(2048, 128)
    model = nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 128))
    grads, stored = {}, {}
    for zstd in (None, 1):
        model.zero_grad()
        with contextlib.ExitStack() as stack:
            kw = {}
            if tier is not None:
                cpu_bytes = 1 << 30 if tier == "cpu" else 0
                kw = {"offload": stack.enter_context(TieredStore(cpu_bytes, nvme_dir=tmp_path))}
            ac = ActivationCompression(codec="block", rel=1e-2, zstd=zstd, debug=True, **kw)
            with ac:
                loss = model(x).square().mean()
            stored[zstd] = ac.stats.stored_bytes
            loss.backward()
        grads[zstd] = [p.grad.clone() for p in model.parameters()]
    assert stored[1] < 0.75 * stored[None]
    assert all(torch.equal(a, b) for a, b in zip(grads[None], grads[1], strict=True))


@pytest.mark.parametrize("level", [23, 1.5, "1"])
def test_a_bad_level_says_what_to_do(level):
    with pytest.raises(ValueError, match="zstd level must be an integer"):
        ActivationCompression(codec="block", rel=1e-2, zstd=level)
