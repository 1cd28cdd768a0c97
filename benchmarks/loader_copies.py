"""The compressed copies ``benchmarks/loader.py`` reads in its (c) rows, made once and
cached beside the data file.

- ``h5_copy``: HDF5 through the tensorpress filter, one sample per chunk (what a
  dataset for shuffled loading should be: a miss reads and decodes only its sample),
  written with h5py and ``tp.hdf5.filter`` (the bound ``rel`` resolved against the
  whole dataset's value range).
- ``cli_copy``: ``files.compress_file`` with its defaults (the filter layout keeps the
  input's chunks: here 4 samples, 1 MiB).
- ``zarr_copy``: a zarr v3 store with tensorpress's serializer, one sample per chunk.

Every copy holds ``x`` and the labels ``y``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import h5py
import numpy as np

BLOCK_ROWS = 256  # samples copied per step


def value_range(path: Path) -> tuple[float, float]:
    """(min, max) of ``x`` in ``path``, read in blocks."""
    lo, hi = np.inf, -np.inf
    with h5py.File(path, "r") as f:
        x = f["x"]
        for s in range(0, x.shape[0], BLOCK_ROWS):
            block = x[s : s + BLOCK_ROWS]
            lo, hi = min(lo, float(block.min())), max(hi, float(block.max()))
    return lo, hi


def stored_bytes(path: Path) -> int:
    """Bytes on disk of a file, or of every file under a directory (a zarr store)."""
    if path.is_dir():
        return sum(os.path.getsize(Path(d) / f) for d, _, fs in os.walk(path) for f in fs)
    return path.stat().st_size


def _copy_rows(src: h5py.Dataset, write) -> None:
    for s in range(0, src.shape[0], BLOCK_ROWS):
        write(s, src[s : s + BLOCK_ROWS])


def h5_copy(path: Path, codec: str, rel: float) -> tuple[Path, str]:
    """``path``'s data through the tensorpress HDF5 filter, chunks of one sample."""
    import tensorpress as tp

    out = path.with_name(f"{path.stem}-{codec}-rel{rel:g}-filter1.h5")
    made = ""
    if not out.exists():
        t0 = time.perf_counter()
        tmp = out.with_suffix(".tmp")
        lo, hi = value_range(path)
        with h5py.File(path, "r") as f, h5py.File(tmp, "w") as g:
            x = f["x"]
            opts = tp.hdf5.filter(rel=rel, value_range=(lo, hi), codec=codec)
            d = g.create_dataset("x", x.shape, x.dtype, chunks=(1, *x.shape[1:]), **opts)
            _copy_rows(x, lambda s, b: d.__setitem__(slice(s, s + len(b)), b))
            g.create_dataset("y", data=f["y"][...])
        os.replace(tmp, out)
        made = f", written in {time.perf_counter() - t0:.1f} s"
    return out, f"HDF5 filter, 1 sample per chunk ({codec}, rel {rel:g}){made}"


def cli_copy(path: Path, codec: str, rel: float, chunk_bytes: int) -> tuple[Path, str]:
    """``path`` compressed by ``files.compress_file`` (filter layout, input's chunks)."""
    from tensorpress.files import compress_file, describe_file

    out = path.with_name(f"{path.stem}-{codec}-rel{rel:g}-1.h5")
    made = ""
    if not out.exists():
        t0 = time.perf_counter()
        compress_file(path, out, {"rel": rel}, codec=codec, chunk_bytes=chunk_bytes)
        made = f", written in {time.perf_counter() - t0:.1f} s"
    x = next(d for d in describe_file(out) if d["name"] == "x")
    with h5py.File(out, "r") as f:
        rows = f["x"].chunks[0]
    return (
        out,
        f"compress_file ({codec}, rel {rel:g}), {rows} samples per chunk, {x['ratio']:.2f}x{made}",
    )


def zarr_copy(path: Path, codec: str, rel: float) -> tuple[Path, str]:
    """``path``'s data as a zarr v3 store (``x`` with tensorpress's ``codec`` serializer
    at the absolute bound ``rel`` resolves to, one sample per chunk; ``y`` plain)."""
    import zarr
    from tensorpress.formats.zarr_codecs import SERIALIZERS

    out = path.with_name(f"{path.stem}-{codec}-rel{rel:g}.zarr")
    made = ""
    if not (out / "zarr.json").exists() or not (out / "complete").exists():
        t0 = time.perf_counter()
        lo, hi = value_range(path)
        serializer = SERIALIZERS[f"tensorpress.{codec}"](abs=rel * (hi - lo))
        g = zarr.open_group(out, mode="w")
        with h5py.File(path, "r") as f:
            x = f["x"]
            a = g.create_array(
                "x",
                shape=x.shape,
                dtype=x.dtype,
                chunks=(1, *x.shape[1:]),
                serializer=serializer,
                compressors=None,
            )
            _copy_rows(x, lambda s, b: a.__setitem__(slice(s, s + len(b)), b))
            g.create_array("y", data=f["y"][...])
        (out / "complete").write_text("")
        made = f", written in {time.perf_counter() - t0:.1f} s"
    return out, f"zarr v3, 1 sample per chunk ({codec}, rel {rel:g}){made}"
