/* The `sz` codec (SPEC.md "sz"; compress/sz/codec.py's decode): the payload's zstd frame
 * read field by field with every check of the Python decoder, the codes' Huffman
 * stream, the predictor's decoder by id (sz_predictors.c), then the log domain, the
 * cast to the chunk's dtype and the patches. */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

#define FLAG_LOG 1
#define FLAG_FLAT 2
#define FLAG_ROWS 4
#define MIN_EB 0x1p-1000
#define MAX_BETA 1048576.0

typedef struct reader {
    const uint8_t *p;
    size_t len, pos;
} reader;

/* the next n bytes, or NULL when fewer are left */
static const uint8_t *take(reader *r, uint64_t n)
{
    if (n > r->len - r->pos)
        return NULL;
    const uint8_t *q = r->p + r->pos;
    r->pos += (size_t)n;
    return q;
}

static int u64(reader *r, uint64_t *v, tp_err *err)
{
    const uint8_t *q = take(r, 8);
    if (!q)
        return tp_fail(err, TP_E_FORMAT, "sz payload ends early");
    *v = 0;
    for (int i = 7; i >= 0; i--)
        *v = *v << 8 | q[i];
    return 0;
}

static int f64(reader *r, double *v, tp_err *err)
{
    uint64_t bits;
    int rc = u64(r, &bits, err);
    memcpy(v, &bits, 8);
    return rc;
}

/* u64 length + that many bytes */
static int blob(reader *r, const uint8_t **q, uint64_t *n, tp_err *err)
{
    int rc = u64(r, n, err);
    if (rc == 0 && !(*q = take(r, *n)))
        rc = tp_fail(err, TP_E_FORMAT, "sz payload ends inside a field of %llu bytes",
                     (unsigned long long)*n);
    return rc;
}

/* count values of size bytes each (count checked against the chunk by the caller) */
static int array(reader *r, uint64_t count, size_t size, const uint8_t **q, tp_err *err)
{
    *q = take(r, count * size);
    return *q ? 0 : tp_fail(err, TP_E_FORMAT, "sz payload ends inside an array");
}

/* predictor 0: u64 n + n bytes of the byte-shuffled chunk */
static int raw(reader *r, uint64_t n, size_t isz, uint8_t *out, tp_err *err)
{
    const uint8_t *q;
    uint64_t len;
    int rc = blob(r, &q, &len, err);
    if (rc)
        return rc;
    if (len != n * isz)
        return tp_fail(err, TP_E_FORMAT, "raw sz payload has %llu bytes, its chunk %llu",
                       (unsigned long long)len, (unsigned long long)(n * isz));
    if (r->pos != r->len)
        return tp_fail(err, TP_E_FORMAT, "unexpected trailing bytes in sz payload");
    for (size_t b = 0; b < isz; b++)
        for (uint64_t e = 0; e < n; e++)
            out[e * isz + b] = q[b * n + e];
    return 0;
}

/* the layout the flags name, folded to ndim dims (steps.squeezed_shape, fold_shape) */
static int layout(const uint64_t *shape, int rank, uint64_t n, int flags, int ndim,
                  uint64_t fold[4], tp_err *err)
{
    uint64_t sq[TP_MAX_RANK];
    int k = 0;
    for (int i = 0; i < rank; i++)
        if (shape[i] != 1)
            sq[k++] = shape[i];
    if (k == 0)
        sq[k++] = 1;
    if ((flags & FLAG_FLAT) && (flags & FLAG_ROWS))
        return tp_fail(err, TP_E_FORMAT, "sz payload: flags name two layouts");
    if (flags & FLAG_FLAT) {
        sq[0] = n;
        k = 1;
    } else if (flags & FLAG_ROWS) {
        if (k < 3)
            return tp_fail(err, TP_E_FORMAT, "sz payload: flags name the 2-d layout of 3 "
                           "dims or more");
        sq[1] = sq[k - 1];
        if (sq[1] == 0)
            return tp_fail(err, TP_E_FORMAT, "sz payload: a chunk without elements");
        sq[0] = n / sq[1];
        k = 2;
    }
    uint64_t lead = 1;
    for (int i = 0; i <= k - ndim; i++)
        lead *= sq[i];
    for (int d = 0; d < ndim; d++) { /* right-aligned: leading 1s, merged leading dims */
        int src = k - ndim + d;
        fold[d] = src < 0 ? 1 : src == k - ndim && k > ndim ? lead : sq[src];
    }
    for (int d = ndim; d < 4; d++)
        fold[d] = 1;
    return 0;
}

