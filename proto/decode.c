/*
 * proto: request and reply decoding on top of the cursor (cursor.c).
 *
 * A frame is walked twice. The first walk is lenient and only looks for `id`
 * and `op`, so that even a malformed request gets an error reply that names
 * it; the second is the strict decode, which knows the op before it meets the
 * op's fields because map keys may come in any order. Unknown keys are
 * skipped (bounded) for forward compatibility; a known key twice is an error.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "proto.h"

struct dec {
    struct mp m;
    struct proto_mem *mem;
    char what[80];
};

static bool key_is(const uint8_t *k, uint32_t n, const char *name)
{
    return strlen(name) == n && memcmp(k, name, n) == 0;
}

/* Records that a known key was seen; a repeat is BAD_VALUE. */
static int once(struct dec *d, uint32_t *seen, unsigned bit, const char *what)
{
    if (*seen & (1u << bit))
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "field `%s` appears twice in one map: send it once", what);
    *seen |= 1u << bit;
    return 0;
}

static const char *name_at(struct dec *d, const char *array, uint32_t i, const char *field)
{
    snprintf(d->what, sizeof(d->what), "%s[%u].%s", array, i, field);
    return d->what;
}

static int missing(struct dec *d, const char *what, const char *op)
{
    return vks_error_set(d->m.err, -VKS_E_MISSING_FIELD,
                         "required field `%s` of `%s` is missing: see docs/protocol.md", what, op);
}

static int read_key(struct dec *d, const uint8_t **k, uint32_t *kn)
{
    return mp_read_raw(&d->m, false, true, d->m.lim->max_str, k, kn, "(map key)");
}

static int lookup(const char *const *names, size_t n, const uint8_t *s, uint32_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (names[i] != NULL && key_is(s, len, names[i]))
            return (int)i;
    }
    return -1;
}

static enum proto_op op_lookup(const uint8_t *s, uint32_t len)
{
    for (int op = PROTO_OP_HELLO; op < PROTO_OP_COUNT; op++) {
        if (key_is(s, len, proto_op_name((enum proto_op)op)))
            return (enum proto_op)op;
    }
    return PROTO_OP_NONE;
}

/* ---- the lenient head walk -------------------------------------------------- */

struct head {
    bool has_id;
    uint32_t id;
    bool has_op;
    bool op_is_str;
    const uint8_t *op;
    uint32_t op_len;
};

static void scan_head(const struct proto_frame *f, const struct proto_limits *lim, struct head *h)
{
    struct mp m = {.p = f->data, .end = f->data + f->len, .lim = lim, .err = NULL};
    uint32_t n;
    memset(h, 0, sizeof(*h));
    if (mp_read_map(&m, lim->max_array, &n, "") < 0)
        return;
    /* encoders write id and op first: stop there, not after skipping the
     * rest (a catalog reply of 43 k rules is 1.7 MB: a second walk of it
     * was a quarter of its decode) */
    for (uint32_t i = 0; i < n && !(h->has_id && h->has_op); i++) {
        const uint8_t *k;
        uint32_t kn;
        if (mp_read_raw(&m, false, true, lim->max_str, &k, &kn, "") < 0)
            return;
        if (key_is(k, kn, "id") && mp_peek(&m) == MP_UINT) {
            uint64_t v;
            if (mp_read_uint(&m, UINT32_MAX, &v, "") == 0) {
                h->has_id = true;
                h->id = (uint32_t)v;
                continue;
            }
            return;
        }
        if (key_is(k, kn, "op")) {
            h->has_op = true;
            h->op_is_str = mp_peek(&m) == MP_STR;
            if (h->op_is_str) {
                if (mp_read_raw(&m, false, true, lim->max_str, &h->op, &h->op_len, "") < 0)
                    return;
                continue;
            }
        }
        if (mp_skip(&m, "") < 0)
            return;
    }
}

/* ---- request fields, one function per op ------------------------------------ */

static int check_hello(struct dec *d, struct proto_request *req, uint32_t seen)
{
    struct proto_hello *h = &req->u.hello;
    if (!(seen & 1u))
        return missing(d, "version", "hello");
    if (!(seen & 2u))
        h->min_version = h->version;
    if (h->min_version > h->version || h->version == 0)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "hello: min_version %u and version %u do not form a range of "
                             "versions from 1 up",
                             h->min_version, h->version);
    return 0;
}

static int read_kind(struct dec *d, enum proto_rule_kind *kind, const char *what)
{
    static const char *const kinds[] = {"literal", "hex", "regex"};
    const uint8_t *s;
    uint32_t n;
    int rc = mp_read_raw(&d->m, false, true, d->m.lim->max_str, &s, &n, what);
    if (rc < 0)
        return rc;
    int k = lookup(kinds, 3, s, n);
    if (k < 0)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "field `%s`: `%.*s` is not a rule kind: use literal, hex or regex",
                             what, (int)(n > 32 ? 32 : n), (const char *)s);
    *kind = (enum proto_rule_kind)k;
    return 0;
}

/* A rule map's fields: one reader per row, found by name (rule_fields). */
static int rule_id(struct dec *d, struct proto_rule *r, const char *what)
{
    return mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &r->id, what);
}

static int rule_kind(struct dec *d, struct proto_rule *r, const char *what)
{
    return read_kind(d, &r->kind, what);
}

static int rule_pattern(struct dec *d, struct proto_rule *r, const char *what)
{
    const uint8_t *p;
    int rc = mp_read_raw(&d->m, true, true, d->m.lim->max_str, &p, &r->pattern_len, what);
    r->pattern = (const char *)p;
    return rc;
}

static int rule_flags(struct dec *d, struct proto_rule *r, const char *what)
{
    return mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &r->flags, what);
}

static const struct {
    const char *name;
    int (*read)(struct dec *d, struct proto_rule *r, const char *what);
} rule_fields[] = {
    {"id", rule_id}, {"kind", rule_kind}, {"pattern", rule_pattern}, {"flags", rule_flags}};

