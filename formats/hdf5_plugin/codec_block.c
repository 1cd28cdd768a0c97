/* The `block` codec (SPEC.md "block"): modes 1 (raw), 2 (blocks of 64 values, each
 * packed at its own width, dense or sparse, direct or delta) and 3 (mode 2 through
 * zstd). Every length is checked before it is read; any inconsistency refuses the
 * chunk, as compress/kernels/block.py's decoder does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "block_index.h"
#include "tp_decode.h"

enum { BLOCK = 64, RAW_WIDTH = 31, MAX_WIDTH = 30, SIGNED = 0x20, SPARSE = 0x40,
       DELTA = 0x80 };

double tp_step_for(double tol);

typedef struct chunk {
    const uint8_t *p;
    size_t size, pos, cpos; /* payload, bytes, data cursor, count-byte cursor */
    uint64_t n, nb;
    size_t itemsize;
    int pw;
    double step;
    int32_t prev; /* the last code of the previous packed block */
    uint8_t *out;
} chunk;

/* nbits (<= 64) bits at bit offset bit of p[0:size], LSB first; bytes past size read 0 */
static inline uint64_t bits_at(const uint8_t *p, size_t size, uint64_t bit, unsigned nbits)
{
    size_t at = (size_t)(bit >> 3);
    unsigned sh = (unsigned)(bit & 7);
    uint64_t v = 0;
    if (at + 8 <= size) {
        memcpy(&v, p + at, 8); /* one unaligned load: hosts are little-endian (tp_decode.h) */
    } else {
        for (int k = 7; k >= 0; k--)
            v = v << 8 | (at + k < size ? p[at + k] : 0);
    }
    v >>= sh;
    if (sh + nbits > 64 && at + 8 < size)
        v |= (uint64_t)p[at + 8] << (64 - sh);
    return nbits < 64 ? v & (((uint64_t)1 << nbits) - 1) : v;
}

/* out[s:s+m] = q * bstep rounded to the dtype, one loop per dtype */
static void store(chunk *c, uint64_t s, const int32_t *q, uint64_t m, double bstep)
{
    if (c->itemsize == 8) {
        for (uint64_t j = 0; j < m; j++) {
            double v = (double)q[j] * bstep;
            memcpy(c->out + 8 * (s + j), &v, 8);
        }
    } else if (c->itemsize == 4) {
        for (uint64_t j = 0; j < m; j++) {
            float f = (float)((double)q[j] * bstep);
            memcpy(c->out + 4 * (s + j), &f, 4);
        }
    } else { /* float16: through float32, two roundings (SPEC.md) */
        for (uint64_t j = 0; j < m; j++) {
            float f = (float)((double)q[j] * bstep);
            uint32_t bits;
            memcpy(&bits, &f, 4);
            uint16_t h = tp_half_from_float_bits(bits);
            memcpy(c->out + 2 * (s + j), &h, 2);
        }
    }
}

static int raw_block(chunk *c, uint8_t head, uint64_t s, uint64_t m)
{
    size_t isz = c->itemsize;
    if (head & SPARSE) { /* constant: one value for all */
        if (c->pos + isz > c->size)
            return -1;
        for (uint64_t i = s; i < s + m; i++)
            memcpy(c->out + i * isz, c->p + c->pos, isz);
        c->pos += isz;
    } else {
        if (m * isz > c->size - c->pos)
            return -1;
        memcpy(c->out + s * isz, c->p + c->pos, m * isz);
        c->pos += m * isz;
    }
    c->prev = 0;
    return 0;
}

/* a sparse block's count byte and index: *mask of its non-zero codes, *cnt of them;
 * *nbits grows by the index's bits */
static int sparse_index(chunk *c, unsigned w, uint64_t m, uint64_t *mask, unsigned *cnt,
                        uint64_t *nbits)
{
    uint8_t code = c->p[c->cpos++];
    *cnt = tp_code_count(code);
    if (*cnt < 1 || *cnt > m)
        return -1;
    *nbits = (uint64_t)*cnt * w;
    unsigned ib = tp_index_bits((unsigned)m, code);
    if (c->pos + (*nbits + ib + 7) / 8 > c->size)
        return -1;
    uint64_t v = bits_at(c->p, c->size, (uint64_t)c->pos * 8 + *nbits, ib);
    *nbits += ib;
    return tp_decode_index(v, code, (unsigned)m, mask) ? 0 : -1;
}

