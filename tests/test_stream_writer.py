"""Streams of codecs that write payloads into the writer's buffer (``writes_into``).

``encode_array`` writes the payloads of a ``block`` stream straight into one buffer;
the stream must be, byte for byte, the one assembled from the payloads that
``codec.encode`` returns chunk by chunk, whatever the threads, the chunking, the dtype,
the layout or byte order of the input, and whether it is writable.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.compress import get_codec
from tensorpress.compress.codec import chunk_rows_for
from tensorpress.formats import read_header
from tensorpress.formats.stream_header import stream_dtype
from tensorpress.formats.stream_writer import encode_array, write_stream


def _chunked_stream(x: np.ndarray, codec, bound, chunk_bytes: int) -> bytes:
    """The stream assembled from ``codec.encode`` of each chunk: the reference."""
    x = np.array(x, dtype=x.dtype.newbyteorder("="), order="C")  # 0-d stays 0-d
    rows = chunk_rows_for(x.shape, x.itemsize, chunk_bytes)
    if x.ndim == 0:
        parts = [x]
    else:
        parts = [x[a : a + rows] for a in range(0, x.shape[0], rows)] if x.size else []
    payloads = [codec.encode(p, bound) for p in parts]
    head = (stream_dtype(x.dtype), x.shape, "C", codec.stream_config(), bound, rows)
    return write_stream(*head, payloads)


def _values(seed: int, shape: tuple, dtype) -> np.ndarray:
    """Smooth stretches, noise, runs of zeros and special values: every chunk mode."""
    g = np.random.default_rng(seed)
    n = math.prod(shape)
    x = np.cumsum(g.standard_normal(n)) * 0.05 + 0.1
    x[g.random(n) < 0.2] = 0.0
    x[n // 3 : n // 3 + 70] = g.standard_normal(min(70, n - n // 3)) * 1e4  # raw blocks
    if n > 10:
        x[[1, 5, 9]] = [np.nan, np.inf, -np.inf]
    return x.astype(dtype).reshape(shape)


@pytest.mark.parametrize("entropy", ["none", "zstd"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "dtype, shape",
    [
        (np.float32, (37, 129)),
        (np.float64, (5, 3, 200)),
        (np.float16, (4000,)),
        (np.float32, ()),
        (np.float32, (0, 8)),
        (np.float32, (1,)),
    ],
)
def test_stream_equals_the_one_of_encoded_chunks(entropy, workers, dtype, shape):
    codec = get_codec({"id": "block", "entropy": entropy}, abs=1e-2)
    x = _values(3, shape, dtype)
    bound = codec.resolve_bound(x)
    for chunk_bytes in (1 << 20, 2048):
        got = encode_array(x, codec, bound, chunk_bytes=chunk_bytes, workers=workers)
        assert got == _chunked_stream(x, codec, bound, chunk_bytes)
        back = tp.decompress(got)
        finite = np.isfinite(x)
        assert np.array_equal(np.isnan(back), np.isnan(x))
        assert np.array_equal(back[~finite & ~np.isnan(x)], x[~finite & ~np.isnan(x)])
        err = np.abs(back[finite].astype(np.float64) - x[finite].astype(np.float64))
        assert np.all(err <= bound.tolerance)


def test_big_endian_read_only_and_fortran_inputs_give_the_native_stream():
    codec = get_codec("block", abs=1e-3)
    x = _values(7, (300, 70), np.float32)
    bound = codec.resolve_bound(x)
    want = encode_array(x, codec, bound, chunk_bytes=4096, workers=2)
    swapped = x.astype(">f4")
    frozen = x.copy()
    frozen.flags.writeable = False
    for y in (swapped, frozen, np.asfortranarray(x)):
        assert encode_array(y, codec, bound, chunk_bytes=4096, workers=2) == want


def test_many_chunks_on_threads_each_in_its_place():
    """Chunks of very different sizes (raw, blocks, mode 3) land in order."""
    codec = get_codec({"id": "block", "entropy": "zstd"}, abs=1e-3)
    g = np.random.default_rng(11)
    rows = [np.zeros(256), np.linspace(0, 1, 256), g.standard_normal(256) * 1e9]
    x = np.stack([rows[i % 3] for i in range(90)]).astype(np.float32)
    bound = codec.resolve_bound(x)
    blob = encode_array(x, codec, bound, chunk_bytes=1024, workers=2)
    assert blob == _chunked_stream(x, codec, bound, 1024)
    assert len(set(read_header(blob).lengths)) >= 3
    assert np.array_equal(tp.decompress(blob)[::3], x[::3])
