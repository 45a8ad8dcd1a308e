/*
 * Structure-aware libFuzzer target for request maps. Byte streams that
 * fuzz_proto feeds rarely get past "not a map" or "missing field"; here the
 * input drives a generator instead: it picks an op and then fields from the
 * protocol's own names (docs/protocol.md), each with a value of the right
 * msgpack type most of the time and of a wrong one sometimes, with nested
 * rule and buffer maps, duplicate keys, unknown keys and descriptors. The
 * frame is decoded as a request; a request that decodes (scans aside: their
 * descriptors are not re-sent) must re-encode, and its re-encoding must
 * decode to the same op and id. Seeds: tests/fuzz/seeds-request/ (any bytes
 * are a valid input; the seeds steer the generator to each op).
 */
#include <msgpack.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

struct gen {
    const uint8_t *p;
    size_t n, off;
    msgpack_packer pk;
};

/* The next input byte (0 once the input is used up). */
static uint8_t next(struct gen *g)
{
    return g->off < g->n ? g->p[g->off++] : 0;
}

static void pack_s(struct gen *g, const char *s)
{
    msgpack_pack_str(&g->pk, strlen(s));
    msgpack_pack_str_body(&g->pk, s, strlen(s));
}

static const char *const ops[] = {"hello",        "ping", "catalog.load", "catalog.has",
                                  "catalog.drop", "scan", "stats",        "sc\xffn"};
static const char *const fields[] = {
    "version",     "min_version", "client",  "rules",   "text",    "max_states",
    "fingerprint", "source",      "catalog", "buffers", "mode",    "max_hits",
    "timeout_ms",  "ids",         "id",      "kind",    "pattern", "flags",
    "data",        "fd",          "offset",  "length",  "op",      "unknown"};
static const char *const words[] = {"literal", "hex",  "regex",  "all",    "first",
                                    "count",   "abc",  "i",      "",       "de ad ?? ef",
                                    "a(b",     "\xc3", "needle", "x{1,5}y"};

static void value(struct gen *g, int depth);

static void pack_rule(struct gen *g, int depth)
{
    uint32_t n = next(g) % 6;
    msgpack_pack_map(&g->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        static const char *const rk[] = {"id", "kind", "pattern", "flags", "line", "id"};
        pack_s(g, rk[next(g) % 6]);
        value(g, depth + 1);
    }
}

static void pack_buffer(struct gen *g, int depth)
{
    uint32_t n = next(g) % 5;
    msgpack_pack_map(&g->pk, n);
    for (uint32_t i = 0; i < n; i++) {
        static const char *const bk[] = {"data", "fd", "offset", "length", "x"};
        pack_s(g, bk[next(g) % 5]);
        value(g, depth + 1);
    }
}

/* A value: the selector byte's low bits pick the type. */
static void value(struct gen *g, int depth)
{
    uint8_t sel = next(g);
    switch (depth > 6 ? sel % 8 : sel % 13) {
    case 0:
        msgpack_pack_uint32(&g->pk, next(g) | (uint32_t)next(g) << 8);
        break;
    case 1:
        msgpack_pack_uint64(&g->pk, (uint64_t)next(g) << 32 | 0xffffffffu);
        break;
    case 2:
        msgpack_pack_int32(&g->pk, -(int32_t)next(g));
        break;
    case 3:
        pack_s(g, words[next(g) % (sizeof(words) / sizeof(words[0]))]);
        break;
    case 4: {
        uint8_t len = next(g) % 40;
        uint8_t fill = next(g);
        uint8_t buf[40];
        memset(buf, fill, len);
        msgpack_pack_bin(&g->pk, len == 33 ? 32 : len);
        msgpack_pack_bin_body(&g->pk, buf, len == 33 ? 32 : len);
        break;
    }
    case 5:
        if (next(g) & 1)
            msgpack_pack_true(&g->pk);
        else
            msgpack_pack_false(&g->pk);
        break;
    case 6:
        msgpack_pack_nil(&g->pk);
        break;
    case 7:
        msgpack_pack_double(&g->pk, (double)next(g) / 3.0);
        break;
    case 8:
    case 9: {
        uint32_t n = next(g) % 5;
        msgpack_pack_array(&g->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            if (sel & 16)
                pack_rule(g, depth + 1);
            else
                pack_buffer(g, depth + 1);
        }
        break;
    }
    case 10: {
        uint32_t n = next(g) % 4;
        msgpack_pack_array(&g->pk, n);
        for (uint32_t i = 0; i < n; i++)
            value(g, depth + 1);
        break;
    }
    case 11:
        pack_rule(g, depth + 1);
        break;
    default: {
        uint32_t n = next(g) % 4;
        msgpack_pack_map(&g->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            pack_s(g, fields[next(g) % (sizeof(fields) / sizeof(fields[0]))]);
            value(g, depth + 1);
        }
        break;
    }
    }
}

