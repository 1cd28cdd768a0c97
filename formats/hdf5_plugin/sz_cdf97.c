/* `sz` predictor 15 (cdf97; SPEC.md "sz", compress/sz/cdf97.py and its kernels): the
 * codes are quantized coefficients k of a multilevel float64 CDF 9/7 lifting in band
 * order (code 2 * radius - 1 escapes an int64 k kept in the side information); each
 * coefficient is k * (alpha * eb), the inverse lifting runs in double in the kernel's
 * operation order (the build has -ffp-contract=off), each value is rounded to the
 * storage precision, and the corrections add k * 2 * eb or put exact float64 values.
 * Or the k come from bit planes (sz_speck.c), the codes then all radius.
 * Side information, little-endian:
 *   u64 n, n i64 escapes, or u64 2^64 - 1, u8 planes, u64 b, b bytes of bit planes;
 *   u64 m, m u64 index gaps, m i64 corrections;
 *   u64 e, e f64 exact values (e = the corrections that are 0) */
#include <stdlib.h>
#include <string.h>

#include "sz.h"
#include "sz_speck.h"

/* cdf97.py LEVELS, MIN_LENGTH */
enum { LEVELS = 10, MIN_LENGTH = 8 };
/* cdf97.py PLANES_MARK: the side information's first u64 where bit planes follow; the
 * most band boxes (the low block and 15 bands per level) */
#define PLANES_MARK UINT64_MAX
/* the same with the corrections as bit planes; the codes' escapes with them */
#define FIXES_MARK (UINT64_MAX - 1)
#define CODES_FIXES_MARK (UINT64_MAX - 2)
enum { MAX_BOXES = 1 + 15 * LEVELS };

/* kernels/cdf97.py's constants, bit for bit (INV_*: 1.0 / SCALE_*, rounded) */
static const double LIFT_A = -0x1.960ce67635b8dp+0, LIFT_B = -0x1.b2035c937d7fbp-5;
static const double LIFT_G = 0x1.c40ceba55cf3cp-1, LIFT_D = 0x1.c626a90452b46p-2;
static const double INV_LOW = 0x1.c1373ea3b573cp-1, INV_HIGH = 0x1.2085eedf82890p+0;

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = v << 8 | p[b];
    return v;
}

static double led(const uint8_t *p)
{
    uint64_t bits = le64(p);
    double v;
    memcpy(&v, &bits, 8);
    return v;
}

/* _predict: d[i] += c * (s[i] + s[i + 1]), s[ns] mirrored to s[ns - 1] */
static void predict(const double *s, double *d, uint64_t ns, uint64_t nd, double c)
{
    for (uint64_t i = 0; i < nd; i++) {
        double t = s[i] + (i + 1 < ns ? s[i + 1] : s[i]);
        t = c * t;
        d[i] = d[i] + t;
    }
}

/* _update: s[i] += c * (d[i - 1] + d[i]), d[-1] -> d[0], d[nd] -> d[nd - 1] */
static void update(double *s, const double *d, uint64_t ns, uint64_t nd, double c)
{
    for (uint64_t i = 0; i < ns; i++) {
        double t = (i > 0 ? d[i - 1] : d[0]) + (i < nd ? d[i] : d[nd - 1]);
        t = c * t;
        s[i] = s[i] + t;
    }
}

/* unlift_rows on one line x of n >= 2 (low-pass first); tmp has room for n */
static void unlift(double *x, uint64_t n, double *tmp)
{
    uint64_t ns = (n + 1) / 2, nd = n / 2;
    double *s = tmp, *d = tmp + ns;
    for (uint64_t i = 0; i < ns; i++)
        s[i] = x[i] * INV_LOW;
    for (uint64_t i = 0; i < nd; i++)
        d[i] = x[ns + i] * INV_HIGH;
    update(s, d, ns, nd, -LIFT_D);
    predict(s, d, ns, nd, -LIFT_G);
    update(s, d, ns, nd, -LIFT_B);
    predict(s, d, ns, nd, -LIFT_A);
    for (uint64_t i = 0; i < ns; i++)
        x[2 * i] = s[i];
    for (uint64_t i = 0; i < nd; i++)
        x[2 * i + 1] = d[i];
}

