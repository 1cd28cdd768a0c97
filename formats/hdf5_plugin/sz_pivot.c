/* The `sz` pivot predictor (13; SPEC.md "sz", "Pivots"): the first columns of the 2-d
 * layout predicted by their centres, each level's columns by offset + scale * (z @ W)
 * from the bins z of the row's reconstructed columns before it. Bit for bit
 * compress/sz/pivot.py and kernels/pivot.py: every sum of z @ W is an integer below
 * 2^53, so the order of the sums does not change it. The model and its Huffman streams
 * are checked as sz/pivot.py's unpack and side_codes check them. */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

enum { MAX_LEVELS = 3 };
/* largest bin, as pivot.ZMAX */
#define ZMAX 32768.0

typedef struct level {
    uint64_t start, end, bits;
    const uint8_t *offsets, *scales, *fields; /* f64, f32 and the packed weights */
} level;

typedef struct model {
    int count;
    level lv[MAX_LEVELS];
    const uint8_t *centres; /* f64, lv[count - 1].start of them */
    size_t size;            /* bytes of the model */
} model;

static uint64_t rd_le(const uint8_t *p, int nbytes)
{
    uint64_t v = 0;
    for (int i = nbytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* sz/pivot.py _layout and the model's size: the levels' first columns (each below the
 * next, the last below `columns`) and weight bits (2 .. 16), then where each array is */
static int layout(const uint8_t *p, size_t len, uint64_t columns, model *m, tp_err *err)
{
    const char *bad = NULL;
    if (len < 1)
        return tp_fail(err, TP_E_FORMAT, "sz pivot model: truncated");
    m->count = p[0];
    if (m->count < 1 || m->count > MAX_LEVELS)
        return tp_fail(err, TP_E_FORMAT, "sz payload: the pivot model names no levels or too many");
    size_t pos = 1 + 5 * (size_t)m->count;
    if (len < pos)
        return tp_fail(err, TP_E_FORMAT, "sz pivot model: truncated");
    for (int i = 0; i < m->count; i++) {
        m->lv[i].start = rd_le(p + 1 + 4 * i, 4);
        m->lv[i].bits = p[1 + 4 * m->count + i];
    }
    for (int i = 0; i < m->count && !bad; i++) {
        m->lv[i].end = i + 1 < m->count ? m->lv[i + 1].start : columns;
        if (m->lv[i].start >= m->lv[i].end || m->lv[i].start == 0)
            bad = "sz payload: the pivot model does not fit the chunk's columns";
        else if (m->lv[i].bits < 2 || m->lv[i].bits > 16)
            bad = "sz payload: the pivot model's weights have no valid width";
    }
    if (bad)
        return tp_fail(err, TP_E_FORMAT, "%s", bad);
    uint64_t last = m->lv[m->count - 1].start;
    if (last > (len - pos) / 8)
        return tp_fail(err, TP_E_FORMAT, "sz pivot model: truncated");
    m->centres = p + pos;
    pos += 8 * last;
    for (int i = 0; i < m->count; i++) {
        level *l = &m->lv[i];
        uint64_t k = l->end - l->start;
        /* each array checked against the bytes left before its size is formed: no overflow */
        if (k > (len - pos) / 12 || (l->start && k > (len - pos - 12 * k) * 8 / l->bits / l->start))
            return tp_fail(err, TP_E_FORMAT, "sz pivot model: truncated");
        l->offsets = p + pos;
        l->scales = p + pos + 8 * k;
        l->fields = p + pos + 12 * k;
        pos += 12 * k + (l->start * k * l->bits + 7) / 8;
        if (pos > len)
            return tp_fail(err, TP_E_FORMAT, "sz pivot model: truncated");
    }
    m->size = pos;
    return TP_OK;
}

/* the whole model: its layout, exactly its bytes, every array finite */
static int parse(const uint8_t *p, size_t len, uint64_t columns, model *m, tp_err *err)
{
    int rc = layout(p, len, columns, m, err);
    if (rc)
        return rc;
    if (m->size != len)
        return tp_fail(err, TP_E_FORMAT, "sz pivot model: %zu bytes left over", len - m->size);
    int finite = 1;
    for (uint64_t i = 0; i < m->lv[m->count - 1].start; i++) {
        double v;
        memcpy(&v, m->centres + 8 * i, 8);
        finite &= isfinite(v) != 0;
    }
    for (int i = 0; i < m->count; i++) {
        for (uint64_t j = 0; j < m->lv[i].end - m->lv[i].start; j++) {
            double o;
            float s;
            memcpy(&o, m->lv[i].offsets + 8 * j, 8);
            memcpy(&s, m->lv[i].scales + 4 * j, 4);
            finite &= isfinite(o) && isfinite(s);
        }
    }
    if (!finite)
        return tp_fail(err, TP_E_FORMAT, "sz payload: the pivot model is not finite");
    return TP_OK;
}

int tp_sz_pivot_side_codes(const uint8_t *side, size_t side_len, const uint64_t shape2[2],
                           uint16_t *codes, uint64_t n, uint64_t *nhead, size_t *model_len,
                           tp_err *err)
{
    model m;
    int rc = layout(side, side_len, shape2[1], &m, err);
    if (rc == TP_OK)
        rc = parse(side, m.size, shape2[1], &m, err);
    if (rc)
        return rc;
    size_t pos = m.size;
    uint64_t rows = shape2[0], done = 0;
    for (int i = 0; i < m.count; i++) { /* the pivots' segment, then each level's but the last */
        uint64_t count = rows * (i == 0 ? m.lv[0].start : m.lv[i - 1].end - m.lv[i - 1].start);
        if (side_len - pos < 8)
            return tp_fail(err, TP_E_FORMAT, "sz pivot side information: truncated");
        uint64_t blen = rd_le(side + pos, 8);
        pos += 8;
        if (blen > side_len - pos)
            return tp_fail(err, TP_E_FORMAT, "sz pivot side information: truncated");
        if (count > n - done)
            return tp_fail(err, TP_E_FORMAT, "sz pivot side information: too many codes");
        rc = tp_sz_huffman_decode(side + pos, (size_t)blen, codes + done, count, err);
        if (rc)
            return rc;
        pos += blen;
        done += count;
    }
    if (pos != side_len)
        return tp_fail(err, TP_E_FORMAT, "sz pivot side information: %zu bytes left over",
                       side_len - pos);
    *nhead = done;
    *model_len = m.size;
    return TP_OK;
}

/* the weights of level l, W + 2^(bits - 1) in bits-bit fields (row-major (start, m),
 * least significant bit first), as doubles */
static void weights(const level *l, double *w)
{
    uint64_t total = l->start * (l->end - l->start), bit = 0;
    int64_t half = (int64_t)1 << (l->bits - 1);
    for (uint64_t t = 0; t < total; t++) {
        uint64_t v = 0;
        for (uint64_t b = 0; b < l->bits; b++, bit++)
            v |= (uint64_t)(l->fields[bit >> 3] >> (bit & 7) & 1) << b;
        w[t] = (double)((int64_t)v - half);
    }
}

/* the codes cr of one row against the predictions already in row[0:m] (work dtype) */
#define RESTORE(T)                                                                          \
    do {                                                                                    \
        T *row = (T *)c->out + t * n + lo;                                                  \
        const T *outl = c->outliers;                                                        \
        if (sums)                                                                           \
            for (uint64_t j = 0; j < m; j++) {                                              \
                double o, s;                                                                \
                float sf;                                                                   \
                memcpy(&o, l->offsets + 8 * j, 8);                                          \
                memcpy(&sf, l->scales + 4 * j, 4);                                          \
                s = sf;                                                                     \
                row[j] = (T)(o + s * sums[j]);                                              \
            }                                                                               \
        for (uint64_t j = 0; j < m; j++) {                                                  \
            if (cr[j]) {                                                                    \
                row[j] = (T)tp_sz_dequant(cr[j], row[j], two_eb, c->radius, c->prec);      \
            } else {                                                                        \
                if (*oi >= c->n_outliers)                                                   \
                    return tp_fail(err, TP_E_FORMAT,                                        \
                                   "sz payload: more outlier codes than outliers");         \
                row[j] = outl[(*oi)++];                                                     \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* row t's columns lo .. lo + m: predictions from sums (level l) unless NULL, codes cr */
static int restore(const tp_sz_chunk *c, uint64_t t, uint64_t lo, uint64_t m,
                   const level *l, const double *sums, const uint16_t *cr, uint64_t *oi,
                   tp_err *err)
{
    const uint64_t n = c->shape[1];
    const double two_eb = 2.0 * c->eb;
    if (c->f64)
        RESTORE(double);
    else
        RESTORE(float);
    return TP_OK;
}

/* kernels/pivot.py level_bins and z @ W for row t: the sums of level l (m of them) */
static void level_sums(const tp_sz_chunk *c, const model *md, const level *l,
                       const double *w, uint64_t t, double *z, double *sums)
{
    const uint64_t n = c->shape[1], m = l->end - l->start;
    const double inv = 0.5 / c->eb;
    for (uint64_t i = 0; i < l->start; i++) {
        double centre;
        memcpy(&centre, md->centres + 8 * i, 8);
        double v = nearbyint((tp_sz_get(c->out, c->f64, t * n + i) - centre) * inv);
        v = v > -ZMAX || isnan(v) ? v : -ZMAX; /* numba's max and min keep a NaN */
        z[i] = v < ZMAX || isnan(v) ? v : ZMAX;
    }
    for (uint64_t j = 0; j < m; j++)
        sums[j] = 0.0;
    for (uint64_t i = 0; i < l->start; i++) { /* exact integers: any order gives them */
        const double zi = z[i], *wi = w + i * m;
        for (uint64_t j = 0; j < m; j++)
            sums[j] += zi * wi[j];
    }
}

static int decode_levels(const tp_sz_chunk *c, const model *md, double *w, double *z,
                         double *sums, tp_err *err)
{
    const uint64_t rows = c->shape[0], n = c->shape[1], first = md->lv[0].start;
    uint64_t oi = 0, pos = 0;
    double centre;
    for (uint64_t t = 0; t < rows; t++) {
        for (uint64_t j = 0; j < first; j++) {
            memcpy(&centre, md->centres + 8 * j, 8);
            tp_sz_put(c->out, c->f64, t * n + j, centre);
        }
        int rc = restore(c, t, 0, first, NULL, NULL, c->codes + t * first, &oi, err);
        if (rc)
            return rc;
    }
    pos = rows * first;
    for (int i = 0; i < md->count; i++) {
        const level *l = &md->lv[i];
        uint64_t m = l->end - l->start;
        weights(l, w);
        for (uint64_t t = 0; t < rows; t++) {
            level_sums(c, md, l, w, t, z, sums);
            int rc = restore(c, t, l->start, m, l, sums, c->codes + pos + t * m, &oi, err);
            if (rc)
                return rc;
        }
        pos += rows * m;
    }
    return TP_OK;
}

int tp_sz_pivot_decode(const tp_sz_chunk *c, tp_err *err)
{
    model m;
    int rc = parse(c->side, c->side_len, c->shape[1], &m, err);
    if (rc || c->n == 0)
        return rc;
    uint64_t most = 0; /* the largest level's weights */
    for (int i = 0; i < m.count; i++) {
        uint64_t k = m.lv[i].start * (m.lv[i].end - m.lv[i].start);
        most = k > most ? k : most;
    }
    double *w = malloc((most ? most : 1) * sizeof *w);
    double *z = malloc((c->shape[1] + 1) * sizeof *z);
    double *sums = malloc((c->shape[1] + 1) * sizeof *sums);
    if (w && z && sums)
        rc = decode_levels(c, &m, w, z, sums, err);
    else
        rc = tp_fail(err, TP_E_MEMORY, "out of memory for the pivot model");
    free(w);
    free(z);
    free(sums);
    return rc;
}
