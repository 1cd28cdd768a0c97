/* JSON reader for the stream header (json.h). */
#define _GNU_SOURCE /* strtod_l: numbers read in the C locale whatever the host program set */
#include "json.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif

typedef struct parser {
    const uint8_t *s;
    size_t n, pos;
    tp_json *j;
    tp_err *err;
} parser;

static int value(parser *p, int depth);

static int bad(parser *p, const char *what)
{
    return tp_fail(p->err, TP_E_FORMAT, "invalid stream header: not JSON (%s at byte %zu)",
                   what, p->pos);
}

static void skip_ws(parser *p)
{
    while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static long add_token(parser *p, int type)
{
    tp_json *j = p->j;
    if (j->n == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 32;
        if (cap > (1u << 24)) /* 16 M values: far past any header tensorpress writes */
            return tp_fail(p->err, TP_E_FORMAT, "invalid stream header: too many values");
        tp_jtok *t = realloc(j->tok, cap * sizeof *t);
        if (!t)
            return tp_fail(p->err, TP_E_MEMORY, "out of memory reading the header");
        j->tok = t;
        j->cap = cap;
    }
    memset(&j->tok[j->n], 0, sizeof j->tok[0]);
    j->tok[j->n].type = (uint8_t)type;
    j->tok[j->n].start = p->pos;
    return (long)j->n++;
}

/* bytes of the UTF-8 sequence at s[0:n] (surrogates allowed, as Python's
 * "surrogatepass" decoding of a header reads them), or 0 when it is not one */
static size_t utf8_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t k = 1; k < len; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 0;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F))
        return 0; /* overlong, or past U+10FFFF */
    return len;
}

static int hex4(const uint8_t *s)
{
    for (int k = 0; k < 4; k++) {
        uint8_t c = s[k];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return 0;
    }
    return 1;
}

static int string(parser *p)
{
    long t = add_token(p, TP_J_STRING);
    if (t < 0)
        return (int)t;
    p->pos++; /* the opening quote */
    p->j->tok[t].start = p->pos;
    while (p->pos < p->n) {
        uint8_t c = p->s[p->pos];
        if (c == '"') {
            p->j->tok[t].end = p->pos++;
            p->j->tok[t].next = (uint32_t)p->j->n;
            return 0;
        }
        if (c < 0x20)
            return bad(p, "control character in a string");
        if (c == '\\') {
            if (p->pos + 1 >= p->n)
                break;
            uint8_t e = p->s[p->pos + 1];
            if (e == 'u') {
                if (p->pos + 6 > p->n || !hex4(p->s + p->pos + 2))
                    return bad(p, "bad \\u escape");
                p->pos += 6;
            } else if (strchr("\"\\/bfnrt", e) && e) {
                p->pos += 2;
            } else {
                return bad(p, "bad escape");
            }
            continue;
        }
        size_t len = utf8_len(p->s + p->pos, p->n - p->pos);
        if (!len)
            return bad(p, "not UTF-8");
        p->pos += len;
    }
    return bad(p, "unterminated string");
}

static size_t digits(parser *p)
{
    size_t k = 0;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
        p->pos++, k++;
    return k;
}

static int literal(parser *p, const char *word, int type)
{
    size_t len = strlen(word);
    if (p->n - p->pos < len || memcmp(p->s + p->pos, word, len) != 0)
        return bad(p, "unexpected character");
    long t = add_token(p, type);
    if (t < 0)
        return (int)t;
    p->pos += len;
    p->j->tok[t].end = p->pos;
    p->j->tok[t].next = (uint32_t)p->j->n;
    return 0;
}

static int number(parser *p)
{
    if (p->s[p->pos] == 'N')
        return literal(p, "NaN", TP_J_NUMBER);
    if (p->s[p->pos] == 'I')
        return literal(p, "Infinity", TP_J_NUMBER);
    if (p->n - p->pos >= 9 && memcmp(p->s + p->pos, "-Infinity", 9) == 0)
        return literal(p, "-Infinity", TP_J_NUMBER);
    long t = add_token(p, TP_J_NUMBER);
    if (t < 0)
        return (int)t;
    int is_int = 1;
    if (p->s[p->pos] == '-')
        p->pos++;
    if (p->pos < p->n && p->s[p->pos] == '0')
        p->pos++; /* a leading 0 stands alone */
    else if (!digits(p))
        return bad(p, "bad number");
    if (p->pos < p->n && p->s[p->pos] == '.') {
        p->pos++;
        is_int = 0;
        if (!digits(p))
            return bad(p, "bad number");
    }
    if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        is_int = 0;
        if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
            p->pos++;
        if (!digits(p))
            return bad(p, "bad number");
    }
    p->j->tok[t].is_int = (uint8_t)is_int;
    p->j->tok[t].end = p->pos;
    p->j->tok[t].next = (uint32_t)p->j->n;
    return 0;
}

/* an object (close '}') or array (close ']') whose opening bracket is at pos */
static int container(parser *p, int type, int depth)
{
    if (depth >= TP_JSON_DEPTH)
        return bad(p, "nested too deep");
    long t = add_token(p, type);
    if (t < 0)
        return (int)t;
    uint8_t close = type == TP_J_OBJECT ? '}' : ']';
    p->pos++;
    skip_ws(p);
    uint32_t count = 0;
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
    } else {
        for (;;) {
            int rc;
            skip_ws(p);
            if (type == TP_J_OBJECT) {
                if (p->pos >= p->n || p->s[p->pos] != '"')
                    return bad(p, "expected a key");
                if ((rc = string(p)) != 0)
                    return rc;
                skip_ws(p);
                if (p->pos >= p->n || p->s[p->pos] != ':')
                    return bad(p, "expected ':'");
                p->pos++;
            }
            if ((rc = value(p, depth + 1)) != 0)
                return rc;
            count++;
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == ',') {
                p->pos++;
                continue;
            }
            if (p->pos < p->n && p->s[p->pos] == close) {
                p->pos++;
                break;
            }
            return bad(p, "expected ',' or a closing bracket");
        }
    }
    p->j->tok[t].count = count;
    p->j->tok[t].end = p->pos;
    p->j->tok[t].next = (uint32_t)p->j->n;
    return 0;
}

