/* The canonical Huffman streams of the `sz` codes (compress/sz/huffman.py; SPEC.md
 * "Huffman stream"): the header and table checked as HuffmanDecoder checks them, then
 * the codes decoded through a lookup table of the next LUT_BITS stream bits that holds up
 * to three short codes an entry (one dependent load per three codes where codes are
 * short, as they are at the bounds users pick); codes longer than the index are found
 * length by length from the canonical first code per length. */
#include <stdlib.h>
#include <string.h>

#include "sz.h"

#define MAX_LEN 24
#define LUT_BITS 12
/* the index of streams above 10 bits a code: wider, since their codes past 12 bits are
 * common and each costs a search; not below (its 32 KiB then crowd the L1 cache) */
#define WIDE_BITS 13
#define ALPHABET 65536u

typedef struct table {
    int64_t first[MAX_LEN + 1], cnt[MAX_LEN + 1], offset[MAX_LEN + 1];
    uint16_t *sorted; /* symbols by (length, value) */
    uint32_t *lut;    /* next tb bits -> symbol << 8 | length, 0 for a longer code */
    uint64_t *multi;  /* next tb bits -> up to three codes: bits 0-4 their total length
                       * (0: a longer code first), 5-6 their count, 8-55 the symbols */
    int tb, lmax;
    int multi_codes, wide; /* the multi-code table is built and used; WIDE_BITS */
} table;

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* the stream bits from pos on (at least 56 of them) in a copy padded by 8 zero bytes,
 * pos at most the stream's bits */
static inline uint64_t peek(const uint8_t *padded, uint64_t pos)
{
    uint64_t w;
    memcpy(&w, padded + (pos >> 3), 8); /* little-endian hosts only (tp_decode.h) */
    return w >> (pos & 7);
}

/* the multi-code entries from the one-code table: a code, then the next while it fits in
 * the index's bits that are left */
static void build_multi(table *t)
{
    uint32_t size = 1u << t->tb;
    for (uint32_t idx = 0; idx < size; idx++) {
        uint64_t e = 0, total = 0, count = 0;
        uint32_t rest = idx;
        while (count < 3) {
            uint32_t one = t->lut[rest];
            uint32_t l = one & 0xff;
            if (one == 0 || total + l > (uint64_t)t->tb)
                break;
            e |= (uint64_t)(one >> 8) << (8 + 16 * count);
            total += l;
            count++;
            rest >>= l;
        }
        t->multi[idx] = count ? e | count << 5 | total : 0;
    }
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
    int bits = t->wide ? WIDE_BITS : LUT_BITS;
    t->tb = t->lmax < bits ? t->lmax : bits;
    t->sorted = malloc((size_t)n * sizeof *t->sorted);
    t->lut = calloc((size_t)1 << t->tb, sizeof *t->lut);
    if (t->multi_codes)
        t->multi = malloc(((size_t)1 << t->tb) * sizeof *t->multi);
    if (!t->sorted || !t->lut || (t->multi_codes && !t->multi))
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
    if (t->multi_codes)
        build_multi(t);
    return 0;
}

/* the code at the bits w (LSB first) longer than the table's index: length by length,
 * from the next 24 stream bits as an integer whose first bit is its highest */
static uint32_t slow(const table *t, uint64_t w)
{
    uint32_t x = (uint32_t)w & 0xffffff; /* reversed: each byte's bits, then the bytes */
    x = ((x >> 1) & 0x555555) | ((x & 0x555555) << 1);
    x = ((x >> 2) & 0x333333) | ((x & 0x333333) << 2);
    x = ((x >> 4) & 0x0f0f0f) | ((x & 0x0f0f0f) << 4);
    uint32_t msb = (x & 0xff) << 16 | (x & 0xff00) | x >> 16;
    for (int l = t->tb + 1; l <= t->lmax; l++) {
        int64_t k = (int64_t)(msb >> (MAX_LEN - l)) - t->first[l];
        if (k >= 0 && k < t->cnt[l])
            return (uint32_t)t->sorted[t->offset[l] + k] << 8 | (uint32_t)l;
    }
    return 0; /* not reached for a complete code */
}

