/*
 * Fault injection into the GPU engine through the vkfault interposer
 * (tests/fault/vkfault.h): Vulkan allocations, submits and fence waits fail
 * on command, at every position a batch reaches. After each failure the
 * engine must either report it (never rc 0 with missing hits) and give exact
 * results on the next batch, or, after a timeout or a lost device, refuse
 * with -ENODEV until re-created. The bug this guards against: a catalog
 * recorded as resident before its upload ran stayed "resident" with no
 * contents after a failed batch, and the next batch returned 0 hits.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "gpu.h"
#include "refscan.h"
#include "rules.h"
#include "vkfault.h"

static struct catalog *compile_one(const char *id, enum rule_kind kind, const char *pat)
{
    struct rule_src src = {id, kind, pat, strlen(pat), 0, 1};
    struct rules_result res = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(rules_compile(&src, 1, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    return cat;
}

/* Staged: catalogs and haystacks go through staging and a device copy, as
 * on a discrete GPU, also where lavapipe could map device memory; then a
 * batch that fails before its copies ran has uploaded nothing. */
static bool staged;
static int32_t factor_pass; /* 1: gated catalogs' factor ends on the device */

static struct gpu_engine *engine(void)
{
    struct gpu_options opt = {.timeout_ms = 20000,
                              .hit_capacity = 4,
                              .staged_upload = staged,
                              .factor_pass = factor_pass};
    struct gpu_engine *eng = NULL;
    struct vks_error err = {0};
    int rc = gpu_engine_create(&opt, &eng, &err);
    ck_assert_msg(rc == 0, "gpu_engine_create: %d %s", rc, err.msg);
    return eng;
}

/* Hits of `cat` over `buf` on the CPU reference scanner. */
static size_t cpu_hits(const struct catalog *cat, const char *buf)
{
    struct scan_hits want = {0};
    ck_assert_int_eq(refscan_buffer(cat, (const uint8_t *)buf, strlen(buf), SCAN_ALL, &want), 0);
    size_t n = want.n;
    scan_hits_finish(&want);
    return n;
}

/* Dispatches one buffer; returns rc and the number of hits in *n. */
static int scan(struct gpu_engine *eng, const struct catalog *cat, const char *buf, size_t *n,
                struct vks_error *err)
{
    const struct catalog *cats[1] = {cat};
    struct gpu_buffer gb = {
        .data = (const uint8_t *)buf, .len = strlen(buf), .id = 1, .mode = SCAN_ALL};
    struct gpu_batch b = {cats, 1, &gb, 1};
    struct gpu_result res = {0};
    int rc = gpu_batch_dispatch(eng, &b, &res, err);
    *n = res.n_hits;
    gpu_result_finish(&res);
    return rc;
}

/* A haystack with more hits than the initial ring (4) holds, so the ring
 * grows (one more allocation and pass) inside the batch. */
static const char hay[] = "xx needle yy needle zz needle .. needle -- needle ++ needle";

/* Arms `op` to fail at its nth call from now, for n = 1, 2, ... until a
 * batch runs without reaching the armed call. Each time: the failed batch
 * reports an error (or, if the failure was absorbed, exact hits), and the
 * next batch, unarmed, gives exact hits. */
/* every_position's fresh catalogs and haystack: by default one more
 * alternative beside "needle" over `hay`; the gated variant (a counted
 * repeat whose DFA is large, walked around its factor) makes each batch
 * two passes on the device, the factor pass and the main one. */
static const char *fresh_pat = "needle|zz%dq";
static const char *fresh_hay = hay;
static const char gated_hay[] = "xx apikey=abcdefghijklmnopqrstuv1234x needle apikey:0123456789"
                                "abcdefghij0123x apikey=short x needle apikey=";

static bool catalog_gated(const struct catalog *cat)
{
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        if (g.flags & CAT_GF_GATED)
            return true;
    }
    return false;
}

