/*
 * proto: the bounded msgpack cursor (internal.h). It reads values straight
 * from a complete frame body, never allocates, and checks every declared
 * length against the bytes that remain before anything trusts it: an array
 * of n elements needs at least n more bytes, a map of n pairs 2n, a string
 * its length. Nesting is counted on container entry.
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

struct mp_val {
    enum mp_type t;
    bool b;
    uint64_t u;
    int64_t i;
    double f;
    const uint8_t *s;
    uint32_t len; /* str/bin/ext bytes, array elements, map pairs */
};

const char *mp_type_name(enum mp_type t)
{
    static const char *const names[] = {
        [MP_NIL] = "nil",
        [MP_BOOL] = "bool",
        [MP_UINT] = "unsigned integer",
        [MP_INT] = "negative integer",
        [MP_FLOAT] = "float",
        [MP_STR] = "str",
        [MP_BIN] = "bin",
        [MP_ARRAY] = "array",
        [MP_MAP] = "map",
        [MP_EXT] = "ext",
        [MP_INVALID] = "the invalid byte 0xc1",
        [MP_EOF] = "the end of the frame",
    };
    return names[t];
}

static int errf(struct mp *m, int code, const char *what, const char *problem)
{
    return vks_error_set(m->err, code, "field `%s`: %s", what, problem);
}

static int truncated(struct mp *m, const char *what)
{
    return vks_error_set(m->err, -VKS_E_BAD_FRAME,
                         "field `%s`: the frame ends inside this value (its length prefix and "
                         "its msgpack content disagree): send complete msgpack",
                         what);
}

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static int need(struct mp *m, size_t n, const char *what)
{
    if ((size_t)(m->end - m->p) < n)
        return truncated(m, what);
    return 0;
}

static int read_len(struct mp *m, unsigned n, uint32_t *len, const char *what)
{
    int rc = need(m, n, what);
    if (rc < 0)
        return rc;
    *len = (uint32_t)be(m->p, n);
    m->p += n;
    return 0;
}

static int read_scalar(struct mp *m, uint8_t c, struct mp_val *v, const char *what)
{
    static const unsigned sizes[] = {1, 2, 4, 8};
    if (c == 0xca || c == 0xcb) {
        unsigned n = c == 0xca ? 4 : 8;
        int rc = need(m, n, what);
        if (rc < 0)
            return rc;
        uint64_t bits = be(m->p, n);
        m->p += n;
        v->t = MP_FLOAT;
        if (n == 4) {
            uint32_t b32 = (uint32_t)bits;
            float fl;
            memcpy(&fl, &b32, sizeof(fl));
            v->f = fl;
        } else {
            memcpy(&v->f, &bits, sizeof(v->f));
        }
        return 0;
    }
    unsigned n = sizes[(c - 0xcc) & 3];
    int rc = need(m, n, what);
    if (rc < 0)
        return rc;
    uint64_t raw = be(m->p, n);
    m->p += n;
    if (c <= 0xcf) {
        v->t = MP_UINT;
        v->u = raw;
        return 0;
    }
    /* Signed; non-negative values count as unsigned. */
    int64_t s = n == 1 ? (int8_t)raw : n == 2 ? (int16_t)raw : n == 4 ? (int32_t)raw : (int64_t)raw;
    if (s >= 0) {
        v->t = MP_UINT;
        v->u = (uint64_t)s;
    } else {
        v->t = MP_INT;
        v->i = s;
    }
    return 0;
}

/* Reads the next value's header: scalars whole, str/bin/ext with their bytes
 * (bounds-checked), containers as a count (elements not consumed). */
