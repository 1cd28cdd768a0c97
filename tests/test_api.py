"""The public API: inputs, outputs, errors, info, registry."""

import numpy as np
import pytest
import tensorpress as tp
import torch
from tensorpress.compress import get_codec


def _field(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return x.astype(dtype)


def _assert_abs(x, y, tol):
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    fin = np.isfinite(x64)
    assert np.array_equal(np.isnan(x64), np.isnan(y64))
    assert np.array_equal(x64[np.isinf(x64)], y64[np.isinf(x64)])
    assert np.all(np.abs(x64[fin] - y64[fin]) <= tol)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("mode", ["abs", "rel", "pw_rel"])
def test_round_trip(dtype, mode):
    x = _field((20, 30, 10), dtype)
    blob = tp.compress(x, **{mode: 1e-2})
    y = tp.decompress(blob)
    assert y.dtype == x.dtype and y.shape == x.shape
    meta = tp.info(blob)
    tol = meta["bound"]["tolerance"]
    if mode == "pw_rel":
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        assert np.all(np.abs(x64 - y64) <= tol * np.abs(x64))
        assert np.array_equal(np.signbit(x), np.signbit(y))
    else:
        _assert_abs(x, y, tol)


def test_info_fields():
    x = _field((64, 64))
    meta = tp.info(tp.compress(x, rel=1e-3))
    assert meta["codec"] == "sz" and meta["config"]["id"] == "sz"
    assert meta["dtype"] == "float32" and meta["shape"] == (64, 64)
    assert meta["bound"]["mode"] == "rel" and meta["bound"]["value"] == 1e-3
    assert meta["bound"]["tolerance"] == pytest.approx(1e-3 * float(x.max() - x.min()))
    assert meta["original_bytes"] == x.nbytes
    assert meta["ratio"] == pytest.approx(x.nbytes / meta["compressed_bytes"])
    assert meta["format_version"] == 2


def test_torch_input_comes_back_as_numpy():
    t = torch.from_numpy(_field((16, 16)))
    y = tp.decompress(tp.compress(t, abs=1e-2))
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    _assert_abs(t.numpy(), y, 1e-2)
    with pytest.raises(TypeError, match="codec='block'"):  # sz has no bfloat16 path
        tp.compress(t.bfloat16(), abs=1e-2)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64, bool])
def test_integer_input_refused_with_advice(dtype):
    x = np.arange(10).astype(dtype)
    with pytest.raises(TypeError, match="codec='zstd'"):
        tp.compress(x, abs=1)
    y = tp.decompress(tp.compress(x, codec="zstd"))
    assert y.dtype == x.dtype and np.array_equal(x, y)


def test_lossless_codec_takes_no_bound():
    with pytest.raises(ValueError, match="lossless"):
        tp.compress(np.ones(3), codec="zstd", rel=1e-3)


def test_unknown_codec_and_bad_params():
    with pytest.raises(ValueError, match="unknown codec 'nope'"):
        tp.compress(np.ones(3), codec="nope", abs=1)
    with pytest.raises(ValueError, match="predictor"):
        tp.compress(np.ones(3), predictor="magic", abs=1)
    with pytest.raises(ValueError, match="workers"):
        tp.compress(np.ones(3), abs=1, workers=0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        tp.compress(np.ones(3), abs=1, chunk_bytes=0)
    with pytest.raises(TypeError, match="complex"):
        tp.compress(np.ones(3, np.complex64), abs=1)


@pytest.mark.parametrize("name", tp.available_codecs())
def test_config_round_trip(name):
    codec = get_codec(name)
    config = codec.get_config()
    assert config["id"] == name
    assert get_codec(config) == codec
    assert get_codec(config).get_config() == config


def test_layouts_kept():
    base = _field((12, 9, 7), np.float64)
    for x in (
        np.asfortranarray(base),
        base[::2, ::-1, 1:],
        base.transpose(2, 0, 1),
        base.astype(">f8"),
    ):
        y = tp.decompress(tp.compress(x, abs=1e-3))
        assert y.shape == x.shape
        _assert_abs(x, y, 1e-3)
    y = tp.decompress(tp.compress(np.asfortranarray(base), abs=1e-3))
    assert y.flags.f_contiguous


@pytest.mark.parametrize(
    "shape", [(), (0,), (3, 0, 2), (1,), (1, 1, 1), (2, 3, 2, 3, 2), (3, 2, 2, 2, 2, 3)]
)
def test_shapes(shape):
    x = _field(shape, np.float32) if shape else np.float32(3.25)
    x = np.asarray(x)
    y = tp.decompress(tp.compress(x, abs=1e-3))
    assert y.shape == x.shape and y.dtype == x.dtype
    _assert_abs(x, y, 1e-3)


def test_rel_on_constant_is_lossless_and_tiny():
    x = np.full((100, 100), 3.7, np.float32)
    blob = tp.compress(x, rel=1e-3)
    assert tp.info(blob)["bound"]["tolerance"] == 0
    assert np.array_equal(tp.decompress(blob), x)
    assert len(blob) < 600


def test_available_codecs():
    assert {"sz", "zstd"} <= set(tp.available_codecs())


def test_compress_is_also_the_codecs_subpackage():
    import tensorpress.compress.sz as sz

    assert tp.compress.sz.SZCodec is sz.SZCodec
    assert tp.compress.get_codec("sz") == get_codec("sz")
    x = np.linspace(0, 1, 50)
    assert np.abs(tp.decompress(tp.compress(x, abs=0.01)) - x).max() <= 0.01
    assert tp.compress.__doc__ and callable(tp.compress)


def test_public_api_is_small():
    names = "ErrorBound __version__ available_codecs compress decompress get_codec hdf5 info open"
    names += " zarr"
    assert set(tp.__all__) == set(names.split())
    assert all(hasattr(tp, name) for name in tp.__all__)


def test_hdf5_filter_helper_imports_as_a_module():
    import tensorpress.hdf5
    from tensorpress.hdf5 import FILTER_ID, filter  # noqa: A004

    assert tensorpress.hdf5 is tp.hdf5
    # neither BZIP2's 307 (the id it had) nor any other registered or hdf5plugin id
    assert FILTER_ID == tp.formats.HDF5_FILTER_ID and FILTER_ID not in (307, *range(32000, 32034))
    assert filter(abs=1e-3)["compression"] == FILTER_ID


def test_open_reads_a_compressed_file_lazily(tmp_path):
    x = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)
    path = tmp_path / "x.tp"
    path.write_bytes(tp.compress(x, abs=1e-3))
    with tp.open(path) as f:
        (name,) = list(f)
        rows = f[name][10:20]
    assert rows.shape == (10, 16) and np.abs(rows - x[10:20]).max() <= 1e-3


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"alpha": "x", "beta": 2}, "alpha and beta"),
        ({"alpha": 1.5}, "both alpha and beta"),
        ({"level": "fast"}, "zstd level"),
        ({"level": 99}, "zstd level"),
        ({"radius": 1}, "radius"),
    ],
)
def test_bad_sz_parameters_say_what_to_do(params, match):
    with pytest.raises(ValueError, match=match):
        tp.compress(np.ones(3), abs=1, **params)