static void every_position(enum vkfault_op op, bool fatal)
{
    const char *hay = fresh_hay;
    struct catalog *cat = compile_one("n", RULE_LITERAL, "needle");
    size_t want = cpu_hits(cat, hay);
    ck_assert_uint_ge(want, 2);
    struct gpu_engine *eng = engine();
    int failures = 0;
    for (int nth = 1; nth < 64; nth++) {
        /* A fresh catalog each time (one more rule changes the
         * fingerprint), so the failing batch is the one that uploads it. */
        char id[16], pat[64];
        snprintf(id, sizeof(id), "r%d", nth);
        snprintf(pat, sizeof(pat), fresh_pat, nth);
        struct catalog *fresh = compile_one(id, RULE_REGEX, pat);
        size_t fresh_want = cpu_hits(fresh, hay);
        if (fresh_hay == gated_hay)
            ck_assert_msg(catalog_gated(fresh) && fresh_want >= 2, "%s: not gated or no hits", pat);
        int fired = vkfault_fired(op);
        vkfault_arm(op, nth);
        struct vks_error err = {0};
        size_t n = 0;
        int rc = scan(eng, fresh, hay, &n, &err);
        vkfault_arm(op, 0);
        bool hit = vkfault_fired(op) > fired;
        if (!hit) {
            /* Past the last call of this kind a batch makes: done. */
            ck_assert_msg(rc == 0, "unarmed batch failed: %d %s", rc, err.msg);
            ck_assert_uint_eq(n, fresh_want);
            catalog_destroy(fresh);
            break;
        }
        failures++;
        if (rc == 0)
            ck_assert_msg(n == fresh_want, "failure at call %d absorbed but %zu hits, want %zu",
                          nth, n, fresh_want);
        else
            ck_assert_msg(err.msg[0] != '\0', "rc %d without a message", rc);
        if (fatal && rc < 0) {
            ck_assert_int_eq(scan(eng, fresh, hay, &n, &err), -ENODEV);
            gpu_engine_destroy(eng);
            eng = engine();
        }
        /* The same catalog again, and the long-lived one: both exact. */
        rc = scan(eng, fresh, hay, &n, &err);
        ck_assert_msg(rc == 0, "batch after a failure at call %d: %d %s", nth, rc, err.msg);
        ck_assert_msg(n == fresh_want, "after a failure at call %d: %zu hits, CPU %zu", nth, n,
                      fresh_want);
        rc = scan(eng, cat, hay, &n, &err);
        ck_assert_msg(rc == 0 && n == want,
                      "other catalog after a failure at call %d: rc %d, "
                      "%zu hits, CPU %zu",
                      nth, rc, n, want);
        catalog_destroy(fresh);
    }
    ck_assert_msg(failures > 0, "the armed call was never reached: interposer not in effect");
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}

/* _i: 0 mapped (direct) uploads, 1 staged uploads. */
START_TEST(alloc_failures)
{
    staged = _i;
    every_position(VKFAULT_ALLOC, false);
}
END_TEST

START_TEST(submit_failures)
{
    staged = _i;
    every_position(VKFAULT_SUBMIT, false);
}
END_TEST

START_TEST(wait_timeouts)
{
    staged = _i;
    every_position(VKFAULT_WAIT, true);
}
END_TEST

START_TEST(device_lost)
{
    staged = _i;
    every_position(VKFAULT_LOST, true);
}
END_TEST

/* Every allocation, submit and wait of a batch with the factor pass
 * (gpu/batch.c factor_pass: its own plan, upload, submit and wait before
 * the main pass) fails in turn: a clear error or exact hits, and the
 * engine goes on (or, for a lost wait, is re-created). _i: bit 0 staged
 * uploads, bits 1-2 the operation. */
START_TEST(factor_pass_failures)
{
    staged = _i & 1;
    factor_pass = 1;
    fresh_pat = "apikey[=:][a-z0-9]{20,40}x|zz%dq";
    fresh_hay = gated_hay;
    static const enum vkfault_op ops[] = {VKFAULT_ALLOC, VKFAULT_SUBMIT, VKFAULT_WAIT};
    every_position(ops[_i >> 1], ops[_i >> 1] == VKFAULT_WAIT);
    factor_pass = 0;
    fresh_pat = "needle|zz%dq";
    fresh_hay = hay;
}
END_TEST

/* A failed grow keeps the old buffer: after the hit ring failed to grow
 * (both the grow and the retry after freeing the old ring), a batch that
 * fits the old ring still runs, and a later grow works. */
