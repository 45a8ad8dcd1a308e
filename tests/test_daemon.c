/*
 * vkscand end to end: each test starts the real daemon (the binary meson
 * built, $VKSCAND) on a temporary socket, waits for its READY=1 datagram on a
 * test-owned $NOTIFY_SOCKET, and drives it through libvkscan; the pipelining
 * and bad-input cases speak raw frames (proto/, msgpack-c). Every hit list is
 * checked against the CPU reference scanner on the same rules.
 *
 * The daemon runs its GPU engine (--engine gpu): lavapipe in CI, so data
 * stays small. Also unit tests of the scheduler's fairness and of the
 * configuration parser.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <msgpack.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "proto.h"
#include "refscan.h"
#include "rules.h"
#include "scheduler.h"
#include "vkscan/vkscan.h"

/* ---- the daemon under test -------------------------------------------- */

struct daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
    char state[128];
    char notify[128];
    int notify_fd;
};

/* A failed assertion ends the test process at once: the daemon it started
 * must not outlive it. */
static void die_with_parent(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

static bool wait_ready(struct daemon *d, int timeout_ms)
{
    struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
    for (int waited = 0; waited < timeout_ms; waited += 100) {
        if (poll(&p, 1, 100) == 1) {
            char buf[512] = {0};
            ssize_t n = recv(d->notify_fd, buf, sizeof(buf) - 1, 0);
            if (n > 0 && strstr(buf, "READY=1") != NULL)
                return true;
        }
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            return false;
        }
    }
    return false;
}

/* When set, the next daemon_start preloads this libvkfault into vkscand,
 * armed through <dir>/vkfault.ctl (tests/fault/vkfault.h). */
static const char *vkfault_so;

/* When set, the next daemon_start preloads this libreadfault into vkscand
 * (tests/fault/readfault.c). */
static const char *readfault_so;

/* With vkfault_so: the next daemon_start's GPU engine waits in
 * vkCreateInstance until <dir>/vkfault.hold exists (tests/fault/vkfault.h). */
static bool vkfault_hold;

/* Starts vkscand in `dir` (a fresh temporary directory when NULL) with the
 * extra flags `extra` (NULL-terminated), not waiting for it. */
static void daemon_spawn(struct daemon *d, const char *dir, const char *const *extra)
{
    memset(d, 0, sizeof(*d));
    if (dir != NULL) {
        snprintf(d->dir, sizeof(d->dir), "%s", dir);
    } else {
        snprintf(d->dir, sizeof(d->dir), "/tmp/vkd-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(d->dir));
        chmod(d->dir, 0755); /* the tenant test connects as another uid */
    }
    snprintf(d->sock, sizeof(d->sock), "%s/vkscand.sock", d->dir);
    snprintf(d->state, sizeof(d->state), "%s/state", d->dir);
    snprintf(d->notify, sizeof(d->notify), "%s/notify", d->dir);
    unlink(d->notify);
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_int_lt(snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->notify),
                     (int)sizeof(sa.sun_path));
    ck_assert_int_eq(bind(d->notify_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char *bin = getenv("VKSCAND");
    ck_assert_msg(bin != NULL, "VKSCAND is not set: run through meson test");
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        const char *argv[32] = {bin,      "--socket",    d->sock,  "--state-dir",
                                d->state, "--engine",    "gpu",    "--socket-mode",
                                "0666",   "--log-level", "warning"};
        int n = 11;
        for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        setenv("NOTIFY_SOCKET", d->notify, 1);
        if (readfault_so != NULL)
            setenv("LD_PRELOAD", readfault_so, 1);
        if (vkfault_so != NULL) {
            char ctl[sizeof(d->dir) + 16];
            snprintf(ctl, sizeof(ctl), "%s/vkfault.ctl", d->dir);
            setenv("VKFAULT_CTL", ctl, 1);
            setenv("LD_PRELOAD", vkfault_so, 1);
            if (vkfault_hold) {
                snprintf(ctl, sizeof(ctl), "%s/vkfault.hold", d->dir);
                setenv("VKFAULT_HOLD", ctl, 1);
            }
        }
        if (readfault_so != NULL || vkfault_so != NULL) {
            char opts[512];
            const char *asan = getenv("ASAN_OPTIONS"); /* libasan stays first for the exe */
            snprintf(opts, sizeof(opts), "%s%sverify_asan_link_order=0", asan ? asan : "",
                     asan ? ":" : "");
            setenv("ASAN_OPTIONS", opts, 1);
        }
        die_with_parent();
        execv(bin, (char *const *)argv);
        _exit(127);
    }
}

/* daemon_spawn, then waits until vkscand is ready (READY=1). */
static void daemon_start(struct daemon *d, const char *dir, const char *const *extra)
{
    daemon_spawn(d, dir, extra);
    ck_assert_msg(wait_ready(d, 120000), "vkscand did not become ready");
}

/* SIGTERM, then the exit status (-1 when it had to be killed). */
static int daemon_stop(struct daemon *d)
{
    int st = 0, rc = -1;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        for (int i = 0; i < 600; i++) {
            if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                break;
            }
            usleep(100000);
        }
        if (rc < 0) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
        }
        d->pid = 0;
    }
    if (d->notify_fd > 0)
        close(d->notify_fd);
    d->notify_fd = 0;
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void daemon_clean(struct daemon *d)
{
    nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static struct vks_client *connect_ok(const struct daemon *d)
{
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    int rc = vks_client_connect(d->sock, NULL, &c, &err);
    ck_assert_msg(rc == 0, "connect: %d %s", rc, err.msg);
    return c;
}

static uint64_t stat_of(struct vks_client *c, const char *key)
{
    struct vks_stats st = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_stats(c, &st, &err), 0);
    const struct vks_stat *s = vks_stat_find(st.stats, st.n_stats, key);
    ck_assert_msg(s != NULL, "stats has no %s", key);
    uint64_t v = s->u;
    vks_stats_finish(&st);
    return v;
}

static uint64_t tel_of(const struct vks_scan_result *r, const char *key)
{
    const struct vks_stat *s = vks_stat_find(r->telemetry, r->n_telemetry, key);
    ck_assert_msg(s != NULL, "telemetry has no %s", key);
    return s->u;
}

/* ---- rules and the reference ------------------------------------------ */

static const struct vks_rule rules[] = {
    {"lit", VKS_RULE_LITERAL, "needle", 0, NULL},
    {"re", VKS_RULE_REGEX, "ab[0-9]+c", 0, NULL},
    {"hex", VKS_RULE_HEX, "de ad ?? ef", 0, NULL},
    {"ci", VKS_RULE_REGEX, "hello", 0, "i"},
    {"yara", VKS_RULE_HEX, "4d 5a [1-3] (50 45 | 4? 45) ~00", 0, NULL},
    {"bad", VKS_RULE_REGEX, "fo+(", 0, NULL},
};
#define N_RULES (sizeof(rules) / sizeof(rules[0]))

static const struct vks_rule other_rules[] = {
    {"other", VKS_RULE_LITERAL, "zebra", 0, NULL},
};

/* The same rules compiled here: the catalog the daemon must have built. */
static struct catalog *local_catalog(const struct vks_rule *r, size_t n)
{
    struct rule_src src[8];
    uint32_t idx[8];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t flags = 0;
        if (r[i].flags != NULL)
            ck_assert_int_eq(rules_parse_flags(r[i].flags, strlen(r[i].flags), &flags, NULL), 0);
        src[k] = (struct rule_src){
            r[i].id, (enum rule_kind)r[i].kind, r[i].pattern, strlen(r[i].pattern), flags, 0};
        idx[k++] = (uint32_t)i;
    }
    (void)idx;
    struct rules_result res = {0};
    struct rules_options ro = {0};
    ck_assert_int_eq(rules_compile(src, k, &ro, &res, NULL), 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    return cat;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

/* A small haystack with the rules' matches planted. */
static size_t make_haystack(uint8_t *buf, size_t len)
{
    static const char *const plants[] = {
        "needle", "ab12c",        "\xde\xad\x01\xef", "HeLLo",
        "ab9c",   "MZ\x90PE\x01", "MZ\x01\x02LE\x07", "MZ\x01\x02\x03\x04PEx"};
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)('a' + rnd(26));
    for (size_t p = 0; p + 16 < len; p += 40 + rnd(200)) {
        const char *s = plants[rnd(8)];
        memcpy(buf + p, s, strlen(s));
    }
    return len;
}

/* Asserts that the hits of buffer `b` in `res` are exactly refscan's. */
static void check_hits(const struct catalog *cat, const struct vks_scan_result *res, uint32_t b,
                       const uint8_t *data, size_t len, enum scan_mode mode)
{
    struct scan_hits want = {0};
    ck_assert_int_eq(refscan_buffer(cat, data, len, mode, &want), 0);
    size_t k = 0;
    for (size_t i = 0; i < res->n_hits; i++) {
        const struct vks_hit *h = &res->hits[i];
        if (h->buffer != b)
            continue;
        ck_assert_msg(k < want.n, "buffer %u: extra hit rule %u end %llu", b, h->rule,
                      (unsigned long long)h->end);
        ck_assert_msg(h->rule == want.v[k].rule && h->end == want.v[k].end &&
                          h->count == want.v[k].count,
                      "buffer %u hit %zu: got (%u,%llu,%u) want (%u,%llu,%u)", b, k, h->rule,
                      (unsigned long long)h->end, h->count, want.v[k].rule,
                      (unsigned long long)want.v[k].end, want.v[k].count);
        k++;
    }
    ck_assert_msg(k == want.n, "buffer %u: %zu hits, refscan %zu", b, k, want.n);
    ck_assert_uint_eq(res->buffers[b].hits, want.n);
    scan_hits_finish(&want);
}

/* Scans vb[0..n) with the result cache off in report mode `mode` (0 all,
 * 1 first, 2 count), asserting the request succeeds; the mode for
 * refscan. */
static enum scan_mode scan_in_mode(struct vks_client *c, const struct vks_catalog *cat,
                                   const struct vks_buffer *vb, size_t n, int mode,
                                   struct vks_scan_result *res)
{
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.no_cache = true;
    so.mode = mode == 0 ? VKS_REPORT_ALL : mode == 1 ? VKS_REPORT_FIRST : VKS_REPORT_COUNT;
    struct vks_error err = {0};
    int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), vb, n, &so, res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    return mode == 0 ? SCAN_ALL : mode == 1 ? SCAN_FIRST : SCAN_COUNT;
}

static struct vks_catalog *load_ok(struct vks_client *c, const struct vks_rule *r, size_t n,
                                   bool always_send)
{
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    struct vks_load_options lo = {.always_send = always_send};
    int rc = vks_client_catalog_load(c, r, n, &lo, &cat, &err);
    ck_assert_msg(rc == 0, "load: %d %s", rc, err.msg);
    return cat;
}

/* ---- raw frames ------------------------------------------------------- */

static int raw_connect(const struct daemon *d)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_int_lt(snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->sock),
                     (int)sizeof(sa.sun_path));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void raw_send(int fd, const void *data, size_t len, const int *fds, size_t n_fds)
{
    ck_assert_int_eq(proto_send(fd, data, len, fds, n_fds, 10000, NULL), 0);
}

/* Sends one msgpack body (from a packer's buffer) as a frame. */
static void raw_frame(int fd, const msgpack_sbuffer *sb, const int *fds, size_t n_fds)
{
    uint8_t *f = malloc(sb->size + 4);
    f[0] = (uint8_t)(sb->size >> 24);
    f[1] = (uint8_t)(sb->size >> 16);
    f[2] = (uint8_t)(sb->size >> 8);
    f[3] = (uint8_t)sb->size;
    memcpy(f + 4, sb->data, sb->size);
    raw_send(fd, f, sb->size + 4, fds, n_fds);
    free(f);
}

/* Reads one reply; NULL at EOF. */
static struct proto_reply *raw_reply(int fd)
{
    struct proto_reader *r;
    ck_assert_int_eq(proto_reader_create(NULL, &r), 0);
    struct proto_reply *rep = NULL;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ck_assert_msg(poll(&p, 1, 60000) == 1, "no reply within 60 s");
        int rc = proto_reader_recv(r, fd, NULL);
        if (rc == PROTO_RECV_EOF || rc == -ECONNRESET)
            break;
        ck_assert_int_ge(rc, 0);
        if (rc == PROTO_RECV_FRAME) {
            struct proto_frame f;
            ck_assert_int_eq(proto_reader_take(r, &f), 0);
            ck_assert_int_eq(proto_reply_decode(&f, NULL, &rep, NULL), 0);
            break;
        }
    }
    proto_reader_destroy(r);
    return rep;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* {"id": id, "op": op} plus `extra` more pairs the caller packs. */
static void pack_head(msgpack_packer *pk, uint32_t id, const char *op, uint32_t extra)
{
    msgpack_pack_map(pk, 2 + extra);
    pack_str(pk, "id");
    msgpack_pack_uint32(pk, id);
    pack_str(pk, "op");
    pack_str(pk, op);
}

static void pack_scan(msgpack_packer *pk, uint32_t id, const uint8_t *fp, const void *data,
                      size_t len)
{
    pack_head(pk, id, "scan", 2);
    pack_str(pk, "catalog");
    msgpack_pack_bin(pk, 32);
    msgpack_pack_bin_body(pk, fp, 32);
    pack_str(pk, "buffers");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    pack_str(pk, "data");
    msgpack_pack_bin(pk, len);
    msgpack_pack_bin_body(pk, data, len);
}

/* Expects an error reply with `code` (positive) and `id`. */
static void expect_error(int fd, uint32_t id, int code)
{
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_msg(rep != NULL, "connection closed, expected error %d", code);
    ck_assert_msg(rep->error.code == -code, "id %u: error %d (%s), expected %d", rep->id,
                  -rep->error.code, rep->error.msg, code);
    ck_assert_uint_eq(rep->id, id);
    ck_assert_msg(rep->error.msg[0] != '\0', "error %d without a message", code);
    proto_reply_destroy(rep);
}

static void expect_ping_ok(const struct daemon *d)
{
    struct vks_client *c = connect_ok(d);
    ck_assert_int_eq(vks_client_ping(c, NULL), 0);
    vks_client_close(c);
}

/* ---- load and scan ---------------------------------------------------- */

START_TEST(test_load_scan_inline)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    ck_assert_mem_eq(vks_catalog_fingerprint(cat), catalog_fingerprint(ref), 32);
    ck_assert_uint_eq(vks_catalog_rule_count(cat), N_RULES - 1);
    ck_assert_uint_eq(vks_catalog_reject_count(cat), 1);
    struct vks_reject rj;
    ck_assert_int_eq(vks_catalog_reject(cat, 0, &rj), 0);
    ck_assert_uint_eq(rj.index, N_RULES - 1);
    ck_assert_str_eq(rj.id, "bad");

    static uint8_t bufs[3][3000];
    struct vks_buffer vb[3];
    for (int i = 0; i < 3; i++) {
        make_haystack(bufs[i], sizeof(bufs[i]) - (size_t)i * 1000);
        vb[i] = (struct vks_buffer){
            .kind = VKS_BUFFER_INLINE, .data = bufs[i], .len = sizeof(bufs[i]) - (size_t)i * 1000};
    }
    for (int mode = 0; mode < 3; mode++) {
        struct vks_scan_options so = {.mode = (enum vks_report)mode, .rule_ids = true};
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), vb, 3, &so, &res, &err);
        ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
        ck_assert_uint_eq(res.n_buffers, 3);
        for (uint32_t b = 0; b < 3; b++)
            check_hits(ref, &res, b, bufs[b], vb[b].len, (enum scan_mode)mode);
        ck_assert_uint_gt(res.n_hits, 0);
        ck_assert_str_eq(res.hits[0].rule_id, vks_catalog_rule_id(cat, res.hits[0].rule));
        ck_assert_uint_eq(tel_of(&res, "engine"), 0); /* the GPU path */
        vks_scan_result_finish(&res);
    }
    /* max_hits cuts the report and says so. */
    struct vks_scan_options so = {.max_hits = 2};
    struct vks_scan_result res = {0};
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), vb, 1, &so, &res, NULL), 0);
    ck_assert_uint_eq(res.n_hits, 2);
    ck_assert(res.buffers[0].truncated);
    vks_scan_result_finish(&res);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* --engine auto: a batch whose bytes x DFA groups stay under cpu-max-work
 * goes to the CPU reference scanner (a GPU launch costs more than scanning
 * a few KiB); a larger one to the GPU. Both give refscan's hits. */
