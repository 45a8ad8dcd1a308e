/*
 * proto: request and reply encoding with msgpack-c's packer. Every encoder
 * appends one whole frame: it reserves the 4-byte length, packs the map, then
 * patches the length; any failure truncates the buffer back to where the
 * frame began, so a half-encoded frame never leaves this file.
 */
#include <errno.h>
#include <msgpack.h>
#include <string.h>

#include "internal.h"
#include "proto.h"

struct enc {
    struct proto_buf *b;
    msgpack_packer pk;
    int rc;    /* sticky: the first failure */
    bool utf8; /* replies: str values are made valid UTF-8 */
};

static int enc_write(void *data, const char *buf, size_t len)
{
    struct enc *e = data;
    if (e->rc != 0)
        return -1;
    if (proto_buf_reserve(e->b, len) < 0) {
        e->rc = -ENOMEM;
        return -1;
    }
    memcpy(e->b->data + e->b->len, buf, len);
    e->b->len += len;
    return 0;
}

static void enc_init(struct enc *e, struct proto_buf *b)
{
    e->b = b;
    e->rc = 0;
    e->utf8 = false;
    msgpack_packer_init(&e->pk, e, enc_write);
    enc_write(e, "\0\0\0\0", PROTO_HEADER_LEN);
}

/* Patches the length prefix, or rolls the buffer back. */
static int enc_finish(struct enc *e, size_t start, struct vks_error *err)
{
    size_t body = e->b->len - start - PROTO_HEADER_LEN;
    if (e->rc == 0 && body > UINT32_MAX)
        e->rc = -E2BIG;
    if (e->rc != 0) {
        e->b->len = start;
        if (e->rc == -ENOMEM)
            return vks_error_set(err, -ENOMEM, "out of memory encoding a frame");
        if (e->rc == -E2BIG)
            return vks_error_set(err, -E2BIG,
                                 "a frame of %zu bytes does not fit the 4-byte length prefix: "
                                 "split the request",
                                 body);
        return e->rc; /* -EINVAL: err was filled where it was found */
    }
    uint8_t *p = e->b->data + start;
    p[0] = (uint8_t)(body >> 24);
    p[1] = (uint8_t)(body >> 16);
    p[2] = (uint8_t)(body >> 8);
    p[3] = (uint8_t)body;
    return 0;
}

static void key(struct enc *e, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, k, n);
}

/* Writes `s` with every byte that does not start or continue a valid UTF-8
 * sequence replaced by U+FFFD: a rule id or an echoed op name from a client
 * must not make the reply undecodable for a strict msgpack reader. */
static void str_utf8(struct enc *e, const char *s, size_t n)
{
    static const char fffd[] = "\xef\xbf\xbd";
    size_t out = 0;
    for (size_t i = 0; i < n;) {
        size_t k = proto_utf8_seq((const uint8_t *)s + i, n - i);
        out += k != 0 ? k : 3;
        i += k != 0 ? k : 1;
    }
    msgpack_pack_str(&e->pk, out);
    for (size_t i = 0; i < n;) {
        size_t k = proto_utf8_seq((const uint8_t *)s + i, n - i);
        if (k != 0)
            msgpack_pack_str_body(&e->pk, s + i, k);
        else
            msgpack_pack_str_body(&e->pk, fffd, 3);
        i += k != 0 ? k : 1;
    }
}

static void str(struct enc *e, const char *s, size_t n)
{
    if (e->utf8 && !proto_utf8_valid((const uint8_t *)s, n)) {
        str_utf8(e, s, n);
        return;
    }
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, s, n);
}

static void cstr(struct enc *e, const char *s)
{
    str(e, s, strlen(s));
}

static void bin(struct enc *e, const void *p, size_t n)
{
    msgpack_pack_bin(&e->pk, n);
    msgpack_pack_bin_body(&e->pk, p, n);
}

static void kv_u64(struct enc *e, const char *k, uint64_t v)
{
    key(e, k);
    msgpack_pack_uint64(&e->pk, v);
}

static void kv_fp(struct enc *e, const char *k, const uint8_t *fp)
{
    key(e, k);
    bin(e, fp, PROTO_FP_LEN);
}

