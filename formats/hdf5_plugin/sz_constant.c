/* `sz` predictor 6: every element predicted by alpha (compress/sz/kernels/constant.py's
 * decoder), in C order; the zero codes take the outliers in order. As the kernel, the
 * values are computed for every code first (a loop without branches, which vectorizes)
 * and the outliers written over the zero codes' after. */
#include "sz.h"

int tp_sz_constant_decode(const tp_sz_chunk *c, tp_err *err)
{
    (void)err;
    double two_eb = 2.0 * c->eb, p = c->alpha;
    int32_t radius = (int32_t)c->radius;
    const uint16_t *codes = c->codes;
    uint64_t n = c->n;
    if (c->f64 && c->prec == TP_PREC_F64) {
        double *out = c->out;
        for (uint64_t t = 0; t < n; t++)
            out[t] = p + (double)((int32_t)codes[t] - radius) * two_eb;
    } else if (!c->f64 && c->prec == TP_PREC_F32) {
        float *out = c->out;
        for (uint64_t t = 0; t < n; t++)
            out[t] = (float)(p + (double)((int32_t)codes[t] - radius) * two_eb);
    } else {
        for (uint64_t t = 0; t < n; t++)
            tp_sz_put(c->out, c->f64, t, tp_sz_dequant(codes[t], p, two_eb, c->radius, c->prec));
    }
    for (uint64_t t = 0, oi = 0; oi < c->n_outliers && t < n; t++)
        if (codes[t] == 0) /* the codec checked: as many outliers as zero codes */
            tp_sz_put(c->out, c->f64, t, tp_sz_get(c->outliers, c->f64, oi++));
    return 0;
}
