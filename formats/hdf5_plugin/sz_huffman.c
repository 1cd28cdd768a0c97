/* The canonical Huffman streams of the `sz` codes (compress/sz/huffman.py; SPEC.md
 * "sz", "Huffman stream"): the header and table checked as HuffmanDecoder checks them,
 * then the codes decoded through a lookup table of the next LUT_BITS stream bits, codes
 * longer than that length by length from the canonical first code per length. */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

#define MAX_LEN 24
#define LUT_BITS 12
#define ALPHABET 65536u

typedef struct table {
    int64_t first[MAX_LEN + 1], cnt[MAX_LEN + 1], offset[MAX_LEN + 1];
    uint16_t *sorted; /* symbols by (length, value) */
    uint32_t *lut;    /* next tb bits -> symbol << 8 | length, 0 for a longer code */
    int tb, lmax;
} table;

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* the stream bits from pos on (at least 56 of them; zeros past the end) */
static inline uint64_t peek(const uint8_t *bits, size_t nbytes, uint64_t pos)
{
    size_t b = (size_t)(pos >> 3);
    uint64_t w = 0;
    if (b + 8 <= nbytes) {
        memcpy(&w, bits + b, 8); /* little-endian hosts only (tp_decode.h) */
    } else {
        for (size_t i = 0; b + i < nbytes; i++)
            w |= (uint64_t)bits[b + i] << (8 * i);
    }
    return w >> (pos & 7);
}

/* the canonical tables of the validated lengths (1..lmax) of the ascending symbols */
static int build(table *t, const uint32_t *syms, const uint8_t *len, uint32_t n, tp_err *err)
{
    memset(t->cnt, 0, sizeof t->cnt);
    for (uint32_t i = 0; i < n; i++)
        t->cnt[len[i]]++;
    int64_t code = 0;
    t->first[0] = t->offset[0] = 0;
    for (int l = 1; l <= MAX_LEN; l++) {
        code = (code + (l > 1 ? t->cnt[l - 1] : 0)) << 1;
        t->first[l] = code;
        t->offset[l] = t->offset[l - 1] + (l > 1 ? t->cnt[l - 1] : 0);
    }
    t->tb = t->lmax < LUT_BITS ? t->lmax : LUT_BITS;
    t->sorted = malloc((size_t)n * sizeof *t->sorted);
    t->lut = calloc((size_t)1 << t->tb, sizeof *t->lut);
    if (!t->sorted || !t->lut)
        return tp_fail(err, TP_E_MEMORY, "out of memory for a Huffman table");
    int64_t slot[MAX_LEN + 1];
    memcpy(slot, t->offset, sizeof slot);
    for (uint32_t i = 0; i < n; i++) {
        int l = len[i];
        int64_t r = slot[l]++;
        t->sorted[r] = (uint16_t)syms[i];
        if (l > t->tb)
            continue;
        uint32_t c = (uint32_t)(t->first[l] + r - t->offset[l]), rev = 0;
        for (int b = 0; b < l; b++)
            rev = rev << 1 | ((c >> b) & 1);
        for (uint32_t hi = 0; hi < (1u << (t->tb - l)); hi++)
            t->lut[rev | hi << l] = (uint32_t)syms[i] << 8 | (uint32_t)l;
    }
    return 0;
}

/* the code at the bits w (LSB first) longer than the table's index: length by length */
static uint32_t slow(const table *t, uint64_t w)
{
    int64_t code = 0;
    for (int l = 1; l <= t->lmax; l++) {
        code = code << 1 | (int64_t)((w >> (l - 1)) & 1);
        int64_t k = code - t->first[l];
        if (k >= 0 && k < t->cnt[l])
            return (uint32_t)t->sorted[t->offset[l] + k] << 8 | (uint32_t)l;
    }
    return 0; /* not reached for a complete code */
}

static int run(const table *t, const uint8_t *bits, size_t nbytes, uint64_t nbits,
               uint16_t *codes, uint64_t count, tp_err *err)
{
    uint64_t pos = 0, mask = ((uint64_t)1 << t->tb) - 1;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t w = peek(bits, nbytes, pos);
        uint32_t e = t->lut[w & mask];
        if (e == 0)
            e = slow(t, w);
        uint32_t l = e & 0xff;
        if (l == 0 || pos + l > nbits)
            return tp_fail(err, TP_E_FORMAT, "huffman: bitstream ends in the middle of a code");
        codes[i] = (uint16_t)(e >> 8);
        pos += l;
    }
    if (pos != nbits)
        return tp_fail(err, TP_E_FORMAT, "huffman: bits left over after decoding %llu symbols",
                       (unsigned long long)count);
    return 0;
}

