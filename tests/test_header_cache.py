"""Parsed stream headers and codecs are kept by their bytes (a loader reads thousands of
chunk streams with one header): a kept header changes nothing a reader checks or
returns. Every stream is still checked in full: its header checksum, its chunk index,
each payload's checksum, trailing bytes, and a damaged header is never kept."""

import struct
import zlib

import numpy as np
import pytest
import tensorpress as tp
from stream_edits import rewrite_header, set_field
from tensorpress.formats import (
    ChecksumError,
    ContainerReader,
    FormatError,
    read_header,
    stream_header,
    stream_reader,
)


def _blob(seed: int, codec: str = "sz", **kw) -> bytes:
    x = np.cumsum(np.random.default_rng(seed).standard_normal((8, 64)), axis=1)
    return tp.compress(x.astype(np.float32), abs=1e-2, codec=codec, chunk_bytes=1 << 20, **kw)


def _head_end(blob: bytes) -> int:
    """Bytes of the preamble, JSON header and its CRC."""
    return 16 + struct.unpack_from("<I", blob, 12)[0] + 4


@pytest.fixture
def pair():
    """Two streams of other values whose headers are the same bytes."""
    a, b = _blob(0), _blob(1)
    assert a[: _head_end(a)] == b[: _head_end(b)] and a != b
    return a, b


def test_same_header_bytes_decode_each_stream_own_values(pair):
    a, b = pair
    ra, rb = ContainerReader(a, workers=1), ContainerReader(b, workers=1)
    assert ra.header.crcs != rb.header.crcs  # each stream's own index
    assert ra.codec is rb.codec  # one codec for one config
    assert not np.array_equal(ra.read(), rb.read())
    assert np.array_equal(rb.read(), tp.decompress(b))


@pytest.mark.parametrize("where", ["index", "payload", "header_crc"])
def test_kept_header_does_not_skip_checksums(pair, where):
    a, _ = pair
    read_header(a)  # the header is kept now
    bad = bytearray(a)
    end = _head_end(a)
    at = {"index": end + 8, "payload": len(a) - 3, "header_crc": end - 2}[where]
    bad[at] ^= 0x40
    with pytest.raises(ChecksumError):
        ContainerReader(bytes(bad), workers=1).read()


def test_kept_header_does_not_skip_trailing_bytes(pair):
    a, _ = pair
    read_header(a)
    with pytest.raises(FormatError, match="trailing"):
        ContainerReader(a + b"\0", workers=1)


def test_a_refused_header_is_refused_every_time(pair):
    a, _ = pair
    bad = rewrite_header(a, set_field("order", "K"))
    for _ in range(2):
        with pytest.raises(FormatError, match="order"):
            read_header(bad)
    assert all(b'"K"' not in key for key in stream_header._fields_cache)


def test_changing_a_header_dict_changes_no_other_stream(pair):
    a, b = pair
    h = read_header(a)
    want = dict(h.codec)
    h.codec["radius"] = 7
    h.codec.clear()
    assert read_header(b).codec == want
    r = ContainerReader(b, workers=1)
    assert r.codec.get_config()["radius"] == want["radius"]


def test_another_config_gets_another_codec():
    one = ContainerReader(_blob(0), workers=1)
    two = ContainerReader(_blob(0, radius=64), workers=1)
    assert one.header.codec != two.header.codec
    assert one.codec is not two.codec
    assert (one.codec.radius, two.codec.radius) == (32768, 64)
    assert np.array_equal(two.read(), tp.decompress(_blob(0, radius=64)))


def test_the_caches_stay_small():
    for radius in range(stream_header.FIELDS_CACHE + 5):
        read_header(_blob(0, radius=radius + 2))
    assert len(stream_header._fields_cache) <= stream_header.FIELDS_CACHE
    assert len(stream_reader._codecs) <= stream_reader.CODEC_CACHE


def test_header_checksum_still_checked_for_a_kept_header(pair):
    a, _ = pair
    read_header(a)
    end = _head_end(a)
    crc = zlib.crc32(a[: end - 4]) ^ 1
    with pytest.raises(ChecksumError, match="header"):
        read_header(a[: end - 4] + struct.pack("<I", crc) + a[end:])


def _kept(blob: bytes) -> bytes:
    """``blob``'s head (bytes up to its chunk count), parsed once so that it is kept."""
    read_header(blob)
    head = stream_header.parse_head(stream_reader.BufferSource(blob))[1]
    assert head in stream_header._heads
    return head


@pytest.mark.parametrize("cut", [1, 40, "index", "head"])
def test_kept_head_a_truncated_stream_is_refused(pair, cut):
    from tensorpress.formats import TruncatedError

    a, _ = pair
    head = _kept(a)
    keep = (
        {"index": len(head) + 5, "head": len(head) - 1}[cut]
        if isinstance(cut, str)
        else len(a) - cut
    )
    with pytest.raises(TruncatedError):
        ContainerReader(a[:keep], workers=1).read()


def test_kept_head_each_index_byte_is_checked(pair):
    a, _ = pair
    head = _kept(a)
    for at in range(len(head), len(head) + 12 + 4):  # one index entry and the index CRC
        bad = bytearray(a)
        bad[at] ^= 0x01
        with pytest.raises((ChecksumError, FormatError)):
            ContainerReader(bytes(bad), workers=1).read()


def test_kept_head_each_payload_checksum_is_checked(pair):
    a, _ = pair
    r = ContainerReader(a, workers=1)
    start = r.header.payload_offset
    for at in range(start, len(a), max(1, (len(a) - start) // 16)):
        bad = bytearray(a)
        bad[at] ^= 0x10
        with pytest.raises(ChecksumError):
            ContainerReader(bytes(bad), workers=1).read()


def test_a_lying_header_length_is_not_read_past_the_kept_heads(pair):
    a, _ = pair
    _kept(a)
    bad = a[:12] + struct.pack("<I", 1 << 31) + a[16:]
    with pytest.raises((FormatError, ChecksumError)):
        ContainerReader(bad, workers=1)


def test_kept_head_decodes_each_stream_exactly(pair, monkeypatch):
    a, b = pair
    _kept(a)

    def full(source):
        raise AssertionError("a kept head was parsed again")

    monkeypatch.setattr(stream_header, "_parse_in_full", full)  # b's head is a's
    for blob in (a, b):
        assert np.array_equal(ContainerReader(blob, workers=1).read(), tp.decompress(blob))
    assert len(stream_header._heads) <= stream_header.FIELDS_CACHE
