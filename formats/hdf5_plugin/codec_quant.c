/* The `quant` codec's decoder (SPEC.md "quant"): per group lo + code * scale in float64,
 * the inverse Hadamard transform where the config asks for it, rounded to the dtype
 * through float32; or the chunk's values as they are. Checks as QuantCodec.decode. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

uint32_t tp_hash32(uint64_t key, uint64_t i)
{
    /* the Python version's products are taken mod 2**32; uint64 wraps mod 2**64, whose
     * low 32 bits are the same */
    uint32_t x = (uint32_t)(key * 0x9E3779B1u + (i & 0xFFFFFFFFu) + (i >> 32) * 0x632BE5ABu);
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

void tp_quant_signs(double *sg, int size, uint64_t key, uint64_t pos)
{
    for (int j = 0; j < size; j++)
        sg[j] = 1.0 - 2.0 * (double)(tp_hash32(key, pos + (uint64_t)j) & 1);
}

void tp_fwht(double *v, int size)
{
    for (int h = 1; h < size; h *= 2)
        for (int i = 0; i < size; i += 2 * h)
            for (int k = i; k < i + h; k++) {
                double a = v[k], b = v[k + h];
                v[k] = a + b;
                v[k + h] = a - b;
            }
}

double tp_half_to_double(uint16_t h)
{
    int e = h >> 10 & 0x1F, s = h & 0x3FF;
    double v = e == 0 ? ldexp(s, -24) : e == 31 ? (s ? NAN : INFINITY) : ldexp(s | 0x400, e - 25);
    return h & 0x8000 ? -v : v;
}

double tp_quant_storage(double v, size_t itemsize)
{
    if (itemsize == 8)
        return v;
    float f = (float)v;
    if (itemsize == 4)
        return f;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return tp_half_to_double(tp_half_from_float_bits(bits));
}

uint64_t tp_quant_payload_size(uint64_t n, int bits, int group, int hadamard,
                               size_t itemsize)
{
    uint64_t ngroups = n / (uint64_t)group + (n % (uint64_t)group != 0);
    uint64_t ncodes = hadamard ? ngroups * (uint64_t)group : n;
    return TP_QUANT_HEAD + 2 * ngroups * (itemsize == 8 ? 8 : 4) + (ncodes * bits + 7) / 8;
}

static double param(const uint8_t *p, size_t psize)
{
    if (psize == 8) {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* float64 v rounded to the chunk's dtype at out[i]: 16-bit through float32, NaN's bits
 * as numpy converts them */
static void put(uint8_t *out, uint64_t i, double v, size_t itemsize)
{
    if (itemsize == 8) {
        memcpy(out + 8 * i, &v, 8);
    } else if (itemsize == 4) {
        float f = (float)v;
        memcpy(out + 4 * i, &f, 4);
    } else {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        uint16_t half = tp_half_from_float_bits(bits);
        memcpy(out + 2 * i, &half, 2);
    }
}

/* groups of codes at packed into out; v and sg hold group doubles each */
static void dequantize(const tp_header *h, const uint8_t *lo, const uint8_t *scale,
                       const uint8_t *packed, uint64_t n, uint8_t *out, double *v, double *sg)
{
    int bits = h->q_bits, group = h->q_group, per = 8 / bits, mask = (1 << bits) - 1;
    int shift = bits == 2 ? 2 : bits == 4 ? 1 : 0; /* log2(per) */
    size_t psize = h->itemsize == 8 ? 8 : 4;
    uint64_t ngroups = n / (uint64_t)group + (n % (uint64_t)group != 0);
    for (uint64_t g = 0; g < ngroups; g++) {
        uint64_t start = g * (uint64_t)group;
        int size = n - start < (uint64_t)group ? (int)(n - start) : group;
        int width = h->q_hadamard ? group : size;
        double lo_p = param(lo + g * psize, psize), scale_p = param(scale + g * psize, psize);
        const uint8_t *at = packed + start * (uint64_t)bits / 8;
        for (int j = 0; j < width; j++) {
            int c = at[j >> shift] >> ((j & (per - 1)) * bits) & mask;
            v[j] = lo_p + (double)c * scale_p;
        }
        if (h->q_hadamard) {
            tp_quant_signs(sg, width, 2 * (uint64_t)h->q_seed + 1, start);
            tp_fwht(v, width);
            for (int j = 0; j < width; j++)
                v[j] = v[j] * sg[j] / group;
        }
        for (int j = 0; j < size; j++)
            put(out, start + (uint64_t)j, v[j], h->itemsize);
    }
}

int tp_quant_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                    uint8_t *out, tp_err *err)
{
    if (len < 1)
        return tp_fail(err, TP_E_FORMAT, "quant payload is empty");
    if (p[0] == 1) {
        if (len - 1 != n * h->itemsize)
            return tp_fail(err, TP_E_FORMAT, "raw quant payload has %zu data bytes, its %llu "
                           "values need %llu", len - 1, (unsigned long long)n,
                           (unsigned long long)(n * h->itemsize));
        memcpy(out, p + 1, len - 1);
        return 0;
    }
    if (p[0] != 0)
        return tp_fail(err, TP_E_FORMAT, "unknown quant chunk mode %d (expected 0 or 1)", p[0]);
    uint64_t want = tp_quant_payload_size(n, h->q_bits, h->q_group, h->q_hadamard, h->itemsize);
    if (len != want)
        return tp_fail(err, TP_E_FORMAT, "quant payload has %zu bytes, its %llu values need "
                       "%llu", len, (unsigned long long)n, (unsigned long long)want);
    uint64_t ngroups = n / (uint64_t)h->q_group + (n % (uint64_t)h->q_group != 0);
    size_t psize = h->itemsize == 8 ? 8 : 4;
    double *v = malloc(2 * (size_t)h->q_group * sizeof *v);
    if (!v)
        return tp_fail(err, TP_E_MEMORY, "out of memory");
    const uint8_t *lo = p + TP_QUANT_HEAD, *scale = lo + ngroups * psize;
    dequantize(h, lo, scale, scale + ngroups * psize, n, out, v, v + h->q_group);
    free(v);
    return 0;
}