/* u[0:cnt] = the w-bit codes packed LSB first at p, which has 8 readable bytes past
 * them; u has room for cnt rounded up to 8. No branch inside the loops, so they
 * vectorize: up to 8 bits, each 8 codes fill w bytes and come from one 8-byte load; up
 * to 14, 4 codes a load; wider, each code from its own (a <= 7-bit offset and w <= 30) */
static void unpack(const uint8_t *p, unsigned cnt, unsigned w, uint32_t *u)
{
    uint64_t mask = ((uint64_t)1 << w) - 1;
    if (w <= 8) {
        for (unsigned i = 0; i < (cnt + 7) / 8; i++) {
            uint64_t v;
            memcpy(&v, p + (size_t)i * w, 8); /* hosts are little-endian (tp_decode.h) */
            for (unsigned k = 0; k < 8; k++)
                u[8 * i + k] = (uint32_t)(v >> (k * w) & mask);
        }
        return;
    }
    if (w <= 14) { /* 4 codes and a <= 7-bit offset fit one load */
        for (unsigned i = 0; i < (cnt + 3) / 4; i++) {
            uint64_t v, off = (uint64_t)4 * i * w;
            memcpy(&v, p + (off >> 3), 8);
            v >>= off & 7;
            for (unsigned k = 0; k < 4; k++)
                u[4 * i + k] = (uint32_t)(v >> (k * w) & mask);
        }
        return;
    }
    for (unsigned j = 0; j < cnt; j++) {
        uint64_t v, off = (uint64_t)j * w;
        memcpy(&v, p + (off >> 3), 8);
        u[j] = (uint32_t)(v >> (off & 7) & mask);
    }
}

/* the block's codes q[0:m] from its packed data at c->pos (nbytes of it); q has room
 * for BLOCK + 8 codes */
static void codes(const chunk *c, uint8_t head, unsigned w, uint64_t m, unsigned cnt,
                  uint64_t mask, size_t nbytes, int32_t *q)
{
    uint8_t pad[BLOCK * 4 + 16];
    const uint8_t *at = c->p + c->pos;
    if (c->size - c->pos < nbytes + 8) { /* the payload's end: 8 readable bytes past it */
        memset(pad, 0, sizeof pad);
        memcpy(pad, at, nbytes);
        at = pad;
    }
    uint32_t sparse[BLOCK + 8], *u = head & SPARSE ? sparse : (uint32_t *)q;
    unpack(at, cnt, w, u);
    if (head & SIGNED)
        for (unsigned j = 0; j < cnt; j++)
            u[j] = (u[j] >> 1) ^ (0u - (u[j] & 1));
    if (head & SPARSE) { /* the non-zero codes, spread back to their places */
        memset(q, 0, m * sizeof *q);
        for (unsigned j = 0; j < cnt; j++, mask &= mask - 1)
            q[__builtin_ctzll(mask)] = (int32_t)u[j];
    }
}

static int packed_block(chunk *c, uint64_t b, uint8_t head, uint64_t s, uint64_t m)
{
    unsigned w = head & 0x1F;
    double bstep = c->step;
    if (c->pw) {
        const uint8_t *e = c->p + 1 + c->nb + 2 * b;
        int k = (int16_t)(uint16_t)(e[0] | e[1] << 8);
        if (k < -1022 || k > 1022)
            return -1;
        bstep = ldexp(1.0, k);
    }
    int32_t q[BLOCK + 8];
    uint64_t mask = 0, nbits = m * w;
    unsigned cnt = (unsigned)m;
    if ((head & SPARSE) && sparse_index(c, w, m, &mask, &cnt, &nbits))
        return -1;
    size_t nbytes = (size_t)((nbits + 7) / 8);
    if (nbytes > c->size - c->pos)
        return -1;
    codes(c, head, w, m, cnt, mask, nbytes, q);
    if (head & DELTA) { /* running sums from the previous block's last code, mod 2^32 */
        uint32_t v = (uint32_t)c->prev;
        for (uint64_t j = 0; j < m; j++)
            q[j] = (int32_t)(v += (uint32_t)q[j]);
    }
    c->prev = q[m - 1];
    store(c, s, q, m, bstep);
    c->pos += nbytes;
    return 0;
}

