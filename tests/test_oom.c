/*
 * Out of memory in rules/, proto/ and libvkscan: every allocation position
 * (or a deterministic sample where there are thousands) of a piece of work
 * is made to fail once through the oomfault allocator (tests/fault/
 * oomfault.h). Each time the work must fail cleanly, with -ENOMEM and a
 * message (never a crash, never rc 0 with a wrong result), leak nothing (the
 * ASan pass of ./dev test runs with leak detection, which checks each test's
 * process at exit), and the same work done again must give the exact result.
 *
 * The client test talks to a real vkscand; only the client process's
 * allocations fail (libvkscan's client.c is compiled into this program, the
 * daemon runs as its own process).
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "catalog.h"
#include "cpuscan.h"
#include "oomfault.h"
#include "patfile.h"
#include "proto.h"
#include "refscan.h"
#include "rules.h"
#include "streamscan.h"
#include "vkscan/vkscan.h"

/* Check is linked statically, so its bookkeeping in every passing assertion
 * (_mark_point copies the file name) would count as the work's allocation:
 * assertions are not counted. */
static void oom_mark_point(const char *file, int line)
{
    oomfault_pause();
    (_mark_point)(file, line);
    oomfault_resume();
}
#define _mark_point(file, line) oom_mark_point(file, line)

/*
 * The positions of `total` allocations to fail: all of them up to
 * MAX_POSITIONS; beyond that the first third, the last third and a third
 * spread evenly in between, so a run stays short under ASan and is the same
 * every time.
 */
#define MAX_POSITIONS 1200
static size_t positions(long total, long *out)
{
    size_t n = 0;
    const long third = MAX_POSITIONS / 3;
    if (total <= MAX_POSITIONS) {
        for (long p = 1; p <= total; p++)
            out[n++] = p;
        return n;
    }
    for (long p = 1; p <= third; p++)
        out[n++] = p;
    for (long i = 1; i <= third; i++)
        out[n++] = third + i * (total - 2 * third) / (third + 1);
    for (long p = total - third + 1; p <= total; p++)
        out[n++] = p;
    return n;
}

/* One piece of work: returns 0 after checking its result, or the error it
 * failed with (err filled). */
typedef int (*work_fn)(void *ctx, struct vks_error *err);

/*
 * Runs `work` once counting its allocations, then once per position with
 * that allocation failing: the work either fails with -ENOMEM and a message
 * (then, run again, it must succeed) or absorbs the failure, which it may
 * only do with an exact result (each work function checks its result
 * whenever it returns 0). `exact`: the work makes the same
 * allocations every time (not so where socket reads decide how often a
 * buffer grows). Returns how many positions were tried.
 */
static size_t every_allocation(const char *what, work_fn work, void *ctx, bool exact)
{
    struct vks_error err = {0};
    int rc = work(ctx, &err); /* once first: what is built once and cached is built */
    ck_assert_msg(rc == 0, "%s without faults: %d %s", what, rc, err.msg);
    oomfault_open(0);
    rc = work(ctx, &err);
    long total = oomfault_close();
    ck_assert_msg(rc == 0, "%s without faults: %d %s", what, rc, err.msg);
    ck_assert_msg(total > 0, "%s allocated nothing: the oomfault wrapper is not linked", what);
    static long pos[MAX_POSITIONS];
    size_t n = positions(total, pos), absorbed = 0;
    for (size_t i = 0; i < n; i++) {
        memset(&err, 0, sizeof(err));
        oomfault_open(pos[i]);
        rc = work(ctx, &err);
        oomfault_close();
        if (!oomfault_fired() && !exact) {
            /* Fewer allocations this time (a socket read in larger pieces). */
            ck_assert_msg(rc == 0, "%s: no allocation failed, yet %d %s", what, rc, err.msg);
            continue;
        }
        ck_assert_msg(oomfault_fired(), "%s: allocation %ld of %ld was never made", what, pos[i],
                      total);
        if (rc == 0) {
            /* Absorbed (a shrinking realloc that may fail, say): the work
             * checked that its result is exact all the same. */
            absorbed++;
            continue;
        }
        ck_assert_msg(rc == -ENOMEM, "%s: allocation %ld of %ld failed with %d (%s), not -ENOMEM",
                      what, pos[i], total, rc, err.msg);
        ck_assert_msg(err.msg[0] != '\0', "%s: allocation %ld failed without a message", what,
                      pos[i]);
        memset(&err, 0, sizeof(err));
        rc = work(ctx, &err);
        ck_assert_msg(rc == 0, "%s after failing allocation %ld: %d %s", what, pos[i], rc, err.msg);
    }
    ck_assert_msg(absorbed < n / 2, "%s: %zu of %zu failed allocations were absorbed", what,
                  absorbed, n);
    return n;
}