START_TEST(test_small_batches_on_cpu)
{
    struct daemon d;
    const char *extra[] = {"--engine", "auto", "--device", "0", "--cpu-max-work", "64K", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    uint32_t groups = catalog_group_count(ref);
    static uint8_t buf[256 * 1024];
    size_t sizes[2] = {4096, sizeof(buf)};
    uint64_t want_engine[2] = {1, 0}; /* 1: CPU scanner, 0: GPU */
    ck_assert_uint_le(4096 * groups, 64 * 1024);
    ck_assert_uint_gt(sizeof(buf) * groups, 64 * 1024);
    for (int k = 0; k < 2; k++) {
        make_haystack(buf, sizes[k]);
        struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = sizes[k]};
        struct vks_scan_options so = {.mode = VKS_REPORT_ALL};
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, &so, &res, &err);
        ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
        check_hits(ref, &res, 0, buf, sizes[k], SCAN_ALL);
        ck_assert_uint_gt(res.n_hits, 0);
        ck_assert_uint_eq(tel_of(&res, "engine"), want_engine[k]);
        vks_scan_result_finish(&res);
    }
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* An idle CPU engine thread spins for the next request (cpu-spin-us): 4 KiB
 * scans one after another on the CPU engine are taken by the spinning
 * thread (cpu.spin_hits), with the hits of the reference; with
 * cpu-spin-us 0 none is. A spin long enough to outlast any client's gap
 * (1 s), so the count does not depend on the machine's speed. The engine
 * thread writes each reply (engine-replies, the default), and a stats
 * request sent right after a reply already counts its scan (it did not when
 * the loop counted the scan after the engine thread's write). */
START_TEST(test_cpu_spin_takes_next_request)
{
    for (int spin = 0; spin < 2; spin++) {
        struct daemon d;
        const char *extra[] = {"--engine", "cpu", "--cpu-spin-us", spin ? "1000000" : "0", NULL};
        daemon_start(&d, NULL, extra);
        struct vks_client *c = connect_ok(&d);
        struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
        struct catalog *ref = local_catalog(rules, N_RULES - 1);
        static uint8_t buf[4096];
        make_haystack(buf, sizeof(buf));
        uint64_t hits_sum = 0;
        for (int i = 0; i < 40; i++) {
            struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = sizeof(buf)};
            struct vks_scan_options so = {.mode = VKS_REPORT_ALL};
            struct vks_scan_result res = {0};
            struct vks_error err = {0};
            int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, &so, &res, &err);
            ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
            check_hits(ref, &res, 0, buf, sizeof(buf), SCAN_ALL);
            ck_assert_uint_gt(res.n_hits, 0);
            ck_assert_uint_eq(stat_of(c, "scans"), (uint64_t)i + 1);
            ck_assert_uint_eq(stat_of(c, "requests.scan.ok"), (uint64_t)i + 1);
            hits_sum += res.n_hits;
            ck_assert_uint_eq(stat_of(c, "scan_hits"), hits_sum);
            vks_scan_result_finish(&res);
        }
        uint64_t hits = stat_of(c, "cpu.spin_hits");
        if (spin)
            ck_assert_uint_ge(hits, 20);
        else
            ck_assert_uint_eq(hits, 0);
        catalog_destroy(ref);
        vks_catalog_destroy(cat);
        vks_client_close(c);
        ck_assert_int_eq(daemon_stop(&d), 0);
        daemon_clean(&d);
    }
}
END_TEST

/* Tiny tasks are claimed several at a time by one CPU engine thread
 * (engine_cpu.c claim_at): 30 buffers of 1 byte to 8 KB cut into 4 KiB
 * segments, so claims span segments, buffers and the request's end, on 3
 * threads. Every mode gives refscan's hits per buffer, and with max_hits 25
 * the reply is the first 25 hits in buffer order (fails if a claimed task's
 * hits are merged out of order or its limit is lost). */
START_TEST(test_tiny_tasks_claimed)
{
    enum { NB = 30 };
    struct daemon d;
    const char *extra[] = {"--engine", "cpu", "--cpu-threads", "3", "--cpu-segment-bytes",
                           "4K",       NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t data[NB][8000];
    struct vks_buffer vb[NB];
    size_t len[NB];
    for (int i = 0; i < NB; i++) {
        len[i] = 1 + rnd(8000); /* under 256 KiB in all: a small batch */
        make_haystack(data[i], len[i]);
        vb[i] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = data[i], .len = len[i]};
    }
    for (int mode = 0; mode < 3; mode++) {
        struct vks_scan_result res = {0};
        enum scan_mode m = scan_in_mode(c, cat, vb, NB, mode, &res);
        for (uint32_t b = 0; b < NB; b++)
            check_hits(ref, &res, b, data[b], len[b], m);
        vks_scan_result_finish(&res);
    }
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.no_cache = true;
    so.max_hits = 25;
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), vb, NB, &so, &res, &err), 0);
    ck_assert_uint_eq(res.n_hits, 25);
    size_t k = 0;
    for (uint32_t b = 0; b < NB && k < 25; b++) {
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(ref, data[b], len[b], SCAN_ALL, &want), 0);
        for (size_t i = 0; i < want.n && k < 25; i++, k++) {
            ck_assert_uint_eq(res.hits[k].buffer, b);
            ck_assert_uint_eq(res.hits[k].rule, want.v[i].rule);
            ck_assert_uint_eq(res.hits[k].end, want.v[i].end);
        }
        scan_hits_finish(&want);
    }
    ck_assert_uint_eq(k, 25);
    vks_scan_result_finish(&res);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* A hit bomb against a catalog with an unbounded rule (matched whole): on
 * the CPU engine and through the GPU engine's host confirmations (which
 * stop at 4 x max-hits raw matches and hand the scan to the CPU engine)
 * count mode is exact, over that bound and under it, and the daemon goes
 * on serving. */
START_TEST(test_hit_bomb_unbounded_rule)
{
    /* The CPU engine counts the matches without holding them
     * (docs/engine.md, "Forward-confirmed catalogs"): the exact count,
     * also past the raw-match bound. The GPU engine's host confirmations
     * pass the bound and the scan is re-run on the CPU engine. _i 1: with
     * a rule of a 3-byte factor beside it, which the CPU engine then walks
     * in full. */
    static const struct vks_rule bomb[2][2] = {
        {{"tok", VKS_RULE_REGEX, "(?i)token[[:alnum:]]{8,}", 0, NULL}},
        {{"tok", VKS_RULE_REGEX, "(?i)token[[:alnum:]]{8,}", 0, NULL},
         {"key", VKS_RULE_REGEX, "key.{2}x", 0, NULL}},
    };
    size_t len = 5 + 100000;
    uint8_t *buf = malloc(len);
    memcpy(buf, "token", 5);
    memset(buf + 5, 'a', len - 5);
    for (int gpu = 0; gpu < 2; gpu++) {
        struct daemon d;
        const char *extra[] = {"--engine", gpu ? "gpu" : "cpu", "--max-hits", "16", NULL};
        daemon_start(&d, NULL, extra);
        struct vks_client *c = connect_ok(&d);
        struct vks_catalog *cat = load_ok(c, bomb[_i], (size_t)_i + 1, false);
        for (int k = 0; k < 2; k++) {
            /* 100,000 - 7 matches, over the 65,536 raw matches a walk of
             * the whole buffer may hold; then 50,000 - 7, under it */
            size_t n = k == 0 ? len : 5 + 50000;
            struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = n};
            struct vks_scan_options so = {.mode = VKS_REPORT_COUNT};
            struct vks_scan_result res = {0};
            struct vks_error err = {0};
            int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, &so, &res, &err);
            ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
            ck_assert_uint_eq(res.n_buffers, 1);
            ck_assert_int_eq(res.buffers[0].code, 0);
            ck_assert_uint_eq(res.n_hits, 1);
            ck_assert_uint_eq(res.hits[0].count, n - 5 - 7);
            if (gpu) { /* a walk past the GPU's cap is finished on the host (on lavapipe this
                        * one is; the H200's cap holds it): both keys sent, and agreeing */
                uint64_t live = tel_of(&res, "confirm_host"), ns = tel_of(&res, "confirm_host_ns");
                ck_assert_msg(live == 0 ? ns == 0 : ns > 0,
                              "confirm_host %llu, confirm_host_ns %llu", (unsigned long long)live,
                              (unsigned long long)ns);
            }
            vks_scan_result_finish(&res);
        }
        vks_catalog_destroy(cat);
        vks_client_close(c);
        ck_assert_int_eq(daemon_stop(&d), 0);
        daemon_clean(&d);
    }
    free(buf);
}
END_TEST

/* One inline scan; returns the telemetry value `key` of its reply. */
static uint64_t scan_tel(struct vks_client *c, const struct vks_catalog *cat, const char *key)
{
    static const uint8_t data[] = "a needle and a zebra";
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data) - 1};
    struct vks_scan_options so = {.mode = VKS_REPORT_ALL};
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, &so, &res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    ck_assert_uint_eq(res.n_hits, 1);
    uint64_t v = tel_of(&res, key);
    vks_scan_result_finish(&res);
    return v;
}

/* A catalog its last tenant drops leaves the device at once, not when LRU
 * eviction gets to it. */
START_TEST(test_drop_frees_device_copy)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *a = load_ok(c, rules, N_RULES, false);
    struct vks_catalog *b = load_ok(c, other_rules, 1, false);
    scan_tel(c, a, "resident_catalogs");
    uint64_t both = scan_tel(c, b, "resident_catalogs");
    bool dropped = false;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_catalog_drop(c, vks_catalog_fingerprint(a), &dropped, &err), 0);
    ck_assert(dropped);
    ck_assert_uint_eq(scan_tel(c, b, "resident_catalogs"), both - 1);
    ck_assert_uint_eq(scan_tel(c, b, "catalog_bytes_uploaded"), 0);
    vks_catalog_destroy(a);
    vks_catalog_destroy(b);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

static int make_memfd(const uint8_t *data, size_t len, bool seal)
{
    int fd = memfd_create("vkscan-test", MFD_CLOEXEC | (seal ? MFD_ALLOW_SEALING : 0));
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
    if (seal)
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
    return fd;
}

START_TEST(test_scan_memfd)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t data[6000];
    make_haystack(data, sizeof(data));
    int plain = make_memfd(data, sizeof(data), false);
    int sealed = make_memfd(data, sizeof(data), true);
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    struct vks_buffer vb[5] = {
        {.kind = VKS_BUFFER_FD, .fd = plain},
        {.kind = VKS_BUFFER_FD, .fd = sealed, .offset = 1000, .length = 3000},
        {.kind = VKS_BUFFER_INLINE, .data = data, .len = 500},
        {.kind = VKS_BUFFER_FD, .fd = pipefd[0]},                             /* not a file */
        {.kind = VKS_BUFFER_FD, .fd = plain, .offset = 5000, .length = 5000}, /* past the end */
    };
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), vb, 5, NULL, &res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    check_hits(ref, &res, 0, data, sizeof(data), SCAN_ALL);
    check_hits(ref, &res, 1, data + 1000, 3000, SCAN_ALL);
    check_hits(ref, &res, 2, data, 500, SCAN_ALL);
    ck_assert_uint_eq(res.buffers[0].bytes, sizeof(data));
    ck_assert_uint_eq(res.buffers[1].bytes, 3000);
    /* A bad descriptor fails only its own buffer. */
    ck_assert_int_eq(res.buffers[3].code, -VKS_E_BAD_FD);
    ck_assert_int_eq(res.buffers[4].code, -VKS_E_BAD_FD);
    ck_assert_ptr_nonnull(res.buffers[3].message);
    vks_scan_result_finish(&res);
    close(plain);
    close(sealed);
    close(pipefd[0]);
    close(pipefd[1]);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* Descriptor buffers on the GPU engine are read by its upload threads
 * straight into upload memory (pread at the buffer's offset, in pieces split
 * at odd haystack offsets), not mapped or copied first: files and memfds,
 * sealed or not, by default (loop 0); with VKSCAND_FD_UPLOAD=map (loop 1) a
 * memfd sealed against shrinking is mapped at load instead. A regular file
 * and memfds, whole and in odd ranges, give exactly the hits of the same
 * bytes sent inline, and the telemetry says which bytes went the deferred
 * way. */
START_TEST(test_fd_read_at_upload)
{
    struct daemon d;
    if (_i == 1)
        setenv("VKSCAND_FD_UPLOAD", "map", 1);
    daemon_start(&d, NULL, NULL);
    unsetenv("VKSCAND_FD_UPLOAD");
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    enum { SIZE = (3 << 20) + 1237 };
    uint8_t *data = malloc(SIZE);
    ck_assert_ptr_nonnull(data);
    make_haystack(data, SIZE);
    /* a match across every MiB boundary and at the very end */
    for (size_t m = 1; m <= 3; m++)
        memcpy(data + (m << 20) - 3, "needle", 6);
    memcpy(data + SIZE - 6, "needle", 6);
    char path[sizeof(d.dir) + 16];
    snprintf(path, sizeof(path), "%s/hay", d.dir);
    int file = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(file, 0);
    ck_assert_int_eq(write(file, data, SIZE), SIZE);
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    int sealed = make_memfd(data, SIZE, true);
    int plain = make_memfd(data, SIZE, false);
    struct {
        int fd;
        uint64_t off, len;
    } v[] = {
        {ro, 0, SIZE},
        {ro, 1000001, 1500007},
        {sealed, 4095, (2u << 20) + 17},
        {sealed, 77, 300001},
        {plain, (1u << 20) - 1, SIZE - (1u << 20) + 1},
        {file, SIZE - 7, 7},
    };
    enum { N = sizeof(v) / sizeof(v[0]) };
    struct vks_buffer vb[N + 1];
    uint64_t fd_bytes = 0;
    for (size_t i = 0; i < N; i++) {
        vb[i] = (struct vks_buffer){
            .kind = VKS_BUFFER_FD, .fd = v[i].fd, .offset = v[i].off, .length = v[i].len};
        fd_bytes += v[i].fd != sealed || _i == 0 ? v[i].len : 0;
    }
    vb[N] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = data + 5, .len = 70001};
    for (int mode = 0; mode < 3; mode++) {
        struct vks_scan_result res = {0};
        enum scan_mode sm = scan_in_mode(c, cat, vb, N + 1, mode, &res);
        for (size_t i = 0; i < N; i++) {
            ck_assert_int_eq(res.buffers[i].code, 0);
            ck_assert_uint_eq(res.buffers[i].bytes, v[i].len);
            check_hits(ref, &res, (uint32_t)i, data + v[i].off, v[i].len, sm);
        }
        check_hits(ref, &res, N, data + 5, 70001, sm);
        ck_assert_uint_eq(tel_of(&res, "engine"), 0);
        ck_assert_uint_eq(tel_of(&res, "fd_upload_bytes"), fd_bytes);
        vks_scan_result_finish(&res);
    }
    close(ro);
    close(file);
    close(sealed);
    close(plain);
    free(data);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* Hit-dense scans in count and first modes are counted per rule by the
 * GPU's kernel (telemetry hits_device_counted, docs/gpu.md "Counting on
 * the device"): through the socket, a sealed memfd and an inline buffer in
 * one request (1 MiB and more in those modes) give the reference scanner's
 * hits in every mode; in modes first and count every match is counted on
 * the device and none reaches the hit ring, in mode all every one does. */