static void kv_bool(struct enc *e, const char *k, bool v)
{
    key(e, k);
    if (v)
        msgpack_pack_true(&e->pk);
    else
        msgpack_pack_false(&e->pk);
}

static int invalid(struct enc *e, struct vks_error *err, const char *what)
{
    e->rc = -EINVAL;
    return vks_error_set(err, -EINVAL, "cannot encode: %s", what);
}

static const char *const kind_names[] = {"literal", "hex", "regex"};
static const char *const mode_names[] = {"all", "first", "count"};

/* ---- requests ----------------------------------------------------------------- */

static int enc_rule(struct enc *e, const struct proto_rule *r, struct vks_error *err)
{
    if (r->id == NULL || (r->pattern == NULL && r->pattern_len > 0) || (unsigned)r->kind > 2)
        return invalid(e, err, "a rule needs an id, a pattern and a kind of literal, hex or regex");
    bool flags = r->flags != NULL && r->flags[0] != '\0';
    msgpack_pack_map(&e->pk, flags ? 4 : 3);
    key(e, "id");
    cstr(e, r->id);
    key(e, "kind");
    cstr(e, kind_names[r->kind]);
    key(e, "pattern");
    str(e, r->pattern != NULL ? r->pattern : "", r->pattern_len);
    if (flags) {
        key(e, "flags");
        cstr(e, r->flags);
    }
    return 0;
}

static int enc_load(struct enc *e, const struct proto_catalog_load *l, struct vks_error *err)
{
    key(e, l->has_text ? "text" : "rules");
    if (l->has_text) {
        if (l->text == NULL && l->text_len > 0)
            return invalid(e, err, "catalog.load text is NULL");
        str(e, l->text != NULL ? l->text : "", l->text_len);
    } else {
        msgpack_pack_array(&e->pk, l->n_rules);
        for (uint32_t i = 0; i < l->n_rules; i++) {
            if (enc_rule(e, &l->rules[i], err) < 0)
                return -EINVAL;
        }
    }
    if (l->max_states != 0)
        kv_u64(e, "max_states", l->max_states);
    if (l->ids_only)
        kv_bool(e, "ids_only", true);
    return 0;
}

static void enc_buffer(struct enc *e, const struct proto_buffer *b)
{
    if (!b->is_fd) {
        msgpack_pack_map(&e->pk, 1);
        key(e, "data");
        bin(e, b->data, (size_t)b->len);
        return;
    }
    msgpack_pack_map(&e->pk, 2 + (b->has_length ? 1 : 0));
    kv_u64(e, "fd", b->fd_index);
    kv_u64(e, "offset", b->offset);
    if (b->has_length)
        kv_u64(e, "length", b->length);
}

static int enc_scan(struct enc *e, const struct proto_scan *s, struct vks_error *err)
{
    if ((unsigned)s->mode > 2)
        return invalid(e, err, "scan mode must be all, first or count");
    kv_fp(e, "catalog", s->catalog);
    key(e, "buffers");
    msgpack_pack_array(&e->pk, s->n_buffers);
    for (uint32_t i = 0; i < s->n_buffers; i++) {
        if (!s->buffers[i].is_fd && s->buffers[i].data == NULL && s->buffers[i].len > 0)
            return invalid(e, err, "an inline buffer has no data");
        enc_buffer(e, &s->buffers[i]);
    }
    key(e, "mode");
    cstr(e, mode_names[s->mode]);
    kv_u64(e, "max_hits", s->max_hits);
    kv_u64(e, "timeout_ms", s->timeout_ms);
    kv_bool(e, "ids", s->rule_ids);
    if (s->no_cache)
        kv_bool(e, "cache", false); /* only then: older daemons know no `cache` */
    if (s->starts)
        kv_bool(e, "starts", true); /* only then, as `cache` */
    return 0;
}

