"""The CF valid range in HDF5 and netCDF outputs: ``tensorpress compress`` records a
variable's ``valid_range``/``valid_min``/``valid_max`` in the stream header (``valid``,
format version 3) and every reader, Python and the compiled plugin in a process that never
imports tensorpress, clamps decoded values into it, so no valid cell decodes outside the
range (where CF readers take it for missing); cells outside it come back bit for bit.
Hostile ``valid`` and ``missing`` fields are refused alike by both decoders."""

from __future__ import annotations

import json
import struct
import zlib

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli, run_json
from plugin_tools import (
    DATA,
    c_decode,
    decode_driver,
    edits_agree,
    plugin_library,
    py_decode,
    read_without_tensorpress,
)
from stream_edits import rewrite_header
from stream_edits import set_field as _set
from tensorpress.compress.registry import get_codec
from tensorpress.formats import read_header
from tensorpress.formats.errors import FormatError
from tensorpress.formats.missing import MissingMap
from tensorpress.formats.stream_writer import encode_array

SHAPE = (48, 80)
#: variable -> (dtype, CF attributes, the valid interval they give)
VARS = {
    "frac": ("<f4", {"valid_range": np.array([0, 1], np.float32)}, (0.0, 1.0)),
    "rain": ("<f8", {"valid_min": 0.0}, (0.0, np.inf)),
    "cap": (">f4", {"valid_max": np.float32(100)}, (-np.inf, 100.0)),
    "h16": ("<f2", {"valid_range": np.array([-1, 1], np.float16)}, (-1.0, 1.0)),
}


def _values(name: str, dtype: str, rng) -> np.ndarray:
    """A smooth field clipped at the ends of the valid interval (where a decoded value
    would cross it), with a few cells outside it (missing by CF)."""
    lo, hi = VARS[name][2]
    yy, xx = np.meshgrid(np.linspace(0, 6, SHAPE[0]), np.linspace(0, 9, SHAPE[1]), indexing="ij")
    x = np.clip(0.5 + 0.8 * np.sin(yy + rng.random()) * np.cos(xx), 0, 1)
    x = 2 * x - 1 if name == "h16" else x * {"rain": 5, "cap": 100}.get(name, 1)
    x = x.astype(dtype)
    outside = [v for v in (lo - 3, lo - 0.5, hi + 2, hi + 0.5) if np.isfinite(v)]
    x[0, : len(outside)] = outside
    return x


@pytest.fixture(scope="module")
def cf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("valid") / "in.nc"
    rng = np.random.default_rng(11)
    data = {}
    with h5py.File(path, "w") as f:
        for name, (dtype, attrs, _) in VARS.items():
            data[name] = _values(name, dtype, rng)
            ds = f.create_dataset(name, data=data[name], chunks=(16, 80))
            ds.attrs.update(attrs)
        f.create_dataset("plain", data=rng.random(SHAPE).astype("<f4"), chunks=(16, 80))
    return path, data


def _outside(name: str, x: np.ndarray) -> np.ndarray:
    lo, hi = VARS[name][2]
    with np.errstate(invalid="ignore"):
        return ~((x >= lo) & (x <= hi))


def _check(name: str, x: np.ndarray, y: np.ndarray, tol: float) -> None:
    """Cells outside the range identical; every valid cell within ``tol`` and inside."""
    miss = _outside(name, x)
    assert miss.sum() >= 2
    bits = f"u{x.dtype.itemsize}"
    native = x.dtype.newbyteorder("=")
    assert np.array_equal(x[miss].astype(native).view(bits), y[miss].astype(native).view(bits))
    xv, yv = x[~miss].astype("f8"), y[~miss].astype("f8")
    assert not _outside(name, yv).any(), name
    assert np.all(np.abs(xv - yv) <= tol), name


def _streams(path, name: str, layout: str) -> list[bytes]:
    """The stream of dataset ``name`` (stream layout) or of each of its stored chunks."""
    with h5py.File(path) as f:
        ds = f[name]
        if layout == "stream":
            return [ds[()].tobytes()]
        return [
            bytes(ds.id.read_direct_chunk(ds.id.get_chunk_info(i).chunk_offset)[1])
            for i in range(ds.id.get_num_chunks())
        ]


def _unclamped(stream: bytes) -> np.ndarray:
    """What a reader that ignored ``valid`` would return for the valid cells: the stream
    relabelled as format version 2 without it (and without ``missing``: NaN markers)."""

    def edit(h):
        h.pop("valid")
        h.pop("missing", None)

    return tp.decompress(_with_version(rewrite_header(stream, edit), 2))


def _with_version(blob: bytes, version: int) -> bytes:
    pre = blob[:8] + struct.pack("<H", version) + blob[10 : 16 + _hlen(blob)]
    return pre + struct.pack("<I", zlib.crc32(pre)) + blob[20 + _hlen(blob) :]


def _hlen(blob: bytes) -> int:
    return struct.unpack_from("<I", blob, 12)[0]


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    return plugin_library(tmp_path_factory)


