/* The interpolation decoders' loops for one work dtype, included by sz_interp.c twice
 * (no include guard: once per dtype; a .h so the package data carries it):
 * T is float or double, FN(name) names this dtype's copy. Each mirrors its numba kernel
 * (compress/sz/kernels/interpolation.py, interp_md.py) operation for operation: the
 * predictions in double from the reconstructions (T promoted), the sums in the kernel's
 * order, then tp_sz_dequant; code 0 takes the next outlier. One exception to the
 * promotion, as numba types it: the linear mean's sum `float(a) + b` is T's (numba's
 * float() of a float32 is a float32), so it is rounded to T before it is halved. */

/* predictions of cnt points f0, f0 + fst, ... of a line from their neighbours at
 * +-st, +-3st along the pass dimension, in mode (one loop per mode: they vectorize) */
static void FN(predict)(double *pb, const T *r, uint64_t f0, uint64_t fst, uint64_t cnt,
                        uint64_t st, int mode)
{
    uint64_t t, f;
    switch (mode) {
    case M_CUBIC:
        for (t = 0, f = f0; t < cnt; t++, f += fst)
            pb[t] = (-(double)r[f - 3 * st] + 9.0 * r[f - st] + 9.0 * r[f + st]
                     - r[f + 3 * st]) / 16.0;
        break;
    case M_CUBIC_LEFT:
        for (t = 0, f = f0; t < cnt; t++, f += fst)
            pb[t] = (3.0 * r[f - st] + 6.0 * r[f + st] - r[f + 3 * st]) / 8.0;
        break;
    case M_CUBIC_RIGHT:
        for (t = 0, f = f0; t < cnt; t++, f += fst)
            pb[t] = (-(double)r[f - 3 * st] + 6.0 * r[f - st] + 3.0 * r[f + st]) / 8.0;
        break;
    case M_LINEAR:
        for (t = 0, f = f0; t < cnt; t++, f += fst)
            pb[t] = (double)(r[f - st] + r[f + st]) / 2.0;
        break;
    case M_EXTRAP:
        for (t = 0, f = f0; t < cnt; t++, f += fst)
            pb[t] = 1.5 * r[f - st] - 0.5 * r[f - 3 * st];
        break;
    default: /* M_COPY */
        for (t = 0, f = f0; t < cnt; t++, f += fst)
            pb[t] = (double)r[f - st];
    }
}

/* reconstruct the m points f0, f0 + fst, ... of a line against their predictions pb,
 * codes from codes[0], outliers from *oi on; the precision a constant in each loop */
static int FN(restore)(const tp_sz_chunk *c, const double *pb, const uint16_t *codes,
                       uint64_t m, T *r, uint64_t f0, uint64_t fst, double two_eb,
                       uint64_t *oi, tp_err *err)
{
    const int32_t radius = (int32_t)c->radius;
    uint64_t zeros = 0, t, f;
    if (c->prec == TP_PREC_F64) {
        for (t = 0, f = f0; t < m; t++, f += fst) {
            r[f] = (T)(pb[t] + (double)((int32_t)codes[t] - radius) * two_eb);
            zeros += codes[t] == 0;
        }
    } else if (c->prec == TP_PREC_F32) {
        for (t = 0, f = f0; t < m; t++, f += fst) {
            r[f] = (T)(float)(pb[t] + (double)((int32_t)codes[t] - radius) * two_eb);
            zeros += codes[t] == 0;
        }
    } else {
        for (t = 0, f = f0; t < m; t++, f += fst) {
            r[f] = (T)tp_sz_dequant(codes[t], pb[t], two_eb, c->radius, c->prec);
            zeros += codes[t] == 0;
        }
    }
    if (zeros > c->n_outliers - *oi)
        return tp_fail(err, TP_E_FORMAT, "sz payload: more outlier codes than outliers");
    const T *outl = c->outliers;
    for (t = 0, f = f0; zeros && t < m; t++, f += fst)
        if (codes[t] == 0) {
            r[f] = outl[(*oi)++];
            zeros--;
        }
    return TP_OK;
}

/* the anchor (0, 0, 0): prediction 0 under the bound of level L */
static int FN(anchor)(const tp_sz_chunk *c, double eb, uint64_t *oi, tp_err *err)
{
    T *r = c->out;
    double p = 0.0;
    return FN(restore)(c, &p, c->codes, 1, r, 0, 1, 2.0 * eb, oi, err);
}

