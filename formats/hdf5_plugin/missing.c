/* Missing values (SPEC.md, header fields "missing" and "valid"; formats/missing.py):
 * the header's fields checked as the Python reader checks them, and each decoded chunk
 * put right as it puts it: numbers clamped into the valid range (a valid cell never
 * decodes outside it, where CF readers would take it for missing), then each marker NaN
 * given back the original bits of the missing value it stands for. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

static int bad(tp_err *err, const char *what)
{
    return tp_fail(err, TP_E_FORMAT, "invalid stream header: %s", what);
}

static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double m = h & 0x3ff, v;
    if (e == 0x1f)
        v = m ? NAN : INFINITY;
    else
        v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

static uint16_t half_bits(double v) /* v a value of float16 (checked by representable) */
{
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    return tp_half_from_float_bits(b);
}

/* whether finite v is a value of the stream's float dtype; *bits: its bits there */
static int representable(const tp_header *h, double v, uint64_t *bits)
{
    if (h->dtype == TP_F8) {
        memcpy(bits, &v, 8);
        return 1;
    }
    if (fabs(v) > (h->dtype == TP_F4 ? FLT_MAX : 65504.0) || (double)(float)v != v)
        return 0;
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    *bits = b;
    if (h->dtype == TP_F4)
        return 1;
    *bits = half_bits(v);
    return half_value((uint16_t)*bits) == v;
}

/* an integer token's exact value: its digits those of the double it reads as (Python
 * compares int and float exactly); "-0" is the integer 0, so +0 */
static int exact_int(const tp_json *j, uint32_t t, double *v)
{
    const tp_jtok *k = &j->tok[t];
    const char *s = (const char *)j->text + k->start;
    size_t len = k->end - k->start;
    if (*v == 0) {
        *v = 0.0;
        return 1;
    }
    if (s[0] == '-')
        s++, len--;
    char buf[400];
    int n = snprintf(buf, sizeof buf, "%.0f", fabs(*v));
    return n > 0 && (size_t)n == len && memcmp(buf, s, len) == 0;
}

/* one end of "valid": null (*has = 0) or a finite number that is a value of the dtype */
static int valid_end(const tp_json *j, uint32_t t, tp_header *h, int *has, double *v,
                     uint64_t *bits, tp_err *err)
{
    *has = 0;
    if (j->tok[t].type == TP_J_NULL)
        return 0;
    if (j->tok[t].type != TP_J_NUMBER)
        return bad(err, "'valid' holds something that is not a number or null");
    *v = tp_json_number(j, t);
    if (!isfinite(*v) || (j->tok[t].is_int && !exact_int(j, t, v)))
        return bad(err, "'valid' holds a number that is not finite or not a float");
    if (!representable(h, *v, bits))
        return bad(err, "'valid' holds a number that is not a value of the stream's dtype");
    *has = 1;
    return 0;
}

static int valid(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    if (h->version < 3)
        return bad(err, "'valid' in a stream of format version 1 or 2");
    if (j->tok[t].type != TP_J_ARRAY || j->tok[t].count != 2)
        return bad(err, "'valid' is not a list [lo, hi]");
    uint32_t second = j->tok[t + 1].next;
    int rc = valid_end(j, t + 1, h, &h->has_lo, &h->lo, &h->lo_bits, err);
    if (rc || (rc = valid_end(j, second, h, &h->has_hi, &h->hi, &h->hi_bits, err)))
        return rc;
    if (!h->has_lo && !h->has_hi)
        return bad(err, "'valid' is [null, null]: it bounds nothing");
    if (h->has_lo && h->has_hi && h->lo > h->hi)
        return bad(err, "'valid' has lo > hi");
    return 0;
}