START_TEST(test_counted_hits)
{
    static const struct vks_rule dense[] = {
        {"ab", VKS_RULE_LITERAL, "ab", 0, NULL},
        {"cx", VKS_RULE_REGEX, "c[ab]", 0, NULL},
        {"sp", VKS_RULE_LITERAL, " a", 0, NULL},
    };
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, dense, 3, false);
    struct catalog *ref = local_catalog(dense, 3);
    enum { SIZE = (1 << 20) + 333 };
    uint8_t *data = malloc(SIZE);
    ck_assert_ptr_nonnull(data);
    uint32_t r = 7;
    for (size_t i = 0; i < SIZE; i++) {
        r = r * 1103515245u + 12345u;
        data[i] = "abc "[(r >> 16) % 4];
    }
    int sealed = make_memfd(data, SIZE, true);
    struct vks_buffer vb[2] = {
        {.kind = VKS_BUFFER_FD, .fd = sealed, .offset = 0, .length = SIZE},
        {.kind = VKS_BUFFER_INLINE, .data = data + 11, .len = 90001},
    };
    for (int mode = 0; mode < 3; mode++) {
        struct vks_scan_result res = {0};
        enum scan_mode sm = scan_in_mode(c, cat, vb, 2, mode, &res);
        check_hits(ref, &res, 0, data, SIZE, sm);
        check_hits(ref, &res, 1, data + 11, 90001, sm);
        ck_assert_uint_eq(tel_of(&res, "engine"), 0);
        uint64_t raw = tel_of(&res, "hits_raw"), dev = tel_of(&res, "hits_device_counted");
        ck_assert_uint_gt(mode == 0 ? raw : dev, 65536);
        ck_assert_uint_eq(mode == 0 ? dev : raw, 0);
        vks_scan_result_finish(&res);
    }
    close(sealed);
    free(data);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* A deferred read that fails (EIO; a file that ended early, as one
 * truncated under the scan) fails its own buffer with BAD_FD and the
 * reason, and drops its hits; a duplicate of it in the batch fails too; the
 * other buffers are exact, and the daemon keeps serving. */
START_TEST(test_fd_read_errors)
{
    readfault_so = getenv("READFAULT_SO");
    ck_assert_msg(readfault_so != NULL, "READFAULT_SO is not set: run through meson test");
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    readfault_so = NULL;
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t data[200000];
    make_haystack(data, sizeof(data));
    int good = make_memfd(data, sizeof(data), true);
    int eio = memfd_create("readfault-eio", MFD_CLOEXEC);
    int eof = memfd_create("readfault-short", MFD_CLOEXEC);
    ck_assert_int_eq(write(eio, data, sizeof(data)), (ssize_t)sizeof(data));
    ck_assert_int_eq(write(eof, data, sizeof(data)), (ssize_t)sizeof(data));
    struct vks_buffer vb[5] = {
        {.kind = VKS_BUFFER_FD, .fd = eio},
        {.kind = VKS_BUFFER_FD, .fd = good, .offset = 3, .length = 100000},
        {.kind = VKS_BUFFER_FD, .fd = eof, .offset = 10},
        {.kind = VKS_BUFFER_FD, .fd = eio}, /* the same file and range: a duplicate */
        {.kind = VKS_BUFFER_INLINE, .data = data, .len = 5000},
    };
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.no_cache = true;
    for (int round = 0; round < 2; round++) {
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), vb, 5, &so, &res, &err);
        ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
        ck_assert_int_eq(res.buffers[0].code, -VKS_E_BAD_FD);
        ck_assert_ptr_nonnull(strstr(res.buffers[0].message, "Input/output error"));
        ck_assert_int_eq(res.buffers[2].code, -VKS_E_BAD_FD);
        ck_assert_ptr_nonnull(strstr(res.buffers[2].message, "shrank"));
        ck_assert_int_eq(res.buffers[3].code, -VKS_E_BAD_FD);
        for (size_t i = 0; i < res.n_hits; i++)
            ck_assert(res.hits[i].buffer == 1 || res.hits[i].buffer == 4);
        check_hits(ref, &res, 1, data + 3, 100000, SCAN_ALL);
        check_hits(ref, &res, 4, data, 5000, SCAN_ALL);
        ck_assert_uint_gt(tel_of(&res, "fd_upload_bytes"), 0);
        vks_scan_result_finish(&res);
    }
    expect_ping_ok(&d);
    close(good);
    close(eio);
    close(eof);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* A gated catalog's file by descriptor: the GPU engine's upload threads
 * read it (fd_upload_bytes), the device finds the factor ends
 * (factor_ends, docs/gpu.md "The factor pass") and the hits are
 * refscan's, in every report mode. */
START_TEST(test_fd_gated)
{
    static const struct vks_rule gated[] = {
        {"api", VKS_RULE_REGEX, "apikey[=:][a-z0-9]{20,40}x", 0, NULL},
        {"tok", VKS_RULE_REGEX, "token[^\\n]{0,30}end", 0, "i"},
        {"lit", VKS_RULE_LITERAL, "needle", 0, NULL},
    };
    struct catalog *ref = local_catalog(gated, 3);
    bool any = false;
    for (uint32_t k = 0; k < catalog_nfa_count(ref); k++) {
        struct catalog_nfa g;
        catalog_nfa(ref, k, &g);
        any |= (g.flags & CAT_GF_GATED) != 0;
    }
    ck_assert_msg(any, "the rules give no gated group: the test needs one");
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, gated, 3, false);
    enum { SIZE = (5 << 20) + 321 };
    uint8_t *data = malloc(SIZE);
    ck_assert_ptr_nonnull(data);
    static const char *const plants[] = {"apikey=abcdefghij0123456789x", "TOKEN is 7 end", "needle",
                                         "apikey:", "tOkEn"};
    for (size_t i = 0; i < SIZE; i++)
        data[i] = (uint8_t)("abcdefghijklmnopqrstuvwxyz0123456789 \n"[rnd(38)]);
    for (size_t p = rnd(50); p + 40 < SIZE; p += 100 + rnd(3000)) {
        const char *x = plants[rnd(5)];
        memcpy(data + p, x, strlen(x));
    }
    char path[sizeof(d.dir) + 16];
    snprintf(path, sizeof(path), "%s/gated", d.dir);
    int file = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(file, 0);
    ck_assert_int_eq(write(file, data, SIZE), SIZE);
    struct vks_buffer vb = {.kind = VKS_BUFFER_FD, .fd = file, .offset = 0, .length = SIZE};
    for (int mode = 0; mode < 3; mode++) {
        struct vks_scan_result res = {0};
        enum scan_mode sm = scan_in_mode(c, cat, &vb, 1, mode, &res);
        ck_assert_int_eq(res.buffers[0].code, 0);
        check_hits(ref, &res, 0, data, SIZE, sm);
        if (mode == 0)
            ck_assert_uint_gt(res.n_hits, 500);
        ck_assert_uint_eq(tel_of(&res, "engine"), 0);
        ck_assert_uint_eq(tel_of(&res, "fd_upload_bytes"), SIZE);
        ck_assert_uint_gt(tel_of(&res, "factor_ends"), 500);
        /* the factor pass's parts: each inside its wall time */
        uint64_t fw = tel_of(&res, "factor_wait_ns"), fu = tel_of(&res, "factor_upload_ns");
        uint64_t fs = tel_of(&res, "factor_sort_ns");
        ck_assert_uint_gt(fw, 0);
        ck_assert_uint_le(fu + fw + fs, tel_of(&res, "factor_ns"));
        vks_scan_result_finish(&res);
    }
    close(file);
    free(data);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

START_TEST(test_second_client_shares_catalog)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    static uint8_t data[2000];
    make_haystack(data, sizeof(data));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data)};

    struct vks_client *a = connect_ok(&d);
    struct vks_catalog *ca = load_ok(a, rules, N_RULES, false);
    ck_assert(vks_catalog_rules_sent(ca));
    ck_assert(!vks_catalog_cached(ca));
    struct vks_scan_result ra = {0};
    ck_assert_int_eq(vks_client_scan(a, vks_catalog_fingerprint(ca), &vb, 1, NULL, &ra, NULL), 0);
    ck_assert_uint_gt(tel_of(&ra, "catalog_bytes_uploaded"), 0);

    struct vks_client *b = connect_ok(&d);
    struct vks_catalog *cb = load_ok(b, rules, N_RULES, false);
    ck_assert(!vks_catalog_rules_sent(cb)); /* catalog.has said known */
    ck_assert_mem_eq(vks_catalog_fingerprint(ca), vks_catalog_fingerprint(cb), 32);
    ck_assert_uint_eq(vks_catalog_rule_count(cb), N_RULES - 1);
    struct vks_scan_result rb = {0};
    ck_assert_int_eq(vks_client_scan(b, vks_catalog_fingerprint(cb), &vb, 1, NULL, &rb, NULL), 0);
    ck_assert_uint_eq(tel_of(&rb, "catalog_bytes_uploaded"), 0);
    ck_assert_uint_ge(tel_of(&rb, "catalog_cache_hits"), 1);
    ck_assert_uint_eq(rb.n_hits, ra.n_hits);
    ck_assert_uint_eq(stat_of(b, "catalog_compiles"), 1);
    vks_scan_result_finish(&ra);
    vks_scan_result_finish(&rb);
    vks_catalog_destroy(ca);
    vks_catalog_destroy(cb);
    vks_client_close(a);
    vks_client_close(b);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- pipelining, batching, backpressure ------------------------------- */

/* Says hello with `read_ahead` (libvkscan's promise: one frame's bytes per
 * sendmsg with descriptors) on a raw connection and checks the reply. */
static void raw_hello_read_ahead(int fd)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(&pk, 900, "hello", 2);
    pack_str(&pk, "version");
    msgpack_pack_uint32(&pk, 1);
    pack_str(&pk, "read_ahead");
    msgpack_pack_true(&pk);
    raw_frame(fd, &sb, NULL, 0);
    msgpack_sbuffer_destroy(&sb);
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_uint_eq(rep->id, 900);
    ck_assert_int_eq(rep->error.code, 0);
    proto_reply_destroy(rep);
}

/* Sends `n` scans (ids 1..n) of different buffers back to back on one
 * connection (after a hello with read_ahead when `ahead`), then checks
 * every reply against refscan by id. */
static void pipeline(const struct daemon *d, const uint8_t *fp, const struct catalog *ref, int n,
                     bool ahead)
{
    int fd = raw_connect(d);
    if (ahead)
        raw_hello_read_ahead(fd);
    static uint8_t data[64][800];
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (int i = 0; i < n; i++) {
        make_haystack(data[i], 100 + 10 * (size_t)i);
        pack_scan(&pk, (uint32_t)i + 1, fp, data[i], 100 + 10 * (size_t)i);
        raw_frame(fd, &sb, NULL, 0);
        msgpack_sbuffer_clear(&sb);
    }
    msgpack_sbuffer_destroy(&sb);
    bool seen[65] = {false};
    for (int k = 0; k < n; k++) {
        struct proto_reply *rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->error.code == 0, "scan %u: %s", rep->id, rep->error.msg);
        ck_assert(rep->id >= 1 && rep->id <= (uint32_t)n && !seen[rep->id]);
        seen[rep->id] = true;
        const uint8_t *buf = data[rep->id - 1];
        size_t len = 100 + 10 * (size_t)(rep->id - 1);
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(ref, buf, len, SCAN_ALL, &want), 0);
        ck_assert_uint_eq(rep->u.scan.n_hits, want.n);
        for (size_t h = 0; h < want.n; h++) {
            ck_assert_uint_eq(rep->u.scan.hits[h].rule, want.v[h].rule);
            ck_assert_uint_eq(rep->u.scan.hits[h].end, want.v[h].end);
        }
        scan_hits_finish(&want);
        proto_reply_destroy(rep);
    }
    close(fd);
}