/* Entries of the request map beyond id and op. */
static uint32_t request_fields(const struct proto_request *req)
{
    switch (req->op) {
    case PROTO_OP_HELLO:
        return 2 + (req->u.hello.client != NULL ? 1 : 0) + (req->u.hello.read_ahead ? 1 : 0);
    case PROTO_OP_CATALOG_LOAD:
        return 1 + (req->u.load.max_states != 0 ? 1 : 0) + (req->u.load.ids_only ? 1 : 0);
    case PROTO_OP_CATALOG_HAS:
        return 1 + (req->u.ref.ids_only ? 1 : 0);
    case PROTO_OP_CATALOG_DROP:
        return 1;
    case PROTO_OP_SCAN:
        return 6 + (req->u.scan.no_cache ? 1 : 0) + (req->u.scan.starts ? 1 : 0);
    case PROTO_OP_STREAM_OPEN:
        return 1 + (req->u.stream.count != 0 ? 1 : 0) + (req->u.stream.mode != 0 ? 1 : 0);
    case PROTO_OP_STREAM_CLOSE:
        return 1;
    case PROTO_OP_STREAM_WRITE:
    case PROTO_OP_STREAM_WRITES:
        return 2;
    default:
        return 0;
    }
}

static int enc_request_body(struct enc *e, const struct proto_request *req, struct vks_error *err)
{
    const struct proto_hello *h = &req->u.hello;
    switch (req->op) {
    case PROTO_OP_HELLO:
        kv_u64(e, "version", h->version);
        kv_u64(e, "min_version", h->min_version != 0 ? h->min_version : h->version);
        if (h->client != NULL) {
            key(e, "client");
            cstr(e, h->client);
        }
        if (h->read_ahead)
            kv_bool(e, "read_ahead", true);
        return 0;
    case PROTO_OP_CATALOG_LOAD:
        return enc_load(e, &req->u.load, err);
    case PROTO_OP_CATALOG_HAS:
    case PROTO_OP_CATALOG_DROP:
        kv_fp(e, req->u.ref.by_source ? "source" : "fingerprint", req->u.ref.fp);
        if (req->op == PROTO_OP_CATALOG_HAS && req->u.ref.ids_only)
            kv_bool(e, "ids_only", true);
        return 0;
    case PROTO_OP_SCAN:
        return enc_scan(e, &req->u.scan, err);
    case PROTO_OP_STREAM_OPEN:
        kv_fp(e, "catalog", req->u.stream.catalog);
        if (req->u.stream.count != 0)
            kv_u64(e, "count", req->u.stream.count);
        if ((unsigned)req->u.stream.mode > 2)
            return invalid(e, err, "stream mode must be all or count");
        if (req->u.stream.mode != 0) { /* only then: older daemons know no `mode` here */
            key(e, "mode");
            cstr(e, mode_names[req->u.stream.mode]);
        }
        return 0;
    case PROTO_OP_STREAM_WRITE:
        kv_u64(e, "stream", req->u.stream.stream);
        key(e, "buffer");
        enc_buffer(e, &req->u.stream.buffer);
        return 0;
    case PROTO_OP_STREAM_CLOSE:
        if (req->u.stream.n_streams == 0) {
            kv_u64(e, "stream", req->u.stream.stream);
            return 0;
        }
        key(e, "streams");
        msgpack_pack_array(&e->pk, req->u.stream.n_streams);
        for (uint32_t i = 0; i < req->u.stream.n_streams; i++)
            msgpack_pack_uint32(&e->pk, req->u.stream.streams[i]);
        return 0;
    case PROTO_OP_STREAM_WRITES: {
        const struct proto_stream_writes *w = &req->u.writes;
        if (w->n_streams != w->n_buffers)
            return invalid(e, err, "stream.writes needs one stream per buffer");
        key(e, "streams");
        msgpack_pack_array(&e->pk, w->n_streams);
        for (uint32_t i = 0; i < w->n_streams; i++)
            msgpack_pack_uint32(&e->pk, w->streams[i]);
        key(e, "buffers");
        msgpack_pack_array(&e->pk, w->n_buffers);
        for (uint32_t i = 0; i < w->n_buffers; i++) {
            if (!w->buffers[i].is_fd && w->buffers[i].data == NULL && w->buffers[i].len > 0)
                return invalid(e, err, "an inline buffer has no data");
            enc_buffer(e, &w->buffers[i]);
        }
        return 0;
    }
    default:
        return 0;
    }
}

