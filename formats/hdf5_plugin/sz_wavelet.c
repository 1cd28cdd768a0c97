/* `sz` predictor 14 (wavelet; SPEC.md "sz", compress/sz/wavelet.py and its kernels): the
 * codes are the coefficients of a multilevel integer CDF 5/3 lifting of the values' bins
 * (code 2 * radius - 1 escapes an int64 coefficient kept in the side information), the
 * inverse lifting restores the bins exactly, each value is round(bin * 2 * eb), and the
 * fixes overwrite their elements with exact float64 values.
 *
 * The lifting runs on uint64 (two's complement wraparound, as numba's int64) and divides
 * by 2 and 4 with an arithmetic shift, which is Python's floor division: no signed
 * overflow even on crafted escapes. Side information, little-endian:
 *   u64 n, n i64 escapes; u64 m, m u64 fix indices (ascending, < elements), m f64 values */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

/* wavelet.py LEVELS, MIN_LENGTH */
enum { LEVELS = 8, MIN_LENGTH = 8 };

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = v << 8 | p[b];
    return v;
}

/* floor(v / 2^k) of the int64 whose bits are v, as bits: an arithmetic shift */
static inline uint64_t floor_shift(uint64_t v, unsigned k)
{
    uint64_t s = v >> k;
    return v >> 63 ? s | ~(~(uint64_t)0 >> k) : s;
}

/* unlift_rows on one row x of n >= 2 coefficients (low-pass first), tmp has room for n */
static void unlift(uint64_t *x, uint64_t n, uint64_t *tmp)
{
    uint64_t ns = (n + 1) / 2, nd = n / 2;
    for (uint64_t i = 0; i < ns; i++) {
        uint64_t dl = i > 0 ? x[ns + i - 1] : x[ns];
        uint64_t dr = i < nd ? x[ns + i] : x[ns + nd - 1];
        tmp[2 * i] = x[i] - floor_shift(dl + dr + 2, 2);
    }
    for (uint64_t i = 0; i < nd; i++) {
        uint64_t right = 2 * i + 2 < n ? tmp[2 * i + 2] : tmp[2 * i];
        tmp[2 * i + 1] = x[ns + i] + floor_shift(tmp[2 * i] + right, 1);
    }
    memcpy(x, tmp, n * sizeof *x);
}

/* unlift the w adjacent lines starting at p (element t of line j at p[t * s + j]) at
 * once, the same arithmetic as unlift per line; tmp has room for n * w */
static void unlift_lines(uint64_t *p, uint64_t n, uint64_t s, uint64_t w, uint64_t *tmp)
{
    uint64_t ns = (n + 1) / 2, nd = n / 2;
    for (uint64_t i = 0; i < ns; i++) {
        const uint64_t *dl = p + (i > 0 ? ns + i - 1 : ns) * s;
        const uint64_t *dr = p + (i < nd ? ns + i : ns + nd - 1) * s, *xi = p + i * s;
        uint64_t *even = tmp + 2 * i * w;
        for (uint64_t j = 0; j < w; j++)
            even[j] = xi[j] - floor_shift(dl[j] + dr[j] + 2, 2);
    }
    for (uint64_t i = 0; i < nd; i++) {
        const uint64_t *left = tmp + 2 * i * w, *xd = p + (ns + i) * s;
        const uint64_t *right = 2 * i + 2 < n ? tmp + (2 * i + 2) * w : left;
        uint64_t *odd = tmp + (2 * i + 1) * w;
        for (uint64_t j = 0; j < w; j++)
            odd[j] = xd[j] + floor_shift(left[j] + right[j], 1);
    }
    for (uint64_t t = 0; t < n; t++)
        memcpy(p + t * s, tmp + t * w, w * sizeof *p);
}

/* unlift every line along axis ax of the block dims[] (a corner of the C-order array of
 * shape sh): along the last axis row by row, along the others dims[3] lines at once
 * (contiguous, so the loads stream); buf has room for dims[ax] * dims[3] and 2 * n */
static void unlift_axis(uint64_t *a, const uint64_t sh[4], const uint64_t dims[4], int ax,
                        uint64_t *buf)
{
    uint64_t stride[4], n = dims[ax];
    stride[3] = 1;
    for (int d = 2; d >= 0; d--)
        stride[d] = stride[d + 1] * sh[d + 1];
    /* the lines start at every index of the block's axes 0 .. 2 but ax (and i3 = 0) */
    uint64_t lim[3] = {dims[0], dims[1], dims[2]}, s = stride[ax];
    if (ax < 3)
        lim[ax] = 1;
    for (uint64_t i0 = 0; i0 < lim[0]; i0++)
        for (uint64_t i1 = 0; i1 < lim[1]; i1++)
            for (uint64_t i2 = 0; i2 < lim[2]; i2++) {
                uint64_t *p = a + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
                if (ax < 3) {
                    unlift_lines(p, n, s, dims[3], buf);
                    continue;
                }
                memcpy(buf, p, n * sizeof *p);
                unlift(buf, n, buf + n);
                memcpy(p, buf, n * sizeof *p);
            }
}