static int rule_field(struct dec *d, struct proto_rule *r, uint32_t i, const uint8_t *k,
                      uint32_t kn, uint32_t *seen)
{
    for (unsigned f = 0; f < sizeof(rule_fields) / sizeof(rule_fields[0]); f++) {
        if (!key_is(k, kn, rule_fields[f].name))
            continue;
        const char *what = name_at(d, "rules", i, rule_fields[f].name);
        int rc = once(d, seen, f, what);
        return rc < 0 ? rc : rule_fields[f].read(d, r, what);
    }
    return mp_skip(&d->m, name_at(d, "rules", i, "?"));
}

static int read_rule(struct dec *d, struct proto_rule *r, uint32_t i)
{
    uint32_t n, seen = 0;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, name_at(d, "rules", i, ""));
    for (uint32_t j = 0; rc == 0 && j < n; j++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc == 0)
            rc = rule_field(d, r, i, k, kn, &seen);
    }
    if (rc < 0)
        return rc;
    mp_leave(&d->m);
    if ((seen & 7u) != 7u) {
        const char *which = !(seen & 1u) ? "id" : !(seen & 2u) ? "kind" : "pattern";
        return missing(d, name_at(d, "rules", i, which), "catalog.load");
    }
    if (r->id[0] == '\0')
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "field `rules[%u].id` is empty: every rule needs an id", i);
    if (r->flags == NULL)
        r->flags = "";
    return 0;
}

static int read_rules(struct dec *d, struct proto_catalog_load *l)
{
    uint32_t n;
    int rc = mp_read_array_code(&d->m, d->m.lim->max_rules, -VKS_E_TOO_MANY_RULES, &n, "rules");
    if (rc < 0)
        return rc;
    l->rules = proto_mem_alloc(d->mem, n, sizeof(*l->rules));
    if (l->rules == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u rules", n);
    l->n_rules = n;
    for (uint32_t i = 0; i < n; i++) {
        rc = read_rule(d, &l->rules[i], i);
        if (rc < 0)
            return rc;
    }
    mp_leave(&d->m);
    return 0;
}

static int read_load_rules(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    return read_rules(d, &req->u.load);
}

static int read_load_text(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    struct proto_catalog_load *l = &req->u.load;
    const uint8_t *p;
    int rc = mp_read_raw(&d->m, true, true, UINT32_MAX, &p, &l->text_len, "text");
    l->text = (const char *)p;
    l->has_text = true;
    return rc;
}

static int check_load(struct dec *d, struct proto_request *req, uint32_t seen)
{
    (void)req;
    if ((seen & 3u) == 3u)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "catalog.load has both `rules` and `text`: send one of them");
    if ((seen & 3u) == 0)
        return missing(d, "rules` or `text", "catalog.load");
    return 0;
}

static int read_ref_fp(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    req->u.ref.by_source = false;
    return mp_read_fp(&d->m, req->u.ref.fp, "fingerprint");
}

static int read_ref_source(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    req->u.ref.by_source = true;
    return mp_read_fp(&d->m, req->u.ref.fp, "source");
}

static int check_ref(struct dec *d, struct proto_request *req, uint32_t seen)
{
    if (seen == 3u)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "catalog.has has both `fingerprint` and `source`: send one of them");
    if (seen == 0)
        return missing(d,
                       req->op == PROTO_OP_CATALOG_HAS ? "fingerprint` or `source" : "fingerprint",
                       proto_op_name(req->op));
    return 0;
}

/* A buffer map's fields: one reader per row, found by name (buffer_fields). */
static int buffer_data(struct dec *d, struct proto_buffer *b, const char *what)
{
    uint32_t len = 0;
    int rc = mp_read_raw(&d->m, true, true, UINT32_MAX, &b->data, &len, what);
    b->len = len;
    return rc;
}

static int buffer_fd(struct dec *d, struct proto_buffer *b, const char *what)
{
    b->is_fd = true;
    return mp_read_u32(&d->m, &b->fd_index, what);
}

static int buffer_offset(struct dec *d, struct proto_buffer *b, const char *what)
{
    return mp_read_uint(&d->m, INT64_MAX, &b->offset, what);
}

static int buffer_length(struct dec *d, struct proto_buffer *b, const char *what)
{
    b->has_length = true;
    return mp_read_uint(&d->m, INT64_MAX, &b->length, what);
}

static const struct {
    const char *name;
    int (*read)(struct dec *d, struct proto_buffer *b, const char *what);
} buffer_fields[] = {
    {"data", buffer_data}, {"fd", buffer_fd}, {"offset", buffer_offset}, {"length", buffer_length}};

static int buffer_field(struct dec *d, struct proto_buffer *b, uint32_t i, const uint8_t *k,
                        uint32_t kn, uint32_t *seen)
{
    for (unsigned f = 0; f < sizeof(buffer_fields) / sizeof(buffer_fields[0]); f++) {
        if (!key_is(k, kn, buffer_fields[f].name))
            continue;
        const char *what = name_at(d, "buffers", i, buffer_fields[f].name);
        int rc = once(d, seen, f, what);
        return rc < 0 ? rc : buffer_fields[f].read(d, b, what);
    }
    return mp_skip(&d->m, name_at(d, "buffers", i, "?"));
}

static int check_buffer(struct dec *d, struct proto_buffer *b, uint32_t i, uint32_t seen,
                        const struct proto_frame *f)
{
    if ((seen & 3u) == 3u || (seen & 3u) == 0)
        return vks_error_set(d->m.err, (seen & 3u) ? -VKS_E_BAD_VALUE : -VKS_E_MISSING_FIELD,
                             "buffers[%u] needs exactly one of `data` (inline bytes) and `fd` "
                             "(descriptor index)",
                             i);
    if (!b->is_fd) {
        b->fd = -1;
        if (seen & 12u)
            return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                                 "buffers[%u]: `offset` and `length` apply to `fd` buffers only; "
                                 "slice inline data before sending it",
                                 i);
        return 0;
    }
    if (b->fd_index >= f->n_fds)
        return vks_error_set(d->m.err, -VKS_E_BAD_FD,
                             "buffers[%u].fd is index %u, but the frame came with %zu "
                             "descriptors: send them with the frame's first byte (SCM_RIGHTS)",
                             i, b->fd_index, f->n_fds);
    b->fd = f->fds[b->fd_index];
    return 0;
}

