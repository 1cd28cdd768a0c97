"""The ``block`` codec: fast, error-bounded, fixed-length codes per block of 64 values.

In the spirit of SZx and cuSZp: every value is quantized on its own (``q =
rint(x / s)``, s just under 2 e; kept only where the reconstruction honours
the bound after rounding to the dtype), then each block of 64 values picks the
smallest of four packings of its codes — the codes or their differences (each
value minus the one before it), all of them or only the non-zero ones (located
by the ranks of their positions in each half of the block, or a 64-bit mask:
``kernels/positions.py``) — each at the block's own bit width. A block that
cannot be quantized (NaN, infinity, a code too large) is stored raw, as one
value when all its values are equal; a block equal to the value before it costs
one header byte. Every step is data-parallel: torch
tensor ops (``kernels/block_torch.py``) and numba.cuda kernels for CUDA
tensors (``kernels/cuda.py``) write the same bytes as the numba CPU
kernels (``kernels/cpu.py``); all three take the layout's fields and the
quantizer's rule from ``kernels/layout.py``.
With ``entropy="zstd"`` a chunk's packed blocks are compressed once more with
zstd where that is smaller (``entropy.py``; on the host only).
Byte layout: formats/SPEC.md.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ..._util.scratch import scratch
from ..._util.threads import map_grouped
from ..bounds import ErrorBound
from ..codec import Codec, deliver
from ..kernels.rounding import PREC_BFLOAT16, PREC_FLOAT16, PREC_FLOAT32, PREC_FLOAT64
from ..registry import register_codec
from .entropy import (
    check_entropy,
    squeeze,
    squeeze_into,
    squeeze_tensor,
    unsqueeze,
    unsqueeze_tensor,
)
from .kernels import cpu as kb
from .kernels import layout as bl
from .kernels.layout import STEP_MARGIN, steps_for
from .rows import RowsDecoder
from .stochastic import levels, stochastic_steps

#: precision code by numpy dtype, native and little-endian (keyed by the dtype: numpy
#: computes ``dtype.name`` in Python, a few microseconds a chunk)
PREC_BY_DTYPE = {
    dt: prec
    for t, prec in (
        (np.float64, PREC_FLOAT64),
        (np.float32, PREC_FLOAT32),
        (np.float16, PREC_FLOAT16),
    )
    for dt in (np.dtype(t), np.dtype(t).newbyteorder("<"))
}


__all__ = [
    "BlockCodec",
    "STEP_MARGIN",
    "encode_values",
    "encode_values_into",
    "payload_capacity",
    "steps_for",
]


def payload_capacity(n: int, itemsize: int) -> int:
    """The most bytes a chunk payload of ``n`` values of ``itemsize`` bytes takes while
    it is written (headers, exponents, counts, data)."""
    return 1 + 12 * -(-n // bl.BLOCK) + n * itemsize


def encode_values(
    xv: np.ndarray, rawb: np.ndarray, prec: int, bound: ErrorBound, finish=bytes
) -> bytes:
    """One chunk's payload from its values ``xv`` (float32/float64, exact) and their
    stored bytes ``rawb``; ``prec`` names the stored dtype (bfloat16 included).
    ``finish`` turns the payload, a view of scratch memory, into the bytes returned (the
    entropy mode squeezes it there, without copying it first)."""
    with scratch(payload_capacity(xv.size, rawb.size // max(xv.size, 1))) as (out,):
        return finish(out[: encode_values_into(xv, rawb, prec, bound, out)])


def encode_values_into(
    xv: np.ndarray,
    rawb: np.ndarray,
    prec: int,
    bound: ErrorBound,
    out: np.ndarray,
    steps: tuple | None = None,
) -> int:
    """:func:`encode_values` written to the uint8 array ``out`` (``payload_capacity``
    bytes at least); returns the payload's length in bytes. ``steps``: the kernels'
    (tolerance, step, inverse) where they are not the bound's (``stochastic.py``)."""
    n = xv.size
    if n == 0:
        out[0] = bl.MODE_BLOCKS
        return 1
    itemsize = rawb.size // n
    tol, (step, inv) = bound.tolerance, steps_for(bound.tolerance)
    if steps is not None:
        tol, step, inv = steps
    pw = bound.resolved_mode == "pw_rel"
    with scratch(n * itemsize + 8) as (data,):
        size = kb.encode_chunk(xv, rawb, itemsize, prec, pw, tol, step, inv, data, out)
    if size >= 1 + n * itemsize:
        out[0] = bl.MODE_RAW
        out[1 : 1 + n * itemsize] = rawb
        return 1 + n * itemsize
    out[0] = bl.MODE_BLOCKS
    return size


