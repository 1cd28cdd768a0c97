"""The ``sz`` codec: prediction, linear quantization, Huffman coding and zstd.

Pipeline per chunk (SZ3's design, our code):

1. non-finite values are taken out as exact patches (the predictors never
   see them); a ``pw_rel`` bound moves the data to log2|x| where it becomes
   an absolute bound;
2. a predictor -- first-order Lorenzo (1-d to 4-d) or multilevel
   interpolation (linear or cubic, coarse levels under a tighter bound as in
   QoZ) -- is chosen per chunk by running each candidate on samples of the
   chunk and keeping the one whose codes cost the fewest bits;
3. the quantizer turns each prediction error into an integer code within the
   bound, reconstructing exactly as the decoder will; what cannot be
   quantized is stored exactly as an outlier;
4. the codes are Huffman coded and the whole payload goes through zstd.

Payload layout (inside one zstd frame), little-endian::

    u8  predictor      0 raw (lossless), 1 Lorenzo, 2 linear interp, 3 cubic interp
    u8  flags          bit 0: values are log2|x| (pw_rel); bit 1: coded as 1-d
    f64 eb             absolute bound the kernels used (log2 domain if flag 0)
    f64 alpha, beta    interpolation level tuning: level l uses eb / min(alpha**(l-1), beta)
    u32 radius         codes are q + radius; code 0 marks an outlier
    u64 n + n bytes    Huffman stream of the codes (see compress/huffman.py)
    u64 n + n values   outliers, in the kernel dtype (float32, or float64 for
                       float64 data and for the log domain)
    patches            u64 n, n u64 flat indices, n values in the chunk dtype
    u64 n + n bytes    sign bits (numpy packbits order), only with flag bit 0

A raw payload (predictor 0: the bound is below 2**-1000, or the predicted payload would
be larger than the chunk's bytes and larger than this one) holds the flags byte, then
u64 n + n bytes of the byte-shuffled chunk.
"""

from __future__ import annotations

import contextlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .bounds import ErrorBound
from .byteio import ByteReader, ByteWriter
from .codec import Codec, deliver
from .huffman import HuffmanDecoder, huffman_encode
from .kernels.interpolation import (
    ALL,
    interp_code,
    interp_decode,
    interp_encode,
    interp_num_levels,
    interp_pass_sizes,
)
from .kernels.lorenzo import code_summary, lorenzo_decode, lorenzo_encode
from .kernels.rounding import PREC_FLOAT64, prec_of
from .lossless import (
    byte_shuffle,
    byte_unshuffle,
    check_level,
    zstd_compress,
    zstd_decompress,
)
from .registry import register_codec
from .special_values import (
    from_log_domain,
    log_bound,
    pw_rel_violations,
    read_patches,
    split_nonfinite,
    to_log_domain,
    write_patches,
)

RAW, LORENZO, LINEAR, CUBIC = 0, 1, 2, 3
_PREDICTOR_IDS = {
    "lorenzo": (LORENZO,),
    "linear": (LINEAR,),
    "cubic": (CUBIC,),
    "interp": (LINEAR, CUBIC),
    "auto": (LORENZO, LINEAR, CUBIC),
}
FLAG_LOG = 1
FLAG_FLAT = 2
#: a chunk whose last dimension is below this many elements may also be coded as
#: 1-d (e.g. 3x3 convolution kernels); the 1-d layout decodes faster there (long
#: lines instead of very short ones: the conv weight gradient of
#: benchmarks/compressors.py), so it is chosen unless the shaped one samples 2% fewer bits
_FLAT_BELOW = 8
_FLAT_SLACK = 1.02
#: bounds below this (about 1e-301) are stored losslessly: nothing could be
#: quantized, and per-level bounds eb / beta must not underflow to 0
_MIN_EB = 2.0**-1000
#: largest alpha and beta: coarse-level bounds stay >= _MIN_EB / 2**20, never 0
_MAX_BETA = 2.0**20

