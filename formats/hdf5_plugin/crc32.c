/* CRC-32 with zlib's (ISO-HDLC) polynomial, table-driven, eight bytes a step. */
#include <pthread.h>

#include "tp_decode.h"

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

uint32_t tp_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    pthread_once(&once, make_table); /* HDF5 may call filters from several threads */
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) { /* slicing-by-8 on a little-endian read */
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                            (uint32_t)p[3] << 24);
        crc = table[7][a & 0xFF] ^ table[6][(a >> 8) & 0xFF] ^ table[5][(a >> 16) & 0xFF] ^
              table[4][a >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
              table[0][p[7]];
    }
    while (n--)
        crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}
