"""numcodecs and zarr (format 2 and 3) codecs: bounds, configs, entry points, damage."""

import itertools
import json
import subprocess
import sys
import textwrap

import numcodecs
import numpy as np
import pytest
import tensorpress as tp
import zarr
from tensorpress.formats import ChecksumError
from tensorpress.formats.zarr_codecs import (
    SZ,
    Block,
    BlockSerializer,
    Quant,
    QuantSerializer,
    SZSerializer,
    Zstd,
    ZstdSerializer,
)

FLOATS = (np.float16, np.float32, np.float64)


def _field(shape, dtype=np.float32, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return (x + offset).astype(dtype)


def _with_specials(x):
    x = x.copy()
    flat = x.reshape(-1)
    flat[[3, 50, 77]] = [np.nan, np.inf, -np.inf]
    return x


def _tolerance(x, mode, value):
    """The bound each element must meet, from the data alone (float64, per element)."""
    x64 = x.astype(np.float64)
    if mode == "abs":
        return np.full(x.shape, value)
    if mode == "pw_rel":
        return value * np.abs(x64)
    fin = x64[np.isfinite(x64)]
    return np.full(x.shape, value * (fin.max() - fin.min()))


def _assert_within(x, y, tol):
    """NaN and +-Inf exact, every finite element within ``tol`` (compared in float64)."""
    assert y.dtype == x.dtype and y.shape == x.shape
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    fin = np.isfinite(x64)
    assert np.array_equal(np.isnan(x64), np.isnan(y64))
    assert np.array_equal(x64[np.isinf(x64)], y64[np.isinf(x64)])
    assert np.all(np.abs(x64[fin] - y64[fin]) <= np.broadcast_to(tol, x.shape)[fin])


def _run(code: str, cwd) -> str:
    """Run ``code`` in a fresh interpreter in ``cwd``; its stdout (fails on a non-zero exit)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# -- numcodecs ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["abs", "rel", "pw_rel"])
@pytest.mark.parametrize("codec_id", ["tensorpress.sz", "tensorpress.block"])
def test_numcodecs_round_trip_within_bound(codec_id, mode, dtype):
    x = _with_specials(_field((24, 17, 9), dtype, seed=1))
    value = {"abs": 0.05, "rel": 1e-3, "pw_rel": 1e-2}[mode]
    codec = numcodecs.get_codec({"id": codec_id, mode: value})
    blob = codec.encode(x)
    assert isinstance(blob, bytes)
    y = codec.decode(blob)
    _assert_within(x, y, _tolerance(x, mode, value))
    if mode == "pw_rel":
        fin = np.isfinite(x)
        assert np.array_equal(np.signbit(x[fin]), np.signbit(y[fin]))
    assert tp.info(blob)["config"]["id"] == codec_id.split(".")[1]


def test_decode_into_out_and_fortran_order():
    x = np.asfortranarray(_field((30, 20), np.float64))
    codec = SZ(abs=1e-3)
    blob = codec.encode(x)
    out = np.full(x.shape, -1.0)
    assert codec.decode(blob, out=out) is out
    _assert_within(x, out, 1e-3)
    flat = np.zeros(x.size)  # numcodecs callers may give a flat buffer of the right size
    codec.decode(blob, out=flat)
    assert np.array_equal(flat.reshape(x.shape, order="F"), out)
    assert codec.decode(blob).flags.f_contiguous


@pytest.mark.parametrize(
    "out",
    [
        np.zeros((32, 64), np.float32),  # the same bytes, another dtype and shape
        np.zeros((64, 16), np.float64),  # the same dtype and size, another shape
        np.zeros(1024, np.float64).view(np.int64),  # flat, another dtype
        np.zeros(2048, np.float32),  # flat, the same bytes
    ],
    ids=["f32-32x64", "f64-64x16", "i64-flat", "f32-flat"],
)
def test_decode_refuses_an_out_of_another_dtype_or_shape(out):
    """A float64 (16, 64) chunk is not written into another array of the same byte size."""
    blob = SZ(abs=1e-3).encode(_field((16, 64), np.float64))
    before = out.copy()
    with pytest.raises(ValueError, match="float64 array of shape"):
        SZ(abs=1e-3).decode(blob, out=out)
    assert np.array_equal(out, before)


def test_decode_into_untyped_memory_of_the_chunks_bytes():
    x = _field((16, 64), np.float64)
    codec = Zstd()
    out = bytearray(x.nbytes)
    codec.decode(codec.encode(x), out=out)
    assert np.array_equal(np.frombuffer(out, np.float64).reshape(x.shape), x)
    with pytest.raises(ValueError, match="out is"):
        codec.decode(codec.encode(x), out=bytearray(x.nbytes + 8))


def test_quant_reports_its_max_error():
    x = _field((64, 48), np.float32)
    codec = numcodecs.get_codec({"id": "tensorpress.quant", "bits": 8, "group": 64})
    blob = codec.encode(x)
    y = codec.decode(blob)
    err = np.abs(x.astype(np.float64) - y).max()
    assert y.shape == x.shape and y.dtype == x.dtype
    assert 0 < err <= tp.info(blob)["max_error"]
    assert len(blob) < x.nbytes / 3


@pytest.mark.parametrize(
    "x",
    [
        np.arange(-500, 500, dtype=np.int32).reshape(20, 50),
        np.random.default_rng(0).random((7, 9)) > 0.5,
        _with_specials(_field((10, 12), np.float64)),
        np.zeros((0, 4), np.float32),
    ],
    ids=["int32", "bool", "float64", "empty"],
)
def test_zstd_is_lossless(x):
    codec = numcodecs.get_codec({"id": "tensorpress.zstd"})
    y = codec.decode(codec.encode(x))
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


@pytest.mark.parametrize(
    "codec",
    [
        SZ(rel=1e-3),
        SZ(pw_rel=0.01, predictor="lorenzo", radius=1024, level=5),
        SZ(abs=0.5, predictor="cubic", alpha=1.25, beta=2.0),
        Block(abs=1e-4),
        Quant(bits=2, group=256, stochastic=True, seed=7, hadamard=True),
        Zstd(level=9, shuffle=False),
    ],
    ids=repr,
)
def test_config_round_trip(codec):
    config = codec.get_config()
    assert list(config)[0] == "id" and config["id"].startswith("tensorpress.")
    again = numcodecs.get_codec(json.loads(json.dumps(config)))
    assert type(again) is type(codec) and again == codec
    assert again.get_config() == config
    assert type(codec).from_config({k: v for k, v in config.items() if k != "id"}) == codec
    assert eval(repr(codec), {type(codec).__name__: type(codec)}) == codec


def test_config_keeps_only_the_given_bound():
    assert SZ(rel=1e-3).get_config() == {
        "id": "tensorpress.sz",
        "rel": 1e-3,
        "predictor": "auto",
        "alpha": None,
        "beta": None,
        "radius": 32768,
        "level": None,
    }
    assert Block(pw_rel=0.1).get_config() == {"id": "tensorpress.block", "pw_rel": 0.1}
    assert SZ(rel=1e-3) != SZ(abs=1e-3)


@pytest.mark.parametrize(
    "config, match",
    [
        ({"id": "tensorpress.sz"}, "exactly one error bound"),
        ({"id": "tensorpress.sz", "abs": 1, "rel": 1}, "exactly one error bound"),
        ({"id": "tensorpress.block", "abs": -1}, ">= 0"),
        ({"id": "tensorpress.sz", "abs": 1, "predictor": "magic"}, "predictor"),
        ({"id": "tensorpress.sz", "abs": 1, "colour": "red"}, "colour"),
        ({"id": "tensorpress.zstd", "abs": 1e-3}, "lossless and takes no error bound"),
        ({"id": "tensorpress.quant", "rel": 1e-3}, "bits-bounded"),
        ({"id": "tensorpress.quant", "bits": 3}, "bits must be 2, 4 or 8"),
    ],
)
def test_bad_config_is_a_clear_value_error(config, match):
    with pytest.raises(ValueError, match=match):
        numcodecs.get_codec(config)


@pytest.mark.parametrize("codec", [SZ(abs=1.0), Block(rel=1e-3), Quant()], ids=repr)
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, np.complex64])
def test_lossy_codec_refuses_non_float_input(codec, dtype):
    with pytest.raises(TypeError, match="float16, float32, float64"):
        codec.encode(np.zeros(16, dtype))


def test_non_native_byte_order_is_refused_not_relabelled(tmp_path):
    x = np.linspace(0, 1, 64).astype(">f8")
    with pytest.raises(ValueError, match="native byte order.*'<f8'"):
        SZ(abs=1e-3).encode(x)
    a = zarr.create_array(
        zarr.storage.LocalStore(tmp_path / "be.zarr"),
        shape=x.shape,
        chunks=(16,),
        dtype=">f8",
        zarr_format=2,
        compressors=SZ(abs=1e-3),
        filters=None,
    )
    with pytest.raises(ValueError, match="native byte order"):
        a[...] = x  # zarr format 2 would view the decoded chunk as big-endian: garbage


def test_decode_refuses_garbage():
    with pytest.raises(ValueError, match="not a tensorpress stream"):
        SZ(abs=1.0).decode(b"\x00" * 64)


def test_entry_point_in_a_fresh_process(tmp_path):
    out = _run(
        """
        import sys, numpy as np, numcodecs
        assert "tensorpress" not in sys.modules
        x = np.linspace(0, 1, 1000, dtype=np.float32).reshape(10, 100)
        for cfg in ({"id": "tensorpress.sz", "rel": 1e-3}, {"id": "tensorpress.block", "abs": 1e-3},
                    {"id": "tensorpress.quant"}, {"id": "tensorpress.zstd"}):
            c = numcodecs.get_codec(cfg)
            y = c.decode(c.encode(x))
            print(type(c).__module__, c.get_config()["id"], float(np.abs(x - y).max()))
        """,
        tmp_path,
    )
    lines = [line.split() for line in out.splitlines()]
    assert [m for m, _, _ in lines] == ["tensorpress.formats.zarr_codecs"] * 4
    ids = [i for _, i, _ in lines]
    assert ids == ["tensorpress.sz", "tensorpress.block", "tensorpress.quant", "tensorpress.zstd"]
    errs = [float(e) for _, _, e in lines]
    assert errs[0] <= 1e-3 and errs[1] <= 1e-3 and errs[3] == 0.0


def test_optional_dependencies(tmp_path):
    out = _run(
        """
        import sys
        sys.modules["numcodecs"] = None  # as if numcodecs were not installed
        try:
            import tensorpress.formats.zarr_codecs
        except ImportError as exc:
            print(exc)
        del sys.modules["numcodecs"]
        sys.modules["zarr"] = None  # numcodecs without zarr
        import numpy as np
        from tensorpress.formats import zarr_codecs as zc
        x = np.arange(100, dtype=np.float64)
        print(float(np.abs(zc.Block(abs=0.5).decode(zc.Block(abs=0.5).encode(x)) - x).max()))
        print(hasattr(zc, "SZSerializer"))
        """,
        tmp_path,
    )
    message, err, has_serializer = out.splitlines()
    assert 'pip install "tensorpress[zarr]"' in message
    assert float(err) <= 0.5 and has_serializer == "False"


# -- zarr format 3 -------------------------------------------------------------------

SHAPE, CHUNKS = (37, 29, 11), (16, 16, 8)  # chunks do not divide the shape


@pytest.fixture(scope="module")
def cube():
    # values far from the fill value 0: padding of edge chunks must not widen a rel bound
    return _with_specials(_field(SHAPE, np.float32, seed=3, offset=100.0))


def _chunk_slices(shape, chunks):
    ranges = [range(0, n, c) for n, c in zip(shape, chunks, strict=True)]
    for start in itertools.product(*ranges):
        yield tuple(slice(s, s + c) for s, c in zip(start, chunks, strict=True))


def _write_v3(path, x, serializer):
    a = zarr.create_array(
        zarr.storage.LocalStore(path),
        shape=x.shape,
        chunks=CHUNKS,
        dtype=x.dtype,
        serializer=serializer,
        compressors=None,
    )
    a[...] = x
    return a


def test_zarr3_rel_bound_holds_per_chunk(tmp_path, cube):
    rel = 1e-3
    _write_v3(tmp_path / "a.zarr", cube, SZSerializer(rel=rel))
    y = zarr.open_array(zarr.storage.LocalStore(tmp_path / "a.zarr"), mode="r")[...]
    for sl in _chunk_slices(SHAPE, CHUNKS):
        _assert_within(cube[sl], y[sl], _tolerance(cube[sl], "rel", rel))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("serializer_cls", [SZSerializer, BlockSerializer])
def test_zarr3_abs_bound_and_reopen(tmp_path, cube, serializer_cls, dtype):
    x = cube.astype(dtype)
    a = _write_v3(tmp_path / "a.zarr", x, serializer_cls(abs=0.05))
    b = zarr.open_array(zarr.storage.LocalStore(tmp_path / "a.zarr"), mode="r")
    assert b.metadata.codecs == a.metadata.codecs == (serializer_cls(abs=0.05),)
    _assert_within(x, b[...], 0.05)
    _assert_within(x[5:20, 3], b[5:20, 3], 0.05)


def test_zarr3_store_reopens_in_a_new_process(tmp_path, cube):
    path = tmp_path / "a.zarr"
    _write_v3(path, cube, SZSerializer(pw_rel=1e-2, predictor="lorenzo"))
    ours = zarr.open_array(zarr.storage.LocalStore(path), mode="r")[...]
    out = _run(
        f"""
        import json, sys, numpy as np, zarr
        a = zarr.open_array(zarr.storage.LocalStore({str(path)!r}), mode="r")
        np.save("theirs.npy", a[...])
        print(json.dumps(a.metadata.to_dict()["codecs"]))
        print("tensorpress" in sys.modules)
        """,
        tmp_path,
    )
    codecs_json, imported = out.splitlines()
    assert json.loads(codecs_json) == [
        {
            "name": "tensorpress.sz",
            "configuration": {
                "pw_rel": 1e-2,
                "predictor": "lorenzo",
                "alpha": None,
                "beta": None,
                "radius": 32768,
                "level": None,
            },
        }
    ]
    assert imported == "True"  # loaded through the zarr.codecs entry point
    assert np.array_equal(np.load(tmp_path / "theirs.npy"), ours, equal_nan=True)
    _assert_within(cube, ours, _tolerance(cube, "pw_rel", 1e-2))


def test_zarr3_chunk_files_are_tensorpress_streams(tmp_path, cube):
    path = tmp_path / "a.zarr"
    _write_v3(path, cube, SZSerializer(abs=0.05))
    files = sorted(p for p in (path / "c").rglob("*") if p.is_file())
    assert len(files) == np.prod([-(-n // c) for n, c in zip(SHAPE, CHUNKS, strict=True)])
    meta = tp.info(files[-1].read_bytes())
    assert meta["shape"] == CHUNKS and meta["dtype"] == "float32"  # edge chunks are full size
    assert meta["bound"] == {"mode": "abs", "value": 0.05, "tolerance": 0.05}


def test_zarr3_corrupted_chunk_raises(tmp_path, cube):
    path = tmp_path / "a.zarr"
    _write_v3(path, cube, SZSerializer(abs=0.05))
    victim = path / "c" / "1" / "0" / "1"
    blob = bytearray(victim.read_bytes())
    blob[-5] ^= 0x10
    victim.write_bytes(bytes(blob))
    a = zarr.open_array(zarr.storage.LocalStore(path), mode="r")
    _assert_within(cube[:16, :16], a[:16, :16], 0.05)  # other chunks still read
    with pytest.raises(ChecksumError, match="checksum"):
        a[16:32, :16, 8:]


def test_zarr3_lossless_zstd_any_dtype(tmp_path):
    x = np.arange(np.prod(SHAPE), dtype=np.int64).reshape(SHAPE) * 7 - 300
    _write_v3(tmp_path / "i.zarr", x, ZstdSerializer(level=5))
    y = zarr.open_array(zarr.storage.LocalStore(tmp_path / "i.zarr"), mode="r")[...]
    assert y.dtype == x.dtype and np.array_equal(x, y)


def test_zarr3_quant_error_is_what_its_chunks_report(tmp_path):
    x = _field(SHAPE, np.float32, seed=4)
    path = tmp_path / "q.zarr"
    _write_v3(path, x, QuantSerializer(bits=8, group=64))
    y = zarr.open_array(zarr.storage.LocalStore(path), mode="r")[...]
    reported = max(tp.info(p.read_bytes())["max_error"] for p in path.rglob("c/*/*/*"))
    assert y.dtype == x.dtype and 0 < np.abs(x.astype(np.float64) - y).max() <= reported


def test_zarr3_refuses_integer_array_for_lossy_codec(tmp_path):
    with pytest.raises(TypeError, match="float16, float32, float64"):
        zarr.create_array(
            zarr.storage.LocalStore(tmp_path / "bad.zarr"),
            shape=(10,),
            chunks=(5,),
            dtype="int32",
            serializer=SZSerializer(abs=1),
            compressors=None,
        )


def test_stages_stay_in_the_zarr_metadata(tmp_path, cube):
    """A codec's zstd stage is part of its config: it reaches the zarr metadata, the
    reopened array's codec has it, and the chunks written are staged streams."""
    stages = [{"id": "zstd", "level": 5, "checksum": False}]
    codec = SZ(abs=0.05, stages=stages)
    assert codec.get_config()["stages"] == stages and codec != SZ(abs=0.05)
    assert numcodecs.get_codec(json.loads(json.dumps(codec.get_config()))) == codec
    a = _write_v3(tmp_path / "s.zarr", cube, SZSerializer(abs=0.05, stages=stages))
    meta = json.loads((tmp_path / "s.zarr" / "zarr.json").read_text())
    assert meta["codecs"][0]["configuration"]["stages"] == stages
    b = zarr.open_array(zarr.storage.LocalStore(tmp_path / "s.zarr"), mode="r")
    assert b.metadata.codecs == a.metadata.codecs == (SZSerializer(abs=0.05, stages=stages),)
    assert b.metadata.codecs != (SZSerializer(abs=0.05),)
    chunk = next(p for p in (tmp_path / "s.zarr" / "c").rglob("*") if p.is_file())
    assert tp.info(chunk.read_bytes())["config"]["stages"] == stages
    _assert_within(cube, b[...], 0.05)


def test_zarr3_serializer_config_round_trip():
    s = SZSerializer(rel=1e-4, predictor="linear", level=7)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["name"] == "tensorpress.sz" and d["configuration"]["rel"] == 1e-4
    assert SZSerializer.from_dict(d) == s and hash(SZSerializer.from_dict(d)) == hash(s)
    assert zarr.registry.get_codec_class("tensorpress.sz") is SZSerializer
    with pytest.raises(ValueError, match="exactly one error bound"):
        SZSerializer.from_dict({"name": "tensorpress.sz"})


# -- zarr format 2 and Dask ---------------------------------------------------------


def test_zarr2_compressor_round_trip(tmp_path, cube):
    path = tmp_path / "v2.zarr"
    a = zarr.create_array(
        zarr.storage.LocalStore(path),
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="float32",
        zarr_format=2,
        compressors=Block(abs=0.02),
        filters=None,
    )
    a[...] = cube
    assert json.loads((path / ".zarray").read_text())["compressor"] == {
        "id": "tensorpress.block",
        "abs": 0.02,
    }
    b = zarr.open_array(zarr.storage.LocalStore(path), mode="r")
    assert b.metadata.zarr_format == 2 and b.metadata.compressor == Block(abs=0.02)
    _assert_within(cube, b[...], 0.02)


def test_dask_writes_and_reads_chunks_in_parallel(tmp_path, cube):
    import dask.array as da

    x = da.from_array(cube, chunks=CHUNKS)
    x.to_zarr(str(tmp_path / "d.zarr"), serializer=SZSerializer(abs=0.05), compressors=None)
    y = da.from_zarr(str(tmp_path / "d.zarr"))
    assert y.chunks == x.chunks
    _assert_within(cube, y.compute(scheduler="threads", num_workers=2), 0.05)