/* wavelet.plan then inverse: the levels' blocks and axes, undone coarsest first */
static int inverse(uint64_t *a, const uint64_t sh[4], tp_err *err)
{
    uint64_t dims[LEVELS][4], room = 0;
    int axes[LEVELS][4], naxes[LEVELS], levels = 0;
    uint64_t cur[4] = {sh[0], sh[1], sh[2], sh[3]};
    for (; levels < LEVELS; levels++) {
        int k = 0;
        for (int ax = 0; ax < 4; ax++)
            if (cur[ax] >= MIN_LENGTH)
                axes[levels][k++] = ax;
        if (!k)
            break;
        naxes[levels] = k;
        memcpy(dims[levels], cur, sizeof cur);
        for (int j = 0; j < k; j++) {
            int ax = axes[levels][j];
            /* a line tile (at most the elements) or a row and its scratch */
            uint64_t need = ax < 3 ? cur[ax] * cur[3] : 2 * cur[3];
            room = need > room ? need : room;
            cur[ax] = (cur[ax] + 1) / 2;
        }
    }
    if (!levels)
        return 0;
    uint64_t *buf = malloc(room * sizeof *buf);
    if (!buf)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the wavelet decoder");
    for (int l = levels - 1; l >= 0; l--)
        for (int j = naxes[l] - 1; j >= 0; j--)
            unlift_axis(a, sh, dims[l], axes[l][j], buf);
    free(buf);
    return 0;
}

/* decode_coefficients: the codes and escapes into a; every escape used exactly */
static int coefficients(const tp_sz_chunk *c, const uint8_t *esc, uint64_t n_esc, uint64_t *a,
                        tp_err *err)
{
    uint64_t k = 0, top = 2 * (uint64_t)c->radius - 1;
    for (uint64_t i = 0; i < c->n; i++) {
        uint64_t code = c->codes[i];
        if (code == top) {
            if (k >= n_esc)
                return tp_fail(err, TP_E_FORMAT, "corrupt stream: more wavelet escape codes "
                               "than escaped coefficients");
            a[i] = le64(esc + 8 * k++);
        } else if (code > 0 && code < top) {
            a[i] = code - c->radius; /* wraps to the negative coefficients' bits */
        } else {
            return tp_fail(err, TP_E_FORMAT, "corrupt stream: wavelet code out of range");
        }
    }
    if (k != n_esc)
        return tp_fail(err, TP_E_FORMAT, "sz payload: wavelet escapes do not match the codes");
    return 0;
}

/* the side information's parts, every length and index checked as decode_chunk does */
typedef struct side {
    const uint8_t *esc, *idx, *vals;
    uint64_t n_esc, m;
} side;

static int parse_side(const tp_sz_chunk *c, side *s, tp_err *err)
{
    const uint8_t *p = c->side;
    size_t left = c->side_len;
    if (left < 8)
        return tp_fail(err, TP_E_FORMAT, "sz wavelet side information is truncated");
    s->n_esc = le64(p);
    p += 8, left -= 8;
    if (s->n_esc > c->n)
        return tp_fail(err, TP_E_FORMAT, "sz payload: more wavelet escapes than elements");
    if (left / 8 < s->n_esc + 1)
        return tp_fail(err, TP_E_FORMAT, "sz wavelet side information is truncated");
    s->esc = p;
    p += 8 * s->n_esc, left -= 8 * s->n_esc;
    s->m = le64(p);
    p += 8, left -= 8;
    if (s->m > c->n)
        return tp_fail(err, TP_E_FORMAT, "sz payload: more wavelet fixes than elements");
    if (left != 16 * s->m)
        return tp_fail(err, TP_E_FORMAT, "sz wavelet side information has the wrong length");
    s->idx = p;
    s->vals = p + 8 * s->m;
    for (uint64_t j = 0; j < s->m; j++) {
        uint64_t i = le64(s->idx + 8 * j);
        if (i >= c->n || (j && i <= le64(s->idx + 8 * (j - 1))))
            return tp_fail(err, TP_E_FORMAT, "sz payload: wavelet fix indices out of order "
                           "or range");
    }
    return 0;
}

int tp_sz_wavelet_decode(const tp_sz_chunk *c, tp_err *err)
{
    side s = {NULL, NULL, NULL, 0, 0};
    int rc = parse_side(c, &s, err);
    if (rc)
        return rc;
    if (c->n > SIZE_MAX / sizeof(uint64_t))
        return tp_fail(err, TP_E_MEMORY, "the chunk is too large for the wavelet decoder");
    uint64_t *a = malloc(c->n ? c->n * sizeof *a : 1);
    if (!a)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the wavelet decoder");
    rc = coefficients(c, s.esc, s.n_esc, a, err);
    if (!rc)
        rc = inverse(a, c->shape, err);
    double two_eb = 2.0 * c->eb;
    for (uint64_t i = 0; !rc && i < c->n; i++)
        tp_sz_put(c->out, c->f64, i, tp_sz_round((double)(int64_t)a[i] * two_eb, c->prec));
    for (uint64_t j = 0; !rc && j < s.m; j++) {
        uint64_t bits = le64(s.vals + 8 * j);
        double v;
        memcpy(&v, &bits, 8);
        tp_sz_put(c->out, c->f64, le64(s.idx + 8 * j), v);
    }
    free(a);
    return rc;
}
