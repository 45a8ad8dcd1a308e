/*
 * libvkscan without a daemon: the installed header compiles on its own (it is
 * the first include of this file and nothing internal follows), and the
 * library is driven against a scripted peer that speaks the wire format with
 * msgpack-c directly, so these tests also check the library against
 * docs/protocol.md rather than against proto/ itself. End-to-end tests with a
 * real vkscand are in tests/test_daemon.c.
 */
#include "vkscan/vkscan.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- the scripted peer ---------------------------------------------------------- */

struct peer {
    char path[108];
    int lfd;
    int cfd; /* the connection being served, -1 between connections */
    pthread_t thread;
    int hello_error;     /* reply to hello with this VKS_E_* code */
    int drop_first_scan; /* close the connection instead of answering one scan */
    int garble_writes;   /* answer stream.write with a result that is not a map */
    int stream_writes;   /* stream.write requests seen */
    /* What the peer saw. */
    int connections;
    int loads;
    int has_by_source;
    uint8_t source[VKS_FP_LEN];
    char fd_text[64];
    int fd_seals;    /* F_GET_SEALS of the last fd buffer */
    int inline_bufs; /* inline buffers seen in the last scan */
    int starts;      /* the last scan asked for `starts` (then each hit starts at 0) */
};

static int read_full(int fd, void *p, size_t n, int *fds, int *n_fds)
{
    size_t off = 0;
    while (off < n) {
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int) * 8)];
        } ctl;
        struct iovec iov = {.iov_base = (char *)p + off, .iov_len = n - off};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = ctl.b,
                           .msg_controllen = sizeof(ctl.b)};
        ssize_t k = recvmsg(fd, &m, 0);
        if (k <= 0)
            return -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c && fds; c = CMSG_NXTHDR(&m, c)) {
            size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            memcpy(fds + *n_fds, CMSG_DATA(c), cnt * sizeof(int));
            *n_fds += (int)cnt;
        }
        off += (size_t)k;
    }
    return 0;
}

static const msgpack_object *get(const msgpack_object *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, strlen(key)) == 0)
            return &kv->val;
    }
    return NULL;
}

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void pk_fp(msgpack_packer *pk, uint8_t b)
{
    uint8_t fp[VKS_FP_LEN];
    memset(fp, b, sizeof(fp));
    msgpack_pack_bin(pk, VKS_FP_LEN);
    msgpack_pack_bin_body(pk, fp, VKS_FP_LEN);
}

static void result_catalog(struct peer *p, msgpack_packer *pk, bool has)
{
    if (has) {
        msgpack_pack_map(pk, 1);
        pk_str(pk, "known");
        msgpack_pack_false(pk);
        return;
    }
    p->loads++;
    msgpack_pack_map(pk, 4);
    pk_str(pk, "fingerprint");
    pk_fp(pk, 0xab);
    pk_str(pk, "rules");
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 2);
    pk_str(pk, "r1");
    pk_fp(pk, 0x01);
    pk_str(pk, "rejected");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3);
    pk_str(pk, "index");
    msgpack_pack_uint32(pk, 1);
    pk_str(pk, "id");
    pk_str(pk, "bad");
    pk_str(pk, "message");
    pk_str(pk, "unbalanced (");
    pk_str(pk, "cached");
    msgpack_pack_false(pk);
}

/* Scan: one hit per buffer whose end is the number of bytes the peer could
 * read from it (inline length, or the fd's content). */
static void result_scan(struct peer *p, msgpack_packer *pk, const msgpack_object *req, int *fds)
{
    const msgpack_object *bufs = get(req, "buffers");
    uint32_t n = bufs->via.array.size;
    const msgpack_object *starts = get(req, "starts");
    p->starts = starts != NULL && starts->type == MSGPACK_OBJECT_BOOLEAN && starts->via.boolean;
    msgpack_pack_map(pk, 3);
    pk_str(pk, "hits");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *b = &bufs->via.array.ptr[i];
        const msgpack_object *data = get(b, "data");
        uint64_t end = data ? data->via.bin.size : 0;
        p->inline_bufs += data != NULL;
        if (!data) {
            int fd = fds[get(b, "fd")->via.u64];
            p->fd_seals = fcntl(fd, F_GET_SEALS);
            ssize_t k = pread(fd, p->fd_text, sizeof(p->fd_text) - 1, 0);
            end = k > 0 ? (uint64_t)k : 0;
        }
        msgpack_pack_array(pk, p->starts ? 6 : 4); /* docs/protocol.md: id slot nil */
        msgpack_pack_uint32(pk, i);
        msgpack_pack_uint32(pk, 0);
        msgpack_pack_uint64(pk, end);
        msgpack_pack_uint32(pk, 1);
        if (p->starts) {
            msgpack_pack_nil(pk);
            msgpack_pack_uint64(pk, 0);
        }
    }
    pk_str(pk, "buffers");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) {
        msgpack_pack_map(pk, 2);
        pk_str(pk, "code");
        msgpack_pack_uint32(pk, 0);
        pk_str(pk, "hits");
        msgpack_pack_uint32(pk, 1);
    }
    pk_str(pk, "telemetry");
    msgpack_pack_map(pk, 1);
    pk_str(pk, "catalog_bytes_uploaded");
    msgpack_pack_uint64(pk, 0);
}

