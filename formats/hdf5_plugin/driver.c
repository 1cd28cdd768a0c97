/* A command line over the decoder, for tests (built with sanitizers): decodes a stream
 * file, whole or as one HDF5 filter chunk, and writes the raw values.
 *
 *   tp_decode IN.tp OUT.raw              every chunk, C order, little-endian
 *   tp_decode IN.tp OUT.raw CD0,CD1,...  as the filter with these cd_values
 *   tp_decode -e IN.raw OUT.tp CD0,...   encode one chunk as the filter writes it
 *   tp_decode -q IN.raw OUT.bin BITS,GROUP,STOCHASTIC,SEED,HADAMARD,ITEMSIZE,OFFSET
 *                                        one quant payload of these little-endian values
 *
 * Exit status 0 with OUT written; 1 and one line on stderr when the stream is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "tp_encode.h"

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) {
            uint8_t *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    *n = len;
    return buf;
}

static int whole(const uint8_t *buf, size_t n, uint8_t **out, size_t *len, tp_err *err)
{
    tp_header h;
    int rc = tp_parse_stream(buf, n, &h, err);
    if (rc)
        return rc;
    uint64_t count = tp_elements(&h);
    if (count > SIZE_MAX / 16)
        return tp_fail(err, TP_E_MEMORY, "the array does not fit in memory");
    *len = (size_t)count * h.itemsize;
    *out = malloc(*len ? *len : 1);
    if (!*out)
        return tp_fail(err, TP_E_MEMORY, "out of memory");
    return tp_decode_stream(buf, &h, *out, err);
}

static int as_filter(const char *list, const uint8_t *buf, size_t n, uint8_t **out,
                     size_t *len, int encode, tp_err *err)
{
    unsigned cd[64];
    size_t ncd = 0;
    for (const char *s = list; *s && ncd < 64; ncd++) {
        char *end;
        cd[ncd] = (unsigned)strtoul(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
    }
    if (encode)
        return tp_filter_encode(cd, ncd, buf, n, malloc, free, out, len, err);
    return tp_filter_decode(cd, ncd, buf, n, malloc, free, out, len, err);
}

/* quant's encoder under any parameters (the filter writes its defaults only) */
static int quant_payload(const char *list, const uint8_t *buf, size_t n, uint8_t **out,
                         size_t *len, tp_err *err)
{
    unsigned long long v[7] = {0};
    tp_header h = {0};
    if (sscanf(list, "%llu,%llu,%llu,%llu,%llu,%llu,%llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6]) != 7 || (v[0] != 2 && v[0] != 4 && v[0] != 8) || v[1] < 16 ||
        v[1] > 4096 || (v[1] & (v[1] - 1)) || (v[5] != 2 && v[5] != 4 && v[5] != 8) ||
        n % v[5])
        return tp_fail(err, TP_E_FORMAT, "bad quant parameters or input length");
    h.q_bits = (int)v[0], h.q_group = (int)v[1], h.q_stochastic = v[2] != 0;
    h.q_seed = (uint32_t)v[3], h.q_hadamard = v[4] != 0, h.itemsize = (size_t)v[5];
    size_t count = n / h.itemsize, cap = n + 32;
    double *x = malloc((count ? count : 1) * sizeof *x), *scratch = malloc(32 * 4096);
    *out = malloc(cap + tp_quant_payload_size(count, h.q_bits, h.q_group, 1, 8));
    if (!x || !scratch || !*out) {
        free(x), free(scratch);
        return tp_fail(err, TP_E_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        const uint8_t *r = buf + i * h.itemsize;
        float f;
        if (h.itemsize == 8)
            memcpy(&x[i], r, 8);
        else if (h.itemsize == 4)
            memcpy(&f, r, 4), x[i] = f;
        else
            x[i] = tp_half_to_double((uint16_t)(r[0] | r[1] << 8));
    }
    *len = tp_quant_encode(&h, x, buf, count, v[6], *out, scratch);
    free(x), free(scratch);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "-q") == 0) {
        size_t n = 0, len = 0;
        uint8_t *buf = slurp(argv[2], &n), *out = NULL;
        tp_err err = {0, ""};
        if (!buf) {
            fprintf(stderr, "cannot read %s\n", argv[2]);
            return 2;
        }
        int rc = quant_payload(argv[4], buf, n, &out, &len, &err);
        FILE *f = rc ? NULL : fopen(argv[3], "wb");
        int ok = f && fwrite(out, 1, len, f) == len;
        ok = f && fclose(f) == 0 && ok;
        if (rc)
            fprintf(stderr, "refused (%d): %s\n", err.code, err.msg);
        free(buf), free(out);
        return ok ? 0 : rc ? 1 : 2;
    }
    int encode = argc == 5 && strcmp(argv[1], "-e") == 0;
    argv += encode, argc -= encode;
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s [-e] IN OUT [CD_VALUES]\n", argv[0]);
        return 2;
    }
    size_t n = 0, len = 0;
    uint8_t *buf = slurp(argv[1], &n), *out = NULL;
    if (!buf) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    tp_err err = {0, ""};
    int rc = argc == 4 ? as_filter(argv[3], buf, n, &out, &len, encode, &err)
                       : whole(buf, n, &out, &len, &err);
    free(buf);
    if (rc) {
        free(out);
        fprintf(stderr, "refused (%d): %s\n", err.code, err.msg);
        return 1;
    }
    FILE *f = fopen(argv[2], "wb");
    int ok = f && fwrite(out, 1, len, f) == len;
    ok = f && fclose(f) == 0 && ok;
    free(out);
    return ok ? 0 : 2;
}
