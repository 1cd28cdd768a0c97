/* A small strict JSON reader for the stream header: RFC 8259 plus the NaN, Infinity and
 * -Infinity that Python's json module reads and writes. Values become a flat token array
 * (an object's tokens: key, value, key, value, ...), nesting at most TP_JSON_DEPTH. */
#ifndef TP_JSON_H
#define TP_JSON_H

#include "tp_decode.h"

#define TP_JSON_DEPTH 64
enum { TP_J_OBJECT, TP_J_ARRAY, TP_J_STRING, TP_J_NUMBER, TP_J_TRUE, TP_J_FALSE, TP_J_NULL };

typedef struct tp_jtok {
    uint8_t type;
    uint8_t is_int;   /* a number without fraction or exponent */
    uint32_t count;   /* object: key-value pairs; array: values */
    uint32_t next;    /* the token after this value and everything inside it */
    size_t start, end; /* the text: inside the quotes for strings */
} tp_jtok;

typedef struct tp_json {
    const uint8_t *text;
    tp_jtok *tok; /* tok[0]: the top-level value */
    size_t n, cap;
} tp_json;

int tp_json_parse(const uint8_t *text, size_t n, tp_json *j, tp_err *err);
void tp_json_free(tp_json *j);
/* the string token t, unescaped, equals the ASCII literal lit */
int tp_json_str_eq(const tp_json *j, uint32_t t, const char *lit);
/* a string token of 1 to 16 lowercase hex digits (escapes undone): 1 and *v its value;
 * else 0 */
int tp_json_hex(const tp_json *j, uint32_t t, uint64_t *v);
/* the number token t's value (+-inf past double's range, NaN for NaN) */
double tp_json_number(const tp_json *j, uint32_t t);
/* an integer token >= 0 that fits 63 bits: 1 and *v; else 0 */
int tp_json_count(const tp_json *j, uint32_t t, uint64_t *v);
/* Python's truth value of the token (false, null, 0, "", [], {} are false) */
int tp_json_truthy(const tp_json *j, uint32_t t);
/* the value of key lit in object token obj (the last one, as Python's dict keeps), or 0 */
uint32_t tp_json_get(const tp_json *j, uint32_t obj, const char *lit);

/* the stream header's missing and valid fields, checked as formats/missing.py checks
 * them (missing.c); h->version and h->dtype already read */
int tp_missing_fields(const tp_json *j, tp_header *h, tp_err *err);

#endif