/* ---- rules --------------------------------------------------------------- */

/* Literals, a hex string, regexes (one case-insensitive), a rule the DFA
 * budget sends to the bit-NFA and a factored one (gated bit-NFA group plus
 * its factor group), and one bad rule (a reject). */
static const struct rule_src mixed[] = {
    {"lit", RULE_LITERAL, "needle", 6, 0, 0},
    {"lit2", RULE_LITERAL, "hay\\x00stack", 12, 0, 0},
    {"hex", RULE_HEX, "4d 5a ?? 00", 11, 0, 0},
    {"re", RULE_REGEX, "ab[0-9]+cd", 10, 0, 0},
    {"rei", RULE_REGEX, "(?i)foo(bar|baz)", 16, 0, 0},
    {"nfa", RULE_REGEX, "q[a-z]{70}z", 11, 0, 0},
    {"factored", RULE_REGEX, "start[^\\n]{80}stop", 18, 0, 0},
    {"bad", RULE_REGEX, "(unclosed", 9, 0, 0},
};
#define N_MIXED (sizeof(mixed) / sizeof(mixed[0]))

static const char pattern_file[] = "1:/needle/\n"
                                   "2:/ab[0-9]+cd/i\n"
                                   "3:/q[a-z]{70}z/s\n"
                                   "4:/(unclosed/\n";

struct rules_ctx {
    uint8_t fp[CATALOG_FP_LEN];
    size_t n_rejects;
    size_t n_hits;
    uint8_t hay[512];
    size_t hay_len;
};

static void make_hay(struct rules_ctx *x)
{
    char *p = (char *)x->hay;
    int n = snprintf(p, sizeof(x->hay), "a needle, ab123cd, FOOBAZ, q");
    for (int i = 0; i < 70; i++)
        p[n++] = 'k';
    p[n++] = 'z';
    n += snprintf(p + n, sizeof(x->hay) - (size_t)n, " start");
    for (int i = 0; i < 80; i++)
        p[n++] = '-';
    n += snprintf(p + n, sizeof(x->hay) - (size_t)n, "stop hay");
    p[n++] = '\0';
    n += snprintf(p + n, sizeof(x->hay) - (size_t)n, "stack MZ!");
    p[n++] = '\0';
    x->hay_len = (size_t)n;
}

/* Compile, scan, write out and read back the catalog, parse a pattern file. */
static int rules_work(void *ctx, struct vks_error *err)
{
    struct rules_ctx *x = ctx;
    struct rules_options opt = {.threads = 1, .max_states = 256};
    struct rules_result res = {0};
    int rc = rules_compile(mixed, N_MIXED, &opt, &res, err);
    if (rc < 0) {
        ck_assert_ptr_null(res.catalog);
        ck_assert_ptr_null(res.rejects);
        return rc;
    }
    struct scan_hits hits = {0};
    rc = refscan_buffer(res.catalog, x->hay, x->hay_len, SCAN_ALL, &hits);
    if (rc < 0) {
        rules_result_finish(&res);
        scan_hits_finish(&hits);
        snprintf(err->msg, sizeof(err->msg), "refscan_buffer: out of memory");
        return rc;
    }
    size_t n_words;
    const uint32_t *words = catalog_words(res.catalog, &n_words);
    struct catalog *back = NULL;
    rc = catalog_from_bytes(words, n_words * 4, &back, err);
    if (rc == 0) {
        struct patfile pf = {0};
        rc = patfile_parse(pattern_file, sizeof(pattern_file) - 1, &pf, err);
        if (rc == 0)
            ck_assert_uint_eq(pf.n, 4);
        patfile_finish(&pf);
    }
    if (rc == 0) {
        ck_assert_mem_eq(catalog_fingerprint(res.catalog), x->fp, CATALOG_FP_LEN);
        ck_assert_mem_eq(catalog_fingerprint(back), x->fp, CATALOG_FP_LEN);
        ck_assert_uint_eq(res.n_rejects, x->n_rejects);
        ck_assert_uint_eq(hits.n, x->n_hits);
    }
    catalog_destroy(back);
    scan_hits_finish(&hits);
    rules_result_finish(&res);
    return rc;
}