static int next(struct mp *m, struct mp_val *v, const char *what)
{
    memset(v, 0, sizeof(*v));
    if (m->p >= m->end) {
        v->t = MP_EOF;
        return truncated(m, what);
    }
    uint8_t c = *m->p++;
    int rc = 0;
    if (c <= 0x7f) {
        v->t = MP_UINT;
        v->u = c;
    } else if (c >= 0xe0) {
        v->t = MP_INT;
        v->i = (int8_t)c;
    } else if (c <= 0x8f) {
        v->t = MP_MAP;
        v->len = c & 0x0f;
    } else if (c <= 0x9f) {
        v->t = MP_ARRAY;
        v->len = c & 0x0f;
    } else if (c <= 0xbf) {
        v->t = MP_STR;
        v->len = c & 0x1f;
    } else if (c == 0xc0) {
        v->t = MP_NIL;
    } else if (c == 0xc1) {
        v->t = MP_INVALID;
        return vks_error_set(m->err, -VKS_E_BAD_FRAME,
                             "field `%s`: byte 0xc1 is not msgpack: send valid msgpack", what);
    } else if (c == 0xc2 || c == 0xc3) {
        v->t = MP_BOOL;
        v->b = c == 0xc3;
    } else if (c >= 0xc4 && c <= 0xc6) {
        v->t = MP_BIN;
        rc = read_len(m, 1u << (c - 0xc4), &v->len, what);
    } else if (c >= 0xc7 && c <= 0xc9) {
        v->t = MP_EXT;
        rc = read_len(m, 1u << (c - 0xc7), &v->len, what);
        v->len += 1; /* the ext type byte */
    } else if (c >= 0xca && c <= 0xd3) {
        rc = read_scalar(m, c, v, what);
    } else if (c >= 0xd4 && c <= 0xd8) {
        v->t = MP_EXT;
        v->len = (1u << (c - 0xd4)) + 1;
    } else if (c >= 0xd9 && c <= 0xdb) {
        v->t = MP_STR;
        rc = read_len(m, 1u << (c - 0xd9), &v->len, what);
    } else if (c == 0xdc || c == 0xdd) {
        v->t = MP_ARRAY;
        rc = read_len(m, c == 0xdc ? 2 : 4, &v->len, what);
    } else {
        v->t = MP_MAP;
        rc = read_len(m, c == 0xde ? 2 : 4, &v->len, what);
    }
    if (rc < 0)
        return rc;
    if (v->t == MP_STR || v->t == MP_BIN || v->t == MP_EXT) {
        if ((size_t)(m->end - m->p) < v->len)
            return truncated(m, what);
        v->s = m->p;
        m->p += v->len;
    }
    return 0;
}

enum mp_type mp_peek(const struct mp *m)
{
    struct mp copy = *m;
    struct mp_val v;
    copy.err = NULL;
    if (next(&copy, &v, "") < 0)
        return v.t == MP_INVALID ? MP_INVALID : MP_EOF;
    return v.t;
}

static int wrong_type(struct mp *m, const struct mp_val *v, const char *want, const char *what)
{
    return vks_error_set(m->err, -VKS_E_BAD_TYPE, "field `%s`: expected %s, got %s", what, want,
                         mp_type_name(v->t));
}

int mp_read_uint(struct mp *m, uint64_t max, uint64_t *out, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (v.t == MP_INT)
        return vks_error_set(m->err, -VKS_E_BAD_VALUE,
                             "field `%s`: %lld is negative, expected an unsigned integer", what,
                             (long long)v.i);
    if (v.t != MP_UINT)
        return wrong_type(m, &v, "an unsigned integer", what);
    if (v.u > max)
        return vks_error_set(m->err, -VKS_E_BAD_VALUE, "field `%s`: %llu is over the maximum %llu",
                             what, (unsigned long long)v.u, (unsigned long long)max);
    *out = v.u;
    return 0;
}