static int is_nan_bits(const tp_header *h, uint64_t b)
{
    if (h->itemsize == 2)
        return (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
    if (h->itemsize == 4)
        return (b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu);
    return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (b & 0xfffffffffffffull);
}

/* sorts the pairs by marker (insertion sort: at most 256) and refuses a marker twice */
static int sort_pairs(tp_header *h, tp_err *err)
{
    for (uint32_t i = 1; i < h->nmissing; i++) {
        uint64_t m = h->markers[i], o = h->originals[i];
        uint32_t k = i;
        for (; k > 0 && h->markers[k - 1] > m; k--) {
            h->markers[k] = h->markers[k - 1];
            h->originals[k] = h->originals[k - 1];
        }
        h->markers[k] = m, h->originals[k] = o;
    }
    for (uint32_t i = 1; i < h->nmissing; i++)
        if (h->markers[i] == h->markers[i - 1])
            return bad(err, "'missing' maps a marker twice");
    return 0;
}

static int missing(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    if (j->tok[t].type != TP_J_ARRAY || j->tok[t].count > TP_MAX_MARKERS)
        return bad(err, "'missing' is not a list of [marker, original] pairs");
    uint64_t top = h->itemsize == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * h->itemsize)) - 1;
    uint32_t p = t + 1;
    for (uint32_t i = 0; i < j->tok[t].count; i++, p = j->tok[p].next) {
        uint64_t m, o;
        if (j->tok[p].type != TP_J_ARRAY || j->tok[p].count != 2 ||
            !tp_json_hex(j, p + 1, &m) || !tp_json_hex(j, j->tok[p + 1].next, &o))
            return bad(err, "'missing' holds a pair that is not two lowercase hex strings");
        if (m > top || o > top)
            return bad(err, "'missing' holds bits wider than the stream's dtype");
        h->markers[i] = m, h->originals[i] = o;
    }
    h->nmissing = j->tok[t].count;
    int rc = sort_pairs(h, err);
    for (uint32_t i = 0; rc == 0 && i < h->nmissing; i++)
        if (!is_nan_bits(h, h->markers[i]))
            rc = bad(err, "'missing' holds a marker that is not a NaN");
    return rc;
}

int tp_missing_fields(const tp_json *j, tp_header *h, tp_err *err)
{
    uint32_t m = tp_json_get(j, 0, "missing"), v = tp_json_get(j, 0, "valid");
    h->nmissing = 0;
    h->has_lo = h->has_hi = 0;
    if (!m && !v)
        return 0;
    if (h->dtype != TP_F2 && h->dtype != TP_F4 && h->dtype != TP_F8)
        return bad(err, "'missing' or 'valid' in a stream of a dtype other than float16/32/64");
    int rc = v ? valid(j, v, h, err) : 0;
    return rc ? rc : m ? missing(j, m, h, err) : 0;
}

/* the original bits of marker b, or b when it maps none */
static uint64_t original(const tp_header *h, uint64_t b)
{
    uint32_t lo = 0, hi = h->nmissing;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (h->markers[mid] < b)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < h->nmissing && h->markers[lo] == b ? h->originals[lo] : b;
}

/* one value (its bits b, its value x): restored when a marker, else clamped */
#define PUT_RIGHT(b, x, set)                                                                 \
    do {                                                                                     \
        if (x != x)                                                                          \
            b = (set)original(h, b);                                                         \
        else if (h->has_lo && x < h->lo)                                                     \
            b = (set)h->lo_bits;                                                             \
        else if (h->has_hi && x > h->hi)                                                     \
            b = (set)h->hi_bits;                                                             \
    } while (0)

void tp_missing_apply(const tp_header *h, uint8_t *out, uint64_t n)
{
    if (!h->nmissing && !h->has_lo && !h->has_hi)
        return;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t *p = out + i * h->itemsize;
        if (h->itemsize == 2) {
            uint16_t b;
            memcpy(&b, p, 2);
            double x = half_value(b);
            PUT_RIGHT(b, x, uint16_t);
            memcpy(p, &b, 2);
        } else if (h->itemsize == 4) {
            uint32_t b;
            float x;
            memcpy(&b, p, 4);
            memcpy(&x, p, 4);
            PUT_RIGHT(b, x, uint32_t);
            memcpy(p, &b, 4);
        } else {
            uint64_t b;
            double x;
            memcpy(&b, p, 8);
            memcpy(&x, p, 8);
            PUT_RIGHT(b, x, uint64_t);
            memcpy(p, &b, 8);
        }
    }
}