/* the table's checks after the header's: symbols, lengths, Kraft sum, bit count */
static int check_table(const uint8_t *len, uint32_t n, uint64_t count, uint64_t nbits,
                       int *lmax, tp_err *err)
{
    int lmin = 256, lx = 0;
    int64_t kraft = 0;
    for (uint32_t i = 0; i < n; i++) {
        lmin = len[i] < lmin ? len[i] : lmin;
        lx = len[i] > lx ? len[i] : lx;
        if (len[i] >= 1 && len[i] <= MAX_LEN)
            kraft += (int64_t)1 << (MAX_LEN - len[i]);
    }
    if (count < n)
        return tp_fail(err, TP_E_FORMAT, "huffman: count below the distinct symbols listed");
    if (lmin < 1 || lx > MAX_LEN)
        return tp_fail(err, TP_E_FORMAT, "huffman: code lengths outside 1..24 bits");
    if (kraft != (int64_t)1 << MAX_LEN)
        return tp_fail(err, TP_E_FORMAT, "huffman: code lengths are no complete prefix code");
    /* count <= 2^61 here (the payload holds fewer elements), so the products fit */
    if (nbits < count * (uint64_t)lmin || nbits > count * (uint64_t)lx)
        return tp_fail(err, TP_E_FORMAT, "huffman: %llu bits cannot hold the codes",
                       (unsigned long long)nbits);
    *lmax = lx;
    return 0;
}

static int decode_many(const uint8_t *p, size_t len, uint32_t n, uint64_t nbits,
                       const uint32_t *syms, uint16_t *codes, uint64_t count, tp_err *err)
{
    const uint8_t *lens = p + 12 + 2 * (size_t)n, *bits = lens + n;
    size_t nbytes = len - 12 - 3 * (size_t)n;
    table t = {.sorted = NULL, .lut = NULL};
    int rc = check_table(lens, n, count, nbits, &t.lmax, err);
    if (rc == 0 && nbits % 8 && bits[nbytes - 1] >> (nbits % 8))
        rc = tp_fail(err, TP_E_FORMAT, "huffman: nonzero padding bits after the bitstream");
    if (rc == 0)
        rc = build(&t, syms, lens, n, err);
    if (rc == 0)
        rc = run(&t, bits, nbytes, nbits, codes, count, err);
    free(t.sorted);
    free(t.lut);
    return rc;
}

int tp_sz_huffman_decode(const uint8_t *p, size_t len, uint16_t *codes, uint64_t count,
                         tp_err *err)
{
    if (len < 12)
        return tp_fail(err, TP_E_FORMAT, "huffman: truncated header");
    uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    uint64_t nbits = rd64(p + 4);
    if (n > ALPHABET)
        return tp_fail(err, TP_E_FORMAT, "huffman: %u distinct symbols exceed the alphabet", n);
    if (len < 12 + 3 * (size_t)n)
        return tp_fail(err, TP_E_FORMAT, "huffman: truncated code table");
    if (nbits / 8 + (nbits % 8 != 0) != len - 12 - 3 * (size_t)n)
        return tp_fail(err, TP_E_FORMAT, "huffman: stream length does not match its bits");
    uint32_t *syms = malloc(((size_t)n + 1) * sizeof *syms);
    if (!syms)
        return tp_fail(err, TP_E_MEMORY, "out of memory for a Huffman table");
    int64_t s = -1;
    for (uint32_t i = 0; i < n; i++) {
        s += (int64_t)(p[12 + 2 * i] | p[13 + 2 * i] << 8) + 1;
        syms[i] = (uint32_t)s;
    }
    int rc = 0;
    if (n && s >= (int64_t)ALPHABET)
        rc = tp_fail(err, TP_E_FORMAT, "huffman: symbol table runs past 65535");
    else if ((n == 0) != (count == 0))
        rc = tp_fail(err, TP_E_FORMAT, "huffman: %u distinct symbols but count %llu", n,
                     (unsigned long long)count);
    else if (n == 0 && nbits)
        rc = tp_fail(err, TP_E_FORMAT, "huffman: empty stream with a nonempty bitstream");
    else if (n == 1 && (p[14] != 0 || nbits != 0))
        rc = tp_fail(err, TP_E_FORMAT, "huffman: one symbol needs length 0 and no bits");
    else if (n == 1)
        for (uint64_t i = 0; i < count; i++)
            codes[i] = (uint16_t)syms[0];
    else if (n >= 2)
        rc = decode_many(p, len, n, nbits, syms, codes, count, err);
    free(syms);
    return rc;
}
