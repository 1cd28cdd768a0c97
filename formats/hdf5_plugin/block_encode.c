/* The `block` encoder (SPEC.md "block"), byte for byte as compress/block/kernels/encode.py
 * writes a chunk payload (entropy "none"): each value quantized on its own and checked as
 * the decoder reconstructs it, each block of 64 the smallest of four packings, a block
 * that cannot be quantized stored raw (one value when all are equal). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "tp_encode.h"

enum { BLOCK = 64, RAW_WIDTH = 31, SIGNED = 0x20, SPARSE = 0x40, DELTA = 0x80,
       HALF = 32, RANK_MAX = 14, MASK_BASE = RANK_MAX * (RANK_MAX + 1) / 2 };
#define QMAX ((double)((1 << 28) - 1))

/* C(n, k) for n <= 32 and the bits of ranks below it: the index's sizes (positions.py) */
static uint64_t comb(unsigned n, unsigned k)
{
    if (k > n)
        return 0;
    uint64_t c = 1;
    for (unsigned j = 1; j <= k; j++)
        c = c * (n - k + j) / j;
    return c;
}

static unsigned bit_length(uint64_t v)
{
    return v ? 64 - (unsigned)__builtin_clzll(v) : 0;
}

static unsigned half_bits(unsigned n, unsigned i)
{
    uint64_t c = comb(n, i);
    return bit_length(c ? c - 1 : 0);
}

/* the index bits the encoder counts for k non-zero codes (COST_BITS: the worst split) */
static unsigned cost_bits(unsigned m, unsigned k)
{
    if (k > RANK_MAX)
        return m;
    unsigned most = 0;
    for (unsigned a = 0; a <= k; a++) {
        unsigned b = half_bits(HALF, k - a) + half_bits(HALF, a);
        most = b > most ? b : most;
    }
    return most;
}

/* the rank of the i positions set in bits (all below 32) */
static uint64_t rank_half(uint64_t bits, unsigned i)
{
    uint64_t r = 0;
    for (unsigned j = 0; j < i; j++) {
        r += comb((unsigned)__builtin_ctzll(bits), j + 1);
        bits &= bits - 1;
    }
    return r;
}

/* count byte, index value and its bits for a sparse block of m values (encode_index) */
static uint8_t encode_index(uint64_t mask, unsigned m, uint64_t *v, unsigned *nbits)
{
    uint64_t lo = mask & 0xFFFFFFFFu, hi = mask >> HALF;
    unsigned b = (unsigned)__builtin_popcountll(lo), a = (unsigned)__builtin_popcountll(hi);
    unsigned k = a + b;
    if (k > RANK_MAX) {
        *v = mask, *nbits = m;
        return (uint8_t)(MASK_BASE + k);
    }
    unsigned nlo = half_bits(m < HALF ? m : HALF, b);
    *v = rank_half(lo, b) | rank_half(hi, a) << nlo;
    *nbits = nlo + half_bits(m > HALF ? m - HALF : 0, a);
    return (uint8_t)(k * (k + 1) / 2 + a);
}

/* float16 bits back to a double (exact) */
static double half_value(uint16_t h)
{
    int e = h >> 10 & 0x1F, s = h & 0x3FF;
    double v = e == 0 ? ldexp(s, -24) : e == 31 ? (s ? NAN : INFINITY) : ldexp(s | 0x400, e - 25);
    return h & 0x8000 ? -v : v;
}

/* t * step rounded to the stored dtype (rounding.round_via_float32) */
static inline double to_storage(double v, size_t itemsize)
{
    if (itemsize == 8)
        return v;
    float f = (float)v;
    if (itemsize == 4)
        return f;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return half_value(tp_half_from_float_bits(bits));
}

/* layout.codable: code t reconstructs x as r within the bound */
static inline int codable(double x, double t, double r, int pw, double tol)
{
    if (!(fabs(t) <= QMAX))
        return 0;
    if (pw) {
        if (!(fabs(r - x) <= tol * fabs(x) && fabs(r) < INFINITY))
            return 0;
        return r * x > 0.0 || (x == 0.0 && !signbit(x));
    }
    if (tol == 0.0 && x == 0.0 && signbit(x))
        return 0;
    return fabs(r - x) <= tol;
}

typedef struct enc {
    const double *x; /* the chunk's values, exact */
    const uint8_t *raw; /* their stored bytes (little-endian) */
    size_t itemsize;
    int pw;
    double tol, step, inv;
} enc;