int proto_request_encode(struct proto_buf *out, const struct proto_request *req,
                         struct vks_error *err)
{
    struct enc e;
    size_t start = out->len;
    const char *op = proto_op_name(req->op);
    if (op == NULL || (req->op == PROTO_OP_CATALOG_DROP && req->u.ref.by_source))
        return vks_error_set(err, -EINVAL, "cannot encode op %d: not a request of this protocol",
                             (int)req->op);
    enc_init(&e, out);
    msgpack_pack_map(&e.pk, 2 + request_fields(req));
    kv_u64(&e, "id", req->id);
    key(&e, "op");
    cstr(&e, op);
    enc_request_body(&e, req, err);
    return enc_finish(&e, start, err);
}

/* ---- replies ------------------------------------------------------------------ */

static void enc_limits(struct enc *e, const struct proto_limits *l)
{
    msgpack_pack_map(&e->pk, 8);
    kv_u64(e, "max_frame", l->max_frame);
    kv_u64(e, "max_depth", l->max_depth);
    kv_u64(e, "max_str", l->max_str);
    kv_u64(e, "max_array", l->max_array);
    kv_u64(e, "max_buffers", l->max_buffers);
    kv_u64(e, "max_rules", l->max_rules);
    kv_u64(e, "max_fds", l->max_fds);
    kv_u64(e, "max_hits", l->max_hits);
}

static int enc_hello_reply(struct enc *e, const struct proto_hello_reply *h, struct vks_error *err)
{
    if (h->server == NULL)
        return invalid(e, err, "hello reply needs a server name");
    msgpack_pack_map(&e->pk, 5);
    kv_u64(e, "version", h->version);
    kv_u64(e, "min_version", h->min_version);
    key(e, "server");
    cstr(e, h->server);
    key(e, "limits");
    enc_limits(e, &h->limits);
    key(e, "devices");
    msgpack_pack_array(&e->pk, h->n_devices);
    for (uint32_t i = 0; i < h->n_devices; i++) {
        const struct proto_device *d = &h->devices[i];
        if (d->name == NULL || d->type == NULL)
            return invalid(e, err, "a device needs a name and a type");
        msgpack_pack_map(&e->pk, 5);
        kv_u64(e, "index", d->index);
        key(e, "name");
        cstr(e, d->name);
        key(e, "type");
        cstr(e, d->type);
        kv_u64(e, "memory", d->memory);
        kv_bool(e, "active", d->active);
    }
    return 0;
}

/* One `[id, fingerprint]` of a catalog result. A catalog of 43 k rules
 * went through the packer's callback five times a rule (6 ms of the
 * daemon's loop per catalog.has); a valid UTF-8 id of under 256 bytes is
 * written here directly, with one reserve. */
static void rule_info(struct enc *e, const char *id, const uint8_t fp[PROTO_FP_LEN])
{
    size_t n = strlen(id);
    if (n > 255 || !proto_utf8_valid((const uint8_t *)id, n)) {
        msgpack_pack_array(&e->pk, 2);
        cstr(e, id);
        bin(e, fp, PROTO_FP_LEN);
        return;
    }
    if (e->rc != 0)
        return;
    if (proto_buf_reserve(e->b, 1 + 2 + n + 2 + PROTO_FP_LEN) < 0) {
        e->rc = -ENOMEM;
        return;
    }
    uint8_t *p = e->b->data + e->b->len;
    *p++ = 0x92; /* fixarray of 2 */
    if (n < 32) {
        *p++ = (uint8_t)(0xa0 | n); /* fixstr */
    } else {
        *p++ = 0xd9; /* str 8 */
        *p++ = (uint8_t)n;
    }
    memcpy(p, id, n);
    p += n;
    *p++ = 0xc4; /* bin 8 */
    *p++ = PROTO_FP_LEN;
    memcpy(p, fp, PROTO_FP_LEN);
    p += PROTO_FP_LEN;
    e->b->len = (size_t)(p - e->b->data);
}

static int enc_rules(struct enc *e, const struct proto_rule_info *rules, uint32_t n, bool ids_only,
                     struct vks_error *err)
{
    msgpack_pack_array(&e->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        if (rules[i].id == NULL)
            return invalid(e, err, "a rule in a catalog result has no id");
        if (ids_only)
            cstr(e, rules[i].id);
        else
            rule_info(e, rules[i].id, rules[i].fp);
    }
    return 0;
}