static int value(parser *p, int depth)
{
    skip_ws(p);
    if (p->pos >= p->n)
        return bad(p, "unexpected end");
    switch (p->s[p->pos]) {
    case '{': return container(p, TP_J_OBJECT, depth);
    case '[': return container(p, TP_J_ARRAY, depth);
    case '"': return string(p);
    case 't': return literal(p, "true", TP_J_TRUE);
    case 'f': return literal(p, "false", TP_J_FALSE);
    case 'n': return literal(p, "null", TP_J_NULL);
    default: return number(p);
    }
}

int tp_json_parse(const uint8_t *text, size_t n, tp_json *j, tp_err *err)
{
    memset(j, 0, sizeof *j);
    j->text = text;
    parser p = {text, n, 0, j, err};
    int rc = value(&p, 0);
    if (rc == 0) {
        skip_ws(&p);
        if (p.pos != n)
            rc = bad(&p, "extra data");
    }
    if (rc != 0)
        tp_json_free(j);
    return rc;
}

void tp_json_free(tp_json *j)
{
    free(j->tok);
    j->tok = NULL;
    j->n = j->cap = 0;
}

/* the next character of string text s[*i:end], unescaped, as a code point */
static long next_char(const uint8_t *s, size_t *i)
{
    uint8_t c = s[*i];
    if (c != '\\') {
        (*i)++;
        return c; /* bytes of non-ASCII characters never equal an ASCII literal */
    }
    uint8_t e = s[*i + 1];
    *i += 2;
    switch (e) {
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'u': {
        char hex[5] = {(char)s[*i], (char)s[*i + 1], (char)s[*i + 2], (char)s[*i + 3], 0};
        *i += 4;
        return strtol(hex, NULL, 16);
    }
    default: return e; /* " \ / */
    }
}

int tp_json_str_eq(const tp_json *j, uint32_t t, const char *lit)
{
    const tp_jtok *k = &j->tok[t];
    if (k->type != TP_J_STRING)
        return 0;
    size_t i = k->start;
    for (; *lit; lit++) {
        if (i >= k->end || next_char(j->text, &i) != (uint8_t)*lit)
            return 0;
    }
    return i == k->end;
}

int tp_json_hex(const tp_json *j, uint32_t t, uint64_t *v)
{
    const tp_jtok *k = &j->tok[t];
    if (k->type != TP_J_STRING || k->end == k->start)
        return 0;
    uint64_t x = 0;
    int n = 0;
    for (size_t i = k->start; i < k->end; n++) {
        long c = next_char(j->text, &i);
        int d = c >= '0' && c <= '9' ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
                                                                             : -1;
        if (d < 0 || n == 16)
            return 0;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 1;
}

static locale_t c_locale;
static pthread_once_t c_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

double tp_json_number(const tp_json *j, uint32_t t)
{
    const tp_jtok *k = &j->tok[t];
    char buf[64];
    size_t len = k->end - k->start;
    const char *s = (const char *)j->text + k->start;
    if (len == 3 && memcmp(s, "NaN", 3) == 0)
        return NAN;
    if (len >= 8 && memcmp(s + len - 8, "Infinity", 8) == 0)
        return s[0] == '-' ? -INFINITY : INFINITY;
    char *heap = NULL, *text = buf;
    if (len >= sizeof buf) {
        if (!(heap = malloc(len + 1)))
            return NAN; /* read as not finite: refused */
        text = heap;
    }
    memcpy(text, s, len);
    text[len] = 0;
    pthread_once(&c_once, make_c_locale);
    double v = c_locale ? strtod_l(text, NULL, c_locale) : strtod(text, NULL);
    free(heap);
    return v;
}

int tp_json_count(const tp_json *j, uint32_t t, uint64_t *v)
{
    const tp_jtok *k = &j->tok[t];
    if (k->type != TP_J_NUMBER || !k->is_int)
        return 0;
    size_t i = k->start;
    if (j->text[i] == '-') { /* only -0 is a count */
        for (i++; i < k->end; i++)
            if (j->text[i] != '0')
                return 0;
        *v = 0;
        return 1;
    }
    uint64_t x = 0;
    for (; i < k->end; i++) {
        unsigned d = j->text[i] - '0';
        if (x > (((uint64_t)1 << 63) - 1 - d) / 10)
            return 0;
        x = 10 * x + d;
    }
    *v = x;
    return 1;
}

int tp_json_truthy(const tp_json *j, uint32_t t)
{
    const tp_jtok *k = &j->tok[t];
    switch (k->type) {
    case TP_J_TRUE: return 1;
    case TP_J_FALSE:
    case TP_J_NULL: return 0;
    case TP_J_STRING: return k->end > k->start;
    case TP_J_NUMBER: return tp_json_number(j, t) != 0.0; /* NaN is true */
    default: return k->count > 0;
    }
}

uint32_t tp_json_get(const tp_json *j, uint32_t obj, const char *lit)
{
    uint32_t found = 0, key = obj + 1;
    for (uint32_t i = 0; i < j->tok[obj].count; i++) {
        if (tp_json_str_eq(j, key, lit))
            found = key + 1;
        key = j->tok[key + 1].next;
    }
    return found;
}
