/* The HDF5 filter plugin: H5PLget_plugin_type and H5PLget_plugin_info for filter 32100,
 * decoding (reading) only. Not linked against libhdf5, so one build serves every HDF5
 * 1.10 to 2.x a program brings: the few HDF5 types are declared here, and HDF5's
 * allocator is found at run time in the program's global symbols (h5dump, C and
 * Fortran codes), else malloc and free (what HDF5's own release builds call), as
 * h5py's LZF plugin and hdf5plugin do. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tp_decode.h"

#define EXPORT __attribute__((visibility("default")))

typedef int64_t hid_t; /* HDF5 1.10 and later */
typedef int H5Z_filter_t;
typedef enum { H5PL_TYPE_ERROR = -1, H5PL_TYPE_FILTER = 0 } H5PL_type_t;
typedef size_t (*H5Z_func_t)(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                             size_t nbytes, size_t *buf_size, void **buf);
typedef struct H5Z_class2_t {
    int version; /* H5Z_CLASS_T_VERS: 1 */
    H5Z_filter_t id;
    unsigned encoder_present, decoder_present;
    const char *name;
    int (*can_apply)(hid_t dcpl, hid_t type, hid_t space);
    int (*set_local)(hid_t dcpl, hid_t type, hid_t space);
    H5Z_func_t filter;
} H5Z_class2_t;

#define FILTER_ID 32100 /* formats/SPEC.md, "Filter ID" */
#define FLAG_REVERSE 0x0100

static void *(*h5_allocate)(size_t, int);
static int (*h5_free)(void *);
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void find_allocator(void)
{
    *(void **)&h5_allocate = dlsym(RTLD_DEFAULT, "H5allocate_memory");
    *(void **)&h5_free = dlsym(RTLD_DEFAULT, "H5free_memory");
    if (!h5_allocate || !h5_free)
        h5_allocate = NULL, h5_free = NULL; /* both or neither */
}

static void *allocate(size_t n)
{
    return h5_allocate ? h5_allocate(n, 0) : malloc(n);
}

static void release(void *p)
{
    if (h5_free)
        h5_free(p);
    else
        free(p);
}

static size_t filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                     size_t nbytes, size_t *buf_size, void **buf)
{
    tp_err err = {0, ""};
    uint8_t *out = NULL;
    size_t out_len = 0;
    pthread_once(&once, find_allocator);
    if (!(flags & FLAG_REVERSE))
        tp_fail(&err, TP_E_UNSUPPORTED, "the compiled plugin reads only: write with "
                "tensorpress in Python (tp.hdf5.filter, tensorpress compress --layout filter)");
    else
        tp_filter_decode(cd_values, cd_nelmts, *buf, nbytes, allocate, release, &out, &out_len,
                         &err);
    if (err.code) { /* HDF5 reports "filter returned failure"; the reason on request */
        if (getenv("TENSORPRESS_PLUGIN_DEBUG"))
            fprintf(stderr, "tensorpress HDF5 plugin: %s\n", err.msg);
        return 0;
    }
    release(*buf);
    *buf = out;
    *buf_size = out_len;
    return out_len;
}

static const H5Z_class2_t FILTER_CLASS = {
    1, FILTER_ID, 0, 1,
    "tensorpress: error-bounded lossy (compiled plugin: reads zstd, block, int8)",
    NULL, NULL, filter,
};

EXPORT H5PL_type_t H5PLget_plugin_type(void)
{
    return H5PL_TYPE_FILTER;
}

EXPORT const void *H5PLget_plugin_info(void)
{
    return &FILTER_CLASS;
}