/* Answers one request; returns -1 to close the connection without a reply. */
static int answer(struct peer *p, int cfd, const msgpack_object *req, int *fds)
{
    const msgpack_object *op = get(req, "op");
    char name[32] = {0};
    memcpy(name, op->via.str.ptr, op->via.str.size < 31 ? op->via.str.size : 31);
    if (strcmp(name, "scan") == 0 && p->drop_first_scan) {
        p->drop_first_scan = 0;
        return -1;
    }
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_sbuffer_write(&sb, "\0\0\0\0", 4);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    pk_str(&pk, "id");
    msgpack_pack_uint64(&pk, get(req, "id")->via.u64);
    pk_str(&pk, "op");
    pk_str(&pk, name);
    if (strcmp(name, "hello") == 0 && p->hello_error) {
        pk_str(&pk, "error");
        msgpack_pack_map(&pk, 2);
        pk_str(&pk, "code");
        msgpack_pack_int(&pk, p->hello_error);
        pk_str(&pk, "message");
        pk_str(&pk, "this vkscand speaks protocol 7 only");
    } else {
        pk_str(&pk, "result");
        if (strcmp(name, "hello") == 0) {
            msgpack_pack_map(&pk, 2);
            pk_str(&pk, "version");
            msgpack_pack_uint32(&pk, 1);
            pk_str(&pk, "server");
            pk_str(&pk, "scripted peer");
        } else if (strcmp(name, "catalog.has") == 0) {
            const msgpack_object *src = get(req, "source");
            p->has_by_source += src != NULL;
            if (src != NULL)
                memcpy(p->source, src->via.bin.ptr, VKS_FP_LEN);
            result_catalog(p, &pk, true);
        } else if (strcmp(name, "catalog.load") == 0) {
            result_catalog(p, &pk, false);
        } else if (strcmp(name, "scan") == 0) {
            result_scan(p, &pk, req, fds);
        } else if (strcmp(name, "stream.open") == 0) {
            msgpack_pack_map(&pk, 2);
            pk_str(&pk, "stream");
            msgpack_pack_uint32(&pk, 1);
            pk_str(&pk, "state_bytes");
            msgpack_pack_uint64(&pk, 64);
        } else if (strcmp(name, "stream.write") == 0 && p->garble_writes) {
            p->stream_writes++;
            pk_str(&pk, "not a result");
        } else {
            msgpack_pack_map(&pk, 0);
        }
    }
    uint32_t len = (uint32_t)sb.size - 4;
    uint8_t hdr[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                      (uint8_t)len};
    memcpy(sb.data, hdr, 4);
    ssize_t w = write(cfd, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return w == (ssize_t)sb.size ? 0 : -1;
}

static void serve(struct peer *p, int cfd)
{
    for (;;) {
        uint8_t hdr[4];
        int fds[8], n_fds = 0;
        if (read_full(cfd, hdr, 4, fds, &n_fds) < 0)
            return;
        size_t len = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
        char *body = malloc(len);
        int rc = read_full(cfd, body, len, fds, &n_fds);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        if (rc == 0 && msgpack_unpack_next(&u, body, len, NULL) == MSGPACK_UNPACK_SUCCESS)
            rc = answer(p, cfd, &u.data, fds);
        msgpack_unpacked_destroy(&u);
        free(body);
        for (int i = 0; i < n_fds; i++)
            close(fds[i]);
        if (rc < 0)
            return;
    }
}

static void *peer_main(void *arg)
{
    struct peer *p = arg;
    int cfd;
    while ((cfd = accept(p->lfd, NULL, NULL)) >= 0) {
        p->connections++;
        __atomic_store_n(&p->cfd, cfd, __ATOMIC_SEQ_CST);
        serve(p, cfd);
        __atomic_store_n(&p->cfd, -1, __ATOMIC_SEQ_CST);
        close(cfd);
    }
    return NULL;
}

static void peer_start(struct peer *p)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(p->path, sizeof(p->path), "/tmp/vks-test-client-%d.sock", (int)getpid());
    unlink(p->path);
    memcpy(sa.sun_path, p->path, strlen(p->path) + 1);
    p->cfd = -1;
    p->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(p->lfd, 0);
    ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(p->lfd, 8), 0);
    ck_assert_int_eq(pthread_create(&p->thread, NULL, peer_main, p), 0);
}

