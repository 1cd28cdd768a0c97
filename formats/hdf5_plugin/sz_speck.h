/* The set-partitioning coding of `sz` predictor 15's coefficients (SPEC.md "CDF 9/7",
 * compress/sz/speck.py and its kernels): sz_speck.c decodes it for sz_cdf97.c. */
#ifndef TP_SZ_SPECK_H
#define TP_SZ_SPECK_H

#include <stddef.h>
#include <stdint.h>

#include "tp_decode.h"

/* kernels/speck.py MAX_PLANES: the most bits of a magnitude */
enum { TP_SPECK_MAX_PLANES = 53 };

/* The len bytes at buf, coded under top planes from the nb sets boxes (each its 4
 * starts, then its 4 lengths, inside the C-order array of shape sh), into k (the
 * array's int64 integers, zeroed by the caller). Every bit is read within len; a stream
 * that ends early, carries a byte past its end or padding bits that are not 0 is
 * refused (TP_E_FORMAT). */
int tp_sz_speck_decode(const uint8_t *buf, size_t len, int top, const uint64_t (*boxes)[8],
                       size_t nb, const uint64_t sh[4], int64_t *k, tp_err *err);

#endif