/* the fields after the flags of a predicted payload, as codec.py reads them */
typedef struct fields {
    int pred, flags;
    double eb, alpha, beta;
    uint32_t radius;
    const uint8_t *side, *huff, *outliers, *patch_idx, *patch_val, *signs;
    uint64_t side_len, huff_len, n_out, n_patch;
} fields;

/* alpha and beta as the predictor's id requires them, eb and radius in range */
static int check_quantizer(const fields *f, tp_err *err)
{
    int tuning;
    if (f->pred == TP_SZ_CONSTANT || f->pred == TP_SZ_MATCH || f->pred == TP_SZ_PIVOT)
        tuning = isfinite(f->alpha) && f->beta == 1.0;
    else if (f->pred == TP_SZ_LATTICE)
        tuning = isfinite(f->alpha) && 0 < f->beta && f->beta < INFINITY;
    else
        tuning = 1 <= f->alpha && f->alpha <= MAX_BETA && 1 <= f->beta && f->beta <= MAX_BETA;
    if (!(MIN_EB <= f->eb && f->eb < INFINITY && tuning && 2 <= f->radius &&
          f->radius <= 32768))
        return tp_fail(err, TP_E_FORMAT, "sz payload has an invalid quantizer header");
    return 0;
}

static int read_fields(reader *r, fields *f, uint64_t n, size_t isz, size_t wsize,
                       tp_err *err)
{
    const uint8_t *q = NULL;
    int rc = 0;
    uint64_t len;
    rc = rc ? rc : f64(r, &f->eb, err);
    rc = rc ? rc : f64(r, &f->alpha, err);
    rc = rc ? rc : f64(r, &f->beta, err);
    if (rc == 0 && !(q = take(r, 4)))
        rc = tp_fail(err, TP_E_FORMAT, "sz payload ends early");
    if (rc)
        return rc;
    f->radius = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                (uint32_t)q[3] << 24;
    if (tp_sz_predictors[f->pred].has_side)
        rc = blob(r, &f->side, &f->side_len, err);
    rc = rc ? rc : check_quantizer(f, err);
    rc = rc ? rc : blob(r, &f->huff, &f->huff_len, err);
    rc = rc ? rc : u64(r, &f->n_out, err);
    if (rc == 0 && f->n_out > n)
        rc = tp_fail(err, TP_E_FORMAT, "sz payload claims more outliers than elements");
    rc = rc ? rc : array(r, f->n_out, wsize, &f->outliers, err);
    rc = rc ? rc : u64(r, &f->n_patch, err);
    if (rc == 0 && f->n_patch > n)
        rc = tp_fail(err, TP_E_FORMAT, "patch count exceeds the chunk size");
    rc = rc ? rc : array(r, f->n_patch, 8, &f->patch_idx, err);
    rc = rc ? rc : array(r, f->n_patch, isz, &f->patch_val, err);
    for (uint64_t i = 0; rc == 0 && i < f->n_patch; i++) {
        uint64_t idx = 0;
        for (int b = 7; b >= 0; b--)
            idx = idx << 8 | f->patch_idx[8 * i + (uint64_t)b];
        if (idx >= n)
            rc = tp_fail(err, TP_E_FORMAT, "patch index out of range");
    }
    if (rc == 0 && (f->flags & FLAG_LOG)) {
        rc = blob(r, &f->signs, &len, err);
        if (rc == 0 && len != (n + 7) / 8)
            rc = tp_fail(err, TP_E_FORMAT, "sz payload: sign bits have the wrong length");
    }
    if (rc == 0 && r->pos != r->len)
        rc = tp_fail(err, TP_E_FORMAT, "unexpected trailing bytes in sz payload");
    return rc;
}