/* predictors 2, 3, 8, 9: line interpolation, pass after pass (kernels/interpolation.py) */
static int FN(line)(const tp_sz_chunk *c, const double *lv, int L, int cubic, int order,
                    double *pb, tp_err *err)
{
    const uint64_t n0 = c->shape[0], n1 = c->shape[1], n2 = c->shape[2];
    T *r = c->out;
    uint64_t oi = 0, ci = 1;
    int rc = FN(anchor)(c, lv[L], &oi, err);
    for (int q = 1; q <= 3 * L && rc == TP_OK; q++) {
        int lvl = L - (q - 1) / 3;
        uint64_t s = (uint64_t)1 << (lvl - 1);
        pass g;
        geometry(&g, c->shape, pass_dim(q, order), s, order, cubic);
        double two_eb = 2.0 * lv[lvl];
        for (uint64_t i = g.i_lo; i < n0 && rc == TP_OK; i += g.i_st) {
            for (uint64_t j = g.j_lo; j < n1 && rc == TP_OK; j += g.j_st) {
                uint64_t f0 = (i * n1 + j) * n2 + g.k0;
                if (g.d != 2) /* the mode depends on i or j only */
                    g.seg[0].mode = g.d == 0 ? mode_at(i, s, n0, cubic)
                                             : mode_at(j, s, n1, cubic);
                for (int k = 0; k < g.nseg; k++)
                    FN(predict)(pb + g.seg[k].lo, r, f0 + g.seg[k].lo * g.k_st, g.k_st,
                                g.seg[k].hi - g.seg[k].lo, g.st, g.seg[k].mode);
                rc = FN(restore)(c, pb, c->codes + ci, g.cl, r, f0, g.k_st, two_eb, &oi, err);
                ci += g.cl;
            }
        }
    }
    return rc;
}

/* one dimension's interpolation (kernels/interp_md.py) of the m points f0, f0 + fst, ...
 * at coordinate x of n along it, their neighbours at +-st, added into pb */
static void FN(md_add)(double *pb, const T *r, uint64_t f0, uint64_t fst, uint64_t m,
                       uint64_t st, uint64_t x, uint64_t s, uint64_t n, int cubic)
{
    int m3 = cubic && x >= 3 * s, p3 = cubic && x + 3 * s < n;
    uint64_t t, f;
    if (m3 && p3) {
        for (t = 0, f = f0; t < m; t++, f += fst)
            pb[t] += (-(double)r[f - 3 * st] + 9.0 * r[f - st] + 9.0 * r[f + st]
                      - r[f + 3 * st]) / 16.0;
    } else if (p3) {
        for (t = 0, f = f0; t < m; t++, f += fst)
            pb[t] += (3.0 * r[f - st] + 6.0 * r[f + st] - r[f + 3 * st]) / 8.0;
    } else if (m3) {
        for (t = 0, f = f0; t < m; t++, f += fst)
            pb[t] += (-(double)r[f - 3 * st] + 6.0 * r[f - st] + 3.0 * r[f + st]) / 8.0;
    } else {
        for (t = 0, f = f0; t < m; t++, f += fst)
            pb[t] += (double)(r[f - st] + r[f + st]) / 2.0;
    }
}

/* along the line (dimension 2, the mode per point): the interpolation added where +s
 * exists, then the mean of the cnt + that many terms, or the extrapolation along the
 * first odd dimension `first` (x its coordinate; -1: k) where there are none */
