"""The ``sz`` codec: prediction, linear quantization, Huffman coding and zstd.

Pipeline per chunk (SZ3's design, our code):

1. non-finite values are taken out as exact patches (the predictors never
   see them); a ``pw_rel`` bound moves the data to log2|x| where it becomes
   an absolute bound;
2. a predictor is chosen per chunk by running each candidate on samples of the
   chunk and keeping the one whose codes cost the fewest bits (as Huffman codes
   them, and zstd after it at low bit rates): first-order Lorenzo (1-d to 4-d), multilevel
   interpolation (linear or cubic, coarse levels under a tighter bound as in
   QoZ), multi-dimensional interpolation (HPEZ: the mean of the interpolations
   along every dimension whose neighbours are known), constant prediction,
   block-wise Lorenzo or linear regression (SZ2: per block of 6^3 / 12^2 / 64
   elements, the one with the smaller estimated error, coefficients stored), or,
   for data on a lattice (``offset + k * step``: integer images, elevation models)
   under a bound below the step, Lorenzo on the indices ``k``, lossless
   (``sz/lattice.py``), or, on chunks of 2**19 elements and more, a causal linear
   prediction whose neighbours and weights are fitted to the chunk by least squares
   (``sz/fitted.py``), or, where constant prediction samples cheapest and the rows
   (the last dimension) nearly repeat, each row predicted by an earlier one
   (``sz/match.py``), or, where they are low rank across the columns, each column
   predicted from the columns before it, in levels (``sz/pivot.py``);
3. the quantizer turns each prediction error into an integer code within the
   bound, reconstructing exactly as the decoder will; what cannot be
   quantized is stored exactly as an outlier;
4. the codes are Huffman coded (where long runs of one code are common, by a code fitted
   to the codes outside them where that pays: sz/runs.py) and the whole payload goes
   through zstd.

Which of these ideas paid, on which kinds of data, and what was tried and left out is
docs/compressors.md's "What was tried and why it was left"; ``auto``'s thresholds
(in ``choice.py``) are the ones that record measured.

Payload layout (inside one zstd frame), little-endian::

    u8  predictor      0 raw (lossless), 1 Lorenzo, 2 linear interp, 3 cubic interp,
                       4 multi-dim linear interp, 5 multi-dim cubic interp, 6 constant,
                       7 block-wise Lorenzo or linear regression, 8 and 9 linear and
                       cubic interp with each level's dimensions in the reverse order,
                       10 Lorenzo on the indices of data on a lattice, lossless
                       (sz/lattice.py; its codes and outliers are those of the indices
                       under the bound 0.5, outliers in float64), 11 a causal linear
                       prediction fitted per chunk (sz/fitted.py), 12 each row of the
                       2-d layout predicted by an earlier row or a constant (sz/match.py),
                       13 the 2-d layout's columns predicted from the columns before
                       them, in levels (sz/pivot.py), 14 the values' bins of width
                       2 * eb under a multilevel integer 5/3 wavelet (sz/wavelet.py;
                       no outliers, code 2 * radius - 1 escapes a coefficient),
                       15 the values under a multilevel float64 CDF 9/7 wavelet, the
                       coefficients quantized with the step alpha * eb, corrections
                       where past the bound (sz/cdf97.py; no outliers)
    u8  flags          bit 0: values are log2|x| (pw_rel); bit 1: coded as 1-d;
                       bit 2: coded as 2-d (all dimensions but the last merged)
    f64 eb             absolute bound the kernels used (log2 domain if flag 0)
    f64 alpha, beta    interpolation level tuning: level l uses eb / min(alpha**(l-1), beta);
                       constant prediction (6): alpha is the prediction, beta is 1;
                       row match (12): alpha predicts the rows that refer to none, beta 1;
                       pivots (13): alpha is the chunk's middle (unused), beta 1;
                       lattice (10): alpha is the offset, beta the step
    u32 radius         codes are q + radius; code 0 marks an outlier
    u64 n + n bytes    only with predictor 7: per-block choices and regression
                       coefficients (see compress/sz/kernels/regression.py); only with
                       predictor 11: the fitted model (neighbours and weights, see
                       compress/sz/fitted.py); only with predictor 12: the rows'
                       references (see compress/sz/match.py); only with predictor 13:
                       the model, then the Huffman streams of every segment of the
                       codes but the last (the pivots' and each level's: a table of
                       their own; see compress/sz/pivot.py); only with predictor 14:
                       escaped coefficients and exact fixes (see compress/sz/wavelet.py);
                       only with predictor 15: escapes and corrections (sz/cdf97.py)
    u64 n + n bytes    Huffman stream of the (other) codes (see compress/sz/huffman.py)
    u64 n + n values   outliers, in the kernel dtype (float32, or float64 for
                       float64 data and for the log domain)
    patches            u64 n, n u64 flat indices, n values in the chunk dtype
    u64 n + n bytes    sign bits (numpy packbits order), only with flag bit 0

A raw payload (predictor 0: the bound is below 2**-1000, or the predicted payload would
be larger than the chunk's bytes and larger than this one) holds the flags byte, then
u64 n + n bytes of the byte-shuffled chunk.
"""