/* a mode-2 payload (mode byte included) */
static int blocks(chunk *c)
{
    size_t counts = 1 + (size_t)c->nb * (c->pw ? 3 : 1);
    if (c->size < counts)
        return -1;
    size_t nsparse = 0;
    for (uint64_t b = 0; b < c->nb; b++) {
        uint8_t h = c->p[1 + b];
        unsigned w = h & 0x1F;
        if (w == RAW_WIDTH ? (h & (SIGNED | DELTA)) != 0 : w > MAX_WIDTH)
            return -1;
        nsparse += w != RAW_WIDTH && (h & SPARSE);
    }
    c->cpos = counts;
    c->pos = counts + nsparse;
    if (c->size < c->pos)
        return -1;
    for (uint64_t b = 0; b < c->nb; b++) {
        uint8_t h = c->p[1 + b];
        uint64_t s = b * BLOCK, m = c->n - s < BLOCK ? c->n - s : BLOCK;
        int rc = (h & 0x1F) == RAW_WIDTH ? raw_block(c, h, s, m) : packed_block(c, b, h, s, m);
        if (rc)
            return -1;
    }
    return c->pos == c->size ? 0 : -1;
}

/* the step codes count in: stochastic codes on the step of half the tolerance, divided
 * as Python divides it (stochastic_steps: steps_for(tol / 2), which differs from
 * tol * margin where tol / 2 rounds, in the subnormals) */
static double block_step(const tp_header *h)
{
    return tp_step_for(h->b_stochastic ? h->tolerance / 2.0 : h->tolerance);
}

int tp_block_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                    uint8_t *out, tp_err *err)
{
    chunk c = {p, len, 0, 0, n, (n + BLOCK - 1) / BLOCK, h->itemsize,
               h->bound_mode == TP_BOUND_PW_REL, block_step(h), 0, out};
    if (h->b_stochastic && c.pw) /* as BlockCodec.decode_step: its encoder never writes one */
        return tp_fail(err, TP_E_FORMAT, "block stochastic rounding under a pw_rel bound");
    if (len < 1)
        return tp_fail(err, TP_E_FORMAT, "block payload is empty");
    if (p[0] == 1) {
        if (len - 1 != n * h->itemsize)
            return tp_fail(err, TP_E_FORMAT, "raw block chunk has %zu bytes, expected %llu",
                           len - 1, (unsigned long long)(n * h->itemsize));
        memcpy(out, p + 1, len - 1);
        return 0;
    }
    uint8_t *owned = NULL;
    if (p[0] == 3) { /* mode 2 inside one zstd frame, at most this long */
        size_t limit = 1 + (size_t)c.nb * (c.pw ? 4 : 2) + (size_t)n * h->itemsize, got;
        int rc = tp_zstd_decompress(p + 1, len - 1, limit, &owned, &got, err);
        if (rc)
            return rc;
        uint8_t *full = realloc(owned, got + 1);
        if (!full) {
            free(owned);
            return tp_fail(err, TP_E_MEMORY, "out of memory");
        }
        memmove(full + 1, full, got);
        full[0] = 2;
        owned = full;
        c.p = full;
        c.size = got + 1;
    } else if (p[0] != 2) {
        if (p[0] == 0)
            return tp_fail(err, TP_E_FORMAT, "block chunk in the first block layout (mode 0), "
                           "no longer read: decode it with the tensorpress that wrote it");
        return tp_fail(err, TP_E_FORMAT, "unknown block chunk mode %d", p[0]);
    }
    int rc = blocks(&c);
    free(owned);
    return rc ? tp_fail(err, TP_E_FORMAT, "block payload is inconsistent (corrupted or "
                        "truncated)") : 0;
}