@pytest.mark.parametrize("layout", ["stream", "filter"])
@pytest.mark.parametrize("codec", ["sz", "block"])
def test_no_valid_value_decodes_outside_the_range(
    cf_file, tmp_path, capsys, plugin_dir, layout, codec
):
    src, data = cf_file
    out = tmp_path / ("out.nc" if layout == "filter" else "out.h5")
    args = ("--rel", "2e-2", "--layout", layout, "--codec", codec)
    rc, _, err = run_cli(capsys, "compress", src, out, *args)
    assert rc == 0, err
    crossed = compressed = 0
    with tp.open(out) as t:
        for name, x in data.items():
            if not t[name].compressed:  # stored raw: block does not pay on float16 here
                assert t[name][()].tobytes() == x.tobytes()
                continue
            compressed += 1
            _check(name, x, t[name][()], t[name].bound["tolerance"])
            for s in _streams(out, name, layout):
                h = read_header(s)
                assert h.version == 3
                lo, hi = VARS[name][2]
                want = (lo if np.isfinite(lo) else None, hi if np.isfinite(hi) else None)
                assert h.missing.valid == want
                y = _unclamped(s)
                crossed += int(_outside(name, y[~np.isnan(y)]).sum())
    assert compressed >= 3
    assert crossed > 0 or codec == "block"  # sz without the clamp: cells read as missing
    if layout == "filter":  # h5py through the compiled plugin, tensorpress never imported
        got = read_without_tensorpress(plugin_dir, out, list(data), tmp_path)
        with tp.open(out) as t:
            for name in data:
                a, b = got[name], t[name][()]
                assert (
                    a.astype(a.dtype.newbyteorder("=")).tobytes()
                    == b.astype(a.dtype.newbyteorder("=")).tobytes()
                ), name


def test_lossless_codecs_and_plain_variables_keep_format_version_2(cf_file, tmp_path, capsys):
    src, data = cf_file
    out = tmp_path / "out.h5"
    rc, _, err = run_cli(capsys, "compress", src, out, "--codec", "zstd", "--layout", "stream")
    assert rc == 0, err
    for name in data:
        h = read_header(_streams(out, name, "stream")[0])
        assert h.version == 2 and (h.missing is None or h.missing.valid is None), name
    rc, _, err = run_cli(capsys, "compress", src, out, "--rel", "1e-3", "--layout", "stream", "-f")
    assert rc == 0, err
    h = read_header(_streams(out, "plain", "stream")[0])
    assert h.version == 2 and h.missing is None


def test_convert_keeps_missing_values_and_the_range(cf_file, tmp_path, capsys):
    src, data = cf_file
    stream, filtered = tmp_path / "s.h5", tmp_path / "f.h5"
    assert run_cli(capsys, "compress", src, stream, "--rel", "2e-2", "--layout", "stream")[0] == 0
    rc, _, err = run_cli(capsys, "convert", stream, filtered)
    assert rc == 0, err
    with tp.open(stream) as a, h5py.File(filtered) as b:
        for name, x in data.items():
            y = b[name][()]
            assert y.tobytes() == a[name][()].astype(y.dtype).tobytes(), name
            _check(name, x, y, a[name].bound["tolerance"])


# -- the header fields, hostile values --------------------------------------------------


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def _stream(dtype="<f4", valid=(0.0, 1.0), pairs=()) -> bytes:
    x = np.clip(np.random.default_rng(5).standard_normal((30, 20)) * 0.3 + 0.5, 0, 1)
    x = x.astype(dtype)
    x[0, 0] = np.nan
    codec = get_codec("sz", abs=0.05)
    missing = MissingMap(x.dtype.itemsize, pairs, valid)
    return encode_array(x, codec, codec.resolve_bound(x), missing=missing)


def _valid(v):
    return _set("valid", v)


#: edits of a version 3 float32 stream's header with whether Python decodes the result
VALID_EDITS = [
    (_valid([1.0, 0.0]), False),  # lo > hi
    (_valid([float("nan"), 1.0]), False),
    (_valid([0.0, float("inf")]), False),
    (_valid([None, None]), False),
    (_valid([0.1, 1.0]), False),  # not a float32 value
    (_valid([0.0, 1e39]), False),  # beyond float32
    (_valid([0, 2**60 + 1]), False),  # an integer no float holds
    (_valid(["0", 1]), False),
    (_valid([True, 1]), False),
    (_valid([0.0]), False),
    (_valid([0.0, 1.0, 2.0]), False),
    (_valid({"lo": 0, "hi": 1}), False),
    (_set("missing", [["7FD5A000", "c0a00000"]]), False),  # uppercase
    (_set("missing", [["7fd5a000", "c0a00000"], ["7fd5a000", "0"]]), False),  # twice
    (_set("missing", [["3f800000", "c0a00000"]]), False),  # 1.0 is no marker
    (_set("missing", [["7fd5a000", "100000000"]]), False),  # wider than float32
    (_set("missing", [["7fd5a000", "0x1"]]), False),
    (_set("missing", [["7fd5a000"]]), False),
    (_set("missing", {"7fd5a000": "0"}), False),
    (_valid([0.25, 0.75]), True),
    (_valid([None, 0.5]), True),
    (_valid([-0, 2**60]), True),  # integers, -0 as 0
    (_valid([-0.0, 0.5]), True),
    (_set("missing", [["7fc00000", "c0a00000"]]), True),  # the NaN of x[0, 0]: -5.0 back
    (_set("missing", [["7fd5a000", "c0a00000"], ["7fd5a001", "0"]]), True),
]