START_TEST(rules_oom)
{
    struct rules_ctx x = {0};
    make_hay(&x);
    /* The reference result, outside any window. */
    struct rules_options opt = {.threads = 1, .max_states = 256};
    struct rules_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(rules_compile(mixed, N_MIXED, &opt, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 1);
    ck_assert_uint_gt(catalog_nfa_count(res.catalog), 0); /* the bit-NFA rule is one */
    memcpy(x.fp, catalog_fingerprint(res.catalog), CATALOG_FP_LEN);
    x.n_rejects = res.n_rejects;
    struct scan_hits hits = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, x.hay, x.hay_len, SCAN_ALL, &hits), 0);
    x.n_hits = hits.n;
    ck_assert_uint_ge(x.n_hits, 7); /* every accepted rule matches once */
    scan_hits_finish(&hits);
    rules_result_finish(&res);
    size_t n = every_allocation("rules", rules_work, &x, true);
    ck_assert_uint_gt(n, 50);
}
END_TEST

/* The CPU engine's scanner (two segments, merged) and the stream scanner
 * (two writes, close) over the mixed catalog, against refscan's count. */
struct scan_ctx {
    const struct catalog *cat;
    const uint8_t *hay;
    size_t len;
    size_t want;
};

static int cpuscan_work(const struct scan_ctx *x, struct vks_error *err)
{
    struct cpuscan_scratch *sc = NULL;
    int rc = cpuscan_scratch_create(&sc);
    struct cpuscan_part parts[2] = {0};
    size_t n_parts = cpuscan_lookback(x->cat) == CPUSCAN_UNSEGMENTABLE ? 1 : 2;
    uint64_t cut = n_parts == 1 ? x->len : x->len / 2;
    if (rc == 0)
        rc =
            cpuscan_segment(x->cat, x->hay, x->len, 0, cut, SCAN_ALL, 0, NULL, NULL, sc, &parts[0]);
    if (rc == 0 && n_parts == 2)
        rc = cpuscan_segment(x->cat, x->hay, x->len, cut, x->len, SCAN_ALL, 0, NULL, NULL, sc,
                             &parts[1]);
    struct scan_hits out = {0};
    uint64_t dropped = 0;
    if (rc == 0)
        rc = cpuscan_merge(x->cat, SCAN_ALL, parts, n_parts, UINT64_MAX, false, &out, &dropped);
    if (rc == 0)
        ck_assert_uint_eq(out.n, x->want);
    scan_hits_finish(&out);
    cpuscan_part_finish(&parts[0]);
    cpuscan_part_finish(&parts[1]);
    cpuscan_scratch_destroy(sc);
    if (rc < 0)
        vks_error_set(err, rc, "cpuscan: %s", strerror(-rc));
    return rc;
}

static int streamscan_work(const struct scan_ctx *x, struct vks_error *err)
{
    struct streamscan *st = NULL;
    struct scan_hits out = {0};
    int rc = streamscan_create(x->cat, &st);
    if (rc == 0)
        rc = streamscan_write(st, x->hay, x->len / 3, &out);
    if (rc == 0)
        rc = streamscan_write(st, x->hay + x->len / 3, x->len - x->len / 3, &out);
    if (rc == 0)
        rc = streamscan_close(st, &out);
    if (rc == 0)
        ck_assert_uint_eq(out.n, x->want);
    scan_hits_finish(&out);
    streamscan_destroy(st);
    if (rc < 0)
        vks_error_set(err, rc, "streamscan: %s", strerror(-rc));
    return rc;
}

