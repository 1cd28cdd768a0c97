/* The stream's JSON header: each field SPEC.md lists, checked as tensorpress's Python
 * reader checks it (formats/stream_header.py, and the codec's config as get_codec and
 * stream_codec take it); anything else malformed is refused. */
#include <math.h>
#include <string.h>

#include "json.h"

static const char *const DTYPES[] = {"|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2",
                                     "<u4", "<u8", "<f2", "<f4", "<f8", "bfloat16"};
static const size_t ITEMSIZE[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2};

static int bad(tp_err *err, const char *what)
{
    return tp_fail(err, TP_E_FORMAT, "invalid stream header: %s", what);
}

/* a real number (not a boolean) that is finite and >= 0 */
static int finite_count(const tp_json *j, uint32_t t, double *v)
{
    if (j->tok[t].type != TP_J_NUMBER)
        return 0;
    *v = tp_json_number(j, t);
    return isfinite(*v) && *v >= 0;
}

static int bound(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    if (j->tok[t].type == TP_J_NULL) {
        h->bound_mode = TP_BOUND_NONE;
        return 0;
    }
    if (j->tok[t].type != TP_J_OBJECT)
        return bad(err, "the bound is not an object or null");
    uint32_t mode = tp_json_get(j, t, "mode"), value = tp_json_get(j, t, "value");
    uint32_t tol = tp_json_get(j, t, "tolerance");
    if (mode && tp_json_str_eq(j, mode, "abs"))
        h->bound_mode = TP_BOUND_ABS;
    else if (mode && tp_json_str_eq(j, mode, "rel"))
        h->bound_mode = TP_BOUND_REL;
    else if (mode && tp_json_str_eq(j, mode, "pw_rel"))
        h->bound_mode = TP_BOUND_PW_REL;
    else
        return bad(err, "unknown error-bound mode");
    if (!value || !finite_count(j, value, &h->bound_value))
        return bad(err, "the bound's value is not a finite number >= 0");
    if (!tol || !finite_count(j, tol, &h->tolerance))
        return bad(err, "the bound's tolerance is not a finite number >= 0");
    if (h->bound_mode != TP_BOUND_REL && h->tolerance != h->bound_value)
        return bad(err, "an abs or pw_rel bound whose tolerance is not its value");
    return 0;
}

/* a zstd level: an integer (not a boolean) in -7..22 */
static int level_ok(const tp_json *j, uint32_t t)
{
    if (j->tok[t].type != TP_J_NUMBER || !j->tok[t].is_int)
        return 0;
    double v = tp_json_number(j, t);
    return v >= -7 && v <= 22;
}

static int stage(const tp_json *j, uint32_t t, tp_err *err)
{
    if (tp_json_str_eq(j, t, "zstd"))
        return 0; /* a stage named by its id alone */
    if (j->tok[t].type != TP_J_OBJECT)
        return bad(err, "a stage is not a stage config");
    uint32_t key = t + 1;
    for (uint32_t i = 0; i < j->tok[t].count; i++, key = j->tok[key + 1].next) {
        uint32_t v = key + 1;
        if (tp_json_str_eq(j, key, "id")) {
            if (!tp_json_str_eq(j, v, "zstd"))
                return bad(err, "unknown stage");
        } else if (tp_json_str_eq(j, key, "level")) {
            if (!level_ok(j, v))
                return bad(err, "a zstd stage's level is not an integer in -7..22");
        } else if (tp_json_str_eq(j, key, "checksum")) {
            if (j->tok[v].type != TP_J_TRUE && j->tok[v].type != TP_J_FALSE)
                return bad(err, "a zstd stage's checksum is not true or false");
        } else {
            return bad(err, "unknown parameter of a zstd stage");
        }
    }
    return tp_json_get(j, t, "id") ? 0 : bad(err, "a stage without an id");
}