/* the codes: PIVOT's first segments from its side information, the rest from the
 * Huffman stream; then the codec's checks (kernels never see a code past the quantizer
 * or more outlier codes than outliers) */
static int codes_of(fields *f, const uint64_t fold[4], uint16_t *codes, uint64_t n,
                    tp_err *err)
{
    uint64_t nhead = 0;
    const tp_sz_predictor *pr = &tp_sz_predictors[f->pred];
    if (f->pred == TP_SZ_PIVOT) {
        if (!pr->side_codes)
            return tp_fail(err, TP_E_UNSUPPORTED, "sz predictor %d is not decoded by this "
                           "plugin yet", f->pred);
        size_t model = 0;
        uint64_t shape2[2] = {fold[0], fold[1]};
        int rc = pr->side_codes(f->side, (size_t)f->side_len, shape2, codes, n, &nhead,
                                &model, err);
        if (rc)
            return rc;
        if (nhead > n || model > f->side_len)
            return tp_fail(err, TP_E_FORMAT, "sz pivot side information is inconsistent");
        f->side_len = model;
    }
    int rc = tp_sz_huffman_decode(f->huff, (size_t)f->huff_len, codes + nhead, n - nhead, err);
    if (rc)
        return rc;
    uint64_t zeros = 0;
    uint16_t top = 0;
    for (uint64_t i = 0; i < n; i++) {
        zeros += codes[i] == 0;
        top = codes[i] > top ? codes[i] : top;
    }
    if (zeros != f->n_out)
        return tp_fail(err, TP_E_FORMAT, "sz payload: outlier count does not match the codes");
    if (top >= 2 * f->radius)
        return tp_fail(err, TP_E_FORMAT, "sz payload: quantization code out of range");
    return 0;
}

/* float64 to float16 bits, one rounding to nearest even (numpy's astype) */
static uint16_t half_of_double(double v)
{
    float r = (float)tp_sz_round(v, TP_PREC_F16); /* exact: a float16 value */
    uint32_t bits;
    memcpy(&bits, &r, 4);
    return tp_half_from_float_bits(bits);
}

/* value i of the work array into element i of out (the chunk's dtype) */
static void store(uint8_t *out, size_t isz, uint64_t i, const void *work, int wf64, double v)
{
    if (isz == 8) {
        memcpy(out + 8 * i, &v, 8);
    } else if (isz == 4) {
        float x = (float)v;
        memcpy(out + 4 * i, &x, 4);
    } else if (wf64) {
        uint16_t x = half_of_double(v);
        memcpy(out + 2 * i, &x, 2);
    } else { /* float32 to float16 as numpy casts it */
        uint32_t bits;
        memcpy(&bits, (const float *)work + i, 4);
        uint16_t x = tp_half_from_float_bits(bits);
        memcpy(out + 2 * i, &x, 2);
    }
}

/* the work array (or log2 magnitudes) to the chunk's dtype, then the patches over it */
static void finish(const fields *f, const void *work, int wf64, uint64_t n, size_t isz,
                   int direct, uint8_t *out)
{
    if (f->flags & FLAG_LOG) { /* special_values.from_log_domain */
        const double *logs = work;
        for (uint64_t i = 0; i < n; i++) {
            double mag = exp2(logs[i]);
            int neg = f->signs[i >> 3] >> (7 - (i & 7)) & 1;
            store(out, isz, i, work, 1, neg ? -mag : mag);
        }
    } else if (!direct) {
        for (uint64_t i = 0; i < n; i++)
            store(out, isz, i, work, wf64, tp_sz_get(work, wf64, i));
    }
    for (uint64_t k = 0; k < f->n_patch; k++) {
        uint64_t idx = 0;
        for (int b = 7; b >= 0; b--)
            idx = idx << 8 | f->patch_idx[8 * k + (uint64_t)b];
        memcpy(out + idx * isz, f->patch_val + k * isz, isz);
    }
}