static int read_buffer(struct dec *d, struct proto_buffer *b, uint32_t i,
                       const struct proto_frame *f)
{
    uint32_t n, seen = 0;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, name_at(d, "buffers", i, ""));
    for (uint32_t j = 0; rc == 0 && j < n; j++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc == 0)
            rc = buffer_field(d, b, i, k, kn, &seen);
    }
    if (rc < 0)
        return rc;
    mp_leave(&d->m);
    return check_buffer(d, b, i, seen, f);
}

static int read_buffers(struct dec *d, struct proto_buffer **out, uint32_t *n_out,
                        const struct proto_frame *f)
{
    uint32_t n;
    int rc =
        mp_read_array_code(&d->m, d->m.lim->max_buffers, -VKS_E_TOO_MANY_BUFFERS, &n, "buffers");
    if (rc < 0)
        return rc;
    struct proto_buffer *v = proto_mem_alloc(d->mem, n, sizeof(*v));
    if (v == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u buffers", n);
    *out = v;
    *n_out = n;
    for (uint32_t i = 0; i < n; i++) {
        rc = read_buffer(d, &v[i], i, f);
        if (rc < 0)
            return rc;
    }
    mp_leave(&d->m);
    return 0;
}

static int read_mode(struct dec *d, enum proto_report *mode)
{
    static const char *const modes[] = {"all", "first", "count"};
    const uint8_t *s;
    uint32_t n;
    int rc = mp_read_raw(&d->m, false, true, d->m.lim->max_str, &s, &n, "mode");
    if (rc < 0)
        return rc;
    int k = lookup(modes, 3, s, n);
    if (k < 0)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "field `mode`: `%.*s` is not a report mode: use all, first or count",
                             (int)(n > 32 ? 32 : n), (const char *)s);
    *mode = (enum proto_report)k;
    return 0;
}

static int read_stream_mode(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    return read_mode(d, &req->u.stream.mode);
}

static int read_scan_buffers(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    return read_buffers(d, &req->u.scan.buffers, &req->u.scan.n_buffers, fr);
}

static int read_scan_mode(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    return read_mode(d, &req->u.scan.mode);
}

static int read_scan_cache(struct dec *d, struct proto_request *req, const struct proto_frame *fr)
{
    (void)fr;
    bool cache = true;
    int rc = mp_read_bool(&d->m, &cache, "cache");
    req->u.scan.no_cache = !cache;
    return rc;
}

static int check_scan(struct dec *d, struct proto_request *req, uint32_t seen)
{
    (void)req;
    if (!(seen & 1u))
        return missing(d, "catalog", "scan");
    if (!(seen & 2u))
        return missing(d, "buffers", "scan");
    return 0;
}

static int read_stream_buffer(struct dec *d, struct proto_request *req,
                              const struct proto_frame *fr)
{
    return read_buffer(d, &req->u.stream.buffer, 0, fr);
}

static int read_writes_buffers(struct dec *d, struct proto_request *req,
                               const struct proto_frame *fr)
{
    return read_buffers(d, &req->u.writes.buffers, &req->u.writes.n_buffers, fr);
}

/* A `streams` array of ids (at most max_buffers). */
static int read_ids(struct dec *d, uint32_t **out, uint32_t *n_out)
{
    uint32_t n;
    int rc =
        mp_read_array_code(&d->m, d->m.lim->max_buffers, -VKS_E_TOO_MANY_BUFFERS, &n, "streams");
    if (rc < 0)
        return rc;
    uint32_t *v = proto_mem_alloc(d->mem, n ? n : 1, sizeof(*v));
    if (v == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u stream ids", n);
    *out = v;
    *n_out = n;
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = mp_read_u32(&d->m, &v[i], "streams");
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int read_writes_streams(struct dec *d, struct proto_request *req,
                               const struct proto_frame *fr)
{
    (void)fr;
    return read_ids(d, &req->u.writes.streams, &req->u.writes.n_streams);
}

static int read_close_streams(struct dec *d, struct proto_request *req,
                              const struct proto_frame *fr)
{
    (void)fr;
    return read_ids(d, &req->u.stream.streams, &req->u.stream.n_streams);
}

/* stream.writes needs `streams` and `buffers`, one stream per buffer. */
static int check_writes(struct dec *d, struct proto_request *req, uint32_t seen)
{
    if (!(seen & 1u))
        return missing(d, "streams", "stream.writes");
    if (!(seen & 2u))
        return missing(d, "buffers", "stream.writes");
    if (req->u.writes.n_streams != req->u.writes.n_buffers)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "stream.writes has %u streams and %u buffers: give one stream id "
                             "per buffer",
                             req->u.writes.n_streams, req->u.writes.n_buffers);
    return 0;
}

/* stream.open needs `catalog`; stream.write `stream` and `buffer`;
 * stream.close `stream` (their tables list them in that order). */
static int check_stream(struct dec *d, struct proto_request *req, uint32_t seen)
{
    const char *op = proto_op_name(req->op);
    if (req->op == PROTO_OP_STREAM_CLOSE && (seen & 3u) == 3u)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "stream.close has both `stream` and `streams`: give one");
    if (req->op == PROTO_OP_STREAM_CLOSE && (seen & 2u))
        return 0;
    if (req->op == PROTO_OP_STREAM_OPEN && (seen & 2u) &&
        (req->u.stream.count == 0 || req->u.stream.count > d->m.lim->max_buffers))
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "stream.open `count` is %u: open 1 to %u streams per request",
                             req->u.stream.count, d->m.lim->max_buffers);
    if (!(seen & 1u))
        return missing(d, req->op == PROTO_OP_STREAM_OPEN ? "catalog" : "stream", op);
    if (req->op == PROTO_OP_STREAM_WRITE && !(seen & 2u))
        return missing(d, "buffer", op);
    return 0;
}

/* ---- request ------------------------------------------------------------------ */

/*
 * The request fields of each op: one table row per field, {name, type,
 * where it goes}, walked by read_field. A field's row index is its bit in
 * `seen` (duplicates are BAD_VALUE), which the op's check function reads.
 */