static int stages(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    if (j->tok[t].type != TP_J_ARRAY)
        return bad(err, "the codec's stages are not a list");
    if (j->tok[t].count > TP_MAX_STAGES)
        return tp_fail(err, TP_E_UNSUPPORTED, "more than %d stages", TP_MAX_STAGES);
    uint32_t v = t + 1;
    for (uint32_t i = 0; i < j->tok[t].count; i++, v = j->tok[v].next) {
        int rc = stage(j, v, err);
        if (rc)
            return rc;
    }
    h->stages = (int)j->tok[t].count;
    return 0;
}

static const char *const QUANT_PARAMS[] = {"bits", "group", "stochastic", "seed", "hadamard"};

static int is_quant_param(const tp_json *j, uint32_t key)
{
    for (int i = 0; i < 5; i++)
        if (tp_json_str_eq(j, key, QUANT_PARAMS[i]))
            return 1;
    return 0;
}

/* a boolean parameter of quant: JSON true or false (QuantCodec refuses 0 and 1) */
static int quant_flag(const tp_json *j, uint32_t v, int *out)
{
    if (j->tok[v].type != TP_J_TRUE && j->tok[v].type != TP_J_FALSE)
        return 0;
    *out = j->tok[v].type == TP_J_TRUE;
    return 1;
}

/* quant's parameters (each key's last value, as Python's dict keeps it), checked as
 * QuantCodec's constructor checks them; absent ones take its defaults */
static int quant_params(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    uint32_t at[5];
    uint64_t bits = 4, group = 128, seed = 0;
    h->q_stochastic = h->q_hadamard = 0;
    for (int i = 0; i < 5; i++)
        at[i] = tp_json_get(j, t, QUANT_PARAMS[i]);
    if (at[0] && (!tp_json_count(j, at[0], &bits) || (bits != 2 && bits != 4 && bits != 8)))
        return bad(err, "quant bits is not 2, 4 or 8");
    if (at[1] && (!tp_json_count(j, at[1], &group) || group < 16 || group > 4096 ||
                  (group & (group - 1))))
        return bad(err, "quant group is not a power of two from 16 to 4096");
    if ((at[2] && !quant_flag(j, at[2], &h->q_stochastic)) ||
        (at[4] && !quant_flag(j, at[4], &h->q_hadamard)))
        return bad(err, "quant stochastic or hadamard is not true or false");
    if (at[3] && (!tp_json_count(j, at[3], &seed) || seed >= (1u << 31)))
        return bad(err, "quant seed is not an integer in [0, 2**31)");
    h->q_bits = (int)bits, h->q_group = (int)group, h->q_seed = (uint32_t)seed;
    return 0;
}

static const char *const SZ_PARAMS[] = {"predictor", "alpha", "beta", "radius", "level"};
static const char *const SZ_PREDICTORS[] = {
    "lorenzo", "linear", "cubic", "linear-rev", "cubic-rev", "md-linear", "md-cubic", "constant",
    "regression", "lattice", "fitted", "match", "pivot", "wavelet", "cdf97", "interp", "auto"};

static int is_param(const tp_json *j, uint32_t key, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (tp_json_str_eq(j, key, names[i]))
            return 1;
    return 0;
}

/* sz's alpha or beta: absent or null (0), or a number in 1..2^20 (1; Python's bool is an
 * int, so true is 1); -1 for anything else */
static int sz_tuning(const tp_json *j, uint32_t v)
{
    if (!v || j->tok[v].type == TP_J_NULL)
        return 0;
    double x = j->tok[v].type == TP_J_TRUE ? 1.0 : j->tok[v].type == TP_J_NUMBER
                                                      ? tp_json_number(j, v)
                                                      : 0.0;
    return x >= 1 && x <= 1048576.0 ? 1 : -1;
}