START_TEST(test_pipelined_by_id)
{
    struct daemon d;
    /* A low per-tenant queue limit: the pipeline must pass through
     * backpressure (the daemon stops reading) and still be answered whole. */
    const char *extra[] = {"--tenant-max-requests", "3", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    pipeline(&d, vks_catalog_fingerprint(cat), ref, 24, false);
    ck_assert_uint_gt(stat_of(c, "backpressure"), 0);
    ck_assert_uint_eq(stat_of(c, "scans"), 24);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/*
 * The same pipeline on a connection whose hello turned read-ahead on: the
 * daemon's first read takes many of the 24 frames at once, and while
 * tenant-max-requests 2 stops it reading they wait in the reader, not in
 * the socket, so no poll announces them. Every scan is answered, right.
 * Fails when frames left in read-ahead wait for the socket (raw_reply gives
 * up after 60 s), and when hello does not turn read-ahead on (the count).
 */
START_TEST(test_read_ahead_pipelined)
{
    struct daemon d;
    const char *extra[] = {"--tenant-max-requests", "2", "--read-ahead", "64K", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    uint64_t ahead0 = stat_of(c, "read_ahead");
    ck_assert_uint_ge(ahead0, 1); /* libvkscan's own connection */
    uint64_t bp0 = stat_of(c, "backpressure");
    pipeline(&d, vks_catalog_fingerprint(cat), ref, 24, true);
    ck_assert_uint_eq(stat_of(c, "read_ahead"), ahead0 + 1);
    ck_assert_uint_gt(stat_of(c, "backpressure"), bp0);
    ck_assert_uint_eq(stat_of(c, "scans"), 24);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

struct batch_seen {
    uint64_t ids[64];
    int n;
};

/* Pipelines `n` scans and records the batch ids of the replies. */
static void batch_ids(int fd, const uint8_t *fp, int n, struct batch_seen *out)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    uint8_t data[512];
    make_haystack(data, sizeof(data));
    for (int i = 0; i < n; i++)
        pack_scan(&pk, (uint32_t)i + 1, fp, data, sizeof(data));
    uint8_t *f = malloc(sb.size + 4 * (size_t)n);
    /* One write of n frames: each frame's own length prefix. */
    size_t one = sb.size / (size_t)n, off = 0;
    for (int i = 0; i < n; i++) {
        f[off] = (uint8_t)(one >> 24), f[off + 1] = (uint8_t)(one >> 16);
        f[off + 2] = (uint8_t)(one >> 8), f[off + 3] = (uint8_t)one;
        memcpy(f + off + 4, sb.data + (size_t)i * one, one);
        off += one + 4;
    }
    raw_send(fd, f, off, NULL, 0);
    free(f);
    msgpack_sbuffer_destroy(&sb);
    for (int i = 0; i < n; i++) {
        struct proto_reply *rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->error.code, 0);
        for (uint32_t k = 0; k < rep->u.scan.n_telemetry; k++) {
            if (strcmp(rep->u.scan.telemetry[k].key, "batch_id") == 0)
                out->ids[out->n++] = rep->u.scan.telemetry[k].u;
        }
        proto_reply_destroy(rep);
    }
}

START_TEST(test_clients_share_batches)
{
    struct daemon d;
    /* One batch in flight at a time, and a large scan to keep it busy:
     * meanwhile both clients' small scans queue up behind it. */
    const char *extra[] = {"--inflight-batches", "1", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    int a = raw_connect(&d), b = raw_connect(&d), blocker = raw_connect(&d);
    struct batch_seen sa = {.n = 0}, sb = {.n = 0};
    size_t big_len = 32u << 20;
    uint8_t *big = malloc(big_len);
    memset(big, 'q', big_len);
    msgpack_sbuffer bsb;
    msgpack_sbuffer_init(&bsb);
    msgpack_packer bpk;
    msgpack_packer_init(&bpk, &bsb, msgpack_sbuffer_write);
    pack_scan(&bpk, 99, vks_catalog_fingerprint(cat), big, big_len);
    raw_frame(blocker, &bsb, NULL, 0);
    msgpack_sbuffer_destroy(&bsb);
    free(big);
    pid_t child = fork();
    if (child == 0) {
        struct batch_seen x = {.n = 0};
        batch_ids(b, vks_catalog_fingerprint(cat), 16, &x);
        FILE *f = fopen("/tmp/vkd-batch-ids", "w");
        fwrite(&x, sizeof(x), 1, f);
        fclose(f);
        _exit(0);
    }
    batch_ids(a, vks_catalog_fingerprint(cat), 16, &sa);
    int st;
    waitpid(child, &st, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    FILE *f = fopen("/tmp/vkd-batch-ids", "r");
    ck_assert_int_eq(fread(&sb, sizeof(sb), 1, f), 1);
    fclose(f);
    unlink("/tmp/vkd-batch-ids");
    ck_assert_int_eq(sa.n, 16);
    ck_assert_int_eq(sb.n, 16);
    bool shared = false;
    for (int i = 0; i < sa.n && !shared; i++)
        for (int j = 0; j < sb.n && !shared; j++)
            shared = sa.ids[i] == sb.ids[j];
    ck_assert_msg(shared, "no GPU batch carried scans of both clients");
    struct proto_reply *rep = raw_reply(blocker);
    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->error.code, 0);
    proto_reply_destroy(rep);
    close(blocker);
    ck_assert_uint_lt(stat_of(c, "batches"), stat_of(c, "batched_scans"));
    close(a);
    close(b);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- tenants ---------------------------------------------------------- */

/* In a child running as uid `uid`: what another tenant may and may not do
 * with root's catalog `fp_root`. Returns a bit mask of failed checks. */
static int other_tenant(const struct daemon *d, uid_t uid, const uint8_t *fp_root)
{
    if (setgid(uid) != 0 || setuid(uid) != 0)
        return 1;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 2;
    int fail = 0;
    bool known = true;
    if (vks_client_catalog_has(c, fp_root, &known, NULL) != 0 || known)
        fail |= 4; /* root's catalog is invisible */
    uint8_t data[] = "a needle here";
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data) - 1};
    struct vks_scan_result res = {0};
    if (vks_client_scan(c, fp_root, &vb, 1, NULL, &res, NULL) != -VKS_E_UNKNOWN_CATALOG)
        fail |= 8; /* and unusable */
    bool dropped = true;
    if (vks_client_catalog_drop(c, fp_root, &dropped, NULL) != 0 || dropped)
        fail |= 16; /* and cannot be dropped by it */
    struct vks_catalog *mine = NULL;
    if (vks_client_catalog_load(c, other_rules, 1, NULL, &mine, NULL) != 0)
        fail |= 32;
    /* Loading root's rules itself works (shared underneath): it had to send
     * them, since has() said unknown to this tenant. */
    struct vks_catalog *same = NULL;
    if (vks_client_catalog_load(c, rules, N_RULES, NULL, &same, NULL) != 0 ||
        !vks_catalog_rules_sent(same) || memcmp(vks_catalog_fingerprint(same), fp_root, 32) != 0)
        fail |= 64;
    if (same != NULL && vks_client_scan(c, fp_root, &vb, 1, NULL, &res, NULL) == 0) {
        if (res.n_hits != 1)
            fail |= 128;
        vks_scan_result_finish(&res);
    } else {
        fail |= 128;
    }
    FILE *f = fopen("/tmp/vkd-tenant-fp", "w");
    if (f != NULL && mine != NULL)
        fwrite(vks_catalog_fingerprint(mine), 32, 1, f);
    if (f != NULL)
        fclose(f);
    vks_catalog_destroy(mine);
    vks_catalog_destroy(same);
    vks_client_close(c);
    return fail;
}

/* The GPU engine loads the batch queued next (its descriptors checked)
 * while the upload threads fill the batch before it (docs/daemon.md
 * "Descriptor buffers"): behind a large scan that holds the device,
 * pipelined scans of one sealed memfd each queue up as batches of their
 * own, and a later one is loaded ahead (telemetry loaded_ahead), with the
 * reference scanner's hits in every reply. */
START_TEST(test_next_batch_loaded_ahead)
{
    struct daemon d;
    const char *extra[] = {"--batch-max-buffers", "1", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    enum { N = 6, SIZE = (256 << 10) + 77 };
    uint8_t *data = malloc(SIZE);
    ck_assert_ptr_nonnull(data);
    make_haystack(data, SIZE);
    struct scan_hits want = {0};
    ck_assert_int_eq(refscan_buffer(ref, data, SIZE, SCAN_ALL, &want), 0);
    ck_assert_uint_gt(want.n, 0);
    size_t big_len = 16u << 20;
    uint8_t *big = malloc(big_len);
    ck_assert_ptr_nonnull(big);
    memset(big, 'q', big_len);
    uint32_t ahead = 0;
    for (int round = 0; round < 3 && ahead == 0; round++) {
        int blocker = raw_connect(&d), fd = raw_connect(&d);
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        pack_scan(&pk, 99, fp, big, big_len);
        raw_frame(blocker, &sb, NULL, 0);
        int mfd[N];
        for (int i = 0; i < N; i++) {
            mfd[i] = make_memfd(data, SIZE, true);
            msgpack_sbuffer_clear(&sb);
            pack_head(&pk, (uint32_t)i + 1, "scan", 2);
            pack_str(&pk, "catalog");
            msgpack_pack_bin(&pk, 32);
            msgpack_pack_bin_body(&pk, fp, 32);
            pack_str(&pk, "buffers");
            msgpack_pack_array(&pk, 1);
            msgpack_pack_map(&pk, 1);
            pack_str(&pk, "fd");
            msgpack_pack_uint32(&pk, 0);
            raw_frame(fd, &sb, &mfd[i], 1);
        }
        msgpack_sbuffer_destroy(&sb);
        for (int i = 0; i < N; i++) {
            struct proto_reply *rep = raw_reply(fd);
            ck_assert_ptr_nonnull(rep);
            ck_assert_msg(rep->error.code == 0, "scan %u: %s", rep->id, rep->error.msg);
            const struct proto_scan_reply *r = &rep->u.scan;
            ck_assert_uint_eq(r->n_hits, want.n);
            for (uint32_t k = 0; k < r->n_hits; k++)
                ck_assert_msg(r->hits[k].buffer == 0 && r->hits[k].rule == want.v[k].rule &&
                                  r->hits[k].end == want.v[k].end,
                              "scan %u hit %u: (%u,%llu), refscan (%u,%llu)", rep->id, k,
                              r->hits[k].rule, (unsigned long long)r->hits[k].end, want.v[k].rule,
                              (unsigned long long)want.v[k].end);
            for (uint32_t k = 0; k < r->n_telemetry; k++)
                if (strcmp(r->telemetry[k].key, "loaded_ahead") == 0)
                    ahead += r->telemetry[k].u != 0;
            proto_reply_destroy(rep);
        }
        struct proto_reply *rep = raw_reply(blocker);
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->error.code, 0);
        proto_reply_destroy(rep);
        for (int i = 0; i < N; i++)
            close(mfd[i]);
        close(fd);
        close(blocker);
    }
    ck_assert_msg(ahead > 0, "no batch was loaded while the one before it uploaded");
    free(big);
    free(data);
    scan_hits_finish(&want);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* Batch buffers are made once and kept (telemetry buffers_made_bytes):
 * the first scan of a size makes its frame's buffers, and scans of that
 * size after every frame has been used make none. */
START_TEST(test_buffers_made_once)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    enum { SIZE = 3 << 20, N = 8 };
    uint8_t *data = malloc(SIZE);
    ck_assert_ptr_nonnull(data);
    make_haystack(data, SIZE);
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = SIZE};
    uint64_t made[N];
    for (int i = 0; i < N; i++) {
        struct vks_scan_result res = {0};
        enum scan_mode sm = scan_in_mode(c, cat, &vb, 1, 0, &res);
        check_hits(ref, &res, 0, data, SIZE, sm);
        made[i] = tel_of(&res, "buffers_made_bytes");
        ck_assert_msg(made[i] == 0 || tel_of(&res, "buffers_made_ns") > 0,
                      "scan %d: %llu bytes made in no time", i, (unsigned long long)made[i]);
        vks_scan_result_finish(&res);
    }
    ck_assert_msg(made[0] >= SIZE, "the first scan made %llu bytes of buffers",
                  (unsigned long long)made[0]);
    for (int i = N - 3; i < N; i++)
        ck_assert_msg(made[i] == 0, "scan %d of the same size made %llu bytes of buffers", i,
                      (unsigned long long)made[i]);
    free(data);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

START_TEST(test_tenants_isolated)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_tenants_isolated: needs root to switch uid; skipped\n");
        return;
    }
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    unlink("/tmp/vkd-tenant-fp");
    pid_t child = fork();
    if (child == 0)
        _exit(other_tenant(&d, 65534, vks_catalog_fingerprint(cat)));
    int st;
    waitpid(child, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "other tenant checks failed: mask %d",
                  WEXITSTATUS(st));
    uint8_t fp_other[32];
    FILE *f = fopen("/tmp/vkd-tenant-fp", "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fread(fp_other, 32, 1, f), 1);
    fclose(f);
    unlink("/tmp/vkd-tenant-fp");
    bool known = true;
    ck_assert_int_eq(vks_client_catalog_has(c, fp_other, &known, NULL), 0);
    ck_assert(!known); /* and the other way round */
    /* Root still holds and uses its own. */
    ck_assert_int_eq(vks_client_catalog_has(c, vks_catalog_fingerprint(cat), &known, NULL), 0);
    ck_assert(known);
    ck_assert_uint_eq(stat_of(c, "tenant.catalogs"), 1);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- failures of clients, draining, restarts -------------------------- */

START_TEST(test_killed_client)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    for (int round = 0; round < 2; round++) {
        pid_t child = fork();
        if (child == 0) {
            int fd = raw_connect(&d);
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            msgpack_packer pk;
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            static uint8_t data[4000];
            make_haystack(data, sizeof(data));
            for (uint32_t i = 0; i < 20; i++) {
                pack_scan(&pk, i + 1, fp, data, sizeof(data));
                raw_frame(fd, &sb, NULL, 0);
                msgpack_sbuffer_clear(&sb);
            }
            /* Round 1 also leaves half a frame behind. */
            if (round == 1)
                raw_send(fd, "\0\0\1\0\x82", 5, NULL, 0);
            pause(); /* killed here, with its scans queued or running */
            _exit(0);
        }
        usleep(300000);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    /* The daemon is alive and still serves the first client correctly. */
    ck_assert_int_eq(waitpid(d.pid, NULL, WNOHANG), 0);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t data[1500];
    make_haystack(data, sizeof(data));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data)};
    struct vks_scan_result res = {0};
    ck_assert_int_eq(vks_client_scan(c, fp, &vb, 1, NULL, &res, NULL), 0);
    check_hits(ref, &res, 0, data, sizeof(data), SCAN_ALL);
    vks_scan_result_finish(&res);
    expect_ping_ok(&d);
    /* The dead clients' queued work was dropped, not kept. */
    for (int i = 0; i < 100 && stat_of(c, "queued_scans") > 0; i++)
        usleep(100000);
    ck_assert_uint_eq(stat_of(c, "queued_scans"), 0);
    /* a dead client's connection goes once its running batch is done */
    for (int i = 0; i < 100 && stat_of(c, "connections") > 1; i++)
        usleep(100000);
    ck_assert_uint_eq(stat_of(c, "connections"), 1);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

START_TEST(test_sigterm_drains)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    int fd = raw_connect(&d);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    static uint8_t data[8000];
    make_haystack(data, sizeof(data));
    for (uint32_t i = 0; i < 8; i++) {
        pack_scan(&pk, i + 1, vks_catalog_fingerprint(cat), data, sizeof(data));
        raw_frame(fd, &sb, NULL, 0);
        msgpack_sbuffer_clear(&sb);
    }
    pack_head(&pk, 100, "ping", 0);
    raw_frame(fd, &sb, NULL, 0);
    msgpack_sbuffer_destroy(&sb);
    /* Once the ping is answered every scan before it was read and queued. */
    int scans = 0;
    for (;;) {
        struct proto_reply *rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        bool ping = rep->id == 100;
        scans += !ping;
        ck_assert_int_eq(rep->error.code, 0);
        proto_reply_destroy(rep);
        if (ping)
            break;
    }
    kill(d.pid, SIGTERM);
    for (; scans < 8; scans++) {
        struct proto_reply *rep = raw_reply(fd);
        ck_assert_msg(rep != NULL, "drain lost scan replies: %d of 8", scans);
        ck_assert_msg(rep->error.code == 0, "scan %u after SIGTERM: %s", rep->id, rep->error.msg);
        ck_assert_uint_gt(rep->u.scan.n_hits, 0);
        proto_reply_destroy(rep);
    }
    ck_assert_ptr_null(raw_reply(fd)); /* then the daemon closes */
    close(fd);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    int st;
    ck_assert_int_eq(waitpid(d.pid, &st, 0), d.pid);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 0);
    d.pid = 0;
    ck_assert_int_ne(access(d.sock, F_OK), 0); /* the socket file is gone */
    daemon_stop(&d);
    daemon_clean(&d);
}
END_TEST

/* Flips a byte in the middle of every cached catalog file under `dir`. */
static int corrupt_cached_catalogs(const char *dir)
{
    char cdir[128];
    snprintf(cdir, sizeof(cdir), "%s/state/catalogs", dir);
    DIR *dp = opendir(cdir);
    ck_assert_ptr_nonnull(dp);
    int n = 0;
    for (struct dirent *de; (de = readdir(dp)) != NULL;) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 4, ".cat") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", cdir, de->d_name);
        int fd = open(path, O_RDWR);
        ck_assert_int_ge(fd, 0);
        struct stat sb;
        ck_assert_int_eq(fstat(fd, &sb), 0);
        uint8_t b;
        ck_assert_int_eq(pread(fd, &b, 1, sb.st_size / 2), 1);
        b ^= 0x5a;
        ck_assert_int_eq(pwrite(fd, &b, 1, sb.st_size / 2), 1);
        close(fd);
        n++;
    }
    closedir(dp);
    return n;
}

/* A corrupt disk-cache file is healed: the next load compiles the rules
 * again (no error), scans are exact, the bad file is replaced, and a later
 * restart reads the good one. Before the fix every load failed with 1020
 * until someone deleted the file by hand. */
START_TEST(test_corrupt_disk_cache_heals)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    uint8_t fp[32];
    memcpy(fp, vks_catalog_fingerprint(cat), 32);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    char dir[64];
    snprintf(dir, sizeof(dir), "%s", d.dir);
    ck_assert_int_eq(corrupt_cached_catalogs(dir), 1);

    static uint8_t data[2000];
    make_haystack(data, sizeof(data));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data)};
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    for (int round = 0; round < 2; round++) {
        daemon_start(&d, dir, NULL);
        c = connect_ok(&d);
        cat = load_ok(c, rules, N_RULES, false);
        ck_assert_mem_eq(vks_catalog_fingerprint(cat), fp, 32);
        /* Round 0 finds the bad file and compiles; round 1 reads the file
         * that compile wrote. */
        ck_assert_uint_eq(stat_of(c, "catalog_compiles"), round == 0 ? 1 : 0);
        ck_assert_uint_eq(stat_of(c, "catalog_disk_read_failures"), round == 0 ? 1 : 0);
        struct vks_scan_result res = {0};
        ck_assert_int_eq(vks_client_scan(c, fp, &vb, 1, NULL, &res, NULL), 0);
        check_hits(ref, &res, 0, data, sizeof(data), SCAN_ALL);
        ck_assert_uint_gt(res.n_hits, 0);
        vks_scan_result_finish(&res);
        vks_catalog_destroy(cat);
        vks_client_close(c);
        ck_assert_int_eq(daemon_stop(&d), 0);
    }
    catalog_destroy(ref);
    daemon_clean(&d);
}
END_TEST

START_TEST(test_restart_uses_disk_cache)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    uint8_t fp[32];
    memcpy(fp, vks_catalog_fingerprint(cat), 32);
    vks_catalog_destroy(cat);
    ck_assert_uint_eq(stat_of(c, "catalog_compiles"), 1);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);

    char dir[64];
    snprintf(dir, sizeof(dir), "%s", d.dir);
    daemon_start(&d, dir, NULL);
    c = connect_ok(&d);
    cat = load_ok(c, rules, N_RULES, false);
    ck_assert(!vks_catalog_rules_sent(cat)); /* the tenant still holds it */
    ck_assert_mem_eq(vks_catalog_fingerprint(cat), fp, 32);
    ck_assert_uint_eq(vks_catalog_reject_count(cat), 1); /* rejects were kept too */
    static uint8_t data[2000];
    make_haystack(data, sizeof(data));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data)};
    struct vks_scan_result res = {0};
    ck_assert_int_eq(vks_client_scan(c, fp, &vb, 1, NULL, &res, NULL), 0);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    check_hits(ref, &res, 0, data, sizeof(data), SCAN_ALL);
    vks_scan_result_finish(&res);
    /* Sending the rules again is answered from the cache as well. */
    struct vks_catalog *again = load_ok(c, rules, N_RULES, true);
    ck_assert(vks_catalog_cached(again));
    ck_assert_uint_eq(stat_of(c, "catalog_compiles"), 0);
    ck_assert_uint_eq(stat_of(c, "catalog_disk_hits"), 1);
    vks_catalog_destroy(again);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* Waits (polling stats, not timing anything) until the start's preload
 * ended; returns preload_catalogs. */
static uint64_t wait_preloaded(struct vks_client *c)
{
    for (int i = 0; i < 1200 && stat_of(c, "preload_done") == 0; i++)
        usleep(50000);
    ck_assert_uint_eq(stat_of(c, "preload_done"), 1);
    return stat_of(c, "preload_catalogs");
}

/* One scan of `data` with `fp`: its hits equal the reference, and the
 * telemetry value of `key` is returned. */
