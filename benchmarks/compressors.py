"""Compressor benchmark: tensorpress against SZ3, ZFP and lossless baselines.

For every corpus array (see ``corpus.py``) and every value-range-relative bound
``rel`` (absolute bound ``eb = rel * (max - min)``, computed in float64, outside the
timings; every codec, tensorpress included, is given the same absolute bound ``eb``,
so no codec's time includes a pass over the data for its value range) this runs

  tp-sz/1         tensorpress ``codec="sz"``, one worker thread
  tp-sz/all       tensorpress ``codec="sz"``, all cores (``workers=None``)
  tp-block/1      tensorpress ``codec="block"`` (numba), one worker thread
  tp-block/2      tensorpress ``codec="block"`` (numba), two worker threads
  tp-block-z/1    tensorpress ``{"id": "block", "entropy": "zstd"}``: zstd over each chunk's
                  packed blocks where that is smaller (host only), one worker thread
  tp-block-torch  ``compress_tensor``/``decompress_tensor`` (block) on a CPU tensor through
                  the torch ops (CPU tensors otherwise take the numba kernels), one
                  torch thread: the reference for the GPU path, not the fast CPU path
  sz3             SZ3 (pysz) default algorithm (interpolation + Lorenzo), ABS bound eb
  sz3-interp      SZ3 interpolation predictor
  sz3-lorenzo     SZ3 Lorenzo + regression predictors
  zfp             ZFP (zfpy) fixed-accuracy mode, tolerance eb
  quantize+zstd   naive baseline: ``q = rint(x / (2 eb))`` as int32, zstd level 3; decoded
                  as ``q * 2 eb`` in float32, so float rounding can push its error past eb
                  (noted as ``over eb``, not counted as a violation)

and, once per array, the lossless baselines ``zstd-3`` (zstandard level 3 on the raw
bytes) and ``fpzip`` (lossless). ``tp-quant`` adds a table of the bits-bounded
``codec="quant"`` (2, 4 and 8 bits, groups of 128, nearest rounding; no error bound,
so outside the violation accounting). Peers that are not installed are skipped with
a note.

Reported per array: compression ratio, max abs error (float64; ``!! VIOLATION`` when
it exceeds eb), PSNR in dB w.r.t. the value range, compress and decompress speed in
MB/s (1 MB = 1e6 bytes of input, median of ``--repeat`` runs). Then a geometric-mean
summary per codec and bound, tensorpress relative to SZ3 (default algorithm), and
the ``block`` targets (speed and ratio against SZ3 and quantize+zstd).

    python benchmarks/compressors.py                 # full run
    python benchmarks/compressors.py --quick         # smoke run, a few seconds
    python benchmarks/compressors.py --datasets aero,tf_attn_probs --bounds 1e-3
    python benchmarks/compressors.py --markdown --json results.json
    python benchmarks/compressors.py --rate-distortion   # bits at equal PSNR (slow)

``--rate-distortion`` runs, instead of the tables above, a sweep of bounds per array
for ``tp-sz/1``, ``tp-block/1``, ``sz3`` and ``zfp`` (``rate_distortion.py``) and
prints each codec's bits per value over SZ3's at equal PSNR (40-100 dB): per array,
and as geometric means over all, scientific (real + simulated) and dl arrays.
The default run also prints the ``sz`` targets: per bound, ``tp-sz/1`` / SZ3 ratio as
a geometric mean and its minimum over arrays, for all, scientific and dl arrays.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

try:
    from corpus import CATEGORIES, NAMES, load_corpus
except ImportError:  # imported as benchmarks.compressors
    from benchmarks.corpus import CATEGORIES, NAMES, load_corpus

DEFAULT_BOUNDS = (1e-2, 1e-3, 1e-4)
DEFAULT_REPEAT = 5
QUICK_DATASETS = ("aero", "smooth_2d", "kolmogorov_grf")
REFERENCE = "sz3"  # tensorpress is compared against this row
LOSSLESS = "lossless"
CATEGORY_ORDER = ("real", "simulated", "dl")
TP_CODECS = ("tp-sz/1", "tp-sz/all", "tp-block/1", "tp-block/2", "tp-block-z/1", "tp-block-torch")
BLOCK, BLOCK_2T, BLOCK_TORCH = "tp-block/1", "tp-block/2", "tp-block-torch"
BLOCK_Z = "tp-block-z/1"  # block with entropy="zstd": the mode that never loses to BASELINE
BASELINE = "quantize+zstd"
QUANT = "tp-quant"  # the bits-bounded quant table
QUANT_BITS = (2, 4, 8)
QUANT_GROUP = 128
SZ, SZ_TARGETS = "tp-sz/1", {"1e-2": 1.15, "1e-3": 1.25, "1e-4": 1.25}  # ratio / SZ3
SZ_FLOOR = 0.95  # tp-sz/1 ratio / SZ3 on every array
GROUPS = (("all", ("real", "simulated", "dl")), ("science", ("real", "simulated")))
GROUPS += (("dl", ("dl",)),)
OPT_IN = ("tp-sz-wavelet/1", "tp-sz-cdf97/1", "sperr")  # run when --codecs names them
# (sperr: see _sperr_codecs)
RD_CODECS = ("tp-sz/1", "tp-block/1", REFERENCE, "zfp")  # the --rate-distortion sweep
TARGET_SPEED_X = 5.0  # tp-block/1 speed >= 5x SZ3
TARGET_DL_RATIO_X = 0.7  # tp-block/1 ratio >= 0.7x SZ3 on deep-learning arrays


# --------------------------------------------------------------------------- codecs


@dataclass
class Codec:
    name: str
    family: str
    lossy: bool
    encode: Callable[[np.ndarray, float, float], Any]  # (x, rel, eb) -> blob
    decode: Callable[[Any, tuple, np.dtype], np.ndarray]  # (blob, shape, dtype) -> array
    guaranteed: bool = True  # False: an error past eb is noted, not flagged as a violation


def _nbytes(blob: Any) -> int:
    if hasattr(blob, "payload") and hasattr(blob, "lengths"):  # a CompressedTensor
        from tensorpress.formats import tensor_to_stream

        return len(tensor_to_stream(blob))  # its container stream, as tp.compress writes it
    return int(blob.nbytes) if hasattr(blob, "nbytes") else len(blob)


def _tensorpress_codecs(notes: list[str]) -> list[Codec]:
    try:
        import tensorpress as tp
    except ImportError as exc:
        notes.append(f"tensorpress not importable ({exc}): tensorpress rows skipped")
        return []
    if not (hasattr(tp, "compress") and hasattr(tp, "decompress")):
        notes.append(
            "tensorpress.compress/decompress not available in this version: "
            "tensorpress rows skipped"
        )
        return []

    def encode(x, rel, eb, workers, codec):
        return tp.compress(x, abs=eb, codec=codec, workers=workers)

    def decode(blob, shape, dtype, workers):
        return tp.decompress(blob, workers=workers)

    variants = [("sz", "sz/1", 1), ("sz", "sz/all", None)]
    # the opt-in wavelet predictors (sz/wavelet.py, sz/cdf97.py), named by --codecs only
    variants += [({"id": "sz", "predictor": "wavelet"}, "sz-wavelet/1", 1)]
    variants += [({"id": "sz", "predictor": "cdf97"}, "sz-cdf97/1", 1)]
    if "block" in tp.available_codecs():
        z = {"id": "block", "entropy": "zstd"}
        variants += [("block", "block/1", 1), ("block", "block/2", 2), (z, "block-z/1", 1)]
    else:
        notes.append("tensorpress has no 'block' codec: tp-block rows skipped")
    codecs = [
        Codec(
            f"tp-{label}",
            "tensorpress",
            True,
            partial(encode, workers=w, codec=codec),
            partial(decode, workers=w),
        )
        for codec, label, w in variants
    ]
    if "block" in tp.available_codecs():
        codecs += _block_torch_codec(notes)
    return codecs


def _block_torch_codec(notes: list[str]) -> list[Codec]:
    """``tp-block-torch``: the torch path of ``block`` on a CPU tensor, one torch thread."""
    try:
        import torch
        from tensorpress.compress import compress_tensor, decompress_tensor
        from tensorpress.compress.block import codec as block
        from tensorpress.compress.block.kernels import torch_codec as block_torch
    except ImportError as exc:
        notes.append(f"torch tensor path not importable ({exc}): {BLOCK_TORCH} rows skipped")
        return []

    def one_thread(fn, *args, **kwargs):
        """``fn`` with one torch thread and the torch ops (CPU tensors default to numba)."""
        threads, host = torch.get_num_threads(), block.HOST_KERNELS[0]
        torch.set_num_threads(1)
        block.HOST_KERNELS[0] = block_torch
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
            block.HOST_KERNELS[0] = host

    def encode(x, rel, eb):
        return one_thread(compress_tensor, torch.from_numpy(x), codec="block", abs=eb)

    def decode(ct, shape, dtype):
        return one_thread(decompress_tensor, ct).numpy()

    return [Codec(BLOCK_TORCH, "tensorpress", True, encode, decode)]


def _quant_available(notes: list[str]) -> bool:
    """Whether tensorpress has the ``quant`` codec (it is skipped with a note if not)."""
    try:
        import tensorpress as tp

        if "quant" in tp.available_codecs():
            return True
    except Exception as exc:  # noqa: BLE001 - any failure just skips the quant table
        notes.append(f"tensorpress quant codec unavailable ({exc}): {QUANT} table skipped")
        return False
    notes.append(f"tensorpress has no 'quant' codec: {QUANT} table skipped")
    return False


def _sz3_codecs(notes: list[str]) -> list[Codec]:
    try:
        import pysz
    except ImportError:
        notes.append("pysz not installed: SZ3 rows skipped")
        return []

    def encode(x, rel, eb, algo):
        conf = pysz.szConfig(x.shape)
        conf.cmprAlgo = algo
        # The default mode is ABS with absErrorBound = 1e-3, whatever relErrorBound says:
        # set the mode and the bound explicitly.
        conf.errorBoundMode = pysz.szErrorBoundMode.ABS
        conf.absErrorBound = eb
        blob, _ratio = pysz.sz.compress(x, conf)
        return blob  # a uint8 view of exactly the compressed bytes

    def decode(blob, shape, dtype):
        out, _conf = pysz.sz.decompress(blob, dtype, shape)
        return out

    algos = pysz.szAlgorithm
    return [
        Codec(name, "sz3", True, partial(encode, algo=algo), decode)
        for name, algo in (
            ("sz3", algos.INTERP_LORENZO),
            ("sz3-interp", algos.INTERP),
            ("sz3-lorenzo", algos.LORENZO_REG),
        )
    ]


def _zfp_codecs(notes: list[str]) -> list[Codec]:
    try:
        import zfpy
    except ImportError:
        notes.append("zfpy not installed: ZFP rows skipped")
        return []

    def encode(x, rel, eb):
        return zfpy.compress_numpy(x, tolerance=eb)

    def decode(blob, shape, dtype):
        return zfpy.decompress_numpy(blob)

    return [Codec("zfp", "zfp", True, encode, decode)]


def _sperr_codecs(notes: list[str]) -> list[Codec]:
    """SPERR (wavelet, SPECK coding, outlier correction) at a point-wise bound. Its
    float32 output can land an ulp past the bound (flagged): opt-in, so that the default
    run's exit status stays tensorpress's."""
    try:
        from numcodecs_wasm_sperr import Sperr
    except ImportError:
        notes.append("numcodecs-wasm-sperr not installed: SPERR rows skipped")
        return []

    def encode(x, rel, eb):
        return Sperr(mode="pwe", pwe=eb).encode(np.ascontiguousarray(x))

    def decode(blob, shape, dtype):
        return np.asarray(Sperr(mode="pwe", pwe=1.0).decode(blob)).reshape(shape)

    return [Codec("sperr", "sperr", True, encode, decode)]


def _lossless_codecs(notes: list[str]) -> list[Codec]:
    codecs = []
    try:
        import zstandard
    except ImportError:
        notes.append("zstandard not installed: zstd rows skipped")
    else:
        cctx = zstandard.ZstdCompressor(level=3)
        dctx = zstandard.ZstdDecompressor()

        def zstd_decode(blob, shape, dtype):
            return np.frombuffer(dctx.decompress(blob), dtype=dtype).reshape(shape)

        codecs.append(
            Codec("zstd-3", "zstd", False, lambda x, rel, eb: cctx.compress(x), zstd_decode)
        )
        codecs.append(_baseline_codec(cctx, dctx))
    try:
        import fpzip
    except ImportError:
        notes.append("fpzip not installed: fpzip rows skipped")
    else:

        def fpzip_decode(blob, shape, dtype):
            # fpzip always hands back a 4-d array (leading axes of length 1).
            return fpzip.decompress(blob, order="C").reshape(shape)

        codecs.append(
            Codec(
                "fpzip",
                "fpzip",
                False,
                lambda x, rel, eb: fpzip.compress(x, precision=0, order="C"),
                fpzip_decode,
            )
        )
    return codecs


def _baseline_codec(cctx, dctx) -> Codec:
    """``quantize+zstd``: ``rint(x / (2 eb))`` as int32, zstd; the step leads the stream."""

    def encode(x, rel, eb):
        step = 2.0 * eb
        q = np.rint(x / step).astype(np.int32)
        return struct.pack("<d", step) + cctx.compress(q)

    def decode(blob, shape, dtype):
        (step,) = struct.unpack_from("<d", blob)
        q = np.frombuffer(dctx.decompress(memoryview(blob)[8:]), dtype=np.int32)
        return (q.astype(np.float32) * np.float32(step)).reshape(shape)

    return Codec(BASELINE, "baseline", True, encode, decode, guaranteed=False)


def make_codecs(notes: list[str]) -> list[Codec]:
    return (
        _tensorpress_codecs(notes)
        + _sz3_codecs(notes)
        + _zfp_codecs(notes)
        + _sperr_codecs(notes)
        + _lossless_codecs(notes)
    )


# --------------------------------------------------------------------------- measuring


def _bound_label(rel: float | None) -> str:
    if rel is None:
        return LOSSLESS
    mantissa, exponent = f"{rel:.6e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


_warmed: set[tuple[str, str, int, str]] = set()


def _warm_up(codec: Codec, name: str, x: np.ndarray, rel: float | None, eb: float | None) -> None:
    """Run the codec once, untimed, on a small crop of ``x`` at the same bound.

    Takes just-in-time compilation, lazy imports and first-touch allocations out of
    the timings (they matter most with ``--repeat 1``).
    """
    key = (codec.name, name, x.ndim, _bound_label(rel))
    if key in _warmed:
        return
    _warmed.add(key)
    shape = list(x.shape)
    while math.prod(shape) > 1 << 16:
        axis = shape.index(max(shape))
        shape[axis] = max(1, shape[axis] // 2)
    crop = np.ascontiguousarray(x[tuple(slice(0, n) for n in shape)])
    try:
        codec.decode(codec.encode(crop, rel, eb), crop.shape, crop.dtype)
    except Exception:  # noqa: BLE001 - the measured run reports the failure
        pass


def measure(codec: Codec, name: str, x: np.ndarray, rel: float | None, repeat: int) -> dict:
    """Compress and decompress ``x`` ``repeat`` times each; return one result record."""
    lo, hi = float(x.min()), float(x.max())
    value_range = hi - lo
    eb = None if rel is None else rel * value_range
    rec: dict[str, Any] = {
        "dataset": name,
        "category": CATEGORIES.get(name, "?"),
        "shape": list(x.shape),
        "mb": x.nbytes / 1e6,
        "codec": codec.name,
        "family": codec.family,
        "bound": _bound_label(rel),
        "rel": rel,
        "abs_bound": eb,
        "flags": [],
        "notes": [],
    }
    _warm_up(codec, name, x, rel, eb)
    try:
        blob, ctimes = None, []
        for _ in range(repeat):
            blob = None
            t0 = time.perf_counter()
            blob = codec.encode(x, rel, eb)
            ctimes.append(time.perf_counter() - t0)
        size = _nbytes(blob)
        y, dtimes = None, []
        for _ in range(repeat):
            y = None
            t0 = time.perf_counter()
            y = codec.decode(blob, x.shape, x.dtype)
            dtimes.append(time.perf_counter() - t0)
        del blob
    except Exception as exc:  # noqa: BLE001 - one failing codec must not stop the run
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["flags"].append("FAILED")
        return rec

    y = np.asarray(y)
    rec["compressed_bytes"] = size
    rec["ratio"] = x.nbytes / size
    rec["compress_mbs"] = x.nbytes / 1e6 / statistics.median(ctimes)
    rec["decompress_mbs"] = x.nbytes / 1e6 / statistics.median(dtimes)
    if y.shape != x.shape:
        rec["flags"].append(f"SHAPE {y.shape}")
        return rec
    if y.dtype != x.dtype:
        rec["flags"].append(f"DTYPE {y.dtype}")
    diff = np.abs(y.astype(np.float64) - x.astype(np.float64))
    max_err = float(diff.max())
    mse = float(np.mean(np.square(diff)))
    rec["max_abs_err"] = max_err
    rec["psnr_db"] = (
        20 * math.log10(value_range) - 10 * math.log10(mse) if mse > 0 and value_range > 0 else None
    )
    if rel is None:
        exact = y.dtype == x.dtype and np.array_equal(
            y.view(np.uint8).reshape(-1), x.view(np.uint8).reshape(-1)
        )
        if not exact:
            rec["flags"].append("NOT LOSSLESS")
    else:
        rec["err_over_bound"] = max_err / eb if eb > 0 else None
        if not max_err <= eb:  # also catches NaN
            if codec.guaranteed:
                rec["flags"].append("VIOLATION")
            else:
                rec["notes"].append("over eb (baseline, no guarantee)")
    return rec


def _reported_max_error(blob) -> float:
    """The max abs error a quant stream records (``tp.info`` or its chunk payloads)."""
    import tensorpress as tp
    from tensorpress.compress import get_codec
    from tensorpress.formats import read_header

    reported = tp.info(blob).get("max_error")
    if reported is not None:
        return float(reported)
    mv = memoryview(blob)
    h = read_header(mv)
    codec = get_codec(h.codec)
    return max(
        (codec.payload_max_error(mv[o : o + n]) for o, n in zip(h.offsets, h.lengths, strict=True)),
        default=0.0,
    )


def measure_quant(name: str, x: np.ndarray, bits: int, repeat: int) -> dict:
    """One ``quant`` record (one worker thread): ratio, reported and measured max error."""
    import tensorpress as tp

    params = {"codec": "quant", "bits": bits, "group": QUANT_GROUP, "stochastic": False}
    rec: dict[str, Any] = {
        "dataset": name,
        "category": CATEGORIES.get(name, "?"),
        "shape": list(x.shape),
        "mb": x.nbytes / 1e6,
        "codec": QUANT,
        "bits": bits,
        "group": QUANT_GROUP,
        "flags": [],
    }
    try:
        tp.decompress(tp.compress(x.reshape(-1)[: 1 << 16], workers=1, **params), workers=1)
        ctimes, dtimes = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            blob = tp.compress(x, workers=1, **params)
            ctimes.append(time.perf_counter() - t0)
        for _ in range(repeat):
            t0 = time.perf_counter()
            y = tp.decompress(blob, workers=1)
            dtimes.append(time.perf_counter() - t0)
        reported = _reported_max_error(blob)
    except Exception as exc:  # noqa: BLE001 - one failing case must not stop the run
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["flags"].append("FAILED")
        return rec
    rec["compressed_bytes"] = len(blob)
    rec["ratio"] = x.nbytes / len(blob)
    rec["compress_mbs"] = x.nbytes / 1e6 / statistics.median(ctimes)
    rec["decompress_mbs"] = x.nbytes / 1e6 / statistics.median(dtimes)
    if y.shape != x.shape or y.dtype != x.dtype:
        rec["flags"].append(f"SHAPE/DTYPE {y.shape} {y.dtype}")
        return rec
    measured = float(np.abs(y.astype(np.float64) - x.astype(np.float64)).max())
    rec["reported_max_err"] = reported
    rec["max_abs_err"] = measured
    if not measured <= reported:  # also catches NaN
        rec["flags"].append("ERR > REPORTED")
    return rec


# --------------------------------------------------------------------------- printing


def fmt_cell(value: float | None, spec: str, suffix: str = "", na: str = "-") -> str:
    """``value`` formatted for a table cell; ``na`` when it is None."""
    return na if value is None else format(value, spec) + suffix


def ratio_or_none(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing (or ``b`` is 0)."""
    return None if a is None or not b else a / b