/* codes of values s..s+m-1 into q (encode.py _quant_block); returns how many miss */
static int quantize(const enc *e, uint64_t s, unsigned m, double bstep, double binv,
                    int32_t *q)
{
    int bad = 0;
    for (unsigned j = 0; j < m; j++) { /* no branch: the loop vectorizes */
        double x = e->x[s + j], t = rint(x * binv);
        double r = to_storage(t * bstep, e->itemsize);
        int ok = fabs(t) <= QMAX && (e->pw ? codable(x, t, r, 1, e->tol) : fabs(r - x) <= e->tol);
        bad += !ok;
        q[j] = fabs(t) <= QMAX ? (int32_t)t : 0;
    }
    if (e->tol == 0.0 && !e->pw)
        for (unsigned j = 0; j < m; j++)
            bad += e->x[s + j] == 0.0 && signbit(e->x[s + j]);
    if (!bad)
        return 0;
    bad = 0; /* a value that misses after rounding gets the other neighbour of x/step */
    for (unsigned j = 0; j < m; j++) {
        double x = e->x[s + j], u = x * binv, t = rint(u);
        if (!codable(x, t, to_storage(t * bstep, e->itemsize), e->pw, e->tol)) {
            t = u > t ? t + 1.0 : t - 1.0;
            bad += !codable(x, t, to_storage(t * bstep, e->itemsize), e->pw, e->tol);
        }
        q[j] = fabs(t) <= QMAX ? (int32_t)t : 0;
    }
    return bad;
}

/* pw_rel: the step exponent of a block (2**k <= 2 tol min|x|, clamped) */
static int pw_exponent(const enc *e, uint64_t s, unsigned m)
{
    double lo = INFINITY;
    for (unsigned j = 0; j < m; j++) {
        double a = fabs(e->x[s + j]);
        lo = a != 0.0 && a < lo ? a : lo; /* as Python's min(lo, a): NaN never wins */
    }
    double a2 = e->tol * (lo != INFINITY ? lo : 0.0);
    a2 = a2 + a2;
    int k = 1022;
    if (isfinite(a2)) {
        frexp(a2, &k);
        k -= 1;
    }
    return k < -1022 ? -1022 : k > 1022 ? 1022 : k;
}

/* (bits, SIGNED or 0) of codes from mn to mx */
static unsigned width_of(int64_t mn, int64_t mx, int *sg)
{
    *sg = mn < 0 ? SIGNED : 0;
    if (mn >= 0)
        return bit_length((uint64_t)mx);
    int64_t a = 2 * mx, b = -2 * mn - 1;
    return bit_length((uint64_t)(a > b ? a : b));
}

/* LSB-first bit writer onto zeroed bytes */
typedef struct bits {
    uint8_t *p;
    uint64_t bit;
} bits;

static inline void put(bits *w, uint64_t v, unsigned n)
{
    while (n) {
        unsigned sh = (unsigned)(w->bit & 7), take = 8 - sh < n ? 8 - sh : n;
        w->p[w->bit >> 3] |= (uint8_t)((v & ((1u << take) - 1)) << sh);
        v >>= take, n -= take, w->bit += take;
    }
}

/* the packed data of a block with header head: codes (or differences from prev) */
static size_t pack(const int32_t *q, int32_t prev, unsigned m, uint8_t head, uint8_t *data,
                   uint8_t *count)
{
    unsigned w = head & 0x1F;
    uint64_t u[BLOCK], mask = 0;
    unsigned cnt = 0;
    for (unsigned j = 0; j < m; j++) {
        int64_t c = head & DELTA ? (int64_t)q[j] - (j ? q[j - 1] : prev) : q[j];
        uint64_t v = head & SIGNED ? (uint64_t)(c * 2) ^ (uint64_t)(c >> 63) : (uint64_t)c;
        if (head & SPARSE) {
            mask |= (uint64_t)(v != 0) << j;
            if (v)
                u[cnt++] = v;
        } else {
            u[cnt++] = v;
        }
    }
    bits bw = {data, 0};
    if (w)
        for (unsigned j = 0; j < cnt; j++)
            put(&bw, u[j], w);
    if (head & SPARSE) { /* the index follows the codes (positions.py) */
        uint64_t v;
        unsigned ib;
        *count = encode_index(mask, m, &v, &ib);
        for (unsigned done = 0; done < ib; done += 32)
            put(&bw, v >> done, ib - done < 32 ? ib - done : 32);
    }
    return (size_t)((bw.bit + 7) / 8);
}

/* the header byte of a quantized block: the smallest of the four packings, or 0xFF
 * where its codes are wider than its raw bytes */
