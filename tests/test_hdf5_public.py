"""The public HDF5 filter name (tensorpress.hdf5), what a tool without the filter sees,
and the filter in DataLoader worker processes started with spawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp
from tensorpress.files import compress_file


def _field(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal(shape), axis=0).astype(dtype)


@pytest.mark.parametrize(
    "kw, check",
    [
        ({"abs": 1e-3}, lambda x, y: np.abs(x - y) <= 1e-3),
        ({"abs": 1e-2, "codec": "block"}, lambda x, y: np.abs(x - y) <= 1e-2),
        ({"pw_rel": 1e-2}, lambda x, y: np.abs(x - y) <= 1e-2 * np.abs(x)),
        ({"rel": 1e-3, "value_range": (-50.0, 50.0)}, lambda x, y: np.abs(x - y) <= 0.1),
    ],
)
def test_public_name_writes_what_h5py_reads(tmp_path, kw, check):
    x = _field((70, 33), np.float64)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("t", data=x, chunks=(16, 16), **tp.hdf5.filter(**kw))
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f["t"].shape == x.shape and f["t"].dtype == x.dtype
        y = f["t"][...]
        assert check(x, y).all()
        np.testing.assert_array_equal(f["t"][20:37, 5:30], y[20:37, 5:30])
    assert tp.hdf5.FILTER_ID == tp.formats.HDF5_FILTER_ID
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f["t"].id.get_create_plist().get_filter(0)[0] == tp.hdf5.FILTER_ID


def test_public_name_refuses_what_a_chunk_cannot_carry():
    with pytest.raises(ValueError, match="value_range"):
        tp.hdf5.filter(rel=1e-3)
    with pytest.raises(ValueError, match="no HDF5 filter"):
        tp.hdf5.filter(codec="bogus")
    with pytest.raises(ValueError, match="takes no error bound"):  # quant: bits, not a bound
        tp.hdf5.filter(codec="quant", abs=1e-3)
    with pytest.raises(TypeError):  # codec parameters have no place in the cd_values
        tp.hdf5.filter(abs=1e-3, predictor="lorenzo")


def test_codec_parameters_are_refused_by_the_filter_layout(tmp_path):
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f["x"] = _field((64, 40))
    with pytest.raises(ValueError, match="default parameters.*--layout stream"):
        compress_file(src, tmp_path / "o.h5", {"abs": 0.1}, codec_options={"level": 9})
    with pytest.raises(ValueError, match="default parameters.*--layout stream"):
        compress_file(src, tmp_path / "o.h5", None, codec="quant", codec_options={"bits": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.h5"]


#: h5py alone, without tensorpress: what any HDF5 tool lacking the filter sees
WITHOUT_FILTER = """
import json, sys
import h5py
h5py._errors.unsilence_errors()  # HDF5's error stack on stderr, as h5dump prints it
with h5py.File(sys.argv[1], "r") as f:
    ds = f["t"]
    fid, _, cd, name = ds.id.get_create_plist().get_filter(0)
    seen = {"shape": ds.shape, "dtype": ds.dtype.str, "chunks": ds.chunks, "id": fid,
            "name": name.decode(), "available": bool(h5py.h5z.filter_avail(fid))}
    try:
        ds[0:2]
        seen["read"] = "values"
    except OSError as exc:
        seen["read"] = str(exc)
print(json.dumps(seen))
"""


def test_a_tool_without_the_filter_sees_the_dataset_and_says_the_filter_is_missing(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=_field((60, 100)), chunks=(16, 100), **tp.hdf5.filter(abs=1))
    plugins = tmp_path / "plugins"  # an empty plugin folder: no filter can come from there
    plugins.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HDF5_PLUGIN_PATH")}
    env["HDF5_PLUGIN_PATH"] = str(plugins)
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_FILTER, str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["shape"] == [60, 100] and seen["dtype"] == "<f4" and seen["chunks"] == [16, 100]
    assert seen["id"] == tp.hdf5.FILTER_ID and not seen["available"]
    assert seen["name"] == "tensorpress: error-bounded lossy (needs: import tensorpress)"
    assert seen["read"] != "values" and "plugin" in seen["read"]  # h5py raises, never zeros
    name = "required filter 'tensorpress: error-bounded lossy (needs: import tensorpress)'"
    assert f"{name} is not registered" in run.stderr


class _RowsThroughTheFilter:
    """Rows of ``path``'s dataset "t" read by h5py, so through HDF5's filter pipeline."""

    def __init__(self, path):
        self.path = str(path)

    def __len__(self):
        with h5py.File(self.path, "r") as f:
            return len(f["t"])

    def __getitem__(self, i):
        with h5py.File(self.path, "r") as f:
            return f["t"][i]


@pytest.mark.slow  # each spawned worker imports torch and tensorpress anew
def test_spawned_dataloader_workers_read_filtered_datasets(tmp_path):
    torch = pytest.importorskip("torch")
    from tensorpress.loaders import H5Dataset

    path = tmp_path / "f.h5"
    x = _field((48, 20))
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=x, chunks=(8, 20), **tp.hdf5.filter(abs=1e-3))
    for dataset in (H5Dataset(path, "t"), _RowsThroughTheFilter(path)):
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=8, num_workers=2, multiprocessing_context="spawn"
        )
        y = torch.cat([torch.as_tensor(b) for b in loader]).numpy()
        assert y.shape == x.shape and np.abs(y - x).max() <= 1e-3