def test_valid_and_missing_edits_agree_with_python(driver, tmp_path):
    edits_agree(driver, tmp_path, _stream(), VALID_EDITS)


def test_valid_clamps_alike_in_python_and_c(driver, tmp_path):
    for dtype in ("<f2", "<f4", "<f8"):
        stream = _stream(dtype, valid=(0.25, 0.75))
        got = py_decode(stream)
        assert got is not None and c_decode(driver, tmp_path, stream) == got
        y = np.frombuffer(got, dtype).reshape(30, 20)
        assert np.isnan(y[0, 0]) and np.nanmin(y) == 0.25 and np.nanmax(y) == 0.75


def test_valid_needs_format_version_3(driver, tmp_path):
    stream = _stream()
    assert read_header(stream).version == 3
    for version, decodes in ((1, False), (2, False), (4, False)):
        bad = _with_version(stream, version)
        assert (py_decode(bad) is not None) == decodes
        assert c_decode(driver, tmp_path, bad) is None
    with pytest.raises(FormatError, match="'valid' in a format version 2"):
        tp.decompress(_with_version(stream, 2))
    with pytest.raises(FormatError, match="upgrade tensorpress"):
        tp.decompress(_with_version(stream, 4))


def test_valid_in_a_stream_of_integers_is_refused(driver, tmp_path):
    x = np.arange(60, dtype="<i4").reshape(6, 10)
    blob = encode_array(x, get_codec("zstd"), None)
    bad = _with_version(rewrite_header(blob, _valid([0, 10])), 3)
    assert py_decode(bad) is None and c_decode(driver, tmp_path, bad) is None


def test_verify_counts_valid_cells_decoded_outside_the_range(cf_file, tmp_path, capsys):
    src, _ = cf_file
    out = tmp_path / "out.h5"
    args = ("--rel", "2e-2", "--layout", "stream", "--codec", "sz")
    assert run_cli(capsys, "compress", src, out, *args)[0] == 0
    doc = run_json(capsys, "verify", src, out)
    assert all(d["status"] == "ok" and d["left_valid_range"] == 0 for d in doc["datasets"])
    with h5py.File(out, "a") as f:  # "frac" as a reader that ignored `valid` decodes it
        old = f["frac"][()].tobytes()
        new = _with_version(rewrite_header(old, lambda h: h.pop("valid")), 2)
        attrs = dict(f["frac"].attrs)
        del f["frac"]
        f.create_dataset("frac", data=np.frombuffer(new, np.uint8)).attrs.update(attrs)
    rc, text, _ = run_cli(capsys, "verify", src, out, "--json")
    frac = next(d for d in json.loads(text)["datasets"] if d["name"].lstrip("/") == "frac")
    assert rc == 1 and frac["left_valid_range"] > 0 and frac["status"].startswith("FAIL")


@pytest.mark.parametrize(
    "valid, says",
    [
        ([1.0, 0.0], "lo > hi"),
        ([float("nan"), 1.0], "not a finite number"),
        ([0.0, float("inf")], "not a finite number"),
        ([0.1, 1.0], "not a value of the stream's float32"),
        ([None, None], "bounds nothing"),
        ("0,1", "not a list"),
    ],
)
def test_hostile_valid_fields_raise_a_clear_error(valid, says):
    with pytest.raises(FormatError, match=f"invalid stream header: 'valid' .*{says}"):
        tp.decompress(rewrite_header(_stream(), _valid(valid)))


#: a format version 3 stream kept as written (4 sz chunks of a (40, 30) float32 field
#: clipped to its valid range [0, 1], -1.0 and 2.5 outside it, one NaN): its decoded bytes
GOLDEN_V3 = "5d2d7d483e73e255d44eae31d2aab1af6636888cd85b297e48250030d00a29ff"


def test_the_version_3_golden_stream_decodes_as_written(driver, tmp_path):
    import hashlib

    blob = (DATA / "v3_sz_valid_missing_f32.tp").read_bytes()
    h = read_header(blob)
    assert (h.version, h.nchunks, h.missing.valid) == (3, 4, (0.0, 1.0))
    got = py_decode(blob)
    assert hashlib.sha256(got).hexdigest() == GOLDEN_V3
    assert c_decode(driver, tmp_path, blob) == got
    y = np.frombuffer(got, "<f4").reshape(40, 30)
    assert y[0, :2].tolist() == [-1.0, 2.5] and np.isnan(y[0, 2])
    assert np.nanmin(y[1:]) >= 0 and np.nanmax(y[1:]) <= 1