static void peer_stop(struct peer *p)
{
    shutdown(p->lfd, SHUT_RDWR);
    int cfd = __atomic_load_n(&p->cfd, __ATOMIC_SEQ_CST);
    if (cfd >= 0)
        shutdown(cfd, SHUT_RDWR);
    pthread_join(p->thread, NULL);
    close(p->lfd);
    unlink(p->path);
}

/* ---- tests ---------------------------------------------------------------------- */

START_TEST(header_and_defaults)
{
    struct vks_client_options o;
    struct vks_error err = {.code = 0};
    vks_client_options_init(&o);
    ck_assert_uint_eq(o.retries, 3);
    ck_assert_uint_eq(o.max_frame, 64u << 20);
    ck_assert_int_eq(VKS_E_FRAME_TOO_LARGE, 1001);
    ck_assert_int_eq(VKS_E_INTERNAL, 1020);
    ck_assert_str_eq(vks_strerror(-VKS_E_BUSY), "busy");
    ck_assert_str_eq(vks_version(), VKS_VERSION);
    ck_assert_uint_eq(sizeof(err.msg), 256);
    /* struct vks_hit grew at its end: the 0.2 fields keep their places */
    ck_assert_uint_eq(offsetof(struct vks_hit, rule_id), 24);
    ck_assert_uint_eq(offsetof(struct vks_hit, start), 32);
    ck_assert(VKS_NO_START == UINT64_MAX);
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    ck_assert(!so.starts);
}
END_TEST

START_TEST(connect_missing_socket)
{
    struct vks_client *c = NULL;
    struct vks_error err;
    struct vks_client_options o;
    vks_client_options_init(&o);
    o.connect_timeout_ms = 100;
    int rc = vks_client_connect("/nonexistent/vkscand.sock", &o, &c, &err);
    ck_assert_int_eq(rc, -ENOENT);
    ck_assert_int_eq(err.code, -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/vkscand.sock"));
    ck_assert_ptr_null(c);
}
END_TEST

START_TEST(load_then_scan_inline_and_memfd)
{
    struct peer p = {0};
    struct vks_client *c;
    struct vks_error err;
    peer_start(&p);
    ck_assert_int_eq(vks_client_connect(p.path, NULL, &c, &err), 0);
    struct vks_server_info info;
    ck_assert_int_eq(vks_client_hello(c, &info, &err), 0);
    ck_assert_str_eq(info.server, "scripted peer");
    ck_assert_uint_eq(info.protocol, 1);

    struct vks_rule rules[2] = {{.id = "r1", .kind = VKS_RULE_LITERAL, .pattern = "abc"},
                                {.id = "bad", .kind = VKS_RULE_REGEX, .pattern = "(x"}};
    struct vks_catalog *cat;
    ck_assert_int_eq(vks_client_catalog_load(c, rules, 2, NULL, &cat, &err), 0);
    /* has (by source fingerprint) came first, then the rules were sent. */
    uint8_t src[VKS_FP_LEN];
    ck_assert_int_eq(vks_source_fingerprint(rules, 2, NULL, src, &err), 0);
    ck_assert_int_eq(p.has_by_source, 1);
    ck_assert_mem_eq(p.source, src, VKS_FP_LEN);
    ck_assert_int_eq(p.loads, 1);
    ck_assert(vks_catalog_rules_sent(cat));
    ck_assert_uint_eq(vks_catalog_fingerprint(cat)[0], 0xab);
    ck_assert_uint_eq(vks_catalog_rule_count(cat), 1);
    ck_assert_str_eq(vks_catalog_rule_id(cat, 0), "r1");
    ck_assert_uint_eq(vks_catalog_reject_count(cat), 1);
    struct vks_reject rj;
    ck_assert_int_eq(vks_catalog_reject(cat, 0, &rj), 0);
    ck_assert_str_eq(rj.message, "unbalanced (");
    ck_assert_int_eq(vks_catalog_reject(cat, 1, &rj), -EINVAL);

    int mfd = memfd_create("scan", MFD_CLOEXEC);
    ck_assert_int_eq(write(mfd, "from a memfd", 12), 12);
    struct vks_buffer bufs[2] = {{.kind = VKS_BUFFER_INLINE, .data = "12345", .len = 5},
                                 {.kind = VKS_BUFFER_FD, .fd = mfd}};
    struct vks_scan_result res;
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 2, NULL, &res, &err),
                     0);
    ck_assert_uint_eq(res.n_hits, 2);
    ck_assert_uint_eq(res.hits[0].end, 5);
    ck_assert_uint_eq(res.hits[1].buffer, 1);
    ck_assert_uint_eq(res.hits[1].end, 12); /* the peer read the memfd we passed */
    ck_assert_str_eq(p.fd_text, "from a memfd");
    ck_assert_int_eq(p.starts, 0);
    ck_assert_uint_eq(res.hits[0].start, VKS_NO_START);
    ck_assert_uint_eq(res.n_buffers, 2);
    const struct vks_stat *t =
        vks_stat_find(res.telemetry, res.n_telemetry, "catalog_bytes_uploaded");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->u, 0);
    vks_scan_result_finish(&res);
    /* `starts: true` goes out, and the hits' starts come back */
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.starts = true;
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 1, &so, &res, &err), 0);
    ck_assert_int_eq(p.starts, 1);
    ck_assert_uint_eq(res.n_hits, 1);
    ck_assert_uint_eq(res.hits[0].start, 0);
    ck_assert_uint_eq(res.hits[0].end, 5);
    ck_assert_ptr_null(res.hits[0].rule_id);
    vks_scan_result_finish(&res);
    vks_catalog_destroy(cat);
    close(mfd);
    vks_client_close(c);
    peer_stop(&p);
}
END_TEST