typedef struct plan {
    uint64_t dims[LEVELS][4];
    int axes[LEVELS][4], naxes[LEVELS], levels;
    uint64_t low[4]; /* the coarsest low-pass block */
} plan;

/* cdf97.plan: per level the block and the axes of at least MIN_LENGTH, halved */
static void make_plan(const uint64_t sh[4], plan *p)
{
    uint64_t cur[4] = {sh[0], sh[1], sh[2], sh[3]};
    for (p->levels = 0; p->levels < LEVELS; p->levels++) {
        int k = 0;
        for (int ax = 0; ax < 4; ax++)
            if (cur[ax] >= MIN_LENGTH)
                p->axes[p->levels][k++] = ax;
        if (!k)
            break;
        p->naxes[p->levels] = k;
        memcpy(p->dims[p->levels], cur, sizeof cur);
        for (int j = 0; j < k; j++)
            cur[p->axes[p->levels][j]] = (cur[p->axes[p->levels][j]] + 1) / 2;
    }
    memcpy(p->low, cur, sizeof cur);
}

/* copy the box [lo, hi) of the C-order array a (shape sh) from (to_a = 0) or to
 * (to_a = 1) the flat run at *pos of band */
static void box_copy(double *a, const uint64_t sh[4], const uint64_t lo[4],
                     const uint64_t hi[4], double *band, uint64_t *pos, int to_a)
{
    uint64_t w = hi[3] - lo[3];
    for (uint64_t i0 = lo[0]; i0 < hi[0]; i0++)
        for (uint64_t i1 = lo[1]; i1 < hi[1]; i1++)
            for (uint64_t i2 = lo[2]; i2 < hi[2]; i2++) {
                double *row = a + ((i0 * sh[1] + i1) * sh[2] + i2) * sh[3] + lo[3];
                if (to_a)
                    memcpy(row, band + *pos, w * sizeof *row);
                else
                    memcpy(band + *pos, row, w * sizeof *row);
                *pos += w;
            }
}

/* cdf97.band_boxes then _scatter: the coarsest low block, then per level (coarsest
 * first) bands b = 1 .. 2^k - 1, bit k - 1 - j of b: high-pass along axes[j] */
static void scatter(double *band, const plan *p, const uint64_t sh[4], double *a)
{
    uint64_t pos = 0, zero[4] = {0, 0, 0, 0};
    box_copy(a, sh, zero, p->low, band, &pos, 1);
    for (int l = p->levels - 1; l >= 0; l--) {
        const uint64_t *dims = p->dims[l];
        int k = p->naxes[l];
        for (unsigned b = 1; b < 1u << k; b++) {
            uint64_t lo[4] = {0, 0, 0, 0}, hi[4] = {dims[0], dims[1], dims[2], dims[3]};
            for (int j = 0; j < k; j++) {
                int ax = p->axes[l][j];
                uint64_t half = (dims[ax] + 1) / 2;
                if (b >> (k - 1 - j) & 1)
                    lo[ax] = half;
                else
                    hi[ax] = half;
            }
            box_copy(a, sh, lo, hi, band, &pos, 1);
        }
    }
}

/* unlift every line along axis ax of the block dims (a corner of a, shape sh); buf has
 * room for 2 * dims[ax] */