static int scanners_work(void *ctx, struct vks_error *err)
{
    int rc = cpuscan_work(ctx, err);
    return rc < 0 ? rc : streamscan_work(ctx, err);
}

START_TEST(scanners_oom)
{
    struct rules_ctx r = {0};
    make_hay(&r);
    struct rules_options opt = {.threads = 1, .max_states = 256};
    struct rules_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(rules_compile(mixed, N_MIXED, &opt, &res, &err), 0);
    struct scan_hits hits = {0};
    ck_assert_int_eq(refscan_buffer(res.catalog, r.hay, r.hay_len, SCAN_ALL, &hits), 0);
    struct scan_ctx x = {res.catalog, r.hay, r.hay_len, hits.n};
    scan_hits_finish(&hits);
    size_t n = every_allocation("cpuscan and streamscan", scanners_work, &x, true);
    ck_assert_uint_gt(n, 5);
    rules_result_finish(&res);
}
END_TEST

/* ---- proto --------------------------------------------------------------- */

/* Feeds the encoded bytes to a fresh reader and takes the frame. */
static int reframe(const struct proto_buf *b, struct proto_frame *f, struct vks_error *err)
{
    struct proto_reader *r = NULL;
    int rc = proto_reader_create(NULL, &r);
    if (rc < 0)
        return vks_error_set(err, rc, "proto_reader_create: out of memory");
    size_t used = 0;
    rc = proto_reader_feed(r, b->data, b->len, &used, err);
    if (rc == 1)
        rc = proto_reader_take(r, f);
    else if (rc == 0)
        rc = vks_error_set(err, -EPROTO, "frame incomplete after %zu of %zu bytes", used, b->len);
    proto_reader_destroy(r);
    return rc;
}

/* Encodes `req` (with `n_fds` descriptors), decodes it back; 0 or the error. */
static int request_roundtrip(const struct proto_request *req, size_t n_fds, struct vks_error *err)
{
    struct proto_buf b;
    proto_buf_init(&b);
    int rc = proto_request_encode(&b, req, err);
    struct proto_frame f = {0};
    if (rc == 0)
        rc = reframe(&b, &f, err);
    proto_buf_finish(&b);
    if (rc == 0 && n_fds > 0) {
        f.fds = malloc(n_fds * sizeof(int));
        if (f.fds == NULL) {
            proto_frame_finish(&f);
            return vks_error_set(err, -ENOMEM, "out of memory for descriptors");
        }
        for (size_t i = 0; i < n_fds; i++)
            f.fds[i] = dup(0);
        f.n_fds = n_fds;
    }
    if (rc < 0)
        return rc;
    struct proto_request *out = NULL;
    struct proto_head head;
    rc = proto_request_decode(&f, NULL, &out, &head, err);
    if (rc == 0) {
        ck_assert_int_eq(out->op, req->op);
        ck_assert_uint_eq(out->id, req->id);
        if (req->op == PROTO_OP_CATALOG_LOAD && !req->u.load.has_text) {
            ck_assert_uint_eq(out->u.load.n_rules, req->u.load.n_rules);
            ck_assert_str_eq(out->u.load.rules[1].id, req->u.load.rules[1].id);
        }
        if (req->op == PROTO_OP_SCAN)
            ck_assert_uint_eq(out->u.scan.n_buffers, req->u.scan.n_buffers);
    } else {
        ck_assert_ptr_null(out);
    }
    proto_request_destroy(out);
    return rc;
}

