/* The container (SPEC.md "Layout" and "What a decoder validates"): preamble, header,
 * chunk index and per-chunk checks, then each chunk's stages and codec. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tp_decode.h"

static const uint8_t MAGIC[8] = {0x89, 'T', 'P', 'R', 'E', 'S', 'S', '\n'};

int tp_fail(tp_err *err, int code, const char *fmt, ...)
{
    if (err && err->code == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

static uint32_t u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t u64le(const uint8_t *p)
{
    return (uint64_t)u32le(p) | (uint64_t)u32le(p + 4) << 32;
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

uint64_t tp_elements(const tp_header *h)
{
    uint64_t n = 1;
    for (int i = 0; i < h->rank; i++)
        n = h->shape[i] == 0 ? 0 : mul_sat(n, h->shape[i]);
    return n;
}

/* elements of one row (the dimensions after the first) */
static uint64_t row_elements(const tp_header *h)
{
    uint64_t n = 1;
    for (int i = 1; i < h->rank; i++)
        n = h->shape[i] == 0 ? 0 : mul_sat(n, h->shape[i]);
    return n;
}

uint64_t tp_chunk_bytes(const tp_header *h)
{
    if (h->rank == 0)
        return h->itemsize;
    uint64_t rows = h->chunk_rows < h->shape[0] ? h->chunk_rows : h->shape[0];
    return mul_sat(mul_sat(rows, row_elements(h)), h->itemsize);
}

static uint64_t expected_chunks(const tp_header *h)
{
    if (tp_elements(h) == 0)
        return 0;
    return h->rank == 0 ? 1 : h->shape[0] / h->chunk_rows + (h->shape[0] % h->chunk_rows != 0);
}

static int fits_in_memory(uint64_t bytes, tp_err *err)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0 && bytes > mul_sat((uint64_t)pages, (uint64_t)page))
        return tp_fail(err, TP_E_MEMORY, "one chunk of the stream needs %llu bytes, more than "
                       "this machine's memory", (unsigned long long)bytes);
    return 0;
}

/* the codec holds the dtype, with a bound exactly when it is error-bounded, of a mode it
 * takes (formats/stream_reader.py, stream_codec) */
static int codec_holds(const tp_header *h, tp_err *err)
{
    int d = h->dtype, is_float = d == TP_F2 || d == TP_F4 || d == TP_F8;
    int holds = h->codec == TP_ZSTD    ? d != TP_BF16
                : h->codec == TP_BLOCK || h->codec == TP_QUANT
                    ? is_float || (d == TP_BF16 && h->stages == 0)
                : h->codec == TP_SZ ? is_float
                                    : d == TP_F4 || d == TP_F8;
    if (!holds)
        return tp_fail(err, TP_E_FORMAT, "the stream's codec does not hold its dtype");
    int bounded = h->codec != TP_ZSTD && h->codec != TP_QUANT; /* quant: bits-bounded */
    if (bounded != (h->bound_mode != TP_BOUND_NONE))
        return tp_fail(err, TP_E_FORMAT, "the stream's bound does not fit its codec");
    if (h->codec == TP_INT8 && h->bound_mode == TP_BOUND_PW_REL)
        return tp_fail(err, TP_E_FORMAT, "codec 'int8' takes no pw_rel bound");
    if (d == TP_BF16) /* written by the torch paths; never inside an HDF5 chunk */
        return tp_fail(err, TP_E_UNSUPPORTED, "bfloat16 streams are not decoded by this plugin");
    return 0;
}

/* checks 3 and 5: the index's CRC, count and the stream's exact length */
static int parse_index(const uint8_t *buf, size_t size, size_t pos, tp_header *h,
                       tp_err *err)
{
    uint64_t n = u64le(buf + pos);
    if (n > (size - pos - 8) / 12 || size - pos - 8 - 12 * n < 4)
        return tp_fail(err, TP_E_TRUNCATED, "stream is truncated inside its chunk index");
    size_t end = pos + 8 + 12 * (size_t)n;
    if (u32le(buf + end) != tp_crc32(0, buf + pos, end - pos))
        return tp_fail(err, TP_E_CHECKSUM, "chunk index checksum mismatch");
    if (n != expected_chunks(h))
        return tp_fail(err, TP_E_FORMAT, "chunk index lists %llu chunks, the shape needs %llu",
                       (unsigned long long)n, (unsigned long long)expected_chunks(h));
    h->nchunks = n;
    h->index = buf + pos + 8;
    h->payload_offset = end + 4;
    uint64_t total = h->payload_offset;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = u64le(h->index + 12 * i);
        if (len > size - total)
            return tp_fail(err, TP_E_TRUNCATED, "stream is truncated: its index needs more");
        total += len;
    }
    h->total = total;
    return 0;
}

