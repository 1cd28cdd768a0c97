"""Bit-level primitives for numba kernels: bit counts, unaligned 8-byte reads and writes,
and two vector steps of the ``block`` decoder (fields of a word, running sums).

Each of the first compiles to one machine instruction (``tzcnt``, ``lzcnt``, an
unaligned ``mov``); the vector steps are written as portable LLVM vector IR, which
LLVM lowers to whatever vector instructions the host has. The byte streams are
little-endian by specification (formats/SPEC.md) and ``load_u64``/``store_u64`` move
them as such, so the module refuses big-endian hosts.
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


#: lanes of :func:`running_sum16`'s vector
SCAN_LANES = 16


@intrinsic
def running_sum16(typingctx, arr, idx, carry):
    """a[idx : idx + 16] = ``carry`` plus the running sums of a[idx : idx + 16], in place,
    for a contiguous int32 array ``a`` (sums wrap modulo 2**32, as int32 stores do);
    returns the last sum. One vector of 16 lanes, four shift-and-add steps (log2 16),
    where a loop would add the 16 values one after another; the caller guarantees
    ``idx + 16 <= a.size``."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int32 and arr.layout == "C"):
        return None
    i32 = ir.IntType(32)
    vty = ir.VectorType(i32, SCAN_LANES)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        vptr = builder.bitcast(builder.gep(ary.data, [args[1]]), vty.as_pointer())
        x = builder.load(vptr, align=4)
        zero = ir.Constant(vty, None)
        k = 1
        while k < SCAN_LANES:  # lane i gets lane i - k (zero below k)
            lanes = [i - k if i >= k else SCAN_LANES for i in range(SCAN_LANES)]
            x = builder.add(x, builder.shuffle_vector(x, zero, ir.Constant(vty, lanes)))
            k *= 2
        one = builder.insert_element(zero, args[2], ir.Constant(i32, 0))
        x = builder.add(x, builder.shuffle_vector(one, zero, ir.Constant(vty, [0] * SCAN_LANES)))
        builder.store(x, vptr, align=4)
        return builder.extract_element(x, ir.Constant(i32, SCAN_LANES - 1))

    return types.int32(arr, types.int64, types.int32), codegen


@intrinsic
def split8(typingctx, arr, idx, v, w):
    """a[idx : idx + 8] = the eight ``w``-bit fields (``w`` <= 8) of uint64 ``v``, lowest
    first, for a contiguous int32 array ``a``: one vector shift by (0, w, ..., 7w) and one
    mask, where a loop would take each field in turn; the caller guarantees
    ``idx + 8 <= a.size``."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int32 and arr.layout == "C"):
        return None
    i64 = ir.IntType(64)
    v64 = ir.VectorType(i64, 8)

    def splat(builder, x):
        one = builder.insert_element(ir.Constant(v64, None), x, ir.Constant(ir.IntType(32), 0))
        lanes = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)
        return builder.shuffle_vector(one, ir.Constant(v64, None), lanes)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        v, w = args[2], args[3]
        mask = builder.sub(builder.shl(ir.Constant(i64, 1), w), ir.Constant(i64, 1))
        shifts = builder.mul(splat(builder, w), ir.Constant(v64, list(range(8))))
        fields = builder.and_(builder.lshr(splat(builder, v), shifts), splat(builder, mask))
        codes = builder.trunc(fields, ir.VectorType(ir.IntType(32), 8))
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), codes.type.as_pointer())
        builder.store(codes, ptr, align=4)
        return context.get_dummy_value()

    return types.none(arr, types.int64, types.uint64, types.uint64), codegen


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
