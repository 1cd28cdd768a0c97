"""Triton pieces the device block kernels share (``tiles_triton.py``,
``gelu_triton.py``): reading float32/float16/bfloat16 elements, the range pass that
also clears a scan's state, the decoupled look-back that gives a block its offset in a
record without a launch of its own, and writing a block's codes as 32-bit words.
"""

from __future__ import annotations

import triton
import triton.language as tl

CLEAR_BLOCK = 1024  # state words a clearing program zeroes at a time


@triton.jit
def load(ptr, idx, inside, KIND: tl.constexpr):
    """Elements of a float32/float16/bfloat16 tensor, as float32 (bfloat16 read as its
    int16 bits)."""
    if KIND == 2:
        bits = ptr.to(tl.pointer_type(tl.int16))
        b = tl.load(bits + idx, mask=inside, other=0).to(tl.int32)
        v = (b << 16).to(tl.float32, bitcast=True)
    else:
        v = tl.load(ptr + idx, mask=inside, other=0.0).to(tl.float32)
    return v


@triton.jit
def exclusive_prefix(state_ptr, t, value):
    """The sum of ``value`` over the tickets before ``t`` (decoupled look-back). A state
    word holds a flag in its high 32 bits (0 not yet, 1 the block's value, 2 the running
    sum through the block) and the value or sum in its low 32."""
    value = value.to(tl.int64)
    tl.atomic_xchg(state_ptr + t, tl.where(t == 0, 2 << 32, 1 << 32) | value)
    prefix = value * 0
    j = t - 1
    while j >= 0:
        s = tl.atomic_add(state_ptr + j, 0)
        flag = s >> 32
        prefix += tl.where(flag > 0, s & 0xFFFFFFFF, 0)
        j = tl.where(flag == 2, -1, tl.where(flag == 1, j - 1, j))
    tl.atomic_xchg(state_ptr + t, (2 << 32) | (prefix + value))
    return prefix


@triton.jit
def range_partials(x_ptr, parts_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    """This program's smallest and largest finite element of its strided share of the
    ``n`` elements, stored at ``parts_ptr[pid]`` and ``parts_ptr[nprog + pid]`` (float32;
    +inf and -inf where it saw none)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lo = tl.full([BLOCK], float("inf"), tl.float32)
    hi = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = load(x_ptr, offs, offs < n, KIND)
        fin = (tl.abs(x) < float("inf")) & (offs < n)  # false for NaN
        lo = tl.minimum(lo, tl.where(fin, x, float("inf")))
        hi = tl.maximum(hi, tl.where(fin, x, float("-inf")))
    tl.store(parts_ptr + pid, tl.min(lo, axis=0))
    tl.store(parts_ptr + nprog + pid, tl.max(hi, axis=0))


@triton.jit
def range_clear_kernel(y_ptr, state_ptr, nstate, n, KIND: tl.constexpr,
                        BLOCK: tl.constexpr, CLEAR: tl.constexpr):  # fmt: skip
    # the partials (float32) follow the scan state in the same buffer
    range_partials(y_ptr, (state_ptr + nstate).to(tl.pointer_type(tl.float32)), n, KIND, BLOCK)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * CLEAR, nstate, nprog * CLEAR):
        offs = start + tl.arange(0, CLEAR)
        tl.store(state_ptr + offs, tl.zeros([CLEAR], tl.int64), mask=offs < nstate)


@triton.jit
def pack_words(words_ptr, v, w, first_word, B: tl.constexpr):
    """Write a block's values ``v`` ([B // 32, 32] int64, each below ``2**w``) as ``w``
    words a group of 32, from ``first_word`` ."""
    g = tl.arange(0, B // 32)
    k = tl.arange(0, 32)
    for b in range(w):
        shift = k.to(tl.int64) * w - 32 * b
        up = tl.minimum(tl.maximum(shift, 0), 63)
        down = tl.minimum(tl.maximum(-shift, 0), 63)
        part = tl.where(shift[None, :] >= 0, v << up[None, :], v >> down[None, :])
        low = part.to(tl.uint32).to(tl.int64)
        part = tl.where(((shift < 32) & (shift > -w))[None, :], low, 0)
        word = tl.sum(part, axis=1)
        tl.store(words_ptr + first_word + g * w + b, word.to(tl.uint32).to(tl.int32, bitcast=True))


@triton.jit
def finish_record(rec_ptr, words_ptr, used_ptr, t, nb, widths, head,
                  HEAD: tl.constexpr, B: tl.constexpr):  # fmt: skip
    """Run by every block program ``t`` of ``nb``, written by the last: the record's bytes
    in use (into ``used_ptr``), the spare word after the codes and the header's padding
    between its ``HEAD + 5 nb`` bytes and ``head``. ``widths``: the sum of all blocks'
    widths (a block of ``B`` values at width ``w`` takes ``w B / 32`` words)."""
    last = t == nb - 1
    total = widths * (B // 32)
    tl.store(used_ptr, (head + 4 * (total + 1)).to(tl.int64), mask=last)
    tl.store(words_ptr + total, total.to(tl.int32) * 0, mask=last)
    pad = HEAD + 5 * nb + tl.arange(0, 8)
    tl.store(rec_ptr + pad, tl.zeros([8], tl.uint8), mask=(pad < head) & (pad * 0 + t == nb - 1))
