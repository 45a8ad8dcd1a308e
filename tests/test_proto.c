/*
 * proto: round trips of every message, the frame accumulator under arbitrary
 * chunking, and every decoding limit with its exact error code.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto.h"

/* ---- helpers ------------------------------------------------------------------- */

/* Feeds `buf` one byte at a time and returns the single frame it holds. */
static void feed_bytewise(const uint8_t *buf, size_t len, struct proto_frame *f)
{
    struct proto_reader *r;
    struct vks_error err;
    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    for (size_t i = 0; i < len; i++) {
        size_t used;
        int rc = proto_reader_feed(r, buf + i, 1, &used, &err);
        ck_assert_uint_eq(used, 1);
        ck_assert_int_eq(rc, i + 1 == len ? 1 : 0);
        ck_assert(!proto_reader_idle(r));
    }
    ck_assert_int_eq(proto_reader_take(r, f), 0);
    ck_assert(proto_reader_idle(r));
    proto_reader_destroy(r);
}

static struct proto_request *roundtrip_request(const struct proto_request *in)
{
    struct proto_buf b;
    struct proto_frame f;
    struct proto_request *out = NULL;
    struct proto_head head;
    struct vks_error err = {0};
    proto_buf_init(&b);
    ck_assert_int_eq(proto_request_encode(&b, in, &err), 0);
    feed_bytewise(b.data, b.len, &f);
    ck_assert_uint_eq(f.len, b.len - PROTO_HEADER_LEN);
    int rc = proto_request_decode(&f, NULL, &out, &head, &err);
    ck_assert_msg(rc == 0, "decode failed: %d %s", rc, err.msg);
    ck_assert_uint_eq(out->id, in->id);
    ck_assert_int_eq(out->op, in->op);
    ck_assert_uint_eq(head.id, in->id);
    proto_buf_finish(&b);
    return out;
}

static struct proto_reply *roundtrip_reply(const struct proto_reply *in)
{
    struct proto_buf b;
    struct proto_frame f;
    struct proto_reply *out = NULL;
    struct vks_error err = {0};
    proto_buf_init(&b);
    ck_assert_int_eq(proto_reply_encode(&b, in, &err), 0);
    feed_bytewise(b.data, b.len, &f);
    int rc = proto_reply_decode(&f, NULL, &out, &err);
    ck_assert_msg(rc == 0, "decode failed: %d %s", rc, err.msg);
    ck_assert_uint_eq(out->id, in->id);
    ck_assert_int_eq(out->op, in->op);
    proto_buf_finish(&b);
    return out;
}

