/* The container around `block` and `quant` payloads (SPEC.md "Layout", version 2), as
 * formats/stream_writer.py writes it for one HDF5 chunk: the JSON header as json.dumps
 * spells it, chunks of whole rows of about 1 MiB (the codec's default_chunk_bytes), each
 * chunk's CRC-32 with its position. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "tp_encode.h"

#ifndef TP_VERSION
#error "build.py defines TP_VERSION, tensorpress's version, which every header names"
#endif

enum { CHUNK_BYTES = 1 << 20, PREAMBLE = 16 };
static const uint8_t MAGIC[8] = {0x89, 'T', 'P', 'R', 'E', 'S', 'S', '\n'};

void tp_repr_double(double v, char *buf)
{
    char tmp[40], digits[20];
    for (int p = 1; p <= 17; p++) { /* the shortest that reads back is the closest too */
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    const char *s = tmp;
    char *o = buf;
    if (*s == '-')
        *o++ = *s++;
    int nd = 0;
    for (; *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = atoi(s + 1) + 1; /* value = 0.DIGITS * 10**decpt */
    if (decpt <= -4 || decpt > 16) { /* float_repr_style "short": 1e-05, 1.5e+16 */
        *o++ = digits[0];
        if (nd > 1)
            *o++ = '.', memcpy(o, digits + 1, (size_t)nd - 1), o += nd - 1;
        sprintf(o, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        return;
    }
    if (decpt <= 0) {
        *o++ = '0', *o++ = '.';
        for (int i = 0; i < -decpt; i++)
            *o++ = '0';
        memcpy(o, digits, (size_t)nd), o += nd;
    } else if (decpt >= nd) {
        memcpy(o, digits, (size_t)nd), o += nd;
        for (int i = nd; i < decpt; i++)
            *o++ = '0';
        *o++ = '.', *o++ = '0';
    } else {
        memcpy(o, digits, (size_t)decpt), o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, (size_t)(nd - decpt)), o += nd - decpt;
    }
    *o = 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)v), put_u32(p + 4, (uint32_t)(v >> 32));
}

/* the codec config and bound of the header, as json.dumps writes them */
static int codec_json(const tp_cd *cd, const tp_header *q, char *text, size_t cap)
{
    if (cd->codec == TP_QUANT)
        return snprintf(text, cap, "\"codec\":{\"id\":\"quant\",\"bits\":%d,\"group\":%d,"
                        "\"stochastic\":%s,\"seed\":%u,\"hadamard\":%s},\"bound\":null",
                        q->q_bits, q->q_group, q->q_stochastic ? "true" : "false", q->q_seed,
                        q->q_hadamard ? "true" : "false");
    char value[40];
    tp_repr_double(cd->bound, value);
    const char *mode = cd->bound_mode == TP_BOUND_PW_REL ? "pw_rel" : "abs";
    return snprintf(text, cap, "\"codec\":{\"id\":\"block\"},\"bound\":{\"mode\":\"%s\","
                    "\"value\":%s,\"tolerance\":%s}", mode, value, value);
}

/* the JSON header of a chunk of cd's layout cut every rows rows; returns its length */
static int header_json(const tp_cd *cd, const tp_header *q, uint64_t rows, char *text,
                       size_t cap)
{
    int n = snprintf(text, cap, "{\"dtype\":\"<f%zu\",\"shape\":[", cd->itemsize);
    for (int i = 0; i < cd->rank; i++)
        n += snprintf(text + n, cap - (size_t)n, "%s%llu", i ? "," : "",
                      (unsigned long long)cd->chunks[i]);
    n += snprintf(text + n, cap - (size_t)n, "],\"order\":\"C\",");
    n += codec_json(cd, q, text + n, cap - (size_t)n);
    n += snprintf(text + n, cap - (size_t)n, ",\"chunk_rows\":%llu,\"writer\":"
                  "\"tensorpress %s\"}", (unsigned long long)rows, TP_VERSION);
    return n;
}

static int refuse_cd(const tp_cd *cd, tp_err *err)
{
    if (cd->codec == TP_QUANT)
        return cd->bound_mode == TP_BOUND_NONE ? 0 : tp_fail(err, TP_E_FORMAT, "quant takes "
                                                             "no error bound: cd_values[2] = 0");
    if (cd->codec != TP_BLOCK)
        return tp_fail(err, TP_E_UNSUPPORTED, "the compiled plugin writes only the block "
                       "codec and quant: write sz, int8 and zstd datasets from Python with "
                       "tensorpress imported (tp.hdf5.filter, tensorpress compress --layout "
                       "filter)");
    if (cd->bound_mode == TP_BOUND_NONE || !(isfinite(cd->bound) && cd->bound >= 0))
        return tp_fail(err, TP_E_FORMAT, "block needs an abs or pw_rel bound, a finite "
                       "number >= 0, in cd_values[2:5]");
    return 0;
}

/* the chunk's values as little-endian bytes and as exact doubles */
static void values(const tp_cd *cd, const uint8_t *buf, uint64_t n, uint8_t *raw, double *x)
{
    size_t isz = cd->itemsize;
    for (uint64_t i = 0; i < n; i++) {
        for (size_t k = 0; k < isz; k++)
            raw[i * isz + k] = buf[i * isz + (cd->big_endian ? isz - 1 - k : k)];
        const uint8_t *r = raw + i * isz;
        if (isz == 8) {
            memcpy(&x[i], r, 8);
        } else if (isz == 4) {
            float f;
            memcpy(&f, r, 4);
            x[i] = f;
        } else {
            x[i] = tp_half_to_double((uint16_t)(r[0] | r[1] << 8));
        }
    }
}

