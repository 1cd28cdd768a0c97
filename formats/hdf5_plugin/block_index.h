/* Where a sparse block's non-zero codes sit (SPEC.md "block": count byte and index;
 * compress/kernels/positions.py writes them). */
#ifndef TP_BLOCK_INDEX_H
#define TP_BLOCK_INDEX_H

#include <stdint.h>

/* non-zero codes named by count byte code (0: not a valid count byte) */
unsigned tp_code_count(uint8_t code);
/* bits of the index of a block of m values (1..64) with valid count byte code */
unsigned tp_index_bits(unsigned m, uint8_t code);
/* the mask of the non-zero codes from index value v; 0 when v is not a valid index */
int tp_decode_index(uint64_t v, uint8_t code, unsigned m, uint64_t *mask);

#endif