/* A raw frame built with msgpack-c, for inputs our encoder would refuse. */
struct raw {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static void raw_init(struct raw *r)
{
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static void raw_str(struct raw *r, const char *s)
{
    msgpack_pack_str(&r->pk, strlen(s));
    msgpack_pack_str_body(&r->pk, s, strlen(s));
}

/* Moves the packed bytes into a frame (as the reader would deliver them). */
static void raw_frame(struct raw *r, struct proto_frame *f)
{
    memset(f, 0, sizeof(*f));
    f->len = r->sb.size;
    f->data = malloc(f->len ? f->len : 1);
    memcpy(f->data, r->sb.data, f->len);
    msgpack_sbuffer_destroy(&r->sb);
}

/* Decodes a raw request that must fail with `code`; returns the head. */
static struct proto_head expect_fail(struct raw *r, const struct proto_limits *lim, int code)
{
    struct proto_frame f;
    struct proto_request *req = NULL;
    struct proto_head head;
    struct vks_error err = {0};
    raw_frame(r, &f);
    int rc = proto_request_decode(&f, lim, &req, &head, &err);
    ck_assert_msg(rc == code, "expected %d (%s), got %d: %s", code, proto_strerror(code), rc,
                  err.msg);
    ck_assert_int_eq(err.code, code);
    ck_assert(err.msg[0] != '\0');
    ck_assert_ptr_null(req);
    ck_assert_ptr_null(f.data);
    return head;
}

static void map_head(struct raw *r, uint32_t n, uint32_t id, const char *op)
{
    msgpack_pack_map(&r->pk, n);
    raw_str(r, "id");
    msgpack_pack_uint32(&r->pk, id);
    raw_str(r, "op");
    raw_str(r, op);
}

static const uint8_t fp_a[PROTO_FP_LEN] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                           12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                           23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

/* ---- round trips --------------------------------------------------------------- */

START_TEST(rt_hello_ping_stats)
{
    struct proto_request in = {.id = 7, .op = PROTO_OP_HELLO};
    in.u.hello.version = 1;
    in.u.hello.client = "tests";
    struct proto_request *out = roundtrip_request(&in);
    ck_assert_uint_eq(out->u.hello.version, 1);
    ck_assert_uint_eq(out->u.hello.min_version, 1);
    ck_assert_str_eq(out->u.hello.client, "tests");
    ck_assert(!out->u.hello.read_ahead);
    proto_request_destroy(out);
    in.u.hello.read_ahead = true;
    out = roundtrip_request(&in);
    ck_assert(out->u.hello.read_ahead);
    proto_request_destroy(out);

    struct proto_request ping = {.id = UINT32_MAX, .op = PROTO_OP_PING};
    proto_request_destroy(roundtrip_request(&ping));
    struct proto_request stats = {.id = 0, .op = PROTO_OP_STATS};
    proto_request_destroy(roundtrip_request(&stats));
}
END_TEST

START_TEST(rt_catalog_load_rules)
{
    struct proto_rule rules[3] = {
        {.id = "lit", .kind = PROTO_KIND_LITERAL, .pattern = "abc\0d", .pattern_len = 5},
        {.id = "hex", .kind = PROTO_KIND_HEX, .pattern = "4d 5a ?? 00", .pattern_len = 11},
        {.id = "re", .kind = PROTO_KIND_REGEX, .pattern = "fo+", .pattern_len = 3, .flags = "iH"},
    };
    struct proto_request in = {.id = 3, .op = PROTO_OP_CATALOG_LOAD};
    in.u.load.rules = rules;
    in.u.load.n_rules = 3;
    in.u.load.max_states = 1000;
    struct proto_request *out = roundtrip_request(&in);
    const struct proto_catalog_load *l = &out->u.load;
    ck_assert(!l->has_text);
    ck_assert_uint_eq(l->n_rules, 3);
    ck_assert_uint_eq(l->max_states, 1000);
    ck_assert_str_eq(l->rules[0].id, "lit");
    ck_assert_uint_eq(l->rules[0].pattern_len, 5);
    ck_assert_mem_eq(l->rules[0].pattern, "abc\0d", 5);
    ck_assert_str_eq(l->rules[0].flags, "");
    ck_assert_int_eq(l->rules[1].kind, PROTO_KIND_HEX);
    ck_assert_int_eq(l->rules[2].kind, PROTO_KIND_REGEX);
    ck_assert_str_eq(l->rules[2].flags, "iH");
    proto_request_destroy(out);
}
END_TEST

START_TEST(rt_catalog_load_text_has_drop)
{
    static const char text[] = "1:/foo/i\n2:/ba[rz]/\n";
    struct proto_request in = {.id = 4, .op = PROTO_OP_CATALOG_LOAD};
    in.u.load.has_text = true;
    in.u.load.text = text;
    in.u.load.text_len = sizeof(text) - 1;
    struct proto_request *out = roundtrip_request(&in);
    ck_assert(out->u.load.has_text);
    ck_assert_uint_eq(out->u.load.text_len, sizeof(text) - 1);
    ck_assert_mem_eq(out->u.load.text, text, sizeof(text) - 1);
    proto_request_destroy(out);

    struct proto_request has = {.id = 5, .op = PROTO_OP_CATALOG_HAS};
    has.u.ref.by_source = true;
    memcpy(has.u.ref.fp, fp_a, PROTO_FP_LEN);
    out = roundtrip_request(&has);
    ck_assert(out->u.ref.by_source);
    ck_assert_mem_eq(out->u.ref.fp, fp_a, PROTO_FP_LEN);
    proto_request_destroy(out);

    struct proto_request drop = {.id = 6, .op = PROTO_OP_CATALOG_DROP};
    memcpy(drop.u.ref.fp, fp_a, PROTO_FP_LEN);
    out = roundtrip_request(&drop);
    ck_assert(!out->u.ref.by_source);
    ck_assert_mem_eq(out->u.ref.fp, fp_a, PROTO_FP_LEN);
    proto_request_destroy(out);
}
END_TEST

START_TEST(rt_scan_inline)
{
    struct proto_buffer bufs[2] = {{.data = (const uint8_t *)"hello", .len = 5},
                                   {.data = (const uint8_t *)"", .len = 0}};
    struct proto_request in = {.id = 9, .op = PROTO_OP_SCAN};
    memcpy(in.u.scan.catalog, fp_a, PROTO_FP_LEN);
    in.u.scan.buffers = bufs;
    in.u.scan.n_buffers = 2;
    in.u.scan.mode = PROTO_REPORT_COUNT;
    in.u.scan.max_hits = 10;
    in.u.scan.timeout_ms = 250;
    in.u.scan.rule_ids = true;
    struct proto_request *out = roundtrip_request(&in);
    const struct proto_scan *s = &out->u.scan;
    ck_assert_mem_eq(s->catalog, fp_a, PROTO_FP_LEN);
    ck_assert_uint_eq(s->n_buffers, 2);
    ck_assert(!s->buffers[0].is_fd);
    ck_assert_int_eq(s->buffers[0].fd, -1);
    ck_assert_uint_eq(s->buffers[0].len, 5);
    ck_assert_mem_eq(s->buffers[0].data, "hello", 5);
    ck_assert_uint_eq(s->buffers[1].len, 0);
    ck_assert_int_eq(s->mode, PROTO_REPORT_COUNT);
    ck_assert_uint_eq(s->max_hits, 10);
    ck_assert_uint_eq(s->timeout_ms, 250);
    ck_assert(s->rule_ids);
    proto_request_destroy(out);
}
END_TEST

/* stream.writes: one stream id per buffer, in order; the decoder refuses
 * lists of different lengths and a missing list. */
START_TEST(rt_stream_writes)
{
    uint32_t ids[3] = {7, 3, 7};
    struct proto_buffer bufs[3] = {{.data = (const uint8_t *)"ab", .len = 2},
                                   {.data = (const uint8_t *)"", .len = 0},
                                   {.data = (const uint8_t *)"xyz", .len = 3}};
    struct proto_request in = {.id = 12, .op = PROTO_OP_STREAM_WRITES};
    in.u.writes = (struct proto_stream_writes){
        .streams = ids, .n_streams = 3, .buffers = bufs, .n_buffers = 3};
    struct proto_request *out = roundtrip_request(&in);
    const struct proto_stream_writes *w = &out->u.writes;
    ck_assert_uint_eq(w->n_streams, 3);
    ck_assert_uint_eq(w->n_buffers, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(w->streams[i], ids[i]);
        ck_assert_uint_eq(w->buffers[i].len, bufs[i].len);
    }
    ck_assert_mem_eq(w->buffers[2].data, "xyz", 3);
    proto_request_destroy(out);

    struct raw r;
    raw_init(&r);
    map_head(&r, 4, 40, "stream.writes");
    raw_str(&r, "streams");
    msgpack_pack_array(&r.pk, 2);
    msgpack_pack_uint32(&r.pk, 1);
    msgpack_pack_uint32(&r.pk, 2);
    raw_str(&r, "buffers");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_map(&r.pk, 1);
    raw_str(&r, "data");
    msgpack_pack_bin(&r.pk, 1);
    msgpack_pack_bin_body(&r.pk, "q", 1);
    expect_fail(&r, NULL, -VKS_E_BAD_VALUE);

    /* stream.open `count`, stream.close `streams` */
    struct proto_request op = {.id = 13, .op = PROTO_OP_STREAM_OPEN};
    memcpy(op.u.stream.catalog, fp_a, PROTO_FP_LEN);
    op.u.stream.count = 5;
    out = roundtrip_request(&op);
    ck_assert_uint_eq(out->u.stream.count, 5);
    proto_request_destroy(out);
    struct proto_request cl = {.id = 14, .op = PROTO_OP_STREAM_CLOSE};
    cl.u.stream.streams = ids;
    cl.u.stream.n_streams = 3;
    out = roundtrip_request(&cl);
    ck_assert_uint_eq(out->u.stream.n_streams, 3);
    ck_assert_uint_eq(out->u.stream.streams[1], 3);
    proto_request_destroy(out);
    uint32_t opened[3] = {4, 5, 9};
    struct proto_reply orep = {.id = 13, .op = PROTO_OP_STREAM_OPEN};
    orep.u.stream = (struct proto_stream_reply){
        .stream = 4, .state_bytes = 100, .streams = opened, .n_streams = 3};
    struct proto_reply *ro = roundtrip_reply(&orep);
    ck_assert_uint_eq(ro->u.stream.n_streams, 3);
    ck_assert_uint_eq(ro->u.stream.streams[2], 9);
    proto_reply_destroy(ro);

    raw_init(&r);
    map_head(&r, 3, 41, "stream.writes");
    raw_str(&r, "streams");
    msgpack_pack_array(&r.pk, 0);
    expect_fail(&r, NULL, -VKS_E_MISSING_FIELD);
}
END_TEST

START_TEST(rt_replies)
{
    struct proto_device dev = {
        .index = 0, .name = "llvmpipe", .type = "cpu", .memory = 1u << 30, .active = true};
    struct proto_reply hello = {.id = 1, .op = PROTO_OP_HELLO};
    hello.u.hello = (struct proto_hello_reply){
        .version = 1, .min_version = 1, .server = "vkscand 0.1.0", .devices = &dev, .n_devices = 1};
    proto_limits_default(&hello.u.hello.limits);
    struct proto_reply *out = roundtrip_reply(&hello);
    ck_assert_str_eq(out->u.hello.server, "vkscand 0.1.0");
    ck_assert_uint_eq(out->u.hello.limits.max_frame, PROTO_DEFAULT_MAX_FRAME);
    ck_assert_uint_eq(out->u.hello.limits.max_hits, PROTO_DEFAULT_MAX_HITS);
    ck_assert_uint_eq(out->u.hello.n_devices, 1);
    ck_assert_str_eq(out->u.hello.devices[0].name, "llvmpipe");
    ck_assert_uint_eq(out->u.hello.devices[0].memory, 1u << 30);
    ck_assert(out->u.hello.devices[0].active);
    proto_reply_destroy(out);

    struct proto_rule_info infos[2] = {{.id = "a"}, {.id = "b"}};
    infos[1].fp[31] = 0xee;
    struct proto_reject rej = {.index = 2, .line = 0, .pos = 3, .id = "c", .message = "bad"};
    struct proto_reply load = {.id = 2, .op = PROTO_OP_CATALOG_LOAD};
    load.u.catalog = (struct proto_catalog_result){.known = true,
                                                   .compile_ns = 42,
                                                   .rules = infos,
                                                   .n_rules = 2,
                                                   .rejects = &rej,
                                                   .n_rejects = 1};
    memcpy(load.u.catalog.fingerprint, fp_a, PROTO_FP_LEN);
    out = roundtrip_reply(&load);
    ck_assert_mem_eq(out->u.catalog.fingerprint, fp_a, PROTO_FP_LEN);
    ck_assert_uint_eq(out->u.catalog.compile_ns, 42);
    ck_assert_uint_eq(out->u.catalog.n_rules, 2);
    ck_assert_str_eq(out->u.catalog.rules[1].id, "b");
    ck_assert_uint_eq(out->u.catalog.rules[1].fp[31], 0xee);
    ck_assert_uint_eq(out->u.catalog.n_rejects, 1);
    ck_assert_uint_eq(out->u.catalog.rejects[0].pos, 3);
    ck_assert_str_eq(out->u.catalog.rejects[0].message, "bad");
    proto_reply_destroy(out);

    struct proto_reply has = {.id = 3, .op = PROTO_OP_CATALOG_HAS};
    out = roundtrip_reply(&has);
    ck_assert(!out->u.catalog.known);
    proto_reply_destroy(out);

    struct proto_reply drop = {.id = 4, .op = PROTO_OP_CATALOG_DROP, .u.dropped = true};
    out = roundtrip_reply(&drop);
    ck_assert(out->u.dropped);
    proto_reply_destroy(out);

    struct proto_reply ping = {.id = 5, .op = PROTO_OP_PING};
    proto_reply_destroy(roundtrip_reply(&ping));
}
END_TEST

START_TEST(rt_scan_and_stats_replies)
{
    struct proto_hit hits[2] = {
        {.buffer = 0, .rule = 1, .end = 5, .count = 1},
        {.buffer = 1, .rule = 0, .end = UINT64_C(1) << 40, .count = 9, .rule_id = "r0"}};
    struct proto_buffer_status st[2] = {
        {.bytes = 5, .hits = 1},
        {.code = -VKS_E_BAD_FD, .message = "short", .hits = 1, .truncated = true}};
    struct proto_stat tel[2] = {{.key = "bytes_uploaded", .u = 0},
                                {.key = "occupancy", .is_float = true, .f = 0.5}};
    struct proto_reply scan = {.id = 8, .op = PROTO_OP_SCAN};
    scan.u.scan = (struct proto_scan_reply){.hits = hits,
                                            .n_hits = 2,
                                            .buffers = st,
                                            .n_buffers = 2,
                                            .telemetry = tel,
                                            .n_telemetry = 2};
    struct proto_reply *out = roundtrip_reply(&scan);
    const struct proto_scan_reply *s = &out->u.scan;
    ck_assert_uint_eq(s->n_hits, 2);
    ck_assert_uint_eq(s->hits[0].end, 5);
    ck_assert_ptr_null(s->hits[0].rule_id);
    ck_assert_uint_eq(s->hits[1].end, UINT64_C(1) << 40);
    ck_assert_uint_eq(s->hits[1].count, 9);
    ck_assert_str_eq(s->hits[1].rule_id, "r0");
    ck_assert_int_eq(s->buffers[0].code, 0);
    ck_assert_int_eq(s->buffers[1].code, -VKS_E_BAD_FD);
    ck_assert_str_eq(s->buffers[1].message, "short");
    ck_assert(s->buffers[1].truncated);
    ck_assert_str_eq(s->telemetry[1].key, "occupancy");
    ck_assert(s->telemetry[1].is_float);
    ck_assert(s->telemetry[1].f == 0.5);
    proto_reply_destroy(out);

    struct proto_reply stats = {.id = 9, .op = PROTO_OP_STATS};
    stats.u.stats = (struct proto_stats_reply){.stats = tel, .n_stats = 1};
    out = roundtrip_reply(&stats);
    ck_assert_uint_eq(out->u.stats.n_stats, 1);
    ck_assert_str_eq(out->u.stats.stats[0].key, "bytes_uploaded");
    proto_reply_destroy(out);
}
END_TEST

/* Starts travel as a sixth element, with nil for a missing id; a scan's
 * `starts` option round-trips, and is absent when false. */
START_TEST(rt_hit_starts)
{
    struct proto_hit hits[3] = {
        {.buffer = 0, .rule = 1, .end = 5, .count = 1, .has_start = true, .start = 2},
        {.buffer = 0, .rule = 2, .end = 7, .count = 1},
        {.buffer = 1, .rule = 0, .end = 90, .count = 1, .rule_id = "r0", .has_start = true}};
    struct proto_buffer_status st[2] = {{.bytes = 5, .hits = 2}, {.bytes = 90, .hits = 1}};
    struct proto_reply scan = {.id = 8, .op = PROTO_OP_SCAN};
    scan.u.scan =
        (struct proto_scan_reply){.hits = hits, .n_hits = 3, .buffers = st, .n_buffers = 2};
    struct proto_reply *out = roundtrip_reply(&scan);
    const struct proto_scan_reply *s = &out->u.scan;
    ck_assert_uint_eq(s->n_hits, 3);
    ck_assert(s->hits[0].has_start);
    ck_assert_uint_eq(s->hits[0].start, 2);
    ck_assert_ptr_null(s->hits[0].rule_id);
    ck_assert(!s->hits[1].has_start);
    ck_assert(s->hits[2].has_start);
    ck_assert_uint_eq(s->hits[2].start, 0);
    ck_assert_str_eq(s->hits[2].rule_id, "r0");
    proto_reply_destroy(out);

    struct proto_buffer buf = {.data = (const uint8_t *)"x", .len = 1};
    struct proto_request in = {.id = 9, .op = PROTO_OP_SCAN};
    in.u.scan.buffers = &buf;
    in.u.scan.n_buffers = 1;
    in.u.scan.starts = true;
    struct proto_request *req = roundtrip_request(&in);
    ck_assert(req->u.scan.starts);
    proto_request_destroy(req);
    in.u.scan.starts = false;
    req = roundtrip_request(&in);
    ck_assert(!req->u.scan.starts);
    proto_request_destroy(req);
}
END_TEST

START_TEST(rt_error_reply)
{
    struct proto_buf b;
    struct proto_frame f;
    struct proto_reply *out;
    struct vks_error err;
    proto_buf_init(&b);
    ck_assert_int_eq(
        proto_error_encode(&b, 11, PROTO_OP_NONE, -VKS_E_UNKNOWN_CATALOG, "no such catalog", &err),
        0);
    feed_bytewise(b.data, b.len, &f);
    ck_assert_int_eq(proto_reply_decode(&f, NULL, &out, &err), 0);
    ck_assert_uint_eq(out->id, 11);
    ck_assert_int_eq(out->op, PROTO_OP_NONE);
    ck_assert_int_eq(out->error.code, -VKS_E_UNKNOWN_CATALOG);
    ck_assert_str_eq(out->error.msg, "no such catalog");
    proto_reply_destroy(out);
    /* Codes outside VKS_E_* are refused and leave the buffer unchanged. */
    size_t len = b.len;
    ck_assert_int_eq(proto_error_encode(&b, 1, PROTO_OP_PING, -ENOMEM, "x", &err), -EINVAL);
    ck_assert_uint_eq(b.len, len);
    proto_buf_finish(&b);
}
END_TEST

/* ---- the frame accumulator ------------------------------------------------------ */

START_TEST(reader_pipelined_chunks)
{
    struct proto_buf b;
    struct vks_error err;
    proto_buf_init(&b);
    for (uint32_t i = 0; i < 3; i++) {
        struct proto_request ping = {.id = 100 + i, .op = PROTO_OP_PING};
        ck_assert_int_eq(proto_request_encode(&b, &ping, &err), 0);
    }
    /* All three frames arrive in one chunk; feed stops at each frame's end. */
    struct proto_reader *r;
    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    size_t off = 0;
    for (uint32_t i = 0; i < 3; i++) {
        size_t used;
        ck_assert_int_eq(proto_reader_feed(r, b.data + off, b.len - off, &used, &err), 1);
        off += used;
        struct proto_frame f;
        struct proto_request *req;
        ck_assert_int_eq(proto_reader_take(r, &f), 0);
        ck_assert_int_eq(proto_request_decode(&f, NULL, &req, NULL, &err), 0);
        ck_assert_uint_eq(req->id, 100 + i);
        proto_request_destroy(req);
    }
    ck_assert_uint_eq(off, b.len);
    ck_assert(proto_reader_idle(r));
    struct proto_frame none;
    ck_assert_int_eq(proto_reader_take(r, &none), -EAGAIN);
    proto_reader_destroy(r);
    proto_buf_finish(&b);
}
END_TEST

START_TEST(reader_oversize_is_fatal)
{
    struct proto_limits lim = {.max_frame = 1024};
    struct proto_reader *r;
    struct vks_error err;
    size_t used;
    const uint8_t hdr[4] = {0, 0, 0x04, 0x01}; /* 1025 */
    ck_assert_int_eq(proto_reader_create(&lim, &r), 0);
    ck_assert_int_eq(proto_reader_feed(r, hdr, 3, &used, &err), 0);
    ck_assert_int_eq(proto_reader_feed(r, hdr + 3, 1, &used, &err), -VKS_E_FRAME_TOO_LARGE);
    ck_assert_int_eq(err.code, -VKS_E_FRAME_TOO_LARGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "1025"));
    /* The reader stays failed: nothing after a bad prefix is trusted. */
    const uint8_t more[4] = {0, 0, 0, 1};
    ck_assert_int_eq(proto_reader_feed(r, more, 4, &used, &err), -VKS_E_FRAME_TOO_LARGE);
    ck_assert_uint_eq(used, 0);
    proto_reader_destroy(r);

    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    const uint8_t zero[4] = {0, 0, 0, 0};
    ck_assert_int_eq(proto_reader_feed(r, zero, 4, &used, &err), -VKS_E_BAD_FRAME);
    proto_reader_destroy(r);
}
END_TEST

START_TEST(reader_truncated_frame)
{
    /* A 4 GB prefix under the default limit check: never allocated up front. */
    struct proto_limits lim = {.max_frame = PROTO_MAX_FRAME_CEILING};
    struct proto_reader *r;
    struct vks_error err;
    size_t used;
    const uint8_t hdr[5] = {0xff, 0xff, 0xff, 0x00, 0x80};
    ck_assert_int_eq(proto_reader_create(&lim, &r), 0);
    ck_assert_int_eq(proto_reader_feed(r, hdr, 5, &used, &err), 0);
    ck_assert_uint_eq(used, 5);
    ck_assert(!proto_reader_idle(r));
    proto_reader_destroy(r);

    /* The length covers only part of the msgpack value: a bad frame, but the
     * stream stays in sync (the decode error is not fatal). */
    struct raw raw;
    raw_init(&raw);
    map_head(&raw, 3, 12, "scan");
    raw_str(&raw, "catalog");
    struct proto_frame f;
    raw_frame(&raw, &f);
    struct proto_request *req;
    struct proto_head head;
    ck_assert_int_eq(proto_request_decode(&f, NULL, &req, &head, &err), -VKS_E_BAD_FRAME);
    ck_assert_uint_eq(head.id, 12);
    ck_assert_int_eq(head.op, PROTO_OP_SCAN);
}
END_TEST

START_TEST(every_prefix_of_a_frame_is_incomplete)
{
    /* Cut a valid scan body at every length: never a crash, never success. */
    struct proto_buffer buf = {.data = (const uint8_t *)"abc", .len = 3};
    struct proto_request in = {.id = 1, .op = PROTO_OP_SCAN};
    memcpy(in.u.scan.catalog, fp_a, PROTO_FP_LEN);
    in.u.scan.buffers = &buf;
    in.u.scan.n_buffers = 1;
    struct proto_buf b;
    struct vks_error err;
    proto_buf_init(&b);
    ck_assert_int_eq(proto_request_encode(&b, &in, &err), 0);
    size_t body = b.len - PROTO_HEADER_LEN;
    for (size_t cut = 1; cut < body; cut++) {
        struct proto_frame f = {.data = malloc(cut), .len = cut};
        struct proto_request *req;
        memcpy(f.data, b.data + PROTO_HEADER_LEN, cut);
        int rc = proto_request_decode(&f, NULL, &req, NULL, &err);
        ck_assert_msg(rc == -VKS_E_BAD_FRAME, "cut %zu: %d %s", cut, rc, err.msg);
    }
    proto_buf_finish(&b);
}
END_TEST

/* ---- decode errors ---------------------------------------------------------------- */

START_TEST(err_wrong_types)
{
    struct raw r;
    raw_init(&r);
    msgpack_pack_array(&r.pk, 0); /* a frame must hold a map */
    expect_fail(&r, NULL, -VKS_E_BAD_TYPE);

    raw_init(&r);
    msgpack_pack_map(&r.pk, 2);
    raw_str(&r, "id");
    raw_str(&r, "seven");
    raw_str(&r, "op");
    raw_str(&r, "ping");
    struct proto_head h = expect_fail(&r, NULL, -VKS_E_BAD_TYPE);
    ck_assert_uint_eq(h.id, 0);
    ck_assert_int_eq(h.op, PROTO_OP_PING);

    raw_init(&r);
    map_head(&r, 3, 21, "scan");
    raw_str(&r, "buffers");
    raw_str(&r, "not an array");
    h = expect_fail(&r, NULL, -VKS_E_BAD_TYPE);
    ck_assert_uint_eq(h.id, 21);

    raw_init(&r);
    msgpack_pack_map(&r.pk, 2);
    raw_str(&r, "op");
    msgpack_pack_uint32(&r.pk, 3);
    raw_str(&r, "id");
    msgpack_pack_uint32(&r.pk, 22);
    h = expect_fail(&r, NULL, -VKS_E_BAD_TYPE);
    ck_assert_uint_eq(h.id, 22); /* found even after the bad op */

    raw_init(&r);
    map_head(&r, 3, 23, "hello");
    raw_str(&r, "version");
    msgpack_pack_int32(&r.pk, -1);
    expect_fail(&r, NULL, -VKS_E_BAD_VALUE);

    raw_init(&r);
    map_head(&r, 3, 24, "catalog.has");
    raw_str(&r, "fingerprint");
    msgpack_pack_bin(&r.pk, 4);
    msgpack_pack_bin_body(&r.pk, "abcd", 4);
    expect_fail(&r, NULL, -VKS_E_BAD_VALUE);
}
END_TEST

START_TEST(err_unknown_op_and_missing)
{
    struct raw r;
    raw_init(&r);
    map_head(&r, 2, 31, "catalog.explode");
    struct proto_head h = expect_fail(&r, NULL, -VKS_E_UNKNOWN_OP);
    ck_assert_uint_eq(h.id, 31);
    ck_assert_int_eq(h.op, PROTO_OP_NONE);

    raw_init(&r);
    msgpack_pack_map(&r.pk, 1);
    raw_str(&r, "op");
    raw_str(&r, "ping");
    expect_fail(&r, NULL, -VKS_E_MISSING_FIELD);

    raw_init(&r);
    map_head(&r, 2, 32, "scan");
    expect_fail(&r, NULL, -VKS_E_MISSING_FIELD);

    raw_init(&r);
    map_head(&r, 3, 33, "catalog.load");
    raw_str(&r, "rules");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_map(&r.pk, 1);
    raw_str(&r, "id");
    raw_str(&r, "x");
    expect_fail(&r, NULL, -VKS_E_MISSING_FIELD);

    /* A known key twice, unknown keys skipped. */
    raw_init(&r);
    msgpack_pack_map(&r.pk, 4);
    raw_str(&r, "id");
    msgpack_pack_uint32(&r.pk, 34);
    raw_str(&r, "future_field");
    msgpack_pack_array(&r.pk, 2);
    msgpack_pack_nil(&r.pk);
    msgpack_pack_double(&r.pk, 1.5);
    raw_str(&r, "op");
    raw_str(&r, "ping");
    raw_str(&r, "id");
    msgpack_pack_uint32(&r.pk, 34);
    expect_fail(&r, NULL, -VKS_E_BAD_VALUE);
}
END_TEST

START_TEST(err_too_many_buffers_and_rules)
{
    struct proto_limits lim = {.max_buffers = 2, .max_rules = 1};
    struct raw r;
    raw_init(&r);
    map_head(&r, 4, 41, "scan");
    raw_str(&r, "catalog");
    msgpack_pack_bin(&r.pk, PROTO_FP_LEN);
    msgpack_pack_bin_body(&r.pk, fp_a, PROTO_FP_LEN);
    raw_str(&r, "buffers");
    msgpack_pack_array(&r.pk, 3);
    for (int i = 0; i < 3; i++) {
        msgpack_pack_map(&r.pk, 1);
        raw_str(&r, "data");
        msgpack_pack_bin(&r.pk, 1);
        msgpack_pack_bin_body(&r.pk, "x", 1);
    }
    struct proto_head h = expect_fail(&r, &lim, -VKS_E_TOO_MANY_BUFFERS);
    ck_assert_uint_eq(h.id, 41);

    raw_init(&r);
    map_head(&r, 3, 42, "catalog.load");
    raw_str(&r, "rules");
    msgpack_pack_array(&r.pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_map(&r.pk, 3);
        raw_str(&r, "id");
        raw_str(&r, "r");
        raw_str(&r, "kind");
        raw_str(&r, "literal");
        raw_str(&r, "pattern");
        raw_str(&r, "abc");
    }
    expect_fail(&r, &lim, -VKS_E_TOO_MANY_RULES);
}
END_TEST

START_TEST(err_depth_and_lengths)
{
    struct proto_limits lim = {.max_depth = 4, .max_str = 8, .max_array = 4};
    struct raw r;
    raw_init(&r);
    map_head(&r, 3, 51, "ping");
    raw_str(&r, "deep");
    for (int i = 0; i < 5; i++)
        msgpack_pack_array(&r.pk, 1);
    msgpack_pack_nil(&r.pk);
    struct proto_head h = expect_fail(&r, &lim, -VKS_E_DEPTH);
    ck_assert_uint_eq(h.id, 51);

    raw_init(&r);
    map_head(&r, 3, 52, "hello");
    raw_str(&r, "client");
    raw_str(&r, "a name longer than eight");
    expect_fail(&r, &lim, -VKS_E_LIMIT);

    raw_init(&r);
    map_head(&r, 3, 53, "ping");
    raw_str(&r, "big");
    msgpack_pack_array(&r.pk, 5);
    for (int i = 0; i < 5; i++)
        msgpack_pack_nil(&r.pk);
    expect_fail(&r, &lim, -VKS_E_LIMIT);

    /* A declared count larger than the remaining bytes is a bad frame, checked
     * before anything is allocated for it. */
    raw_init(&r);
    map_head(&r, 3, 54, "ping");
    raw_str(&r, "x");
    msgpack_pack_array(&r.pk, 60000);
    expect_fail(&r, NULL, -VKS_E_BAD_FRAME);

    raw_init(&r);
    map_head(&r, 2, 55, "ping");
    msgpack_pack_nil(&r.pk); /* trailing bytes after the map */
    expect_fail(&r, NULL, -VKS_E_BAD_FRAME);
}
END_TEST

/* ---- descriptors ------------------------------------------------------------------ */

static int memfd_with(const char *text)
{
    int fd = memfd_create("test_proto", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

/* Sends `req` with `fds` over a socketpair and receives it through the reader. */
static int send_recv(const struct proto_request *req, const int *fds, size_t n_fds,
                     struct proto_request **out, struct vks_error *err)
{
    int sv[2];
    struct proto_buf b;
    struct proto_reader *r;
    struct proto_frame f;
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    proto_buf_init(&b);
    ck_assert_int_eq(proto_request_encode(&b, req, err), 0);
    ck_assert_int_eq(proto_send(sv[0], b.data, b.len, fds, n_fds, 1000, err), 0);
    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    int rc;
    while ((rc = proto_reader_recv(r, sv[1], err)) == PROTO_RECV_MORE)
        ;
    ck_assert_int_eq(rc, PROTO_RECV_FRAME);
    ck_assert_int_eq(proto_reader_take(r, &f), 0);
    ck_assert_uint_eq(f.n_fds, n_fds);
    rc = proto_request_decode(&f, NULL, out, NULL, err);
    close(sv[0]);
    /* The peer is gone and nothing is buffered: a clean end of stream. */
    ck_assert_int_eq(proto_reader_recv(r, sv[1], err), PROTO_RECV_EOF);
    close(sv[1]);
    proto_reader_destroy(r);
    proto_buf_finish(&b);
    return rc;
}

START_TEST(fd_buffers_travel_with_their_frame)
{
    int fds[2] = {memfd_with("first file"), memfd_with("second")};
    struct proto_buffer bufs[3] = {
        {.is_fd = true, .fd_index = 1},
        {.data = (const uint8_t *)"inline", .len = 6},
        {.is_fd = true, .fd_index = 0, .offset = 6, .length = 4, .has_length = true}};
    struct proto_request in = {.id = 61, .op = PROTO_OP_SCAN};
    struct proto_request *out;
    struct vks_error err;
    memcpy(in.u.scan.catalog, fp_a, PROTO_FP_LEN);
    in.u.scan.buffers = bufs;
    in.u.scan.n_buffers = 3;
    ck_assert_int_eq(send_recv(&in, fds, 2, &out, &err), 0);
    const struct proto_scan *s = &out->u.scan;
    char text[16] = {0};
    ck_assert(s->buffers[0].is_fd);
    ck_assert_int_eq(pread(s->buffers[0].fd, text, sizeof(text) - 1, 0), 6);
    ck_assert_str_eq(text, "second");
    ck_assert(s->buffers[2].has_length);
    ck_assert_uint_eq(s->buffers[2].offset, 6);
    ck_assert_uint_eq(s->buffers[2].length, 4);
    memset(text, 0, sizeof(text));
    ck_assert_int_eq(pread(s->buffers[2].fd, text, 4, 6), 4);
    ck_assert_str_eq(text, "file");
    ck_assert_int_ne(s->buffers[0].fd, fds[1]); /* a received copy, not ours */
    proto_request_destroy(out);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

START_TEST(fd_errors)
{
    int fd = memfd_with("x");
    struct proto_buffer buf = {.is_fd = true, .fd_index = 1};
    struct proto_request in = {.id = 62, .op = PROTO_OP_SCAN};
    struct proto_request *out = NULL;
    struct vks_error err;
    memcpy(in.u.scan.catalog, fp_a, PROTO_FP_LEN);
    in.u.scan.buffers = &buf;
    in.u.scan.n_buffers = 1;
    ck_assert_int_eq(send_recv(&in, &fd, 1, &out, &err), -VKS_E_BAD_FD);
    ck_assert_ptr_null(out);

    struct proto_request ping = {.id = 63, .op = PROTO_OP_PING};
    ck_assert_int_eq(send_recv(&ping, &fd, 1, &out, &err), -VKS_E_BAD_FD);
    close(fd);
}
END_TEST

START_TEST(fd_over_limit)
{
    struct proto_limits lim = {.max_fds = 1};
    int sv[2], fds[2] = {memfd_with("a"), memfd_with("b")};
    struct proto_reader *r;
    struct proto_frame f;
    struct proto_request *req;
    struct proto_head head;
    struct vks_error err;
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct proto_buf b;
    struct proto_request ping = {.id = 64, .op = PROTO_OP_PING};
    proto_buf_init(&b);
    ck_assert_int_eq(proto_request_encode(&b, &ping, &err), 0);
    ck_assert_int_eq(proto_send(sv[0], b.data, b.len, fds, 2, 1000, &err), 0);
    ck_assert_int_eq(proto_reader_create(&lim, &r), 0);
    int rc;
    while ((rc = proto_reader_recv(r, sv[1], &err)) == PROTO_RECV_MORE)
        ;
    ck_assert_int_eq(rc, PROTO_RECV_FRAME);
    ck_assert_int_eq(proto_reader_take(r, &f), 0);
    ck_assert_uint_eq(f.n_fds, 1);
    ck_assert_int_eq(f.fd_error, -VKS_E_TOO_MANY_FDS);
    ck_assert_int_eq(proto_request_decode(&f, &lim, &req, &head, &err), -VKS_E_TOO_MANY_FDS);
    ck_assert_uint_eq(head.id, 64);
    proto_reader_destroy(r);
    proto_buf_finish(&b);
    close(sv[0]);
    close(sv[1]);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

START_TEST(recv_eof_mid_frame)
{
    int sv[2];
    struct proto_reader *r;
    struct vks_error err;
    const uint8_t part[6] = {0, 0, 0, 10, 0x81, 0xa2};
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_int_eq(write(sv[0], part, sizeof(part)), (ssize_t)sizeof(part));
    close(sv[0]);
    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    int rc;
    while ((rc = proto_reader_recv(r, sv[1], &err)) == PROTO_RECV_MORE)
        ;
    ck_assert_int_eq(rc, -ECONNRESET);
    proto_reader_destroy(r);
    close(sv[1]);
}
END_TEST

/* ---- read-ahead ------------------------------------------------------------------- */

/* Open descriptors of this process. */
static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) != -1;
    return n;
}

/* A frame of the read-ahead tests: a scan of `n_fd` descriptor buffers
 * (indexes 0..n_fd-1) and `inline_len` inline bytes, or a ping (both 0). */
static void encode_case(struct proto_buf *b, uint32_t id, uint32_t n_fd, size_t inline_len)
{
    static uint8_t bytes[100000];
    struct proto_buffer bufs[4];
    struct vks_error err;
    if (n_fd == 0 && inline_len == 0) {
        struct proto_request ping = {.id = id, .op = PROTO_OP_PING};
        ck_assert_int_eq(proto_request_encode(b, &ping, &err), 0);
        return;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_fd; i++)
        bufs[n++] = (struct proto_buffer){.is_fd = true, .fd_index = i};
    if (inline_len > 0) {
        ck_assert_uint_le(inline_len, sizeof(bytes));
        memset(bytes, 'a' + (int)(id % 26), inline_len);
        bufs[n++] = (struct proto_buffer){.data = bytes, .len = inline_len};
    }
    struct proto_request req = {.id = id, .op = PROTO_OP_SCAN};
    memcpy(req.u.scan.catalog, fp_a, PROTO_FP_LEN);
    req.u.scan.buffers = bufs;
    req.u.scan.n_buffers = n;
    ck_assert_int_eq(proto_request_encode(b, &req, &err), 0);
}

/*
 * Frames queued in the socket before the reader looks, each sent with its
 * own sendmsg as libvkscan does, some with descriptors, one larger than the
 * read-ahead: every frame comes out whole and in order, and every
 * descriptor with the frame it was sent with (its file's text says which),
 * for read-ahead sizes that split length prefixes and bodies everywhere.
 * Fails when read-ahead gives descriptors to a neighbour, loses bytes past
 * a frame, or leaks the descriptors of a frame never reached.
 */
START_TEST(read_ahead_frames_and_their_fds)
{
    static const struct {
        uint32_t n_fd;
        size_t inline_len;
    } cases[] = {{0, 0}, {1, 0}, {0, 0}, {2, 10}, {0, 70000}, {1, 5}, {0, 0}, {3, 0}, {0, 300}};
    const size_t n_cases = sizeof(cases) / sizeof(cases[0]);
    const size_t sizes[] = {1, 3, 7, 64, 1000, 16384, 200000};
    int before = open_fds();
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        int sv[2];
        struct vks_error err;
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        int sndbuf = 1 << 20;
        setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
        for (size_t c = 0; c < n_cases; c++) {
            struct proto_buf b;
            proto_buf_init(&b);
            encode_case(&b, (uint32_t)c + 1, cases[c].n_fd, cases[c].inline_len);
            int fds[3];
            for (uint32_t i = 0; i < cases[c].n_fd; i++) {
                char text[64];
                snprintf(text, sizeof(text), "frame %zu fd %u", c + 1, i);
                fds[i] = memfd_with(text);
            }
            ck_assert_int_eq(proto_send(sv[0], b.data, b.len, fds, cases[c].n_fd, 1000, &err), 0);
            for (uint32_t i = 0; i < cases[c].n_fd; i++)
                close(fds[i]);
            proto_buf_finish(&b);
        }
        close(sv[0]);
        struct proto_reader *r;
        ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
        ck_assert_int_eq(proto_reader_read_ahead(r, sizes[si]), 0);
        for (size_t c = 0; c < n_cases; c++) {
            int rc;
            while ((rc = proto_reader_recv(r, sv[1], &err)) == PROTO_RECV_MORE)
                ;
            ck_assert_msg(rc == PROTO_RECV_FRAME, "read-ahead %zu, frame %zu: %d", sizes[si], c + 1,
                          rc);
            struct proto_frame f;
            struct proto_request *req = NULL;
            ck_assert_int_eq(proto_reader_take(r, &f), 0);
            ck_assert_msg(f.n_fds == cases[c].n_fd, "read-ahead %zu, frame %zu: %zu fds", sizes[si],
                          c + 1, f.n_fds);
            ck_assert_int_eq(proto_request_decode(&f, NULL, &req, NULL, &err), 0);
            ck_assert_uint_eq(req->id, c + 1);
            for (uint32_t i = 0; i < cases[c].n_fd; i++) {
                char want[64], got[64] = {0};
                snprintf(want, sizeof(want), "frame %zu fd %u", c + 1, i);
                const struct proto_buffer *pb = &req->u.scan.buffers[i];
                ck_assert(pb->is_fd);
                ck_assert_int_eq(pread(pb->fd, got, sizeof(got) - 1, 0), (ssize_t)strlen(want));
                ck_assert_str_eq(got, want);
            }
            if (cases[c].inline_len > 0) {
                const struct proto_buffer *pb = &req->u.scan.buffers[cases[c].n_fd];
                ck_assert_uint_eq(pb->len, cases[c].inline_len);
                ck_assert_uint_eq(pb->data[pb->len - 1], 'a' + (int)((c + 1) % 26));
            }
            proto_request_destroy(req);
        }
        ck_assert_int_eq(proto_reader_recv(r, sv[1], &err), PROTO_RECV_EOF);
        proto_reader_destroy(r);
        close(sv[1]);
    }
    ck_assert_int_eq(open_fds(), before);
}
END_TEST

struct shape {
    uint32_t n_fd;
    size_t inline_len;
};

struct sender {
    int fd;
    const struct shape *shapes;
    size_t n;
    int rc; /* 0, or the first proto_send failure */
};

/* Sends the frames of `shapes` (ids 1..n), each with its own sendmsg and
 * memfds that name their frame, as a client thread would. */
static void *send_shapes(void *arg)
{
    struct sender *s = arg;
    for (size_t c = 0; c < s->n && s->rc == 0; c++) {
        struct proto_buf b;
        proto_buf_init(&b);
        encode_case(&b, (uint32_t)c + 1, s->shapes[c].n_fd, s->shapes[c].inline_len);
        int fds[3];
        for (uint32_t i = 0; i < s->shapes[c].n_fd; i++) {
            char text[64];
            snprintf(text, sizeof(text), "frame %zu fd %u", c + 1, i);
            fds[i] = memfd_with(text);
        }
        s->rc = proto_send(s->fd, b.data, b.len, fds, s->shapes[c].n_fd, 10000, NULL);
        for (uint32_t i = 0; i < s->shapes[c].n_fd; i++)
            close(fds[i]);
        proto_buf_finish(&b);
    }
    shutdown(s->fd, SHUT_WR);
    return NULL;
}

/*
 * Random frames (0-3 descriptors, 0-40,000 inline bytes) sent by a thread
 * while the reader reads with a random read-ahead size (1 byte to 64 KiB),
 * 40 rounds: the reads meet frames whole, split, and in groups, as they
 * arrive. Each frame comes out in order with exactly its descriptors.
 */
START_TEST(read_ahead_random)
{
    uint32_t x = 0x9e3779b9u;
    int before = open_fds();
    for (int round = 0; round < 40; round++) {
        struct shape shapes[24];
        size_t n = 0;
        for (; n < sizeof(shapes) / sizeof(shapes[0]); n++) {
            x = x * 1664525u + 1013904223u;
            shapes[n].n_fd = (x >> 8) % 4 == 3 ? (x >> 12) % 3 + 1 : 0;
            x = x * 1664525u + 1013904223u;
            shapes[n].inline_len = (x >> 8) % 8 == 0 ? (x >> 11) % 40000 : (x >> 11) % 300;
        }
        x = x * 1664525u + 1013904223u;
        size_t ahead = 1 + (x >> 8) % 65536;
        int sv[2];
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        struct sender snd = {.fd = sv[0], .shapes = shapes, .n = n};
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, send_shapes, &snd), 0);
        struct proto_reader *r;
        struct vks_error err;
        ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
        ck_assert_int_eq(proto_reader_read_ahead(r, ahead), 0);
        for (size_t c = 0; c < n; c++) {
            int rc;
            while ((rc = proto_reader_recv(r, sv[1], &err)) == PROTO_RECV_MORE)
                ;
            ck_assert_msg(rc == PROTO_RECV_FRAME, "round %d (read-ahead %zu), frame %zu: %d", round,
                          ahead, c + 1, rc);
            struct proto_frame f;
            struct proto_request *req = NULL;
            ck_assert_int_eq(proto_reader_take(r, &f), 0);
            ck_assert_msg(f.n_fds == shapes[c].n_fd,
                          "round %d (read-ahead %zu), frame %zu: %zu fds", round, ahead, c + 1,
                          f.n_fds);
            ck_assert_int_eq(proto_request_decode(&f, NULL, &req, NULL, &err), 0);
            ck_assert_uint_eq(req->id, c + 1);
            for (uint32_t i = 0; i < shapes[c].n_fd; i++) {
                char want[64], got[64] = {0};
                snprintf(want, sizeof(want), "frame %zu fd %u", c + 1, i);
                ck_assert_int_eq(pread(req->u.scan.buffers[i].fd, got, sizeof(got) - 1, 0),
                                 (ssize_t)strlen(want));
                ck_assert_str_eq(got, want);
            }
            proto_request_destroy(req);
        }
        ck_assert_int_eq(proto_reader_recv(r, sv[1], &err), PROTO_RECV_EOF);
        pthread_join(t, NULL);
        ck_assert_int_eq(snd.rc, 0);
        proto_reader_destroy(r);
        close(sv[0]);
        close(sv[1]);
    }
    ck_assert_int_eq(open_fds(), before);
}
END_TEST