from __future__ import annotations

import math

import numpy as np

from ..bounds import ErrorBound
from ..byteio import ByteReader, ByteWriter
from ..codec import Codec, deliver
from ..kernels.rounding import PREC_FLOAT64, prec_of
from ..registry import register_codec
from ..zstd import byte_shuffle, byte_unshuffle, check_level, zstd_compress, zstd_decompress
from . import pivot as sz_pivot
from . import runs as sz_runs
from .choice import PREDICTOR_IDS, choose
from .huffman import HuffmanDecoder
from .ids import (
    CDF97,
    CONSTANT,
    CUBIC,
    FITTED,
    LATTICE,
    LINE_INTERP,
    LINEAR,
    LORENZO,
    MATCH,
    MD_CUBIC,
    MD_LINEAR,
    PIVOT,
    RAW,
    REGRESSION,
    WAVELET,
    WITH_SIDE,
)
from .interpolation import decode_overlapped
from .kernels.lorenzo import code_summary
from .lattice import find_lattice, on_lattice
from .special_values import (
    from_log_domain,
    log_bound,
    pw_rel_violations,
    read_patches,
    split_nonfinite,
    to_log_domain,
    write_patches,
)
from .steps import (
    SizedPool,
    chunk_pool,
    decode_with,
    encode_with,
    fold_shape,
    kernel_dtype,
    squeezed_shape,
    worth_threads,
)

#: the ids of predicted payloads (all but RAW)
_PREDICTED = (LORENZO, LINEAR, CUBIC, MD_LINEAR, MD_CUBIC, CONSTANT, REGRESSION, *LINE_INTERP)
_PREDICTED += (LATTICE, FITTED, MATCH, PIVOT, WAVELET, CDF97)
FLAG_LOG = 1
FLAG_FLAT = 2
#: coded as 2-d: every dimension but the last merged into one (N, C, H, W activations:
#: interpolation across channels predicts badly; benchmarks/compressors.py)
FLAG_ROWS = 4
#: bounds below this (about 1e-301) are stored losslessly: nothing could be
#: quantized, and per-level bounds eb / beta must not underflow to 0
_MIN_EB = 2.0**-1000
#: largest alpha and beta: coarse-level bounds stay >= _MIN_EB / 2**20, never 0
_MAX_BETA = 2.0**20

#: zstd level for payloads under ``_LOW_RATE_BITS`` bits per element: there the
#: Huffman stream is mostly runs of the zero code's bit that a deeper match search
#: shortens, and so few bytes go through zstd that the higher level costs little
#: time (benchmarks/compressors.py: smooth fields at rel 1e-2). Between 1.25 and 2 bits
#: level 9 saved 0-2% over level 3 at 2-5 times its time (4-20% of compress time)
LOW_RATE_LEVEL = 9
_LOW_RATE_BITS = 1.25
#: zstd level for payloads of ``_HIGH_RATE_BITS`` bits per element and more: the
#: Huffman stream is nearly incompressible there, and level 1 finds what little there
#: is as well as level 3 (within 0.3% on the corpus) in a third to half of its time
HIGH_RATE_LEVEL = 1
_HIGH_RATE_BITS = 3.0


#: zstd level of every other payload when the config leaves the level open
DEFAULT_LEVEL = 3


def _zstd_level(level: int | None, nbytes: int, elements: int) -> int:
    """The zstd level for a payload of ``nbytes`` bytes coding ``elements`` elements: the
    configured ``level``, or when it is None the default for the payload's rate."""
    if level is not None:
        return level
    if 8 * nbytes < _LOW_RATE_BITS * elements:
        return LOW_RATE_LEVEL
    return HIGH_RATE_LEVEL if 8 * nbytes >= _HIGH_RATE_BITS * elements else DEFAULT_LEVEL


#: ``auto``'s bits per value at a ``psnr=`` target within which the search also tries
#: ``predictor="cdf97"``: a stream coded at more bits per value is not smooth enough
#: for the wavelet to pay
PSNR_CDF97_RATES = (0.1, 2.0)