int tp_parse_stream(const uint8_t *buf, size_t size, tp_header *h, tp_err *err)
{
    memset(h, 0, sizeof *h);
    if (size < 16 || memcmp(buf, MAGIC, 8) != 0) {
        if (size < 8 && memcmp(buf, MAGIC, size) == 0)
            return tp_fail(err, TP_E_TRUNCATED, "stream is truncated inside its preamble");
        return tp_fail(err, TP_E_FORMAT, "not a tensorpress stream (bad magic number)");
    }
    h->version = buf[8] | buf[9] << 8;
    if (h->version > 3)
        return tp_fail(err, TP_E_VERSION, "stream is format version %d; this plugin reads up "
                       "to version 3: upgrade tensorpress", h->version);
    if (h->version < 1)
        return tp_fail(err, TP_E_FORMAT, "invalid format version %d", h->version);
    size_t end = 16 + (size_t)u32le(buf + 12);
    if (size < end || size - end < 12)
        return tp_fail(err, TP_E_TRUNCATED, "stream is truncated inside its header");
    if (u32le(buf + end) != tp_crc32(0, buf, end))
        return tp_fail(err, TP_E_CHECKSUM, "header checksum mismatch");
    if (buf[10] | buf[11])
        return tp_fail(err, TP_E_FORMAT, "unknown header flags");
    int rc = tp_header_fields(buf + 16, end - 16, h, err);
    if (rc == TP_OK)
        rc = fits_in_memory(tp_chunk_bytes(h), err);
    if (rc == TP_OK)
        rc = parse_index(buf, size, end + 4, h, err);
    if (rc == TP_OK)
        rc = codec_holds(h, err);
    if (rc == TP_OK && size > h->total)
        rc = tp_fail(err, TP_E_FORMAT, "%llu trailing bytes after the stream",
                     (unsigned long long)(size - h->total));
    return rc;
}

/* undo the zstd stages: *p becomes a malloc'd payload (or stays when there are none) */
static int unstage(const tp_header *h, uint64_t n, const uint8_t **p, size_t *len,
                   uint8_t **owned, tp_err *err)
{
    uint64_t limit = mul_sat(mul_sat(2, n), h->itemsize);
    limit = limit > UINT64_MAX - 4096 ? UINT64_MAX : limit + 4096;
    for (int s = 0; s < h->stages; s++) {
        uint8_t *next;
        size_t next_len;
        int rc = tp_zstd_decompress(*p, *len, limit > SIZE_MAX ? SIZE_MAX : (size_t)limit,
                                    &next, &next_len, err);
        free(*owned);
        *owned = NULL;
        if (rc)
            return rc;
        *owned = next;
        *p = next;
        *len = next_len;
    }
    return 0;
}

/* sz: the chunk's shape, its rows those of n elements (n > 0: a chunk holds some) */
static int sz_chunk(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                    uint8_t *out, tp_err *err)
{
    uint64_t shape[TP_MAX_RANK];
    for (int i = 0; i < h->rank; i++)
        shape[i] = h->shape[i];
    if (h->rank > 0)
        shape[0] = n / row_elements(h);
    return tp_sz_decode(h, p, len, n, shape, h->rank, out, err);
}

static int decode_chunk(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                        uint8_t *out, tp_err *err)
{
    uint8_t *owned = NULL;
    int rc = unstage(h, n, &p, &len, &owned, err);
    if (rc == TP_OK) {
        if (h->codec == TP_ZSTD)
            rc = tp_zstd_codec_decode(h, p, len, n, out, err);
        else if (h->codec == TP_BLOCK)
            rc = tp_block_decode(h, p, len, n, out, err);
        else if (h->codec == TP_QUANT)
            rc = tp_quant_decode(h, p, len, n, out, err);
        else if (h->codec == TP_SZ)
            rc = sz_chunk(h, p, len, n, out, err);
        else
            rc = tp_int8_decode(h, p, len, n, out, err);
    }
    free(owned);
    return rc;
}

int tp_decode_stream(const uint8_t *buf, const tp_header *h, uint8_t *out, tp_err *err)
{
    uint64_t offset = h->payload_offset, row = row_elements(h), done = 0;
    for (uint64_t i = 0; i < h->nchunks; i++) {
        const uint8_t *entry = h->index + 12 * i;
        uint64_t len = u64le(entry);
        const uint8_t *p = buf + offset;
        uint32_t crc = tp_crc32(0, p, len);
        if (h->version >= 2) { /* the chunk's position follows its payload in its CRC */
            uint8_t pos[8];
            for (int k = 0; k < 8; k++)
                pos[k] = (uint8_t)(i >> (8 * k));
            crc = tp_crc32(crc, pos, 8);
        }
        if (crc != u32le(entry + 8))
            return tp_fail(err, TP_E_CHECKSUM, "chunk %llu checksum mismatch",
                           (unsigned long long)i);
        uint64_t n = 1;
        if (h->rank > 0) {
            uint64_t start = i * h->chunk_rows, left = h->shape[0] - start;
            n = (left < h->chunk_rows ? left : h->chunk_rows) * row;
        }
        int rc = decode_chunk(h, p, (size_t)len, n, out + done * h->itemsize, err);
        if (rc)
            return rc;
        tp_missing_apply(h, out + done * h->itemsize, n);
        done += n;
        offset += len;
    }
    return 0;
}
