/* `sz` predictors 1 (Lorenzo) and 10 (Lorenzo on the indices of data on a lattice):
 * compress/sz/kernels/lorenzo.py's decoder. Size-1 dimensions are dropped (exact with
 * zero padding) and a 1-d to 4-d loop runs over a rolling float64 buffer of the
 * reconstructions padded by one zero row, column or plane; each prediction sums the
 * neighbours in the kernel's order, so the values are its values bit for bit. */
#include <stdlib.h>

#include "sz.h"

typedef struct run {
    const tp_sz_chunk *c;
    double two_eb;
    uint64_t oi; /* next outlier */
    int prec;
} run;

/* the value of code f against the prediction p (quantizer.decode_value) */
static inline double value(run *r, uint64_t f, double p)
{
    uint16_t code = r->c->codes[f];
    if (code == 0) /* the codec checked: as many outliers as zero codes */
        return tp_sz_get(r->c->outliers, r->c->f64, r->oi++);
    return tp_sz_dequant(code, p, r->two_eb, r->c->radius, r->prec);
}

static void run1(run *r, uint64_t n)
{
    double prev = 0.0;
    for (uint64_t f = 0; f < n; f++) {
        prev = value(r, f, prev);
        tp_sz_put(r->c->out, r->c->f64, f, prev);
    }
}

static void run2(run *r, const uint64_t *d, double *buf)
{
    uint64_t n0 = d[0], n1 = d[1], f = 0;
    for (uint64_t i = 0; i < n0; i++) {
        double *cur = buf + (i & 1) * (n1 + 1), *up = buf + ((i + 1) & 1) * (n1 + 1);
        double left = 0.0;
        for (uint64_t j = 0; j < n1; j++, f++) {
            double v = value(r, f, (up[j + 1] - up[j]) + left);
            tp_sz_put(r->c->out, r->c->f64, f, v);
            cur[j + 1] = v;
            left = v;
        }
    }
}

static void run3(run *r, const uint64_t *d, double *buf)
{
    uint64_t n1 = d[1], n2 = d[2], f = 0, row = n2 + 1, plane = (n1 + 1) * row;
    for (uint64_t i = 0; i < d[0]; i++) {
        double *cur = buf + (i & 1) * plane, *prv = buf + ((i + 1) & 1) * plane;
        for (uint64_t j = 0; j < n1; j++) {
            const double *c0 = cur + j * row, *p0 = prv + j * row, *p1 = prv + (j + 1) * row;
            double *c1 = cur + (j + 1) * row, left = 0.0;
            for (uint64_t k = 0; k < n2; k++, f++) {
                double p = (c0[k + 1] + p1[k + 1] - c0[k] - p1[k] - p0[k + 1] + p0[k]) + left;
                double v = value(r, f, p);
                tp_sz_put(r->c->out, r->c->f64, f, v);
                c1[k + 1] = v;
                left = v;
            }
        }
    }
}

static void run4(run *r, const uint64_t *d, double *buf)
{
    uint64_t n1 = d[1], n2 = d[2], n3 = d[3], f = 0;
    uint64_t row = n3 + 1, plane = (n2 + 1) * row, vol = (n1 + 1) * plane;
    for (uint64_t i = 0; i < d[0]; i++) {
        double *cur = buf + (i & 1) * vol, *prv = buf + ((i + 1) & 1) * vol;
        for (uint64_t j = 0; j < n1; j++) {
            for (uint64_t k = 0; k < n2; k++) {
                /* rows named by which of (i, j, k) are decremented */
                double *r000 = cur + (j + 1) * plane + (k + 1) * row;
                const double *r001 = cur + (j + 1) * plane + k * row;
                const double *r010 = cur + j * plane + (k + 1) * row;
                const double *r011 = cur + j * plane + k * row;
                const double *r100 = prv + (j + 1) * plane + (k + 1) * row;
                const double *r101 = prv + (j + 1) * plane + k * row;
                const double *r110 = prv + j * plane + (k + 1) * row;
                const double *r111 = prv + j * plane + k * row;
                double left = 0.0;
                for (uint64_t m = 0; m < n3; m++, f++) {
                    uint64_t a = m + 1;
                    double p = (r001[a] + r010[a] + r100[a] - r001[m] - r010[m] - r100[m] -
                                r011[a] - r101[a] - r110[a] + r011[m] + r101[m] + r110[m] +
                                r111[a] - r111[m]) +
                               left;
                    double v = value(r, f, p);
                    tp_sz_put(r->c->out, r->c->f64, f, v);
                    r000[a] = v;
                    left = v;
                }
            }
        }
    }
}

/* Lorenzo over the chunk's 4-d fold with the bound eb and precision prec */
static int lorenzo(const tp_sz_chunk *c, double eb, int prec, tp_err *err)
{
    uint64_t d[4] = {1, 1, 1, 1};
    int nd = 0;
    for (int ax = 0; ax < 4; ax++)
        if (c->shape[ax] != 1)
            d[nd++] = c->shape[ax];
    run r = {c, 2.0 * eb, 0, prec};
    if (nd <= 1) {
        run1(&r, c->n);
        return 0;
    }
    /* two planes (rows, volumes) of the dims after the first, each padded by one */
    size_t cells = 2;
    for (int ax = 1; ax < nd; ax++)
        cells *= (size_t)d[ax] + 1;
    double *buf = calloc(cells, sizeof *buf);
    if (!buf)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the Lorenzo decoder");
    if (nd == 2)
        run2(&r, d, buf);
    else if (nd == 3)
        run3(&r, d, buf);
    else
        run4(&r, d, buf);
    free(buf);
    return 0;
}

int tp_sz_lorenzo_decode(const tp_sz_chunk *c, tp_err *err)
{
    return lorenzo(c, c->eb, c->prec, err);
}

/* the indices k under the bound 0.5 in float64, then offset + k * step (lattice.py) */
int tp_sz_lattice_decode(const tp_sz_chunk *c, tp_err *err)
{
    if (!c->f64)
        return tp_fail(err, TP_E_FORMAT, "sz lattice decodes into float64 only");
    int rc = lorenzo(c, 0.5, TP_PREC_F64, err);
    double *out = c->out, step = c->beta, offset = c->alpha;
    for (uint64_t i = 0; rc == 0 && i < c->n; i++) {
        double k = out[i];
        if (step != 1.0) /* as lattice_values: a step of 1 is not multiplied */
            k *= step;
        out[i] = k + offset;
    }
    return rc;
}
