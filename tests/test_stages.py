"""Bytes-to-bytes stages after a codec: the pipeline round-trips, its config is part of
the codec's identity, and a stream with stages never decodes to wrong numbers."""

from __future__ import annotations

import numpy as np
import pytest
import tensorpress as tp
import torch
from tensorpress.compress import compress_tensor, get_codec
from tensorpress.compress.stages import get_stage
from tensorpress.compress.zstd import Zstd
from tensorpress.formats import FormatError, read_header, tensor_from_stream


def _relu(seed=0, shape=(128, 96)) -> np.ndarray:
    """ReLU-like rows that repeat (a token's activations wherever it occurs): the bytes
    a codec writes for them repeat too, and zstd finds them."""
    rows = np.maximum(np.random.default_rng(seed).standard_normal((8, shape[1])), 0)
    return np.tile(rows, (shape[0] // 8, 1)).astype(np.float32)


@pytest.mark.parametrize(
    ("codec", "kw"),
    [("block", {"abs": 1e-3}), ("int8", {"abs": 0.05}), ("sz", {"rel": 1e-3}), ("zstd", {})],
)
def test_a_stage_round_trips_and_shrinks_what_it_can(codec, kw):
    x = _relu()
    plain = tp.compress(x, codec=codec, **kw)
    staged = tp.compress(x, codec=codec, stages=[{"id": "zstd", "level": 3}], **kw)
    assert tp.info(staged)["config"]["stages"] == [{"id": "zstd", "level": 3, "checksum": False}]
    assert np.array_equal(tp.decompress(staged), tp.decompress(plain))
    if codec in ("block", "int8"):  # fixed-width codes of repeated values: zstd pays
        assert len(staged) < 0.9 * len(plain)


def test_stages_are_part_of_the_config():
    codec = get_codec({"id": "block", "rel": 1e-2, "stages": ["zstd"]})
    assert codec.stages == (Zstd(),)
    config = codec.get_config()
    assert config["stages"] == [{"id": "zstd", "level": 3, "checksum": False}]
    assert get_codec(config) == codec != get_codec("block", rel=1e-2)
    assert "stages" not in get_codec("block").get_config()  # none: the config as before


def test_a_checksummed_stage_catches_what_the_container_would_not():
    x = _relu()
    codec = get_codec("block", abs=1e-3, stages=[{"id": "zstd", "checksum": True}])
    blob = tp.compress(x, codec=codec)
    assert np.abs(tp.decompress(blob) - x).max() <= 1e-3
    payload = bytes(codec.encode_chunk(x, codec.resolve_bound(x)))
    bad = bytearray(payload)
    bad[len(bad) // 2] ^= 0x20
    with pytest.raises(ValueError, match="zstd"):
        codec.decode_chunk(bytes(bad), x.shape, x.dtype, codec.resolve_bound(x))


def test_a_corrupted_staged_stream_raises():
    blob = bytearray(tp.compress(_relu(), codec="block", abs=1e-3, stages=["zstd"]))
    h = read_header(bytes(blob))
    blob[h.payload_offset + 4] ^= 0xFF
    with pytest.raises(FormatError):
        tp.decompress(bytes(blob))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"id": "block", "abs": 1, "stages": ["lz4"]}, "unknown stage"),
        ({"id": "block", "abs": 1, "stages": "zstd"}, "list of stage configs"),
        ({"id": "block", "abs": 1, "stages": [{"id": "zstd", "level": 99}]}, "level"),
        ({"id": "block", "abs": 1, "stages": [{"id": "zstd", "speed": 1}]}, "speed"),
    ],
)
def test_bad_stages_say_what_to_do(spec, match):
    with pytest.raises(ValueError, match=match):
        get_codec(spec)


def test_tensor_paths_refuse_stages():
    t = torch.from_numpy(_relu())
    with pytest.raises(ValueError, match="stages"):
        compress_tensor(t, "block", abs=1e-3, stages=["zstd"])
    blob = tp.compress(_relu(), codec="block", abs=1e-3, stages=["zstd"])
    with pytest.raises(ValueError, match="tensorpress.decompress"):
        tensor_from_stream(blob)


def test_get_stage_takes_a_name_a_config_or_a_stage():
    assert get_stage("zstd") == get_stage({"id": "zstd"}) == get_stage(Zstd()) == Zstd(3)
    assert Zstd(5).decode(Zstd(5).encode(b"abc" * 100), 300) == b"abc" * 100
    with pytest.raises(ValueError, match="corrupted zstd"):
        Zstd().decode(b"not a frame", 100)
    with pytest.raises(ValueError, match="at most 999"):
        Zstd().decode(Zstd().encode(b"\0" * 1000), 999)  # more than the caller allows
