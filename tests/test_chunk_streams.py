"""One-chunk streams decoded straight into the caller's array (formats/chunk_streams.py):
the values ContainerReader gives, each stream checked, the rest left to the reader."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.formats.chunk_streams import OneChunkStreams
from tensorpress.formats.errors import FormatError
from tensorpress.formats.stream_reader import ContainerReader
from tensorpress.formats.zarr_codecs import Block

BOUND = 1e-3


def _data(seed: int, shape=(2, 4096), dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.normal(size=shape), axis=-1).astype(dtype)


def _stream(x: np.ndarray, codec="block", **params) -> bytes:
    params = {"abs": BOUND, **params}
    return tp.compress(x, codec=codec, chunk_bytes=x.nbytes, workers=1, **params)


class _Counting:
    """An ``open_reader`` that counts its calls."""

    def __init__(self, check=None):
        self.calls, self.check = 0, check

    def __call__(self, data) -> ContainerReader:
        self.calls += 1
        reader = ContainerReader(data, workers=1)
        if self.check is not None:
            self.check(reader)
        return reader


CASES = {
    "block": ({}, np.float32),
    "block f64": ({}, np.float64),
    "block zstd": ({"entropy": "zstd"}, np.float32),
    "block pw_rel": ({"abs": None, "pw_rel": 1e-2}, np.float32),
    "block f16": ({"abs": 1e-2}, np.float16),
    "sz": ({}, np.float32),
}


@pytest.mark.parametrize("case", CASES)
def test_streams_alike_decode_as_the_reader_does(case):
    """Several streams with one head: each decoded as ContainerReader decodes it, every
    element within the bound, the head worked out once."""
    params, dtype = CASES[case]
    codec = case.split()[0]
    opener, streams = _Counting(), None
    streams = OneChunkStreams(opener)
    for seed in range(4):
        x = _data(seed, dtype=dtype)
        blob = _stream(x, codec, **params)
        out = np.full(x.shape, np.nan, dtype)
        assert streams.decode_into(blob, out)
        want = ContainerReader(blob, workers=1).read()
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
        err = np.abs(out.astype(np.float64) - x.astype(np.float64))
        if "pw_rel" in params:
            assert (err <= params["pw_rel"] * np.abs(x.astype(np.float64))).all()
        else:
            assert (err <= params.get("abs", BOUND)).all()
    assert opener.calls == 1 and len(streams._plans) == 1


def test_raw_blocks_decode():
    """Noise at a bound of 0 is stored raw: the values come back bit for bit."""
    x = np.random.default_rng(3).normal(size=(1, 5000)).astype(np.float32)
    blob = _stream(x, abs=0.0)
    out = np.empty_like(x)
    assert OneChunkStreams(_Counting()).decode_into(blob, out)
    assert np.array_equal(out.view(np.uint32), x.view(np.uint32))


def test_missing_cells_and_valid_range_as_the_serializer_reads():
    """A zarr chunk with missing cells and a valid range: the markers' bits restored and
    the values clamped, as the serializer's reader does."""
    x = np.clip(_data(5) / 40 + 0.5, 0, 1)
    x[0, :5] = -999.0
    x[1, 7] = 1.0
    codec = Block(abs=0.05, missing=[-999.0], valid_range=[0, 1])
    blob = np.frombuffer(codec.encode_chunk(x), np.uint8)
    out = np.empty_like(x)
    assert OneChunkStreams(codec.reader).decode_into(blob, out)
    assert np.array_equal(out.view(np.uint32), codec.reader(blob).read().view(np.uint32))
    assert (out[0, :5] == -999.0).all()
    inside = x != -999.0
    assert (out[inside] >= 0).all() and (out[inside] <= 1).all()
    assert (np.abs(out[inside].astype(np.float64) - x[inside]) <= 0.05).all()


def _damaged(blob: bytes) -> dict[str, bytes]:
    b = bytearray(blob)
    payload = bytearray(b)
    payload[-10] ^= 0x40
    n = len(blob)
    h = ContainerReader(blob, workers=1).header
    index = bytearray(b)
    index[h.payload_offset - 8] ^= 1  # a byte of the chunk index
    return {
        "payload": bytes(payload),
        "index": bytes(index),
        "trailing": blob + b"\0",
        "truncated": blob[: n - 3],
        "preamble": blob[:10],
    }


@pytest.mark.parametrize("how", ["payload", "index", "trailing", "truncated", "preamble"])
def test_a_damaged_stream_is_left_to_the_reader(how):
    """A stream with a known head that fails a check is not decoded here (False), and
    the reader says what is wrong."""
    x = _data(0)
    streams = OneChunkStreams(_Counting())
    assert streams.decode_into(_stream(x), np.empty_like(x))  # the head is known now
    bad = _damaged(_stream(_data(1)))[how]
    assert not streams.decode_into(bad, np.empty_like(x))
    with pytest.raises(FormatError):
        ContainerReader(bad, workers=1).read()


def test_refused_streams_are_never_decoded_nor_kept():
    """The caller's check runs for every stream it refuses: nothing is remembered."""

    def refuse(reader):
        raise FormatError("not this dataset's chunk")

    opener = _Counting(refuse)
    streams = OneChunkStreams(opener)
    x = _data(0)
    for _ in range(3):
        out = np.zeros_like(x)
        assert not streams.decode_into(_stream(x), out)
        assert not out.any()
    assert opener.calls == 3 and not streams._plans


def test_what_does_not_apply_is_left_to_the_reader():
    """Several chunks, another shape or dtype of ``out``, ``out`` not contiguous."""
    x = _data(0, shape=(4, 4096))
    streams = OneChunkStreams(_Counting())
    several = tp.compress(x, codec="block", abs=BOUND, chunk_bytes=x.nbytes // 2, workers=1)
    assert not streams.decode_into(several, np.empty_like(x))
    blob = _stream(x)
    assert not streams.decode_into(blob, np.empty((4, 4095), np.float32))
    assert not streams.decode_into(blob, np.empty(x.shape, np.float64))
    assert not streams.decode_into(blob, np.empty((4, 8192), np.float32)[:, ::2])
    assert streams.decode_into(blob, np.empty_like(x))


def test_threads_share_one():
    """Threads decoding streams alike at once each get their own stream's values."""
    xs = [_data(s) for s in range(8)]
    blobs = [_stream(x) for x in xs]
    want = [ContainerReader(b, workers=1).read() for b in blobs]
    streams, bad = OneChunkStreams(_Counting()), []

    def run(t: int) -> None:
        out = np.empty_like(xs[0])
        for k in range(40):
            i = (t + k) % len(blobs)
            if not streams.decode_into(blobs[i], out) or not np.array_equal(out, want[i]):
                bad.append((t, i))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not bad
