"""The ``quant`` codec: per-group min/scale quantization to 2, 4 or 8 bits (ActNN, SDP4Bit).

For activations and gradients that only need a fixed number of bits, not an
error bound. Two implementations write identical bytes: numba kernels on numpy
chunks (:meth:`QuantCodec.encode`/``decode``, :mod:`.kernels.quant`) and the
torch ops of :mod:`.groups`, which run unchanged on CPU and GPU
(:meth:`QuantCodec.encode_tensor`/``decode_tensor``, which hand float16/32/64
CPU tensors to the numba kernels).

Each chunk of ``n`` values (C order) is one row of :mod:`.groups`'s
arithmetic with these choices:

* compute dtype float64; parameter dtype P float64 for float64 data, else float32;
* with ``hadamard`` every group is zero-padded to ``group`` values and ``group``
  codes are stored; the signs are ``s_j = 1 - 2 * (hash32(2*seed + 1, j) & 1)``,
  j the position in the chunk (so a chunk decodes on its own);
* with ``stochastic``, ``u = (hash32(2*seed, offset + k) >> 8) * 2**-24`` for code
  index k, ``offset`` the index of the chunk's first element in the whole array;
* the values rebuilt are rounded to the chunk dtype (``R``: float16 and bfloat16
  via float32), and ``max_error = max |x' - x|``. If it is not finite (a NaN or
  infinity in the chunk, or an overflow of the range) the chunk is stored raw.

``hash32`` is :func:`.kernels.hashing.hash32`.

Payload, little-endian. Mode 0: ``u8 0, f64 max_error, P[ngroups] lo,
P[ngroups] scale``, then the codes packed LSB-first (2 bits: ``c0 | c1<<2 |
c2<<4 | c3<<6``, 4 bits: ``c0 | c1<<4``, 8 bits: a byte each; the last byte
zero-padded; without ``hadamard`` only the ``n`` codes of the values). An empty
chunk is ``u8 0, f64 0.0``. Mode 1 (raw): ``u8 1`` then the chunk's
little-endian bytes.
"""

from __future__ import annotations

import itertools
import math
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..byteio import ByteWriter
from ..codec import Codec, deliver
from ..kernels.rounding import PREC_FLOAT16, PREC_FLOAT64, prec_of
from ..registry import register_codec
from .kernels.cpu import quant_decode, quant_encode

MODE_QUANT, MODE_RAW = 0, 1
_HEAD = 9  # u8 mode + f64 max_error
_U_SCALE = 2.0**-24
#: fewest elements per thread worth splitting a chunk's groups among threads
_PARALLEL_MIN_ELEMENTS = 1 << 18
#: CPU tensors of these dtypes take the numba kernels, which run faster than the torch
#: ops on the CPU (one fused loop a chunk instead of many tensor-wide passes);
#: tests set HOST_KERNELS[0] = False to check that the torch ops write the same bytes
HOST_KERNELS = [True]
_HOST_DTYPES = {
    "torch.float16": np.float16,
    "torch.float32": np.float32,
    "torch.float64": np.float64,
}


def _host_dtype(dtype, device):
    """The numpy dtype when a tensor of ``dtype`` on ``device`` takes the numba kernels."""
    return _HOST_DTYPES.get(str(dtype)) if HOST_KERNELS[0] and device.type == "cpu" else None


def _check_bool(name, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise ValueError(f"quant {name} must be true or false, got {v!r}")
    return bool(v)


def _check_int(name, v) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"quant {name} must be an integer, got {v!r}")
    return int(v)