enum field_type { FT_U32, FT_BOOL, FT_CSTR, FT_FP, FT_CUSTOM };

struct field {
    const char *name;
    enum field_type type;
    size_t off; /* in struct proto_request */
    int (*read)(struct dec *d, struct proto_request *req, const struct proto_frame *fr);
};

#define RQ(m) offsetof(struct proto_request, m)

static const struct field hello_fields[] = {
    {"version", FT_U32, RQ(u.hello.version), NULL},
    {"min_version", FT_U32, RQ(u.hello.min_version), NULL},
    {"client", FT_CSTR, RQ(u.hello.client), NULL},
    {"read_ahead", FT_BOOL, RQ(u.hello.read_ahead), NULL},
};
static const struct field load_fields[] = {
    {"rules", FT_CUSTOM, 0, read_load_rules},
    {"text", FT_CUSTOM, 0, read_load_text},
    {"max_states", FT_U32, RQ(u.load.max_states), NULL},
    {"ids_only", FT_BOOL, RQ(u.load.ids_only), NULL},
};
static const struct field has_fields[] = {
    /* catalog.drop: the first only */
    {"fingerprint", FT_CUSTOM, 0, read_ref_fp},
    {"source", FT_CUSTOM, 0, read_ref_source},
    {"ids_only", FT_BOOL, RQ(u.ref.ids_only), NULL},
};
static const struct field scan_fields[] = {
    {"catalog", FT_FP, RQ(u.scan.catalog), NULL},
    {"buffers", FT_CUSTOM, 0, read_scan_buffers},
    {"mode", FT_CUSTOM, 0, read_scan_mode},
    {"max_hits", FT_U32, RQ(u.scan.max_hits), NULL},
    {"timeout_ms", FT_U32, RQ(u.scan.timeout_ms), NULL},
    {"ids", FT_BOOL, RQ(u.scan.rule_ids), NULL},
    {"cache", FT_CUSTOM, 0, read_scan_cache},
    {"starts", FT_BOOL, RQ(u.scan.starts), NULL},
};
static const struct field stream_open_fields[] = {
    {"catalog", FT_FP, RQ(u.stream.catalog), NULL},
    {"count", FT_U32, RQ(u.stream.count), NULL},
    {"mode", FT_CUSTOM, 0, read_stream_mode},
};
static const struct field stream_close_fields[] = {
    {"stream", FT_U32, RQ(u.stream.stream), NULL},
    {"streams", FT_CUSTOM, 0, read_close_streams},
};
static const struct field stream_write_fields[] = {
    {"stream", FT_U32, RQ(u.stream.stream), NULL},
    {"buffer", FT_CUSTOM, 0, read_stream_buffer},
};
static const struct field stream_writes_fields[] = {
    {"streams", FT_CUSTOM, 0, read_writes_streams},
    {"buffers", FT_CUSTOM, 0, read_writes_buffers},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The field table of `op`; catalog.drop takes only `fingerprint`. */
static const struct field *op_fields(enum proto_op op, size_t *n)
{
    switch (op) {
    case PROTO_OP_HELLO:
        *n = N_OF(hello_fields);
        return hello_fields;
    case PROTO_OP_CATALOG_LOAD:
        *n = N_OF(load_fields);
        return load_fields;
    case PROTO_OP_CATALOG_HAS:
        *n = N_OF(has_fields);
        return has_fields;
    case PROTO_OP_CATALOG_DROP:
        *n = 1;
        return has_fields;
    case PROTO_OP_SCAN:
        *n = N_OF(scan_fields);
        return scan_fields;
    case PROTO_OP_STREAM_OPEN:
        *n = N_OF(stream_open_fields);
        return stream_open_fields;
    case PROTO_OP_STREAM_WRITE:
        *n = N_OF(stream_write_fields);
        return stream_write_fields;
    case PROTO_OP_STREAM_CLOSE:
        *n = N_OF(stream_close_fields);
        return stream_close_fields;
    case PROTO_OP_STREAM_WRITES:
        *n = N_OF(stream_writes_fields);
        return stream_writes_fields;
    default:
        *n = 0;
        return NULL;
    }
}

/* Reads the value of key `k` when the op's table has it: 1 when read, 0 when
 * the key is not a field of this op (the caller skips it), or an error. */
static int op_field(struct dec *d, struct proto_request *req, const uint8_t *k, uint32_t kn,
                    uint32_t *seen, const struct proto_frame *fr)
{
    size_t n;
    const struct field *t = op_fields(req->op, &n);
    const struct field *f = NULL;
    for (size_t i = 0; i < n && f == NULL; i++)
        f = key_is(k, kn, t[i].name) ? &t[i] : NULL;
    if (f == NULL)
        return 0;
    int rc = once(d, seen, (unsigned)(f - t), f->name);
    if (rc < 0)
        return rc;
    void *at = (char *)req + f->off;
    switch (f->type) {
    case FT_U32:
        rc = mp_read_u32(&d->m, at, f->name);
        break;
    case FT_BOOL:
        rc = mp_read_bool(&d->m, at, f->name);
        break;
    case FT_CSTR:
        rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, at, f->name);
        break;
    case FT_FP:
        rc = mp_read_fp(&d->m, at, f->name);
        break;
    case FT_CUSTOM:
        rc = f->read(d, req, fr);
        break;
    }
    return rc < 0 ? rc : 1;
}

static int op_check(struct dec *d, struct proto_request *req, uint32_t seen)
{
    switch (req->op) {
    case PROTO_OP_HELLO:
        return check_hello(d, req, seen);
    case PROTO_OP_CATALOG_LOAD:
        return check_load(d, req, seen);
    case PROTO_OP_CATALOG_HAS:
    case PROTO_OP_CATALOG_DROP:
        return check_ref(d, req, seen);
    case PROTO_OP_SCAN:
        return check_scan(d, req, seen);
    case PROTO_OP_STREAM_OPEN:
    case PROTO_OP_STREAM_WRITE:
    case PROTO_OP_STREAM_CLOSE:
        return check_stream(d, req, seen);
    case PROTO_OP_STREAM_WRITES:
        return check_writes(d, req, seen);
    default:
        return 0;
    }
}