class Table:
    """A streaming text table: aligned columns, or Markdown with ``markdown=True``."""

    def __init__(self, title: str, columns: Sequence[tuple[str, int, str]], markdown: bool):
        self.title = title
        self.columns = [(head, max(width, len(head)), align) for head, width, align in columns]
        self.markdown = markdown

    def _line(self, cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if align == ">" else cell.ljust(width)
            for cell, (_, width, align) in zip(cells, self.columns, strict=True)
        ]
        return f"| {' | '.join(parts)} |" if self.markdown else "  ".join(parts).rstrip()

    def header(self) -> None:
        if self.markdown:
            print(f"\n### {self.title}\n")
            print(self._line([head for head, _, _ in self.columns]))
            rules = [
                "-" * (width - 1) + (":" if align == ">" else "-")
                for _, width, align in self.columns
            ]
            print(f"| {' | '.join(rules)} |")
        else:
            print(f"\n== {self.title} ==")
            print(self._line([head for head, _, _ in self.columns]))
            print(self._line(["-" * width for _, width, _ in self.columns]))
        sys.stdout.flush()

    def row(self, *cells: str) -> None:
        print(self._line(cells), flush=True)


def _f(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return format(value, spec)


def _flag_text(rec: dict) -> str:
    text = ("!! " + ", ".join(rec["flags"])) if rec["flags"] else ""
    notes = ", ".join(rec.get("notes", ()))
    return f"{text}; {notes}" if text and notes else text or notes


def _row_cells(rec: dict, lossy: bool) -> list[str]:
    if "error" in rec:
        blanks = ["-"] * (6 if lossy else 3)
        return [rec["dataset"], rec["codec"], *blanks, f"!! {rec['error']}"]
    speed = [_f(rec["compress_mbs"], ".1f"), _f(rec["decompress_mbs"], ".1f")]
    if not lossy:
        return [rec["dataset"], rec["codec"], _f(rec["ratio"], ".3f"), *speed, _flag_text(rec)]
    return [
        rec["dataset"],
        rec["codec"],
        _f(rec["ratio"], ".2f"),
        _f(rec.get("max_abs_err"), ".3g"),
        _f(rec.get("err_over_bound"), ".3f"),
        "inf" if rec.get("max_abs_err") == 0 else _f(rec.get("psnr_db"), ".1f"),
        *speed,
        _flag_text(rec),
    ]


def _dataset_table(
    title: str, lossy: bool, name_width: int, markdown: bool, codec_width: int = 11
) -> Table:
    cols = [("dataset", name_width, "<"), ("codec", codec_width, "<"), ("ratio", 7, ">")]
    if lossy:
        cols += [("max err", 9, ">"), ("err/eb", 6, ">"), ("PSNR dB", 7, ">")]
    cols += [("comp MB/s", 9, ">"), ("dec MB/s", 8, ">"), ("flag", 4, "<")]
    return Table(title, cols, markdown)


def _geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(records: list[dict], codec_order: list[str], bound_order: list[str]) -> list[dict]:
    rows = []
    for bound in bound_order:
        for codec in codec_order:
            recs = [r for r in records if r["codec"] == codec and r["bound"] == bound]
            if not recs:
                continue
            ok = [r for r in recs if "error" not in r]
            psnrs = [r["psnr_db"] for r in ok if r.get("psnr_db") is not None]
            errs = [r["err_over_bound"] for r in ok if r.get("err_over_bound") is not None]
            row = {
                "codec": codec,
                "bound": bound,
                "n": len(ok),
                "failed": len(recs) - len(ok),
                "ratio": _geomean([r["ratio"] for r in ok]),
                "compress_mbs": _geomean([r["compress_mbs"] for r in ok]),
                "decompress_mbs": _geomean([r["decompress_mbs"] for r in ok]),
                "psnr_db_mean": statistics.fmean(psnrs) if psnrs else None,
                "worst_err_over_bound": max(errs) if errs else None,
                "flagged": sum(1 for r in recs if r["flags"]),
                "over_eb_noted": sum(1 for r in recs if r.get("notes")),
            }
            for cat in CATEGORY_ORDER:
                row[f"ratio_{cat}"] = _geomean([r["ratio"] for r in ok if r["category"] == cat])
            rows.append(row)
    return rows


def compare_to_reference(records: list[dict], bounds: list[str]) -> list[dict]:
    """Geometric means of tensorpress / SZ3 per dataset (datasets where both ran)."""
    ref = {
        (r["dataset"], r["bound"]): r
        for r in records
        if r["codec"] == REFERENCE and "error" not in r
    }
    rows = []
    for bound in bounds:
        for codec in TP_CODECS:
            pairs = [
                (r, ref[(r["dataset"], bound)])
                for r in records
                if r["codec"] == codec
                and r["bound"] == bound
                and "error" not in r
                and (r["dataset"], bound) in ref
            ]
            if not pairs:
                continue
            rows.append(
                {
                    "codec": codec,
                    "bound": bound,
                    "n": len(pairs),
                    "ratio": _geomean([a["ratio"] / b["ratio"] for a, b in pairs]),
                    "compress_speed": _geomean(
                        [a["compress_mbs"] / b["compress_mbs"] for a, b in pairs]
                    ),
                    "decompress_speed": _geomean(
                        [a["decompress_mbs"] / b["decompress_mbs"] for a, b in pairs]
                    ),
                }
            )
    return rows


def _ratios(records: list[dict], bound: str, codec: str, other: str, key: str) -> list[float]:
    """Per-dataset ``codec[key] / other[key]`` at ``bound`` (datasets where both ran)."""
    ok = {
        (r["codec"], r["dataset"]): r[key]
        for r in records
        if r["bound"] == bound and "error" not in r and r.get(key)
    }
    return [v / ok[(other, d)] for (c, d), v in ok.items() if c == codec and (other, d) in ok]


def block_targets(records: list[dict], bounds: list[str]) -> list[dict]:
    """Per bound: ``tp-block/1`` against SZ3, ``quantize+zstd``, two threads and torch."""
    rows = []
    for bound in bounds:
        at = {
            (r["codec"], r["dataset"]): r
            for r in records
            if r["bound"] == bound and "error" not in r
        }
        datasets = [d for c, d in at if c == BLOCK]
        if not datasets:
            continue
        dl = [d for d in datasets if CATEGORIES.get(d) == "dl"]

        def geo(other, key, names, at=at):
            pairs = [(at[(BLOCK, d)], at.get((other, d))) for d in names]
            return _geomean([a[key] / b[key] for a, b in pairs if b is not None])

        row = {
            "bound": bound,
            "n": len(datasets),
            "n_dl": len(dl),
            "compress_speed_vs_sz3": geo(REFERENCE, "compress_mbs", datasets),
            "decompress_speed_vs_sz3": geo(REFERENCE, "decompress_mbs", datasets),
            "ratio_vs_sz3_dl": geo(REFERENCE, "ratio", dl),
            "ratio_vs_sz3_all": geo(REFERENCE, "ratio", datasets),
            "compress_speedup_2t": _geomean(
                [1 / v for v in _ratios(records, bound, BLOCK, BLOCK_2T, "compress_mbs")]
            ),
            "decompress_speedup_2t": _geomean(
                [1 / v for v in _ratios(records, bound, BLOCK, BLOCK_2T, "decompress_mbs")]
            ),
            "torch_compress_fraction": _geomean(
                [1 / v for v in _ratios(records, bound, BLOCK, BLOCK_TORCH, "compress_mbs")]
            ),
            "torch_decompress_fraction": _geomean(
                [1 / v for v in _ratios(records, bound, BLOCK, BLOCK_TORCH, "decompress_mbs")]
            ),
        }
        row.update(_vs_baseline(at, BLOCK, datasets, ""))
        if any((BLOCK_Z, d) in at for d in datasets):
            zd = [d for d in datasets if (BLOCK_Z, d) in at]
            row.update(_vs_baseline(at, BLOCK_Z, zd, "z_"))
            for key in ("compress_mbs", "decompress_mbs", "ratio"):
                pairs = [(at[(BLOCK_Z, d)], at.get((REFERENCE, d))) for d in zd]
                row[f"z_{key}_vs_sz3"] = _geomean([a[key] / b[key] for a, b in pairs if b])
        rows.append(row)
    return rows


def _vs_baseline(at: dict, codec: str, datasets: list[str], prefix: str) -> dict:
    """How many arrays ``codec`` compresses at least as well as ``BASELINE`` (ratio >=),
    and the others."""
    vs_base = [(d, at[(codec, d)]["ratio"], at.get((BASELINE, d))) for d in datasets]
    vs_base = [(d, a, b["ratio"]) for d, a, b in vs_base if b is not None]
    return {
        f"{prefix}baseline_n": len(vs_base),
        f"{prefix}beats_baseline": sum(1 for _, a, b in vs_base if a >= b),
        f"{prefix}not_beating_baseline": [
            {"dataset": d, "tp_block_ratio": a, "baseline_ratio": b}
            for d, a, b in vs_base
            if not a >= b
        ],
    }


def _print_block_targets(rows: list[dict], markdown: bool) -> None:
    table = Table(
        f"block targets: {BLOCK} (one thread, median of the repeats) against {REFERENCE}, "
        f"{BASELINE}, {BLOCK_2T} and {BLOCK_TORCH}; geometric means over arrays",
        [
            ("bound", 6, "<"),
            ("measure", 50, "<"),
            ("value", 8, ">"),
            ("target", 7, "<"),
            ("met", 3, "<"),
        ],
        markdown,
    )
    table.header()

    def line(bound, what, value, spec, target=None, need=None):
        met = "-" if need is None or value is None else ("yes" if value >= need else "NO")
        table.row(bound, what, _f(value, spec), target or "-", met)

    for r in rows:
        b = r["bound"]
        speed = (f">= {TARGET_SPEED_X:g}x", TARGET_SPEED_X)
        line(b, f"compress speed / {REFERENCE}", r["compress_speed_vs_sz3"], ".2f", *speed)
        line(b, f"decompress speed / {REFERENCE}", r["decompress_speed_vs_sz3"], ".2f", *speed)
        line(
            b,
            f"ratio / {REFERENCE}, deep-learning arrays (n={r['n_dl']})",
            r["ratio_vs_sz3_dl"],
            ".3f",
            f">= {TARGET_DL_RATIO_X:g}x",
            TARGET_DL_RATIO_X,
        )
        line(b, f"ratio / {REFERENCE}, all arrays (n={r['n']})", r["ratio_vs_sz3_all"], ".3f")
        if r["baseline_n"]:
            met = "yes" if r["beats_baseline"] == r["baseline_n"] else "NO"
            table.row(
                b,
                f"arrays where ratio >= {BASELINE}",
                f"{r['beats_baseline']}/{r['baseline_n']}",
                "all",
                met,
            )
        else:
            table.row(b, f"arrays where ratio >= {BASELINE}", "-", "all", "-")
        _print_block_z_targets(r, line, table)
        line(b, f"compress speed {BLOCK_2T} / {BLOCK}", r["compress_speedup_2t"], ".2f")
        line(b, f"decompress speed {BLOCK_2T} / {BLOCK}", r["decompress_speedup_2t"], ".2f")
        line(b, f"compress speed {BLOCK_TORCH} / {BLOCK}", r["torch_compress_fraction"], ".3f")
        line(b, f"decompress speed {BLOCK_TORCH} / {BLOCK}", r["torch_decompress_fraction"], ".3f")
    for r in rows:
        for codec, prefix in ((BLOCK, ""), (BLOCK_Z, "z_")):
            if not r.get(f"{prefix}not_beating_baseline"):
                continue
            print(f"\n{codec} does not reach {BASELINE} at rel = {r['bound']} on:\n")
            for m in r[f"{prefix}not_beating_baseline"]:
                print(
                    f"{'- ' if markdown else '  '}{m['dataset']}: {codec} ratio "
                    f"{m['tp_block_ratio']:.2f}, {BASELINE} ratio {m['baseline_ratio']:.2f}"
                )
    sys.stdout.flush()


def _print_block_z_targets(r: dict, line, table) -> None:
    """The ``tp-block-z/1`` lines of the block targets: speed against SZ3, and never
    fewer bytes than ``quantize+zstd``."""
    if "z_baseline_n" not in r:
        return
    b, speed = r["bound"], (f">= {TARGET_SPEED_X:g}x", TARGET_SPEED_X)
    line(b, f"{BLOCK_Z} compress speed / {REFERENCE}", r["z_compress_mbs_vs_sz3"], ".2f", *speed)
    line(b, f"{BLOCK_Z} decompress speed / {REFERENCE}", r["z_decompress_mbs_vs_sz3"], ".2f")
    line(b, f"{BLOCK_Z} ratio / {REFERENCE}, all arrays", r["z_ratio_vs_sz3"], ".3f")
    n, k = r["z_baseline_n"], r["z_beats_baseline"]
    met = "-" if not n else ("yes" if k == n else "NO")
    table.row(b, f"{BLOCK_Z} arrays where ratio >= {BASELINE}", f"{k}/{n}", "all", met)


def _quant_table(name_width: int, markdown: bool) -> Table:
    return Table(
        f"quant (bits-bounded, no error bound): group {QUANT_GROUP}, nearest rounding, "
        "one worker; max error as the stream reports it and as measured",
        [
            ("dataset", name_width, "<"),
            ("bits", 4, ">"),
            ("ratio", 7, ">"),
            ("reported err", 12, ">"),
            ("measured err", 12, ">"),
            ("meas/rep", 8, ">"),
            ("comp MB/s", 9, ">"),
            ("dec MB/s", 8, ">"),
            ("flag", 4, "<"),
        ],
        markdown,
    )


def _quant_cells(r: dict) -> list[str]:
    if "error" in r:
        return [r["dataset"], str(r["bits"]), *["-"] * 6, f"!! {r['error']}"]
    rep, meas = r.get("reported_max_err"), r.get("max_abs_err")
    return [
        r["dataset"],
        str(r["bits"]),
        _f(r["ratio"], ".2f"),
        _f(rep, ".4g"),
        _f(meas, ".4g"),
        _f(meas / rep if rep and meas is not None else None, ".3f"),
        _f(r["compress_mbs"], ".1f"),
        _f(r["decompress_mbs"], ".1f"),
        _flag_text(r),
    ]


# --------------------------------------------------------------------------- main


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for module in ("tensorpress", "pysz", "zfpy", "fpzip", "zstandard"):
        try:
            from importlib.metadata import version

            out[module] = version(module)
        except Exception:  # noqa: BLE001 - not installed
            out[module] = "not installed"
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark tensorpress against SZ3, ZFP, zstd and fpzip on the corpus."
    )
    p.add_argument(
        "--quick", action="store_true", help=f"smoke run: {', '.join(QUICK_DATASETS)}, 1 repetition"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed runs per measurement, median reported "
        f"(default {DEFAULT_REPEAT}; 1 with --quick)",
    )
    p.add_argument(
        "--datasets", default=None, help=f"comma-separated subset of: {', '.join(NAMES)}"
    )
    p.add_argument(
        "--bounds",
        default=None,
        help="comma-separated value-range-relative bounds (default 1e-2,1e-3,1e-4)",
    )
    p.add_argument(
        "--codecs",
        default=None,
        help="comma-separated subset of codec names (default: all available)",
    )
    p.add_argument(
        "--rate-distortion",
        action="store_true",
        help="sweep bounds per array instead (tp-sz/1, tp-block/1, sz3, zfp unless "
        "--codecs says otherwise) and print bits per value / SZ3's at equal PSNR",
    )
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    p.add_argument(
        "--json", metavar="PATH", default=None, help="also write all results to PATH as JSON"
    )
    args = p.parse_args(argv)
    if args.datasets:
        args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
        unknown = [d for d in args.datasets if d not in NAMES]
        if unknown:
            p.error(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    else:
        args.datasets = list(QUICK_DATASETS) if args.quick else list(NAMES)
    try:
        args.bounds = (
            [float(b) for b in args.bounds.split(",") if b.strip()]
            if args.bounds
            else list(DEFAULT_BOUNDS)
        )
    except ValueError:
        p.error(f"--bounds must be comma-separated numbers, got {args.bounds!r}")
    if any(not (0 < b < 1) for b in args.bounds):
        p.error("--bounds must lie in (0, 1)")
    if args.repeat is None:
        args.repeat = 1 if args.quick else DEFAULT_REPEAT
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.codecs:
        args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    return args


def _select_codecs(args, notes: list[str]) -> tuple[list[Codec], bool]:
    """The codecs ``--codecs`` names (all available by default), and whether the quant
    table runs."""
    codecs = make_codecs(notes)
    run_quant = (not args.codecs or QUANT in args.codecs) and _quant_available(notes)
    wanted = args.codecs or (RD_CODECS if args.rate_distortion else None)
    if not wanted:
        codecs = [c for c in codecs if c.name not in OPT_IN]
    if wanted:
        known = {c.name for c in codecs} | {QUANT}
        for name in args.codecs or ():
            if name not in known:
                notes.append(f"codec {name!r} is unknown or not available: skipped")
        codecs = [c for c in codecs if c.name in wanted]
    return codecs, run_quant and not args.rate_distortion


def _print_preamble(args, corpus: dict, notes: list[str], versions: dict) -> None:
    total_mb = sum(x.nbytes for x in corpus.values()) / 1e6
    print("Compressor benchmark (float32 arrays; MB = 1e6 bytes of input)")
    what = (
        "a sweep of bounds per codec (rate-distortion)"
        if args.rate_distortion
        else f"bounds rel = {', '.join(_bound_label(b) for b in args.bounds)} of the value "
        f"range; median of {args.repeat} run(s); {os.cpu_count()} cores for tp-sz/all; "
        f"{BLOCK_TORCH} on one torch thread"
    )
    print(f"{len(corpus)} datasets, {total_mb:.1f} MB; {what}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    for note in notes:
        print(f"note: {note}")
    sys.stdout.flush()


def run_tables(corpus: dict, codecs: list[Codec], args, widths: tuple[int, int]) -> list[dict]:
    """The per-array tables: lossless baselines once, then each lossy codec per bound."""
    name_width, codec_width = widths
    records: list[dict] = []
    lossless = [c for c in codecs if not c.lossy]
    lossy = [c for c in codecs if c.lossy]
    runs = [(None, lossless, "lossless baselines")] if lossless else []
    if lossy:
        runs += [
            (rel, lossy, f"rel = {_bound_label(rel)} (eb = rel * value range)")
            for rel in args.bounds
        ]
    for rel, group, title in runs:
        table = _dataset_table(title, rel is not None, name_width, args.markdown, codec_width)
        table.header()
        for name, x in corpus.items():
            for codec in group:
                rec = measure(codec, name, x, rel, args.repeat)
                records.append(rec)
                table.row(*_row_cells(rec, rel is not None))
    return records


def run_quant_table(corpus: dict, name_width: int, args) -> list[dict]:
    table = _quant_table(name_width, args.markdown)
    table.header()
    records = []
    for name, x in corpus.items():
        for bits in QUANT_BITS:
            rec = measure_quant(name, x, bits, args.repeat)
            records.append(rec)
            table.row(*_quant_cells(rec))
    return records


def _print_summary(summary: list[dict], codec_width: int, md: bool) -> None:
    table = Table(
        "geometric means over datasets (ratio per category: real / simulated / dl)",
        [
            ("codec", codec_width, "<"),
            ("bound", 8, "<"),
            ("n", 2, ">"),
            ("ratio", 7, ">"),
            ("real", 7, ">"),
            ("sim", 7, ">"),
            ("dl", 7, ">"),
            ("comp MB/s", 9, ">"),
            ("dec MB/s", 8, ">"),
            ("mean PSNR", 9, ">"),
            ("worst err/eb", 12, ">"),
            ("flagged", 7, ">"),
        ],
        md,
    )
    table.header()
    for row in summary:
        flagged = str(row["flagged"]) + (" !!" if row["flagged"] else "")
        if row["over_eb_noted"]:
            flagged += f" ({row['over_eb_noted']} over eb, no guarantee)"
        table.row(
            row["codec"],
            row["bound"],
            str(row["n"]),
            _f(row["ratio"], ".2f"),
            *(_f(row[f"ratio_{cat}"], ".2f") for cat in CATEGORY_ORDER),
            _f(row["compress_mbs"], ".1f"),
            _f(row["decompress_mbs"], ".1f"),
            _f(row["psnr_db_mean"], ".1f"),
            _f(row["worst_err_over_bound"], ".3f"),
            flagged,
        )


def _print_comparison(comparison: list[dict], codec_width: int, md: bool) -> None:
    if not comparison:
        print(f"\n(no tensorpress / {REFERENCE} comparison: one of them did not run)")
        return
    table = Table(
        f"tensorpress / SZ3 ({REFERENCE}, default algorithm): "
        "geometric means of per-dataset ratios",
        [
            ("codec", codec_width, "<"),
            ("bound", 6, "<"),
            ("n", 2, ">"),
            ("ratio x", 7, ">"),
            ("comp speed x", 12, ">"),
            ("dec speed x", 11, ">"),
        ],
        md,
    )
    table.header()
    for row in comparison:
        table.row(
            row["codec"],
            row["bound"],
            str(row["n"]),
            _f(row["ratio"], ".3f"),
            _f(row["compress_speed"], ".3f"),
            _f(row["decompress_speed"], ".3f"),
        )


def sz_targets(records: list[dict], bounds: list[str]) -> list[dict]:
    """Per bound and group of arrays: ``tp-sz/1`` ratio / SZ3's, geometric mean and
    minimum (with its array)."""
    rows = []
    for bound in bounds:
        for group, cats in GROUPS:
            pairs = [
                (d, v)
                for d, v in _ratio_pairs(records, bound, SZ, REFERENCE)
                if CATEGORIES.get(d) in cats
            ]
            if not pairs:
                continue
            worst = min(pairs, key=lambda p: p[1])
            rows.append(
                {
                    "bound": bound,
                    "group": group,
                    "n": len(pairs),
                    "geomean": _geomean([v for _, v in pairs]),
                    "min": worst[1],
                    "min_dataset": worst[0],
                    "target": SZ_TARGETS.get(bound),
                }
            )
    return rows


def _ratio_pairs(records: list[dict], bound: str, codec: str, other: str) -> list[tuple]:
    """``[(dataset, codec ratio / other ratio)]`` at ``bound`` where both ran."""
    at = {
        (r["codec"], r["dataset"]): r["ratio"]
        for r in records
        if r["bound"] == bound and "error" not in r and r.get("ratio")
    }
    return [(d, v / at[(other, d)]) for (c, d), v in at.items() if c == codec and (other, d) in at]


def _print_sz_targets(rows: list[dict], md: bool) -> None:
    table = Table(
        f"sz targets: {SZ} ratio / {REFERENCE} ratio per array, geometric mean and minimum "
        f"(target: geomean as listed, every array >= {SZ_FLOOR:g}x)",
        [
            ("bound", 6, "<"),
            ("arrays", 7, "<"),
            ("n", 2, ">"),
            ("geomean", 7, ">"),
            ("target", 6, ">"),
            ("min", 5, ">"),
            ("min on", 17, "<"),
            ("met", 3, "<"),
        ],
        md,
    )
    table.header()
    for r in rows:
        target = r["target"]
        ok = r["min"] >= SZ_FLOOR and (target is None or r["geomean"] >= target)
        table.row(
            r["bound"],
            r["group"],
            str(r["n"]),
            _f(r["geomean"], ".3f"),
            "-" if target is None else f"{target:.2f}",
            _f(r["min"], ".3f"),
            r["min_dataset"],
            "yes" if ok else "NO",
        )


def run_rate_distortion(corpus: dict, codecs: list[Codec], args, name_width: int) -> dict:
    """``--rate-distortion``: sweep each codec on each array, then bits / SZ3's bits at
    equal PSNR per array and as geometric means per group of arrays."""
    try:
        from rate_distortion import bits_ratio_at_equal_psnr, sweep
    except ImportError:  # imported as benchmarks.compressors
        from benchmarks.rate_distortion import bits_ratio_at_equal_psnr, sweep

    curves: dict[str, dict[str, list[dict]]] = {}
    for name, x in corpus.items():
        for codec in codecs:
            _warm_up(codec, name, x, 1e-3, 1e-3 * (float(x.max()) - float(x.min())))
            pts = sweep(codec.encode, codec.decode, _nbytes, x)
            curves.setdefault(name, {})[codec.name] = pts
            print(f"swept {name} {codec.name}: {len(pts)} bounds", file=sys.stderr, flush=True)
    others = [c.name for c in codecs if c.name != REFERENCE]
    per_array = {
        name: {
            c: bits_ratio_at_equal_psnr(cv[c], cv[REFERENCE]) if REFERENCE in cv else None
            for c in others
        }
        for name, cv in curves.items()
    }
    _print_rd_tables(per_array, others, name_width, args.markdown)
    return {"curves": curves, "bits_vs_sz3": per_array}


def _print_rd_tables(per_array: dict, others: list[str], name_width: int, md: bool) -> None:
    cols = [("dataset", name_width, "<"), ("kind", 9, "<")]
    cols += [(f"{c} bits x", max(9, len(c) + 7), ">") for c in others]
    cols += [("PSNR range dB", 13, "<")]
    table = Table(
        f"bits per value / {REFERENCE}'s at equal PSNR (geometric mean over the common "
        "PSNR grid, 1 dB steps within 40-100 dB; below 1: fewer bits)",
        cols,
        md,
    )
    table.header()
    for name, res in per_array.items():
        span = next((r for r in res.values() if r), None)
        table.row(
            name,
            CATEGORIES.get(name, "?"),
            *(_f(res[c]["ratio"] if res[c] else None, ".3f") for c in others),
            f"{span['psnr_lo']:.0f}-{span['psnr_hi']:.0f}" if span else "-",
        )
    table = Table(
        f"geometric means over arrays of bits / {REFERENCE}'s bits at equal PSNR (target "
        "for tp-sz/1: below 1)",
        [("codec", 11, "<"), ("arrays", 7, "<"), ("n", 2, ">"), ("geomean", 7, ">")]
        + [("min", 5, ">"), ("max", 5, ">")],
        md,
    )
    table.header()
    for codec in others:
        for group, cats in GROUPS:
            vals = [
                res[codec]["ratio"]
                for name, res in per_array.items()
                if res[codec] and CATEGORIES.get(name) in cats
            ]
            if vals:
                table.row(
                    codec,
                    group,
                    str(len(vals)),
                    _f(_geomean(vals), ".3f"),
                    _f(min(vals), ".3f"),
                    _f(max(vals), ".3f"),
                )
    sys.stdout.flush()


def _print_verdict(records: list[dict], quant_records: list[dict], notes: list[str]) -> None:
    flagged = [r for r in records if r["flags"]]
    over_eb = [r for r in records if r.get("notes")]
    print()
    for note in notes:
        print(f"note: {note}")
    if flagged:
        print(f"!! {len(flagged)} flagged result(s):")
        for r in flagged:
            print(f"!!   {r['dataset']} {r['codec']} {r['bound']}: {', '.join(r['flags'])}")
    else:
        print("no bound violations, no failures")
    if over_eb:
        print(
            f"{len(over_eb)} {BASELINE} result(s) over eb (a baseline without a guarantee, "
            "not counted as violations): "
            + ", ".join(f"{r['dataset']} {r['bound']}" for r in over_eb)
        )
    for r in quant_records:
        if r["flags"]:
            print(f"!! quant {r['dataset']} bits={r['bits']}: {', '.join(r['flags'])}")


def _write_json(path: str, meta: dict, sections: dict) -> None:
    with open(path, "w") as fh:
        json.dump({"meta": meta, **sections}, fh, indent=1, allow_nan=False, default=str)
    print(f"results written to {path}")


def _tables_and_summaries(corpus, codecs, run_quant, args, widths) -> tuple[list, dict]:
    """The default run: per-array tables, then the summaries; returns the records and
    the JSON sections."""
    md, bounds = args.markdown, [_bound_label(b) for b in args.bounds]
    records = run_tables(corpus, codecs, args, widths)
    quant_records = run_quant_table(corpus, widths[0], args) if run_quant else []
    summary = summarize(records, [c.name for c in codecs], bounds + [LOSSLESS])
    _print_summary(summary, widths[1], md)
    comparison = compare_to_reference(records, bounds)
    _print_comparison(comparison, widths[1], md)
    sz = sz_targets(records, bounds)
    if sz:
        _print_sz_targets(sz, md)
    targets = block_targets(records, bounds)
    if targets:
        _print_block_targets(targets, md)
    else:
        print(f"\n(no block targets: {BLOCK} did not run)")
    sections = {
        "results": records,
        "summary": summary,
        "tensorpress_vs_sz3": comparison,
        "sz_targets": sz,
        "block_targets": targets,
        "quant": quant_records,
    }
    return records, sections


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    notes: list[str] = []
    codecs, run_quant = _select_codecs(args, notes)
    corpus = load_corpus(args.datasets, verbose=True)
    widths = (max(len(n) for n in corpus), max([11] + [len(c.name) for c in codecs]))
    versions = _versions()
    _print_preamble(args, corpus, notes, versions)
    if args.rate_distortion:
        records, sections = [], run_rate_distortion(corpus, codecs, args, widths[0])
    else:
        records, sections = _tables_and_summaries(corpus, codecs, run_quant, args, widths)
    _print_verdict(records, sections.get("quant", []), notes)
    elapsed = time.perf_counter() - started
    print(f"total time {elapsed:.0f} s")
    if args.json:
        meta = {
            "versions": versions,
            "cpu_count": os.cpu_count(),
            "repeat": args.repeat,
            "bounds": args.bounds,
            "datasets": list(corpus),
            "notes": notes,
            "seconds": elapsed,
        }
        _write_json(args.json, meta, sections)
    bad = {"VIOLATION", "NOT LOSSLESS"}
    return 1 if any(bad & set(r["flags"]) for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
