/* The `quant` codec's arithmetic (SPEC.md "quant"), shared by its decoder (codec_quant.c)
 * and encoder (quant_encode.c): the same float64 operations in the same order as
 * compress/quant/kernels/cpu.py, so both write and read the Python codec's bytes. */
#ifndef TP_QUANT_H
#define TP_QUANT_H

#include "tp_decode.h"

enum { TP_QUANT_HEAD = 9 }; /* u8 mode, f64 max_error */

/* _util/hashing.py's hash32 of key (below 2**32) and index i */
uint32_t tp_hash32(uint64_t key, uint64_t i);
/* sg[j] = +1.0 or -1.0 from bit 0 of hash32(key, pos + j), j < size */
void tp_quant_signs(double *sg, int size, uint64_t key, uint64_t pos);
/* the unnormalised Walsh-Hadamard transform of v[:size] in place (size a power of 2) */
void tp_fwht(double *v, int size);
/* float64 v rounded to a stored value of itemsize bytes, 16-bit through float32 */
double tp_quant_storage(double v, size_t itemsize);
/* float16 bits as a double (exact) */
double tp_half_to_double(uint16_t h);
/* the bytes of a mode-0 payload of n values: 9 + 2 * groups * P + packed codes */
uint64_t tp_quant_payload_size(uint64_t n, int bits, int group, int hadamard,
                               size_t itemsize);

/* one chunk payload of the n values x (exact as doubles; raw: their little-endian bytes)
 * as the Python encoder writes it, offset the chunk's first element in the array (the
 * stochastic noise's key); out holds 1 + n * itemsize bytes and the mode-0 payload size,
 * scratch 4 * group doubles. Returns its bytes */
size_t tp_quant_encode(const tp_header *h, const double *x, const uint8_t *raw, uint64_t n,
                       uint64_t offset, uint8_t *out, double *scratch);

#endif
