"""The ``block`` codec as numba.cuda kernels: the bytes and values of ``block_torch``.

One CUDA thread per block of 64 values, each a direct port of the per-block
body of ``kernels/cpu.py``'s ``encode_chunk``; the threads of a CUDA block share
the memory traffic of their tile of consecutive blocks (whose values are one
contiguous range), so that consecutive threads touch consecutive addresses:

1. ``QUANT`` (the quantization kernel): the tile's values are loaded into shared
   memory together; each thread gives its block's codes (into an int32 scratch,
   transposed: code ``j`` of block ``g`` at ``j * nblocks + g``), step exponent
   and raw flag (quantization, neighbour retry, direct width).
2. ``plan_kernel``: with the previous block's raw flag and last code known, the
   delta statistics, the packing choice, the header and count bytes and the byte
   counts.
3. torch ops on the device: one running sum over all blocks' byte counts gives the
   per-chunk sizes (and raw chunks, and where each chunk's regions start); one
   host sync for the lengths.
4. ``write_kernel``: each block's offsets from the running sum; header, exponent
   and count bytes; the data (packed codes and a sparse block's index, staged in
   shared memory, or the bytes of raw blocks and raw chunks) are copied out by the
   whole CUDA block.

Float arithmetic is float64 with only +, -, *, rint and comparisons; products
that meet an addition go through ``dmul_rn`` so the compiler cannot fuse them
into an FMA; 16-bit roundings are integer operations on the float32 bits.

The decoder (``decode``, the values of ``block_torch.decode``): torch ops parse the
headers and counts and give every block its index and data offsets; ``scan_kernel``
checks each sparse block's index and sums its codes (delta) or takes its last code
(direct); one host sync rejects inconsistent payloads; a segmented scan gives each
delta block its carry-in; ``DECODE`` (the decoding kernel) unpacks, reconstructs, rounds
to the dtype and puts the values' bits (raw blocks and raw chunks: their bytes) in a
shared-memory tile that the CUDA block writes out together.

The kernels live in ``kernels/cuda_encode.py`` and ``kernels/cuda_decode.py``
(their shared device functions in ``kernels/cuda_device.py``); this module
runs them between torch ops.

With ``NUMBA_ENABLE_CUDASIM=1`` the kernels run in numba's simulator on CPU
tensors (numpy arrays), which is how the tests check the bytes.
"""

from __future__ import annotations

import torch
from numba import cuda

from . import layout as bl
from .cuda_decode import DECODE, scan_kernel
from .cuda_device import PREC, SIM, TPB
from .cuda_encode import QUANT, SPARSE_ROW, plan_kernel, write_kernel
from .layout import BLOCK, DELTA, SIGNED
from .torch_codec import BlockFields, BlockGrid, carry_in, int_view


def _dev(t: torch.Tensor):
    """A torch tensor as a kernel argument: no copy on a GPU; its numpy view in the
    simulator (which copies it in and back around each launch)."""
    if t.is_cuda:  # no host sync: the kernels run on torch's current stream
        return cuda.as_cuda_array(t, sync=False)
    if not SIM:
        raise ValueError("block_cuda needs a CUDA tensor (or NUMBA_ENABLE_CUDASIM=1)")
    return t.numpy()