static int enc_catalog(struct enc *e, const struct proto_catalog_result *c, bool has,
                       struct vks_error *err)
{
    if (has && !c->known) {
        msgpack_pack_map(&e->pk, 1);
        kv_bool(e, "known", false);
        return 0;
    }
    msgpack_pack_map(&e->pk, 6 + (has ? 1 : 0));
    if (has)
        kv_bool(e, "known", true);
    kv_fp(e, "fingerprint", c->fingerprint);
    kv_fp(e, "source", c->source);
    kv_bool(e, "cached", c->cached);
    kv_u64(e, "compile_ns", c->compile_ns);
    key(e, "rules");
    if (c->rules_packed != NULL)
        enc_write(e, (const char *)c->rules_packed, c->rules_packed_len);
    else if (enc_rules(e, c->rules, c->n_rules, c->ids_only, err) < 0)
        return -EINVAL;
    key(e, "rejected");
    msgpack_pack_array(&e->pk, c->n_rejects);
    for (uint32_t i = 0; i < c->n_rejects; i++) {
        const struct proto_reject *r = &c->rejects[i];
        msgpack_pack_map(&e->pk, 5);
        kv_u64(e, "index", r->index);
        kv_u64(e, "line", r->line);
        kv_u64(e, "pos", r->pos);
        key(e, "id");
        cstr(e, r->id != NULL ? r->id : "");
        key(e, "message");
        cstr(e, r->message != NULL ? r->message : "");
    }
    return 0;
}

static void enc_stats(struct enc *e, const struct proto_stat *s, uint32_t n)
{
    msgpack_pack_map(&e->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        cstr(e, s[i].key != NULL ? s[i].key : "");
        if (s[i].is_float)
            msgpack_pack_double(&e->pk, s[i].f);
        else
            msgpack_pack_uint64(&e->pk, s[i].u);
    }
}

static void enc_status(struct enc *e, const struct proto_buffer_status *b)
{
    bool msg = b->code != 0 && b->message != NULL;
    msgpack_pack_map(&e->pk, 4 + (msg ? 1 : 0) + (b->cached ? 1 : 0));
    kv_u64(e, "code", (uint64_t)(b->code < 0 ? -b->code : b->code));
    if (msg) {
        key(e, "message");
        cstr(e, b->message);
    }
    kv_u64(e, "bytes", b->bytes);
    kv_u64(e, "hits", b->hits);
    kv_bool(e, "truncated", b->truncated);
    if (b->cached)
        kv_bool(e, "cached", true);
}

static void enc_scan_reply(struct enc *e, const struct proto_scan_reply *s)
{
    msgpack_pack_map(&e->pk, 3);
    key(e, "hits");
    msgpack_pack_array(&e->pk, s->n_hits);
    for (uint32_t i = 0; i < s->n_hits; i++) {
        const struct proto_hit *h = &s->hits[i];
        /* [buffer, rule, end, count(, id(, start))]: a start without an id
         * puts nil in the id's place */
        msgpack_pack_array(&e->pk, h->has_start ? 6 : h->rule_id != NULL ? 5 : 4);
        msgpack_pack_uint32(&e->pk, h->buffer);
        msgpack_pack_uint32(&e->pk, h->rule);
        msgpack_pack_uint64(&e->pk, h->end);
        msgpack_pack_uint32(&e->pk, h->count);
        if (h->rule_id != NULL)
            cstr(e, h->rule_id);
        else if (h->has_start)
            msgpack_pack_nil(&e->pk);
        if (h->has_start)
            msgpack_pack_uint64(&e->pk, h->start);
    }
    key(e, "buffers");
    msgpack_pack_array(&e->pk, s->n_buffers);
    for (uint32_t i = 0; i < s->n_buffers; i++)
        enc_status(e, &s->buffers[i]);
    key(e, "telemetry");
    enc_stats(e, s->telemetry, s->n_telemetry);
}

