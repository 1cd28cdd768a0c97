/* The lossless `zstd` codec (SPEC.md "zstd"): one frame of the chunk's bytes, with
 * `shuffle` grouped by significance (all bytes 0, then all bytes 1, ...). */
#include <stdlib.h>
#include <string.h>

#include "tp_decode.h"

int tp_zstd_codec_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                         uint8_t *out, tp_err *err)
{
    size_t isz = h->itemsize, want = (size_t)n * isz;
    uint8_t *raw;
    size_t got;
    int rc = tp_zstd_decompress(p, len, want, &raw, &got, err);
    if (rc)
        return rc;
    if (got != want) {
        free(raw);
        return tp_fail(err, TP_E_FORMAT, "zstd payload holds %zu bytes, its chunk %zu", got,
                       want);
    }
    if (!h->shuffle || isz == 1) {
        memcpy(out, raw, want);
    } else {
        for (size_t b = 0; b < isz; b++) {
            const uint8_t *plane = raw + b * (size_t)n;
            for (size_t e = 0; e < (size_t)n; e++)
                out[e * isz + b] = plane[e];
        }
    }
    free(raw);
    return 0;
}