def encode(t: torch.Tensor, chunk_elems: int, pw: bool, tol: float, step: float, inv: float):
    """Payloads of all chunks of the flattened C-contiguous ``t``: (uint8 tensor on
    ``t.device``, lengths), the bytes of ``block_torch.encode``."""
    dtype = t.dtype
    prec = PREC[dtype]
    itemsize = t.element_size()
    dev = t.device
    flat = t.reshape(-1).contiguous()
    n = flat.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=dev), []
    nchunks = -(-n // chunk_elems)
    bpc = -(-chunk_elems // BLOCK)  # blocks per full chunk
    nblocks = (n // chunk_elems) * bpc + -(-(n % chunk_elems) // BLOCK)
    xv = flat if itemsize >= 4 else flat.to(torch.float32)
    rawb = flat.view(torch.uint8)
    codes = torch.empty(nblocks * BLOCK, dtype=torch.int32, device=dev)
    blk = torch.empty((4, nblocks), dtype=torch.int64, device=dev)
    sizes = torch.empty((2, nblocks), dtype=torch.int64, device=dev)
    # launch on torch's current stream so the kernels and the torch ops stay in order
    stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream) if t.is_cuda else 0
    geo = (n, chunk_elems, bpc, nblocks, itemsize)
    d_rawb, d_codes, d_blk, d_sizes = _dev(rawb), _dev(codes), _dev(blk), _dev(sizes)
    tpb, quant = QUANT[xv.element_size()]
    quant[(nblocks + tpb - 1) // tpb, tpb, stream](
        _dev(xv), *geo, prec, 1 if pw else 0, float(tol), float(step), float(inv), d_codes, d_blk
    )
    grid = (nblocks + TPB - 1) // TPB
    plan_kernel[grid, TPB, stream](d_rawb, d_codes, d_blk, *geo, d_sizes)

    # per chunk: sizes (one running sum over all blocks' byte counts), then chunks that
    # would not shrink are stored raw
    incl = torch.cumsum(sizes.reshape(-1), 0).reshape(2, nblocks)
    first = torch.arange(nchunks, device=dev) * bpc
    last = torch.clamp(first + bpc, max=nblocks) - 1
    per_chunk = incl[:, last] - incl[:, first] + sizes[:, first]
    n_c = torch.clamp(n - torch.arange(nchunks, device=dev) * chunk_elems, max=chunk_elems)
    counts_at = bl.counts_at(last - first + 1, pw)  # where each chunk's count bytes start
    size_c = counts_at + per_chunk.sum(0)
    raw_c = size_c >= 1 + n_c * itemsize
    size_c = torch.where(raw_c, 1 + n_c * itemsize, size_c)
    lengths = size_c.tolist()  # the one host sync
    start_c = torch.cumsum(size_c, 0) - size_c
    counts_c = start_c + counts_at
    data_c = counts_c + per_chunk[SPARSE_ROW]
    chunks = torch.stack([start_c, raw_c.long(), counts_c, data_c])
    out = torch.empty(sum(lengths), dtype=torch.uint8, device=dev)
    if SIM:
        out.fill_(0xA5)  # a byte the kernels miss shows in the tests
    write_kernel[grid, TPB, stream](
        d_rawb, d_codes, d_blk, d_sizes, _dev(incl), _dev(chunks), *geo, 1 if pw else 0, _dev(out)
    )
    return out, lengths


def decode(payload: torch.Tensor, lengths: list, n: int, chunk_elems: int, dtype, pw, step):
    """The ``n`` values (flattened) of the chunk payloads concatenated in ``payload``,
    on ``payload.device``: the values of ``block_torch.decode``.

    Raises ValueError when a payload is inconsistent with its length.
    """
    dev = payload.device
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(0, dtype=dtype, device=dev)
    lay = BlockGrid(n, chunk_elems, dev)
    nch = lay.nchunks
    if len(lengths) != nch:
        raise ValueError(f"{len(lengths)} chunk payloads for {nch} chunks")
    if min(lengths) < 1:
        raise ValueError("a block chunk payload is empty")
    total = sum(lengths)
    buf = payload.reshape(-1)
    if buf.numel() < total:
        raise ValueError("block payload is shorter than its chunk lengths")
    buf = buf[:total].contiguous()
    prec = PREC[dtype]
    i64 = dict(dtype=torch.int64, device=dev)
    len_c = torch.tensor(lengths, device=dev)
    start_c = torch.cumsum(len_c, 0) - len_c
    # block-level bookkeeping (as block_torch.decode): headers, counts, offsets
    p = BlockFields(buf, start_c, lay, pw, itemsize)
    mode_c, head, raw, code, doff = p.mode_c, p.head, p.raw, p.code, p.doff

    # per block: index checks and the codes' sum or last code (one thread per block)
    nblocks = lay.nblocks
    bpc = lay.bpc
    grid = (nblocks + TPB - 1) // TPB
    stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream) if buf.is_cuda else 0
    geo = (n, chunk_elems, bpc, nblocks)
    bad = torch.empty(nblocks, **i64)
    rel = torch.empty(nblocks, **i64)
    d_buf, d_start, d_mode = _dev(buf), _dev(start_c), _dev(mode_c)
    d_head, d_code, d_doff = _dev(head), _dev(code), _dev(doff)
    scan_kernel[grid, TPB, stream](
        d_buf, *geo, d_start, _dev(len_c), d_mode, d_head, d_code, d_doff, _dev(bad), _dev(rel),
    )  # fmt: skip

    bad_head = (bad != 0) | raw & (head & (SIGNED | DELTA) != 0)
    if pw:
        k = p.exponents()
        bad_head = bad_head | ~raw & ((k < bl.EXP_MIN) | (k > bl.EXP_MAX))
    if bool(p.bad_chunks(bad_head, len_c).any()):  # the one host sync
        bl.check_modes(mode_c.tolist())
        raise ValueError("block payload is inconsistent (corrupted or truncated)")

    # the running value behind delta blocks (``rel``: a delta block's sum of codes, a
    # direct block's last code)
    carry = carry_in(lay, (head & DELTA != 0) & ~raw, raw, rel, rel)

    out = torch.empty(n, dtype=dtype, device=dev)
    ints = out.view(int_view(dtype))
    tpb, dec = DECODE[itemsize]
    dec[(nblocks + tpb - 1) // tpb, tpb, stream](
        d_buf, *geo, itemsize, prec, 1 if pw else 0, float(step), d_start, d_mode, d_head,
        d_code, d_doff, _dev(carry), _dev(ints),
    )  # fmt: skip
    return out


def _bench(n: int = 1 << 26, chunk_bytes: int = 1 << 20, reps: int = 5, device="cuda") -> None:
    """On a GPU: byte identity with ``block_torch`` (encoded bytes, decoded bits) and the
    throughput of both (GB/s of uncompressed values)."""
    import time

    from . import torch_codec as block_torch
    from .layout import steps_for

    g = torch.Generator(device=device).manual_seed(0)
    base = torch.randn(n, device=device, generator=g, dtype=torch.float64)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    base = torch.where(base > 1.5, 0.0, base.cumsum(0) * 1e-3)  # smooth, with zeros
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = base.to(dtype)
        ce = chunk_bytes // x.element_size()
        for mode, tol in (("abs", 1e-3), ("pw_rel", 1e-2)):
            step, inv = steps_for(tol)
            args = (ce, mode == "pw_rel", tol, step, inv)
            times = {}
            for name, fn in (("cuda", encode), ("torch", block_torch.encode)):
                t0 = time.perf_counter()
                out, lengths = fn(x, *args)  # first call: numba compiles the kernels
                sync()
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(x, *args)
                sync()
                times[name] = ((time.perf_counter() - t0) / reps, first, out, lengths)
            (tc, fc, oc, lc), (tt, _, ot, lt) = times["cuda"], times["torch"]
            same = lc == lt and torch.equal(oc, ot)
            gb = x.numel() * x.element_size() / 1e9
            print(
                f"{str(dtype):15} {mode:6} ratio {gb * 1e9 / oc.numel():6.2f} "
                f"cuda {gb / tc:7.2f} GB/s (first call {fc:5.1f} s)  "
                f"torch {gb / tt:7.2f} GB/s  same bytes: {same}"
            )
            dargs = (ot, lt, x.numel(), ce, dtype, mode == "pw_rel", step)
            for name, fn in (("cuda", decode), ("torch", block_torch.decode)):
                t0 = time.perf_counter()
                y = fn(*dargs)  # first call: numba compiles the kernels
                sync()
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(*dargs)
                sync()
                times[name] = ((time.perf_counter() - t0) / reps, first, y)
            (tc, fc, yc), (tt, _, yt) = times["cuda"], times["torch"]
            same = torch.equal(yc.view(torch.uint8), yt.view(torch.uint8))
            print(
                f"{'':15} {'decode':6} {'':12} "
                f"cuda {gb / tc:7.2f} GB/s (first call {fc:5.1f} s)  "
                f"torch {gb / tt:7.2f} GB/s  same bits: {same}"
            )


if __name__ == "__main__":  # python -m tensorpress.compress.block.kernels.cuda [n]
    import sys

    _bench(*(int(a) for a in sys.argv[1:2]))
