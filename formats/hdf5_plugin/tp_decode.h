/* tensorpress stream decoder in C: the container of formats/SPEC.md and the codecs
 * the compiled HDF5 plugin decodes. No libhdf5, no Python: plugin.c adapts it to
 * HDF5's filter interface, driver.c to a command line (tests). */
#ifndef TP_DECODE_H
#define TP_DECODE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the decoder writes values in the host's byte order: little-endian hosts only"
#endif

/* results: 0 or one of these (negative) */
enum {
    TP_OK = 0,
    TP_E_FORMAT = -1,      /* malformed, inconsistent or out-of-range fields */
    TP_E_TRUNCATED = -2,   /* the bytes end early */
    TP_E_CHECKSUM = -3,    /* a CRC-32 does not match */
    TP_E_VERSION = -4,     /* a format version newer than this decoder */
    TP_E_UNKNOWN = -5,     /* a codec no tensorpress registers */
    TP_E_UNSUPPORTED = -6, /* a valid stream this plugin does not decode yet */
    TP_E_MEMORY = -7,      /* allocation failed, or the chunk exceeds this machine */
};

typedef struct tp_err {
    int code;
    char msg[240];
} tp_err;

/* set err (first error wins) and return its code */
int tp_fail(tp_err *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

enum tp_dtype { TP_B1, TP_I1, TP_I2, TP_I4, TP_I8, TP_U1, TP_U2, TP_U4, TP_U8,
                TP_F2, TP_F4, TP_F8, TP_BF16 };
enum tp_codec_id { TP_ZSTD, TP_BLOCK, TP_INT8, TP_SZ, TP_QUANT };
enum tp_bound_mode { TP_BOUND_NONE, TP_BOUND_ABS, TP_BOUND_REL, TP_BOUND_PW_REL };

#define TP_MAX_RANK 64   /* streams of more dimensions are refused here */
#define TP_MAX_STAGES 16 /* likewise codec configs with more stages */
#define TP_MAX_MARKERS 256 /* missing values a header maps, at most (SPEC.md) */

typedef struct tp_header {
    int version;           /* format version, 1 to 3 */
    int dtype;             /* enum tp_dtype */
    size_t itemsize;       /* bytes a value */
    int rank;
    uint64_t shape[TP_MAX_RANK];
    uint64_t chunk_rows;
    int codec;             /* enum tp_codec_id */
    int shuffle;           /* zstd codec: bytes grouped by significance */
    int stages;            /* zstd stages after the codec */
    int bound_mode;        /* enum tp_bound_mode */
    int q_bits, q_group;   /* quant: bits a code (2, 4, 8), values a group (16..4096) */
    int q_stochastic, q_hadamard;
    uint32_t q_seed;       /* quant: the noise's and the signs' seed, below 2**31 */
    int b_stochastic;      /* block: stochastic rounding, codes on tol / 2's step */
    double bound_value, tolerance;
    /* the header's missing and valid (SPEC.md; missing.c): decoded numbers clamped into
     * [lo, hi] (a side only when has_lo / has_hi), then each marker NaN (ascending)
     * given back its original bits */
    int has_lo, has_hi;
    double lo, hi;
    uint64_t lo_bits, hi_bits; /* lo and hi as values of the dtype */
    uint32_t nmissing;
    uint64_t markers[TP_MAX_MARKERS], originals[TP_MAX_MARKERS];
    uint64_t nchunks;
    const uint8_t *index;  /* the chunk index entries: u64 length, u32 CRC each */
    uint64_t payload_offset, total; /* first payload, stream length (bytes) */
} tp_header;

/* CRC-32 (zlib's polynomial) of n bytes continuing crc (0 to start) */
uint32_t tp_crc32(uint32_t crc, const uint8_t *p, size_t n);

/* checks 1-6 of SPEC.md "What a decoder validates" on the whole stream buf[0:size] */
int tp_parse_stream(const uint8_t *buf, size_t size, tp_header *h, tp_err *err);
/* from the JSON header text: the fields, each checked (header.c) */
int tp_header_fields(const uint8_t *text, size_t n, tp_header *h, tp_err *err);
/* elements of the whole array; bytes of its largest chunk (saturating) */
uint64_t tp_elements(const tp_header *h);
uint64_t tp_chunk_bytes(const tp_header *h);
/* decode every chunk of a parsed stream into out (tp_elements * itemsize bytes, C order,
 * little-endian values) */
int tp_decode_stream(const uint8_t *buf, const tp_header *h, uint8_t *out, tp_err *err);

/* a decoded chunk's n values at out: clamped into the valid range, markers restored */
void tp_missing_apply(const tp_header *h, uint8_t *out, uint64_t n);

/* codecs: one chunk payload (stages undone) of n values into out (n * itemsize bytes) */
int tp_zstd_codec_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                         uint8_t *out, tp_err *err);
int tp_block_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                    uint8_t *out, tp_err *err);
int tp_int8_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                   uint8_t *out, tp_err *err);
/* sz also takes the chunk's shape (rank dims; codec_sz.c, sz.h) */
int tp_sz_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                 const uint64_t *chunk_shape, int rank, uint8_t *out, tp_err *err);
int tp_quant_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                    uint8_t *out, tp_err *err);

/* zstd through libzstd.so.1 loaded at run time (zstd_dl.c): one frame of src into a new
 * malloc'd buffer of at most max bytes, refused before allocating when its header
 * declares more; *out_len its size */
int tp_zstd_decompress(const uint8_t *src, size_t n, size_t max, uint8_t **out,
                       size_t *out_len, tp_err *err);

/* float32 bits to float16 bits, to nearest with ties to even (numpy's conversion) */
uint16_t tp_half_from_float_bits(uint32_t f);

/* The HDF5 filter's cd_values (SPEC.md "The HDF5 filter", layouts 1 and 2), parsed */
typedef struct tp_cd {
    int codec;        /* enum tp_codec_id of cd_values[1] */
    int bound_mode;   /* TP_BOUND_NONE, TP_BOUND_ABS or TP_BOUND_PW_REL */
    double bound;
    size_t itemsize;  /* 2, 4 or 8 */
    int big_endian;
    int rank;
    uint64_t chunks[32];
} tp_cd;

int tp_parse_cd_values(const unsigned *cd, size_t n, tp_cd *out, tp_err *err);
/* a stored chunk (one stream) back to the chunk cd_values describe, in their byte
 * order, in a buffer from alloc (HDF5's allocator in the plugin; release frees it on a
 * failure); *out_len its bytes */
int tp_filter_decode(const unsigned *cd, size_t ncd, const uint8_t *buf, size_t size,
                     void *(*alloc)(size_t), void (*release)(void *), uint8_t **out,
                     size_t *out_len, tp_err *err);

#endif