static void unlift_axis(double *a, const uint64_t sh[4], const uint64_t dims[4], int ax,
                        double *buf)
{
    uint64_t stride[4], n = dims[ax], lim[4] = {dims[0], dims[1], dims[2], dims[3]};
    stride[3] = 1;
    for (int d = 2; d >= 0; d--)
        stride[d] = stride[d + 1] * sh[d + 1];
    lim[ax] = 1;
    for (uint64_t i0 = 0; i0 < lim[0]; i0++)
        for (uint64_t i1 = 0; i1 < lim[1]; i1++)
            for (uint64_t i2 = 0; i2 < lim[2]; i2++)
                for (uint64_t i3 = 0; i3 < lim[3]; i3++) {
                    double *p = a + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3;
                    for (uint64_t t = 0; t < n; t++)
                        buf[t] = p[t * stride[ax]];
                    unlift(buf, n, buf + n);
                    for (uint64_t t = 0; t < n; t++)
                        p[t * stride[ax]] = buf[t];
                }
}

typedef struct side {
    const uint8_t *esc, *gaps, *ks, *exact, *planes, *fix_planes;
    uint64_t n_esc, m, e, planes_len, fix_len;
    int top, fix_top, planar;
} side;

/* the listed corrections (from p, left bytes), every count and index checked */
static int parse_listed(const tp_sz_chunk *c, side *s, const uint8_t *p, size_t left,
                        tp_err *err)
{
    if (left < 8)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
    s->m = le64(p);
    p += 8, left -= 8;
    if (s->m > c->n)
        return tp_fail(err, TP_E_FORMAT, "sz payload: more cdf97 corrections than elements");
    if (left / 16 < s->m || left - 16 * s->m < 8)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
    s->gaps = p;
    s->ks = p + 8 * s->m;
    p += 16 * s->m, left -= 16 * s->m;
    s->e = le64(p);
    p += 8, left -= 8;
    uint64_t zeros = 0, pos = 0;
    for (uint64_t j = 0; j < s->m; j++) {
        zeros += le64(s->ks + 8 * j) == 0;
        uint64_t g = le64(s->gaps + 8 * j);
        if (g >= c->n || (pos += g + (j > 0)) >= c->n)
            return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 correction indices out of "
                           "range");
    }
    if (s->e != zeros)
        return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 exact values do not match the "
                       "corrections");
    if (left != 8 * s->e)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information has the wrong length");
    s->exact = p;
    return 0;
}

/* the planar corrections: u8 planes, u64 b, b bytes, u64 e, e u64 gaps, e f64 values */
static int parse_planar(const tp_sz_chunk *c, side *s, const uint8_t *p, size_t left,
                        tp_err *err)
{
    if (left < 9 || (s->fix_len = le64(p + 1)) > left - 9)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
    s->fix_top = p[0];
    s->fix_planes = p + 9;
    p += 9 + s->fix_len, left -= 9 + s->fix_len;
    if (left < 8)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
    s->e = le64(p);
    p += 8, left -= 8;
    if (s->e > c->n)
        return tp_fail(err, TP_E_FORMAT, "sz payload: more cdf97 exact values than elements");
    if (left != 16 * s->e)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information has the wrong length");
    s->gaps = p;
    s->exact = p + 8 * s->e;
    uint64_t pos = 0;
    for (uint64_t j = 0; j < s->e; j++) {
        uint64_t g = le64(s->gaps + 8 * j);
        if (g >= c->n || (pos += g + (j > 0)) >= c->n)
            return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 correction indices out of "
                           "range");
    }
    return 0;
}

/* the side information's parts: the escapes or the coefficients' bit planes, then the
 * corrections, every length, count and index checked as cdf97.py checks them */