/* `op` from the head walk decides which fields the strict walk knows. */
static int resolve_op(struct dec *d, const struct head *h, enum proto_op *op)
{
    if (!h->has_op)
        return 0;
    if (!h->op_is_str)
        return vks_error_set(d->m.err, -VKS_E_BAD_TYPE, "field `op`: expected str");
    *op = op_lookup(h->op, h->op_len);
    if (*op == PROTO_OP_NONE)
        return vks_error_set(d->m.err, -VKS_E_UNKNOWN_OP,
                             "operation `%.*s` is not part of protocol version %u: check the "
                             "name, or the server's version in the hello reply",
                             (int)(h->op_len > 40 ? 40 : h->op_len), (const char *)h->op,
                             PROTO_VERSION);
    return 0;
}

static int finish_frame(struct dec *d)
{
    if (d->m.p != d->m.end)
        return vks_error_set(d->m.err, -VKS_E_BAD_FRAME,
                             "%zu bytes follow the frame's map: a frame holds exactly one map",
                             (size_t)(d->m.end - d->m.p));
    return 0;
}

static int decode_request(struct dec *d, struct proto_request *req, const struct proto_frame *f)
{
    uint32_t n, seen = 0, base = 0;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "(frame)");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        if (key_is(k, kn, "id")) {
            rc = once(d, &base, 0, "id");
            if (rc == 0)
                rc = mp_read_u32(&d->m, &req->id, "id");
        } else if (key_is(k, kn, "op")) {
            rc = once(d, &base, 1, "op");
            if (rc == 0)
                rc = mp_skip(&d->m, "op"); /* resolved by the head walk */
        } else {
            rc = op_field(d, req, k, kn, &seen, f);
            rc = rc == 0 ? mp_skip(&d->m, "(unknown field)") : rc < 0 ? rc : 0;
        }
    }
    if (rc < 0)
        return rc;
    mp_leave(&d->m);
    if (!(base & 1u))
        return missing(d, "id", req->op ? proto_op_name(req->op) : "request");
    if (!(base & 2u))
        return missing(d, "op", "request");
    rc = op_check(d, req, seen);
    return rc < 0 ? rc : finish_frame(d);
}

static int request_fail(struct proto_request *req, struct proto_mem *mem, struct proto_frame *f,
                        int rc)
{
    free(req);
    proto_mem_destroy(mem);
    proto_frame_finish(f);
    return rc;
}

int proto_request_decode(struct proto_frame *frame, const struct proto_limits *lim,
                         struct proto_request **out, struct proto_head *head, struct vks_error *err)
{
    struct proto_limits l = lim != NULL ? *lim : (struct proto_limits){0};
    struct head h;
    struct dec d = {
        .m = {.p = frame->data, .end = frame->data + frame->len, .lim = &l, .err = err}};
    proto_limits_normalize(&l);
    *out = NULL;
    scan_head(frame, &l, &h);
    struct proto_request *req = calloc(1, sizeof(*req));
    d.mem = proto_mem_create();
    if (head != NULL)
        *head = (struct proto_head){.id = h.has_id ? h.id : 0, .op = PROTO_OP_NONE};
    if (req == NULL || d.mem == NULL)
        return request_fail(req, d.mem, frame,
                            vks_error_set(err, -ENOMEM, "out of memory decoding a request"));
    int rc = resolve_op(&d, &h, &req->op);
    if (head != NULL)
        head->op = req->op;
    if (rc == 0 && frame->fd_error == -VKS_E_BUSY)
        rc = vks_error_set(err, frame->fd_error,
                           "vkscand is out of file descriptors and could not take the ones "
                           "sent with this request: retry later");
    else if (rc == 0 && frame->fd_error != 0)
        rc = vks_error_set(err, frame->fd_error,
                           "more than %u descriptors came with one frame: send fewer per scan",
                           l.max_fds);
    if (rc == 0)
        rc = decode_request(&d, req, frame);
    if (rc == 0 && frame->n_fds > 0 && req->op != PROTO_OP_SCAN &&
        req->op != PROTO_OP_STREAM_WRITE && req->op != PROTO_OP_STREAM_WRITES)
        rc = vks_error_set(err, -VKS_E_BAD_FD,
                           "%zu descriptors came with a `%s` request: only scan, "
                           "stream.write and stream.writes take them",
                           frame->n_fds, proto_op_name(req->op));
    if (rc < 0)
        return request_fail(req, d.mem, frame, rc);
    req->frame = *frame;
    memset(frame, 0, sizeof(*frame));
    req->mem = d.mem;
    *out = req;
    return 0;
}

void proto_request_destroy(struct proto_request *req)
{
    if (req == NULL)
        return;
    proto_frame_finish(&req->frame);
    proto_mem_destroy(req->mem);
    free(req);
}

/* ---- replies ------------------------------------------------------------------ */

static int read_stats(struct dec *d, struct proto_stat **out, uint32_t *n_out, const char *what)
{
    uint32_t n;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, what);
    if (rc < 0)
        return rc;
    struct proto_stat *s = proto_mem_alloc(d->mem, n, sizeof(*s));
    if (s == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u counters", n);
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &s[i].key, what);
        if (rc == 0)
            rc = mp_read_number(&d->m, &s[i].is_float, &s[i].u, &s[i].f, what);
    }
    if (rc < 0)
        return rc;
    mp_leave(&d->m);
    *out = s;
    *n_out = n;
    return 0;
}

