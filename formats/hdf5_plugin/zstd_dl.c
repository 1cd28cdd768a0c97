/* zstd through the system's libzstd.so.1, loaded at run time.
 *
 * Why not vendored or linked: libzstd's run-time library is on practically every Linux
 * system (systemd, the kernel's tools and package managers need it) while its headers
 * and static library often are not; loading it at first use needs neither at build
 * time, keeps the plugin one small file, and a missing libzstd fails a chunk with a
 * clear message instead of keeping the whole plugin from loading. Only the stable API
 * of zstd 1.3 and later is used, declared here. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "tp_decode.h"

typedef struct { const void *src; size_t size, pos; } zin;
typedef struct { void *dst; size_t size, pos; } zout;

static struct {
    unsigned long long (*content_size)(const void *, size_t);
    void *(*create)(void);
    size_t (*free_ctx)(void *);
    size_t (*stream)(void *, zout *, zin *);
    unsigned (*is_error)(size_t);
    const char *(*error_name)(size_t);
    const char *why; /* why libzstd is not usable, or NULL */
} z;
static pthread_once_t once = PTHREAD_ONCE_INIT;

#define CONTENTSIZE_UNKNOWN (0ULL - 1)
#define CONTENTSIZE_ERROR (0ULL - 2)

static void load(void)
{
    static const char *const names[] = {"libzstd.so.1", "libzstd.so", "libzstd.1.dylib"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        z.why = "libzstd.so.1 was not found: install zstd's library (Debian, Ubuntu: "
                "libzstd1; Fedora: libzstd) to read tensorpress datasets";
        return;
    }
    *(void **)&z.content_size = dlsym(lib, "ZSTD_getFrameContentSize");
    *(void **)&z.create = dlsym(lib, "ZSTD_createDCtx");
    *(void **)&z.free_ctx = dlsym(lib, "ZSTD_freeDCtx");
    *(void **)&z.stream = dlsym(lib, "ZSTD_decompressStream");
    *(void **)&z.is_error = dlsym(lib, "ZSTD_isError");
    *(void **)&z.error_name = dlsym(lib, "ZSTD_getErrorName");
    if (!z.content_size || !z.create || !z.free_ctx || !z.stream || !z.is_error ||
        !z.error_name)
        z.why = "the libzstd found is older than zstd 1.3: install a newer one";
}

/* as the zstandard module's decompress (the Python reader): the first frame only, its
 * declared size checked against max before anything is allocated */
int tp_zstd_decompress(const uint8_t *src, size_t n, size_t max, uint8_t **out,
                       size_t *out_len, tp_err *err)
{
    pthread_once(&once, load);
    if (z.why)
        return tp_fail(err, TP_E_UNSUPPORTED, "%s", z.why);
    unsigned long long declared = z.content_size(src, n);
    if (declared == CONTENTSIZE_ERROR)
        return tp_fail(err, TP_E_FORMAT, "corrupted zstd stream: no frame header");
    if (declared != CONTENTSIZE_UNKNOWN && declared > max)
        return tp_fail(err, TP_E_FORMAT, "corrupted zstd stream: a frame of %llu bytes where "
                       "at most %zu can be", declared, max);
    size_t cap = declared == CONTENTSIZE_UNKNOWN ? max : (size_t)declared;
    *out = malloc(cap ? cap : 1);
    void *ctx = z.create();
    if (!*out || !ctx) {
        free(*out);
        if (ctx)
            z.free_ctx(ctx);
        return tp_fail(err, TP_E_MEMORY, "out of memory decompressing %zu bytes", cap);
    }
    zin in = {src, n, 0};
    zout o = {*out, cap, 0};
    size_t left = cap == 0 && declared == 0 ? 0 : z.stream(ctx, &o, &in);
    z.free_ctx(ctx);
    const char *why = z.is_error(left) ? z.error_name(left)
                      : left ? "did not decompress full frame"
                      : declared != CONTENTSIZE_UNKNOWN && o.pos != declared
                          ? "fewer bytes than its header declares" : NULL;
    if (why) {
        free(*out);
        *out = NULL;
        return tp_fail(err, TP_E_FORMAT, "corrupted zstd stream: %s", why);
    }
    *out_len = o.pos;
    return 0;
}
