/* The `sz` fitted predictor (11; SPEC.md "sz", "Fitted"): a causal linear
 * prediction from the model's neighbours and weights, first-order Lorenzo with zero
 * padding where a neighbour leaves the chunk. Bit for bit compress/sz/kernels/fitted.py:
 * the same ring of padded planes and the same order of the sums. */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

enum { MAX_TERMS = 32, MAX_REACH = 8 };

typedef struct model {
    int n, planar;
    int off[MAX_TERMS][3];
    double w[MAX_TERMS];
    int kind[MAX_TERMS]; /* 0: an earlier plane, 1: an earlier row, 2: in the row */
} model;

/* sz/fitted.py unpack: the model bytes checked (length, flags, causal offsets within
 * reach, finite weights) */
static int parse(const uint8_t *p, size_t len, model *m, tp_err *err)
{
    if (len < 2)
        return tp_fail(err, TP_E_FORMAT, "sz payload: the fitted model is empty");
    m->n = p[0];
    m->planar = p[1];
    if (m->n < 1 || m->n > MAX_TERMS || len != 2 + 11 * (size_t)m->n || m->planar > 1)
        return tp_fail(err, TP_E_FORMAT, "sz payload: the fitted model has the wrong length "
                                         "or flags");
    for (int t = 0; t < m->n; t++) {
        int *o = m->off[t];
        for (int d = 0; d < 3; d++) {
            o[d] = (int8_t)p[2 + 3 * t + d];
            if (o[d] > MAX_REACH || o[d] < -MAX_REACH)
                return tp_fail(err, TP_E_FORMAT, "sz payload: the fitted model names a "
                                                 "neighbour out of reach");
        }
        memcpy(&m->w[t], p + 2 + 3 * m->n + 8 * t, 8); /* little-endian hosts */
        int causal = o[0] < 0 || (o[0] == 0 && (o[1] < 0 || (o[1] == 0 && o[2] < 0)));
        if (!causal || !isfinite(m->w[t]))
            return tp_fail(err, TP_E_FORMAT, "sz payload: the fitted model names a neighbour "
                                             "not yet decoded");
        m->kind[t] = o[0] < 0 ? 0 : o[1] < 0 ? 1 : 2;
    }
    return TP_OK;
}

typedef struct run {
    const tp_sz_chunk *c;
    const model *m;
    int64_t n0, n1, n2, width, plane, ring;
    int64_t depth, up, down, lo, hi; /* the reach; lo .. hi: the columns fitted */
    double w1, w2, far_w[MAX_TERMS];
    int64_t far_d[MAX_TERMS];
    int nfar, planes;
    double *buf, *part;
    uint64_t f, oi;
    double two_eb;
} run;

static void setup(run *r, const model *m)
{
    int64_t left = 0, right = 0;
    r->depth = r->up = r->down = 0;
    r->w1 = r->w2 = 0.0;
    r->nfar = 0;
    for (int t = 0; t < m->n; t++) {
        const int *o = m->off[t];
        r->depth = -o[0] > r->depth ? -o[0] : r->depth;
        r->up = -o[1] > r->up ? -o[1] : r->up;
        r->down = o[1] > r->down ? o[1] : r->down;
        left = -o[2] > left ? -o[2] : left;
        right = o[2] > right ? o[2] : right;
        if (m->kind[t] == 2 && o[2] == -1)
            r->w1 = m->w[t]; /* the last of equal offsets, as the kernel takes it */
        else if (m->kind[t] == 2 && o[2] == -2)
            r->w2 = m->w[t];
        else if (m->kind[t] == 2) {
            r->far_w[r->nfar] = m->w[t];
            r->far_d[r->nfar++] = -o[2];
        }
    }
    r->lo = left;
    r->hi = r->n2 - right;
    r->ring = (r->depth > 1 ? r->depth : 1) + 1;
    r->planes = r->depth <= r->n0 && r->up + r->down < r->n1 && r->lo < r->hi;
}

/* the sums of row j's terms outside the row (earlier planes, then earlier rows, each in
 * the model's order) into part, columns lo .. hi: eight columns at a time, their sums
 * held in registers through all the terms (+0.0, then each term in order, as the
 * kernel adds them) */