static int read_limits(struct dec *d, struct proto_limits *l)
{
    static const char *const names[] = {"max_frame",   "max_depth", "max_str", "max_array",
                                        "max_buffers", "max_rules", "max_fds", "max_hits"};
    uint32_t *fields[] = {&l->max_frame,   &l->max_depth, &l->max_str, &l->max_array,
                          &l->max_buffers, &l->max_rules, &l->max_fds, &l->max_hits};
    uint32_t n;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "limits");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        int f = rc == 0 ? lookup(names, 8, k, kn) : -1;
        if (rc == 0)
            rc = f < 0 ? mp_skip(&d->m, "limits") : mp_read_u32(&d->m, fields[f], names[f]);
    }
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int read_device(struct dec *d, struct proto_device *dev)
{
    static const char *const names[] = {"index", "name", "type", "memory", "active"};
    uint32_t n;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "devices[]");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        uint32_t lim = d->m.lim->max_str;
        switch (lookup(names, 5, k, kn)) {
        case 0:
            rc = mp_read_u32(&d->m, &dev->index, "devices[].index");
            break;
        case 1:
            rc = mp_read_cstr(&d->m, d->mem, lim, &dev->name, "devices[].name");
            break;
        case 2:
            rc = mp_read_cstr(&d->m, d->mem, lim, &dev->type, "devices[].type");
            break;
        case 3:
            rc = mp_read_uint(&d->m, UINT64_MAX, &dev->memory, "devices[].memory");
            break;
        case 4:
            rc = mp_read_bool(&d->m, &dev->active, "devices[].active");
            break;
        default:
            rc = mp_skip(&d->m, "devices[]");
        }
    }
    if (rc == 0)
        mp_leave(&d->m);
    if (rc == 0 && (dev->name == NULL || dev->type == NULL))
        rc = missing(d, "devices[].name` and `type", "hello");
    return rc;
}

static int read_devices(struct dec *d, struct proto_hello_reply *h)
{
    uint32_t n;
    int rc = mp_read_array(&d->m, d->m.lim->max_array, &n, "devices");
    if (rc < 0)
        return rc;
    h->devices = proto_mem_alloc(d->mem, n, sizeof(*h->devices));
    if (h->devices == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u devices", n);
    h->n_devices = n;
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = read_device(d, &h->devices[i]);
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int result_hello(struct dec *d, struct proto_reply *rep, const uint8_t *k, uint32_t kn)
{
    static const char *const names[] = {"version", "min_version", "server", "limits", "devices"};
    struct proto_hello_reply *h = &rep->u.hello;
    switch (lookup(names, 5, k, kn)) {
    case 0:
        return mp_read_u32(&d->m, &h->version, "version");
    case 1:
        return mp_read_u32(&d->m, &h->min_version, "min_version");
    case 2:
        return mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &h->server, "server");
    case 3:
        return read_limits(d, &h->limits);
    case 4:
        return read_devices(d, h);
    default:
        return mp_skip(&d->m, "(unknown field)");
    }
}

/* One rule of a catalog result in the shape this library's encoder writes,
 * `[fixstr or str 8 id, bin 8 of 32]`, read in place (a 43 k-rule reply
 * spent 4 ms in the general cursor). Returns 1 when read, 0 when the bytes
 * have another shape (the caller reads them the general way), or an error. */
static int rule_info_fast(struct dec *d, struct proto_rule_info *r)
{
    const uint8_t *p = d->m.p, *end = d->m.end;
    if (end - p < 2 || p[0] != 0x92 || d->m.depth + 1 > d->m.lim->max_depth)
        return 0;
    uint32_t n;
    if ((p[1] & 0xe0) == 0xa0) {
        n = p[1] & 0x1f;
        p += 2;
    } else if (p[1] == 0xd9 && end - p >= 3) {
        n = p[2];
        p += 3;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < (size_t)n + 2 + PROTO_FP_LEN || n > d->m.lim->max_str || p[n] != 0xc4 ||
        p[n + 1] != PROTO_FP_LEN || memchr(p, '\0', n) != NULL)
        return 0; /* the general path says what is wrong, if anything */
    r->id = proto_mem_strndup(d->mem, (const char *)p, n);
    if (r->id == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory decoding field `rules[].id`");
    memcpy(r->fp, p + n + 2, PROTO_FP_LEN);
    d->m.p = p + n + 2 + PROTO_FP_LEN;
    return 1;
}

static int read_rule_infos(struct dec *d, struct proto_catalog_result *c)
{
    uint32_t n;
    int rc = mp_read_array(&d->m, d->m.lim->max_rules, &n, "rules");
    if (rc < 0)
        return rc;
    c->rules = proto_mem_alloc(d->mem, n, sizeof(*c->rules));
    if (c->rules == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u rules", n);
    c->n_rules = n;
    c->ids_only = n > 0 && mp_peek(&d->m) == MP_STR;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        if (c->ids_only) { /* ids_only: every element an id */
            rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &c->rules[i].id, "rules[]");
            continue;
        }
        rc = rule_info_fast(d, &c->rules[i]);
        if (rc != 0) {
            rc = rc < 0 ? rc : 0;
            continue;
        }
        uint32_t two;
        rc = mp_read_array(&d->m, 2, &two, "rules[]");
        if (rc == 0 && two != 2)
            rc = vks_error_set(d->m.err, -VKS_E_BAD_VALUE, "rules[%u] is not [id, fingerprint]", i);
        if (rc == 0)
            rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &c->rules[i].id, "rules[].id");
        if (rc == 0)
            rc = mp_read_fp(&d->m, c->rules[i].fp, "rules[].fingerprint");
        if (rc == 0)
            mp_leave(&d->m);
    }
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int read_reject(struct dec *d, struct proto_reject *r)
{
    static const char *const names[] = {"index", "line", "pos", "id", "message"};
    uint32_t n;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "rejected[]");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        uint32_t lim = d->m.lim->max_str;
        switch (lookup(names, 5, k, kn)) {
        case 0:
            rc = mp_read_u32(&d->m, &r->index, "rejected[].index");
            break;
        case 1:
            rc = mp_read_u32(&d->m, &r->line, "rejected[].line");
            break;
        case 2:
            rc = mp_read_u32(&d->m, &r->pos, "rejected[].pos");
            break;
        case 3:
            rc = mp_read_cstr(&d->m, d->mem, lim, &r->id, "rejected[].id");
            break;
        case 4:
            rc = mp_read_cstr(&d->m, d->mem, lim, &r->message, "rejected[].message");
            break;
        default:
            rc = mp_skip(&d->m, "rejected[]");
        }
    }
    if (rc == 0)
        mp_leave(&d->m);
    if (rc == 0 && r->id == NULL)
        r->id = "";
    if (rc == 0 && r->message == NULL)
        r->message = "";
    return rc;
}