@register_codec
class SZCodec(Codec):
    """Error-bounded prediction codec (abs/rel/pw_rel), float16/32/64, any number of dims.

    predictor: ``auto`` (chosen per chunk by sampling), ``lorenzo``, ``linear``,
    ``cubic``, ``linear-rev``, ``cubic-rev`` (each level's dimensions in the reverse
    order), ``md-linear``, ``md-cubic`` (multi-dimensional), ``constant``,
    ``regression``, ``lattice`` (lossless indices of data on a lattice under a bound
    below its step, else Lorenzo), ``fitted`` (neighbours' weights fitted per chunk,
    see sz/fitted.py), ``match`` (each row predicted by an earlier, similar row, else
    constant prediction; see sz/match.py), ``pivot`` (each column predicted from the
    columns before it, else constant prediction; see sz/pivot.py), ``wavelet`` (the
    values' bins under an integer 5/3 wavelet; see sz/wavelet.py), ``cdf97`` (a float
    CDF 9/7 wavelet with corrections; see sz/cdf97.py) or ``interp`` (the
    interpolations but md-linear, by sampling).
    alpha/beta: fixed interpolation level tuning, or None to choose by sampling. radius: codes
    per side of the quantizer (at most 32768). level: zstd level, or None for
    the level by the payload's rate (``LOW_RATE_LEVEL`` under 1.25 bits per element,
    ``HIGH_RATE_LEVEL`` from 3, else ``DEFAULT_LEVEL``).
    """

    name = "sz"
    #: larger than other codecs' default: a chunk is coded in threads already, and
    #: thin slabs of 3-d fields (chunks split along axis 0) lose the coarse levels of
    #: interpolation across their thin dimension (docs/compressors.md, "What was tried").
    #: The trade is memory: the CLI holds about 2 x workers x this many bytes
    default_chunk_bytes = 32 << 20

    def __init__(
        self,
        predictor: str = "auto",
        alpha: float | None = None,
        beta: float | None = None,
        radius: int = 32768,
        level: int | None = None,
        **bound,
    ):
        super().__init__(**bound)
        if predictor not in PREDICTOR_IDS:
            raise ValueError(
                f"unknown sz predictor {predictor!r}; use one of {sorted(PREDICTOR_IDS)}"
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
        self.level = None if level is None else check_level(level)

    def parameters(self) -> dict:
        return {
            "predictor": self.predictor,
            "alpha": self.alpha,
            "beta": self.beta,
            "radius": self.radius,
            "level": self.level,
        }

    def psnr_alternatives(self, bits_per_value: float) -> tuple[Codec, ...]:
        """``auto`` at a PSNR target: the CDF 9/7 path too, where transform coding can
        pay (``PSNR_CDF97_RATES`` bits per value); its error spreads below the bound
        (fewer bits at equal PSNR on climate_t2m and grayscott_u than ``auto``'s)."""
        low, high = PSNR_CDF97_RATES
        if self.predictor != "auto" or not low <= bits_per_value <= high:
            return ()
        config = self.stream_config()
        config["predictor"] = "cdf97"
        return (type(self).from_config(config),)

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

        lattice = None
        if not log_domain and LATTICE in PREDICTOR_IDS[self.predictor]:
            lattice = find_lattice(work, patch_idx, eb)
        with chunk_pool(threads, values.size) as pool:
            args, coded = (self.predictor, self.alpha, self.beta, self.radius), {}
            choice, shape = choose(
                values, squeezed_shape(chunk.shape), eb, prec, pool, *args, lattice, coded
            )
            if choice[0] == LATTICE and not on_lattice(work, patch_idx, *lattice):
                # the samples were on it, some other value is not: choose without it
                choice, shape = choose(values, squeezed_shape(chunk.shape), eb, prec, pool, *args)
            if (choice, shape) in coded:  # coded whole while choosing
                codes, outliers, side = coded[choice, shape]
            else:
                side = []  # REGRESSION's and FITTED's side information
                codes, outliers = encode_with(
                    choice, values, shape, eb, prec, self.radius, pool, side
                )
            blob, last = side[0] if side else b"", codes
            if choice[0] == PIVOT:  # each level's codes: a Huffman table of their own
                blob, last = sz_pivot.side_info(blob, codes, fold_shape(shape, 2), pool)
            streams = sz_runs.streams(last, pool)

        if log_domain:
            logs = decode_with(
                choice, codes, outliers, shape, eb, prec, self.radius, np.float64, None, *side
            )
            y = from_log_domain(logs, signs, flat.dtype)
            missed = pw_rel_violations(work, y, tol)
            patch_idx = np.union1d(np.union1d(patch_idx, zero_idx), missed)

        pred, alpha, beta = choice[:3]
        w = ByteWriter()
        w.u8(pred)
        squeezed = squeezed_shape(chunk.shape)
        layout_flag = 0 if shape == squeezed else FLAG_FLAT if len(shape) == 1 else FLAG_ROWS
        w.u8((FLAG_LOG if log_domain else 0) | layout_flag)
        w.f64(eb)
        w.f64(alpha)
        w.f64(beta)
        w.u32(self.radius)
        if pred in WITH_SIDE:
            w.blob(blob)
        tail = ByteWriter()
        tail.u64(outliers.size)
        tail.array(outliers)
        write_patches(tail, patch_idx, flat[patch_idx])
        if log_domain:
            tail.blob(signs.tobytes())
        payload = self._smallest(w.getvalue(), streams, tail.getvalue(), flat.size)
        if len(payload) > flat.nbytes:  # prediction did not pay: keep the chunk exactly
            raw = self._raw(flat)
            if len(raw) < len(payload):
                return raw
        return payload

    def _smallest(self, head: bytes, streams: list, tail: bytes, elements: int) -> bytes:
        """The zstd payload of ``head``, a Huffman stream (as a blob) and ``tail``, for a
        chunk of ``elements`` elements: of the first of ``streams``, or of the second
        where that is at most ``RUN_GAIN`` of its bytes (sz/runs.py)."""
        payloads = []
        for stream in streams:
            body = b"".join((head, len(stream).to_bytes(8, "little"), stream, tail))
            payloads.append(zstd_compress(body, _zstd_level(self.level, len(body), elements)))
        plain, *others = payloads
        return next((p for p in others if len(p) <= sz_runs.RUN_GAIN * len(plain)), plain)

    def _raw(self, flat: np.ndarray) -> bytes:
        """The lossless payload (predictor 0) of the flat chunk."""
        w = ByteWriter()
        w.u8(RAW)
        w.u8(0)
        w.blob(byte_shuffle(flat))
        return zstd_compress(w.getvalue(), DEFAULT_LEVEL if self.level is None else self.level)

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
        if pred not in _PREDICTED or flags & ~(FLAG_LOG | FLAG_FLAT | FLAG_ROWS):
            raise ValueError(f"sz payload names unknown predictor {pred} or flags {flags}")
        shape1 = squeezed_shape(shape)
        if flags & FLAG_FLAT and flags & FLAG_ROWS:
            raise ValueError("sz payload: flags name two layouts")
        if flags & FLAG_FLAT:
            shape1 = (size,)
        elif flags & FLAG_ROWS:
            if len(shape1) < 3:
                raise ValueError("sz payload: flags name the 2-d layout of 3 dims or more")
            shape1 = (size // shape1[-1], shape1[-1])
        log_domain = bool(flags & FLAG_LOG)
        eb, alpha, beta = r.f64(), r.f64(), r.f64()
        radius = r.u32()
        side = r.blob() if pred in WITH_SIDE else b""
        if pred in (CONSTANT, MATCH, PIVOT):  # alpha: the prediction (PIVOT's: unused)
            tuning = math.isfinite(alpha) and beta == 1
        elif pred == LATTICE:  # alpha and beta: the offset and the step
            tuning = math.isfinite(alpha) and 0 < beta < math.inf
        else:
            tuning = 1 <= alpha <= _MAX_BETA and 1 <= beta <= _MAX_BETA
        valid = _MIN_EB <= eb < math.inf and tuning and 2 <= radius <= 32768
        if not valid:
            raise ValueError("sz payload has an invalid quantizer header")
        head = np.empty(0, np.uint16)
        if pred == PIVOT:  # the codes of every level but the last: after the model
            side, head = sz_pivot.side_codes(side, fold_shape(shape1, 2))
        decoder = HuffmanDecoder(r.blob(), size - head.size)
        work_dtype = np.dtype(np.float64) if pred == LATTICE else kernel_dtype(dtype, log_domain)
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
        if pred in LINE_INTERP and worth_threads(threads, size):
            with SizedPool(1) as pool:
                out3 = dest.reshape(fold_shape(shape1, 3))
                args = (choice, decoder, outliers, out3, eb, prec, radius)
                zeros, top = decode_overlapped(pool, *args)
        else:
            codes = decoder.finish()
            if head.size:
                codes = np.concatenate([head, codes])
            zeros, top = code_summary(codes)
            decode_with(choice, codes, outliers, shape1, eb, prec, radius, work_dtype, dest, side)
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
