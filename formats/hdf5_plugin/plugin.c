/* The HDF5 filter plugin: H5PLget_plugin_type and H5PLget_plugin_info for filter 32100:
 * reads zstd, block, int8 and quant chunks, writes block and quant ones (can_apply refuses
 * the codecs it does not write, set_local appends the chunk layout to cd_values). Not
 * linked against libhdf5, so one build serves every HDF5 1.10 to 2.x a program brings: the few HDF5 types are declared here, and HDF5's
 * allocator and the calls set_local makes are found at run time in the program's global
 * symbols (h5dump, C and Fortran codes) or in the libhdf5 it loaded privately (h5py),
 * else malloc and free (what HDF5's own release builds call), as h5py's LZF plugin and
 * hdf5plugin do. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp_encode.h"

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
#define USER_VALUES 5 /* cd_values from tp.hdf5.filter; set_local appends the rest */
#define MAX_CD (USER_VALUES + 3 + 32)
enum { T_FLOAT = 1, ORDER_LE = 0, ORDER_BE = 1 }; /* H5T_FLOAT, H5T_ORDER_LE/BE */
typedef uint64_t hsize_t;

/* the HDF5 calls set_local needs, found at run time in the program's libhdf5 */
static struct {
    int (*get_filter)(hid_t, H5Z_filter_t, unsigned *, size_t *, unsigned *, size_t, char *,
                      unsigned *);
    int (*modify_filter)(hid_t, H5Z_filter_t, unsigned, size_t, const unsigned *);
    int (*get_chunk)(hid_t, int, hsize_t *);
    size_t (*type_size)(hid_t);
    int (*type_class)(hid_t);
    int (*type_order)(hid_t);
} h5;

static void *(*h5_allocate)(size_t, int);
static int (*h5_free)(void *);
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* the loaded libhdf5 whose symbols the program did not make global (h5py loads it
 * with RTLD_LOCAL): the first loaded object named libhdf5* (not libhdf5_hl) */
static int find_hdf5(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *name = info->dlpi_name, *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libhdf5", 7) != 0 || base[7] == '_')
        return 0;
    void *lib = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    if (lib && dlsym(lib, "H5Pmodify_filter")) {
        *(void **)found = lib;
        return 1;
    }
    if (lib)
        dlclose(lib);
    return 0;
}

static void find_hdf5_calls(void)
{
    void *lib = RTLD_DEFAULT; /* h5dump, h5repack, C and Fortran codes */
    if (!dlsym(lib, "H5Pmodify_filter")) {
        lib = NULL;
        dl_iterate_phdr(find_hdf5, &lib);
        if (!lib)
            return; /* no HDF5 calls: malloc, and no writes */
    }
    *(void **)&h5.get_filter = dlsym(lib, "H5Pget_filter_by_id2");
    *(void **)&h5.modify_filter = dlsym(lib, "H5Pmodify_filter");
    *(void **)&h5.get_chunk = dlsym(lib, "H5Pget_chunk");
    *(void **)&h5.type_size = dlsym(lib, "H5Tget_size");
    *(void **)&h5.type_class = dlsym(lib, "H5Tget_class");
    *(void **)&h5.type_order = dlsym(lib, "H5Tget_order");
    *(void **)&h5_allocate = dlsym(lib, "H5allocate_memory");
    *(void **)&h5_free = dlsym(lib, "H5free_memory");
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

/* A chunk that fails to decode, on stderr: the first one of the process only (a damaged
 * file may fail every chunk, and a reader may ask again for each), saying how to see
 * them all; each with TENSORPRESS_PLUGIN_DEBUG set. h5dump itself prints only "unable to
 * print data", a missing libzstd too, so the first reason must reach the user. */
static void report_read_failure(const char *why)
{
    static atomic_int told;
    if (getenv("TENSORPRESS_PLUGIN_DEBUG"))
        fprintf(stderr, "tensorpress HDF5 plugin: cannot decode a chunk: %s\n", why);
    else if (!atomic_exchange(&told, 1))
        fprintf(stderr, "tensorpress HDF5 plugin: cannot decode a chunk: %s (later failures "
                "are not printed; TENSORPRESS_PLUGIN_DEBUG=1 prints each)\n", why);
}

static size_t filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[],
                     size_t nbytes, size_t *buf_size, void **buf)
{
    tp_err err = {0, ""};
    uint8_t *out = NULL;
    size_t out_len = 0;
    pthread_once(&once, find_hdf5_calls);
    if (!(flags & FLAG_REVERSE))
        tp_filter_encode(cd_values, cd_nelmts, *buf, nbytes, allocate, release, &out, &out_len,
                         &err);
    else
        tp_filter_decode(cd_values, cd_nelmts, *buf, nbytes, allocate, release, &out, &out_len,
                         &err);
    if (err.code) { /* HDF5 reports only "filter returned failure": say why on stderr */
        if (!(flags & FLAG_REVERSE))
            fprintf(stderr, "tensorpress HDF5 plugin: %s\n", err.msg);
        else
            report_read_failure(err.msg);
        return 0;
    }
    release(*buf);
    *buf = out;
    *buf_size = out_len;
    return out_len;
}