/* Builds one request map from the input into `sb`. */
static void generate(struct gen *g)
{
    uint8_t shape = next(g);
    uint32_t extra = next(g) % 6;
    bool with_id = (shape & 1) == 0, with_op = (shape & 2) == 0;
    msgpack_pack_map(&g->pk, extra + with_id + with_op);
    if (with_id) {
        pack_s(g, "id");
        if (shape & 4)
            value(g, 1);
        else
            msgpack_pack_uint32(&g->pk, next(g));
    }
    if (with_op) {
        pack_s(g, "op");
        pack_s(g, ops[next(g) % (sizeof(ops) / sizeof(ops[0]))]);
    }
    for (uint32_t i = 0; i < extra; i++) {
        pack_s(g, fields[next(g) % (sizeof(fields) / sizeof(fields[0]))]);
        value(g, 1);
    }
}

static struct proto_frame frame_of(const void *data, size_t len, int n_fds)
{
    struct proto_frame f = {.len = len, .data = malloc(len ? len : 1)};
    if (f.data != NULL)
        memcpy(f.data, data, len);
    if (n_fds > 0) {
        f.fds = malloc((size_t)n_fds * sizeof(int));
        for (int i = 0; f.fds != NULL && i < n_fds; i++)
            f.fds[f.n_fds++] = -1; /* never used: decoding does not touch them */
    }
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_limits lim = {.max_frame = 1u << 20,
                               .max_depth = 8,
                               .max_str = 4096,
                               .max_array = 64,
                               .max_buffers = 16,
                               .max_rules = 32,
                               .max_fds = 4};
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    struct gen g = {.p = data, .n = size};
    msgpack_packer_init(&g.pk, &sb, msgpack_sbuffer_write);
    generate(&g);
    int n_fds = size > 0 ? data[size - 1] % 3 : 0;
    struct proto_frame f = frame_of(sb.data, sb.size, n_fds);
    msgpack_sbuffer_destroy(&sb);
    if (f.data == NULL)
        return 0;
    struct proto_request *req = NULL;
    struct proto_head head;
    struct vks_error err;
    if (proto_request_decode(&f, &lim, &req, &head, &err) == 0 && req->op != PROTO_OP_SCAN) {
        struct proto_buf b;
        proto_buf_init(&b);
        if (proto_request_encode(&b, req, &err) != 0)
            abort(); /* a decoded request is in range */
        struct proto_frame again = frame_of(b.data + PROTO_HEADER_LEN, b.len - PROTO_HEADER_LEN, 0);
        struct proto_request *req2 = NULL;
        if (proto_request_decode(&again, &lim, &req2, &head, &err) != 0 || req2->op != req->op ||
            req2->id != req->id)
            abort(); /* the re-encoding must mean the same */
        proto_request_destroy(req2);
        proto_buf_finish(&b);
    }
    proto_request_destroy(req);
    return 0;
}