/* A frame sent while the reader waits comes whole from one recv call with
 * read-ahead (its length prefix and body in one recvmsg); without, the
 * first call has only the length prefix. Frames sent together wait in the
 * reader (proto_reader_buffered) while the socket is empty. */
START_TEST(read_ahead_one_call_a_frame)
{
    int sv[2];
    struct vks_error err;
    struct proto_buf b;
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    for (int ahead = 0; ahead < 2; ahead++) {
        struct proto_reader *r;
        ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
        if (ahead)
            ck_assert_int_eq(proto_reader_read_ahead(r, 16384), 0);
        proto_buf_init(&b);
        encode_case(&b, 1, 0, 4096);
        ck_assert_int_eq(write(sv[0], b.data, b.len), (ssize_t)b.len);
        ck_assert_int_eq(proto_reader_recv(r, sv[1], &err),
                         ahead ? PROTO_RECV_FRAME : PROTO_RECV_MORE);
        if (!ahead)
            ck_assert_int_eq(proto_reader_recv(r, sv[1], &err), PROTO_RECV_FRAME);
        struct proto_frame f;
        ck_assert_int_eq(proto_reader_take(r, &f), 0);
        proto_frame_finish(&f);
        ck_assert(!proto_reader_buffered(r));
        ck_assert_int_eq(proto_reader_recv(r, sv[1], &err), -EAGAIN);

        b.len = 0;
        for (uint32_t i = 0; i < 3; i++)
            encode_case(&b, 10 + i, 0, 0);
        ck_assert_int_eq(write(sv[0], b.data, b.len), (ssize_t)b.len);
        for (uint32_t i = 0; i < 3; i++) {
            int rc;
            while ((rc = proto_reader_recv(r, sv[1], &err)) == PROTO_RECV_MORE)
                ;
            ck_assert_int_eq(rc, PROTO_RECV_FRAME);
            ck_assert_int_eq(proto_reader_take(r, &f), 0);
            proto_frame_finish(&f);
            char c;
            bool socket_empty = recv(sv[1], &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0;
            ck_assert(socket_empty || !ahead);
            ck_assert(proto_reader_buffered(r) == (ahead && i < 2));
        }
        ck_assert(proto_reader_idle(r));
        proto_buf_finish(&b);
        proto_reader_destroy(r);
    }
    close(sv[0]);
    close(sv[1]);
}
END_TEST

/* A bad length prefix read ahead behind a good frame: the good frame comes
 * out, then the fatal error; descriptors read with the bad frame are
 * closed with the reader. */
START_TEST(read_ahead_bad_length_after_a_frame)
{
    int sv[2];
    struct vks_error err;
    struct proto_buf b;
    int before = open_fds();
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    proto_buf_init(&b);
    encode_case(&b, 1, 0, 0);
    ck_assert_int_eq(proto_send(sv[0], b.data, b.len, NULL, 0, 1000, &err), 0);
    const uint8_t zero[5] = {0, 0, 0, 0, 0x80};
    int fd = memfd_with("orphan");
    ck_assert_int_eq(proto_send(sv[0], zero, sizeof(zero), &fd, 1, 1000, &err), 0);
    close(fd);
    struct proto_reader *r;
    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    ck_assert_int_eq(proto_reader_read_ahead(r, 4096), 0);
    ck_assert_int_eq(proto_reader_recv(r, sv[1], &err), PROTO_RECV_FRAME);
    struct proto_frame f;
    ck_assert_int_eq(proto_reader_take(r, &f), 0);
    ck_assert_uint_eq(f.n_fds, 0);
    proto_frame_finish(&f);
    ck_assert_int_eq(proto_reader_recv(r, sv[1], &err), -VKS_E_BAD_FRAME);
    proto_reader_destroy(r);
    proto_buf_finish(&b);
    close(sv[0]);
    close(sv[1]);
    ck_assert_int_eq(open_fds(), before);
}
END_TEST

/* ---- source fingerprint ------------------------------------------------------------ */

struct collect {
    uint8_t buf[512];
    size_t len;
};

static void collect_sink(void *ctx, const void *data, size_t len)
{
    struct collect *c = ctx;
    ck_assert_uint_le(c->len + len, sizeof(c->buf));
    memcpy(c->buf + c->len, data, len);
    c->len += len;
}

START_TEST(source_canon_is_exact)
{
    struct proto_rule rule = {
        .id = "a", .kind = PROTO_KIND_REGEX, .pattern = "x+", .pattern_len = 2, .flags = "i"};
    struct proto_catalog_load load = {.rules = &rule, .n_rules = 1, .max_states = 7};
    struct collect c = {.len = 0};
    proto_source_canon(&load, collect_sink, &c);
    static const uint8_t want[] = {'v', 'k', 's', 'c', 'a', 'n', '-', 's', 'o', 'u', 'r',
                                   'c', 'e', '-', '1', 0,   0,   0,   0,   7,   'R', 0,
                                   0,   0,   1,   0,   0,   0,   1,   'a', 2,   0,   0,
                                   0,   1,   'i', 0,   0,   0,   2,   'x', '+'};
    ck_assert_uint_eq(c.len, sizeof(want));
    ck_assert_mem_eq(c.buf, want, sizeof(want));
    /* Any change of the source changes the bytes. */
    struct collect d = {.len = 0};
    rule.flags = "";
    proto_source_canon(&load, collect_sink, &d);
    ck_assert(d.len != c.len || memcmp(d.buf, c.buf, c.len) != 0);
}
END_TEST

START_TEST(limits_normalize)
{
    struct proto_limits l = {.max_frame = 0xffffffffu, .max_fds = 1000, .max_depth = 3};
    proto_limits_normalize(&l);
    ck_assert_uint_eq(l.max_frame, PROTO_MAX_FRAME_CEILING);
    ck_assert_uint_eq(l.max_fds, PROTO_MAX_FDS_CEILING);
    ck_assert_uint_eq(l.max_depth, 3);
    ck_assert_uint_eq(l.max_str, PROTO_DEFAULT_MAX_STR);
    ck_assert_str_eq(proto_strerror(-VKS_E_UNKNOWN_CATALOG), "unknown catalog");
    ck_assert_str_eq(proto_strerror(-VKS_E_DENIED), "connection not allowed");
    /* every code has a name of its own */
    for (int c = VKS_E_BASE + 1; c <= VKS_E_MAX_CODE; c++)
        ck_assert_msg(strcmp(proto_strerror(-c), "unknown error") != 0, "code %d has no name", c);
    ck_assert_str_eq(proto_op_name(PROTO_OP_CATALOG_LOAD), "catalog.load");
    ck_assert_ptr_null(proto_op_name(PROTO_OP_COUNT));
}
END_TEST

/* Reads every "VKS_E_NAME = N" of a header into names/values; returns how many. */
static int read_codes(const char *rel, char names[][40], int *values, int cap)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", VKS_SOURCE_ROOT, rel);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[512];
    int n = 0;
    while (n < cap && fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, " %39[A-Z_] = %d", names[n], &values[n]) == 2 &&
            strncmp(names[n], "VKS_E_", 6) == 0)
            n++;
    }
    fclose(f);
    return n;
}