/* the user's cd_values of dcpl's filter (*n of them), or -1 with a reason on stderr */
static int user_values(hid_t dcpl, unsigned *flags, unsigned *cd, size_t *n)
{
    pthread_once(&once, find_hdf5_calls);
    unsigned config = 0;
    *n = MAX_CD;
    if (!h5.get_filter || !h5.modify_filter || !h5.get_chunk || !h5.type_size ||
        !h5.type_class || !h5.type_order) {
        fprintf(stderr, "tensorpress HDF5 plugin: the program's HDF5 library lacks the "
                "calls a write needs (H5Pget_filter_by_id2 ...): write from Python\n");
        return -1;
    }
    if (h5.get_filter(dcpl, FILTER_ID, flags, n, cd, 0, NULL, &config) < 0)
        return -1;
    return 0;
}

/* H5Z_can_apply_func_t: 1 for float datasets whose codec this plugin writes, else -1
 * with the reason on stderr: HDF5 then refuses to create the dataset (0 would not do for
 * h5py, which adds filters as optional: HDF5 keeps an optional filter that cannot
 * apply, and stores every chunk it fails unfiltered) */
static int can_apply(hid_t dcpl, hid_t type, hid_t space)
{
    (void)space;
    unsigned flags, cd[MAX_CD];
    size_t n;
    if (user_values(dcpl, &flags, cd, &n))
        return -1;
    tp_err err = {0, ""};
    size_t size = h5.type_size(type);
    uint64_t word = n < USER_VALUES ? 0 : (uint64_t)cd[4] << 32 | cd[3];
    double bound;
    memcpy(&bound, &word, 8);
    if (n < USER_VALUES || (cd[0] != 1 && cd[0] != 2))
        tp_fail(&err, TP_E_FORMAT, "cd_values must begin 2,CODEC,MODE,LO,HI (SPEC.md, "
                "\"The HDF5 filter\"): e.g. 2,2,1,LO,HI for block with an abs bound");
    else if (cd[1] != 2 && cd[1] != 5)
        tp_fail(&err, TP_E_UNSUPPORTED, "the compiled plugin writes only the block codec "
                "(cd_values[1] = 2) and quant (5), not codec %u: write it from Python with "
                "tensorpress imported (tp.hdf5.filter, tensorpress compress --layout filter)",
                cd[1]);
    else if (cd[1] == 5 && cd[2] != 0)
        tp_fail(&err, TP_E_FORMAT, "quant takes no error bound: cd_values[2] = 0");
    else if (cd[1] == 2 && ((cd[2] != 1 && cd[2] != 2) || !(isfinite(bound) && bound >= 0)))
        tp_fail(&err, TP_E_FORMAT, "block needs an abs (cd_values[2] = 1) or pw_rel (2) "
                "bound, a finite double >= 0 in cd_values[3:5] (low word first)");
    else if (h5.type_class(type) != T_FLOAT || (size != 2 && size != 4 && size != 8))
        tp_fail(&err, TP_E_FORMAT, "the filter takes float16, float32 or float64 datasets");
    if (!err.code)
        return 1;
    fprintf(stderr, "tensorpress HDF5 plugin: %s\n", err.msg);
    return -1;
}

/* H5Z_set_local_func_t: append the element size, byte order, chunk rank and dimensions
 * to cd_values (layout 2, as formats/hdf5_filter.py's _set_local) */
static int set_local(hid_t dcpl, hid_t type, hid_t space)
{
    (void)space;
    unsigned flags, cd[MAX_CD];
    size_t n;
    hsize_t dims[32];
    if (user_values(dcpl, &flags, cd, &n) || n < USER_VALUES)
        return -1;
    int order = h5.type_order(type), rank = h5.get_chunk(dcpl, 32, dims);
    if (rank < 1 || (order != ORDER_LE && order != ORDER_BE)) {
        fprintf(stderr, "tensorpress HDF5 plugin: the dataset must be chunked, of little- or "
                "big-endian floats\n");
        return -1;
    }
    cd[0] = 2; /* always the current layout */
    cd[USER_VALUES] = (unsigned)h5.type_size(type);
    cd[USER_VALUES + 1] = order == ORDER_BE;
    cd[USER_VALUES + 2] = (unsigned)rank;
    for (int i = 0; i < rank; i++)
        cd[USER_VALUES + 3 + i] = (unsigned)dims[i];
    return h5.modify_filter(dcpl, FILTER_ID, flags, USER_VALUES + 3 + (size_t)rank, cd) < 0
               ? -1 : 1;
}

static const H5Z_class2_t FILTER_CLASS = {
    1, FILTER_ID, 1, 1,
    "tensorpress: error-bounded lossy (compiled plugin: reads zstd, block, int8, quant; "
    "writes block, quant)",
    can_apply, set_local, filter,
};

EXPORT H5PL_type_t H5PLget_plugin_type(void)
{
    return H5PL_TYPE_FILTER;
}

EXPORT const void *H5PLget_plugin_info(void)
{
    return &FILTER_CLASS;
}