static int read_rejects(struct dec *d, struct proto_catalog_result *c)
{
    uint32_t n;
    int rc = mp_read_array(&d->m, d->m.lim->max_rules, &n, "rejected");
    if (rc < 0)
        return rc;
    c->rejects = proto_mem_alloc(d->mem, n, sizeof(*c->rejects));
    if (c->rejects == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u rejects", n);
    c->n_rejects = n;
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = read_reject(d, &c->rejects[i]);
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int result_catalog(struct dec *d, struct proto_reply *rep, const uint8_t *k, uint32_t kn)
{
    static const char *const names[] = {"known",      "fingerprint", "source",  "cached",
                                        "compile_ns", "rules",       "rejected"};
    struct proto_catalog_result *c = &rep->u.catalog;
    switch (lookup(names, 7, k, kn)) {
    case 0:
        return mp_read_bool(&d->m, &c->known, "known");
    case 1:
        return mp_read_fp(&d->m, c->fingerprint, "fingerprint");
    case 2:
        return mp_read_fp(&d->m, c->source, "source");
    case 3:
        return mp_read_bool(&d->m, &c->cached, "cached");
    case 4:
        return mp_read_uint(&d->m, UINT64_MAX, &c->compile_ns, "compile_ns");
    case 5:
        return read_rule_infos(d, c);
    case 6:
        return read_rejects(d, c);
    default:
        return mp_skip(&d->m, "(unknown field)");
    }
}

static int read_hit(struct dec *d, struct proto_hit *h)
{
    uint32_t n;
    int rc = mp_read_array(&d->m, 6, &n, "hits[]");
    if (rc == 0 && n < 4)
        rc = vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                           "hits[] has %u elements, expected [buffer, rule, end, count(, id(, "
                           "start))]",
                           n);
    if (rc == 0)
        rc = mp_read_u32(&d->m, &h->buffer, "hits[].buffer");
    if (rc == 0)
        rc = mp_read_u32(&d->m, &h->rule, "hits[].rule");
    if (rc == 0)
        rc = mp_read_uint(&d->m, UINT64_MAX, &h->end, "hits[].end");
    if (rc == 0)
        rc = mp_read_u32(&d->m, &h->count, "hits[].count");
    if (rc == 0 && n >= 5 && n == 6 && mp_peek(&d->m) == MP_NIL)
        rc = mp_skip(&d->m, "hits[].id"); /* a start without an id */
    else if (rc == 0 && n >= 5)
        rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &h->rule_id, "hits[].id");
    if (rc == 0 && n == 6) {
        rc = mp_read_uint(&d->m, UINT64_MAX - 1, &h->start, "hits[].start");
        h->has_start = rc == 0;
        if (rc == 0 && h->start >= h->end)
            rc = vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                               "field `hits[].start`: %llu is not before the end %llu",
                               (unsigned long long)h->start, (unsigned long long)h->end);
    }
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int read_hits(struct dec *d, struct proto_scan_reply *s)
{
    uint32_t n;
    int rc = mp_read_array(&d->m, d->m.lim->max_hits, &n, "hits");
    if (rc < 0)
        return rc;
    s->hits = proto_mem_alloc(d->mem, n, sizeof(*s->hits));
    if (s->hits == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u hits", n);
    s->n_hits = n;
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = read_hit(d, &s->hits[i]);
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int read_status(struct dec *d, struct proto_buffer_status *b)
{
    static const char *const names[] = {"code", "message", "bytes", "hits", "truncated", "cached"};
    uint32_t n, code = 0;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "buffers[]");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        switch (lookup(names, 6, k, kn)) {
        case 0:
            rc = mp_read_u32(&d->m, &code, "buffers[].code");
            break;
        case 1:
            rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &b->message, "buffers[].message");
            break;
        case 2:
            rc = mp_read_uint(&d->m, UINT64_MAX, &b->bytes, "buffers[].bytes");
            break;
        case 3:
            rc = mp_read_u32(&d->m, &b->hits, "buffers[].hits");
            break;
        case 4:
            rc = mp_read_bool(&d->m, &b->truncated, "buffers[].truncated");
            break;
        case 5:
            rc = mp_read_bool(&d->m, &b->cached, "buffers[].cached");
            break;
        default:
            rc = mp_skip(&d->m, "buffers[]");
        }
    }
    if (rc == 0)
        mp_leave(&d->m);
    b->code = code > INT32_MAX ? -VKS_E_INTERNAL : -(int)code;
    return rc;
}

