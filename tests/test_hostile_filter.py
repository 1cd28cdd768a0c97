"""Crafted HDF5 files against the tensorpress filter: lying cd_values, chunks whose
stream is not the chunk, decompression bombs. Each is read in a subprocess (a crash
shows as a signal, not a dead test runner) through plain h5py, ``tp.open``, the
loaders' ``H5Dataset`` and ``tensorpress decompress``: an error, never values, never a
signal, and peak RSS under 64 MiB above the reader's baseline."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import tensorpress as tp
from peak_memory import CODE as PEAK_CODE
from tensorpress.compress.bounds import ErrorBound
from tensorpress.compress.registry import get_codec
from tensorpress.formats import hdf5_filter, read_header
from tensorpress.formats.errors import FormatError
from tensorpress.formats.filtered_chunks import FilteredChunks
from tensorpress.formats.hdf5_filter import FILTER_ID
from tensorpress.formats.stream_writer import encode_array, write_stream

#: peak RSS a refused read may add, MiB
RSS_SLACK_MIB = 64

#: writes a chunked dataset "t" whose pipeline holds FILTER_ID with exactly the given
#: cd_values (an optional filter that this process does not know: no set_local runs)
#: and whose chunk at the origin holds the given bytes; tensorpress is not imported
CRAFT = """
import json, sys
import h5py, numpy as np
for spec in json.loads(open(sys.argv[1]).read()):
    with h5py.File(spec["path"], "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk(tuple(spec["chunks"]))
        dcpl.set_filter(spec["fid"], h5py.h5z.FLAG_OPTIONAL, tuple(spec["cd"]))
        space = h5py.h5s.create_simple(tuple(spec["chunks"]))
        tid = h5py.h5t.py_create(np.dtype(spec["dtype"]))
        ds = h5py.h5d.create(f.id, b"t", tid, space, dcpl=dcpl)
        stream = open(spec["stream"], "rb").read()
        ds.write_direct_chunk((0,) * len(spec["chunks"]), stream, 0)
"""

#: reads "t" of each file of the JSON list argv[1] ([path, readers]) the ways listed;
#: one JSON line each: the outcome and the growth of peak RSS (MiB) over the baseline
#: taken just before each read (see peak_memory.py)
READ = """
import json, os, sys
import h5py, numpy as np
import tensorpress as tp
from tensorpress.cli import main
from tensorpress.loaders import H5Dataset

def read(how, path):
    if how == "h5py":
        with h5py.File(path, "r") as f:
            return f["t"][...]
    if how == "open":
        with tp.open(path) as f:
            return np.asarray(f["t"][...])
    if how == "loader":
        return H5Dataset(path, "t")[0]
    out = path + ".out.h5"
    rc = main(["decompress", path, out])
    return None if rc and not os.path.exists(out) else f"exit {rc}, wrote {out}"

for path, readers in json.loads(sys.argv[1]):
    for how in readers:
        print(f"reading {path} with {how}", file=sys.stderr, flush=True)
        reset_peak()
        base = peak_bytes()
        try:
            y = read(how, path)
            outcome = "error" if y is None else f"values {str(y)[:200]}"
        except Exception as exc:
            outcome = f"error {type(exc).__name__}: {str(exc)[:300]}"
        grown = (peak_bytes() - base) / (1 << 20)
        line = {"path": path, "how": how, "outcome": outcome, "grown_mib": grown}
        print(json.dumps(line), flush=True)
"""

ALL_READERS = ("h5py", "open", "loader", "cli")
OURS = ("open", "loader", "cli")


def _cd(codec="zstd", layout=None, version=2, **bound) -> list[int]:
    """cd_values: the helper's five, then ``layout`` (the values set_local appends)."""
    head = list(hdf5_filter.filter(codec=codec, **bound)["compression_opts"])
    head[0] = version
    return head + list(layout or [])


def _bomb(n: int, dtype: str) -> bytes:
    """A valid ``sz`` stream of ``n`` zeros of ``dtype`` (a few KB) built from one
    encoded chunk repeated, so the test never holds the array it declares."""
    rows = 1 << 20
    codec, bound = get_codec("sz", abs=1e-3), ErrorBound("abs", 1e-3, 1e-3)
    one = encode_array(np.zeros(rows, dtype), codec, bound, chunk_bytes=rows * 8)
    h = read_header(one)
    payload = bytes(one[h.payload_offset :])
    return write_stream(h.dtype.str, (n,), "C", h.codec, h.bound, rows, [payload] * (n // rows))


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> dict:
    """Stream files by name: small valid chunks of the wrong kind, and bombs."""
    d = tmp_path_factory.mktemp("streams")
    made = {
        "f8_2x2_zstd": tp.compress(np.arange(4.0).reshape(2, 2), codec="zstd"),
        "f8_2x2_sz": tp.compress(np.arange(4.0).reshape(2, 2), abs=1e-3),
        "f4_8x4_zstd": tp.compress(np.arange(32, dtype="f4").reshape(8, 4), codec="zstd"),
        "bomb_f8": _bomb(1 << 28, "<f8"),  # 2 GiB declared
        "bomb_f4": _bomb(1 << 28, "<f4"),  # 1 GiB declared
    }
    assert len(made["bomb_f8"]) < 64 << 10
    assert read_header(made["bomb_f8"]).original_bytes == 1 << 31
    for name, blob in made.items():
        (d / name).write_bytes(blob)
    return {name: d / name for name in made}


def _assert_refused(results, readers) -> None:
    assert [r["how"] for r in results] == list(readers)
    for r in results:
        assert r["outcome"].startswith("error"), r
        assert r["grown_mib"] < RSS_SLACK_MIB, r


#: (id, dataset dtype, HDF5 chunk shape, cd_values, stream): the filter itself refuses
#: these, so plain h5py raises too
CASES = [
    # item 1: cd_values without the chunk layout, a stream of 4 values
    ("no-layout-256", "f8", [256, 256], _cd(), "f8_2x2_zstd"),
    ("no-layout-2048", "f8", [2048, 2048], _cd(), "f8_2x2_zstd"),
    ("no-layout-v1", "f8", [2048, 2048], _cd(version=1), "f8_2x2_zstd"),
    # item 1: chunk dims that disagree with the stream
    ("dims-256", "f8", [256, 256], _cd(layout=[8, 0, 2, 256, 256]), "f8_2x2_zstd"),
    ("dims-flat", "f8", [2048, 2048], _cd(layout=[8, 0, 1, 4]), "f8_2x2_zstd"),
    ("dims-v1", "f8", [256, 256], _cd(version=1, layout=[8, 2, 256, 256]), "f8_2x2_zstd"),
    ("rank-lies", "f8", [256, 256], _cd(layout=[8, 0, 3, 256, 256]), "f8_2x2_zstd"),
    # item 2: a float64 4x4 chunk holding 8x4 float32 (the same 128 bytes)
    ("f4-in-f8", "f8", [4, 4], _cd(layout=[8, 0, 2, 4, 4]), "f4_8x4_zstd"),
    ("f4-in-f8-v1", "f8", [4, 4], _cd(version=1, layout=[8, 2, 4, 4]), "f4_8x4_zstd"),
    # item 2: the codec differs from the one cd_values name (a lossless zstd stream
    # is taken in any dataset: convert writes one for a short last chunk)
    ("codec-lies", "f8", [2, 2], _cd("block", [8, 0, 2, 2, 2], abs=1e-3), "f8_2x2_sz"),
    ("bound-lies", "f8", [2, 2], _cd("sz", [8, 0, 2, 2, 2], abs=1e-9), "f8_2x2_sz"),
    # item 3: a 2x2 chunk, cd_values as written, a stream declaring 2**28 values
    ("bomb-f8", "f8", [2, 2], _cd("sz", [8, 0, 2, 2, 2], abs=1e-3), "bomb_f8"),
    ("bomb-f4", "f4", [4, 4], _cd("sz", [4, 0, 2, 4, 4], abs=1e-3), "bomb_f4"),
    ("bomb-v1", "f8", [2, 2], _cd("sz", [8, 2, 2, 2], version=1, abs=1e-3), "bomb_f8"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_crafted_chunk_is_refused_by_every_reader(read_crafted, case):
    _assert_refused(read_crafted[case[0]], ALL_READERS)
    assert not pathlib.Path(read_crafted[case[0]][0]["path"] + ".out.h5").exists()


#: cd_values that agree with the stream but not with the dataset: the filter callback
#: cannot see the dataset (HDF5 gives it cd_values and bytes only), so plain h5py is
#: not defended (SPEC.md says so); tensorpress's own readers compare with the dataset
CONSISTENT_LIES = [
    ("dims-2048", "f8", [2048, 2048], _cd(layout=[8, 0, 2, 2, 2]), "f8_2x2_zstd"),
    ("dims-2048-v1", "f8", [2048, 2048], _cd(version=1, layout=[8, 2, 2, 2]), "f8_2x2_zstd"),
    ("itemsize", "f8", [4, 4], _cd(layout=[4, 0, 2, 8, 4]), "f4_8x4_zstd"),
    ("itemsize-v1", "f8", [4, 4], _cd(version=1, layout=[4, 2, 8, 4]), "f4_8x4_zstd"),
    ("bomb-dims", "f8", [2, 2], _cd("sz", [8, 0, 1, 1 << 28], abs=1e-3), "bomb_f8"),
]


@pytest.mark.parametrize("case", CONSISTENT_LIES, ids=[c[0] for c in CONSISTENT_LIES])
def test_cd_values_that_disagree_with_the_dataset_are_refused_by_our_readers(read_crafted, case):
    _assert_refused(read_crafted[case[0]], OURS)


@pytest.fixture(scope="module")
def read_crafted(tmp_path_factory, streams) -> dict:
    """Every case crafted (one subprocess without tensorpress) and read (one subprocess
    with it): the results by case id. A reader that dies names the file it was reading."""
    d = tmp_path_factory.mktemp("crafted")
    specs, plan = [], []
    for cases, readers in ((CASES, ALL_READERS), (CONSISTENT_LIES, OURS)):
        for name, dtype, chunks, cd, stream in cases:
            path = str(d / f"{name}.h5")
            specs.append({"path": path, "fid": FILTER_ID, "dtype": dtype, "chunks": chunks})
            specs[-1].update(cd=cd, stream=str(streams[stream]))
            plan.append([path, readers])
    (d / "specs.json").write_text(json.dumps(specs))
    done = subprocess.run(
        [sys.executable, "-c", CRAFT, str(d / "specs.json")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CODE + READ, json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = [line for line in done.stderr.splitlines() if line.startswith("reading ")][-1:]
    assert done.returncode == 0, f"the reader ended with {done.returncode} while {last}"
    out: dict = {}
    for line in done.stdout.splitlines():
        r = json.loads(line)
        out.setdefault(pathlib.Path(r["path"]).stem, []).append(r)
    return out


def test_filter_callback_refuses_before_decoding(streams):
    cd = _cd("sz", [8, 0, 2, 2, 2], abs=1e-3)
    bomb = streams["bomb_f8"].read_bytes()
    with pytest.raises(FormatError, match="refused before decoding"):
        hdf5_filter.decode_chunk(bomb, cd)
    small = streams["f8_2x2_zstd"].read_bytes()
    with pytest.raises(ValueError, match="lack the element size"):
        hdf5_filter.decode_chunk(small, _cd())
    assert hdf5_filter.decode_chunk(small, _cd(layout=[8, 0, 2, 2, 2])).nbytes == 32
    sz = streams["f8_2x2_sz"].read_bytes()
    with pytest.raises(FormatError, match="codec"):
        hdf5_filter.decode_chunk(sz, _cd("block", [8, 0, 2, 2, 2], abs=1e-3))
    with pytest.raises(FormatError, match="bound"):
        hdf5_filter.decode_chunk(sz, _cd("sz", [8, 0, 2, 2, 2], abs=1e-9))
    exact = hdf5_filter.decode_chunk(small, _cd("sz", [8, 0, 2, 2, 2], abs=1e-3))
    assert np.array_equal(exact.view("<f8"), np.arange(4.0))  # lossless meets any bound


@pytest.mark.parametrize(
    "layout, why",
    [
        ([8, 0, 2, 2], "rank 2"),  # ends inside the dims
        ([8, 0, 2, 2, 2, 2], "rank 2"),  # a value too many
        ([3, 0, 1, 4], "element size 3"),
        ([8, 7, 1, 4], "byte order 7"),
        ([8, 0, 0], "rank 0"),
        ([8, 0, 1, 0], "rank 1"),
        ([8, 0, 2, 65536, 65536], "larger than HDF5 allows"),
        ([8, 0], "end before the chunk rank"),
    ],
)
def test_parse_cd_values_refuses_malformed_layouts(layout, why):
    with pytest.raises(ValueError, match=why):
        hdf5_filter.parse_cd_values(_cd(layout=layout))


DATA = pathlib.Path(__file__).parent / "data"


def test_version_1_cd_values_keep_decoding():
    """filter_cd_v1.h5: written with cd_values layout 1 (no byte order) under filter
    id 307; each chunk decodes with the file's own cd_values, and through the readers
    that decode stored chunks themselves."""
    with h5py.File(DATA / "filter_cd_v1.h5", "r") as f:
        x = f.attrs["x"]
        for name, bound in (("f8", 1e-3), ("f4", 0.0)):
            ds = f[name]
            cd = [int(v) for v in ds.id.get_create_plist().get_filter(0)[2]]
            assert cd[0] == 1
            p = hdf5_filter.parse_cd_values(cd)
            assert (p["byteorder"], p["chunks"]) == ("<", ds.chunks)
            _, raw = ds.id.read_direct_chunk((0, 0))
            first = hdf5_filter.decode_chunk(raw, cd).view(ds.dtype).reshape(ds.chunks)
            want = x[: ds.chunks[0], : ds.chunks[1]].astype(ds.dtype)
            assert np.abs(first - want).max() <= bound
            y = FilteredChunks(ds).read_rows(0, ds.shape[0])
            assert np.abs(y.astype("f8") - x.astype(ds.dtype)).max() <= bound


def test_big_endian_filter_layout_keeps_its_dtype(tmp_path):
    """`tensorpress compress --layout filter` keeps >f8 as >f8 (a contiguous input
    becomes chunked: a filter needs chunks), within the bound, and h5py reads it."""
    x = np.random.default_rng(44).standard_normal((300, 40)).cumsum(0).astype(">f8")
    src, dst = tmp_path / "be.h5", tmp_path / "be.tp.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("contiguous", data=x)
        f.create_dataset("chunked", data=x, chunks=(64, 40))
    code = textwrap.dedent(
        """
        import sys
        from tensorpress.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    run = [sys.executable, "-c", code]
    done = subprocess.run(
        [*run, "compress", str(src), str(dst), "--layout", "filter", "--abs", "1e-3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    with h5py.File(dst, "r") as f:
        for name in ("contiguous", "chunked"):
            d = f[name]
            cd = d.id.get_create_plist().get_filter(0)[2]
            assert d.dtype.str == ">f8" and cd[6] == 1 and d.chunks is not None
            y = d[...]
            assert y.dtype.str == ">f8"
            assert np.abs(y - x).max() <= 1e-3
    done = subprocess.run([*run, "verify", str(src), str(dst)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


#: reads the zarr array argv[1] whole, then decodes the bomb argv[2] into a 4-value
#: ``out`` with the numcodecs codec: one JSON line each, as READ
READ_ZARR = """
import json, sys
import numpy as np, zarr
from tensorpress.formats.zarr_codecs import SZ

def zarr_read():
    return zarr.open_array(sys.argv[1], mode="r")[...]

def numcodecs_read():
    return SZ(abs=1e-3).decode(open(sys.argv[2], "rb").read(), out=np.empty(4))

for how, read in (("zarr", zarr_read), ("numcodecs", numcodecs_read)):
    reset_peak()
    base = peak_bytes()
    try:
        outcome = f"values {str(read())[:200]}"
    except Exception as exc:
        outcome = f"error {type(exc).__name__}: {str(exc)[:300]}"
    grown = (peak_bytes() - base) / (1 << 20)
    print(json.dumps({"how": how, "outcome": outcome, "grown_mib": grown}), flush=True)
"""


def test_crafted_zarr_chunk_is_refused_before_decoding(tmp_path, streams):
    zarr = pytest.importorskip("zarr")
    from tensorpress.formats.zarr_codecs import SZSerializer

    store = tmp_path / "a.zarr"
    a = zarr.create_array(
        store,
        shape=(4,),
        chunks=(2,),
        dtype="f8",
        serializer=SZSerializer(abs=1e-3),
        compressors=None,  # the chunk file is the stream itself
    )
    a[...] = np.arange(4.0)
    chunk = next(p for p in store.rglob("*") if p.is_file() and p.parent.name == "c")
    chunk.write_bytes(streams["bomb_f8"].read_bytes())  # a 2-value chunk declaring 2**28
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CODE + READ_ZARR, str(store), str(streams["bomb_f8"])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    _assert_refused(results, ("zarr", "numcodecs"))
    assert "refused before decoding" in results[0]["outcome"]
