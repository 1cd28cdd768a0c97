/* tensorpress stream encoder in C: the `block` codec (entropy "none") and the container
 * around it, byte for byte as the Python filter writes a chunk (formats/hdf5_filter.py,
 * encode_chunk). plugin.c adapts it to HDF5's filter interface, driver.c to tests. */
#ifndef TP_ENCODE_H
#define TP_ENCODE_H

#include "tp_decode.h"

/* the most bytes a block payload of n values takes while it is written */
size_t tp_block_capacity(uint64_t n, size_t itemsize);
/* one chunk payload of the n values x (exact as doubles) whose stored little-endian
 * bytes are raw, under an abs (pw 0) or pw_rel (pw 1) tolerance, into out
 * (tp_block_capacity bytes); data: scratch of n * itemsize + 8 bytes. Returns its bytes */
size_t tp_block_encode(const double *x, const uint8_t *raw, uint64_t n, size_t itemsize,
                       int pw, double tol, uint8_t *out, uint8_t *data);

/* Python's repr of a finite double (the shortest digits that read back, its layout),
 * as json.dumps writes floats; buf holds at least 32 bytes */
void tp_repr_double(double v, char *buf);

/* one HDF5 chunk (floats in the byte order cd_values give) as a container stream in a
 * buffer from alloc (release frees it on a failure); *out_len its bytes. Codecs other
 * than block fail with TP_E_UNSUPPORTED */
int tp_filter_encode(const unsigned *cd, size_t ncd, const uint8_t *buf, size_t size,
                     void *(*alloc)(size_t), void (*release)(void *), uint8_t **out,
                     size_t *out_len, tp_err *err);

#endif
