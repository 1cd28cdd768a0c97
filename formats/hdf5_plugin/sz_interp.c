/* The `sz` interpolation predictors (SPEC.md "sz", "Interpolation"): line interpolation
 * linear (2) or cubic (3), each level's passes along dimensions 0, 1, 2 or reversed
 * (8, 9), and the multi-dimensional ones (4, 5), over the chunk folded to 3-d. Bit for
 * bit those of compress/sz/kernels/interpolation.py and interp_md.py: the loops for each
 * work dtype are in sz_interp_body.h. */
#include <stdlib.h>

#include "sz.h"

/* prediction modes along a pass line (kernels/interpolation.py _mode) */
enum { M_CUBIC, M_CUBIC_LEFT, M_CUBIC_RIGHT, M_LINEAR, M_EXTRAP, M_COPY };

/* the odd-coordinate sets of the multi-dimensional groups in coding order (bit d: odd) */
static const int MD_GROUPS[7] = {1, 2, 4, 3, 5, 6, 7};

/* levels L = max(1, ceil(log2(max dim))) */
static int num_levels(const uint64_t *shape)
{
    uint64_t n = shape[0];
    for (int d = 1; d < 3; d++)
        n = shape[d] > n ? shape[d] : n;
    int L = 0;
    while (L < 64 && ((uint64_t)1 << L) < n)
        L++;
    return L > 1 ? L : 1;
}

/* interpolation.eb_levels: level l's bound eb / min(alpha^(l-1), beta) (l >= 1), with
 * libm's pow as numpy's power calls it for an array of exponents */
static void eb_levels(double *lv, int L, double eb, double alpha, double beta)
{
    for (int l = 0; l <= L; l++) {
        double a = pow(alpha, (double)(l > 1 ? l - 1 : 0));
        lv[l] = eb / (a < beta ? a : beta);
    }
}

/* the prediction mode of the point at x (an odd multiple of s) on a line of n */
static int mode_at(uint64_t x, uint64_t s, uint64_t n, int cubic)
{
    if (x + s < n) {
        if (cubic) {
            int m3 = x >= 3 * s, p3 = x + 3 * s < n;
            if (m3 && p3)
                return M_CUBIC;
            if (p3)
                return M_CUBIC_LEFT;
            if (m3)
                return M_CUBIC_RIGHT;
        }
        return M_LINEAR;
    }
    return x >= 3 * s ? M_EXTRAP : M_COPY;
}

/* the dimension of pass q >= 1: 0, 1, 2 in each level (order 0) or 2, 1, 0 (order 1) */
static int pass_dim(int q, int order)
{
    int d = (q - 1) % 3;
    return order == 0 ? d : 2 - d;
}

typedef struct segment {
    uint64_t lo, hi; /* points lo .. hi - 1 of a line */
    int mode;
} segment;

/* one pass along d with stride s: its lines (i, j) start at i_lo, j_lo and step by
 * i_st, j_st; each holds cl points k0, k0 + k_st, ...; st: the flat offset of +-s
 * along d; along k (d == 2) the points' modes come in nseg runs */
typedef struct pass {
    int d, nseg;
    uint64_t i_lo, i_st, j_lo, j_st, k0, k_st, st, cl;
    segment seg[6];
} pass;

/* grid step of dimension e in the pass along d: s once e was passed at this level */
static uint64_t grid_step(int e, int d, uint64_t s, int order)
{
    int earlier = order == 0 ? e < d : e > d;
    return earlier ? s : 2 * s;
}

static void geometry(pass *g, const uint64_t *n, int d, uint64_t s, int order, int cubic)
{
    g->d = d;
    g->i_lo = d == 0 ? s : 0;
    g->i_st = d == 0 ? 2 * s : grid_step(0, d, s, order);
    g->j_lo = d == 1 ? s : 0;
    g->j_st = d == 1 ? 2 * s : grid_step(1, d, s, order);
    g->k0 = d == 2 ? s : 0;
    g->k_st = d == 2 ? 2 * s : grid_step(2, d, s, order);
    g->st = d == 0 ? s * n[1] * n[2] : d == 1 ? s * n[2] : s;
    g->cl = n[2] > g->k0 ? (n[2] - g->k0 + g->k_st - 1) / g->k_st : 0;
    g->nseg = 1;
    g->seg[0].lo = 0;
    g->seg[0].hi = g->cl;
    g->seg[0].mode = M_LINEAR;
    if (d != 2 || g->cl == 0)
        return;
    g->nseg = 0; /* along k: runs of equal mode (at most 5) */
    for (uint64_t t = 0; t < g->cl; t++) {
        int m = mode_at(s + 2 * s * t, s, n[2], cubic);
        if (g->nseg > 0 && g->seg[g->nseg - 1].mode == m) {
            g->seg[g->nseg - 1].hi = t + 1;
        } else {
            g->seg[g->nseg] = (segment){t, t + 1, m};
            g->nseg++;
        }
    }
}

#define T float
#define FN(name) name##_f32
#include "sz_interp_body.h"
#undef T
#undef FN
#define T double
#define FN(name) name##_f64
#include "sz_interp_body.h"
#undef T
#undef FN

/* the chunk's levels and bounds per level, and a line's prediction buffer */
static int prepare(const tp_sz_chunk *c, int *L, double *lv, double **pb, tp_err *err)
{
    *L = num_levels(c->shape);
    eb_levels(lv, *L, c->eb, c->alpha, c->beta);
    for (int l = 1; l <= *L; l++)
        if (!(lv[l] > 0.0))
            return tp_fail(err, TP_E_FORMAT, "sz payload: an interpolation level's bound is 0");
    *pb = malloc((c->shape[2] + 1) * sizeof **pb);
    if (!*pb)
        return tp_fail(err, TP_E_MEMORY, "out of memory for an interpolation line");
    return TP_OK;
}

int tp_sz_interp_decode(const tp_sz_chunk *c, tp_err *err)
{
    if (c->n == 0)
        return TP_OK;
    int L, cubic = c->id == TP_SZ_CUBIC || c->id == TP_SZ_CUBIC_REV;
    int order = c->id == TP_SZ_LINEAR_REV || c->id == TP_SZ_CUBIC_REV;
    double lv[65], *pb = NULL;
    int rc = prepare(c, &L, lv, &pb, err);
    if (rc == TP_OK)
        rc = c->f64 ? line_f64(c, lv, L, cubic, order, pb, err)
                    : line_f32(c, lv, L, cubic, order, pb, err);
    free(pb);
    return rc;
}

int tp_sz_interp_md_decode(const tp_sz_chunk *c, tp_err *err)
{
    if (c->n == 0)
        return TP_OK;
    int L, cubic = c->id == TP_SZ_MD_CUBIC;
    double lv[65], *pb = NULL;
    int rc = prepare(c, &L, lv, &pb, err);
    if (rc == TP_OK)
        rc = c->f64 ? md_f64(c, lv, L, cubic, pb, err) : md_f32(c, lv, L, cubic, pb, err);
    free(pb);
    return rc;
}