#: (alpha, beta) pairs tried per interpolation when the config leaves them open
#: (tighter coarse levels pay off for cubic, rarely for linear)
LEVEL_TUNINGS = {LINEAR: ((1.0, 1.0),), CUBIC: ((1.0, 1.0), (1.25, 2.0))}
#: predictor choice: sample blocks per chunk, the share of the chunk they cover
#: (1/8), and the most and fewest elements per block (below that, the whole chunk)
_SAMPLE_BLOCKS = 4
_SAMPLE_FRACTION = 8
_SAMPLE_ELEMENTS = 32768
_SAMPLE_MIN_ELEMENTS = 2048
#: below this many elements a chunk is not worth a thread pool
_PARALLEL_MIN_ELEMENTS = 1 << 19
#: interpolation passes of at least this many points are split over the threads
_SPLIT_MIN_POINTS = 1 << 16


@register_codec
class SZCodec(Codec):
    """Error-bounded prediction codec (abs/rel/pw_rel), float16/32/64, any number of dims.

    predictor: ``auto`` (chosen per chunk by sampling), ``lorenzo``, ``linear``,
    ``cubic`` or ``interp`` (linear or cubic by sampling). alpha/beta: fixed
    interpolation level tuning, or None to choose by sampling. radius: codes
    per side of the quantizer (at most 32768). level: zstd level.
    """

    name = "sz"

    def __init__(
        self,
        predictor: str = "auto",
        alpha: float | None = None,
        beta: float | None = None,
        radius: int = 32768,
        level: int = 3,
        **bound,
    ):
        super().__init__(**bound)
        if predictor not in _PREDICTOR_IDS:
            raise ValueError(
                f"unknown sz predictor {predictor!r}; use one of {sorted(_PREDICTOR_IDS)}"
            )
        if (alpha is None) != (beta is None):
            raise ValueError("give both alpha and beta, or neither")
        if alpha is not None and not all(
            isinstance(v, (int, float)) and 1 <= v <= _MAX_BETA for v in (alpha, beta)
        ):
            raise ValueError(f"alpha and beta must be numbers in 1..{_MAX_BETA:g}")
        if not isinstance(radius, int) or not 2 <= radius <= 32768:
            raise ValueError(f"radius must be an integer in 2..32768, got {radius!r}")
        self.predictor = predictor
        self.alpha = None if alpha is None else float(alpha)
        self.beta = None if beta is None else float(beta)
        self.radius = radius
        self.level = check_level(level)

    def parameters(self) -> dict:
        return {
            "predictor": self.predictor,
            "alpha": self.alpha,
            "beta": self.beta,
            "radius": self.radius,
            "level": self.level,
        }

    # -- encoding -------------------------------------------------------------

    def encode(
        self, chunk: np.ndarray, bound: ErrorBound, threads: int = 1, offset: int = 0
    ) -> bytes:
        flat = np.ascontiguousarray(chunk).reshape(-1)
        if not flat.flags.writeable:  # numba types read-only arrays apart: one kernel type
            flat = flat.copy()
        tol = bound.tolerance
        log_domain = bound.resolved_mode == "pw_rel"
        eb = log_bound(tol) if log_domain else float(tol)
        if flat.size == 0 or not eb >= _MIN_EB:
            return self._raw(flat)

        patch_idx, work = split_nonfinite(flat)
        if log_domain:
            values, signs, zero_idx = to_log_domain(work)
            prec = PREC_FLOAT64
        else:
            values = work.astype(np.float32) if work.dtype == np.float16 else work
            prec = prec_of(flat.dtype)

        with _pool(threads, values.size) as pool:
            choice, shape = self._choose(values, _squeezed(chunk.shape), eb, prec, pool)
            codes, outliers = _encode_with(choice, values, shape, eb, prec, self.radius, pool)
            stream = huffman_encode(codes, pool)

        if log_domain:
            logs = _decode_with(choice, codes, outliers, shape, eb, prec, self.radius, np.float64)
            y = from_log_domain(logs, signs, flat.dtype)
            missed = pw_rel_violations(work, y, tol)
            patch_idx = np.union1d(np.union1d(patch_idx, zero_idx), missed)

        pred, alpha, beta = choice
        w = ByteWriter()
        w.u8(pred)
        as_1d = shape != _squeezed(chunk.shape)
        w.u8((FLAG_LOG if log_domain else 0) | (FLAG_FLAT if as_1d else 0))
        w.f64(eb)
        w.f64(alpha)
        w.f64(beta)
        w.u32(self.radius)
        w.blob(stream)
        w.u64(outliers.size)
        w.array(outliers)
        write_patches(w, patch_idx, flat[patch_idx])
        if log_domain:
            w.blob(signs.tobytes())
        payload = zstd_compress(w.getvalue(), self.level)
        if len(payload) > flat.nbytes:  # prediction did not pay: keep the chunk exactly
            raw = self._raw(flat)
            if len(raw) < len(payload):
                return raw
        return payload

    def _raw(self, flat: np.ndarray) -> bytes:
        """The lossless payload (predictor 0) of the flat chunk."""
        w = ByteWriter()
        w.u8(RAW)
        w.u8(0)
        w.blob(byte_shuffle(flat))
        return zstd_compress(w.getvalue(), self.level)

    def _choose(self, values, shape, eb, prec, pool) -> tuple[tuple, tuple]:
        """``((predictor id, alpha, beta), layout)``: the candidate whose sampled codes
        cost least, and the shape it codes the chunk as (``shape`` or 1-d, see
        ``_FLAT_BELOW``)."""
        candidates = []
        for pred in _PREDICTOR_IDS[self.predictor]:
            if pred == LORENZO:
                candidates.append((LORENZO, 1.0, 1.0))
            elif self.alpha is not None:
                candidates.append((pred, self.alpha, self.beta))
            else:
                candidates.extend((pred, a, b) for a, b in LEVEL_TUNINGS[pred])
        layouts = [shape]
        if len(shape) > 1 and shape[-1] < _FLAT_BELOW:
            layouts.append((values.size,))
        candidates = [(c, layout) for layout in layouts for c in candidates]
        if len(candidates) == 1:
            return candidates[0]
        samples = {layout: _sample_blocks(values.reshape(_fold(layout, 3))) for layout in layouts}

        def cost(candidate):
            cand, layout = candidate
            coded = [_encode_with(cand, b, b.shape, eb, prec, self.radius) for b in samples[layout]]
            codes = np.concatenate([c for c, _ in coded])
            return _code_bits(codes) + 8 * sum(o.nbytes for _, o in coded)

        costs = np.array(list(pool.map(cost, candidates)) if pool else list(map(cost, candidates)))
        if len(layouts) > 1:  # the 1-d layout codes fast: it wins near-ties
            costs[: len(costs) // 2] *= _FLAT_SLACK
        return candidates[int(np.argmin(costs))]

    # -- decoding -------------------------------------------------------------

    def decode(self, payload, shape, dtype, bound=None, out=None, threads=1) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        # worst case: raw bytes or outliers in float64 plus patches and codes
        limit = 64 + size * (2 * dtype.itemsize + 8 + 8 + 3) + (1 << 20)
        r = ByteReader(zstd_decompress(payload, limit), "sz payload")
        pred, flags = r.u8(), r.u8()
        if pred == RAW:
            flat = byte_unshuffle(bytes(r.blob()), dtype, size)
            r.done()
            return deliver(flat, shape, out)
        if pred not in (LORENZO, LINEAR, CUBIC) or flags & ~(FLAG_LOG | FLAG_FLAT):
            raise ValueError(f"sz payload names unknown predictor {pred} or flags {flags}")
        log_domain = bool(flags & FLAG_LOG)
        eb, alpha, beta = r.f64(), r.f64(), r.f64()
        radius = r.u32()
        valid = (
            _MIN_EB <= eb < math.inf
            and 1 <= alpha <= _MAX_BETA
            and 1 <= beta <= _MAX_BETA
            and 2 <= radius <= 32768
        )
        if not valid:
            raise ValueError("sz payload has an invalid quantizer header")
        decoder = HuffmanDecoder(r.blob(), size)
        work_dtype = _kernel_dtype(dtype, log_domain)
        n_out = r.u64()
        if n_out > size:
            raise ValueError("sz payload claims more outliers than elements")
        outliers = r.array(work_dtype, n_out)
        patch_idx, patch_vals = read_patches(r, dtype, size)
        if log_domain:
            signs = np.frombuffer(r.blob(), np.uint8)
            if signs.size != (size + 7) // 8:
                raise ValueError("sz payload: sign bits have the wrong length")
        r.done()
        prec = PREC_FLOAT64 if log_domain else prec_of(dtype)
        # decode straight into the caller's buffer when the kernel dtype allows
        direct = out is not None and not log_domain and work_dtype == dtype
        dest = out.reshape(-1) if direct else np.empty(size, work_dtype)
        choice = (pred, alpha, beta)
        shape1 = (size,) if flags & FLAG_FLAT else _squeezed(shape)
        if pred != LORENZO and threads > 1 and size >= _PARALLEL_MIN_ELEMENTS:
            with _Pool(1) as pool:
                zeros, top = _decode_overlapped(
                    pool, choice, decoder, outliers, shape1, eb, prec, radius, dest
                )
        else:
            codes = decoder.finish()
            zeros, top = code_summary(codes)
            _decode_with(choice, codes, outliers, shape1, eb, prec, radius, work_dtype, dest)
        # the kernels never go out of bounds on damaged codes; these catch the rest
        if zeros != n_out:
            raise ValueError("sz payload: outlier count does not match the codes")
        if top >= 2 * radius:
            raise ValueError("sz payload: quantization code out of range")
        if log_domain:
            flat = from_log_domain(dest, signs, dtype)
        else:
            flat = dest.astype(dtype, copy=False)
        flat[patch_idx] = patch_vals
        return out if direct else deliver(flat, shape, out)


# -- helpers: shapes, kernels, cost --------------------------------------------


def _kernel_dtype(dtype: np.dtype, log_domain: bool) -> np.dtype:
    if log_domain or dtype == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _squeezed(shape: tuple) -> tuple:
    """Shape without size-1 dims (at least 1-d)."""
    dims = tuple(int(d) for d in shape if d != 1)
    return dims or (1,)


def _fold(shape: tuple, ndim: int) -> tuple:
    """Merge leading dims so at most ``ndim`` remain, then pad with leading 1s to ``ndim``."""
    if len(shape) > ndim:
        shape = (math.prod(shape[: len(shape) - ndim + 1]),) + tuple(shape[len(shape) - ndim + 1 :])
    return (1,) * (ndim - len(shape)) + tuple(shape)


class _Pool(ThreadPoolExecutor):
    """A thread pool that knows its size (``threads``)."""

    def __init__(self, threads: int):
        super().__init__(threads)
        self.threads = threads


def _pool(threads: int, size: int):
    """A pool of ``threads`` threads for a chunk of ``size`` elements, if worth one."""
    worth = threads > 1 and size >= _PARALLEL_MIN_ELEMENTS
    return _Pool(threads) if worth else contextlib.nullcontext()  # None: one thread


def _encode_with(choice, values, shape, eb, prec, radius, pool=None):
    pred, alpha, beta = choice
    n = values.size
    codes = np.empty(n, np.uint16)
    outliers = np.empty(n, values.dtype)
    if pred == LORENZO:
        data = values.reshape(_fold(shape, 4))
        k = lorenzo_encode(data, eb, radius, prec, codes, outliers)
    else:
        data = values.reshape(_fold(shape, 3))
        levels = _eb_levels(data.shape, eb, alpha, beta)
        if pool is None:
            k = interp_encode(data, levels, radius, prec, pred == CUBIC, codes, outliers)
        else:
            rec = np.empty_like(data)
            k = _interp_threaded(pool, data, rec, codes, outliers, levels, radius, prec, pred)
    return codes, outliers[:k].copy()


def _decode_with(choice, codes, outliers, shape, eb, prec, radius, work_dtype, dest=None):
    """Reconstruct into ``dest`` (a flat array of ``work_dtype``) or a new array; flat result."""
    pred, alpha, beta = choice
    if dest is None:
        dest = np.empty(math.prod(shape), work_dtype)
    if pred == LORENZO:
        out = dest.reshape(_fold(shape, 4))
        lorenzo_decode(codes, outliers, eb, radius, prec, out)
    else:
        out = dest.reshape(_fold(shape, 3))
        levels = _eb_levels(out.shape, eb, alpha, beta)
        interp_decode(codes, outliers, levels, radius, prec, pred == CUBIC, out)
    return out.reshape(-1)


def _decode_overlapped(pool, choice, decoder, outliers, shape, eb, prec, radius, dest):
    """Interpolation decoding while ``pool``'s thread Huffman-decodes the codes ahead.

    The codes are decoded in pieces (whole small passes, large passes in runs of
    lines, about 1/8 of the chunk each); each piece is reconstructed as soon as its
    codes are there. Returns ``code_summary`` of the codes (counted by the decoding
    thread, piece by piece).
    """
    pred, alpha, beta = choice
    out = dest.reshape(_fold(shape, 3))
    levels = _eb_levels(out.shape, eb, alpha, beta)
    pieces = _pieces(interp_pass_sizes(*out.shape), max(_SPLIT_MIN_POINTS, out.size // 8))
    ready = [threading.Event() for _ in pieces]

    def huffman():
        zeros, top, start = 0, 0, 0
        try:
            for piece, event in zip(pieces, ready, strict=True):
                decoder.decode_to(piece[-1])
                event.set()
                z, t = code_summary(decoder.symbols[start : piece[-1]])
                zeros, top, start = zeros + z, max(top, t), piece[-1]
            return zeros, top
        finally:
            for event in ready:  # a damaged stream stops the reconstruction too
                event.set()

    job = pool.submit(huffman)
    oi = 0
    try:
        for (q_lo, q_hi, ln_lo, ln_hi, end), event in zip(pieces, ready, strict=True):
            event.wait()
            if decoder.done < end:
                break
            oi = interp_code(
                out, out, decoder.symbols, outliers, levels, radius, prec, pred == CUBIC, True,
                q_lo, q_hi, ln_lo, ln_hi, oi,
            )  # fmt: skip
    finally:
        summary = job.result()  # the decoder's error first, if any
    decoder.finish()
    return summary


def _pieces(sizes: np.ndarray, target: int) -> list[tuple]:
    """Split interpolation passes (``interp_pass_sizes``) into pieces of about ``target``
    codes: ``(q_lo, q_hi, ln_lo, ln_hi, end)``, passes ``q_lo..q_hi - 1`` (lines
    ``ln_lo..ln_hi - 1`` of a large one), codes up to ``end``; in coding order."""
    pieces, q_lo, end = [], 0, 0
    for q, (lines, per_line) in enumerate(sizes.tolist()):
        points = lines * per_line
        if points < target:
            end += points
            if q + 1 < len(sizes) and end - (pieces[-1][-1] if pieces else 0) < target:
                continue
            pieces.append((q_lo, q + 1, 0, ALL, end))
        else:
            if q > q_lo:
                pieces.append((q_lo, q, 0, ALL, end))
            parts = min(lines, -(-points // target))
            for p in range(parts):
                a, b = lines * p // parts, lines * (p + 1) // parts
                pieces.append((q, q + 1, a, b, end + b * per_line))
            end += points
        q_lo = q + 1
    return pieces


def _interp_threaded(pool, src, rec, codes, outliers, levels, radius, prec, pred):
    """Interpolation encoding with the large passes split by lines over ``pool``'s threads.

    Codes, outliers and reconstructions are those of ``interp_encode``: each part
    of a pass writes its own codes and puts its outliers at its first code's index
    (free: outliers never outnumber codes); they are moved up behind the earlier
    parts' afterwards. Returns the number of outliers.
    """
    parts = pool.threads
    sizes = interp_pass_sizes(*rec.shape)
    points = sizes[:, 0] * sizes[:, 1]
    starts = np.concatenate(([0], np.cumsum(points)))
    cubic = pred == CUBIC

    def run(q_lo, q_hi, ln_lo, ln_hi, oi, out=outliers):
        return interp_code(
            src, rec, codes, out, levels, radius, prec, cubic, False, q_lo, q_hi, ln_lo, ln_hi, oi
        )

    oi, done = 0, 0  # outliers so far, passes done
    for q in np.flatnonzero((points >= _SPLIT_MIN_POINTS) & (sizes[:, 0] >= parts)):
        oi = run(done, q, 0, ALL, oi) if q > done else oi
        lines = [sizes[q, 0] * p // parts for p in range(parts + 1)]
        firsts = [int(starts[q] + ln * sizes[q, 1]) for ln in lines]  # first code per part
        jobs = [pool.submit(run, q, q + 1, lines[0], lines[1], oi)]
        jobs += [
            pool.submit(run, q, q + 1, lines[p], lines[p + 1], 0, outliers[firsts[p] :])
            for p in range(1, parts)
        ]
        counts = [j.result() for j in jobs]
        oi = counts[0]
        for p in range(1, parts):
            outliers[oi : oi + counts[p]] = outliers[firsts[p] : firsts[p] + counts[p]]
            oi += counts[p]
        done = q + 1
    return run(done, ALL, 0, ALL, oi) if done < len(sizes) else oi


def _eb_levels(shape3, eb, alpha, beta) -> np.ndarray:
    """Bound per interpolation level (index l = level l; index 0 unused)."""
    n = interp_num_levels(shape3)
    levels = np.arange(n + 1, dtype=np.float64)
    return eb / np.minimum(alpha ** np.maximum(levels - 1, 0), beta)


def _sample_blocks(data3: np.ndarray) -> list[np.ndarray]:
    """``_SAMPLE_BLOCKS`` contiguous sub-blocks spread over the chunk, together
    about 1/``_SAMPLE_FRACTION`` of it (each at most ``_SAMPLE_ELEMENTS``).

    A block keeps small dimensions whole and halves the largest one until it
    fits, so it has the same kind of neighbourhoods as the chunk.
    """
    per_block = min(_SAMPLE_ELEMENTS, data3.size // (_SAMPLE_FRACTION * _SAMPLE_BLOCKS))
    if per_block < _SAMPLE_MIN_ELEMENTS:
        return [np.ascontiguousarray(data3)]
    block = list(data3.shape)
    while math.prod(block) > per_block:
        i = block.index(max(block))
        block[i] = (block[i] + 1) // 2
    blocks = []
    for b in range(_SAMPLE_BLOCKS):
        frac = (b + 0.5) / _SAMPLE_BLOCKS
        start = [int((d - s) * frac) for d, s in zip(data3.shape, block, strict=True)]
        sl = tuple(slice(s, s + n) for s, n in zip(start, block, strict=True))
        blocks.append(np.ascontiguousarray(data3[sl]))
    return blocks


def _code_bits(codes: np.ndarray) -> float:
    """Estimated cost of ``codes`` after entropy coding, in bits (zstd on the raw codes)."""
    return 8.0 * len(zstd_compress(codes.tobytes(), 1))
