/* A command line over the decoder, for tests (built with sanitizers): decodes a stream
 * file, whole or as one HDF5 filter chunk, and writes the raw values.
 *
 *   tp_decode IN.tp OUT.raw              every chunk, C order, little-endian
 *   tp_decode IN.tp OUT.raw CD0,CD1,...  as the filter with these cd_values
 *   tp_decode -e IN.raw OUT.tp CD0,...   encode one chunk as the filter writes it
 *
 * Exit status 0 with OUT written; 1 and one line on stderr when the stream is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
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