@register_codec
class QuantCodec(Codec):
    """Bits-bounded quantizer: ``bits`` (2, 4, 8) per value plus a float min and scale
    per ``group`` values (a power of two, 16..4096); ``stochastic`` rounding draws
    seeded noise (``seed`` in [0, 2**31)); ``hadamard`` rotates each group first
    (spreads outliers). Takes no error bound; see the module docstring."""

    name = "quant"
    lossy = True
    bounded = False
    dtypes = ("float16", "float32", "float64")
    default_chunk_bytes = 1 << 20
    devices = ("cpu", "cuda")
    reports_max_error = True
    payload_head_bytes = _HEAD

    def __init__(
        self,
        bits: int = 4,
        group: int = 128,
        stochastic: bool = False,
        seed: int = 0,
        hadamard: bool = False,
    ):
        self.bits = _check_int("bits", bits)
        if self.bits not in (2, 4, 8):
            raise ValueError(f"quant bits must be 2, 4 or 8, got {bits!r}")
        self.group = _check_int("group", group)
        if not 16 <= self.group <= 4096 or self.group & (self.group - 1):
            raise ValueError(
                f"quant group must be a power of two from 16 to 4096 values, got {group!r}"
            )
        self.stochastic = _check_bool("stochastic", stochastic)
        self.seed = _check_int("seed", seed)
        if not 0 <= self.seed < 2**31:
            raise ValueError(f"quant seed must be in [0, 2**31), got {seed!r}")
        self.hadamard = _check_bool("hadamard", hadamard)

    def parameters(self) -> dict:
        return {
            "bits": self.bits,
            "group": self.group,
            "stochastic": self.stochastic,
            "seed": self.seed,
            "hadamard": self.hadamard,
        }

    # -- layout --------------------------------------------------------------------

    def _layout(self, n: int) -> tuple[int, int, int]:
        """(groups, codes, packed code bytes) of an ``n``-value chunk."""
        ngroups = -(-n // self.group)
        ncodes = ngroups * self.group if self.hadamard else n
        return ngroups, ncodes, (ncodes * self.bits + 7) // 8

    def payload_size(self, n: int, param_itemsize: int) -> int:
        """Bytes of a mode-0 payload of ``n`` values with ``param_itemsize``-byte lo/scale."""
        ngroups, _, nbytes = self._layout(n)
        return _HEAD + 2 * ngroups * param_itemsize + nbytes

    @staticmethod
    def payload_max_error(payload) -> float:
        """The max abs error a chunk payload records (0.0 for a raw chunk)."""
        head = bytes(memoryview(payload)[:_HEAD])
        if not head:
            raise ValueError("quant payload is empty")
        if head[0] == MODE_RAW:
            return 0.0
        if head[0] != MODE_QUANT:
            raise ValueError(f"unknown quant chunk mode {head[0]}")
        if len(head) < _HEAD:
            raise ValueError(f"quant payload of {len(head)} bytes has no max_error field")
        max_error = struct.unpack_from("<d", head, 1)[0]
        if not 0.0 <= max_error < math.inf:  # a chunk whose error is not finite is stored raw
            raise ValueError(f"quant payload records max_error {max_error!r}")
        return max_error

    # -- numpy / numba path --------------------------------------------------------

    def _check_dtype(self, dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype.name not in self.dtypes:
            raise TypeError(f"codec 'quant' takes {', '.join(self.dtypes)}, not {dtype}")
        return dtype

    def encode(self, chunk, bound=None, threads=1, offset=0) -> bytes:
        """Payload of one chunk; ``offset`` (elements) seeds the noise, ``bound`` is unused."""
        flat = np.ascontiguousarray(chunk).reshape(-1)
        dtype = self._check_dtype(flat.dtype)
        flat = flat.astype(dtype.newbyteorder("="), copy=False)
        n = flat.size
        if n == 0:
            return struct.pack("<Bd", MODE_QUANT, 0.0)
        prec = prec_of(dtype)
        pdt = np.float64 if prec == PREC_FLOAT64 else np.float32
        xin = flat.astype(np.float32) if prec == PREC_FLOAT16 else flat
        ngroups, _, nbytes = self._layout(n)
        lo = np.empty(ngroups, pdt)
        scale = np.empty(ngroups, pdt)
        packed = np.empty(nbytes, np.uint8)
        args = (self.group, self.bits, self.stochastic, self.seed, self.hadamard, int(offset))

        def run(r):
            return quant_encode(xin, *args, prec, r[0], r[1], lo, scale, packed)

        ranges = _split(ngroups, max(1, min(int(threads), n // _PARALLEL_MIN_ELEMENTS)))
        if len(ranges) == 1:
            err = run(ranges[0])
        else:
            with ThreadPoolExecutor(len(ranges)) as pool:
                err = max(pool.map(run, ranges))
        if not err < math.inf:
            return bytes([MODE_RAW]) + flat.astype(dtype.newbyteorder("<")).tobytes()
        w = ByteWriter()
        w.u8(MODE_QUANT)
        w.f64(err)
        w.array(lo)
        w.array(scale)
        w.array(packed)
        return w.getvalue()

    def decode(self, payload, shape, dtype, bound=None, out=None, threads=1) -> np.ndarray:
        """Rebuild a chunk; ``bound`` is unused."""
        dtype = self._check_dtype(dtype)
        shape = tuple(int(d) for d in shape)
        n = math.prod(shape)
        buf = np.frombuffer(payload, np.uint8)
        if buf.size == 0:
            raise ValueError("quant payload is empty")
        mode = int(buf[0])
        if mode == MODE_RAW:
            if buf.size != 1 + n * dtype.itemsize:
                raise ValueError(
                    f"raw quant payload has {buf.size - 1} data bytes, expected "
                    f"{n * dtype.itemsize} for {n} {dtype} values"
                )
            return deliver(buf[1:].view(dtype.newbyteorder("<")).astype(dtype), shape, out)
        if mode != MODE_QUANT:
            raise ValueError(f"unknown quant chunk mode {mode} (expected 0 or 1)")
        prec = prec_of(dtype)
        pdt = np.dtype(np.float64 if prec == PREC_FLOAT64 else np.float32)
        expected = self.payload_size(n, pdt.itemsize)
        if buf.size != expected:
            raise ValueError(
                f"quant payload has {buf.size} bytes, expected {expected} for {n} {dtype} "
                f"values (bits={self.bits}, group={self.group}, hadamard={self.hadamard})"
            )
        ngroups = self._layout(n)[0]
        le = pdt.newbyteorder("<")
        at = _HEAD + ngroups * pdt.itemsize
        lo = buf[_HEAD:at].view(le).astype(pdt)
        scale = buf[at : at + ngroups * pdt.itemsize].view(le).astype(pdt)
        packed = buf[at + ngroups * pdt.itemsize :]
        res = np.empty(n, np.float32 if prec == PREC_FLOAT16 else dtype)
        args = (self.group, self.bits, self.seed, self.hadamard, prec)
        quant_decode(lo, scale, packed, n, *args, 0, ngroups, res)
        return deliver(res.astype(dtype, copy=False), shape, out)

    # -- torch path ----------------------------------------------------------------

    def encode_tensor(self, t, bound, chunk_rows: int):
        """Payloads of all chunks of C-contiguous tensor ``t`` (float16/bfloat16/float32/
        float64, any device), ``chunk_rows`` rows each; see :meth:`Codec.encode_tensor`."""
        import torch

        from .kernels import torch_ops as qt

        pdt = qt.param_dtype(t.dtype)
        if not t.is_contiguous():
            raise ValueError("encode_tensor needs a C-contiguous tensor (call .contiguous())")
        chunk_rows = _check_int("chunk_rows", chunk_rows)
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
        n = t.numel()
        if n == 0:
            return torch.empty(0, dtype=torch.uint8, device=t.device), []
        m = chunk_rows * (n // (t.shape[0] if t.dim() else 1))
        if _host_dtype(t.dtype, t.device) is not None:
            host = t.reshape(-1).numpy()
            parts = [self.encode(host[a : a + m], offset=a) for a in range(0, n, m)]
            payload = torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
            return payload, [len(p) for p in parts]
        rows = [(x, c * m) for c, x in _equal_chunks(t.reshape(-1), m)]  # (values, offset)
        encoded = [self._encode_rows(x, base, pdt) for x, base in rows]
        raw = torch.cat([~torch.isfinite(err) for _, err in encoded]).tolist()  # the one sync
        if not any(raw):
            payload = torch.cat([enc.reshape(-1) for enc, _ in encoded])
            return payload, [enc.shape[1] for enc, _ in encoded for _ in range(enc.shape[0])]
        pieces, lengths = [], []
        flags = iter(raw)
        one = torch.ones(1, dtype=torch.uint8, device=t.device)
        for (x, _), (enc, _) in zip(rows, encoded, strict=True):
            for row in range(x.shape[0]):
                if next(flags):
                    pieces += [one, x[row].view(torch.uint8)]
                    lengths.append(1 + x.shape[1] * x.element_size())
                else:
                    pieces.append(enc[row])
                    lengths.append(enc.shape[1])
        return torch.cat(pieces), lengths

    def _signs(self, ngroups: int, device):
        """Hadamard signs ``[1, ngroups, group]`` keyed on the chunk-local position (None
        without hadamard), so a chunk decodes on its own."""
        if not self.hadamard:
            return None
        import torch

        from .kernels import torch_ops as qt

        pos = torch.arange(ngroups * self.group, device=device)
        return qt.signs(self.seed, pos).view(1, ngroups, self.group)

    def _encode_rows(self, x, base: int, pdt):
        """Mode-0 payloads ``[chunks, bytes]`` of the equal chunks in the rows of ``x`` (the
        first at element ``base``) and their max errors (not finite: store raw)."""
        import torch

        from . import groups as gq
        from .kernels import torch_ops as qt

        nch, m = x.shape
        ngroups, ncodes, _ = self._layout(m)
        signs = self._signs(ngroups, x.device)
        noise = None
        if self.stochastic:  # keyed on the element's index in the whole array
            pos = qt.positions(base, nch, m, ngroups * self.group, x.device)
            noise = qt.uniform_noise(self.seed, pos).view(nch, ngroups, self.group)
        arith = {"compute_dtype": torch.float64, "signs": signs}
        q, lo_p, scale_p = gq.quantize(
            x, self.bits, self.group, param_dtype=pdt, noise=noise, **arith
        )
        codes = gq.pack(q[:, :ncodes], self.bits)
        rec = gq.dequantize(q, lo_p, scale_p, m, self.group, **arith)
        if x.dtype != torch.float64:
            rec.copy_(qt.to_storage(rec, x.dtype))
        err = rec.sub_(x).abs_().amax(1)
        head = torch.zeros(nch, 1, dtype=torch.uint8, device=x.device)
        fields = [head, err.view(torch.uint8).view(nch, 8)]
        fields += [p.view(torch.uint8).view(nch, -1) for p in (lo_p, scale_p)]
        return torch.cat([*fields, codes], 1), err

    def decode_tensor(self, payload, lengths, shape, dtype, bound, chunk_rows: int):
        """Inverse of :meth:`encode_tensor` on ``payload.device`` (``chunk_rows`` as encoded)."""
        import torch

        from .kernels import torch_ops as qt

        qt.param_dtype(dtype)  # TypeError for a dtype the codec does not take
        shape = tuple(int(d) for d in shape)
        n = math.prod(shape)
        lengths = _check_lengths(payload, lengths, n)
        if n == 0:
            return torch.empty(shape, dtype=dtype, device=payload.device)
        payload = payload.contiguous()
        starts = [0, *itertools.accumulate(lengths[:-1])]
        modes = payload[torch.tensor(starts, device=payload.device)].tolist()  # the one sync
        chunk_rows = _check_int("chunk_rows", chunk_rows)
        self._check_chunks(modes, lengths, shape, dtype, chunk_rows)
        m = chunk_rows * (n // (shape[0] if shape else 1))
        chunks = [payload[a : a + ln] for a, ln in zip(starts, lengths, strict=True)]
        host = _host_dtype(dtype, payload.device)
        if host is not None:
            res = np.empty(n, host)
            for i, p in enumerate(chunks):
                size = min(m, n - i * m)
                res[i * m : i * m + size] = self.decode(p.numpy(), (size,), host)
            return torch.from_numpy(res).view(shape)
        out = torch.empty(n, dtype=dtype, device=payload.device)
        for c, dst in _equal_chunks(out, m):  # equal chunks decode in one batch
            self._decode_run(chunks[c : c + dst.shape[0]], modes[c : c + dst.shape[0]], dst)
        return out.view(shape)

    def _check_chunks(self, modes, lengths, shape, dtype, chunk_rows: int) -> None:
        """ValueError unless each payload's mode and length fit a chunk of ``chunk_rows`` rows
        of a ``dtype`` tensor of ``shape``."""
        import torch

        from .kernels import torch_ops as qt

        itemsize = torch.empty(0, dtype=dtype).element_size()
        psize = torch.empty(0, dtype=qt.param_dtype(dtype)).element_size()
        rows = shape[0] if shape else 1
        row_size = math.prod(shape) // rows
        k = len(lengths)
        if -(-rows // chunk_rows) == k:
            sizes = [chunk_rows * row_size] * (k - 1) + [(rows - (k - 1) * chunk_rows) * row_size]
            expected = {
                MODE_RAW: lambda size: 1 + size * itemsize,
                MODE_QUANT: lambda size: self.payload_size(size, psize),
            }
            if all(
                mode in expected and expected[mode](size) == length
                for mode, size, length in zip(modes, sizes, lengths, strict=True)
            ):
                return
        bad = [i for i, mode in enumerate(modes) if mode not in (MODE_QUANT, MODE_RAW)]
        if bad:
            raise ValueError(f"unknown quant chunk mode {modes[bad[0]]} in chunk {bad[0]}")
        raise ValueError(
            f"{k} chunk payloads of {lengths[:4]}... bytes do not match "
            f"shape {shape} in chunks of {chunk_rows} rows"
        )

    def _decode_run(self, chunks: list, modes: list, dst) -> None:
        """Decode chunk payloads of one size into the rows of ``dst [chunks, size]``."""
        import torch

        from .kernels import torch_ops as qt

        pdt = qt.param_dtype(dst.dtype)
        quant = [i for i, mode in enumerate(modes) if mode == MODE_QUANT]
        if len(quant) == len(chunks):  # equal payloads, one after another: view them as rows
            span = chunks[0].numel()
            enc = chunks[0].as_strided((len(chunks), span), (span, 1))
            dst.copy_(qt.to_storage(self._decode_rows(enc, dst.shape[1], pdt), dst.dtype))
        elif quant:
            enc = torch.stack([chunks[i] for i in quant])
            dec = qt.to_storage(self._decode_rows(enc, dst.shape[1], pdt), dst.dtype)
            dst[torch.tensor(quant, device=dst.device)] = dec
        for i, mode in enumerate(modes):
            if mode == MODE_RAW:
                dst[i] = qt.bytes_as(chunks[i][1:], dst.dtype)

    def _decode_rows(self, enc, m: int, pdt):
        """Values ``[chunks, m]`` (float64, before storage rounding) of the mode-0 payloads in
        the rows of ``enc``."""
        import torch

        from . import groups as gq
        from .kernels import torch_ops as qt

        ngroups, ncodes, _ = self._layout(m)
        psize = 8 if pdt == torch.float64 else 4
        at = _HEAD + ngroups * psize
        lo = qt.bytes_as(enc[:, _HEAD:at], pdt)
        scale = qt.bytes_as(enc[:, at : at + ngroups * psize], pdt)
        codes = gq.unpack(enc[:, at + ngroups * psize :], self.bits, ncodes)
        codes = torch.nn.functional.pad(codes, (0, ngroups * self.group - ncodes))
        signs = self._signs(ngroups, enc.device)
        return gq.dequantize(
            codes, lo, scale, m, self.group, compute_dtype=torch.float64, signs=signs
        )


# -- helpers -------------------------------------------------------------------------


def _check_lengths(payload, lengths, n: int) -> list[int]:
    """``lengths`` as ints, after checking that they cut the uint8 ``payload`` into the
    chunks of an ``n``-value tensor (none when ``n`` is 0, none empty otherwise)."""
    import torch

    if payload.dtype != torch.uint8 or payload.dim() != 1:
        raise ValueError("decode_tensor needs a 1-d uint8 payload tensor")
    lengths = [int(v) for v in lengths]
    if sum(lengths) != payload.numel():
        raise ValueError(
            f"chunk lengths add up to {sum(lengths)} bytes but the payload has {payload.numel()}"
        )
    if n == 0 and lengths:
        raise ValueError(f"an empty tensor has no chunks, got {len(lengths)}")
    if n and (not lengths or min(lengths) < 1):
        raise ValueError("every chunk of a non-empty tensor needs a non-empty payload")
    return lengths


def _equal_chunks(flat, m: int):
    """``(first chunk index, view [chunks, size])`` of the runs of equal-size chunks of
    ``m`` values in 1-d ``flat``: the whole chunks, then a short last one."""
    n = flat.numel()
    whole = n // m
    if whole:
        yield 0, flat[: whole * m].view(whole, m)
    if n > whole * m:
        yield whole, flat[whole * m :].view(1, n - whole * m)


def _split(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous near-equal ranges covering 0..count-1."""
    parts = max(1, min(parts, count))
    bounds = [count * i // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))
