/* The decoder of the set-partitioning (SPECK-style) coding of `sz` predictor 15's
 * coefficients (SPEC.md "CDF 9/7", compress/sz/kernels/speck.py, whose decode this
 * mirrors step for step). A set is a box below 2^u; its bit length comes in unary from
 * plane u - 1 (0: insignificant there); a significant element then has its sign and the
 * bits below its leading one; a significant box splits in halves along every dimension
 * longer than 1 (first half the longer, children in C order of their halves), each child
 * with a bit saying whether its bit length is the box's (the last child's left out where
 * none before said 1), coded depth first. */
#include <stdlib.h>

#include "sz_speck.h"

/* kernels/speck.py STACK_ROOM: a split pushes at most 16 children, nested at most 64
 * deep (each level halves a length below 2^64) */
enum { STACK_ROOM = 16 * 66 };

typedef struct entry {
    uint64_t box[8];
    int u, exact;
} entry;

typedef struct bits {
    const uint8_t *p;
    uint64_t pos, n;
} bits;

/* the next bit into *bit, or -1 where none is left */
static int get(bits *b, int *bit)
{
    if (b->pos >= b->n)
        return -1;
    *bit = b->p[b->pos >> 3] >> (7 - (b->pos & 7)) & 1;
    b->pos++;
    return 0;
}

static unsigned children(const uint64_t box[8])
{
    unsigned s = 0;
    for (int d = 0; d < 4; d++)
        s += box[4 + d] > 1;
    return 1u << s;
}

/* _child: child j of box, the first halved dimension's half in j's highest bit */
static void child(const uint64_t box[8], unsigned j, uint64_t out[8])
{
    int s = 0;
    for (int d = 0; d < 4; d++)
        s += box[4 + d] > 1;
    for (int d = 0; d < 4; d++) {
        uint64_t lo = box[d], n = box[4 + d];
        if (n > 1) {
            uint64_t h = (n + 1) / 2;
            s--;
            if (j >> s & 1)
                lo += h, n -= h;
            else
                n = h;
        }
        out[d] = lo;
        out[4 + d] = n;
    }
}

/* one element: its sign and the b - 1 bits below its leading one */
static int element(bits *b, int bl, const uint64_t box[8], const uint64_t sh[4], int64_t *k)
{
    int neg, bit;
    if (get(b, &neg))
        return -1;
    uint64_t v = 1;
    for (int i = 0; i < bl - 1; i++) {
        if (get(b, &bit))
            return -1;
        v = v << 1 | (uint64_t)bit;
    }
    k[((box[0] * sh[1] + box[1]) * sh[2] + box[2]) * sh[3] + box[3]] =
        neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

/* the sets from the stack down to none; -1 where the bits end early */
static int sets(bits *b, entry *stack, size_t sp, size_t cap, const uint64_t sh[4],
                int64_t *k)
{
    while (sp) {
        entry cur = stack[--sp];
        int bl = cur.u, bit;
        if (!cur.exact) {
            while (bl > 0) {
                if (get(b, &bit))
                    return -1;
                if (bit)
                    break;
                bl--;
            }
            if (bl == 0)
                continue;
        }
        const uint64_t *bx = cur.box;
        if (bx[4] * bx[5] * bx[6] * bx[7] == 1) {
            if (element(b, bl, bx, sh, k))
                return -1;
            continue;
        }
        unsigned nc = children(bx);
        if (cap - sp < nc)
            return -2; /* cannot happen: STACK_ROOM bounds the nesting */
        int said = 0;
        for (unsigned j = 0; j < nc; j++) {
            entry *e = &stack[sp + nc - 1 - j];
            child(bx, j, e->box);
            int sig = 1;
            if (j < nc - 1 || said) {
                if (get(b, &sig))
                    return -1;
            }
            said |= sig;
            e->u = sig ? bl : bl - 1;
            e->exact = sig;
        }
        sp += nc;
    }
    return 0;
}

int tp_sz_speck_decode(const uint8_t *buf, size_t len, int top, const uint64_t (*boxes)[8],
                       size_t nb, const uint64_t sh[4], int64_t *k, tp_err *err)
{
    if (top < 0 || top > TP_SPECK_MAX_PLANES)
        return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 bit planes above 53");
    if (len > UINT64_MAX / 8 || nb > SIZE_MAX / sizeof(entry) - STACK_ROOM)
        return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 bit planes too long");
    size_t cap = nb + STACK_ROOM;
    entry *stack = malloc(cap * sizeof *stack);
    if (!stack)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the cdf97 bit planes");
    for (size_t i = 0; i < nb; i++) {
        entry *e = &stack[nb - 1 - i];
        for (int d = 0; d < 8; d++)
            e->box[d] = boxes[i][d];
        e->u = top;
        e->exact = 0;
    }
    bits b = {buf, 0, (uint64_t)len * 8};
    int rc = sets(&b, stack, nb, cap, sh, k);
    free(stack);
    if (rc == -1)
        return tp_fail(err, TP_E_FORMAT, "corrupt stream: the cdf97 bit planes end early");
    if (rc)
        return tp_fail(err, TP_E_FORMAT, "corrupt stream: cdf97 sets nest too deep");
    uint64_t pad = b.n - b.pos;
    if (pad >= 8 || (pad && (buf[len - 1] & ((1u << pad) - 1))))
        return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 bit planes have bytes or bits "
                       "past their end");
    return 0;
}
