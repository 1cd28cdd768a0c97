/* The `sz` row-match predictor (12; SPEC.md "sz", "Row match"): each row of the 2-d
 * layout predicted by the reconstruction of an earlier row, or by the constant alpha.
 * Bit for bit compress/sz/kernels/match.py: the prediction is first stored in the row
 * (in the work dtype), then replaced by the reconstruction. */
#include <stdlib.h>

#include "sz.h"

/* the width-bit fields of side (after its width byte), least significant bit first */
static uint64_t field(const uint8_t *p, uint64_t t, unsigned width)
{
    uint64_t bit = t * width, v = 0;
    for (unsigned b = 0; b < width; b++, bit++)
        v |= (uint64_t)(p[bit >> 3] >> (bit & 7) & 1) << b;
    return v;
}

/* sz/match.py unpack: one reference per row, each to an earlier row (or 0) */
static int references(const tp_sz_chunk *c, uint64_t rows, uint64_t *refs, tp_err *err)
{
    unsigned width = c->side_len ? c->side[0] : 64;
    if (width > 32 || c->side_len - 1 != (rows * width + 7) / 8)
        return tp_fail(err, TP_E_FORMAT, "sz payload: the row references have the wrong length");
    for (uint64_t t = 0; t < rows; t++) {
        refs[t] = field(c->side + 1, t, width);
        if (refs[t] > t)
            return tp_fail(err, TP_E_FORMAT, "sz payload: a row refers to no earlier row");
    }
    return TP_OK;
}

/* row t from its prediction (row t - refs[t], or alpha in the work dtype T), one pass:
 * float32 and float64 precision round by the cast to T (a loop without branches),
 * float16's through tp_sz_dequant; then the outliers */
#define RESTORE(T)                                                                          \
    do {                                                                                    \
        T *out = c->out, *row = out + t * n;                                                \
        const T *outl = c->outliers, *ref = out + (t - refs[t]) * n;                        \
        const T a = (T)c->alpha;                                                            \
        uint64_t zeros = 0;                                                                 \
        if (c->prec == TP_PREC_F16) {                                                       \
            for (uint64_t i = 0; i < n; i++) {                                              \
                T p = refs[t] ? ref[i] : a;                                                 \
                row[i] = (T)tp_sz_dequant(cr[i], p, two_eb, c->radius, c->prec);           \
                zeros += cr[i] == 0;                                                        \
            }                                                                               \
        } else if (refs[t]) {                                                               \
            for (uint64_t i = 0; i < n; i++) {                                              \
                row[i] = (T)(ref[i] + (double)((int32_t)cr[i] - radius) * two_eb);          \
                zeros += cr[i] == 0;                                                        \
            }                                                                               \
        } else {                                                                            \
            for (uint64_t i = 0; i < n; i++) {                                              \
                row[i] = (T)(a + (double)((int32_t)cr[i] - radius) * two_eb);               \
                zeros += cr[i] == 0;                                                        \
            }                                                                               \
        }                                                                                   \
        if (zeros > c->n_outliers - oi)                                                     \
            return tp_fail(err, TP_E_FORMAT, "sz payload: more outlier codes than outliers");  \
        for (uint64_t i = 0; zeros && i < n; i++) {                                         \
            if (cr[i] == 0) {                                                               \
                row[i] = outl[oi++];                                                        \
                zeros--;                                                                    \
            }                                                                               \
        }                                                                                   \
    } while (0)

static int restore(const tp_sz_chunk *c, const uint64_t *refs, tp_err *err)
{
    const uint64_t rows = c->shape[0], n = c->shape[1];
    const double two_eb = 2.0 * c->eb;
    const int32_t radius = (int32_t)c->radius;
    uint64_t oi = 0;
    for (uint64_t t = 0; t < rows; t++) {
        const uint16_t *cr = c->codes + t * n;
        if (c->f64)
            RESTORE(double);
        else
            RESTORE(float);
    }
    return TP_OK;
}

int tp_sz_match_decode(const tp_sz_chunk *c, tp_err *err)
{
    uint64_t rows = c->shape[0];
    uint64_t *refs = malloc((rows ? rows : 1) * sizeof *refs);
    if (!refs)
        return tp_fail(err, TP_E_MEMORY, "out of memory for the row references");
    int rc = references(c, rows, refs, err);
    if (rc == TP_OK)
        rc = restore(c, refs, err);
    free(refs);
    return rc;
}