/* An inline buffer at or above memfd_threshold reaches the peer as a
 * memfd holding its bytes, one of the client's kept memfds: sealed against
 * shrinking (a daemon may map it), not against writes (the next scan
 * writes into it); a smaller one stays inline. */
START_TEST(large_inline_buffer_becomes_sealed_memfd)
{
    struct peer p = {0};
    struct vks_client *c;
    struct vks_error err;
    peer_start(&p);
    struct vks_client_options o;
    vks_client_options_init(&o);
    o.memfd_threshold = 16;
    ck_assert_int_eq(vks_client_connect(p.path, &o, &c, &err), 0);
    const char big[] = "twenty bytes inline";
    struct vks_buffer bufs[2] = {{.kind = VKS_BUFFER_INLINE, .data = big, .len = 19},
                                 {.kind = VKS_BUFFER_INLINE, .data = "small", .len = 5}};
    uint8_t fp[VKS_FP_LEN] = {0xab};
    struct vks_scan_result res;
    ck_assert_int_eq(vks_client_scan(c, fp, bufs, 2, NULL, &res, &err), 0);
    ck_assert_int_eq(p.inline_bufs, 1); /* "small" */
    ck_assert_str_eq(p.fd_text, big);   /* the memfd held the buffer's bytes */
    ck_assert_int_eq(p.fd_seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL),
                     F_SEAL_SHRINK);
    ck_assert_uint_eq(res.hits[0].end, 19);
    ck_assert_uint_eq(res.hits[1].end, 5);
    vks_scan_result_finish(&res);
    vks_client_close(c);
    peer_stop(&p);
}
END_TEST

START_TEST(reconnects_an_idempotent_scan)
{
    struct peer p = {.drop_first_scan = 1};
    struct vks_client *c;
    struct vks_error err;
    uint8_t fp[VKS_FP_LEN] = {0};
    peer_start(&p);
    ck_assert_int_eq(vks_client_connect(p.path, NULL, &c, &err), 0);
    struct vks_buffer buf = {.data = "abcdefg", .len = 7};
    struct vks_scan_result res;
    ck_assert_int_eq(vks_client_scan(c, fp, &buf, 1, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_hits, 1);
    ck_assert_uint_eq(res.hits[0].end, 7);
    ck_assert_int_eq(p.connections, 2);
    vks_scan_result_finish(&res);
    vks_client_close(c);
    peer_stop(&p);
}
END_TEST

/* A stream.write whose reply cannot be decoded may have been applied: the
 * stream says it is unusable from then on instead of writing on with a
 * wrong offset and lost matches; even once the client has reconnected (a
 * new connection may reuse the stream's id). */
START_TEST(stream_unusable_after_lost_write_reply)
{
    struct peer p = {.garble_writes = 1};
    struct vks_client *c;
    struct vks_error err = {0};
    uint8_t fp[VKS_FP_LEN] = {0};
    peer_start(&p);
    ck_assert_int_eq(vks_client_connect(p.path, NULL, &c, &err), 0);
    struct vks_stream *s = NULL;
    ck_assert_int_eq(vks_stream_open(c, fp, NULL, &s, &err), 0);
    struct vks_scan_result res;
    ck_assert_int_eq(vks_stream_write(s, "abc", 3, &res, &err), -VKS_E_PROTOCOL);
    ck_assert_int_eq(vks_stream_write(s, "def", 3, &res, &err), -VKS_E_CLOSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "stream 1 is unusable"));
    ck_assert_ptr_nonnull(strstr(err.msg, "the reply of the write at offset 0 was lost"));
    ck_assert_int_eq(vks_client_ping(c, &err), 0); /* reconnects */
    ck_assert_int_eq(vks_stream_write(s, "def", 3, &res, &err), -VKS_E_CLOSED);
    ck_assert_int_eq(p.stream_writes, 1); /* nothing sent after the lost reply */
    ck_assert_int_eq(vks_stream_close(s, NULL, &err), -VKS_E_CLOSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "is gone"));
    vks_client_close(c);
    peer_stop(&p);
}
END_TEST