/* predictor, codes, decoder and the steps after it, on the parsed fields */
static int predicted(fields *f, const uint64_t fold[4], int ndim, uint64_t n, size_t isz,
                     uint8_t *out, tp_err *err)
{
    int wf64 = f->pred == TP_SZ_LATTICE || (f->flags & FLAG_LOG) || isz == 8;
    size_t wsize = wf64 ? 8 : 4;
    int direct = !(f->flags & FLAG_LOG) && wsize == isz;
    uint16_t *codes = malloc((size_t)n * sizeof *codes);
    void *outl = malloc(f->n_out ? (size_t)f->n_out * wsize : 1);
    void *work = direct ? out : malloc((size_t)n * wsize);
    int rc = codes && outl && work ? 0 : tp_fail(err, TP_E_MEMORY, "out of memory for an "
                                                 "sz chunk of %llu values",
                                                 (unsigned long long)n);
    rc = rc ? rc : codes_of(f, fold, codes, n, err);
    const tp_sz_predictor *pr = &tp_sz_predictors[f->pred];
    if (rc == 0 && !pr->decode)
        rc = tp_fail(err, TP_E_UNSUPPORTED, "sz predictor %d is not decoded by this plugin "
                     "yet", f->pred);
    if (rc == 0) {
        memcpy(outl, f->outliers, (size_t)f->n_out * wsize); /* aligned for the decoder */
        int prec = f->flags & FLAG_LOG || isz == 8 ? TP_PREC_F64
                   : isz == 4                      ? TP_PREC_F32
                                                   : TP_PREC_F16;
        tp_sz_chunk c = {f->pred, f->alpha, f->beta, ndim, {fold[0], fold[1], fold[2], fold[3]},
                         n, f->side, (size_t)f->side_len, codes, outl, f->n_out, f->eb,
                         f->radius, prec, wf64, work};
        rc = pr->decode(&c, err);
    }
    if (rc == 0)
        finish(f, work, wf64, n, isz, direct, out);
    free(codes);
    free(outl);
    if (!direct)
        free(work);
    return rc;
}

int tp_sz_decode(const tp_header *h, const uint8_t *p, size_t len, uint64_t n,
                 const uint64_t *chunk_shape, int rank, uint8_t *out, tp_err *err)
{
    size_t isz = h->itemsize;
    /* codec.py's limit: raw bytes or float64 outliers plus patches and codes */
    uint64_t limit = 64 + (1u << 20), per = 2 * (uint64_t)isz + 19;
    limit = n > (UINT64_MAX - limit) / per ? UINT64_MAX : limit + n * per;
    uint8_t *body;
    size_t got;
    int rc = tp_zstd_decompress(p, len, limit > SIZE_MAX ? SIZE_MAX : (size_t)limit, &body,
                                &got, err);
    if (rc)
        return rc;
    reader r = {body, got, 0};
    const uint8_t *q = take(&r, 2);
    fields f = {0};
    if (!q) {
        rc = tp_fail(err, TP_E_FORMAT, "sz payload ends early");
    } else if (q[0] == TP_SZ_RAW) {
        rc = raw(&r, n, isz, out, err);
    } else if (q[0] >= TP_SZ_NPRED || q[1] & ~(FLAG_LOG | FLAG_FLAT | FLAG_ROWS)) {
        rc = tp_fail(err, TP_E_FORMAT, "sz payload names unknown predictor %d or flags %d",
                     q[0], q[1]);
    } else {
        f.pred = q[0];
        f.flags = q[1];
        uint64_t fold[4];
        int ndim = tp_sz_predictors[f.pred].ndim;
        size_t wsize = f.pred == TP_SZ_LATTICE || (f.flags & FLAG_LOG) || isz == 8 ? 8 : 4;
        rc = layout(chunk_shape, rank, n, f.flags, ndim, fold, err);
        rc = rc ? rc : read_fields(&r, &f, n, isz, wsize, err);
        rc = rc ? rc : predicted(&f, fold, ndim, n, isz, out, err);
    }
    free(body);
    return rc;
}