static int choose(const int32_t *q, int32_t prev, unsigned m, size_t itemsize)
{
    int64_t mn_d = INT32_MAX, mx_d = -INT32_MAX, mn_l = INT32_MAX, mx_l = -INT32_MAX;
    unsigned nz_d = 0, nz_l = 0;
    for (unsigned j = 0; j < m; j++) {
        int64_t v = q[j], d = (int32_t)(q[j] - (j ? q[j - 1] : prev));
        mn_d = v < mn_d ? v : mn_d, mx_d = v > mx_d ? v : mx_d, nz_d += v != 0;
        mn_l = d < mn_l ? d : mn_l, mx_l = d > mx_l ? d : mx_l, nz_l += d != 0;
    }
    int sg_d, sg_l;
    unsigned w_d = width_of(mn_d, mx_d, &sg_d), w_l = width_of(mn_l, mx_l, &sg_l);
    size_t best = ((size_t)m * w_d + 7) / 8, c;
    if (best > m * itemsize)
        return -1;
    int head = (int)w_d | sg_d;
    if ((c = 1 + (nz_d * w_d + cost_bits(m, nz_d) + 7) / 8) < best)
        best = c, head = (int)w_d | sg_d | SPARSE;
    if ((c = ((size_t)m * w_l + 7) / 8) < best)
        best = c, head = (int)w_l | sg_l | DELTA;
    if ((c = 1 + (nz_l * w_l + cost_bits(m, nz_l) + 7) / 8) < best)
        head = (int)w_l | sg_l | DELTA | SPARSE;
    return head;
}

size_t tp_block_capacity(uint64_t n, size_t itemsize)
{
    return 1 + 12 * (size_t)((n + BLOCK - 1) / BLOCK) + (size_t)n * itemsize;
}

size_t tp_block_encode(const double *x, const uint8_t *raw, uint64_t n, size_t itemsize,
                       int pw, double tol, uint8_t *out, uint8_t *data)
{
    uint64_t nb = (n + BLOCK - 1) / BLOCK;
    enc e = {x, raw, itemsize, pw, tol, 2.0 * tol * (1.0 - 0x1p-12), 0.0};
    if (!isfinite(e.step))
        e.step = DBL_MAX;
    e.inv = e.step > 0 ? 1.0 / e.step : 0.0;
    size_t dpos = 0, nsparse = 0, counts = 1 + (size_t)nb * (pw ? 3 : 1);
    uint8_t *count = out + counts; /* at most nb count bytes; data moved after them */
    int32_t q[BLOCK], prev = 0;
    memset(data, 0, (size_t)n * itemsize + 8);
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t s = b * BLOCK;
        unsigned m = (unsigned)(n - s < BLOCK ? n - s : BLOCK);
        int k = pw ? pw_exponent(&e, s, m) : 0;
        double bstep = pw ? ldexp(1.0, k) : e.step, binv = pw ? ldexp(1.0, -k) : e.inv;
        int head = quantize(&e, s, m, bstep, binv, q) ? -1 : choose(q, prev, m, itemsize);
        if (pw)
            out[1 + nb + 2 * b] = 0, out[2 + nb + 2 * b] = 0;
        if (head < 0) { /* raw: one value where all its bytes repeat */
            size_t bytes = (size_t)m * itemsize, cnt = itemsize;
            const uint8_t *v = raw + s * itemsize;
            for (size_t j = itemsize; j < bytes && cnt == itemsize; j++)
                cnt = v[j] == v[j % itemsize] ? itemsize : bytes;
            out[1 + b] = (uint8_t)(RAW_WIDTH | (cnt == itemsize ? SPARSE : 0));
            memcpy(data + dpos, v, cnt);
            dpos += cnt, prev = 0;
            continue;
        }
        out[1 + b] = (uint8_t)head;
        if (pw)
            out[1 + nb + 2 * b] = (uint8_t)(k & 0xFF), out[2 + nb + 2 * b] = (uint8_t)(k >> 8 & 0xFF);
        dpos += pack(q, prev, m, (uint8_t)head, data + dpos, count + nsparse);
        nsparse += (head & SPARSE) != 0;
        prev = q[m - 1];
    }
    if (counts + nsparse + dpos >= 1 + n * itemsize) { /* no smaller than the values */
        out[0] = 1;
        memcpy(out + 1, raw, (size_t)n * itemsize);
        return 1 + (size_t)n * itemsize;
    }
    out[0] = 2;
    memcpy(out + counts + nsparse, data, dpos);
    return counts + nsparse + dpos;
}
