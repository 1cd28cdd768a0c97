/* `sz` predictor 7: block-wise Lorenzo or linear regression (SZ2's predictor;
 * compress/sz/kernels/regression.py's decoder). The side information (SPEC.md) names
 * per block which one, and the regression blocks' quantized coefficients. Lorenzo reads
 * its neighbours from the output (the work array holds each reconstruction exactly, as
 * the kernel's zero-padded buffer does), so no buffer of the chunk's size is added. */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

/* block side per dimension: 6 (3 dims above 1), 12 (2) or 64 (1), 1 along size-1 dims */
static void block_sides(const uint64_t *shape, uint64_t side[3])
{
    int big = (shape[0] > 1) + (shape[1] > 1) + (shape[2] > 1);
    uint64_t s = big == 3 ? 6 : big == 2 ? 12 : 64;
    for (int d = 0; d < 3; d++)
        side[d] = shape[d] > 1 ? s : 1;
}

/* unpack_side: kinds (0/1 per block) and each block's coefficients (zero for Lorenzo
 * blocks) times their steps, as float64 */
static int unpack(const tp_sz_chunk *c, uint64_t nblocks, const uint64_t side[3],
                  uint8_t *kinds, double *coefs, tp_err *err)
{
    const uint8_t *s = c->side;
    uint64_t nbits = (nblocks + 7) / 8, nreg = 0;
    if (c->side_len < 1 + nbits || (s[0] != 1 && s[0] != 2 && s[0] != 4 && s[0] != 8))
        return tp_fail(err, TP_E_FORMAT, "sz payload: regression side information is damaged");
    unsigned width = s[0];
    for (uint64_t b = 0; b < nblocks; b++) {
        kinds[b] = s[1 + (b >> 3)] >> (7 - (b & 7)) & 1;
        nreg += kinds[b];
    }
    if (c->side_len != 1 + nbits + 4 * nreg * width)
        return tp_fail(err, TP_E_FORMAT, "sz payload: regression side information has the "
                       "wrong length");
    double steps[4];
    for (int d = 0; d < 3; d++)
        steps[d] = c->eb / (4.0 * (double)side[d]);
    steps[3] = c->eb / 4.0;
    const uint8_t *z = s + 1 + nbits;
    uint64_t q[4] = {0, 0, 0, 0}; /* running sums, wrapping as int64's cumsum */
    for (uint64_t b = 0; b < nblocks; b++) {
        for (int d = 0; d < 4; d++) {
            if (kinds[b]) {
                uint64_t zig = 0;
                for (unsigned k = width; k-- > 0;)
                    zig = zig << 8 | z[k];
                z += width;
                q[d] += (zig >> 1) ^ (0 - (zig & 1));
            }
            coefs[4 * b + d] = kinds[b] ? (double)(int64_t)q[d] * steps[d] : 0.0 * steps[d];
        }
    }
    return 0;
}

typedef struct blocks {
    const tp_sz_chunk *c;
    uint64_t n[3], s[3];
    const uint8_t *kinds;
    const double *coefs;
} blocks;

/* the reconstruction at (i - di, j - dj, k - dk), +0.0 outside the array */
static inline double at(const blocks *B, uint64_t i, uint64_t j, uint64_t k, uint64_t di,
                        uint64_t dj, uint64_t dk)
{
    if (i < di || j < dj || k < dk)
        return 0.0;
    uint64_t f = ((i - di) * B->n[1] + (j - dj)) * B->n[2] + (k - dk);
    return tp_sz_get(B->c->out, B->c->f64, f);
}

/* block blk at (b0, b1, b2); its codes from *f on (the codes follow the blocks' order) */
static void block(const blocks *B, uint64_t blk, uint64_t b0, uint64_t b1, uint64_t b2,
                  uint64_t *f, uint64_t *oi)
{
    const tp_sz_chunk *c = B->c;
    uint64_t n1 = B->n[1], n2 = B->n[2];
    uint64_t e0 = b0 + B->s[0] < B->n[0] ? b0 + B->s[0] : B->n[0];
    uint64_t e1 = b1 + B->s[1] < n1 ? b1 + B->s[1] : n1;
    uint64_t e2 = b2 + B->s[2] < n2 ? b2 + B->s[2] : n2;
    const double *k4 = B->coefs + 4 * blk;
    double two_eb = 2.0 * c->eb;
    for (uint64_t i = b0; i < e0; i++)
        for (uint64_t j = b1; j < e1; j++)
            for (uint64_t k = b2; k < e2; k++) {
                double p;
                if (B->kinds[blk]) {
                    p = k4[0] * (double)(i - b0) + k4[1] * (double)(j - b1) +
                        k4[2] * (double)(k - b2) + k4[3];
                } else { /* the kernel's order of the terms */
                    p = at(B, i, j, k, 1, 0, 0) + at(B, i, j, k, 0, 1, 0) +
                        at(B, i, j, k, 0, 0, 1) - at(B, i, j, k, 1, 1, 0) -
                        at(B, i, j, k, 1, 0, 1) - at(B, i, j, k, 0, 1, 1) +
                        at(B, i, j, k, 1, 1, 1);
                }
                uint16_t code = c->codes[(*f)++];
                double v = code ? tp_sz_dequant(code, p, two_eb, c->radius, c->prec)
                                : tp_sz_get(c->outliers, c->f64, (*oi)++);
                tp_sz_put(c->out, c->f64, (i * n1 + j) * n2 + k, v);
            }
}

int tp_sz_regression_decode(const tp_sz_chunk *c, tp_err *err)
{
    blocks B = {c, {c->shape[0], c->shape[1], c->shape[2]}, {0}, NULL, NULL};
    block_sides(c->shape, B.s);
    uint64_t nb[3], nblocks = 1;
    for (int d = 0; d < 3; d++) {
        nb[d] = (B.n[d] + B.s[d] - 1) / B.s[d];
        nblocks *= nb[d];
    }
    uint8_t *kinds = malloc(nblocks ? (size_t)nblocks : 1);
    double *coefs = malloc((nblocks ? (size_t)nblocks : 1) * 4 * sizeof *coefs);
    int rc = kinds && coefs ? 0 : tp_fail(err, TP_E_MEMORY, "out of memory for the "
                                                 "regression decoder");
    rc = rc ? rc : unpack(c, nblocks, B.s, kinds, coefs, err);
    if (rc == 0) {
        B.kinds = kinds;
        B.coefs = coefs;
        uint64_t blk = 0, f = 0, oi = 0;
        for (uint64_t b0 = 0; b0 < B.n[0]; b0 += B.s[0])
            for (uint64_t b1 = 0; b1 < B.n[1]; b1 += B.s[1])
                for (uint64_t b2 = 0; b2 < B.n[2]; b2 += B.s[2])
                    block(&B, blk++, b0, b1, b2, &f, &oi);
    }
    free(kinds);
    free(coefs);
    return rc;
}