/* sz's parameters, checked as SZCodec's constructor checks them (absent: its defaults) */
static int sz_params(const tp_json *j, uint32_t t, tp_err *err)
{
    uint32_t at[5];
    for (int i = 0; i < 5; i++)
        at[i] = tp_json_get(j, t, SZ_PARAMS[i]);
    int names = (int)(sizeof SZ_PREDICTORS / sizeof *SZ_PREDICTORS);
    if (at[0] && (j->tok[at[0]].type != TP_J_STRING || !is_param(j, at[0], SZ_PREDICTORS, names)))
        return bad(err, "unknown sz predictor");
    int alpha = sz_tuning(j, at[1]), beta = sz_tuning(j, at[2]);
    if ((alpha == 0) != (beta == 0) || alpha < 0 || beta < 0)
        return bad(err, "sz alpha and beta are not both null or both numbers in 1..2**20");
    uint64_t radius = 32768;
    if (at[3] && (!tp_json_count(j, at[3], &radius) || radius < 2 || radius > 32768))
        return bad(err, "sz radius is not an integer in 2..32768");
    if (at[4] && j->tok[at[4]].type != TP_J_NULL && !level_ok(j, at[4]))
        return bad(err, "sz level is not null or an integer in -7..22");
    return 0;
}

/* block's parameters beyond entropy, checked as BlockCodec's constructor checks them:
 * stochastic true or false, seed an integer in [0, 2**31) whatever stochastic is, and
 * stochastic rounding under no pw_rel bound of the config's (one of the header's alone
 * is refused when a chunk is decoded, as Python refuses it: tp_block_decode) */
static int block_params(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    uint32_t flag = tp_json_get(j, t, "stochastic"), seed = tp_json_get(j, t, "seed");
    uint32_t pw = tp_json_get(j, t, "pw_rel");
    uint64_t s = 0;
    h->b_stochastic = 0;
    if (flag && !quant_flag(j, flag, &h->b_stochastic))
        return bad(err, "block stochastic is not true or false");
    if (seed && (!tp_json_count(j, seed, &s) || s >= (1u << 31)))
        return bad(err, "block seed is not an integer in [0, 2**31)");
    if (h->b_stochastic && pw && j->tok[pw].type != TP_J_NULL)
        return bad(err, "block stochastic rounding under a pw_rel bound");
    return 0;
}

/* one parameter key=v of the codec config (not its id); *bounds counts bound keys */
static int codec_param(const tp_json *j, uint32_t key, tp_header *h, int *bounds, tp_err *err)
{
    uint32_t v = key + 1;
    if (tp_json_str_eq(j, key, "stages"))
        return stages(j, v, h, err);
    if (tp_json_str_eq(j, key, "abs") || tp_json_str_eq(j, key, "rel") ||
        tp_json_str_eq(j, key, "pw_rel")) {
        double x;
        if (j->tok[v].type == TP_J_NULL)
            return 0; /* as not given */
        if (h->codec == TP_ZSTD || h->codec == TP_QUANT || !finite_count(j, v, &x))
            return bad(err, "the codec config's bound is not one the codec takes");
        if (h->codec == TP_INT8 && tp_json_str_eq(j, key, "pw_rel"))
            return bad(err, "codec 'int8' takes no pw_rel bound");
        ++*bounds;
        return 0;
    }
    if (h->codec == TP_ZSTD && tp_json_str_eq(j, key, "level"))
        return level_ok(j, v) ? 0 : bad(err, "zstd level is not an integer in -7..22");
    if (h->codec == TP_ZSTD && tp_json_str_eq(j, key, "shuffle")) {
        h->shuffle = tp_json_truthy(j, v);
        return 0;
    }
    if (h->codec == TP_QUANT && is_quant_param(j, key))
        return 0; /* checked once the config is read (quant_params) */
    if (h->codec == TP_SZ && is_param(j, key, SZ_PARAMS, 5))
        return 0; /* checked once the config is read (sz_params) */
    if (h->codec == TP_BLOCK && tp_json_str_eq(j, key, "entropy")) {
        if (tp_json_str_eq(j, v, "none") || tp_json_str_eq(j, v, "zstd"))
            return 0; /* a reader decodes mode 3 whatever the config says */
        return bad(err, "block entropy is not 'none' or 'zstd'");
    }
    if (h->codec == TP_BLOCK && (tp_json_str_eq(j, key, "stochastic") ||
                                 tp_json_str_eq(j, key, "seed")))
        return 0; /* checked once the config is read (block_params) */
    return bad(err, "unknown parameter in the codec config");
}

