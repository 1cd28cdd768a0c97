/* The `sz` codec's predictors in C (SPEC.md "sz"): the interface between the payload
 * parser (codec_sz.c) and each predictor's decoder (sz_<name>.c), the dispatch table
 * (sz_predictors.c), the Huffman decoder of the codes (sz_huffman.c) and the quantizer's
 * arithmetic (compress/sz/kernels/quantizer.py), inline so every predictor rounds alike.
 *
 * Floating point: each reconstruction is computed in double in the operation order of
 * the numba kernel it mirrors and rounded with tp_sz_round; the build has no
 * -ffast-math and -ffp-contract=off (an FMA would round once where numba rounds twice). */
#ifndef TP_SZ_H
#define TP_SZ_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "tp_decode.h"

/* predictor ids: the payload's first byte (compress/sz/ids.py) */
enum tp_sz_id {
    TP_SZ_RAW = 0,
    TP_SZ_LORENZO = 1,
    TP_SZ_LINEAR = 2,
    TP_SZ_CUBIC = 3,
    TP_SZ_MD_LINEAR = 4,
    TP_SZ_MD_CUBIC = 5,
    TP_SZ_CONSTANT = 6,
    TP_SZ_REGRESSION = 7,
    TP_SZ_LINEAR_REV = 8,
    TP_SZ_CUBIC_REV = 9,
    TP_SZ_LATTICE = 10,
    TP_SZ_FITTED = 11,
    TP_SZ_MATCH = 12,
    TP_SZ_PIVOT = 13,
    TP_SZ_WAVELET = 14,
    TP_SZ_CDF97 = 15,
    TP_SZ_NPRED = 16
};

/* storage precision of the reconstructions (compress/kernels/rounding.py PREC_*) */
enum tp_sz_prec { TP_PREC_F64 = 0, TP_PREC_F32 = 1, TP_PREC_F16 = 2 };

/* One chunk for a predictor's decoder. The codec has checked, before the call: `codes`
 * holds `n` codes, each below 2 * radius, exactly `n_outliers` of them 0; eb >= 2^-1000
 * and finite; 2 <= radius <= 32768; alpha, beta as SPEC.md requires of this id. A
 * decoder must still check everything it reads from `side` (lengths, indices, counts)
 * and never read or write outside the arrays below. */
typedef struct tp_sz_chunk {
    int id;              /* enum tp_sz_id */
    double alpha, beta;  /* the choice's tuning (or constant, offset and step) */
    int ndim;            /* tp_sz_predictors[id].ndim */
    uint64_t shape[4];   /* the layout folded to ndim dims (leading 1s), C order */
    uint64_t n;          /* elements: the product of shape */
    const uint8_t *side; /* side information (7, 11, 12; 13: the model only) */
    size_t side_len;     /* bytes */
    const uint16_t *codes;     /* n codes in the predictor's traversal order */
    const void *outliers;      /* n_outliers values of the work dtype, in order (aligned) */
    uint64_t n_outliers;
    double eb;           /* absolute bound of the payload (log2 domain with flag 0) */
    uint32_t radius;
    int prec;            /* enum tp_sz_prec: float16 data has prec F16, work float32 */
    int f64;             /* work dtype: 1 float64, 0 float32 (outliers and out) */
    void *out;           /* n values of the work dtype */
} tp_sz_chunk;

/* a predictor's decoder: 0, or a failure code set through err (never an abort) */
typedef int (*tp_sz_decode_fn)(const tp_sz_chunk *c, tp_err *err);

/* PIVOT's side information holds the Huffman streams of the codes' first segments:
 * decode them into codes[0 .. *nhead) (codes has room for n), and set *model_len to the
 * bytes of the model in front of them (the predictor's `side`); shape2: the 2-d fold */
typedef int (*tp_sz_side_codes_fn)(const uint8_t *side, size_t side_len,
                                   const uint64_t shape2[2], uint16_t *codes, uint64_t n,
                                   uint64_t *nhead, size_t *model_len, tp_err *err);

typedef struct tp_sz_predictor {
    int ndim;                       /* dimensions the chunk is folded to (steps.fold_shape) */
    int has_side;                   /* a u64 length + side bytes precede the codes */
    tp_sz_decode_fn decode;         /* NULL: a valid id not decoded here (TP_E_UNSUPPORTED) */
    tp_sz_side_codes_fn side_codes; /* PIVOT only, else NULL */
} tp_sz_predictor;

/* indexed by id; RAW's entry is unused (codec_sz.c decodes raw payloads itself) */
extern const tp_sz_predictor tp_sz_predictors[TP_SZ_NPRED];

/* the decoders: sz_lorenzo.c (Lorenzo and the lattice), sz_constant.c, sz_regression.c,
 * sz_interp.c (the interpolations), sz_fitted.c, sz_match.c, sz_pivot.c, sz_wavelet.c,
 * sz_cdf97.c */
int tp_sz_lorenzo_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_constant_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_regression_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_lattice_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_interp_decode(const tp_sz_chunk *c, tp_err *err);    /* 2, 3, 8, 9 */
int tp_sz_interp_md_decode(const tp_sz_chunk *c, tp_err *err); /* 4, 5 */
int tp_sz_fitted_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_match_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_pivot_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_wavelet_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_cdf97_decode(const tp_sz_chunk *c, tp_err *err);
int tp_sz_pivot_side_codes(const uint8_t *side, size_t side_len, const uint64_t shape2[2],
                           uint16_t *codes, uint64_t n, uint64_t *nhead, size_t *model_len,
                           tp_err *err);

/* one stream of compress/sz/huffman.py (exactly len bytes) into its count codes, with
 * every check of HuffmanDecoder (header, table, Kraft sum, bit count, padding, bits
 * used up exactly) */
int tp_sz_huffman_decode(const uint8_t *p, size_t len, uint16_t *codes, uint64_t count,
                         tp_err *err);

/* round_to_storage: v rounded to the storage precision, ties to even (float16 directly
 * from double, one rounding, as rounding._round_half_even) */
static inline double tp_sz_round(double v, int prec)
{
    if (prec == TP_PREC_F64)
        return v;
    if (prec == TP_PREC_F32)
        return (double)(float)v;
    double a = fabs(v);
    if (!(a < 65520.0))
        return isnan(a) ? v : copysign(INFINITY, v);
    if (a == 0.0)
        return v;
    int e;
    frexp(a, &e);
    int ex = e - 1 > -14 ? e - 1 : -14;
    double ulp = ldexp(1.0, ex - 10);
    return copysign(nearbyint(a / ulp) * ulp, v);
}

/* quantizer.dequantize: the reconstruction of a code c != 0 against the prediction p */
static inline double tp_sz_dequant(uint16_t c, double p, double two_eb, uint32_t radius,
                                   int prec)
{
    return tp_sz_round(p + (double)((int64_t)c - (int64_t)radius) * two_eb, prec);
}

/* the work array's value i as double, and a store of a double into it */
static inline double tp_sz_get(const void *a, int f64, uint64_t i)
{
    return f64 ? ((const double *)a)[i] : (double)((const float *)a)[i];
}
static inline void tp_sz_put(void *a, int f64, uint64_t i, double v)
{
    if (f64)
        ((double *)a)[i] = v;
    else
        ((float *)a)[i] = (float)v;
}

#endif
