"""Bit-level primitives for numba kernels: bit counts, unaligned 8-byte reads and writes.

Each compiles to one machine instruction (``tzcnt``, ``lzcnt``, an unaligned ``mov``). The
byte streams are little-endian by specification (formats/SPEC.md) and
``load_u64``/``store_u64`` move them as such, so the module refuses big-endian hosts.
"""

import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("tensorpress kernels need a little-endian machine")


def _contiguous_bytes(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.uint8 and arr.layout == "C"


@intrinsic
def trailing_zeros(typingctx, v):
    """Trailing zero bits of uint64 ``v`` (``v`` != 0)."""

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.uint64(types.uint64), codegen


@intrinsic
def leading_zeros(typingctx, v):
    """Leading zero bits of uint64 ``v`` (64 for 0)."""

    def codegen(context, builder, signature, args):
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.uint64(types.uint64), codegen


@njit(cache=True, nogil=True, inline="always")
def bit_length(v):
    """Bits needed to write the non-negative integer ``v`` (0 for 0)."""
    return 64 - np.int64(leading_zeros(np.uint64(v)))


@intrinsic
def popcount(typingctx, v):
    """Set bits of uint64 ``v``."""

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return types.uint64(types.uint64), codegen


@intrinsic
def load_u64(typingctx, arr, idx):
    """Bytes ``idx`` .. ``idx + 7`` of a contiguous uint8 array as a little-endian uint64,
    with no alignment needed; the caller guarantees ``idx + 8 <= arr.size``."""
    if not _contiguous_bytes(arr):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(arr, types.int64), codegen


@intrinsic
def store_u64(typingctx, arr, idx, value):
    """Write uint64 ``value`` little-endian into bytes ``idx`` .. ``idx + 7`` of a
    contiguous uint8 array, with no alignment needed; the caller guarantees
    ``idx + 8 <= arr.size``."""
    if not _contiguous_bytes(arr):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        builder.store(args[2], builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(arr, types.int64, types.uint64), codegen


@njit(cache=True, nogil=True, inline="always")
def copy_bytes(dst, at, src, start, n):
    """dst[at : at + n] = src[start : start + n] for contiguous uint8 arrays, 8 bytes at a
    time (numba's slice copy goes byte by byte)."""
    whole = n - n % 8
    for i in range(0, whole, 8):
        store_u64(dst, at + i, load_u64(src, start + i))
    for i in range(whole, n):
        dst[at + i] = src[start + i]


@njit(cache=True, nogil=True, inline="always")
def put_bits(data, at, bit, v, nbits):
    """Write the ``nbits`` (<= 64) bits of uint64 ``v`` at bit ``bit`` from byte ``at`` of
    ``data``, keeping the bits below it; bytes up to 8 past the end are overwritten."""
    bo = at + (bit >> 3)
    sh = np.uint64(bit & 7)
    lo = np.uint64(data[bo]) & ((np.uint64(1) << sh) - np.uint64(1))
    store_u64(data, bo, lo | (v << sh))
    if sh + np.uint64(nbits) > np.uint64(64):
        data[bo + 8] = np.uint8(v >> (np.uint64(64) - sh))


@njit(cache=True, nogil=True, inline="always")
def get_bits(buf, at, bit, nbits):
    """The ``nbits`` (<= 64) bits at bit ``bit`` from byte ``at`` of ``buf`` (which has 8
    readable bytes past them), as uint64."""
    bo = at + (bit >> 3)
    sh = np.uint64(bit & 7)
    v = load_u64(buf, bo) >> sh
    if sh + np.uint64(nbits) > np.uint64(64):
        v |= np.uint64(buf[bo + 8]) << (np.uint64(64) - sh)
    if nbits < 64:
        v &= (np.uint64(1) << np.uint64(nbits)) - np.uint64(1)
    return v