/* the codec config: its id, parameters and stages, as get_codec(config) takes them */
static int codec(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    uint32_t id = j->tok[t].type == TP_J_OBJECT ? tp_json_get(j, t, "id") : 0;
    if (!id || j->tok[id].type != TP_J_STRING)
        return bad(err, "the codec config has no string 'id'");
    if (tp_json_str_eq(j, id, "zstd"))
        h->codec = TP_ZSTD, h->shuffle = 1;
    else if (tp_json_str_eq(j, id, "block"))
        h->codec = TP_BLOCK;
    else if (tp_json_str_eq(j, id, "int8"))
        h->codec = TP_INT8;
    else if (tp_json_str_eq(j, id, "quant"))
        h->codec = TP_QUANT;
    else if (tp_json_str_eq(j, id, "sz"))
        h->codec = TP_SZ;
    else
        return tp_fail(err, TP_E_UNKNOWN, "the stream uses a codec tensorpress does not know");
    int bounds = 0, rc;
    uint32_t key = t + 1;
    for (uint32_t i = 0; i < j->tok[t].count; i++, key = j->tok[key + 1].next)
        if (!tp_json_str_eq(j, key, "id") && (rc = codec_param(j, key, h, &bounds, err)) != 0)
            return rc;
    if (bounds > 1)
        return bad(err, "the codec config gives more than one bound");
    if (h->codec == TP_SZ)
        return sz_params(j, t, err);
    if (h->codec == TP_BLOCK)
        return block_params(j, t, h, err);
    return h->codec == TP_QUANT ? quant_params(j, t, h, err) : 0;
}

static int shape(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    if (j->tok[t].type != TP_J_ARRAY)
        return bad(err, "shape is not a list of sizes");
    if (j->tok[t].count > TP_MAX_RANK)
        return tp_fail(err, TP_E_UNSUPPORTED, "more than %d dimensions", TP_MAX_RANK);
    h->rank = (int)j->tok[t].count;
    uint32_t v = t + 1;
    for (int i = 0; i < h->rank; i++, v = j->tok[v].next)
        if (!tp_json_count(j, v, &h->shape[i]))
            return bad(err, "shape is not a list of sizes");
    return 0;
}

static int dtype(const tp_json *j, uint32_t t, tp_header *h, tp_err *err)
{
    for (int d = 0; d < (int)(sizeof DTYPES / sizeof *DTYPES); d++)
        if (tp_json_str_eq(j, t, DTYPES[d])) {
            h->dtype = d;
            h->itemsize = ITEMSIZE[d];
            return 0;
        }
    return bad(err, "dtype is not one a stream holds");
}

static int fields(const tp_json *j, tp_header *h, tp_err *err)
{
    static const char *const need[] = {"dtype", "shape", "order", "codec", "bound",
                                       "chunk_rows"};
    uint32_t at[6];
    if (j->tok[0].type != TP_J_OBJECT)
        return bad(err, "not a JSON object");
    for (int k = 0; k < 6; k++)
        if (!(at[k] = tp_json_get(j, 0, need[k])))
            return tp_fail(err, TP_E_FORMAT, "invalid stream header: no %s", need[k]);
    int rc;
    if ((rc = dtype(j, at[0], h, err)) || (rc = shape(j, at[1], h, err)))
        return rc;
    if (!tp_json_count(j, at[5], &h->chunk_rows) || h->chunk_rows < 1)
        return bad(err, "chunk_rows is not a positive integer");
    if (!tp_json_str_eq(j, at[2], "C") && !tp_json_str_eq(j, at[2], "F"))
        return bad(err, "order is not 'C' or 'F'");
    if ((rc = codec(j, at[3], h, err)) || (rc = bound(j, at[4], h, err)))
        return rc;
    return tp_missing_fields(j, h, err); /* writer, target: informative, not read */
}

int tp_header_fields(const uint8_t *text, size_t n, tp_header *h, tp_err *err)
{
    tp_json j;
    int rc = tp_json_parse(text, n, &j, err);
    if (rc)
        return rc;
    rc = fields(&j, h, err);
    tp_json_free(&j);
    return rc;
}