static int reply_roundtrip(const struct proto_reply *rep, struct vks_error *err)
{
    struct proto_buf b;
    proto_buf_init(&b);
    int rc = proto_reply_encode(&b, rep, err);
    struct proto_frame f = {0};
    if (rc == 0)
        rc = reframe(&b, &f, err);
    proto_buf_finish(&b);
    if (rc < 0)
        return rc;
    struct proto_reply *out = NULL;
    rc = proto_reply_decode(&f, NULL, &out, err);
    if (rc == 0) {
        ck_assert_int_eq(out->op, rep->op);
        ck_assert_int_eq(out->error.code, rep->error.code);
        if (rep->op == PROTO_OP_SCAN) {
            ck_assert_uint_eq(out->u.scan.n_hits, rep->u.scan.n_hits);
            ck_assert_str_eq(out->u.scan.hits[1].rule_id, rep->u.scan.hits[1].rule_id);
            ck_assert_uint_eq(out->u.scan.n_telemetry, rep->u.scan.n_telemetry);
        }
        if (rep->op == PROTO_OP_CATALOG_LOAD) {
            ck_assert_uint_eq(out->u.catalog.n_rules, rep->u.catalog.n_rules);
            ck_assert_str_eq(out->u.catalog.rejects[0].message, rep->u.catalog.rejects[0].message);
        }
    } else {
        ck_assert_ptr_null(out);
    }
    proto_reply_destroy(out);
    return rc;
}

static struct proto_rule wire_rules[] = {
    {"r0", PROTO_KIND_LITERAL, "needle", 6, ""},
    {"r1", PROTO_KIND_REGEX, "ab[0-9]+cd", 10, "i"},
    {"r2", PROTO_KIND_HEX, "4d 5a", 5, ""},
};
static const char wire_text[] = "1:/needle/\n2:/ab[0-9]+cd/i\n";
static const uint8_t wire_data[] = "some bytes to scan";