static int parse_side(const tp_sz_chunk *c, side *s, tp_err *err)
{
    const uint8_t *p = c->side;
    size_t left = c->side_len;
    if (left < 8)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
    uint64_t first = le64(p);
    p += 8, left -= 8;
    s->planar = first == FIXES_MARK || first == CODES_FIXES_MARK;
    if (first == CODES_FIXES_MARK) { /* the escapes' count follows */
        if (left < 8)
            return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
        first = le64(p);
        p += 8, left -= 8;
        if (first > c->n)
            return tp_fail(err, TP_E_FORMAT, "sz payload: more cdf97 escapes than elements");
    }
    s->n_esc = first;
    if (first == PLANES_MARK || first == FIXES_MARK) {
        if (left < 9 || (s->planes_len = le64(p + 1)) > left - 9)
            return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
        s->top = p[0];
        s->planes = p + 9;
        p += 9 + s->planes_len, left -= 9 + s->planes_len;
        s->n_esc = 0;
    } else if (s->n_esc > c->n) {
        return tp_fail(err, TP_E_FORMAT, "sz payload: more cdf97 escapes than elements");
    }
    if (left / 8 < s->n_esc)
        return tp_fail(err, TP_E_FORMAT, "sz cdf97 side information is truncated");
    s->esc = p;
    p += 8 * s->n_esc, left -= 8 * s->n_esc;
    return s->planar ? parse_planar(c, s, p, left, err) : parse_listed(c, s, p, left, err);
}

/* dequantize: the codes and escapes into band (k * step); every escape used exactly */
static int coefficients(const tp_sz_chunk *c, const side *s, double step, double *band,
                        tp_err *err)
{
    uint64_t k = 0, top = 2 * (uint64_t)c->radius - 1;
    for (uint64_t i = 0; i < c->n; i++) {
        uint64_t code = c->codes[i];
        if (code == top) {
            if (k >= s->n_esc)
                return tp_fail(err, TP_E_FORMAT, "corrupt stream: more cdf97 escape codes "
                               "than escapes");
            band[i] = (double)(int64_t)le64(s->esc + 8 * k++) * step;
        } else if (code > 0 && code < top) {
            band[i] = (double)((int64_t)code - (int64_t)c->radius) * step;
        } else {
            return tp_fail(err, TP_E_FORMAT, "corrupt stream: cdf97 code out of range");
        }
    }
    if (k != s->n_esc)
        return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 escapes do not match the codes");
    return 0;
}

/* cdf97.band_boxes: the boxes of scatter's order, each its starts then its lengths */
static size_t band_boxes(const plan *p, uint64_t (*boxes)[8])
{
    size_t nb = 0;
    for (int ax = 0; ax < 4; ax++)
        boxes[nb][ax] = 0, boxes[nb][4 + ax] = p->low[ax];
    nb++;
    for (int l = p->levels - 1; l >= 0; l--) {
        const uint64_t *dims = p->dims[l];
        int k = p->naxes[l];
        for (unsigned b = 1; b < 1u << k; b++, nb++) {
            for (int ax = 0; ax < 4; ax++)
                boxes[nb][ax] = 0, boxes[nb][4 + ax] = dims[ax];
            for (int j = 0; j < k; j++) {
                int ax = p->axes[l][j];
                uint64_t half = (dims[ax] + 1) / 2;
                int high = b >> (k - 1 - j) & 1;
                boxes[nb][ax] = high ? half : 0;
                boxes[nb][4 + ax] = high ? dims[ax] - half : half;
            }
        }
    }
    return nb;
}

/* the coefficients k * step (Mallat layout, into a) from the bit planes; every code
 * must be that of 0; k: room for n int64 */
static int from_planes(const tp_sz_chunk *c, const side *s, const plan *p, double step,
                       int64_t *k, double *a, tp_err *err)
{
    for (uint64_t i = 0; i < c->n; i++)
        if (c->codes[i] != c->radius)
            return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 codes with bit planes must "
                           "all be zero");
    uint64_t boxes[MAX_BOXES][8];
    size_t nb = band_boxes(p, boxes);
    memset(k, 0, c->n * sizeof *k);
    int rc = tp_sz_speck_decode(s->planes, s->planes_len, s->top, (const uint64_t(*)[8])boxes,
                                nb, c->shape, k, err);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < c->n; i++)
        a[i] = (double)k[i] * step;
    return 0;
}