/* proto/errors.h owns the codes; the installed client header must carry the
 * same names and numbers. */
START_TEST(error_codes_match_the_client_header)
{
    static char pn[64][40], cn[64][40];
    int pv[64], cv[64];
    int np = read_codes("proto/errors.h", pn, pv, 64);
    int nc = read_codes("client/include/vkscan/errors.h", cn, cv, 64);
    ck_assert_int_ge(np, 23);
    ck_assert_int_eq(np, nc);
    for (int i = 0; i < np; i++) {
        ck_assert_str_eq(pn[i], cn[i]);
        ck_assert_int_eq(pv[i], cv[i]);
    }
    ck_assert_int_eq(VKS_E_MAX_CODE, VKS_E_DENIED);
}
END_TEST

/* Replies are valid UTF-8 whatever bytes a client put in ids and names. */
START_TEST(replies_are_valid_utf8)
{
    ck_assert(proto_utf8_valid((const uint8_t *)"ok \xc3\xa9 \xf0\x9f\x98\x80", 10));
    ck_assert(!proto_utf8_valid((const uint8_t *)"\xc0\xaf", 2));         /* overlong */
    ck_assert(!proto_utf8_valid((const uint8_t *)"\xed\xa0\x80", 3));     /* surrogate */
    ck_assert(!proto_utf8_valid((const uint8_t *)"\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    ck_assert(!proto_utf8_valid((const uint8_t *)"\xe2\x82", 2));         /* cut short */
    struct proto_buf b;
    proto_buf_init(&b);
    ck_assert_int_eq(proto_error_encode(&b, 3, PROTO_OP_PING, -VKS_E_BAD_VALUE, "bad \xff!", NULL),
                     0);
    struct proto_frame f = {.len = b.len - 4, .data = malloc(b.len)};
    memcpy(f.data, b.data + 4, f.len);
    struct proto_reply *rep = NULL;
    ck_assert_int_eq(proto_reply_decode(&f, NULL, &rep, NULL), 0);
    ck_assert_str_eq(rep->error.msg, "bad \xef\xbf\xbd!");
    proto_reply_destroy(rep);
    proto_buf_finish(&b);
}
END_TEST

/* A catalog result's rules in each shape the encoder writes: fixstr and
 * str 8 ids on the direct path, an id that is not UTF-8 through the packer
 * (U+FFFD), pre-packed bytes, and ids only; and the request flag. */
START_TEST(rt_catalog_rules_shapes)
{
    char long_id[201];
    memset(long_id, 'x', 200);
    long_id[200] = '\0';
    struct proto_rule_info infos[3] = {{.id = "short"}, {.id = long_id}, {.id = "bad\xff"}};
    for (int i = 0; i < 3; i++)
        memset(infos[i].fp, 0x10 + i, PROTO_FP_LEN);
    struct proto_buf packed[2];
    for (int ids = 0; ids < 2; ids++) {
        proto_buf_init(&packed[ids]);
        ck_assert_int_eq(proto_pack_rules(&packed[ids], infos, 3, ids, NULL), 0);
    }
    ck_assert_uint_lt(packed[1].len, packed[0].len - 3 * PROTO_FP_LEN);
    for (int form = 0; form < 4; form++) { /* struct / packed, with fps / ids only */
        bool ids = form & 1;
        struct proto_reply rep = {.id = 2, .op = PROTO_OP_CATALOG_HAS};
        rep.u.catalog = (struct proto_catalog_result){
            .known = true, .rules = infos, .n_rules = 3, .ids_only = ids};
        if (form >= 2) {
            rep.u.catalog.rules = NULL;
            rep.u.catalog.rules_packed = packed[ids].data;
            rep.u.catalog.rules_packed_len = packed[ids].len;
        }
        struct proto_reply *out = roundtrip_reply(&rep);
        const struct proto_catalog_result *c = &out->u.catalog;
        ck_assert(c->known);
        ck_assert_uint_eq(c->n_rules, 3);
        ck_assert(c->ids_only == ids);
        ck_assert_str_eq(c->rules[0].id, "short");
        ck_assert_str_eq(c->rules[1].id, long_id);
        ck_assert_str_eq(c->rules[2].id, "bad\xef\xbf\xbd");
        for (int i = 0; i < 3; i++)
            ck_assert_uint_eq(c->rules[i].fp[PROTO_FP_LEN - 1], ids ? 0 : 0x10 + i);
        proto_reply_destroy(out);
    }
    proto_buf_finish(&packed[0]);
    proto_buf_finish(&packed[1]);

    struct proto_request has = {.id = 7, .op = PROTO_OP_CATALOG_HAS};
    has.u.ref = (struct proto_catalog_ref){.by_source = true, .ids_only = true};
    struct proto_request *rq = roundtrip_request(&has);
    ck_assert(rq->u.ref.by_source && rq->u.ref.ids_only);
    proto_request_destroy(rq);
    has.u.ref.ids_only = false;
    rq = roundtrip_request(&has);
    ck_assert(!rq->u.ref.ids_only);
    proto_request_destroy(rq);
    struct proto_request load = {.id = 8, .op = PROTO_OP_CATALOG_LOAD};
    load.u.load = (struct proto_catalog_load){
        .has_text = true, .text = "a:/x/", .text_len = 5, .ids_only = true};
    rq = roundtrip_request(&load);
    ck_assert(rq->u.load.ids_only);
    proto_request_destroy(rq);
}
END_TEST

Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *t = tcase_create("roundtrip");
    tcase_add_test(t, rt_hello_ping_stats);
    tcase_add_test(t, rt_catalog_load_rules);
    tcase_add_test(t, rt_catalog_load_text_has_drop);
    tcase_add_test(t, rt_scan_inline);
    tcase_add_test(t, rt_stream_writes);
    tcase_add_test(t, rt_replies);
    tcase_add_test(t, rt_catalog_rules_shapes);
    tcase_add_test(t, rt_scan_and_stats_replies);
    tcase_add_test(t, rt_hit_starts);
    tcase_add_test(t, rt_error_reply);
    suite_add_tcase(s, t);
    t = tcase_create("reader");
    tcase_add_test(t, reader_pipelined_chunks);
    tcase_add_test(t, reader_oversize_is_fatal);
    tcase_add_test(t, reader_truncated_frame);
    tcase_add_test(t, every_prefix_of_a_frame_is_incomplete);
    tcase_add_test(t, recv_eof_mid_frame);
    suite_add_tcase(s, t);
    t = tcase_create("errors");
    tcase_add_test(t, err_wrong_types);
    tcase_add_test(t, err_unknown_op_and_missing);
    tcase_add_test(t, err_too_many_buffers_and_rules);
    tcase_add_test(t, err_depth_and_lengths);
    suite_add_tcase(s, t);
    t = tcase_create("fds");
    tcase_add_test(t, fd_buffers_travel_with_their_frame);
    tcase_add_test(t, fd_errors);
    tcase_add_test(t, fd_over_limit);
    suite_add_tcase(s, t);

    t = tcase_create("read_ahead");
    tcase_add_test(t, read_ahead_frames_and_their_fds);
    tcase_add_test(t, read_ahead_random);
    tcase_add_test(t, read_ahead_one_call_a_frame);
    tcase_add_test(t, read_ahead_bad_length_after_a_frame);
    suite_add_tcase(s, t);

    t = tcase_create("misc");
    tcase_add_test(t, source_canon_is_exact);
    tcase_add_test(t, limits_normalize);
    tcase_add_test(t, error_codes_match_the_client_header);
    tcase_add_test(t, replies_are_valid_utf8);
    suite_add_tcase(s, t);
    return s;
}
