/* The `quant` encoder (SPEC.md "quant"), byte for byte as QuantCodec.encode writes a chunk
 * payload (compress/quant/kernels/cpu.py, quant_encode): per group its minimum and scale
 * rounded to the parameter type, codes floor((v - lo) / scale + u) clamped to the bits,
 * the reconstruction's largest error; the chunk raw where that error is not finite. */
#include <math.h>
#include <string.h>

#include "quant.h"

typedef struct group_args {
    const tp_header *h;
    double fmaxc;
    uint64_t offset; /* the chunk's first element in the array */
} group_args;

/* float64 v rounded to the parameter type: float64 for float64 data, else float32 */
static double to_param(double v, size_t itemsize)
{
    return itemsize == 8 ? v : (double)(float)v;
}

static void put_param(uint8_t *p, double v, size_t itemsize)
{
    if (itemsize == 8) {
        memcpy(p, &v, 8);
    } else {
        float f = (float)v;
        memcpy(p, &f, 4);
    }
}

/* codes[:width] of the group v (whose first element is start) under lo_p, scale_p */
static void quantize(const group_args *a, const double *v, int width, uint64_t start,
                     double lo_p, double scale_p, uint8_t *codes)
{
    const tp_header *h = a->h;
    if (!(scale_p > 0.0)) {
        memset(codes, 0, (size_t)width);
        return;
    }
    for (int j = 0; j < width; j++) {
        double u = 0.5;
        if (h->q_stochastic)
            u = (double)(tp_hash32(2 * (uint64_t)h->q_seed, a->offset + start + (uint64_t)j) >> 8)
                * 0x1p-24;
        double q = floor((v[j] - lo_p) / scale_p + u);
        if (!(q >= 0.0)) /* also NaN (the chunk then goes raw) */
            q = 0.0;
        else if (q > a->fmaxc)
            q = a->fmaxc;
        codes[j] = (uint8_t)q;
    }
}

/* codes[:count] LSB first into packed; codes holds zeros up to the next whole byte */
static void pack(const uint8_t *codes, int count, int bits, uint8_t *packed)
{
    int per = 8 / bits, nbytes = (count * bits + 7) / 8;
    for (int b = 0; b < nbytes; b++) {
        unsigned acc = 0;
        for (int s = 0; s < per; s++)
            acc |= (unsigned)codes[b * per + s] << (s * bits);
        packed[b] = (uint8_t)acc;
    }
}

/* group g of x: its lo and scale, packed codes; returns the largest error of its values
 * (NaN where one is not finite) */
static double encode_group(const group_args *a, const double *x, uint64_t n, uint64_t g,
                           uint8_t *lo_out, uint8_t *scale_out, uint8_t *packed, double *v,
                           double *sg, uint8_t *codes)
{
    const tp_header *h = a->h;
    int group = h->q_group;
    uint64_t start = g * (uint64_t)group;
    int size = n - start < (uint64_t)group ? (int)(n - start) : group;
    int width = h->q_hadamard ? group : size;
    size_t isz = h->itemsize, psize = isz == 8 ? 8 : 4;
    for (int j = 0; j < width; j++)
        v[j] = j < size ? x[start + (uint64_t)j] : 0.0;
    if (h->q_hadamard) {
        tp_quant_signs(sg, width, 2 * (uint64_t)h->q_seed + 1, start);
        for (int j = 0; j < width; j++)
            v[j] *= sg[j];
        tp_fwht(v, width);
    }
    double lo = v[0], hi = v[0];
    for (int j = 1; j < width; j++) { /* selects: a NaN is skipped as the kernel skips it */
        lo = v[j] < lo ? v[j] : lo;
        hi = v[j] > hi ? v[j] : hi;
    }
    double lo_p = to_param(lo + 0.0, isz); /* + 0.0: min and max may pick either zero */
    double scale_p = to_param(((hi + 0.0) - lo_p) / a->fmaxc, isz);
    put_param(lo_out + g * psize, lo_p, isz);
    put_param(scale_out + g * psize, scale_p, isz);
    quantize(a, v, width, start, lo_p, scale_p, codes);
    for (int j = 0; j < width; j++)
        v[j] = lo_p + (double)codes[j] * scale_p;
    if (h->q_hadamard) {
        tp_fwht(v, width);
        for (int j = 0; j < width; j++)
            v[j] = v[j] * sg[j] / group;
    }
    double most = 0.0;
    for (int j = 0; j < size; j++) {
        double e = fabs(tp_quant_storage(v[j], isz) - x[start + (uint64_t)j]);
        if (e != e)
            return NAN;
        most = e > most ? e : most;
    }
    memset(codes + width, 0, 8); /* whole bytes of codes for pack */
    pack(codes, width, h->q_bits, packed + start * (uint64_t)h->q_bits / 8);
    return most;
}

size_t tp_quant_encode(const tp_header *h, const double *x, const uint8_t *raw, uint64_t n,
                       uint64_t offset, uint8_t *out, double *scratch)
{
    group_args a = {h, (double)((1 << h->q_bits) - 1), offset};
    int group = h->q_group;
    size_t isz = h->itemsize, psize = isz == 8 ? 8 : 4;
    uint64_t ngroups = n / (uint64_t)group + (n % (uint64_t)group != 0);
    uint8_t *lo = out + TP_QUANT_HEAD, *scale = lo + ngroups * psize;
    uint8_t *packed = scale + ngroups * psize, *codes = (uint8_t *)(scratch + 2 * group);
    double most = 0.0;
    for (uint64_t g = 0; g < ngroups; g++) {
        double e = encode_group(&a, x, n, g, lo, scale, packed, scratch, scratch + group, codes);
        if (!(e < INFINITY)) { /* not finite: the chunk is stored as it is */
            out[0] = 1;
            memcpy(out + 1, raw, (size_t)n * isz);
            return 1 + (size_t)n * isz;
        }
        most = e > most ? e : most;
    }
    out[0] = 0;
    memcpy(out + 1, &most, 8);
    return (size_t)tp_quant_payload_size(n, h->q_bits, group, h->q_hadamard, isz);
}