static int enc_result(struct enc *e, const struct proto_reply *rep, struct vks_error *err)
{
    switch (rep->op) {
    case PROTO_OP_HELLO:
        return enc_hello_reply(e, &rep->u.hello, err);
    case PROTO_OP_CATALOG_LOAD:
    case PROTO_OP_CATALOG_HAS:
        return enc_catalog(e, &rep->u.catalog, rep->op == PROTO_OP_CATALOG_HAS, err);
    case PROTO_OP_CATALOG_DROP:
        msgpack_pack_map(&e->pk, 1);
        kv_bool(e, "dropped", rep->u.dropped);
        return 0;
    case PROTO_OP_SCAN:
    case PROTO_OP_STREAM_WRITE:
    case PROTO_OP_STREAM_CLOSE:
    case PROTO_OP_STREAM_WRITES:
        enc_scan_reply(e, &rep->u.scan);
        return 0;
    case PROTO_OP_STREAM_OPEN:
        msgpack_pack_map(&e->pk, 2 + (rep->u.stream.n_streams != 0 ? 1 : 0));
        kv_u64(e, "stream", rep->u.stream.stream);
        kv_u64(e, "state_bytes", rep->u.stream.state_bytes);
        if (rep->u.stream.n_streams != 0) {
            key(e, "streams");
            msgpack_pack_array(&e->pk, rep->u.stream.n_streams);
            for (uint32_t i = 0; i < rep->u.stream.n_streams; i++)
                msgpack_pack_uint32(&e->pk, rep->u.stream.streams[i]);
        }
        return 0;
    case PROTO_OP_STATS:
        enc_stats(e, rep->u.stats.stats, rep->u.stats.n_stats);
        return 0;
    default:
        msgpack_pack_map(&e->pk, 0);
        return 0;
    }
}

int proto_reply_encode(struct proto_buf *out, const struct proto_reply *rep, struct vks_error *err)
{
    struct enc e;
    size_t start = out->len;
    int code = rep->error.code;
    if (code > 0 || (code < 0 && (-code <= VKS_E_BASE || -code > VKS_E_MAX_CODE)))
        return vks_error_set(
            err, -EINVAL, "cannot encode error code %d: replies carry -VKS_E_* codes only", code);
    if ((unsigned)rep->op >= PROTO_OP_COUNT || (code == 0 && rep->op == PROTO_OP_NONE))
        return vks_error_set(err, -EINVAL, "cannot encode a result for op %d", (int)rep->op);
    enc_init(&e, out);
    e.utf8 = true;
    msgpack_pack_map(&e.pk, 2 + (rep->op != PROTO_OP_NONE ? 1 : 0));
    kv_u64(&e, "id", rep->id);
    if (rep->op != PROTO_OP_NONE) {
        key(&e, "op");
        cstr(&e, proto_op_name(rep->op));
    }
    if (code != 0) {
        key(&e, "error");
        msgpack_pack_map(&e.pk, 2);
        kv_u64(&e, "code", (uint64_t)-code);
        key(&e, "message");
        cstr(&e, rep->error.msg);
    } else {
        key(&e, "result");
        enc_result(&e, rep, err);
    }
    return enc_finish(&e, start, err);
}

int proto_error_encode(struct proto_buf *out, uint32_t id, enum proto_op op, int code,
                       const char *msg, struct vks_error *err)
{
    struct proto_reply rep = {.id = id, .op = op};
    rep.error.code = code;
    snprintf(rep.error.msg, sizeof(rep.error.msg), "%s", msg != NULL ? msg : "");
    if (code == 0)
        return vks_error_set(err, -EINVAL, "an error reply needs a non-zero code");
    return proto_reply_encode(out, &rep, err);
}

int proto_pack_rules(struct proto_buf *out, const struct proto_rule_info *rules, uint32_t n,
                     bool ids_only, struct vks_error *err)
{
    struct enc e;
    size_t start = out->len;
    e.b = out;
    e.rc = 0;
    e.utf8 = true;
    msgpack_packer_init(&e.pk, &e, enc_write);
    enc_rules(&e, rules, n, ids_only, err);
    if (e.rc != 0) {
        out->len = start;
        return e.rc == -ENOMEM ? vks_error_set(err, -ENOMEM, "out of memory packing rules") : e.rc;
    }
    return 0;
}