static void outer_sums(run *r, int64_t i, int64_t rb, const double *cur)
{
    const double *src[MAX_TERMS];
    double w[MAX_TERMS];
    int nt = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (int t = 0; t < r->m->n; t++) {
            if (r->m->kind[t] != kind)
                continue;
            const int *o = r->m->off[t];
            const double *plane = kind == 0 ? r->buf + ((i + o[0]) % r->ring) * r->plane : cur;
            src[nt] = plane + rb + o[1] * r->width + o[2];
            w[nt++] = r->m->w[t];
        }
    }
    double *part = r->part + rb;
    int64_t k = r->lo;
    for (; k + 8 <= r->hi; k += 8) {
        double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        for (int t = 0; t < nt; t++)
            for (int u = 0; u < 8; u++)
                acc[u] += w[t] * src[t][k + u];
        for (int u = 0; u < 8; u++)
            part[k + u] = acc[u];
    }
    for (; k < r->hi; k++) {
        double acc = 0.0;
        for (int t = 0; t < nt; t++)
            acc += w[t] * src[t][k];
        part[k] = acc;
    }
}

/* row j of plane i (cur, the plane before it prv) */
static int row(run *r, int64_t i, int64_t j, double *cur, const double *prv, int fitted,
               int f64, int prec, tp_err *err)
{
    const tp_sz_chunk *c = r->c;
    int64_t rb = (j + 1) * r->width + 1, W = r->width;
    if (fitted)
        outer_sums(r, i, rb, cur);
    double prev1 = 0.0, prev2 = 0.0, p;
    for (int64_t k = 0; k < r->n2; k++) {
        int64_t q = rb + k;
        if (fitted && r->lo <= k && k < r->hi) {
            p = r->part[q];
            for (int u = 0; u < r->nfar; u++)
                p += r->far_w[u] * cur[q - r->far_d[u]];
            p += r->w2 * prev2;
            p += r->w1 * prev1;
        } else if (r->m->planar) {
            p = cur[q - 1] + cur[q - W] - cur[q - W - 1];
        } else {
            p = cur[q - 1] + cur[q - W] + prv[q] - cur[q - W - 1] - prv[q - 1] - prv[q - W]
                + prv[q - W - 1];
        }
        uint16_t code = c->codes[r->f];
        double v;
        if (code) {
            v = tp_sz_dequant(code, p, r->two_eb, c->radius, prec);
        } else {
            if (r->oi >= c->n_outliers)
                return tp_fail(err, TP_E_FORMAT, "sz payload: more outlier codes than outliers");
            v = tp_sz_get(c->outliers, f64, r->oi++);
        }
        tp_sz_put(c->out, f64, r->f++, v);
        cur[q] = v;
        prev2 = prev1;
        prev1 = v;
    }
    return TP_OK;
}

int tp_sz_fitted_decode(const tp_sz_chunk *c, tp_err *err)
{
    model m;
    int rc = parse(c->side, c->side_len, &m, err);
    if (rc || c->n == 0)
        return rc;
    run r = {.c = c, .m = &m, .two_eb = 2.0 * c->eb};
    r.n0 = (int64_t)c->shape[0];
    r.n1 = (int64_t)c->shape[1];
    r.n2 = (int64_t)c->shape[2];
    r.width = r.n2 + 1; /* a padded row: (j, k) at (j + 1) * width + k + 1 */
    r.plane = (r.n1 + 1) * r.width;
    setup(&r, &m);
    r.buf = calloc((size_t)(r.ring * r.plane), sizeof *r.buf);
    r.part = calloc((size_t)r.plane, sizeof *r.part);
    if (!r.buf || !r.part)
        rc = tp_fail(err, TP_E_MEMORY, "out of memory for the fitted predictor's planes");
    for (int64_t i = 0; i < r.n0 && rc == TP_OK; i++) {
        double *cur = r.buf + (i % r.ring) * r.plane;
        const double *prv = r.buf + ((i + r.ring - 1) % r.ring) * r.plane;
        int fitted_plane = r.planes && i >= r.depth;
        for (int64_t j = 0; j < r.n1 && rc == TP_OK; j++) {
            int fitted = fitted_plane && r.up <= j && j < r.n1 - r.down;
            /* the dtype and precision as constants: the compiler clones row per pair */
            if (c->f64)
                rc = row(&r, i, j, cur, prv, fitted, 1, TP_PREC_F64, err);
            else if (c->prec == TP_PREC_F32)
                rc = row(&r, i, j, cur, prv, fitted, 0, TP_PREC_F32, err);
            else
                rc = row(&r, i, j, cur, prv, fitted, 0, TP_PREC_F16, err);
        }
    }
    free(r.buf);
    free(r.part);
    return rc;
}
