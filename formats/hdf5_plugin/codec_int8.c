/* The `int8` codec (SPEC.md "int8"): one signed byte a value, x' = q * step in float64
 * rounded to the dtype, or the chunk's values as they are. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "tp_decode.h"

/* block's step for an abs tolerance (compress/kernels/block_layout.py, steps_for) */
double tp_step_for(double tol)
{
    double step = 2.0 * tol * (1.0 - 0x1p-12);
    return isfinite(step) ? step : DBL_MAX;
}

int tp_int8_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                   uint8_t *out, tp_err *err)
{
    if (len < 1)
        return tp_fail(err, TP_E_FORMAT, "int8 payload is empty");
    size_t want = p[0] == 1 ? (size_t)n * h->itemsize : p[0] == 2 ? (size_t)n : 0;
    if (p[0] != 1 && p[0] != 2)
        return tp_fail(err, TP_E_FORMAT, "unknown int8 chunk mode %d", p[0]);
    if (len - 1 != want)
        return tp_fail(err, TP_E_FORMAT, "int8 payload holds %zu bytes, its values need %zu",
                       len - 1, want);
    if (p[0] == 1) {
        memcpy(out, p + 1, want);
        return 0;
    }
    if (!(h->tolerance > 0)) /* the encoder writes codes only under a positive bound */
        return tp_fail(err, TP_E_FORMAT, "int8 codes under a zero tolerance");
    double step = tp_step_for(h->tolerance);
    for (size_t i = 0; i < (size_t)n; i++) {
        double v = (double)(int8_t)p[1 + i] * step;
        if (h->itemsize == 8) {
            memcpy(out + 8 * i, &v, 8);
        } else {
            float f = (float)v;
            memcpy(out + 4 * i, &f, 4);
        }
    }
    return 0;
}