/* the inverse transform of a (levels and axes reversed) */
static int inverse(double *a, const plan *p, const uint64_t sh[4], tp_err *err)
{
    uint64_t room = 2;
    for (int ax = 0; ax < 4; ax++)
        room = 2 * sh[ax] > room ? 2 * sh[ax] : room;
    double *buf = malloc(room * sizeof *buf);
    if (!buf)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the cdf97 decoder");
    for (int l = p->levels - 1; l >= 0; l--)
        for (int j = p->naxes[l] - 1; j >= 0; j--)
            unlift_axis(a, sh, p->dims[l], p->axes[l][j], buf);
    free(buf);
    return 0;
}

/* apply: every value rounded, then the corrections */
static void finish(const tp_sz_chunk *c, const side *s, const double *a)
{
    double two_eb = 2.0 * c->eb;
    for (uint64_t i = 0; i < c->n; i++)
        tp_sz_put(c->out, c->f64, i, tp_sz_round(a[i], c->prec));
    uint64_t pos = 0, e = 0;
    for (uint64_t j = 0; j < s->m; j++) {
        pos += le64(s->gaps + 8 * j) + (j > 0);
        int64_t k = (int64_t)le64(s->ks + 8 * j);
        double v = k ? tp_sz_round(a[pos] + (double)k * two_eb, c->prec)
                     : led(s->exact + 8 * e++);
        tp_sz_put(c->out, c->f64, pos, v);
    }
}

/* finish with planar corrections: k (room for n) from their bit planes, the chunk one
 * set; no exact value where a correction is */
static int finish_planar(const tp_sz_chunk *c, const side *s, const double *a, int64_t *k,
                         tp_err *err)
{
    uint64_t whole[1][8] = {{0, 0, 0, 0, c->shape[0], c->shape[1], c->shape[2], c->shape[3]}};
    memset(k, 0, c->n * sizeof *k);
    int rc = tp_sz_speck_decode(s->fix_planes, s->fix_len, s->fix_top,
                                (const uint64_t(*)[8])whole, 1, c->shape, k, err);
    if (rc)
        return rc;
    uint64_t pos = 0;
    for (uint64_t j = 0; j < s->e; j++) {
        pos += le64(s->gaps + 8 * j) + (j > 0);
        if (k[pos])
            return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 exact values where "
                           "corrections are");
    }
    double two_eb = 2.0 * c->eb;
    for (uint64_t i = 0; i < c->n; i++) {
        double v = k[i] ? tp_sz_round(a[i] + (double)k[i] * two_eb, c->prec)
                        : tp_sz_round(a[i], c->prec);
        tp_sz_put(c->out, c->f64, i, v);
    }
    pos = 0;
    for (uint64_t j = 0; j < s->e; j++) {
        pos += le64(s->gaps + 8 * j) + (j > 0);
        tp_sz_put(c->out, c->f64, pos, led(s->exact + 8 * j));
    }
    return 0;
}

int tp_sz_cdf97_decode(const tp_sz_chunk *c, tp_err *err)
{
    side s;
    memset(&s, 0, sizeof s);
    int rc = parse_side(c, &s, err);
    if (rc)
        return rc;
    double step = c->alpha * c->eb;
    if (!(isfinite(step) && step > 0))
        return tp_fail(err, TP_E_FORMAT, "sz payload: cdf97 step is not a positive number");
    if (c->n > SIZE_MAX / (2 * sizeof(double)))
        return tp_fail(err, TP_E_MEMORY, "the chunk is too large for the cdf97 decoder");
    double *band = malloc(c->n ? 2 * c->n * sizeof *band : 1);
    if (!band)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the cdf97 decoder");
    double *a = band + c->n;
    plan p;
    make_plan(c->shape, &p);
    if (s.planes) {
        rc = from_planes(c, &s, &p, step, (int64_t *)(void *)band, a, err);
    } else {
        rc = coefficients(c, &s, step, band, err);
        if (!rc)
            scatter(band, &p, c->shape, a);
    }
    if (!rc)
        rc = inverse(a, &p, c->shape, err);
    if (!rc && s.planar)
        rc = finish_planar(c, &s, a, (int64_t *)(void *)band, err);
    else if (!rc)
        finish(c, &s, a);
    free(band);
    return rc;
}