/* every chunk's payload, one after the other in pay; len[i] their lengths. q: quant's
 * parameters (QuantCodec's defaults), data: the codec's scratch */
static size_t payloads(const tp_cd *cd, const tp_header *q, const uint8_t *raw,
                       const double *x, uint64_t n, uint64_t row, uint64_t rows,
                       uint64_t nchunks, uint8_t *pay, uint8_t *data, uint64_t *len)
{
    size_t at = 0, isz = cd->itemsize;
    for (uint64_t i = 0; i < nchunks; i++) {
        uint64_t a = i * rows * row, m = rows * row < n - a ? rows * row : n - a;
        if (cd->codec == TP_QUANT) /* the noise's key: the chunk's first element */
            len[i] = tp_quant_encode(q, x + a, raw + a * isz, m, a, pay + at, (double *)data);
        else
            len[i] = tp_block_encode(x + a, raw + a * isz, m, isz,
                                     cd->bound_mode == TP_BOUND_PW_REL, cd->bound, pay + at,
                                     data);
        at += len[i];
    }
    return at;
}

static uint8_t *assemble(const char *json, int hlen, const uint8_t *pay, const uint64_t *len,
                         uint64_t nchunks, size_t paid, void *(*alloc)(size_t), size_t *total)
{
    size_t index = 8 + 12 * (size_t)nchunks + 4, pre = PREAMBLE + (size_t)hlen + 4;
    *total = pre + index + paid;
    uint8_t *s = alloc(*total), *p;
    if (!s)
        return NULL;
    memcpy(s, MAGIC, 8);
    s[8] = 2, s[9] = 0, s[10] = 0, s[11] = 0; /* format version 2, no flags */
    put_u32(s + 12, (uint32_t)hlen);
    memcpy(s + PREAMBLE, json, (size_t)hlen);
    put_u32(s + pre - 4, tp_crc32(0, s, pre - 4));
    p = s + pre;
    put_u64(p, nchunks);
    for (uint64_t i = 0, off = 0; i < nchunks; off += len[i++]) {
        uint8_t where[8];
        put_u64(where, i);
        put_u64(p + 8 + 12 * i, len[i]);
        put_u32(p + 16 + 12 * i, tp_crc32(tp_crc32(0, pay + off, len[i]), where, 8));
    }
    put_u32(p + index - 4, tp_crc32(0, p, index - 4));
    memcpy(p + index, pay, paid);
    return s;
}

int tp_filter_encode(const unsigned *cdv, size_t ncd, const uint8_t *buf, size_t size,
                     void *(*alloc)(size_t), void (*release)(void *), uint8_t **out,
                     size_t *out_len, tp_err *err)
{
    (void)release;
    tp_cd cd;
    int rc = tp_parse_cd_values(cdv, ncd, &cd, err);
    if (rc || (rc = refuse_cd(&cd, err)))
        return rc;
    uint64_t row = 1, n;
    for (int i = 1; i < cd.rank; i++)
        row *= cd.chunks[i];
    n = row * cd.chunks[0];
    if (size != n * cd.itemsize)
        return tp_fail(err, TP_E_FORMAT, "the chunk holds %zu bytes, cd_values say %llu",
                       size, (unsigned long long)(n * cd.itemsize));
    uint64_t rows = CHUNK_BYTES / (row * cd.itemsize); /* codec.chunk_rows_for */
    rows = rows < 1 ? 1 : rows > cd.chunks[0] ? cd.chunks[0] : rows;
    uint64_t nchunks = (cd.chunks[0] + rows - 1) / rows;
    tp_header q = {.itemsize = cd.itemsize, .q_bits = 4, .q_group = 128};
    /* a quant chunk of m values takes at most m * itemsize + 26 bytes while it is written
     * (the raw form, or 9 + 2 * ceil(m / 16) * 8 + ceil(m / 2) with 16-bit values) */
    size_t cap = cd.codec == TP_QUANT ? (size_t)n * cd.itemsize + 32 * (size_t)nchunks
                                      : tp_block_capacity(n, cd.itemsize) + 13 * (size_t)nchunks;
    size_t scratch = (size_t)(rows * row) * cd.itemsize + 8, qs = 4 * sizeof(double) * 128;
    uint8_t *raw = malloc((size_t)n * cd.itemsize), *pay = malloc(cap);
    uint8_t *data = malloc(scratch > qs ? scratch : qs);
    double *x = malloc((size_t)n * sizeof *x);
    uint64_t *len = malloc((size_t)nchunks * sizeof *len);
    char json[2048];
    if (!raw || !pay || !data || !x || !len) {
        rc = tp_fail(err, TP_E_MEMORY, "out of memory for a chunk of %zu bytes", size);
    } else {
        values(&cd, buf, n, raw, x);
        size_t paid = payloads(&cd, &q, raw, x, n, row, rows, nchunks, pay, data, len);
        int hlen = header_json(&cd, &q, rows, json, sizeof json);
        *out = assemble(json, hlen, pay, len, nchunks, paid, alloc, out_len);
        if (!*out)
            rc = tp_fail(err, TP_E_MEMORY, "out of memory for a stream of %zu bytes", *out_len);
    }
    free(raw), free(pay), free(data), free(x), free(len);
    return rc;
}