static uint64_t scan_checked(struct vks_client *c, const uint8_t *fp, const struct catalog *ref,
                             const uint8_t *data, size_t len, const char *key)
{
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = len};
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = vks_client_scan(c, fp, &vb, 1, NULL, &res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    ck_assert_uint_eq(tel_of(&res, "engine"), 0); /* on the GPU engine (lavapipe) */
    check_hits(ref, &res, 0, data, len, SCAN_ALL);
    uint64_t v = tel_of(&res, key);
    vks_scan_result_finish(&res);
    return v;
}

/*
 * Warm restart (docs/daemon.md): the catalogs used last before a stop are
 * read from the disk cache at the next start and made resident on the GPU
 * engine before any tenant asks, so the first scan uploads nothing; the
 * catalog stays invisible to a tenant that never loaded it. With
 * preload-catalogs 0 the first scan uploads it, as before.
 */
START_TEST(test_restart_preloads)
{
    struct daemon d;
    daemon_start(&d, NULL, NULL);
    struct vks_client *c = connect_ok(&d);
    ck_assert_uint_eq(wait_preloaded(c), 0); /* a fresh state directory: nothing to preload */
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    uint8_t fp[32];
    memcpy(fp, vks_catalog_fingerprint(cat), 32);
    vks_catalog_destroy(cat);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t data[3000];
    make_haystack(data, sizeof(data));
    ck_assert_uint_gt(scan_checked(c, fp, ref, data, sizeof(data), "catalog_bytes_uploaded"), 0);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0); /* writes the catalogs used last */

    char dir[64];
    snprintf(dir, sizeof(dir), "%s", d.dir);
    daemon_start(&d, dir, NULL);
    c = connect_ok(&d);
    ck_assert_uint_eq(wait_preloaded(c), 1);
    ck_assert_uint_eq(stat_of(c, "catalog_disk_hits"), 1);
    ck_assert_uint_eq(stat_of(c, "catalogs_in_memory"), 1);
    ck_assert_uint_gt(stat_of(c, "startup_ns"), 0);
    ck_assert_uint_gt(stat_of(c, "startup_engine_open_ns"), 0);
    /* The first scan finds the catalog on the device: nothing uploaded,
     * read from disk once (by the preload), hits exact. */
    ck_assert_uint_eq(scan_checked(c, fp, ref, data, sizeof(data), "catalog_bytes_uploaded"), 0);
    ck_assert_uint_eq(scan_checked(c, fp, ref, data, sizeof(data), "catalog_cache_hits"), 1);
    ck_assert_uint_eq(stat_of(c, "catalog_disk_hits"), 1);
    if (geteuid() == 0) { /* preloaded is not loaded: another uid still cannot see it */
        pid_t child = fork();
        if (child == 0)
            _exit(other_tenant(&d, 65534, fp));
        int st;
        waitpid(child, &st, 0);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "other tenant checks failed: mask %d",
                      WEXITSTATUS(st));
        unlink("/tmp/vkd-tenant-fp");
    }
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);

    const char *off[] = {"--preload-catalogs", "0", NULL};
    daemon_start(&d, dir, off);
    c = connect_ok(&d);
    ck_assert_uint_eq(wait_preloaded(c), 0);
    ck_assert_uint_eq(stat_of(c, "catalogs_in_memory"), 0);
    ck_assert_uint_gt(scan_checked(c, fp, ref, data, sizeof(data), "catalog_bytes_uploaded"), 0);
    catalog_destroy(ref);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* The catalogs used last are written while the daemon runs
 * (recent-save-ms), not only at a clean stop: a daemon killed with SIGKILL
 * still preloads the catalog it used; with recent-save-ms 0 it does not
 * (the list is then written at a clean stop only). */
START_TEST(test_recent_saved_before_a_kill)
{
    for (int save = 1; save >= 0; save--) {
        struct daemon d;
        const char *extra[] = {"--recent-save-ms", save ? "100" : "0", NULL};
        daemon_start(&d, NULL, extra);
        char recent[200];
        snprintf(recent, sizeof(recent), "%s/catalogs/recent", d.state);
        struct stat sb;
        /* three save periods with no catalog used: no list is written (an
         * empty one would stand in for the last run's list) */
        usleep(300000);
        ck_assert_msg(stat(recent, &sb) != 0, "%s written before any catalog was used", recent);
        struct vks_client *c = connect_ok(&d);
        struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
        uint8_t fp[32];
        memcpy(fp, vks_catalog_fingerprint(cat), 32);
        vks_catalog_destroy(cat);
        struct catalog *ref = local_catalog(rules, N_RULES - 1);
        static uint8_t data[3000];
        make_haystack(data, sizeof(data));
        scan_checked(c, fp, ref, data, sizeof(data), "catalog_bytes_uploaded");
        vks_client_close(c);
        /* up to 10 s for a list that names the catalog: the daemon writes
         * no list before one changes (an empty file here was the cause of
         * two fresh-clone failures under ASan) */
        for (int i = 0; i < 500 && (stat(recent, &sb) != 0 || sb.st_size == 0); i++)
            usleep(20000);
        if (save)
            ck_assert_msg(stat(recent, &sb) == 0 && sb.st_size > 0, "%s was not written", recent);
        else
            usleep(300000); /* what a sweep would have taken */
        kill(d.pid, SIGKILL);
        waitpid(d.pid, NULL, 0);
        d.pid = 0;
        if (d.notify_fd > 0)
            close(d.notify_fd);
        d.notify_fd = 0;
        char dir[64];
        snprintf(dir, sizeof(dir), "%s", d.dir);
        daemon_start(&d, dir, NULL);
        c = connect_ok(&d);
        ck_assert_uint_eq(wait_preloaded(c), save ? 1 : 0);
        ck_assert_uint_eq(scan_checked(c, fp, ref, data, sizeof(data), "catalog_bytes_uploaded") ==
                              0,
                          save ? 1 : 0);
        catalog_destroy(ref);
        vks_client_close(c);
        ck_assert_int_eq(daemon_stop(&d), 0);
        daemon_clean(&d);
    }
}
END_TEST

/* ---- bad input -------------------------------------------------------- */

START_TEST(test_bad_input)
{
    struct daemon d;
    const char *extra[] = {"--max-buffers", "4", "--max-frame", "1M", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int fd = raw_connect(&d);

    /* Unknown op: answered with its id; the same connection goes on. */
    pack_head(&pk, 7, "frobnicate", 0);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 7, VKS_E_UNKNOWN_OP);
    /* Wrong msgpack types: id as a string, a catalog that is a number, a
     * frame that is an array. */
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "id");
    pack_str(&pk, "x");
    pack_str(&pk, "op");
    pack_str(&pk, "ping");
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 0, VKS_E_BAD_TYPE);
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 8, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_uint32(&pk, 5);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 0);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 8, VKS_E_BAD_TYPE);
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, 1);
    msgpack_pack_uint32(&pk, 2);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 0, VKS_E_BAD_TYPE);
    /* A body cut short inside its frame. */
    raw_send(fd, "\0\0\0\3\x82\xa2i", 7, NULL, 0);
    expect_error(fd, 0, VKS_E_BAD_FRAME);
    /* A fingerprint nobody loaded. */
    uint8_t nofp[32];
    memset(nofp, 0x5a, sizeof(nofp));
    msgpack_sbuffer_clear(&sb);
    pack_scan(&pk, 9, nofp, "abc", 3);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 9, VKS_E_UNKNOWN_CATALOG);
    /* Descriptors: an index past the ones sent, and one with a ping. */
    int mfd = make_memfd((const uint8_t *)"needle", 6, false);
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 10, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "fd");
    msgpack_pack_uint32(&pk, 1);
    raw_frame(fd, &sb, &mfd, 1);
    expect_error(fd, 10, VKS_E_BAD_FD);
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 11, "ping", 0);
    raw_frame(fd, &sb, &mfd, 1);
    expect_error(fd, 11, VKS_E_BAD_FD);
    close(mfd);
    /* Too many buffers (the daemon runs with --max-buffers 4). */
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 12, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 5);
    for (int i = 0; i < 5; i++) {
        msgpack_pack_map(&pk, 1);
        pack_str(&pk, "data");
        msgpack_pack_bin(&pk, 1);
        msgpack_pack_bin_body(&pk, "x", 1);
    }
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 12, VKS_E_TOO_MANY_BUFFERS);
    /* After all that, this connection still works. */
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 13, "ping", 0);
    raw_frame(fd, &sb, NULL, 0);
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->error.code, 0);
    ck_assert_uint_eq(rep->id, 13);
    proto_reply_destroy(rep);
    close(fd);

    /* An oversize frame: error with id 0, then the connection is closed. */
    fd = raw_connect(&d);
    raw_send(fd, "\0\x20\0\0", 4, NULL, 0);
    expect_error(fd, 0, VKS_E_FRAME_TOO_LARGE);
    ck_assert_ptr_null(raw_reply(fd));
    close(fd);
    expect_ping_ok(&d);
    /* A stream that ends inside a frame (the client shut down writing). */
    fd = raw_connect(&d);
    raw_send(fd, "\0\0\0\x64\x82\xa2id\x01", 9, NULL, 0);
    shutdown(fd, SHUT_WR);
    expect_error(fd, 0, VKS_E_BAD_FRAME);
    ck_assert_ptr_null(raw_reply(fd));
    close(fd);
    expect_ping_ok(&d);

    ck_assert_uint_ge(stat_of(c, "errors"), 10);
    msgpack_sbuffer_destroy(&sb);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- every error code (issue 8): the documented reply, then exact results --- */

/* A raw scan of `data` on `fd` must give refscan's number of hits. */
static void expect_raw_scan_ok(int fd, uint32_t id, const uint8_t *fp, const struct catalog *ref,
                               const char *data)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_scan(&pk, id, fp, data, strlen(data));
    raw_frame(fd, &sb, NULL, 0);
    msgpack_sbuffer_destroy(&sb);
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_msg(rep->error.code == 0, "scan after errors: %d %s", rep->error.code,
                  rep->error.msg);
    ck_assert_uint_eq(rep->id, id);
    struct scan_hits want = {0};
    ck_assert_int_eq(refscan_buffer(ref, (const uint8_t *)data, strlen(data), SCAN_ALL, &want), 0);
    ck_assert_uint_gt(want.n, 0);
    ck_assert_uint_eq(rep->u.scan.n_hits, want.n);
    for (uint32_t i = 0; i < rep->u.scan.n_hits; i++) {
        ck_assert_uint_eq(rep->u.scan.hits[i].rule, want.v[i].rule);
        ck_assert_uint_eq(rep->u.scan.hits[i].end, want.v[i].end);
    }
    scan_hits_finish(&want);
    proto_reply_destroy(rep);
}

/*
 * The request errors no other daemon test sends: MISSING_FIELD, BAD_VALUE,
 * DEPTH, LIMIT (max_states over max-states), VERSION, TOO_MANY_RULES
 * (max-rules), TOO_MANY_FDS (over 64 descriptors with one frame) and RULES
 * (a rule set the compiler refuses as a whole: max_states below 16). Each
 * is answered with its code, its id and a message, the connection goes on,
 * and a scan after them all gives exact hits.
 */
START_TEST(test_error_codes)
{
    struct daemon d;
    const char *extra[] = {"--max-rules", "3", "--max-states", "4096", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, 3, false);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    struct catalog *ref = local_catalog(rules, 3);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int fd = raw_connect(&d);

    /* MISSING_FIELD: a scan without its catalog. */
    pack_head(&pk, 20, "scan", 1);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 0);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 20, VKS_E_MISSING_FIELD);
    /* BAD_VALUE: a report mode that does not exist. */
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 21, "scan", 3);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 0);
    pack_str(&pk, "mode");
    pack_str(&pk, "sometimes");
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 21, VKS_E_BAD_VALUE);
    /* DEPTH: arrays nested past max_depth (16) in a ping. */
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 22, "ping", 1);
    pack_str(&pk, "deep");
    for (int i = 0; i < 40; i++)
        msgpack_pack_array(&pk, i < 39 ? 1 : 0);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 22, VKS_E_DEPTH);
    /* VERSION: a hello that speaks only a future version. */
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 23, "hello", 2);
    pack_str(&pk, "version");
    msgpack_pack_uint32(&pk, 999);
    pack_str(&pk, "min_version");
    msgpack_pack_uint32(&pk, 999);
    raw_frame(fd, &sb, NULL, 0);
    expect_error(fd, 23, VKS_E_VERSION);
    /* catalog.load: four rules over --max-rules 3; max_states over the
     * daemon's ceiling (LIMIT); max_states 8, which the compiler refuses for
     * the whole set (RULES). */
    for (int k = 0; k < 3; k++) {
        static const uint32_t n_rules[3] = {4, 1, 1}, states[3] = {0, 5000, 8};
        static const int want[3] = {VKS_E_TOO_MANY_RULES, VKS_E_LIMIT, VKS_E_RULES};
        msgpack_sbuffer_clear(&sb);
        pack_head(&pk, 24 + (uint32_t)k, "catalog.load", states[k] ? 2 : 1);
        pack_str(&pk, "rules");
        msgpack_pack_array(&pk, n_rules[k]);
        for (uint32_t i = 0; i < n_rules[k]; i++) {
            msgpack_pack_map(&pk, 3);
            pack_str(&pk, "id");
            pack_str(&pk, rules[i].id);
            pack_str(&pk, "kind");
            pack_str(&pk, "literal");
            pack_str(&pk, "pattern");
            pack_str(&pk, "needle");
        }
        if (states[k]) {
            pack_str(&pk, "max_states");
            msgpack_pack_uint32(&pk, states[k]);
        }
        raw_frame(fd, &sb, NULL, 0);
        expect_error(fd, 24 + (uint32_t)k, want[k]);
    }
    /* TOO_MANY_FDS: 65 descriptors with one scan (the limit is 64). */
    int fds[65];
    for (int i = 0; i < 65; i++)
        fds[i] = make_memfd((const uint8_t *)"needle", 6, false);
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 27, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "fd");
    msgpack_pack_uint32(&pk, 0);
    raw_frame(fd, &sb, fds, 65);
    expect_error(fd, 27, VKS_E_TOO_MANY_FDS);
    for (int i = 0; i < 65; i++)
        close(fds[i]);
    /* The same connection, and the library's, still scan exactly. */
    expect_raw_scan_ok(fd, 28, fp, ref, "xx needle ab12c HELLO ab9c");
    close(fd);
    static uint8_t buf[4000];
    make_haystack(buf, sizeof(buf));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = sizeof(buf)};
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_scan(c, fp, &vb, 1, NULL, &res, &err), 0);
    check_hits(ref, &res, 0, buf, sizeof(buf), SCAN_ALL);
    vks_scan_result_finish(&res);
    /* And the load that failed for its state budget works with a good one. */
    struct vks_load_options lo = {.max_states = 64, .always_send = true};
    struct vks_catalog *small = NULL;
    ck_assert_int_eq(vks_client_catalog_load(c, rules, 2, &lo, &small, &err), 0);
    vks_catalog_destroy(small);
    msgpack_sbuffer_destroy(&sb);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/*
 * max-connections: past it a connection is closed at once, without a reply
 * (docs/daemon.md), and counted in connections_refused; once one closes, a
 * new client gets in and scans exactly.
 */
START_TEST(test_connection_cap)
{
    struct daemon d;
    const char *extra[] = {"--max-connections", "3", NULL};
    daemon_start(&d, NULL, extra);
    int fds[3];
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (int i = 0; i < 3; i++) {
        fds[i] = raw_connect(&d);
        msgpack_sbuffer_clear(&sb);
        pack_head(&pk, 30 + (uint32_t)i, "ping", 0);
        raw_frame(fds[i], &sb, NULL, 0);
        struct proto_reply *rep = raw_reply(fds[i]); /* surely accepted */
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->error.code, 0);
        proto_reply_destroy(rep);
    }
    msgpack_sbuffer_destroy(&sb);
    int over = raw_connect(&d);
    ck_assert_ptr_null(raw_reply(over)); /* closed, no reply */
    close(over);
    close(fds[0]);
    struct vks_client *c = NULL;
    for (int i = 0; i < 100 && vks_client_connect(d.sock, NULL, &c, NULL) != 0; i++)
        usleep(50000); /* until the daemon has seen the close */
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_ge(stat_of(c, "connections_refused"), 1);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t buf[3000];
    make_haystack(buf, sizeof(buf));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = sizeof(buf)};
    struct vks_scan_result res = {0};
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, NULL, &res, NULL), 0);
    check_hits(ref, &res, 0, buf, sizeof(buf), SCAN_ALL);
    vks_scan_result_finish(&res);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    close(fds[1]);
    close(fds[2]);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/*
 * TIMEOUT for a scan's own timeout_ms: with one batch in flight holding one
 * buffer (--inflight-batches 1, --batch-max-buffers 1) and one CPU thread,
 * a scan of 32 MiB through a bit-NFA rule takes far longer than 5 ms, so
 * the scan pipelined behind it with timeout_ms 5 is still queued when its
 * deadline passes: TIMEOUT with its id and a message. The long scan and a
 * scan after the timeout give exact hits.
 */