/* Every request and reply kind, encoded and decoded. */
static int proto_work(void *ctx, struct vks_error *err)
{
    (void)ctx;
    struct proto_request req = {.id = 7, .op = PROTO_OP_HELLO};
    req.u.hello = (struct proto_hello){2, 1, "oom-test", true};
    int rc = request_roundtrip(&req, 0, err);
    if (rc == 0) {
        req = (struct proto_request){.id = 8, .op = PROTO_OP_CATALOG_LOAD};
        req.u.load = (struct proto_catalog_load){.rules = wire_rules, .n_rules = 3};
        rc = request_roundtrip(&req, 0, err);
    }
    if (rc == 0) {
        req = (struct proto_request){.id = 9, .op = PROTO_OP_CATALOG_LOAD};
        req.u.load = (struct proto_catalog_load){
            .has_text = true, .text = wire_text, .text_len = sizeof(wire_text) - 1};
        rc = request_roundtrip(&req, 0, err);
    }
    if (rc == 0) {
        req = (struct proto_request){.id = 10, .op = PROTO_OP_CATALOG_HAS};
        req.u.ref.by_source = true;
        rc = request_roundtrip(&req, 0, err);
    }
    struct proto_buffer bufs[3] = {
        {.data = wire_data, .len = sizeof(wire_data)},
        {.is_fd = true, .fd_index = 0},
        {.is_fd = true, .fd_index = 1, .offset = 2, .length = 3, .has_length = true},
    };
    if (rc == 0) {
        req = (struct proto_request){.id = 11, .op = PROTO_OP_SCAN};
        req.u.scan = (struct proto_scan){
            .buffers = bufs, .n_buffers = 3, .mode = PROTO_REPORT_FIRST, .rule_ids = true};
        rc = request_roundtrip(&req, 2, err);
    }
    if (rc == 0) {
        req = (struct proto_request){.id = 12, .op = PROTO_OP_STREAM_WRITE};
        req.u.stream = (struct proto_stream){.stream = 3, .buffer = bufs[0]};
        rc = request_roundtrip(&req, 0, err);
    }
    if (rc == 0) {
        req = (struct proto_request){.id = 13, .op = PROTO_OP_STATS};
        rc = request_roundtrip(&req, 0, err);
    }
    struct proto_device dev[2] = {{0, "lavapipe", "cpu", 1 << 20, true},
                                  {1, "other", "discrete", 1 << 30, false}};
    struct proto_reply rep = {.id = 7, .op = PROTO_OP_HELLO};
    rep.u.hello = (struct proto_hello_reply){
        .version = 2, .min_version = 1, .server = "vkscand", .devices = dev, .n_devices = 2};
    proto_limits_default(&rep.u.hello.limits);
    if (rc == 0)
        rc = reply_roundtrip(&rep, err);
    struct proto_rule_info infos[2] = {{"r0", {1}}, {"r1", {2}}};
    struct proto_reject rejects[1] = {{2, 0, 1, "r2", "unclosed group"}};
    rep = (struct proto_reply){.id = 8, .op = PROTO_OP_CATALOG_LOAD};
    rep.u.catalog = (struct proto_catalog_result){
        .known = true, .rules = infos, .n_rules = 2, .rejects = rejects, .n_rejects = 1};
    if (rc == 0)
        rc = reply_roundtrip(&rep, err);
    struct proto_hit hits[3] = {{.buffer = 0, .rule = 0, .end = 8, .count = 1, .rule_id = "r0"},
                                {.buffer = 0, .rule = 1, .end = 12, .count = 1, .rule_id = "r1"},
                                {.buffer = 2, .rule = 0, .end = 3, .count = 1, .rule_id = "r0"}};
    struct proto_buffer_status st[3] = {{0, NULL, 18, 2, false, false},
                                        {-VKS_E_BAD_FD, "bad descriptor", 0, 0, false, false},
                                        {0, NULL, 3, 1, true, true}};
    struct proto_stat tel[2] = {{"bytes", false, 21, 0}, {"occupancy", true, 0, 0.5}};
    rep = (struct proto_reply){.id = 11, .op = PROTO_OP_SCAN};
    rep.u.scan = (struct proto_scan_reply){hits, 3, st, 3, tel, 2};
    if (rc == 0)
        rc = reply_roundtrip(&rep, err);
    rep = (struct proto_reply){.id = 13, .op = PROTO_OP_STATS};
    rep.u.stats = (struct proto_stats_reply){tel, 2};
    if (rc == 0)
        rc = reply_roundtrip(&rep, err);
    rep = (struct proto_reply){.id = 14, .op = PROTO_OP_STREAM_OPEN};
    rep.u.stream = (struct proto_stream_reply){.stream = 5, .state_bytes = 4096};
    if (rc == 0)
        rc = reply_roundtrip(&rep, err);
    if (rc == 0) {
        struct proto_buf b;
        proto_buf_init(&b);
        rc = proto_error_encode(&b, 15, PROTO_OP_SCAN, -VKS_E_BUSY, "over quota", err);
        proto_buf_finish(&b);
    }
    return rc;
}

START_TEST(proto_oom)
{
    size_t n = every_allocation("proto", proto_work, NULL, true);
    ck_assert_uint_gt(n, 20);
}
END_TEST

/* ---- libvkscan against a real vkscand ------------------------------------- */

struct daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
};