START_TEST(failed_grow_keeps_buffer)
{
    struct catalog *cat = compile_one("n", RULE_LITERAL, "needle");
    struct gpu_engine *eng = engine();
    size_t n = 0;
    struct vks_error err = {0};
    /* one hit in 2 KiB: a rate that gives the next batch no larger ring
     * before it runs (batch.c sizes rings from the rates seen) */
    char sparse[2048];
    memset(sparse, '.', sizeof(sparse) - 1);
    memcpy(sparse, "a needle", 8);
    sparse[sizeof(sparse) - 1] = '\0';
    ck_assert_int_eq(scan(eng, cat, sparse, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    /* Six hits need a bigger ring than 4: its allocation is the first one
     * this batch makes (everything else is resident). */
    vkfault_arm_n(VKFAULT_ALLOC, 1, 2);
    int rc = scan(eng, cat, hay, &n, &err);
    vkfault_arm(VKFAULT_ALLOC, 0);
    ck_assert_int_eq(vkfault_fired(VKFAULT_ALLOC), 2);
    ck_assert_int_eq(rc, -ENOMEM);
    ck_assert_int_eq(scan(eng, cat, "needle needle", &n, &err), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(scan(eng, cat, hay, &n, &err), 0);
    ck_assert_uint_eq(n, 6);
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}
END_TEST

/* ---- faults with batches in flight ------------------------------------- */

struct flight {
    const struct catalog *cats[1];
    struct gpu_buffer gb;
    struct gpu_batch b;
    struct gpu_result res;
};

static void flight_init(struct flight *f, const struct catalog *cat, const char *buf)
{
    f->cats[0] = cat;
    f->gb = (struct gpu_buffer){
        .data = (const uint8_t *)buf, .len = strlen(buf), .id = 1, .mode = SCAN_ALL};
    f->b = (struct gpu_batch){f->cats, 1, &f->gb, 1};
}

/* A batch that reported success has exactly `want` hits; one that failed
 * says why. Returns rc. */
static int settled(int rc, const struct gpu_result *res, size_t want, const struct vks_error *err,
                   int nth, const char *which)
{
    if (rc == 0)
        ck_assert_msg(res->n_hits == want, "%s, failure at call %d: rc 0 with %zu hits, want %zu",
                      which, nth, res->n_hits, want);
    else
        ck_assert_msg(err->msg[0] != '\0', "%s: rc %d without a message", which, rc);
    return rc;
}

/* As every_position, with batches in flight: batch A (a long-lived
 * catalog) is submitted, then `op` is armed at its nth call from there and
 * batch B (a fresh catalog) is submitted behind A, then both are collected
 * in order. The armed call falls in B's submit, A's wait or B's wait. Each
 * batch either fails with a message or has exact hits; a failure never
 * poisons the other batch's catalog or the cache: afterwards two more
 * batches in flight, one per catalog, are exact (after a timeout or a lost
 * device, on a re-created engine, the old one refusing with -ENODEV). */
static void every_position_inflight(enum vkfault_op op, bool fatal)
{
    struct catalog *cat = compile_one("n", RULE_LITERAL, "needle");
    size_t want = cpu_hits(cat, hay);
    struct gpu_options opt = {
        .timeout_ms = 20000, .hit_capacity = 4, .staged_upload = staged, .inflight = 2};
    struct gpu_engine *eng = NULL;
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_engine_create(&opt, &eng, &err), 0);
    int failures = 0;
    for (int nth = 1; nth < 64; nth++) {
        char id[16], pat[64];
        snprintf(id, sizeof(id), "f%d", nth);
        snprintf(pat, sizeof(pat), "needle|yy%dq", nth);
        struct catalog *fresh = compile_one(id, RULE_REGEX, pat);
        size_t fresh_want = cpu_hits(fresh, hay);
        struct flight a = {0}, b = {0};
        flight_init(&a, cat, hay);
        flight_init(&b, fresh, hay);
        struct vks_error ea = {0}, eb = {0};
        struct gpu_result *out = NULL;
        ck_assert_int_eq(gpu_batch_submit(eng, &a.b, &a.res, &ea), 0);
        int fired = vkfault_fired(op);
        vkfault_arm(op, nth);
        int rb = gpu_batch_submit(eng, &b.b, &b.res, &eb);
        int ra = gpu_batch_collect(eng, &out, &ea);
        ck_assert_ptr_eq(out, &a.res);
        if (rb == 0) {
            rb = gpu_batch_collect(eng, &out, &eb);
            ck_assert_ptr_eq(out, &b.res);
        }
        vkfault_arm(op, 0);
        ck_assert_uint_eq(gpu_engine_inflight(eng), 0);
        bool hit = vkfault_fired(op) > fired;
        ra = settled(ra, &a.res, want, &ea, nth, "batch A");
        rb = settled(rb, &b.res, fresh_want, &eb, nth, "batch B");
        if (!hit) {
            ck_assert_msg(ra == 0 && rb == 0, "unarmed: A %d %s, B %d %s", ra, ea.msg, rb, eb.msg);
            gpu_result_finish(&a.res);
            gpu_result_finish(&b.res);
            catalog_destroy(fresh);
            break;
        }
        failures++;
        if (fatal && (ra < 0 || rb < 0)) {
            ck_assert_int_eq(gpu_batch_submit(eng, &a.b, &a.res, &ea), -ENODEV);
            gpu_engine_destroy(eng);
            ck_assert_int_eq(gpu_engine_create(&opt, &eng, &err), 0);
        }
        /* Both catalogs again, both in flight at once: exact. */
        ck_assert_int_eq(gpu_batch_submit(eng, &b.b, &b.res, &eb), 0);
        ck_assert_int_eq(gpu_batch_submit(eng, &a.b, &a.res, &ea), 0);
        ck_assert_int_eq(gpu_batch_collect(eng, &out, &eb), 0);
        ck_assert_msg(b.res.n_hits == fresh_want, "after a failure at call %d: %zu hits, CPU %zu",
                      nth, b.res.n_hits, fresh_want);
        ck_assert_int_eq(gpu_batch_collect(eng, &out, &ea), 0);
        ck_assert_msg(a.res.n_hits == want, "other catalog after a failure at call %d: %zu hits",
                      nth, a.res.n_hits);
        gpu_result_finish(&a.res);
        gpu_result_finish(&b.res);
        catalog_destroy(fresh);
    }
    ck_assert_msg(failures > 0, "the armed call was never reached: interposer not in effect");
    gpu_engine_destroy(eng);
    catalog_destroy(cat);
}

/* _i: bit 0 staged uploads; bits 1-2 the call that fails: allocations,
 * submits, waits (timeouts), lost devices. */
START_TEST(inflight_failures)
{
    static const enum vkfault_op ops[] = {VKFAULT_ALLOC, VKFAULT_SUBMIT, VKFAULT_WAIT,
                                          VKFAULT_LOST};
    staged = _i & 1;
    enum vkfault_op op = ops[_i >> 1];
    every_position_inflight(op, op == VKFAULT_WAIT || op == VKFAULT_LOST);
}
END_TEST

static void pin_vulkan_modules(void)
{
    static const char *const libs[] = {"libvulkan_lvp.so", "libVkLayer_MESA_device_select.so",
                                       "libvulkan_intel.so", "libvulkan_radeon.so",
                                       "libvulkan_intel_hasvk.so"};
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++)
        dlopen(libs[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

/* Where a read callback takes a buffer's bytes from; `fail` fails it. */
struct src {
    const uint8_t *bytes;
    bool fail;
    atomic_uint calls;
};

static int read_src(void *ctx, uint8_t *dst, uint64_t off, size_t len)
{
    struct src *s = ctx;
    atomic_fetch_add(&s->calls, 1);
    if (s->fail) {
        memset(dst, 0x55, len); /* what was written before the failure */
        return -EIO;
    }
    memcpy(dst, s->bytes + off, len);
    return 0;
}

/* Runs bufs[0..n) (bytes, or through read_src when `read`) and returns
 * the hits. */
static struct gpu_result run_bufs(struct gpu_engine *eng, const struct catalog *cat,
                                  struct src *srcs, const size_t *lens, size_t n, bool read)
{
    const struct catalog *cats[1] = {cat};
    struct gpu_buffer gb[8];
    for (size_t i = 0; i < n; i++) {
        gb[i] = (struct gpu_buffer){.data = read ? NULL : srcs[i].bytes,
                                    .len = lens[i],
                                    .id = i,
                                    .mode = SCAN_ALL,
                                    .read = read ? read_src : NULL,
                                    .read_ctx = &srcs[i]};
    }
    struct gpu_batch b = {cats, 1, gb, (uint32_t)n};
    struct gpu_result res = {0};
    struct vks_error err = {0};
    int rc = gpu_batch_dispatch(eng, &b, &res, &err);
    ck_assert_msg(rc == 0, "dispatch: %d %s", rc, err.msg);
    return res;
}

/* Buffers read through a callback (gpu_buffer.read, the daemon's
 * descriptor buffers) in many pieces (64 KiB staging chunks when staged)
 * give exactly the hits of the same bytes in memory; a callback that fails
 * leaves zeros, never the bytes it wrote, so its buffer has no hits and the
 * others keep theirs. */
START_TEST(read_callback)
{
    struct gpu_options opt = {.timeout_ms = 20000, .staged_upload = _i == 1, .upload_chunk = 65536};
    struct gpu_engine *eng = NULL;
    struct vks_error err = {0};
    ck_assert_int_eq(gpu_engine_create(&opt, &eng, &err), 0);
    struct catalog *cat = compile_one("n", RULE_LITERAL, "needle");
    enum { N = 4 };
    static const size_t lens[N] = {200001, 77777, 131075, 5};
    struct src srcs[N];
    uint8_t *bytes[N];
    for (size_t i = 0; i < N; i++) {
        bytes[i] = malloc(lens[i]);
        memset(bytes[i], 'x', lens[i]);
        for (size_t at = 65536 - 3 - i; at + 6 <= lens[i]; at += 65536)
            memcpy(bytes[i] + at, "needle", 6); /* across every 64 KiB */
        if (lens[i] >= 6)
            memcpy(bytes[i] + lens[i] - 6, "needle", 6);
        srcs[i] = (struct src){.bytes = bytes[i]};
        atomic_init(&srcs[i].calls, 0);
    }
    struct gpu_result want = run_bufs(eng, cat, srcs, lens, N, false);
    ck_assert_uint_ge(want.n_hits, 8);
    for (int round = 0; round < 2; round++) {
        srcs[1].fail = round == 1;
        struct gpu_result got = run_bufs(eng, cat, srcs, lens, N, true);
        size_t k = 0;
        for (size_t h = 0; h < want.n_hits; h++) {
            if (round == 1 && want.hits[h].buffer == 1)
                continue; /* its read failed: nothing of it is found */
            ck_assert_uint_lt(k, got.n_hits);
            ck_assert_uint_eq(got.hits[k].buffer, want.hits[h].buffer);
            ck_assert_uint_eq(got.hits[k].end, want.hits[h].end);
            k++;
        }
        ck_assert_uint_eq(k, got.n_hits);
        gpu_result_finish(&got);
    }
    for (size_t i = 0; i < N; i++) {
        ck_assert_uint_ge(atomic_load(&srcs[i].calls), 2); /* read in both rounds */
        free(bytes[i]);
    }
    gpu_result_finish(&want);
    catalog_destroy(cat);
    gpu_engine_destroy(eng);
}
END_TEST

Suite *fault_suite(void)
{
    pin_vulkan_modules();
    struct gpu_device_info info;
    uint32_t n = 0;
    if (gpu_device_list(&info, 1, &n, NULL) < 0 || n == 0) {
        fprintf(stderr, "no Vulkan device: fault suite skipped\n");
        exit(77);
    }
    Suite *s = suite_create("fault");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, alloc_failures, 0, 2);
    tcase_add_loop_test(tc, submit_failures, 0, 2);
    tcase_add_loop_test(tc, wait_timeouts, 0, 2);
    tcase_add_loop_test(tc, device_lost, 0, 2);
    tcase_add_loop_test(tc, factor_pass_failures, 0, 6);
    tcase_add_test(tc, failed_grow_keeps_buffer);
    tcase_add_loop_test(tc, read_callback, 0, 2);
    tcase_add_loop_test(tc, inflight_failures, 0, 8);
    suite_add_tcase(s, tc);
    return s;
}