int mp_read_u32(struct mp *m, uint32_t *out, const char *what)
{
    uint64_t v;
    int rc = mp_read_uint(m, UINT32_MAX, &v, what);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

int mp_read_bool(struct mp *m, bool *out, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (v.t != MP_BOOL)
        return wrong_type(m, &v, "a bool", what);
    *out = v.b;
    return 0;
}

int mp_read_number(struct mp *m, bool *is_float, uint64_t *u, double *f, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (v.t == MP_UINT) {
        *is_float = false;
        *u = v.u;
        *f = (double)v.u;
        return 0;
    }
    if (v.t == MP_FLOAT) {
        *is_float = true;
        *f = v.f;
        *u = v.f > 0 && v.f < 18446744073709551615.0 ? (uint64_t)v.f : 0;
        return 0;
    }
    return wrong_type(m, &v, "a number", what);
}

int mp_read_raw(struct mp *m, bool allow_bin, bool allow_str, uint32_t limit, const uint8_t **s,
                uint32_t *len, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (!((v.t == MP_BIN && allow_bin) || (v.t == MP_STR && allow_str)))
        return wrong_type(m, &v, allow_bin ? (allow_str ? "bin or str" : "bin") : "str", what);
    if (v.len > limit)
        return vks_error_set(m->err, -VKS_E_LIMIT,
                             "field `%s`: %u bytes is over the limit of %u bytes", what, v.len,
                             limit);
    *s = v.s;
    *len = v.len;
    return 0;
}

int mp_read_cstr(struct mp *m, struct proto_mem *mem, uint32_t limit, const char **s,
                 const char *what)
{
    const uint8_t *p;
    uint32_t len;
    int rc = mp_read_raw(m, false, true, limit, &p, &len, what);
    if (rc < 0)
        return rc;
    if (memchr(p, '\0', len) != NULL)
        return errf(m, -VKS_E_BAD_VALUE, what, "contains a NUL byte, which this field cannot");
    *s = proto_mem_strndup(mem, (const char *)p, len);
    if (*s == NULL)
        return vks_error_set(m->err, -ENOMEM, "out of memory decoding field `%s`", what);
    return 0;
}

int mp_read_fp(struct mp *m, uint8_t fp[PROTO_FP_LEN], const char *what)
{
    const uint8_t *p;
    uint32_t len;
    int rc = mp_read_raw(m, true, true, UINT32_MAX, &p, &len, what);
    if (rc < 0)
        return rc;
    if (len != PROTO_FP_LEN)
        return vks_error_set(m->err, -VKS_E_BAD_VALUE,
                             "field `%s`: a fingerprint is %u bytes (bin), got %u", what,
                             PROTO_FP_LEN, len);
    memcpy(fp, p, PROTO_FP_LEN);
    return 0;
}

static int enter(struct mp *m, const struct mp_val *v, uint32_t limit, int limit_code,
                 const char *what)
{
    size_t min_bytes = v->t == MP_MAP ? 2 * (size_t)v->len : v->len;
    if (m->depth + 1 > m->lim->max_depth)
        return vks_error_set(m->err, -VKS_E_DEPTH,
                             "field `%s`: msgpack nesting deeper than %u levels", what,
                             m->lim->max_depth);
    if (v->len > limit)
        return vks_error_set(m->err, limit_code, "field `%s`: %u %s is over the limit of %u", what,
                             v->len, v->t == MP_MAP ? "entries" : "elements", limit);
    if ((size_t)(m->end - m->p) < min_bytes)
        return truncated(m, what);
    m->depth++;
    return 0;
}

int mp_read_array(struct mp *m, uint32_t limit, uint32_t *n, const char *what)
{
    return mp_read_array_code(m, limit, -VKS_E_LIMIT, n, what);
}

int mp_read_array_code(struct mp *m, uint32_t limit, int limit_code, uint32_t *n, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (v.t != MP_ARRAY)
        return wrong_type(m, &v, "an array", what);
    rc = enter(m, &v, limit, limit_code, what);
    if (rc < 0)
        return rc;
    *n = v.len;
    return 0;
}

int mp_read_map(struct mp *m, uint32_t limit, uint32_t *n, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (v.t != MP_MAP)
        return wrong_type(m, &v, "a map", what);
    rc = enter(m, &v, limit, -VKS_E_LIMIT, what);
    if (rc < 0)
        return rc;
    *n = v.len;
    return 0;
}

void mp_leave(struct mp *m)
{
    m->depth--;
}

int mp_skip(struct mp *m, const char *what)
{
    struct mp_val v;
    int rc = next(m, &v, what);
    if (rc < 0)
        return rc;
    if (v.t == MP_STR || v.t == MP_BIN) {
        if (v.len > m->lim->max_str)
            return vks_error_set(m->err, -VKS_E_LIMIT,
                                 "field `%s`: %u bytes is over the limit of %u bytes", what, v.len,
                                 m->lim->max_str);
        return 0;
    }
    if (v.t != MP_ARRAY && v.t != MP_MAP)
        return 0;
    rc = enter(m, &v, m->lim->max_array, -VKS_E_LIMIT, what);
    if (rc < 0)
        return rc;
    uint64_t n = v.t == MP_MAP ? 2 * (uint64_t)v.len : v.len;
    for (uint64_t i = 0; i < n && rc == 0; i++)
        rc = mp_skip(m, what);
    mp_leave(m);
    return rc;
}