static int read_statuses(struct dec *d, struct proto_scan_reply *s)
{
    uint32_t n;
    int rc = mp_read_array(&d->m, d->m.lim->max_buffers, &n, "buffers");
    if (rc < 0)
        return rc;
    s->buffers = proto_mem_alloc(d->mem, n, sizeof(*s->buffers));
    if (s->buffers == NULL)
        return vks_error_set(d->m.err, -ENOMEM, "out of memory for %u buffer statuses", n);
    s->n_buffers = n;
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        rc = read_status(d, &s->buffers[i]);
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int result_scan(struct dec *d, struct proto_reply *rep, const uint8_t *k, uint32_t kn)
{
    static const char *const names[] = {"hits", "buffers", "telemetry"};
    struct proto_scan_reply *s = &rep->u.scan;
    switch (lookup(names, 3, k, kn)) {
    case 0:
        return read_hits(d, s);
    case 1:
        return read_statuses(d, s);
    case 2:
        return read_stats(d, &s->telemetry, &s->n_telemetry, "telemetry");
    default:
        return mp_skip(&d->m, "(unknown field)");
    }
}

static int result_stream(struct dec *d, struct proto_reply *rep, const uint8_t *k, uint32_t kn)
{
    if (key_is(k, kn, "stream"))
        return mp_read_u32(&d->m, &rep->u.stream.stream, "stream");
    if (key_is(k, kn, "state_bytes"))
        return mp_read_uint(&d->m, UINT64_MAX, &rep->u.stream.state_bytes, "state_bytes");
    if (key_is(k, kn, "streams"))
        return read_ids(d, &rep->u.stream.streams, &rep->u.stream.n_streams);
    return mp_skip(&d->m, "(unknown field)");
}

static int read_result(struct dec *d, struct proto_reply *rep)
{
    if (rep->op == PROTO_OP_STATS)
        return read_stats(d, &rep->u.stats.stats, &rep->u.stats.n_stats, "result");
    uint32_t n;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "result");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        switch (rep->op) {
        case PROTO_OP_HELLO:
            rc = result_hello(d, rep, k, kn);
            break;
        case PROTO_OP_CATALOG_LOAD:
        case PROTO_OP_CATALOG_HAS:
            rc = result_catalog(d, rep, k, kn);
            break;
        case PROTO_OP_CATALOG_DROP:
            rc = key_is(k, kn, "dropped") ? mp_read_bool(&d->m, &rep->u.dropped, "dropped")
                                          : mp_skip(&d->m, "(unknown field)");
            break;
        case PROTO_OP_SCAN:
        case PROTO_OP_STREAM_WRITE:
        case PROTO_OP_STREAM_CLOSE:
        case PROTO_OP_STREAM_WRITES:
            rc = result_scan(d, rep, k, kn);
            break;
        case PROTO_OP_STREAM_OPEN:
            rc = result_stream(d, rep, k, kn);
            break;
        default:
            rc = mp_skip(&d->m, "(unknown field)");
        }
    }
    if (rc == 0)
        mp_leave(&d->m);
    return rc;
}

static int read_error(struct dec *d, struct proto_reply *rep)
{
    uint32_t n, code = 0;
    const char *msg = "";
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "error");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        if (key_is(k, kn, "code"))
            rc = mp_read_u32(&d->m, &code, "error.code");
        else if (key_is(k, kn, "message"))
            rc = mp_read_cstr(&d->m, d->mem, d->m.lim->max_str, &msg, "error.message");
        else
            rc = mp_skip(&d->m, "error");
    }
    if (rc < 0)
        return rc;
    mp_leave(&d->m);
    if (code == 0 || code > INT32_MAX)
        return vks_error_set(d->m.err, -VKS_E_BAD_VALUE,
                             "field `error.code`: %u is not an error code", code);
    rep->error.code = -(int)code;
    snprintf(rep->error.msg, sizeof(rep->error.msg), "%s", msg);
    return 0;
}

/* The op must be known before `result` is read, as in requests. */
static int reply_op(struct dec *d, const struct head *h, struct proto_reply *rep)
{
    if (!h->has_op)
        return 0;
    if (!h->op_is_str)
        return vks_error_set(d->m.err, -VKS_E_BAD_TYPE, "reply field `op`: expected str");
    rep->op = op_lookup(h->op, h->op_len);
    if (rep->op == PROTO_OP_NONE)
        return vks_error_set(d->m.err, -VKS_E_UNKNOWN_OP, "reply names an unknown op `%.*s`",
                             (int)(h->op_len > 40 ? 40 : h->op_len), (const char *)h->op);
    return 0;
}

static int decode_reply(struct dec *d, struct proto_reply *rep)
{
    uint32_t n, seen = 0;
    int rc = mp_read_map(&d->m, d->m.lim->max_array, &n, "(frame)");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const uint8_t *k;
        uint32_t kn;
        rc = read_key(d, &k, &kn);
        if (rc < 0)
            break;
        if (key_is(k, kn, "id")) {
            rc = once(d, &seen, 0, "id");
            rc = rc < 0 ? rc : mp_read_u32(&d->m, &rep->id, "id");
        } else if (key_is(k, kn, "result")) {
            rc = once(d, &seen, 1, "result");
            rc = rc < 0 ? rc : read_result(d, rep);
        } else if (key_is(k, kn, "error")) {
            rc = once(d, &seen, 2, "error");
            rc = rc < 0 ? rc : read_error(d, rep);
        } else {
            rc = mp_skip(&d->m, key_is(k, kn, "op") ? "op" : "(unknown field)");
        }
    }
    if (rc < 0)
        return rc;
    mp_leave(&d->m);
    if (!(seen & 1u))
        return missing(d, "id", "reply");
    if ((seen & 6u) == 0 || (seen & 6u) == 6u)
        return vks_error_set(d->m.err, (seen & 6u) ? -VKS_E_BAD_VALUE : -VKS_E_MISSING_FIELD,
                             "a reply carries exactly one of `result` and `error`");
    if ((seen & 2u) && rep->op == PROTO_OP_NONE)
        return missing(d, "op", "reply with a result");
    return finish_frame(d);
}

int proto_reply_decode(struct proto_frame *frame, const struct proto_limits *lim,
                       struct proto_reply **out, struct vks_error *err)
{
    struct proto_limits l = lim != NULL ? *lim : (struct proto_limits){0};
    struct head h;
    struct dec d = {
        .m = {.p = frame->data, .end = frame->data + frame->len, .lim = &l, .err = err}};
    proto_limits_normalize(&l);
    *out = NULL;
    scan_head(frame, &l, &h);
    struct proto_reply *rep = calloc(1, sizeof(*rep));
    d.mem = proto_mem_create();
    int rc = rep == NULL || d.mem == NULL
                 ? vks_error_set(err, -ENOMEM, "out of memory decoding a reply")
                 : reply_op(&d, &h, rep);
    if (rc == 0 && frame->n_fds > 0)
        rc = vks_error_set(err, -VKS_E_BAD_FD, "a reply came with descriptors; replies carry none");
    if (rc == 0)
        rc = decode_reply(&d, rep);
    if (rc < 0) {
        free(rep);
        proto_mem_destroy(d.mem);
        proto_frame_finish(frame);
        return rc;
    }
    rep->frame = *frame;
    memset(frame, 0, sizeof(*frame));
    rep->mem = d.mem;
    *out = rep;
    return 0;
}

void proto_reply_destroy(struct proto_reply *rep)
{
    if (rep == NULL)
        return;
    proto_frame_finish(&rep->frame);
    proto_mem_destroy(rep->mem);
    free(rep);
}