static void FN(md_line)(double *pb, const T *r, uint64_t f0, uint64_t k0, uint64_t m,
                        uint64_t s, uint64_t n2, int cnt, int first, uint64_t x,
                        uint64_t fst_first, int cubic)
{
    for (uint64_t t = 0; t < m; t++) {
        uint64_t k = k0 + t * 2 * s, f = f0 + t * 2 * s;
        int cc = cnt;
        if (k + s < n2) {
            cc++;
            int m3 = cubic && k >= 3 * s, p3 = cubic && k + 3 * s < n2;
            double v;
            if (m3 && p3)
                v = (-(double)r[f - 3 * s] + 9.0 * r[f - s] + 9.0 * r[f + s] - r[f + 3 * s])
                    / 16.0;
            else if (p3)
                v = (3.0 * r[f - s] + 6.0 * r[f + s] - r[f + 3 * s]) / 8.0;
            else if (m3)
                v = (-(double)r[f - 3 * s] + 6.0 * r[f - s] + 3.0 * r[f + s]) / 8.0;
            else
                v = (double)(r[f - s] + r[f + s]) / 2.0;
            pb[t] += v;
        }
        if (cc > 1) {
            pb[t] /= cc;
        } else if (cc == 0) {
            uint64_t xf = first < 0 ? k : x, st = first < 0 ? s : fst_first;
            pb[t] = xf >= 3 * s ? 1.5 * r[f - st] - 0.5 * r[f - 3 * st] : (double)r[f - st];
        }
    }
}

/* one line of a group of level s (mask: the odd dimensions) at (i, j): its predictions */
static void FN(md_predict)(double *pb, const T *r, const uint64_t *dims, uint64_t i,
                           uint64_t j, uint64_t k0, uint64_t ks, uint64_t m, uint64_t s,
                           int mask, int cubic)
{
    const uint64_t n1 = dims[1], n2 = dims[2], flat[2] = {n1 * n2, n2};
    uint64_t f0 = (i * n1 + j) * n2 + k0;
    for (uint64_t t = 0; t < m; t++)
        pb[t] = 0.0;
    int cnt = 0, first = -1;
    for (int d = 0; d < 2; d++) { /* constant along the line */
        if (!(mask >> d & 1))
            continue;
        if (first < 0)
            first = d;
        uint64_t xd = d == 0 ? i : j;
        if (xd + s >= dims[d])
            continue;
        cnt++;
        FN(md_add)(pb, r, f0, ks, m, s * flat[d], xd, s, dims[d], cubic);
    }
    uint64_t xf = first == 0 ? i : j, stf = first >= 0 ? s * flat[first] : 0;
    if (mask & 4) {
        FN(md_line)(pb, r, f0, k0, m, s, n2, cnt, first, xf, stf, cubic);
    } else if (cnt > 1) {
        for (uint64_t t = 0; t < m; t++)
            pb[t] /= cnt;
    } else if (cnt == 0 && first >= 0) {
        if (xf >= 3 * s) {
            for (uint64_t t = 0, f = f0; t < m; t++, f += ks)
                pb[t] = 1.5 * r[f - stf] - 0.5 * r[f - 3 * stf];
        } else {
            for (uint64_t t = 0, f = f0; t < m; t++, f += ks)
                pb[t] = (double)r[f - stf];
        }
    }
}

/* predictors 4, 5: the groups of each level in order, each line along k */
static int FN(md)(const tp_sz_chunk *c, const double *lv, int L, int cubic, double *pb,
                  tp_err *err)
{
    const uint64_t *dims = c->shape;
    T *r = c->out;
    uint64_t oi = 0, ci = 1;
    int rc = FN(anchor)(c, lv[L], &oi, err);
    for (int lvl = L; lvl >= 1 && rc == TP_OK; lvl--) {
        uint64_t s = (uint64_t)1 << (lvl - 1);
        double two_eb = 2.0 * lv[lvl];
        for (int g = 0; g < 7 && rc == TP_OK; g++) {
            int mask = MD_GROUPS[g];
            uint64_t lo[3], st[3];
            for (int d = 0; d < 3; d++) {
                lo[d] = mask >> d & 1 ? s : 0;
                st[d] = 2 * s;
            }
            uint64_t m = dims[2] > lo[2] ? (dims[2] - lo[2] + st[2] - 1) / st[2] : 0;
            if (m == 0)
                continue;
            for (uint64_t i = lo[0]; i < dims[0] && rc == TP_OK; i += st[0]) {
                for (uint64_t j = lo[1]; j < dims[1] && rc == TP_OK; j += st[1]) {
                    FN(md_predict)(pb, r, dims, i, j, lo[2], st[2], m, s, mask, cubic);
                    uint64_t f0 = (i * dims[1] + j) * dims[2] + lo[2];
                    rc = FN(restore)(c, pb, c->codes + ci, m, r, f0, st[2], two_eb, &oi, err);
                    ci += m;
                }
            }
        }
    }
    return rc;
}
