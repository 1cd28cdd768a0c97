/* `sz` predictor 6: every element predicted by alpha (compress/sz/kernels/constant.py's
 * decoder), in C order; the zero codes take the outliers in order. */
#include "sz.h"

int tp_sz_constant_decode(const tp_sz_chunk *c, tp_err *err)
{
    (void)err;
    double two_eb = 2.0 * c->eb, p = c->alpha;
    uint64_t oi = 0;
    for (uint64_t t = 0; t < c->n; t++) {
        uint16_t code = c->codes[t];
        double v = code ? tp_sz_dequant(code, p, two_eb, c->radius, c->prec)
                        : tp_sz_get(c->outliers, c->f64, oi++);
        tp_sz_put(c->out, c->f64, t, v);
    }
    return 0;
}
