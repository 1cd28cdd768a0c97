/* Sparse blocks' positions: up to RANK_MAX non-zero codes are located by the ranks of
 * their positions in each half of the block (combinatorial number system), more by the
 * block's m-bit mask; the count byte names how many and how they split. */
#include "block_index.h"

#include <pthread.h>

enum { HALF = 32, RANK_MAX = 14, MASK_BASE = RANK_MAX * (RANK_MAX + 1) / 2 };

static int64_t binom[RANK_MAX + 1][HALF + 1]; /* binom[i][p] = C(p, i) */
static unsigned half_bits[HALF + 1][HALF + 1]; /* bit length of C(n, i) - 1 */
static int code_count[256], code_high[256];   /* high: codes in the second half; -1 mask */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t comb(unsigned n, unsigned k)
{
    if (k > n)
        return 0;
    uint64_t c = 1;
    for (unsigned j = 1; j <= k; j++)
        c = c * (n - k + j) / j; /* exact: C(n-k+j, j) at every step, below 2^40 here */
    return c;
}

static unsigned bit_length(uint64_t v)
{
    return v ? 64 - (unsigned)__builtin_clzll(v) : 0;
}

static void make_tables(void)
{
    for (unsigned i = 0; i <= RANK_MAX; i++)
        for (unsigned p = 0; p <= HALF; p++)
            binom[i][p] = (int64_t)comb(p, i);
    for (unsigned n = 0; n <= HALF; n++)
        for (unsigned i = 0; i <= HALF; i++) {
            uint64_t c = comb(n, i);
            half_bits[n][i] = bit_length(c ? c - 1 : 0);
        }
    for (int c = 0; c < 256; c++)
        code_high[c] = -1;
    for (int k = 1; k <= 2 * HALF; k++) {
        if (k > RANK_MAX) {
            code_count[MASK_BASE + k] = k;
            continue;
        }
        for (int a = 0; a <= k; a++)
            code_count[k * (k + 1) / 2 + a] = k, code_high[k * (k + 1) / 2 + a] = a;
    }
}

unsigned tp_code_count(uint8_t code)
{
    pthread_once(&once, make_tables);
    return (unsigned)code_count[code];
}

unsigned tp_index_bits(unsigned m, uint8_t code)
{
    pthread_once(&once, make_tables);
    int k = code_count[code], a = code_high[code];
    if (a < 0)
        return m;
    unsigned lo = m < HALF ? m : HALF, hi = m > HALF ? m - HALF : 0;
    return half_bits[lo][k - a] + half_bits[hi][a];
}

/* the mask of the i positions (below 32) of rank r: from the highest, each position is
 * the largest p with C(p, i) <= what is left of the rank */
static uint64_t unrank(int64_t r, int i)
{
    uint64_t mask = 0;
    for (; i > 0; i--) {
        int p = HALF - 1;
        while (binom[i][p] > r)
            p--;
        r -= binom[i][p];
        mask |= (uint64_t)1 << p;
    }
    return mask;
}

int tp_decode_index(uint64_t v, uint8_t code, unsigned m, uint64_t *mask)
{
    pthread_once(&once, make_tables);
    int k = code_count[code], a = code_high[code];
    if (a < 0) {
        *mask = v;
        return k > RANK_MAX && k <= (int)m && __builtin_popcountll(v) == k;
    }
    int b = k - a;
    unsigned nlo = m < HALF ? m : HALF, nhi = m > HALF ? m - HALF : 0;
    if (k == 0 || b > (int)nlo || a > (int)nhi)
        return 0;
    unsigned w = half_bits[nlo][b];
    int64_t rlo = (int64_t)(w < 64 ? v & (((uint64_t)1 << w) - 1) : v);
    int64_t rhi = (int64_t)(w < 64 ? v >> w : 0);
    if (rlo >= binom[b][nlo] || rhi >= binom[a][nhi] || rhi < 0)
        return 0;
    *mask = unrank(rlo, b) | unrank(rhi, a) << HALF;
    return 1;
}
