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

/* the weights of level l, W + 2^(bits - 1) in bits-bit fields (row-major (start, k),
 * least significant bit first), as doubles and floats (exact: at most 16 bits) */
static void weights(const level *l, double *w, float *wf)
{
    uint64_t bit = 0;
    int64_t half = (int64_t)1 << (l->bits - 1);
    for (uint64_t t = 0; t < l->start * (l->end - l->start); t++) {
        uint64_t v = 0;
        for (uint64_t b = 0; b < l->bits; b++, bit++)
            v |= (uint64_t)(l->fields[bit >> 3] >> (bit & 7) & 1) << b;
        w[t] = (double)((int64_t)v - half);
        wf[t] = (float)w[t];
    }
}

/* out[at .. at + m) (work dtype) from the predictions p (each a work-dtype value) and
 * the codes cr, a loop per precision; outliers from *oi on */
static int restore(const tp_sz_chunk *c, const double *p, const uint16_t *cr, uint64_t m,
                   uint64_t at, uint64_t *oi, tp_err *err)
{
    const int32_t radius = (int32_t)c->radius;
    const double two_eb = 2.0 * c->eb;
    uint64_t zeros = 0;
    double *o64 = (double *)c->out + at;
    float *o32 = (float *)c->out + at;
    if (c->f64) { /* float64 work: float64 precision */
        for (uint64_t j = 0; j < m; j++) {
            o64[j] = p[j] + (double)((int32_t)cr[j] - radius) * two_eb;
            zeros += cr[j] == 0;
        }
    } else if (c->prec == TP_PREC_F32) {
        for (uint64_t j = 0; j < m; j++) {
            o32[j] = (float)(p[j] + (double)((int32_t)cr[j] - radius) * two_eb);
            zeros += cr[j] == 0;
        }
    } else {
        for (uint64_t j = 0; j < m; j++) {
            o32[j] = (float)tp_sz_dequant(cr[j], p[j], two_eb, c->radius, c->prec);
            zeros += cr[j] == 0;
        }
    }
    if (zeros > c->n_outliers - *oi)
        return tp_fail(err, TP_E_FORMAT, "sz payload: more outlier codes than outliers");
    for (uint64_t j = 0; zeros && j < m; j++) {
        if (cr[j] == 0) {
            tp_sz_put(c->out, c->f64, at + j, tp_sz_get(c->outliers, c->f64, (*oi)++));
            zeros--;
        }
    }
    return TP_OK;
}

/* a level's arrays: weights, offsets and scales, a row's bins, sums and predictions */
typedef struct work {
    double *w, *off, *sc, *z, *sums, *p;
    float *wf, *sumsf;
    double *zmax;
} work;

/* kernels/pivot.py level_bins: row t's bins of the columns before level l (NaN kept) */
static void bins(const tp_sz_chunk *c, const model *md, const level *l, uint64_t t,
                 double *z)
{
    const uint64_t n = c->shape[1];
    const double inv = 0.5 / c->eb;
    for (uint64_t i = 0; i < l->start; i++) {
        double centre;
        memcpy(&centre, md->centres + 8 * i, 8);
        double v = nearbyint((tp_sz_get(c->out, c->f64, t * n + i) - centre) * inv);
        v = v > -ZMAX || isnan(v) ? v : -ZMAX; /* numba's max and min keep a NaN */
        z[i] = v < ZMAX || isnan(v) ? v : ZMAX;
    }
}

/* whether every partial sum of z @ W over all rows stays within 2^24 (and no bin is
 * NaN): then float32 holds them exactly; the bound is pivot.py's _level_sums' own,
 * max |z| per column @ |W| */
static int float_exact(const tp_sz_chunk *c, const model *md, const level *l, work *wk)
{
    uint64_t k = l->end - l->start;
    for (uint64_t i = 0; i < l->start; i++)
        wk->zmax[i] = 0.0;
    for (uint64_t t = 0; t < c->shape[0]; t++) {
        bins(c, md, l, t, wk->z);
        for (uint64_t i = 0; i < l->start; i++) {
            if (isnan(wk->z[i]))
                return 0;
            wk->zmax[i] = fabs(wk->z[i]) > wk->zmax[i] ? fabs(wk->z[i]) : wk->zmax[i];
        }
    }
    for (uint64_t j = 0; j < k; j++)
        wk->sums[j] = 0.0;
    for (uint64_t i = 0; i < l->start; i++)
        for (uint64_t j = 0; j < k; j++)
            wk->sums[j] += wk->zmax[i] * fabs(wk->w[i * k + j]);
    for (uint64_t j = 0; j < k; j++)
        if (!(wk->sums[j] <= 16777216.0))
            return 0;
    return 1;
}