@register_codec
class BlockCodec(Codec):
    """Blocks of 64 values, each packed at its own bit width; see the module docstring.

    ``entropy``: ``"none"`` (the default: the kernels' bytes, on every device) or
    ``"zstd"`` (zstd over a chunk's packed blocks where that is smaller, on the host).
    ``stochastic``: unbiased stochastic rounding on a step just under the bound, its
    noise keyed on ``seed`` (in [0, 2**31)) and each element's index (``stochastic.py``;
    abs and rel bounds; encoded on the host).
    """

    name = "block"
    default_chunk_bytes = 1 << 20
    devices = ("cpu", "cuda")
    keeps_zeros = True
    writes_into = True

    def __init__(self, *, entropy: str = "none", stochastic: bool = False, seed: int = 0, **bound):
        super().__init__(**bound)
        self.entropy = check_entropy(entropy)
        if not isinstance(stochastic, (bool, np.bool_)):
            raise TypeError(f"block stochastic must be True or False, got {stochastic!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"block seed must be an integer, got {seed!r}")
        if not 0 <= seed < 2**31:
            raise ValueError(f"block seed must be in [0, 2**31), got {seed!r}")
        self.stochastic, self.seed = bool(stochastic), int(seed)
        if self.stochastic:
            _no_pw_rel(self.bound)
            self.writes_into = False  # its noise needs the chunk's offset, which encode takes

    def parameters(self) -> dict:
        params = {} if self.entropy == "none" else {"entropy": self.entropy}
        if self.stochastic:
            params.update(stochastic=True, seed=self.seed)
        return params

    def step(self, tol: float) -> float:
        """The quantization step the codes of an abs tolerance ``tol`` count in."""
        return stochastic_steps(tol)[0] if self.stochastic else steps_for(tol)[0]

    def decode_step(self, bound: ErrorBound) -> float:
        """:meth:`step` for the bound a stream was written under (its header's), checked
        as the config's is: stochastic codes were never written under a pw_rel bound, so
        a stream that says so was not written by this codec (ValueError)."""
        if self.stochastic and bound.resolved_mode == "pw_rel":
            raise ValueError(
                "the stream's header gives block stochastic rounding a pw_rel bound, "
                "which its encoder never writes (a damaged or crafted stream)"
            )
        return self.step(bound.tolerance)

    def encode(self, chunk: np.ndarray, bound: ErrorBound, threads: int = 1, offset: int = 0):
        flat = np.ascontiguousarray(chunk).reshape(-1)
        xv = flat if flat.dtype.itemsize >= 4 else flat.astype(np.float32)
        finish = bytes if self.entropy == "none" else squeeze
        prec, rawb = PREC_BY_DTYPE[flat.dtype], flat.view(np.uint8)
        if self.stochastic:
            return finish(self._stochastic_payload(xv, rawb, prec, bound, offset))
        return encode_values(xv, rawb, prec, bound, finish)

    def _stochastic_payload(self, xv, rawb, prec: int, bound: ErrorBound, offset: int) -> bytes:
        """One chunk's payload with stochastic codes (``offset``: its first element's
        index in the whole array)."""
        _no_pw_rel(bound)
        tol = bound.tolerance
        if not 0.0 < tol < math.inf:  # no level to choose: the nearest codes are exact
            return encode_values(xv, rawb, prec, bound)
        ys = levels(xv, prec, tol, self.seed, offset)
        step, inv, kernel_tol = stochastic_steps(tol)
        steps = (kernel_tol, step, inv)
        with scratch(payload_capacity(xv.size, rawb.size // max(xv.size, 1))) as (out,):
            return bytes(out[: encode_values_into(ys, rawb, prec, bound, out, steps)])

    def payload_capacity(self, size: int, itemsize: int) -> int:
        return payload_capacity(size, itemsize)

    def encode_into(self, chunk: np.ndarray, bound: ErrorBound, out: np.ndarray) -> int:
        flat = np.ascontiguousarray(chunk).reshape(-1)
        xv = flat if flat.dtype.itemsize >= 4 else flat.astype(np.float32)
        size = encode_values_into(xv, flat.view(np.uint8), PREC_BY_DTYPE[flat.dtype], bound, out)
        return size if self.entropy == "none" else squeeze_into(out, size)

    def decode(self, payload, shape, dtype, bound, out=None, threads=1):
        dtype = np.dtype(dtype)
        n = math.prod(shape)
        step = self.decode_step(bound)
        direct = out is not None and out.flags.c_contiguous and out.dtype == dtype
        res = out.reshape(-1) if direct else np.empty(n, dtype)
        pw = bound.resolved_mode == "pw_rel"
        buf = unsqueeze(np.frombuffer(payload, np.uint8), n, dtype.itemsize, pw)
        self._decode_into(buf, n, dtype, pw, step, res)
        return out if direct else deliver(res, shape, out)

    def chunk_decoder(self, shape: tuple, dtype: np.dtype, bound: ErrorBound):
        """:meth:`decode` of chunks of ``shape`` and ``dtype`` into ``out``, the step, the
        precision and the sizes worked out once: a packed payload of 32/64-bit values is
        one kernel call on the caller's memory (the set-up :meth:`decode` does per call
        cost as much as the kernel on a 256 KiB chunk: ``benchmarks/loader.py``'s (c))."""
        dtype = np.dtype(dtype)
        n, step = math.prod(shape), self.decode_step(bound)
        pw = bound.resolved_mode == "pw_rel"
        if self.stages or dtype.itemsize < 4 or dtype not in PREC_BY_DTYPE:
            return super().chunk_decoder(shape, dtype, bound)
        args = (n, dtype.itemsize, PREC_BY_DTYPE[dtype], pw, step)

        def decode(payload, out: np.ndarray) -> None:
            buf = np.frombuffer(payload, np.uint8)
            if buf.size < 1 or buf[0] != bl.MODE_BLOCKS or not out.flags.c_contiguous:
                self.decode(payload, shape, dtype, bound, out=out)
                return
            res = out.reshape(-1)
            if not kb.decode_chunk(buf, *args, res, res.view(np.uint8), _pad(buf.size + 8)):
                raise ValueError("block payload is inconsistent (corrupted or truncated)")

        return decode

    def rows_decoder(self, shape: tuple, dtype: np.dtype, bound: ErrorBound):
        """A :class:`~.rows.RowsDecoder` of one-chunk payloads of ``shape``: 32/64-bit
        floats packed without a zstd stage; None otherwise (decode whole chunks)."""
        dtype = np.dtype(dtype)
        if self.stages or self.entropy != "none" or dtype.itemsize < 4 or len(shape) < 1:
            return None
        if dtype not in PREC_BY_DTYPE:
            return None
        pw = bound.resolved_mode == "pw_rel"
        return RowsDecoder(shape, dtype.newbyteorder("="), pw, self.decode_step(bound))

    @staticmethod
    def _decode_into(buf: np.ndarray, n: int, dtype, pw: bool, step: float, res: np.ndarray):
        """Decode one chunk payload ``buf`` into ``res`` (``n`` values, flat, contiguous);
        ``dtype`` "bfloat16" writes bfloat16 bits into a uint16 ``res``."""
        bf16 = isinstance(dtype, str) and dtype == "bfloat16"
        dtype = np.dtype(np.uint16 if bf16 else dtype)
        itemsize = dtype.itemsize
        if buf.size < 1:
            raise ValueError("block payload is empty")
        if buf[0] == bl.MODE_RAW:
            if buf.size != 1 + n * itemsize:
                raise ValueError(
                    f"raw block chunk has {buf.size - 1} bytes, expected {n * itemsize}"
                )
            res[:] = buf[1:].view(dtype.newbyteorder("<"))
            return
        if buf[0] != bl.MODE_BLOCKS:
            raise bl.mode_error(int(buf[0]))
        prec = PREC_BFLOAT16 if bf16 else PREC_BY_DTYPE[dtype]
        if itemsize >= 4:
            with scratch(buf.size + 8) as (pad,):
                ok = kb.decode_chunk(buf, n, itemsize, prec, pw, step, res, res.view(np.uint8), pad)
        else:
            with scratch(buf.size + 8, 4 * n, n * itemsize) as (pad, vb, rawb):
                vals = vb.view(np.float32)
                ok = kb.decode_chunk(buf, n, itemsize, prec, pw, step, vals, rawb, pad)
                if ok:
                    BlockCodec._overlay_16bit(buf, n, itemsize, bf16, vals, rawb, res)
        if not ok:
            raise ValueError("block payload is inconsistent (corrupted or truncated)")

    @staticmethod
    def _overlay_16bit(buf, n, itemsize, bf16, vals, rawb, res):
        """res = the decoded float32 ``vals`` rounded to the 16-bit dtype, with the raw
        blocks' bytes from ``rawb`` laid over them."""
        with np.errstate(over="ignore"):  # raw blocks hold garbage until overlaid
            res[:] = _bfloat16_bits(vals) if bf16 else vals
        nb = -(-n // bl.BLOCK)
        raw = bl.is_raw(buf[bl.head_at(0) : bl.head_at(nb)])
        if raw.any():
            pick = np.repeat(raw, bl.BLOCK * itemsize)[: n * itemsize]
            res.view(np.uint8)[pick] = rawb[pick]

    def encode_tensor(self, t, bound: ErrorBound, chunk_rows: int):
        step, inv = steps_for(bound.tolerance)
        pw = bound.resolved_mode == "pw_rel"
        elems = elements_per_chunk(t.shape, chunk_rows)
        if self.stochastic:
            payload, lengths = self._stochastic_tensor(t, bound, elems)
        else:
            args = (t, elems, pw, bound.tolerance, step, inv)
            payload, lengths = _run_kernels("encode", t.is_cuda, args)
        return (payload, lengths) if self.entropy == "none" else squeeze_tensor(payload, lengths)

    def _stochastic_tensor(self, t, bound: ErrorBound, elems: int):
        """(payload, lengths) of ``t`` in stochastic codes, chunk by chunk on the host (the
        bytes :meth:`encode` writes for each chunk), the payload on ``t``'s device."""
        import torch

        flat = t.detach().reshape(-1).cpu()
        n = flat.numel()
        if n == 0:
            return torch.zeros(0, dtype=torch.uint8, device=t.device), []
        if flat.dtype == torch.bfloat16:
            xv, prec = flat.float().numpy(), PREC_BFLOAT16
            rawb = flat.view(torch.int16).numpy().view(np.uint8)
        else:
            arr = flat.numpy()
            xv = arr if arr.itemsize >= 4 else arr.astype(np.float32)
            rawb, prec = arr.view(np.uint8), PREC_BY_DTYPE[arr.dtype]
        size = flat.element_size()
        parts = _map_chunks(
            lambda a: self._stochastic_payload(
                xv[a : a + elems], rawb[a * size : (a + elems) * size], prec, bound, a
            ),
            range(0, n, elems),
        )
        payload = np.concatenate([np.frombuffer(p, np.uint8) for p in parts])
        return torch.from_numpy(payload).to(t.device), [len(p) for p in parts]

    def decode_tensor(self, payload, lengths, shape, dtype, bound, chunk_rows):
        step = self.decode_step(bound)
        pw = bound.resolved_mode == "pw_rel"
        n = math.prod(shape)
        elems = elements_per_chunk(shape, chunk_rows)
        if self.entropy != "none":  # mode-3 chunks are unpacked on the host
            itemsize = dtype.itemsize
            payload, lengths = unsqueeze_tensor(payload, list(lengths), n, elems, itemsize, pw)
        args = (list(lengths), n, elems, dtype, pw, step)
        return _run_kernels("decode", payload.is_cuda, (payload, *args)).reshape(shape)


#: the kernels ``encode_tensor``/``decode_tensor`` use for CUDA tensors: empty until the
#: first use, then ``[kernels.cuda]``, or ``[None]`` once they failed to load or run (the
#: torch ops from then on); put a module in it to choose the kernels, ``[None]`` to skip them
CUDA_KERNELS: list = []


def _run_kernels(name: str, on_cuda: bool, args):
    """``name`` from the numba.cuda kernels for CUDA tensors, else from the host kernels.

    All write the same bytes; where the CUDA kernels cannot load or compile (a
    numba without CUDA support, say) the torch ops take over, with one warning.
    """
    from .kernels import torch_codec as block_torch

    if not on_cuda:
        return getattr(HOST_KERNELS[0], name)(*args)
    if not CUDA_KERNELS:
        try:
            from .kernels import cuda as block_cuda

            CUDA_KERNELS.append(block_cuda)
        except Exception as exc:  # noqa: BLE001 - any import failure means: use torch
            _give_up_cuda(exc)
    module = CUDA_KERNELS[0]
    if module is not None:
        try:
            return getattr(module, name)(*args)
        except ValueError:
            raise  # a corrupted payload: the torch ops would say the same
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot compile or run
            _give_up_cuda(exc)
    return getattr(block_torch, name)(*args)


class _HostKernels:
    """The tensor path on CPU tensors: the numba kernels, chunk by chunk, on the tensor's
    own memory (same signatures as ``kernels.torch_codec``, whose torch ops are much
    slower on a CPU: ``python benchmarks/gpu_check.py --cpu-dry-run`` compares them)."""

    @staticmethod
    def encode(t, chunk_elems: int, pw: bool, tol: float, step: float, inv: float):
        import torch

        flat = t.reshape(-1)
        n = flat.numel()
        if n == 0:
            return torch.zeros(0, dtype=torch.uint8), []
        if t.dtype == torch.bfloat16:
            xv, prec = flat.float().numpy(), PREC_BFLOAT16
            rawb = flat.view(torch.int16).numpy().view(np.uint8)
        else:
            arr = flat.numpy()
            xv = arr if arr.itemsize >= 4 else arr.astype(np.float32)
            rawb, prec = arr.view(np.uint8), PREC_BY_DTYPE[arr.dtype]
        itemsize = t.element_size()
        bound = ErrorBound("pw_rel" if pw else "abs", tol).resolve(None)
        parts = _map_chunks(
            lambda a: encode_values(
                xv[a : a + chunk_elems],
                rawb[a * itemsize : (a + chunk_elems) * itemsize],
                prec,
                bound,
            ),
            range(0, n, chunk_elems),
        )
        lengths = [len(p) for p in parts]
        payload = torch.empty(sum(lengths), dtype=torch.uint8)
        np.concatenate([np.frombuffer(p, np.uint8) for p in parts], out=payload.numpy())
        return payload, lengths

    @staticmethod
    def decode(payload, lengths: list, n: int, chunk_elems: int, dtype, pw: bool, step: float):
        import torch

        if n == 0:
            return torch.zeros(0, dtype=dtype)
        nchunks = -(-n // chunk_elems)
        if len(lengths) != nchunks:
            raise ValueError(f"{len(lengths)} chunk payloads for {nchunks} chunks")
        if sum(lengths) != payload.numel():
            raise ValueError(
                f"chunk lengths add up to {sum(lengths)} bytes but the payload has "
                f"{payload.numel()}"
            )
        buf = payload.numpy()
        out = torch.empty(n, dtype=dtype)
        bf16 = dtype == torch.bfloat16
        res = out.view(torch.int16).numpy().view(np.uint16) if bf16 else out.numpy()
        kind = "bfloat16" if bf16 else res.dtype
        starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()

        def one(i: int) -> None:
            a, m = i * chunk_elems, min(chunk_elems, n - i * chunk_elems)
            chunk = buf[starts[i] : starts[i + 1]]
            BlockCodec._decode_into(chunk, m, kind, pw, step, res[a : a + m])

        _map_chunks(one, range(nchunks))
        return out


def _map_chunks(fn, items) -> list:
    """``[fn(i) for i in items]``, on as many threads as torch uses (the kernels release
    the GIL), a few runs of chunks to a thread."""
    import torch

    return map_grouped(fn, items, torch.get_num_threads())


_pads = threading.local()


def _pad(nbytes: int) -> np.ndarray:
    """This thread's kernel scratch of at least ``nbytes`` bytes (kept for its next chunk:
    the kernel holds it only during one call, which never calls back here)."""
    pad = getattr(_pads, "buf", None)
    if pad is None or pad.size < nbytes:
        pad = _pads.buf = np.empty(max(nbytes, 1 << 16) * 5 // 4, np.uint8)
    return pad


def _bfloat16_bits(vals: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even), as uint16 bits."""
    import torch

    return torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


#: the kernels ``encode_tensor``/``decode_tensor`` use for CPU tensors (tests swap in
#: ``kernels.torch_codec`` to check that the torch ops write the same bytes)
HOST_KERNELS: list = [_HostKernels]


def _give_up_cuda(exc: Exception) -> None:
    import warnings

    CUDA_KERNELS[:] = [None]
    warnings.warn(
        f"block codec: the CUDA kernels cannot run here ({type(exc).__name__}: {exc}); "
        "using torch tensor ops instead (same bytes, slower)",
        RuntimeWarning,
        stacklevel=3,
    )


def _no_pw_rel(bound) -> None:
    if bound is not None and bound.resolved_mode == "pw_rel":
        raise ValueError(
            "block stochastic rounding takes abs or rel bounds, not pw_rel (its levels "
            "are one step apart, the same for every value); use abs= or rel="
        )


def elements_per_chunk(shape, chunk_rows: int) -> int:
    """Elements in a chunk of ``chunk_rows`` rows of an array of ``shape`` (at least 1)."""
    return max(1, chunk_rows * math.prod(shape[1:])) if len(shape) else 1