static int overrun(tp_err *err)
{
    return tp_fail(err, TP_E_FORMAT, "huffman: bitstream ends in the middle of a code");
}

/* one code a lookup (streams above 4 bits a code, where an entry rarely holds two): as
 * many codes from one load of 56 bits as surely fit, the lookups chained through shifts */
static int run_single(const table *t, const uint8_t *padded, uint64_t nbits, uint16_t *codes,
                      uint64_t count, tp_err *err)
{
    uint64_t pos = 0, i = 0, mask = ((uint64_t)1 << t->tb) - 1;
    while (i < count) {
        if (pos > nbits)
            return overrun(err);
        uint64_t w = peek(padded, pos);
        for (int avail = 56; avail >= t->lmax && i < count;) {
            uint32_t e = t->lut[w & mask];
            if (e == 0)
                e = slow(t, w); /* avail >= lmax: the whole code is in w */
            uint32_t l = e & 0xff;
            if (l == 0)
                return overrun(err);
            codes[i++] = (uint16_t)(e >> 8);
            w >>= l;
            avail -= (int)l;
            pos += l;
        }
    }
    if (pos != nbits)
        return tp_fail(err, TP_E_FORMAT, "huffman: %s after decoding %llu symbols",
                       pos > nbits ? "the bitstream ends early" : "bits left over",
                       (unsigned long long)count);
    return 0;
}

static int run(const table *t, const uint8_t *padded, uint64_t nbits, uint16_t *codes,
               uint64_t count, tp_err *err)
{
    if (!t->multi_codes)
        return run_single(t, padded, nbits, codes, count, err);
    uint64_t pos = 0, i = 0, mask = ((uint64_t)1 << t->tb) - 1;
    while (i + 3 <= count) { /* room for three codes: an entry's are all written */
        uint64_t w = peek(padded, pos), e = t->multi[w & mask];
        /* four entries of at most 12 bits from one load of 56: the lookups chain through
         * shifts of w, not through loads at pos */
        for (int k = 0; k < 4 && e && i + 3 <= count; k++) {
            codes[i] = (uint16_t)(e >> 8);
            codes[i + 1] = (uint16_t)(e >> 24);
            codes[i + 2] = (uint16_t)(e >> 40);
            i += (e >> 5) & 3;
            pos += e & 31;
            w >>= e & 31;
            e = t->multi[w & mask];
        }
        if (pos > nbits)
            return overrun(err);
        if (e || i + 3 > count)
            continue;
        uint32_t one = slow(t, peek(padded, pos)); /* a code longer than the index */
        if (one == 0)
            return overrun(err);
        codes[i++] = (uint16_t)(one >> 8);
        pos += one & 0xff;
        if (pos > nbits)
            return overrun(err);
    }
    for (; i < count; i++) {
        uint64_t w = peek(padded, pos);
        uint32_t e = t->lut[w & mask];
        if (e == 0)
            e = slow(t, w);
        uint32_t l = e & 0xff;
        if (l == 0 || pos + l > nbits)
            return overrun(err);
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
    /* up to 4 bits a code: three codes an entry pay (compress/sz/huffman.py's choice) */
    table t = {.multi_codes = nbits <= 4 * count, .wide = nbits > 10 * count};
    uint8_t *padded = NULL;
    int rc = check_table(lens, n, count, nbits, &t.lmax, err);
    if (rc == 0 && nbits % 8 && bits[nbytes - 1] >> (nbits % 8))
        rc = tp_fail(err, TP_E_FORMAT, "huffman: nonzero padding bits after the bitstream");
    if (rc == 0)
        rc = build(&t, syms, lens, n, err);
    if (rc == 0 && !(padded = calloc(nbytes + 8, 1)))
        rc = tp_fail(err, TP_E_MEMORY, "out of memory for a Huffman stream");
    if (rc == 0) {
        memcpy(padded, bits, nbytes);
        rc = run(&t, padded, nbits, codes, count, err);
    }
    free(padded);
    free(t.sorted);
    free(t.lut);
    free(t.multi);
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