START_TEST(test_scan_timeout)
{
    static const struct vks_rule slow_rules[] = {
        {"lit", VKS_RULE_LITERAL, "needle", 0, NULL},
        {"nfa", VKS_RULE_REGEX, "q[a-z]{70}z", 0, NULL},
    };
    struct daemon d;
    const char *extra[] = {
        "--engine", "cpu", "--cpu-threads", "1", "--inflight-batches", "1", "--batch-max-buffers",
        "1",        NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, slow_rules, 2, false);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    struct catalog *ref = local_catalog(slow_rules, 2);
    size_t big_len = 32u << 20;
    uint8_t *big = malloc(big_len);
    ck_assert_ptr_nonnull(big);
    for (size_t i = 0; i < big_len; i++)
        big[i] = (uint8_t)('a' + i % 23);
    memcpy(big + big_len / 2, "needle", 6);
    int mfd = make_memfd(big, big_len, true);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(&pk, 40, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "fd");
    msgpack_pack_uint32(&pk, 0);
    int fd = raw_connect(&d);
    raw_frame(fd, &sb, &mfd, 1);
    close(mfd);
    msgpack_sbuffer_clear(&sb);
    pack_head(&pk, 41, "scan", 3);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "data");
    msgpack_pack_bin(&pk, 6);
    msgpack_pack_bin_body(&pk, "needle", 6);
    pack_str(&pk, "timeout_ms");
    msgpack_pack_uint32(&pk, 5);
    raw_frame(fd, &sb, NULL, 0);
    msgpack_sbuffer_destroy(&sb);
    /* Replies come in any order (the timeout is normally first). */
    bool timed_out = false, long_ok = false;
    for (int k = 0; k < 2; k++) {
        struct proto_reply *rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        if (rep->id == 41) {
            ck_assert_msg(rep->error.code == -VKS_E_TIMEOUT,
                          "timeout_ms 5: %d (%s), expected TIMEOUT", rep->error.code,
                          rep->error.msg);
            ck_assert(rep->error.msg[0] != '\0');
            timed_out = true;
        } else {
            ck_assert_uint_eq(rep->id, 40);
            ck_assert_msg(rep->error.code == 0, "long scan: %d %s", rep->error.code,
                          rep->error.msg);
            struct scan_hits want = {0};
            ck_assert_int_eq(refscan_buffer(ref, big, big_len, SCAN_ALL, &want), 0);
            ck_assert_uint_eq(rep->u.scan.n_hits, want.n);
            scan_hits_finish(&want);
            long_ok = true;
        }
        proto_reply_destroy(rep);
    }
    ck_assert(timed_out && long_ok);
    close(fd);
    free(big);
    static uint8_t buf[3000];
    make_haystack(buf, sizeof(buf));
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = sizeof(buf)};
    struct vks_scan_options so = {.struct_size = sizeof(so), .timeout_ms = 60000};
    struct vks_scan_result res = {0};
    ck_assert_int_eq(vks_client_scan(c, fp, &vb, 1, &so, &res, NULL), 0);
    check_hits(ref, &res, 0, buf, sizeof(buf), SCAN_ALL);
    vks_scan_result_finish(&res);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- device failures in a running daemon (tests/fault/vkfault) ---------- */

/* Arms the vkfault interposer preloaded into `d` (vkfault.h: VKFAULT_CTL):
 * the spec is written whole (a temporary file renamed over). */
static void vkfault_ctl(const struct daemon *d, const char *spec)
{
    char tmp[200], path[200];
    snprintf(tmp, sizeof(tmp), "%s/vkfault.ctl.tmp", d->dir);
    snprintf(path, sizeof(path), "%s/vkfault.ctl", d->dir);
    FILE *f = fopen(tmp, "w");
    ck_assert_ptr_nonnull(f);
    fputs(spec, f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(rename(tmp, path), 0);
}

/* Whether the daemon's interposer took the last spec (it removes the file). */
static bool vkfault_taken(const struct daemon *d)
{
    char path[200];
    snprintf(path, sizeof(path), "%s/vkfault.ctl", d->dir);
    return access(path, F_OK) != 0;
}

/* Scans `buf` on `c`; returns rc, fills *res (finish it), checks nothing. */
static int scan_buf(struct vks_client *c, const uint8_t *fp, const uint8_t *buf, size_t len,
                    struct vks_scan_result *res, struct vks_error *err)
{
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = buf, .len = len};
    memset(err, 0, sizeof(*err));
    return vks_client_scan(c, fp, &vb, 1, NULL, res, err);
}