START_TEST(gives_up_after_retries)
{
    struct peer p = {0};
    struct vks_client *c;
    struct vks_error err;
    struct vks_client_options o;
    vks_client_options_init(&o);
    o.retries = 2;
    o.backoff_ms = 1;
    peer_start(&p);
    ck_assert_int_eq(vks_client_connect(p.path, &o, &c, &err), 0);
    peer_stop(&p); /* the daemon is gone for good */
    ck_assert_int_eq(vks_client_ping(c, &err), -VKS_E_CLOSED);
    ck_assert_int_eq(err.code, -VKS_E_CLOSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "retries"));
    vks_client_close(c);
}
END_TEST

START_TEST(version_error_at_connect)
{
    struct peer p = {.hello_error = VKS_E_VERSION};
    struct vks_client *c = NULL;
    struct vks_error err;
    peer_start(&p);
    ck_assert_int_eq(vks_client_connect(p.path, NULL, &c, &err), -VKS_E_VERSION);
    ck_assert_ptr_nonnull(strstr(err.msg, "protocol 7"));
    ck_assert_ptr_null(c);
    peer_stop(&p);
}
END_TEST

START_TEST(source_fingerprints)
{
    struct vks_rule a = {.id = "x", .kind = VKS_RULE_REGEX, .pattern = "ab+", .flags = "i"};
    struct vks_rule b = a;
    uint8_t fa[VKS_FP_LEN], fb[VKS_FP_LEN], ft[VKS_FP_LEN];
    struct vks_error err;
    ck_assert_int_eq(vks_source_fingerprint(&a, 1, NULL, fa, &err), 0);
    ck_assert_int_eq(vks_source_fingerprint(&b, 1, NULL, fb, &err), 0);
    ck_assert_mem_eq(fa, fb, VKS_FP_LEN);
    b.flags = "";
    ck_assert_int_eq(vks_source_fingerprint(&b, 1, NULL, fb, &err), 0);
    ck_assert(memcmp(fa, fb, VKS_FP_LEN) != 0);
    struct vks_load_options o = {.max_states = 10};
    ck_assert_int_eq(vks_source_fingerprint(&a, 1, &o, fb, &err), 0);
    ck_assert(memcmp(fa, fb, VKS_FP_LEN) != 0);
    ck_assert_int_eq(vks_source_fingerprint_text("x:/ab+/i\n", 9, NULL, ft, &err), 0);
    ck_assert(memcmp(fa, ft, VKS_FP_LEN) != 0);
    struct vks_rule bad = {.id = NULL, .pattern = "x"};
    ck_assert_int_eq(vks_source_fingerprint(&bad, 1, NULL, fa, &err), -EINVAL);
}
END_TEST

Suite *client_suite(void)
{
    Suite *s = suite_create("client");
    TCase *t = tcase_create("client");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, header_and_defaults);
    tcase_add_test(t, connect_missing_socket);
    tcase_add_test(t, load_then_scan_inline_and_memfd);
    tcase_add_test(t, large_inline_buffer_becomes_sealed_memfd);
    tcase_add_test(t, reconnects_an_idempotent_scan);
    tcase_add_test(t, stream_unusable_after_lost_write_reply);
    tcase_add_test(t, gives_up_after_retries);
    tcase_add_test(t, version_error_at_connect);
    tcase_add_test(t, source_fingerprints);
    suite_add_tcase(s, t);
    return s;
}