static void daemon_start(struct daemon *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/vkoom-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/vkscand.sock", d->dir);
    char state[sizeof(d->dir) + 16], notify[sizeof(d->dir) + 16];
    snprintf(state, sizeof(state), "%s/state", d->dir);
    snprintf(notify, sizeof(notify), "%s/notify", d->dir);
    int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", notify);
    ck_assert_int_eq(bind(nfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char *bin = getenv("VKSCAND");
    ck_assert_msg(bin != NULL, "VKSCAND is not set: run through meson test");
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        setenv("NOTIFY_SOCKET", notify, 1);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(bin, bin, "--socket", d->sock, "--state-dir", state, "--engine", "cpu",
              "--cpu-threads", "1", "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    bool ready = false;
    for (int waited = 0; waited < 120000 && !ready; waited += 100) {
        struct pollfd p = {.fd = nfd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            char buf[256] = {0};
            ready = recv(nfd, buf, sizeof(buf) - 1, 0) > 0 && strstr(buf, "READY=1") != NULL;
        }
        int st;
        ck_assert_msg(waitpid(d->pid, &st, WNOHANG) != d->pid, "vkscand exited");
    }
    close(nfd);
    ck_assert_msg(ready, "vkscand did not become ready");
}

static void daemon_stop(struct daemon *d)
{
    int st;
    kill(d->pid, SIGTERM);
    waitpid(d->pid, &st, 0);
    char cmd[sizeof(d->dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
    ck_assert_int_eq(system(cmd), 0);
}

static const struct vks_rule client_rules[] = {
    {"lit", VKS_RULE_LITERAL, "needle", 0, NULL},
    {"re", VKS_RULE_REGEX, "ab[0-9]+cd", 0, "i"},
    {"hex", VKS_RULE_HEX, "4d 5a", 0, NULL},
    {"bad", VKS_RULE_REGEX, "(unclosed", 0, NULL},
};
static const char client_text[] = "1:/needle/\n2:/q[a-z]{70}z/\n";
static const char client_hay[] = "a needle and AB12CD and MZ, then needle again";

struct client_ctx {
    const char *sock;
    uint8_t fp[VKS_FP_LEN];
};

/* A failed call must give -ENOMEM with a message and nothing to free; the
 * same call again (the armed allocation fails only once) must succeed. */
#define RETRY(call)                                                                        \
    do {                                                                                   \
        memset(err, 0, sizeof(*err));                                                      \
        rc = (call);                                                                       \
        if (rc != 0) {                                                                     \
            ck_assert_msg(rc == -ENOMEM, "%s: %d (%s), not -ENOMEM", #call, rc, err->msg); \
            ck_assert_msg(err->msg[0] != '\0', "%s failed without a message", #call);      \
            failed = rc;                                                                   \
            first = *err;                                                                  \
            memset(err, 0, sizeof(*err));                                                  \
            rc = (call);                                                                   \
            ck_assert_msg(rc == 0, "%s again: %d %s", #call, rc, err->msg);                \
        }                                                                                  \
    } while (0)

static void check_scan(const struct vks_scan_result *res)
{
    ck_assert_uint_eq(res->n_buffers, 2);
    ck_assert_uint_eq(res->n_hits, 4); /* needle twice, ab12cd, MZ in buffer 0 */
    ck_assert_uint_eq(res->buffers[0].hits, 4);
    ck_assert_uint_eq(res->buffers[1].hits, 0);
    ck_assert_str_eq(res->hits[0].rule_id, "lit");
}

/*
 * One client session: connect, hello, load (rules and text), has, scan,
 * stream, stats, drop. Each call that fails is retried at once; the return
 * value is the failure seen (or 0), so every_allocation sees the work fail
 * and then, run again unarmed, succeed.
 */
static int client_work(void *ctx, struct vks_error *err)
{
    struct client_ctx *x = ctx;
    int rc, failed = 0;
    struct vks_error first = {0};
    struct vks_client *c = NULL;
    RETRY(vks_client_connect(x->sock, NULL, &c, err));
    struct vks_server_info info;
    RETRY(vks_client_hello(c, &info, err));
    ck_assert_uint_gt(info.max_frame, 0);
    struct vks_catalog *cat = NULL;
    struct vks_load_options lo;
    vks_load_options_init(&lo);
    lo.always_send = true;
    RETRY(vks_client_catalog_load(c, client_rules, 4, &lo, &cat, err));
    ck_assert_uint_eq(vks_catalog_rule_count(cat), 3);
    ck_assert_uint_eq(vks_catalog_reject_count(cat), 1);
    ck_assert_mem_eq(vks_catalog_fingerprint(cat), x->fp, VKS_FP_LEN);
    vks_catalog_destroy(cat);
    RETRY(vks_client_catalog_load_text(c, client_text, sizeof(client_text) - 1, NULL, &cat, err));
    ck_assert_uint_eq(vks_catalog_rule_count(cat), 2);
    vks_catalog_destroy(cat);
    bool known = false;
    RETRY(vks_client_catalog_has(c, x->fp, &known, err));
    ck_assert(known);
    struct vks_buffer bufs[2] = {
        {.kind = VKS_BUFFER_INLINE, .data = client_hay, .len = sizeof(client_hay) - 1},
        {.kind = VKS_BUFFER_INLINE, .data = "nothing", .len = 7}};
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.rule_ids = true;
    so.no_cache = true;
    struct vks_scan_result res;
    RETRY(vks_client_scan(c, x->fp, bufs, 2, &so, &res, err));
    check_scan(&res);
    vks_scan_result_finish(&res);
    struct vks_stats stats;
    RETRY(vks_client_stats(c, &stats, err));
    ck_assert_uint_gt(stats.n_stats, 0);
    vks_stats_finish(&stats);
    RETRY(vks_client_ping(c, err));
    vks_client_close(c);
    *err = first;
    return failed;
}

/* One stream: open, two writes with a match across them, close. Returns
 * the first failure; the hits of a stream that failed are not checked. */
static int stream_once(struct vks_client *c, const uint8_t fp[VKS_FP_LEN], struct vks_error *err)
{
    struct vks_stream *s = NULL;
    int rc = vks_stream_open(c, fp, NULL, &s, err);
    if (rc < 0)
        return rc;
    struct vks_scan_result r1, r2, r3;
    rc = vks_stream_write(s, "xx ab1", 6, &r1, err);
    if (rc == 0) {
        rc = vks_stream_write(s, "2cd needle", 10, &r2, err);
        if (rc == 0) {
            ck_assert_uint_eq(r1.n_hits + r2.n_hits, 2);
            ck_assert_uint_eq(vks_stream_offset(s), 16);
        }
        vks_scan_result_finish(&r2);
    }
    vks_scan_result_finish(&r1);
    struct vks_error close_err = {0};
    int close_rc = vks_stream_close(s, &r3, rc == 0 ? err : &close_err);
    vks_scan_result_finish(&r3);
    return rc != 0 ? rc : close_rc;
}

/* Streams: a write whose reply was lost to -ENOMEM may have been applied by
 * the daemon, so it is not retried; the stream is closed and a fresh one
 * (the failure fired once) must give the exact hits. */
static int stream_work(void *ctx, struct vks_error *err)
{
    struct client_ctx *x = ctx;
    struct vks_client *c = NULL;
    oomfault_pause(); /* connect is covered by client_work */
    int rc = vks_client_connect(x->sock, NULL, &c, err);
    oomfault_resume();
    ck_assert_msg(rc == 0, "connect: %d %s", rc, err->msg);
    rc = stream_once(c, x->fp, err);
    if (rc != 0) {
        ck_assert_msg(rc == -ENOMEM, "stream: %d (%s), not -ENOMEM", rc, err->msg);
        struct vks_error again = {0};
        int rc2 = stream_once(c, x->fp, &again);
        ck_assert_msg(rc2 == 0, "stream after -ENOMEM: %d %s", rc2, again.msg);
    }
    vks_client_close(c);
    return rc;
}

START_TEST(client_oom)
{
    struct daemon d;
    daemon_start(&d);
    struct client_ctx x = {.sock = d.sock};
    struct vks_error err = {0};
    ck_assert_int_eq(vks_source_fingerprint(client_rules, 4, NULL, x.fp, &err), 0);
    /* The catalog fingerprint, outside any window. */
    struct vks_client *c = NULL;
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0);
    struct vks_catalog *cat = NULL;
    ck_assert_int_eq(vks_client_catalog_load(c, client_rules, 4, NULL, &cat, &err), 0);
    memcpy(x.fp, vks_catalog_fingerprint(cat), VKS_FP_LEN);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    size_t n = every_allocation("libvkscan", client_work, &x, false);
    ck_assert_uint_gt(n, 20);
    n = every_allocation("libvkscan streams", stream_work, &x, false);
    ck_assert_uint_gt(n, 10);
    daemon_stop(&d);
}
END_TEST

Suite *oom_suite(void)
{
    Suite *s = suite_create("oom");
    TCase *tc = tcase_create("oom");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, rules_oom);
    tcase_add_test(tc, scanners_oom);
    tcase_add_test(tc, proto_oom);
    tcase_add_test(tc, client_oom);
    suite_add_tcase(s, tc);
    return s;
}