/* An exact scan on the GPU engine (engine 0), not re-run on the CPU. */
static void expect_gpu_scan_ok(struct vks_client *c, const uint8_t *fp, const struct catalog *ref,
                               const uint8_t *buf, size_t len)
{
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = scan_buf(c, fp, buf, len, &res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    check_hits(ref, &res, 0, buf, len, SCAN_ALL);
    ck_assert_uint_eq(tel_of(&res, "engine"), 0);
    ck_assert_uint_eq(tel_of(&res, "cpu_retry"), 0);
    vks_scan_result_finish(&res);
}

/*
 * A scan with more hits than one reply can carry (max-unsent-bytes 1 MiB
 * here; 64 MiB, libvkscan's frame limit, at most) is cut as at max-hits:
 * the reply is under the limit, its buffer says truncated, the hits it
 * holds are the first ones, and the connection stays. So is a stream
 * write's. Before, the daemon
 * closed the connection over max-unsent-bytes and the client retried the
 * scan until it gave up.
 */
START_TEST(test_reply_room)
{
    struct daemon d;
    daemon_start(&d, NULL,
                 (const char *const[]){"--engine", "cpu", "--max-hits", "8000000",
                                       "--max-unsent-bytes", "1M", NULL});
    struct vks_client *c = connect_ok(&d);
    static const struct vks_rule one[] = {{"a", VKS_RULE_LITERAL, "a", 0, NULL}};
    struct vks_catalog *cat = load_ok(c, one, 1, false);
    const size_t len = 600000; /* 600,000 hits of 4 to 8 bytes */
    uint8_t *buf = malloc(len);
    ck_assert_ptr_nonnull(buf);
    memset(buf, 'a', len);
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = scan_buf(c, vks_catalog_fingerprint(cat), buf, len, &res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    ck_assert(res.buffers[0].truncated);
    ck_assert_uint_gt(res.n_hits, 100000);
    ck_assert_uint_lt(res.n_hits, len);
    for (size_t i = 0; i < res.n_hits; i++)
        ck_assert_uint_eq(res.hits[i].end, i + 1);
    vks_scan_result_finish(&res);
    ck_assert_int_eq(vks_client_ping(c, &err), 0);
    /* a stream write's reply the same way (at 25 bytes a hit, 512 KiB) */
    struct vks_stream *st = NULL;
    ck_assert_int_eq(vks_stream_open(c, vks_catalog_fingerprint(cat), NULL, &st, &err), 0);
    rc = vks_stream_write(st, buf, len, &res, &err);
    ck_assert_msg(rc == 0, "stream write: %d %s", rc, err.msg);
    ck_assert(res.buffers[0].truncated);
    ck_assert_uint_eq(res.n_hits, (512u << 10) / 25);
    for (size_t i = 0; i < res.n_hits; i++)
        ck_assert_uint_eq(res.hits[i].end, i + 1);
    vks_scan_result_finish(&res);
    ck_assert_int_eq(vks_stream_close(st, &res, &err), 0);
    vks_scan_result_finish(&res);
    ck_assert_uint_eq(stat_of(c, "output_limit_closes"), 0);
    free(buf);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* A daemon with the vkfault interposer preloaded, a client, the `rules`
 * catalog (and its local copy) and a haystack the GPU engine has scanned
 * exactly once. */
#define FAULT_BUF 3000u
struct fault_fixture {
    struct daemon d;
    struct vks_client *c;
    struct vks_catalog *cat;
    const uint8_t *fp; /* cat's */
    struct catalog *ref;
    uint8_t buf[FAULT_BUF];
};

static void fault_fixture_start(struct fault_fixture *f)
{
    vkfault_so = getenv("VKFAULT_SO");
    ck_assert_msg(vkfault_so != NULL, "VKFAULT_SO is not set: run through meson test");
    daemon_start(&f->d, NULL, NULL);
    vkfault_so = NULL;
    f->c = connect_ok(&f->d);
    f->cat = load_ok(f->c, rules, N_RULES, false);
    f->fp = vks_catalog_fingerprint(f->cat);
    f->ref = local_catalog(rules, N_RULES - 1);
    make_haystack(f->buf, FAULT_BUF);
    expect_gpu_scan_ok(f->c, f->fp, f->ref, f->buf, FAULT_BUF);
}

static void fault_fixture_stop(struct fault_fixture *f)
{
    catalog_destroy(f->ref);
    vks_catalog_destroy(f->cat);
    vks_client_close(f->c);
    ck_assert_int_eq(daemon_stop(&f->d), 0);
    daemon_clean(&f->d);
}

/*
 * The GPU engine of a running vkscand (lavapipe) fails on command:
 * - a lost device (VK_ERROR_DEVICE_LOST at the fence wait) and a fence
 *   timeout: the batch is re-run on the CPU engine with exact hits
 *   (telemetry cpu_retry = ENODEV / ETIMEDOUT), the engine is re-created, and
 *   the next scan runs on the GPU again, exact;
 * - a failed submit (out of device memory): the scan gets DEVICE (1018) with
 *   a message, and the next scan runs on the GPU, exact.
 */
START_TEST(test_device_faults)
{
    struct fault_fixture f;
    fault_fixture_start(&f);

    static const char *const specs[2] = {"lost=1", "wait=1"};
    static const uint64_t why[2] = {ENODEV, ETIMEDOUT};
    for (int k = 0; k < 2; k++) {
        vkfault_ctl(&f.d, specs[k]);
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        int rc = scan_buf(f.c, f.fp, f.buf, FAULT_BUF, &res, &err);
        ck_assert_msg(vkfault_taken(&f.d), "%s: the preloaded interposer never read it", specs[k]);
        ck_assert_msg(rc == 0, "%s: %d %s", specs[k], rc, err.msg);
        check_hits(f.ref, &res, 0, f.buf, FAULT_BUF, SCAN_ALL);
        ck_assert_uint_eq(tel_of(&res, "cpu_retry"), why[k]);
        vks_scan_result_finish(&res);
        expect_gpu_scan_ok(f.c, f.fp, f.ref, f.buf, FAULT_BUF);
    }
    ck_assert_uint_ge(stat_of(f.c, "engine.0.cpu_retries"), 2);

    vkfault_ctl(&f.d, "submit=1");
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = scan_buf(f.c, f.fp, f.buf, FAULT_BUF, &res, &err);
    ck_assert(vkfault_taken(&f.d));
    ck_assert_msg(rc == -VKS_E_DEVICE, "failed submit: %d %s, expected DEVICE", rc, err.msg);
    ck_assert(err.msg[0] != '\0');
    vks_scan_result_finish(&res);
    expect_gpu_scan_ok(f.c, f.fp, f.ref, f.buf, FAULT_BUF);

    fault_fixture_stop(&f);
}
END_TEST

/*
 * A kernel the driver cannot build (an H100 answers VK_ERROR_UNKNOWN for a
 * bit-NFA kernel of MAX_WORDS 2048; vkfault's `pipeline` here) is not a
 * device failure: the scan that needs it runs on the CPU engine with exact
 * hits (cpu_retry ENOTSUP), the GPU engine is not re-created (before, each
 * such batch re-created it, for every tenant), the refusal is remembered
 * (the next scan of that catalog goes to the CPU engine without a compile
 * that lavapipe would now pass), and other catalogs still scan on the GPU.
 */
START_TEST(test_pipeline_refused)
{
    struct fault_fixture f;
    fault_fixture_start(&f);

    static const struct vks_rule wide_rules[] = {
        {"wide", VKS_RULE_REGEX, "abc[0-9a-f]{1500}xyz", 0, NULL},
        {"tail", VKS_RULE_LITERAL, "xyz", 0, NULL},
    };
    struct vks_catalog *wide = load_ok(f.c, wide_rules, 2, false);
    struct catalog *wide_ref = local_catalog(wide_rules, 2);
    static uint8_t hay[4000];
    memset(hay, '7', sizeof(hay));
    memcpy(hay + 100, "abc", 3);
    memcpy(hay + 1603, "xyz", 3);
    memcpy(hay + 3000, "xyz", 3);
    vkfault_ctl(&f.d, "pipeline=1");
    for (int k = 0; k < 2; k++) {
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        int rc = scan_buf(f.c, vks_catalog_fingerprint(wide), hay, sizeof(hay), &res, &err);
        ck_assert(vkfault_taken(&f.d));
        ck_assert_msg(rc == 0, "scan %d: %d %s", k, rc, err.msg);
        check_hits(wide_ref, &res, 0, hay, sizeof(hay), SCAN_ALL);
        ck_assert_uint_eq(res.n_hits, 3);
        ck_assert_uint_eq(tel_of(&res, "cpu_retry"), ENOTSUP);
        vks_scan_result_finish(&res);
    }
    ck_assert_uint_eq(stat_of(f.c, "engine.0.reopens"), 0);
    ck_assert_uint_ge(stat_of(f.c, "engine.0.cpu_retries"), 2);
    expect_gpu_scan_ok(f.c, f.fp, f.ref, f.buf, FAULT_BUF);

    catalog_destroy(wide_ref);
    vks_catalog_destroy(wide);
    fault_fixture_stop(&f);
}
END_TEST

/*
 * Under --engine auto vkscand takes connections before its GPU engine has
 * started (docs/daemon.md "Warm restart"). With the engine held in
 * vkCreateInstance (vkfault's hold): a catalog loads and a scan is answered
 * by the CPU engine with exact hits, stats say engine_starting and when
 * accepting began, and READY=1 has not been sent. Once the engine goes on,
 * READY=1 comes and the next scan runs on the GPU engine (lavapipe named by
 * --device 0; cpu-max-work 0 sends every batch there). Fails when accepting
 * waits for the GPU engine again (the first request times out) or when a
 * batch is placed on a GPU engine that has not started.
 */
START_TEST(test_serves_before_gpu_starts)
{
    vkfault_so = getenv("VKFAULT_SO");
    ck_assert_msg(vkfault_so != NULL, "VKFAULT_SO is not set: run through meson test");
    vkfault_hold = true;
    struct daemon d;
    daemon_spawn(
        &d, NULL,
        (const char *const[]){"--engine", "auto", "--device", "0", "--cpu-max-work", "0", NULL});
    vkfault_so = NULL;
    vkfault_hold = false;
    for (int i = 0; i < 12000 && access(d.sock, F_OK) != 0; i++)
        usleep(10000);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t buf[5000];
    make_haystack(buf, sizeof(buf));
    struct vks_scan_result res = {0};
    struct vks_error err = {0};
    int rc = scan_buf(c, fp, buf, sizeof(buf), &res, &err);
    ck_assert_msg(rc == 0, "scan while the GPU engine starts: %d %s", rc, err.msg);
    check_hits(ref, &res, 0, buf, sizeof(buf), SCAN_ALL);
    ck_assert_uint_eq(tel_of(&res, "engine"), 1); /* the CPU engine */
    vks_scan_result_finish(&res);
    ck_assert_uint_eq(stat_of(c, "engine_starting"), 1);
    ck_assert_uint_gt(stat_of(c, "startup_accept_ns"), 0);
    ck_assert_uint_eq(stat_of(c, "startup_ns"), 0); /* not ready */
    ck_assert_msg(!wait_ready(&d, 200), "READY=1 came while the GPU engine was held");

    char hold[sizeof(d.dir) + 16];
    snprintf(hold, sizeof(hold), "%s/vkfault.hold", d.dir);
    int fd = open(hold, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_msg(wait_ready(&d, 120000), "vkscand did not become ready once the engine went on");
    ck_assert_uint_eq(stat_of(c, "engine_starting"), 0);
    ck_assert_uint_ge(stat_of(c, "startup_ns"), stat_of(c, "startup_accept_ns"));
    expect_gpu_scan_ok(c, fp, ref, buf, sizeof(buf));

    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- PROTOCOL: a peer that breaks the protocol (client side) ------------ */

/* Reads one request frame from `fd` and decodes it (the scripted peer). */
static struct proto_request *peer_read(int fd)
{
    struct proto_reader *r = NULL;
    if (proto_reader_create(NULL, &r) < 0)
        _exit(3);
    struct proto_request *req = NULL;
    for (;;) {
        int rc = proto_reader_recv(r, fd, NULL);
        if (rc == PROTO_RECV_FRAME) {
            struct proto_frame f;
            proto_reader_take(r, &f);
            if (proto_request_decode(&f, NULL, &req, NULL, NULL) < 0)
                _exit(4);
            break;
        }
        if (rc < 0 && rc != -EAGAIN)
            _exit(5);
        if (rc == PROTO_RECV_EOF)
            _exit(6);
    }
    proto_reader_destroy(r);
    return req;
}

/* Answers `req` properly: hello with this protocol version, ping empty. */
static void peer_answer(int fd, const struct proto_request *req)
{
    struct proto_reply rep = {.id = req->id, .op = req->op};
    if (req->op == PROTO_OP_HELLO) {
        rep.u.hello.version = PROTO_VERSION;
        rep.u.hello.min_version = PROTO_VERSION_MIN;
        rep.u.hello.server = "scripted peer";
        proto_limits_default(&rep.u.hello.limits);
    }
    struct proto_buf b;
    proto_buf_init(&b);
    if (proto_reply_encode(&b, &rep, NULL) < 0 ||
        proto_send(fd, b.data, b.len, NULL, 0, 5000, NULL) < 0)
        _exit(7);
    proto_buf_finish(&b);
}

/* The peer: on its first connection it answers hello, then the next
 * request with a frame that is not msgpack; on its second it answers hello
 * and ping properly. */
static void scripted_peer(int lfd)
{
    for (int conn = 0; conn < 2; conn++) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            _exit(2);
        struct proto_request *req = peer_read(fd);
        peer_answer(fd, req);
        proto_request_destroy(req);
        req = peer_read(fd);
        if (conn == 0) {
            static const uint8_t bad[] = {0, 0, 0, 1, 0xc1}; /* 0xc1: never used */
            if (proto_send(fd, bad, sizeof(bad), NULL, 0, 5000, NULL) < 0)
                _exit(8);
        } else {
            peer_answer(fd, req);
        }
        proto_request_destroy(req);
        if (conn == 0) { /* the client drops this connection */
            char c;
            while (read(fd, &c, 1) > 0)
                ;
        }
        close(fd);
    }
    _exit(0);
}

/*
 * PROTOCOL (1021, client only): a reply that is not msgpack makes the call
 * fail with PROTOCOL and a message, the client drops that connection, and
 * its next call reconnects and succeeds.
 */
START_TEST(test_protocol_error)
{
    char dir[] = "/tmp/vkd-peer-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/peer.sock", dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        die_with_parent();
        scripted_peer(lfd);
    }
    close(lfd);
    struct vks_client_options opt;
    vks_client_options_init(&opt);
    opt.io_timeout_ms = 20000;
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(sa.sun_path, &opt, &c, &err), 0);
    int rc = vks_client_ping(c, &err);
    ck_assert_msg(rc == -VKS_E_PROTOCOL, "bad reply: %d %s, expected PROTOCOL", rc, err.msg);
    ck_assert_ptr_nonnull(strstr(err.msg, "malformed"));
    memset(&err, 0, sizeof(err));
    rc = vks_client_ping(c, &err);
    ck_assert_msg(rc == 0, "ping after PROTOCOL: %d %s", rc, err.msg);
    vks_client_close(c);
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripted peer: status %d", st);
    unlink(sa.sun_path);
    rmdir(dir);
}
END_TEST

/* ---- operations: reload, socket activation ---------------------------- */

START_TEST(test_sighup_reloads)
{
    char dir[] = "/tmp/vkd-XXXXXX", conf[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(conf, sizeof(conf), "%s/vkscand.conf", dir);
    FILE *f = fopen(conf, "w");
    fprintf(f, "# limits\nmax-buffers 8\n");
    fclose(f);
    const char *extra[] = {"--config", conf, NULL};
    struct daemon d;
    daemon_start(&d, dir, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_server_info info;
    /* vks_client_info: the hello of the connect, without a round trip. */
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    ck_assert_uint_eq(info.max_buffers, 8);
    ck_assert(strncmp(info.server, "vkscand ", 8) == 0);
    ck_assert_uint_eq(info.protocol, VKS_PROTOCOL_VERSION);
    ck_assert_int_eq(vks_client_info(NULL, &info), -EINVAL);
    uint64_t hellos = stat_of(c, "requests.hello");
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    ck_assert_uint_eq(stat_of(c, "requests.hello"), hellos); /* nothing was sent */
    ck_assert_int_eq(vks_client_hello(c, &info, NULL), 0);
    ck_assert_uint_eq(info.max_buffers, 8);
    f = fopen(conf, "w");
    fprintf(f, "max-buffers 16\n");
    fclose(f);
    kill(d.pid, SIGHUP);
    ck_assert(wait_ready(&d, 10000)); /* RELOADING=1 ... READY=1 */
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    ck_assert_uint_eq(info.max_buffers, 8); /* the connection's hello until asked again */
    ck_assert_int_eq(vks_client_hello(c, &info, NULL), 0);
    ck_assert_uint_eq(info.max_buffers, 16);
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    ck_assert_uint_eq(info.max_buffers, 16);
    ck_assert_uint_eq(stat_of(c, "reloads"), 1);
    /* A bad file keeps the running configuration. */
    f = fopen(conf, "w");
    fprintf(f, "max-buffers lots\n");
    fclose(f);
    kill(d.pid, SIGHUP);
    ck_assert(wait_ready(&d, 10000));
    ck_assert_int_eq(vks_client_hello(c, &info, NULL), 0);
    ck_assert_uint_eq(info.max_buffers, 16);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

START_TEST(test_socket_activation)
{
    char dir[] = "/tmp/vkd-XXXXXX", path[96], notify[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/activated.sock", dir);
    snprintf(notify, sizeof(notify), "%s/notify", dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(lfd, 16), 0);
    struct daemon d = {0};
    snprintf(d.dir, sizeof(d.dir), "%s", dir);
    snprintf(d.sock, sizeof(d.sock), "%s", path);
    d.notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un na = {.sun_family = AF_UNIX};
    snprintf(na.sun_path, sizeof(na.sun_path), "%s", notify);
    ck_assert_int_eq(bind(d.notify_fd, (struct sockaddr *)&na, sizeof(na)), 0);
    d.pid = fork();
    if (d.pid == 0) {
        char pid[16], state[96];
        dup2(lfd, 3);
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        snprintf(state, sizeof(state), "%s/state", dir);
        setenv("LISTEN_PID", pid, 1);
        setenv("LISTEN_FDS", "1", 1);
        setenv("NOTIFY_SOCKET", notify, 1);
        die_with_parent();
        /* --socket names a path that is never bound: the passed socket wins. */
        execl(getenv("VKSCAND"), "vkscand", "--socket", "/nonexistent/x.sock", "--state-dir", state,
              "--engine", "gpu", "--log-level", "warning", (char *)NULL);
        _exit(127);
    }
    close(lfd);
    ck_assert(wait_ready(&d, 120000));
    expect_ping_ok(&d);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* allow-uids: in a child running as `uid`, connects and reports how it went:
 * 0 served, 1 refused with DENIED and a message naming the uid, 2 anything
 * else. */
static int connect_as(const struct daemon *d, uid_t uid)
{
    if (setgid(uid) != 0 || setuid(uid) != 0)
        return 2;
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    int rc = vks_client_connect(d->sock, NULL, &c, &err);
    if (rc == 0) {
        rc = vks_client_ping(c, NULL);
        vks_client_close(c);
        return rc == 0 ? 0 : 2;
    }
    char want[64];
    snprintf(want, sizeof(want), "uid %u may not use this vkscand", (unsigned)uid);
    if (rc == -VKS_E_DENIED && err.code == -VKS_E_DENIED && strstr(err.msg, want) != NULL &&
        strstr(err.msg, "allow-uids") != NULL)
        return 1;
    fprintf(stderr, "connect as uid %u: %d %s\n", (unsigned)uid, rc, err.msg);
    return 2;
}

static int child_connect_as(const struct daemon *d, uid_t uid)
{
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0)
        _exit(connect_as(d, uid));
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

START_TEST(test_allow_uids)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_allow_uids: needs root to switch uid; skipped\n");
        return;
    }
    char dir[] = "/tmp/vkd-XXXXXX", conf[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    chmod(dir, 0755);
    snprintf(conf, sizeof(conf), "%s/vkscand.conf", dir);
    FILE *f = fopen(conf, "w");
    fprintf(f, "allow-uids root\n");
    fclose(f);
    const char *extra[] = {"--config", conf, "--socket-group", "65534", NULL};
    struct daemon d;
    daemon_start(&d, dir, extra);
    /* socket-group: the socket vkscand bound belongs to the group. */
    struct stat sb;
    ck_assert_int_eq(stat(d.sock, &sb), 0);
    ck_assert_uint_eq(sb.st_gid, 65534);
    /* Not listed: refused with a clear error; the listed root is served. */
    ck_assert_int_eq(child_connect_as(&d, 65534), 1);
    expect_ping_ok(&d);
    struct vks_client *c = connect_ok(&d);
    ck_assert_uint_eq(stat_of(c, "connections_denied"), 1);
    ck_assert_uint_ge(stat_of(c, "requests.hello.error"), 1);
    /* Reloadable: listed after SIGHUP, served on the next connection. */
    f = fopen(conf, "w");
    fprintf(f, "allow-uids root, 65534\n");
    fclose(f);
    kill(d.pid, SIGHUP);
    ck_assert(wait_ready(&d, 10000));
    ck_assert_int_eq(child_connect_as(&d, 65534), 0);
    ck_assert_uint_eq(stat_of(c, "connections_denied"), 1);
    /* allow-gids admits by group: 65534 by its gid while allow-uids names
     * only root. */
    f = fopen(conf, "w");
    fprintf(f, "allow-uids 0\nallow-gids 65534\n");
    fclose(f);
    kill(d.pid, SIGHUP);
    ck_assert(wait_ready(&d, 10000));
    ck_assert_int_eq(child_connect_as(&d, 65534), 0);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

/* ---- the configuration on its own ------------------------------------- */

static char conf_dir[64];

/* Writes `text` to a file in a fresh directory; returns its path. */
static const char *conf_file(const char *text)
{
    static char path[128];
    snprintf(conf_dir, sizeof(conf_dir), "/tmp/vkd-conf-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(conf_dir));
    snprintf(path, sizeof(path), "%s/vkscand.conf", conf_dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void conf_clean(void)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/vkscand.conf", conf_dir);
    unlink(path);
    rmdir(conf_dir);
}

/* config_load_from with the flags `flags` (NULL-terminated) and the
 * default file `def`. */
static int load_with(struct daemon_config *cfg, const char *const *flags, const char *def,
                     struct vks_error *err)
{
    char *argv[16] = {"vkscand"};
    int argc = 1;
    for (int i = 0; flags != NULL && flags[i] != NULL && argc < 15; i++)
        argv[argc++] = (char *)flags[i];
    argv[argc] = NULL;
    return config_load_from(cfg, argc, argv, def, stdout, err);
}

START_TEST(test_config_access_keys)
{
    struct daemon_config cfg;
    struct vks_error err = {0};
    /* Defaults: no group change, nobody filtered. */
    ck_assert_int_eq(load_with(&cfg, NULL, NULL, &err), 0);
    ck_assert_str_eq(cfg.socket_group, "");
    ck_assert_uint_eq(cfg.allow_uids.n, 0);
    ck_assert_uint_eq(cfg.allow_gids.n, 0);
    ck_assert(config_peer_allowed(&cfg, 1234, 1234, NULL, 0));
    /* Every new key, by name and by number. */
    const char *path = conf_file("# access\nsocket-group root\nallow-uids root, 65534\n"
                                 "allow-gids = 0,4242\n");
    const char *flags[] = {"--config", path, NULL};
    ck_assert_msg(load_with(&cfg, flags, NULL, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(cfg.socket_group, "root");
    ck_assert_uint_eq(cfg.allow_uids.n, 2);
    ck_assert_uint_eq(cfg.allow_uids.id[0], 0);
    ck_assert_uint_eq(cfg.allow_uids.id[1], 65534);
    ck_assert_uint_eq(cfg.allow_gids.n, 2);
    ck_assert_uint_eq(cfg.allow_gids.id[1], 4242);
    /* Who is let in: a listed uid, a listed primary or supplementary group. */
    const uint32_t groups[] = {7, 4242};
    ck_assert(config_peer_allowed(&cfg, 65534, 100, NULL, 0));
    ck_assert(config_peer_allowed(&cfg, 1000, 0, NULL, 0));
    ck_assert(config_peer_allowed(&cfg, 1000, 100, groups, 2));
    ck_assert(!config_peer_allowed(&cfg, 1000, 100, groups, 1));
    /* A reload takes the allow lists but not socket-group (restart). */
    struct daemon_config next = cfg;
    snprintf(next.socket_group, sizeof(next.socket_group), "0");
    next.allow_uids.n = 1;
    snprintf(next.allow_uids.text, sizeof(next.allow_uids.text), "root");
    config_apply_reload(&cfg, &next);
    ck_assert_uint_eq(cfg.allow_uids.n, 1);
    ck_assert_str_eq(cfg.allow_uids.text, "root");
    ck_assert_str_eq(cfg.socket_group, "root");
    conf_clean();
}
END_TEST

START_TEST(test_config_bad_access_values)
{
    static const struct {
        const char *line, *says;
    } bad[] = {
        {"allow-uids root,no-such-user-vkscan", "'no-such-user-vkscan' is no user on this host"},
        {"allow-gids 12x", "'12x' is not a valid number"},
        {"allow-gids no-such-group-vkscan", "is no group on this host"},
        {"socket-group no-such-group-vkscan", "socket-group 'no-such-group-vkscan' is no group"},
        {"allow-uids 99999999999", "not a valid number"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[256], where[160];
        snprintf(text, sizeof(text), "# line 1\nmax-hits 10\n%s\n", bad[i].line);
        const char *path = conf_file(text);
        const char *flags[] = {"--config", path, NULL};
        struct daemon_config cfg;
        struct vks_error err = {0};
        ck_assert_int_eq(load_with(&cfg, flags, NULL, &err), -EINVAL);
        snprintf(where, sizeof(where), "%s:3: ", path);
        ck_assert_msg(strstr(err.msg, where) != NULL, "no line number in: %s", err.msg);
        ck_assert_msg(strstr(err.msg, bad[i].says) != NULL, "%s: %s", bad[i].line, err.msg);
        conf_clean();
    }
    /* 65 entries: over CONFIG_MAX_IDS. */
    char many[512] = "allow-uids ";
    for (int i = 0; i <= CONFIG_MAX_IDS; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%d,", i);
    const char *path = conf_file(many);
    const char *flags[] = {"--config", path, NULL};
    struct daemon_config cfg;
    struct vks_error err = {0};
    ck_assert_int_eq(load_with(&cfg, flags, NULL, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, ":1: allow-uids lists more than 64"));
    conf_clean();
}
END_TEST

START_TEST(test_config_default_file)
{
    struct daemon_config cfg;
    struct vks_error err = {0};
    /* A missing default file is no error: every default. */
    ck_assert_int_eq(load_with(&cfg, NULL, "/nonexistent/vkscand.conf", &err), 0);
    ck_assert_str_eq(cfg.config_file, "");
    ck_assert_uint_eq(cfg.max_hits, 1u << 20);
    /* An existing one is read, and flags still win over it. */
    const char *path = conf_file("max-hits 77\nmax-rules 5\n");
    ck_assert_int_eq(load_with(&cfg, NULL, path, &err), 0);
    ck_assert_str_eq(cfg.config_file, path);
    ck_assert_uint_eq(cfg.max_hits, 77);
    const char *flags[] = {"--max-rules", "6", NULL};
    ck_assert_int_eq(load_with(&cfg, flags, path, &err), 0);
    ck_assert_uint_eq(cfg.max_hits, 77);
    ck_assert_uint_eq(cfg.max_rules, 6);
    /* A bad line in the default file is an error with its line number. */
    FILE *f = fopen(path, "w");
    fputs("max-hits 77\nmax-hits lots\n", f);
    fclose(f);
    ck_assert_int_eq(load_with(&cfg, NULL, path, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, ":2: max-hits 'lots'"));
    /* --config "" reads no file, not even the default. */
    const char *none[] = {"--config", "", NULL};
    ck_assert_int_eq(load_with(&cfg, none, path, &err), 0);
    ck_assert_uint_eq(cfg.max_hits, 1u << 20);
    conf_clean();
    /* A missing --config file still is an error. */
    const char *missing[] = {"--config", "/nonexistent/vkscand.conf", NULL};
    ck_assert_int_eq(load_with(&cfg, missing, NULL, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "cannot open config file /nonexistent/vkscand.conf"));
}
END_TEST

/* ---- the scheduler on its own ----------------------------------------- */

/* A tenant alone fills a batch with its queued scans on one catalog, up to
 * the batch's byte limit: no one to be fair to, and each batch costs a fixed
 * launch. With a second tenant waiting, DRR takes turns again. */
START_TEST(test_sched_solo_tenant_fills_batches)
{
    struct sched *s;
    struct sched_limits lim = {
        .quantum = 1 << 20, .tenant_max_requests = 1000, .tenant_max_bytes = 1ull << 40};
    ck_assert_int_eq(sched_create(&lim, &s), 0);
    struct sched_tenant *solo = sched_tenant_get(s, 1);
    static struct sched_job jl[6], jo[2];
    int key_a, key_b;
    for (int i = 0; i < 6; i++) {
        jl[i] = (struct sched_job){.key = &key_a, .bytes = 64u << 20, .n_buffers = 1};
        sched_push(s, solo, &jl[i]);
    }
    size_t sizes[8], n_batches = 0;
    bool pushed_other = false;
    for (;;) {
        struct sched_job *first;
        size_t n = sched_next_batch(s, 256u << 20, 4096, &first);
        if (n == 0)
            break;
        sizes[n_batches++] = n;
        for (struct sched_job *j = first, *next; j != NULL; j = next) {
            next = j->next;
            sched_job_done(s, j);
        }
        if (!pushed_other) { /* a second tenant arrives after the first batch */
            struct sched_tenant *other = sched_tenant_get(s, 2);
            for (int i = 0; i < 2; i++) {
                jo[i] = (struct sched_job){.key = &key_b, .bytes = 64u << 20, .n_buffers = 1};
                sched_push(s, other, &jo[i]);
            }
            pushed_other = true;
        }
    }
    /* 4 x 64 MiB fill the first batch; then the two tenants take turns, one
     * scan per batch, for the remaining 2 + 2. */
    ck_assert_uint_eq(sizes[0], 4);
    ck_assert_uint_eq(n_batches, 5);
    for (size_t i = 1; i < n_batches; i++)
        ck_assert_uint_eq(sizes[i], 1);
    sched_destroy(s);
}
END_TEST

/* A lone tenant's backlog is cut by the latency target (batch_max_ns over
 * the observed throughput), not only by bytes: a tenant arriving after the
 * first batch formed is in the very next one (issue 8, item 10). */
START_TEST(test_sched_latency_bound)
{
    struct sched *s;
    struct sched_limits lim = {.quantum = 64 << 10,
                               .tenant_max_requests = 1000,
                               .tenant_max_bytes = 1ull << 40,
                               .batch_max_ns = 1000000};
    ck_assert_int_eq(sched_create(&lim, &s), 0);
    sched_observe(s, 1000000, 1000000); /* 1 byte per ns: 1 ms = 1 MB */
    ck_assert_uint_eq(sched_latency_bytes(s), 1000000);
    struct sched_tenant *solo = sched_tenant_get(s, 1);
    static struct sched_job jl[100], jo;
    int key;
    for (int i = 0; i < 100; i++) {
        jl[i] = (struct sched_job){.key = &key, .bytes = 256u << 10, .n_buffers = 1};
        ck_assert_int_eq(sched_push(s, solo, &jl[i]), 0);
    }
    struct sched_job *first;
    size_t n = sched_next_batch(s, 1ull << 30, 65536, &first);
    ck_assert_uint_eq(n, 3); /* 3 x 256 KiB fit 1 MB; not the whole backlog */
    struct sched_tenant *other = sched_tenant_get(s, 2);
    jo = (struct sched_job){.key = &key, .bytes = 4096, .n_buffers = 1};
    ck_assert_int_eq(sched_push(s, other, &jo), 0);
    struct sched_job *second;
    ck_assert_uint_gt(sched_next_batch(s, 1ull << 30, 65536, &second), 0);
    bool found = false;
    for (struct sched_job *j = second; j != NULL; j = j->next)
        found |= j == &jo;
    ck_assert_msg(found, "the other tenant's scan waited behind more than one batch");
    while (n > 0) {
        for (struct sched_job *j = first, *next; j != NULL; j = next) {
            next = j->next;
            sched_job_done(s, j);
        }
        first = second;
        second = NULL;
        n = first != NULL ? 1 : sched_next_batch(s, 1ull << 30, 65536, &first);
    }
    sched_tenant_put(s, solo);
    sched_tenant_put(s, other);
    sched_destroy(s);
}
END_TEST

/* The deadline heap: the next deadline is always the earliest queued one,
 * through pushes, removals, batches and expiry. */
START_TEST(test_sched_deadlines)
{
    struct sched *s;
    struct sched_limits lim = {
        .quantum = 1 << 20, .tenant_max_requests = 1000, .tenant_max_bytes = 1ull << 40};
    ck_assert_int_eq(sched_create(&lim, &s), 0);
    struct sched_tenant *t[3];
    for (int i = 0; i < 3; i++)
        t[i] = sched_tenant_get(s, (uid_t)(10 + i));
    enum { N = 300 };
    static struct sched_job j[N];
    int keys[2];
    for (int i = 0; i < N; i++) {
        uint64_t dl = (i % 7 == 0) ? 0 : 1000 + (uint64_t)rnd(100000);
        j[i] = (struct sched_job){
            .key = &keys[i % 2], .bytes = 1000, .n_buffers = 1, .deadline_ns = dl};
        ck_assert_int_eq(sched_push(s, t[i % 3], &j[i]), 0);
    }
    for (int round = 0;; round++) {
        uint64_t want = 0;
        for (int i = 0; i < N; i++) {
            if (j[i].queued && j[i].deadline_ns != 0 && (want == 0 || j[i].deadline_ns < want))
                want = j[i].deadline_ns;
        }
        ck_assert_uint_eq(sched_next_deadline(s), want);
        if (want == 0)
            break;
        int pick = (int)rnd(N);
        if (round % 3 == 0 && j[pick].queued) {
            sched_remove(s, &j[pick]);
        } else if (round % 3 == 1) {
            struct sched_job *first;
            sched_next_batch(s, 5000, 4096, &first);
            for (struct sched_job *b = first, *next; b != NULL; b = next) {
                next = b->next;
                sched_job_done(s, b);
            }
        } else {
            struct sched_job *first;
            size_t n = sched_take_expired(s, want + 2000, &first);
            ck_assert_uint_ge(n, 1);
            for (struct sched_job *b = first; b != NULL; b = b->next)
                ck_assert_uint_le(b->deadline_ns, want + 2000);
        }
    }
    for (int i = 0; i < 3; i++)
        sched_tenant_put(s, t[i]);
    sched_destroy(s);
}
END_TEST

START_TEST(test_sched_fair_by_bytes)
{
    struct sched *s;
    struct sched_limits lim = {
        .quantum = 64 << 10, .tenant_max_requests = 1000, .tenant_max_bytes = 1ull << 40};
    ck_assert_int_eq(sched_create(&lim, &s), 0);
    struct sched_tenant *big = sched_tenant_get(s, 1), *small = sched_tenant_get(s, 2);
    static struct sched_job jb[200], js[16384];
    int key_a, key_b;
    for (int i = 0; i < 200; i++) { /* 1 MiB scans, catalog A */
        jb[i] = (struct sched_job){.key = &key_a, .bytes = 1 << 20, .n_buffers = 1};
        sched_push(s, big, &jb[i]);
    }
    for (int i = 0; i < 16384; i++) { /* 4 KiB scans (64 MiB in all), catalog B */
        js[i] = (struct sched_job){.key = &key_b, .bytes = 4096, .n_buffers = 1};
        sched_push(s, small, &js[i]);
    }
    ck_assert(sched_tenant_over(s, big) == false);
    /* Serve 64 MiB worth of batches: each tenant gets about half. */
    uint64_t served = 0;
    while (served < (64u << 20)) {
        struct sched_job *first;
        size_t n = sched_next_batch(s, 8u << 20, 4096, &first);
        ck_assert_uint_gt(n, 0);
        const void *key = first->key;
        for (struct sched_job *j = first, *next; j != NULL; j = next) {
            next = j->next;
            ck_assert_ptr_eq(j->key, key); /* one catalog per batch */
            served += j->bytes;
            sched_job_done(s, j);
        }
    }
    struct sched_tenant_stats a, b;
    ck_assert(sched_tenant_stats(s, 1, &a));
    ck_assert(sched_tenant_stats(s, 2, &b));
    double ratio = (double)a.served_bytes / (double)b.served_bytes;
    ck_assert_msg(ratio > 0.7 && ratio < 1.4, "bytes served %llu vs %llu",
                  (unsigned long long)a.served_bytes, (unsigned long long)b.served_bytes);
    /* Quotas: a tenant at its limit reports over. */
    lim.tenant_max_requests = 10;
    sched_set_limits(s, &lim);
    ck_assert(sched_tenant_over(s, small));
    /* Cancelled jobs leave the queue and the quota. */
    struct sched_stats st;
    sched_get_stats(s, &st);
    uint32_t before = st.queued_jobs;
    sched_remove(s, &js[16383]);
    sched_get_stats(s, &st);
    ck_assert_uint_eq(st.queued_jobs, before - 1);
    /* Drain the rest, then free. */
    struct sched_job *first;
    while (sched_next_batch(s, 1ull << 40, 1u << 30, &first) > 0) {
        for (struct sched_job *j = first, *next; j != NULL; j = next) {
            next = j->next;
            sched_job_done(s, j);
        }
    }
    sched_tenant_put(s, big);
    sched_tenant_put(s, small);
    sched_get_stats(s, &st);
    ck_assert_uint_eq(st.tenants, 0);
    sched_destroy(s);
}
END_TEST

/* Scan replies written by the CPU engine's threads (session_scan_finished;
 * engine-replies, the default; _i 1: by the loop, engine-replies no)
 * meet a socket the client does not read: 32 pipelined scans of 256 KiB
 * with a match every 140 bytes or so give about 1 MB of replies, over what
 * the socket holds, so replies are cut mid-frame (the rest queued for the
 * loop) or wait behind such a rest. Every reply must still arrive whole,
 * once, with refscan's hits; fails if a thread's write interleaves with
 * another reply or a cut reply's rest is lost. */
START_TEST(test_engine_thread_replies_fill_socket)
{
    enum { N = 32, LEN = 256 << 10 };
    struct daemon d;
    const char *extra[] = {"--engine", "cpu", "--engine-replies", _i == 0 ? "yes" : "no", NULL};
    daemon_start(&d, NULL, extra);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES, false);
    struct catalog *ref = local_catalog(rules, N_RULES - 1);
    static uint8_t data[N][LEN];
    int fd = raw_connect(&d);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (int i = 0; i < N; i++) {
        make_haystack(data[i], LEN);
        pack_scan(&pk, (uint32_t)i + 1, vks_catalog_fingerprint(cat), data[i], LEN);
        raw_frame(fd, &sb, NULL, 0);
        msgpack_sbuffer_clear(&sb);
    }
    msgpack_sbuffer_destroy(&sb);
    bool seen[N + 1] = {false};
    size_t total = 0;
    for (int k = 0; k < N; k++) {
        struct proto_reply *rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->error.code == 0, "scan %u: %s", rep->id, rep->error.msg);
        ck_assert(rep->id >= 1 && rep->id <= N && !seen[rep->id]);
        seen[rep->id] = true;
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(ref, data[rep->id - 1], LEN, SCAN_ALL, &want), 0);
        ck_assert_uint_eq(rep->u.scan.n_hits, want.n);
        for (size_t h = 0; h < want.n; h++) {
            ck_assert_uint_eq(rep->u.scan.hits[h].rule, want.v[h].rule);
            ck_assert_uint_eq(rep->u.scan.hits[h].end, want.v[h].end);
        }
        total += want.n;
        scan_hits_finish(&want);
        proto_reply_destroy(rep);
    }
    ck_assert_uint_gt(total, (size_t)N * 1000); /* the replies were large */
    close(fd);
    ck_assert_uint_eq(stat_of(c, "scans"), N);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    daemon_clean(&d);
}
END_TEST

Suite *daemon_suite(void)
{
    if (getenv("VKSCAND") == NULL || access(getenv("VKSCAND"), X_OK) != 0) {
        fprintf(stderr, "VKSCAND does not name the built vkscand\n");
        exit(77);
    }
    Suite *s = suite_create("daemon");
    TCase *tc = tcase_create("unit");
    tcase_add_test(tc, test_sched_fair_by_bytes);
    tcase_add_test(tc, test_sched_solo_tenant_fills_batches);
    tcase_add_test(tc, test_sched_latency_bound);
    tcase_add_test(tc, test_sched_deadlines);
    tcase_add_test(tc, test_config_access_keys);
    tcase_add_test(tc, test_config_bad_access_values);
    tcase_add_test(tc, test_config_default_file);
    suite_add_tcase(s, tc);
    tc = tcase_create("e2e");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_load_scan_inline);
    tcase_add_test(tc, test_small_batches_on_cpu);
    tcase_add_test(tc, test_cpu_spin_takes_next_request);
    tcase_add_test(tc, test_tiny_tasks_claimed);
    tcase_add_loop_test(tc, test_hit_bomb_unbounded_rule, 0, 2);
    tcase_add_test(tc, test_drop_frees_device_copy);
    tcase_add_test(tc, test_scan_memfd);
    tcase_add_loop_test(tc, test_fd_read_at_upload, 0, 2);
    tcase_add_test(tc, test_counted_hits);
    tcase_add_test(tc, test_fd_read_errors);
    tcase_add_test(tc, test_fd_gated);
    tcase_add_test(tc, test_second_client_shares_catalog);
    tcase_add_test(tc, test_pipelined_by_id);
    tcase_add_test(tc, test_read_ahead_pipelined);
    tcase_add_test(tc, test_clients_share_batches);
    tcase_add_test(tc, test_next_batch_loaded_ahead);
    tcase_add_test(tc, test_buffers_made_once);
    tcase_add_test(tc, test_tenants_isolated);
    tcase_add_test(tc, test_killed_client);
    tcase_add_test(tc, test_sigterm_drains);
    tcase_add_test(tc, test_restart_uses_disk_cache);
    tcase_add_test(tc, test_corrupt_disk_cache_heals);
    tcase_add_test(tc, test_restart_preloads);
    tcase_add_test(tc, test_recent_saved_before_a_kill);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_sighup_reloads);
    tcase_add_test(tc, test_socket_activation);
    tcase_add_test(tc, test_allow_uids);
    tcase_add_loop_test(tc, test_engine_thread_replies_fill_socket, 0, 2);
    suite_add_tcase(s, tc);
    /* Every error code of proto/errors.h not sent elsewhere (issue 8). */
    tc = tcase_create("codes");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_error_codes);
    tcase_add_test(tc, test_device_faults);
    tcase_add_test(tc, test_pipeline_refused);
    tcase_add_test(tc, test_reply_room);
    tcase_add_test(tc, test_serves_before_gpu_starts);
    tcase_add_test(tc, test_protocol_error);
    tcase_add_test(tc, test_connection_cap);
    tcase_add_test(tc, test_scan_timeout);
    suite_add_tcase(s, tc);
    return s;
}
