/* The filter's cd_values and what a chunk's stream must hold to be decoded for them
 * (SPEC.md "The HDF5 filter" and "What a crafted file can do to a reader"; in Python
 * formats/hdf5_filter.py: parse_cd_values, chunk_values, check_stream, decode_chunk). */
#include <string.h>

#include "tp_decode.h"

static const int CODECS[] = {-1, TP_SZ, TP_BLOCK, TP_INT8, TP_ZSTD, TP_QUANT}; /* cd[1] */

/* the element size, byte order and chunk shape set_local appends */
static int chunk_layout(const unsigned *cd, size_t n, tp_cd *out, tp_err *err)
{
    size_t rank_at = cd[0] >= 2 ? 7 : 6; /* layout 1: little-endian, no byte order */
    if (n <= rank_at)
        return tp_fail(err, TP_E_FORMAT, "cd_values end before the chunk rank");
    out->itemsize = cd[5];
    out->big_endian = cd[0] >= 2 ? (int)cd[6] : 0;
    out->rank = (int)cd[rank_at];
    if (cd[5] != 2 && cd[5] != 4 && cd[5] != 8)
        return tp_fail(err, TP_E_FORMAT, "cd_values give element size %u, not 2, 4 or 8", cd[5]);
    if (cd[0] >= 2 && cd[6] > 1)
        return tp_fail(err, TP_E_FORMAT, "cd_values give byte order %u, not 0 or 1", cd[6]);
    if (cd[rank_at] < 1 || cd[rank_at] > 32 || n - rank_at - 1 != cd[rank_at])
        return tp_fail(err, TP_E_FORMAT, "cd_values do not end with a chunk shape of rank %u",
                       cd[rank_at]);
    uint64_t bytes = out->itemsize;
    for (int i = 0; i < out->rank; i++) {
        out->chunks[i] = cd[rank_at + 1 + i];
        if (out->chunks[i] == 0)
            return tp_fail(err, TP_E_FORMAT, "cd_values give a chunk dimension of 0");
        bytes *= out->chunks[i];
        if (bytes > 0xFFFFFFFFu) /* HDF5's limit: a larger chunk in cd_values is a lie */
            return tp_fail(err, TP_E_FORMAT, "cd_values give a chunk larger than HDF5 allows");
    }
    return 0;
}

int tp_parse_cd_values(const unsigned *cd, size_t n, tp_cd *out, tp_err *err)
{
    memset(out, 0, sizeof *out);
    if (n < 5 || (cd[0] != 1 && cd[0] != 2))
        return tp_fail(err, TP_E_VERSION, "cd_values are not a tensorpress filter layout this "
                       "plugin reads (1, 2): upgrade tensorpress, or the file is damaged");
    if (cd[1] < 1 || cd[1] > 5 || cd[2] > 2)
        return tp_fail(err, TP_E_FORMAT, "unknown codec %u or bound mode %u in cd_values",
                       cd[1], cd[2]);
    out->codec = CODECS[cd[1]];
    out->bound_mode = cd[2] == 0 ? TP_BOUND_NONE : cd[2] == 1 ? TP_BOUND_ABS : TP_BOUND_PW_REL;
    uint64_t word = (uint64_t)cd[4] << 32 | cd[3];
    memcpy(&out->bound, &word, 8);
    if (n == 5) /* without the layout nothing sizes the output */
        return tp_fail(err, TP_E_FORMAT, "cd_values lack the element size and chunk shape "
                       "that the tensorpress filter records");
    return chunk_layout(cd, n, out, err);
}

/* the stream holds exactly a chunk of cd_values, with their codec and a bound no
 * looser, or losslessly: checked from its header, before anything is decoded */
static int check_stream(const tp_header *h, const tp_cd *cd, tp_err *err)
{
    int want = cd->itemsize == 2 ? TP_F2 : cd->itemsize == 4 ? TP_F4 : TP_F8;
    int same = h->dtype == want && h->rank == cd->rank;
    for (int i = 0; same && i < h->rank; i++)
        same = h->shape[i] == cd->chunks[i];
    if (!same)
        return tp_fail(err, TP_E_FORMAT, "the chunk's stream does not hold the dataset's "
                       "chunk (its dtype or shape differ): refused before decoding");
    if (h->codec == TP_ZSTD && h->bound_mode == TP_BOUND_NONE)
        return 0; /* exact values meet any bound */
    if (h->codec != cd->codec)
        return tp_fail(err, TP_E_FORMAT, "the chunk's stream uses another codec than the "
                       "dataset's");
    int kind = h->bound_mode == TP_BOUND_NONE     ? TP_BOUND_NONE
               : h->bound_mode == TP_BOUND_PW_REL ? TP_BOUND_PW_REL : TP_BOUND_ABS;
    if (kind != cd->bound_mode || (kind != TP_BOUND_NONE && !(h->tolerance <= cd->bound)))
        return tp_fail(err, TP_E_FORMAT, "the chunk's stream has a bound looser than the "
                       "dataset's");
    return 0;
}

static void swap_bytes(uint8_t *p, size_t count, size_t isz)
{
    for (size_t i = 0; i < count; i++, p += isz)
        for (size_t a = 0, b = isz - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

int tp_filter_decode(const unsigned *cdv, size_t ncd, const uint8_t *buf, size_t size,
                     void *(*alloc)(size_t), void (*release)(void *), uint8_t **out,
                     size_t *out_len, tp_err *err)
{
    tp_cd cd;
    tp_header h;
    int rc = tp_parse_cd_values(cdv, ncd, &cd, err);
    if (rc == TP_OK)
        rc = tp_parse_stream(buf, size, &h, err);
    if (rc == TP_OK)
        rc = check_stream(&h, &cd, err);
    if (rc)
        return rc;
    size_t count = (size_t)tp_elements(&h), bytes = count * h.itemsize;
    *out = alloc(bytes ? bytes : 1);
    if (!*out)
        return tp_fail(err, TP_E_MEMORY, "out of memory for a chunk of %zu bytes", bytes);
    rc = tp_decode_stream(buf, &h, *out, err);
    if (rc) {
        release(*out);
        *out = NULL;
        return rc;
    }
    if (cd.big_endian)
        swap_bytes(*out, count, h.itemsize);
    *out_len = bytes;
    return 0;
}