/* row t's sums of level l (exact integers: any order of the sums gives them), in float
 * where float_exact holds (four a vector) */
static void sums_of(const level *l, work *wk, int in_float)
{
    uint64_t k = l->end - l->start;
    if (in_float) {
        for (uint64_t j = 0; j < k; j++)
            wk->sumsf[j] = 0.0f;
        for (uint64_t i = 0; i < l->start; i++) {
            const float zi = (float)wk->z[i], *wi = wk->wf + i * k;
            for (uint64_t j = 0; j < k; j++)
                wk->sumsf[j] += zi * wi[j];
        }
        for (uint64_t j = 0; j < k; j++)
            wk->sums[j] = wk->sumsf[j];
        return;
    }
    for (uint64_t j = 0; j < k; j++)
        wk->sums[j] = 0.0;
    for (uint64_t i = 0; i < l->start; i++) {
        const double zi = wk->z[i], *wi = wk->w + i * k;
        for (uint64_t j = 0; j < k; j++)
            wk->sums[j] += zi * wi[j];
    }
}

/* level l's columns of every row: offset + scale * sums rounded to the work dtype */
static int decode_level(const tp_sz_chunk *c, const model *md, const level *l, work *wk,
                        uint64_t pos, uint64_t *oi, tp_err *err)
{
    uint64_t k = l->end - l->start, n = c->shape[1];
    weights(l, wk->w, wk->wf);
    for (uint64_t j = 0; j < k; j++) {
        float sf;
        memcpy(&wk->off[j], l->offsets + 8 * j, 8);
        memcpy(&sf, l->scales + 4 * j, 4);
        wk->sc[j] = sf;
    }
    int in_float = float_exact(c, md, l, wk);
    for (uint64_t t = 0; t < c->shape[0]; t++) {
        bins(c, md, l, t, wk->z);
        sums_of(l, wk, in_float);
        for (uint64_t j = 0; j < k; j++) {
            double v = wk->off[j] + wk->sc[j] * wk->sums[j];
            wk->p[j] = c->f64 ? v : (double)(float)v;
        }
        int rc = restore(c, wk->p, c->codes + pos + t * k, k, t * n + l->start, oi, err);
        if (rc)
            return rc;
    }
    return TP_OK;
}

static int decode_levels(const tp_sz_chunk *c, const model *md, work *wk, tp_err *err)
{
    const uint64_t rows = c->shape[0], n = c->shape[1], first = md->lv[0].start;
    uint64_t oi = 0, pos = rows * first;
    for (uint64_t j = 0; j < first; j++) { /* the pivots: their centres in the work dtype */
        double centre;
        memcpy(&centre, md->centres + 8 * j, 8);
        wk->p[j] = c->f64 ? centre : (double)(float)centre;
    }
    for (uint64_t t = 0; t < rows; t++) {
        int rc = restore(c, wk->p, c->codes + t * first, first, t * n, &oi, err);
        if (rc)
            return rc;
    }
    for (int i = 0; i < md->count; i++) {
        int rc = decode_level(c, md, &md->lv[i], wk, pos, &oi, err);
        if (rc)
            return rc;
        pos += rows * (md->lv[i].end - md->lv[i].start);
    }
    return TP_OK;
}

int tp_sz_pivot_decode(const tp_sz_chunk *c, tp_err *err)
{
    model m;
    int rc = parse(c->side, c->side_len, c->shape[1], &m, err);
    if (rc || c->n == 0)
        return rc;
    uint64_t most = 1, cols = c->shape[1] + 1; /* the largest level's weights */
    for (int i = 0; i < m.count; i++) {
        uint64_t k = m.lv[i].start * (m.lv[i].end - m.lv[i].start);
        most = k > most ? k : most;
    }
    const size_t d = sizeof(double), f = sizeof(float);
    work wk = {malloc(most * d), malloc(cols * d), malloc(cols * d), malloc(cols * d),
               malloc(cols * d), malloc(cols * d), malloc(most * f), malloc(cols * f),
               malloc(cols * d)};
    if (wk.w && wk.off && wk.sc && wk.z && wk.sums && wk.p && wk.wf && wk.sumsf &&
        wk.zmax)
        rc = decode_levels(c, &m, &wk, err);
    else
        rc = tp_fail(err, TP_E_MEMORY, "out of memory for the pivot model");
    void *all[] = {wk.w, wk.off, wk.sc, wk.z, wk.sums, wk.p, wk.wf, wk.sumsf, wk.zmax};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    return rc;
}
