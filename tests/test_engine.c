/*
 * The engines (daemon/engine.c, rules/cpuscan.c): segment scans merged
 * across threads equal one refscan walk; the CPU engine of a real vkscand
 * (segments on several threads, the default on lavapipe); GPU batches that
 * fail for time or size re-run on the CPU; max_hits bounds what the engine
 * keeps; two GPU engines on one device share the work. Every hit list is
 * checked against refscan_buffer. Data stays small (lavapipe).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpulit.h"
#include "cpupair.h"
#include "cpurun.h"
#include "cpuplan.h"
#include "cpuscan.h"
#include "refscan.h"
#include "rules.h"
#include "vkscan/vkscan.h"

/* ---- rules and data --------------------------------------------------- */

struct rdef {
    const char *id, *pattern, *flags;
    enum rule_kind kind;
};

/* Every group bounded: segments apply. Assertions, a single-match rule,
 * caseless and hex rules make the start context and the merge matter. */
static const struct rdef bounded[] = {
    {"lit", "needle", NULL, RULE_LITERAL},
    {"rep", "ab[0-9]{1,4}c", NULL, RULE_REGEX},
    {"word", "\\bfo[a-z]?o\\b", NULL, RULE_REGEX},
    {"bol", "^xy", "m", RULE_REGEX},
    {"bos", "^ab", NULL, RULE_REGEX},
    {"eol", "zq$", NULL, RULE_REGEX},
    {"ci", "hello", "i", RULE_REGEX},
    {"once", "nee?dle", "H", RULE_REGEX},
    {"hex", "de ad ?? ef", NULL, RULE_HEX},
    {"aa", "aa", NULL, RULE_LITERAL},
};
#define N_BOUNDED (sizeof(bounded) / sizeof(bounded[0]))

static const struct rdef unbounded[] = {
    {"lit", "needle", NULL, RULE_LITERAL},
    {"gap", "a[^z]*q", NULL, RULE_REGEX},
};

static struct catalog *compile_with(const struct rdef *r, size_t n, bool bitnfa)
{
    struct rule_src src[16];
    for (size_t i = 0; i < n; i++) {
        uint32_t flags = 0;
        if (r[i].flags != NULL)
            ck_assert_int_eq(rules_parse_flags(r[i].flags, strlen(r[i].flags), &flags, NULL), 0);
        src[i] =
            (struct rule_src){r[i].id, r[i].kind, r[i].pattern, strlen(r[i].pattern), flags, 0};
    }
    struct rules_result res = {0};
    struct rules_options ro = {.force_bitnfa = bitnfa, .gate_bits = UINT32_MAX}; /* as chosen */
    ck_assert_int_eq(rules_compile(src, n, &ro, &res, NULL), 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    return cat;
}

static struct catalog *compile(const struct rdef *r, size_t n)
{
    return compile_with(r, n, false);
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)((rng >> 11) % n);
}

/* Random bytes from a small alphabet (many short matches) with the rules'
 * matches planted. */
static void make_data(uint8_t *buf, size_t len)
{
    static const char alpha[] = "abcdefhlnoqxyz0123 \n";
    static const char *const plants[] = {
        "needle", "ab12c", "\xde\xad\x01\xef", "HeLLo", "ab9999c", " foo ", "\nxy", "zq\n",
        "nedle",  "fo"};
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 16 < len; p += 3 + rnd(60)) {
        const char *s = plants[rnd(10)];
        memcpy(buf + p, s, strlen(s));
    }
}

static void assert_same(const struct scan_hits *got, const struct scan_hits *want, const char *what)
{
    ck_assert_msg(got->n == want->n, "%s: %zu hits, refscan %zu", what, got->n, want->n);
    for (size_t i = 0; i < want->n; i++)
        ck_assert_msg(got->v[i].rule == want->v[i].rule && got->v[i].end == want->v[i].end &&
                          got->v[i].count == want->v[i].count,
                      "%s: hit %zu (%u,%llu,%u), refscan (%u,%llu,%u)", what, i, got->v[i].rule,
                      (unsigned long long)got->v[i].end, got->v[i].count, want->v[i].rule,
                      (unsigned long long)want->v[i].end, want->v[i].count);
}

/* ---- segments (rules/cpuscan.c) ---------------------------------------- */

struct seg_job {
    const struct catalog *cat;
    const uint8_t *buf;
    size_t len, seg;
    enum scan_mode mode;
    uint64_t limit;
    struct cpuscan_part *parts;
    size_t n_parts;
    int first, step; /* this thread's segments */
};

static void *seg_thread(void *arg)
{
    struct seg_job *j = arg;
    struct cpuscan_scratch *s;
    ck_assert_int_eq(cpuscan_scratch_create(&s), 0);
    for (size_t k = (size_t)j->first; k < j->n_parts; k += (size_t)j->step) {
        uint64_t lo = k * j->seg, hi = lo + j->seg < j->len ? lo + j->seg : j->len;
        ck_assert_int_eq(cpuscan_segment(j->cat, j->buf, j->len, lo, hi, j->mode, j->limit, NULL,
                                         NULL, s, &j->parts[k]),
                         0);
    }
    cpuscan_scratch_destroy(s);
    return NULL;
}

/* Scans buf in segments of `seg` on `threads` threads and merges. */
static void segmented(const struct catalog *cat, const uint8_t *buf, size_t len, size_t seg,
                      int threads, enum scan_mode mode, uint64_t limit, uint64_t budget,
                      struct scan_hits *out, uint64_t *dropped)
{
    size_t n = (len + seg - 1) / seg;
    struct cpuscan_part *parts = calloc(n, sizeof(*parts));
    pthread_t th[4];
    struct seg_job jobs[4];
    for (int t = 0; t < threads; t++) {
        jobs[t] = (struct seg_job){cat, buf, len, seg, mode, limit, parts, n, t, threads};
        ck_assert_int_eq(pthread_create(&th[t], NULL, seg_thread, &jobs[t]), 0);
    }
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    ck_assert_int_eq(cpuscan_merge(cat, mode, parts, n, budget, false, out, dropped), 0);
    for (size_t k = 0; k < n; k++)
        cpuscan_part_finish(&parts[k]);
    free(parts);
}

/* _i 1: every rule forced onto the bit-NFA engine. */
START_TEST(test_segments_equal_refscan)
{
    struct catalog *cat = compile_with(bounded, N_BOUNDED, _i == 1);
    ck_assert_uint_eq(catalog_nfa_count(cat) > 0, _i == 1);
    uint64_t lb = cpuscan_lookback(cat);
    ck_assert_uint_ne(lb, CPUSCAN_UNSEGMENTABLE);
    ck_assert_uint_ge(lb, 7); /* ab[0-9]{1,4}c: matches straddle short segments */
    static uint8_t buf[24000];
    make_data(buf, sizeof(buf));
    static const size_t segs[] = {1, 2, 5, 7, 64, 1000, 30000};
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), (enum scan_mode)mode, &want), 0);
        ck_assert_uint_ge(want.n, 6);
        for (size_t s = 0; s < sizeof(segs) / sizeof(segs[0]); s++) {
            struct scan_hits got = {0};
            uint64_t dropped = 0;
            segmented(cat, buf, sizeof(buf), segs[s], 1 + (int)(s % 3), (enum scan_mode)mode, 0,
                      UINT64_MAX, &got, &dropped);
            char what[64];
            snprintf(what, sizeof(what), "mode %d segments of %zu", mode, segs[s]);
            assert_same(&got, &want, what);
            ck_assert_uint_eq(dropped, 0);
            scan_hits_finish(&got);
        }
        scan_hits_finish(&want);
    }
    catalog_destroy(cat);
}
END_TEST

/* Idle skipping in the CPU engine's DFA walks (cpuplan.h struct
 * cpuplan_skip): rules whose start states wait for a digit or a rare
 * letter, with \b, \B, multi-line ^ and $, so the start state after a run
 * depends on the run's last byte; long idle runs, matches right after runs
 * of every byte kind, at buffer and segment edges. The CPU engine equals
 * refscan_buffer (which never skips) in every mode and segment size, and
 * every DFA group has skipping on. Fails when the walk resumes from the
 * wrong start state after a run (always start[3], the one after a byte
 * that is neither a word byte nor a newline: 80 of 292 hits lost). */
START_TEST(test_idle_skip_equals_refscan)
{
    static const struct rdef rules[] = {
        {"ssn", "\\b\\d{3}-\\d{2}\\b", NULL, RULE_REGEX},
        {"bol", "^q\\d", "m", RULE_REGEX},
        {"eol", "z\\d$", "m", RULE_REGEX},
        {"nb", "\\Bq\\d", NULL, RULE_REGEX},
        {"yr", "19\\d\\d", NULL, RULE_REGEX},
    };
    enum { N = sizeof(rules) / sizeof(rules[0]) };
    struct catalog *cat = compile(rules, N);
    ck_assert_uint_eq(catalog_nfa_count(cat), 0);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_get(cat, &plan), 0);
    for (uint32_t g = 0; g < catalog_group_count(cat); g++)
        ck_assert_msg(plan->skip[g].on, "group %u has no idle bytes", g);
    cpuplan_put(plan);
    static const char *const plants[] = {"123-45", "q7",       "z9\n", "aq1", "1999",
                                         " 1",     "x123-45 ", "\nq3", "z5",  "_q2"};
    static uint8_t buf[40000];
    uint64_t r = 0x1d1e5c1bull;
    for (size_t i = 0; i < sizeof(buf);) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        if (r % 5 == 0) {
            const char *p = plants[(r >> 8) % 10];
            for (size_t k = 0; p[k] && i < sizeof(buf); k++)
                buf[i++] = (uint8_t)p[k];
        } else {
            static const char filler[] = "the cat sat, on a mat.\t-_Zx\n";
            for (uint64_t n = (r >> 20) % 40; n > 0 && i < sizeof(buf); n--, r >>= 1)
                buf[i++] = (uint8_t)filler[(r >> 3) % (sizeof(filler) - 1)];
        }
    }
    memcpy(buf, "q1 123-45", 9); /* at the very start */
    static const size_t segs[] = {3, 17, 1000, 40000};
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), (enum scan_mode)mode, &want), 0);
        ck_assert_uint_ge(want.n, mode == SCAN_ALL ? 200 : 4);
        for (size_t k = 0; k < sizeof(segs) / sizeof(segs[0]); k++) {
            struct scan_hits got = {0};
            uint64_t dropped = 0;
            segmented(cat, buf, sizeof(buf), segs[k], 1 + (int)(k % 2), (enum scan_mode)mode, 0,
                      UINT64_MAX, &got, &dropped);
            char what[64];
            snprintf(what, sizeof(what), "idle skip, mode %d segments of %zu", mode, segs[k]);
            assert_same(&got, &want, what);
            scan_hits_finish(&got);
        }
        scan_hits_finish(&want);
    }
    catalog_destroy(cat);
}
END_TEST

/* The plan reads rules written as plain strings without the parser
 * (rules/cpuplan.c plain_of). Plain regexes and literals (caseless or not,
 * with punctuation and bytes over 0x7f), beside strings written with an
 * escape that the parser must read, are planned as literal-matcher rules
 * and report what the DFA walk of refscan reports. */
START_TEST(test_plain_strings_equal_refscan)
{
    static const char pool[] = "abcqXYZ09-_/#,:;'\"<>=@!%&~ \x80\xa5\xff";
    enum { N = 48 };
    static char pat[N][20], str[N][20]; /* as written; the string it is */
    struct rule_src src[N];
    static char ids[N][8];
    for (int i = 0; i < N; i++) {
        size_t len = 5 + rnd(8);
        for (size_t k = 0; k < len; k++)
            str[i][k] = pool[rnd(sizeof(pool) - 1)];
        str[i][len] = '\0';
        enum rule_kind kind = i % 3 == 0 ? RULE_LITERAL : RULE_REGEX;
        if (i % 8 == 5 && kind == RULE_LITERAL) { /* "xA..." written "x\x41..." */
            str[i][1] = 'A';
            snprintf(pat[i], sizeof(pat[i]), "%c\\x41%s", str[i][0], str[i] + 2);
        } else if (i % 8 == 5) { /* "xb.c..." written "xb\.c..." */
            memcpy(str[i] + 1, "b.c", 3);
            snprintf(pat[i], sizeof(pat[i]), "%cb\\.c%s", str[i][0], str[i] + 4);
        } else {
            memcpy(pat[i], str[i], len + 1);
        }
        snprintf(ids[i], sizeof(ids[i]), "p%d", i);
        src[i] =
            (struct rule_src){ids[i], kind, pat[i], strlen(pat[i]), i % 2 ? RULE_F_CASELESS : 0, 0};
    }
    struct rules_result res = {0};
    struct rules_options ro = {.literal_group = -1, .gate_bits = UINT32_MAX}; /* DFA groups */
    ck_assert_int_eq(rules_compile(src, N, &ro, &res, NULL), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_get(cat, &plan), 0);
    ck_assert_uint_eq(plan->n_lit_groups, catalog_group_count(cat) + catalog_nfa_count(cat));
    cpuplan_put(plan);
    /* the pool's bytes, with every rule planted, caseless ones in mixed case */
    static uint8_t buf[30000];
    for (size_t i = 0; i < sizeof(buf);) {
        if (rnd(4) == 0) {
            int r = (int)rnd(N);
            const char *p = str[r];
            for (size_t k = 0; p[k] != '\0' && i < sizeof(buf); k++) {
                uint8_t c = (uint8_t)p[k];
                bool letter = (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
                buf[i++] = r % 2 && letter && rnd(2) ? c ^ 0x20 : c;
            }
        } else {
            buf[i++] = (uint8_t)pool[rnd(sizeof(pool) - 1)];
        }
    }
    struct scan_hits want = {0}, got = {0};
    ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), SCAN_ALL, &want), 0);
    ck_assert_uint_ge(want.n, 1000);
    uint64_t dropped = 0;
    segmented(cat, buf, sizeof(buf), sizeof(buf), 1, SCAN_ALL, 0, UINT64_MAX, &got, &dropped);
    assert_same(&got, &want, "plain strings");
    scan_hits_finish(&got);
    scan_hits_finish(&want);
    catalog_destroy(cat);
    /* one metacharacter each, each rule alone: none of them is a string */
    static const char *const meta[] = {"qa.z",  "qb?z",  "qc*z",   "qd+z", "qe|zf",
                                       "q(g)z", "q[h]z", "qi{2}z", "^qj",  "qk$"};
    static const char text[] = "qaXz qz qbz qccz qddz qe zf qgz qhz qiiz qj qk qa.z qc*z qi{2}z ";
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(rnd(3) ? text[i % (sizeof(text) - 1)] : '\n');
    for (size_t i = 0; i < sizeof(meta) / sizeof(meta[0]); i++) {
        src[0] = (struct rule_src){"m", RULE_REGEX, meta[i], strlen(meta[i]), RULE_F_MULTILINE, 0};
        ck_assert_int_eq(rules_compile(src, 1, &ro, &res, NULL), 0);
        cat = res.catalog;
        res.catalog = NULL;
        rules_result_finish(&res);
        ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), SCAN_ALL, &want), 0);
        ck_assert_uint_ge(want.n, 20);
        segmented(cat, buf, sizeof(buf), sizeof(buf), 1, SCAN_ALL, 0, UINT64_MAX, &got, &dropped);
        assert_same(&got, &want, meta[i]);
        scan_hits_finish(&got);
        scan_hits_finish(&want);
        catalog_destroy(cat);
    }
}
END_TEST

/* A limit keeps the first hits of every segment, and the merge the first
 * of the buffer: the result is refscan's prefix, the rest counted. */
START_TEST(test_segment_limit)
{
    struct catalog *cat = compile(bounded, N_BOUNDED);
    static uint8_t buf[8000];
    make_data(buf, sizeof(buf));
    struct scan_hits want = {0};
    ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), SCAN_ALL, &want), 0);
    ck_assert_uint_gt(want.n, 100);
    for (uint64_t limit = 1; limit <= 64; limit *= 4) {
        struct scan_hits got = {0};
        uint64_t dropped = 0;
        segmented(cat, buf, sizeof(buf), 512, 2, SCAN_ALL, limit, limit, &got, &dropped);
        struct scan_hits prefix = want;
        prefix.n = limit;
        assert_same(&got, &prefix, "limited");
        /* the single-match rule's repeats in later segments are not counted */
        ck_assert_uint_le(dropped, want.n * 2);
        ck_assert_uint_ge(dropped, want.n - limit);
        scan_hits_finish(&got);
    }
    scan_hits_finish(&want);
    catalog_destroy(cat);
}
END_TEST

static bool say(void *ctx, uint64_t kept)
{
    uint64_t *calls = ctx;
    ck_assert_uint_ge(kept, 1);
    calls[0]++;
    return calls[1] != 0;
}

/* The `enough` hook: asked while a segment keeps matches; a yes leaves one
 * kept (the marker) and counts the rest as dropped. */
START_TEST(test_segment_enough)
{
    static const struct rdef dot[] = {{"dot", ".", "s", RULE_REGEX}};
    struct catalog *cat = compile(dot, 1);
    static uint8_t buf[20000];
    memset(buf, 'x', sizeof(buf));
    struct cpuscan_scratch *s;
    ck_assert_int_eq(cpuscan_scratch_create(&s), 0);
    for (int yes = 0; yes < 2; yes++) {
        uint64_t calls[2] = {0, (uint64_t)yes};
        struct cpuscan_part part = {0};
        ck_assert_int_eq(cpuscan_segment(cat, buf, sizeof(buf), 0, sizeof(buf), SCAN_ALL, 10000,
                                         say, calls, s, &part),
                         0);
        ck_assert_uint_ge(calls[0], 1);
        ck_assert_uint_eq(part.hits.n, yes ? 1 : 10000);
        ck_assert_uint_eq(part.hits.v[0].end, 1);
        ck_assert_uint_eq(part.dropped, sizeof(buf) - part.hits.n);
        cpuscan_part_finish(&part);
    }
    cpuscan_scratch_destroy(s);
    catalog_destroy(cat);
}
END_TEST

/* An unbounded rule (_i 0: DFA, 1: bit-NFA): every buffer is one piece,
 * equal to refscan, with a limit applied while it is walked. */
START_TEST(test_unbounded_one_piece)
{
    struct catalog *cat = compile_with(unbounded, 2, _i == 1);
    ck_assert_uint_eq(catalog_nfa_count(cat) > 0, _i == 1);
    ck_assert_uint_eq(cpuscan_lookback(cat), CPUSCAN_UNSEGMENTABLE);
    static uint8_t buf[4000];
    make_data(buf, sizeof(buf));
    struct cpuscan_scratch *s;
    ck_assert_int_eq(cpuscan_scratch_create(&s), 0);
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0}, got = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), (enum scan_mode)mode, &want), 0);
        struct cpuscan_part part = {0};
        ck_assert_int_eq(cpuscan_segment(cat, buf, sizeof(buf), 0, sizeof(buf),
                                         (enum scan_mode)mode, 0, NULL, NULL, s, &part),
                         0);
        uint64_t dropped = 0;
        ck_assert_int_eq(
            cpuscan_merge(cat, (enum scan_mode)mode, &part, 1, UINT64_MAX, false, &got, &dropped),
            0);
        assert_same(&got, &want, "unbounded");
        ck_assert(!part.final); /* walked, not handed to refscan_buffer */
        /* a piece of such a catalog cannot be scanned alone */
        struct cpuscan_part p2 = {0};
        ck_assert_int_eq(cpuscan_segment(cat, buf, sizeof(buf), 100, 200, (enum scan_mode)mode, 0,
                                         NULL, NULL, s, &p2),
                         -EINVAL);
        cpuscan_part_finish(&p2);
        cpuscan_part_finish(&part);
        scan_hits_finish(&want);
        scan_hits_finish(&got);
    }
    { /* the limit holds while the one piece is walked */
        struct scan_hits want = {0}, got = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), SCAN_ALL, &want), 0);
        ck_assert_uint_gt(want.n, 3);
        struct cpuscan_part part = {0};
        ck_assert_int_eq(cpuscan_segment(cat, buf, sizeof(buf), 0, sizeof(buf), SCAN_ALL, 3, NULL,
                                         NULL, s, &part),
                         0);
        ck_assert_uint_le(part.hits.n, 3);
        ck_assert_uint_eq(part.dropped, want.n - part.hits.n);
        uint64_t dropped = 0;
        ck_assert_int_eq(cpuscan_merge(cat, SCAN_ALL, &part, 1, 3, false, &got, &dropped), 0);
        want.n = 3;
        assert_same(&got, &want, "unbounded, limited");
        cpuscan_part_finish(&part);
        scan_hits_finish(&got);
        scan_hits_finish(&want);
    }
    cpuscan_scratch_destroy(s);
    catalog_destroy(cat);
}
END_TEST

/* ---- the daemon under test -------------------------------------------- */

struct daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
    char notify[128];
    int notify_fd;
};

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

/* Starts vkscand with `extra` flags (NULL-terminated) in a fresh directory
 * and waits for READY=1. Stats are service-wide for our group. */
static void daemon_start(struct daemon *d, const char *const *extra)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/vke-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/vkscand.sock", d->dir);
    snprintf(d->notify, sizeof(d->notify), "%s/notify", d->dir);
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_uint_lt(strlen(d->notify), sizeof(sa.sun_path));
    memcpy(sa.sun_path, d->notify, strlen(d->notify) + 1);
    ck_assert_int_eq(bind(d->notify_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char *bin = getenv("VKSCAND");
    ck_assert_msg(bin != NULL, "VKSCAND is not set: run through meson test");
    char state[128], gid[16];
    snprintf(state, sizeof(state), "%s/state", d->dir);
    snprintf(gid, sizeof(gid), "%u", (unsigned)getgid());
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        const char *argv[40] = {bin, "--socket",    d->sock,   "--state-dir", state, "--admin-gids",
                                gid, "--log-level", "warning", "--config",    ""};
        int n = 11;
        for (int i = 0; extra != NULL && extra[i] != NULL && n < 39; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        setenv("NOTIFY_SOCKET", d->notify, 1);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    ck_assert_msg(wait_ready(d, 120000), "vkscand did not become ready");
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* SIGTERM, waits, removes the directory; returns the exit status. */
static int daemon_stop(struct daemon *d)
{
    int st = 0, rc = -1;
    kill(d->pid, SIGTERM);
    for (int i = 0; i < 600 && rc < 0; i++) {
        if (waitpid(d->pid, &st, WNOHANG) == d->pid)
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        else
            usleep(100000);
    }
    if (rc < 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &st, 0);
    }
    close(d->notify_fd);
    nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}

static struct vks_client *connect_ok(const struct daemon *d)
{
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    int rc = vks_client_connect(d->sock, NULL, &c, &err);
    ck_assert_msg(rc == 0, "connect: %d %s", rc, err.msg);
    return c;
}

static const struct vks_stat *find(const struct vks_stat *v, size_t n, const char *key)
{
    const struct vks_stat *s = vks_stat_find(v, n, key);
    ck_assert_msg(s != NULL, "no %s", key);
    return s;
}

static uint64_t tel_of(const struct vks_scan_result *r, const char *key)
{
    return find(r->telemetry, r->n_telemetry, key)->u;
}

static uint64_t stat_of(struct vks_client *c, const char *key)
{
    struct vks_stats st = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_stats(c, &st, &err), 0);
    uint64_t v = find(st.stats, st.n_stats, key)->u;
    vks_stats_finish(&st);
    return v;
}

static struct vks_catalog *load(struct vks_client *c, const struct rdef *r, size_t n)
{
    struct vks_rule vr[16];
    for (size_t i = 0; i < n; i++)
        vr[i] = (struct vks_rule){r[i].id,
                                  r[i].kind == RULE_LITERAL ? VKS_RULE_LITERAL
                                  : r[i].kind == RULE_HEX   ? VKS_RULE_HEX
                                                            : VKS_RULE_REGEX,
                                  r[i].pattern, 0, r[i].flags};
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    int rc = vks_client_catalog_load(c, vr, n, NULL, &cat, &err);
    ck_assert_msg(rc == 0, "load: %d %s", rc, err.msg);
    return cat;
}

static void scan(struct vks_client *c, struct vks_catalog *cat, const struct vks_buffer *b,
                 size_t n, enum vks_report mode, uint32_t max_hits, struct vks_scan_result *res)
{
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.mode = mode;
    so.max_hits = max_hits;
    struct vks_error err = {0};
    memset(res, 0, sizeof(*res));
    int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), b, n, &so, res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
}

/* The hits of buffer `b` equal refscan's. */
static void check(const struct catalog *cat, const struct vks_scan_result *res, uint32_t b,
                  const uint8_t *data, size_t len, enum scan_mode mode)
{
    struct scan_hits want = {0}, got = {0};
    ck_assert_int_eq(refscan_buffer(cat, data, len, mode, &want), 0);
    for (size_t i = 0; i < res->n_hits; i++) {
        if (res->hits[i].buffer == b)
            scan_hits_push(&got, res->hits[i].rule, res->hits[i].end, res->hits[i].count);
    }
    char what[32];
    snprintf(what, sizeof(what), "buffer %u mode %d", b, mode);
    assert_same(&got, &want, what);
    scan_hits_finish(&want);
    scan_hits_finish(&got);
}

static struct vks_buffer inline_buf(const uint8_t *d, size_t len)
{
    return (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = d, .len = len};
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- the CPU engine in vkscand ---------------------------------------- */

/* Three threads scan 256-byte segments of each buffer: every mode gives
 * refscan's hits, also for matches that straddle segment boundaries. */
START_TEST(test_cpu_engine_segments)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "3", "--cpu-segment-bytes", "256"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[40000], b[1000], z[10];
    make_data(a, sizeof(a));
    make_data(b, sizeof(b));
    memcpy(z, "needle zq", 9);
    struct vks_buffer vb[3] = {inline_buf(a, sizeof(a)), inline_buf(b, sizeof(b)),
                               inline_buf(z, sizeof(z))};
    const enum vks_report modes[3] = {VKS_REPORT_ALL, VKS_REPORT_FIRST, VKS_REPORT_COUNT};
    for (int m = 0; m < 3; m++) {
        struct vks_scan_result res;
        scan(c, cat, vb, 3, modes[m], 0, &res);
        check(ref, &res, 0, a, sizeof(a), (enum scan_mode)m);
        check(ref, &res, 1, b, sizeof(b), (enum scan_mode)m);
        check(ref, &res, 2, z, sizeof(z), (enum scan_mode)m);
        ck_assert_uint_eq(tel_of(&res, "engine"), 1);
        ck_assert_uint_eq(tel_of(&res, "engine_index"), 0); /* engine.0: the CPU engine */
        /* 40000 bytes in pieces of at least four lookbacks, plus the small ones */
        ck_assert_uint_gt(tel_of(&res, "cpu_segments"),
                          3 + 40000 / (4 * cpuscan_lookback(ref) + 256));
        ck_assert_uint_eq(tel_of(&res, "hits_dropped"), 0);
        vks_scan_result_finish(&res);
    }
    ck_assert_uint_eq(stat_of(c, "cpu_threads"), 3);
    ck_assert_uint_eq(stat_of(c, "engines"), 1);
    ck_assert_uint_eq(stat_of(c, "engine.0.kind"), 1);
    ck_assert_uint_eq(stat_of(c, "engine.0.batches"), 3);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A catalog with unbounded and bounded groups, one 1 MiB buffer on four
 * threads: its unbounded groups walk the whole buffer as one task, its
 * bounded ones in segments beside it (cpuscan_split_lookback). Every mode
 * gives refscan's hits, and a limit keeps the first hits by (end, rule)
 * though the unbounded task's lie anywhere in the buffer. */
START_TEST(test_cpu_engine_split)
{
    static const struct rdef mixed[] = {
        {"gap", "a[^z]*q", NULL, RULE_REGEX},
        {"lead", "[a-f ]+ nee?dle", NULL, RULE_REGEX},
        {"rep", "ab[0-9]{1,4}c", NULL, RULE_REGEX},
        {"word", "\\bfo[a-z]?o\\b", NULL, RULE_REGEX},
        {"lit", "needle", NULL, RULE_LITERAL},
        {"once", "x[^\\n]*zq", "H", RULE_REGEX},
        {"eol", "zq$", "m", RULE_REGEX},
    };
    enum { N = sizeof(mixed) / sizeof(mixed[0]) };
    struct catalog *ref = compile(mixed, N);
    ck_assert_uint_eq(cpuscan_lookback(ref), CPUSCAN_UNSEGMENTABLE);
    ck_assert_uint_ne(cpuscan_split_lookback(ref), CPUSCAN_UNSEGMENTABLE);
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "4", "--cpu-segment-bytes", "64K"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, mixed, N);
    static uint8_t a[1 << 20];
    make_data(a, sizeof(a));
    struct vks_buffer vb = inline_buf(a, sizeof(a));
    const enum vks_report modes[3] = {VKS_REPORT_ALL, VKS_REPORT_FIRST, VKS_REPORT_COUNT};
    for (int m = 0; m < 3; m++) {
        struct vks_scan_result res;
        scan(c, cat, &vb, 1, modes[m], 0, &res);
        check(ref, &res, 0, a, sizeof(a), (enum scan_mode)m);
        /* the unbounded groups' four pieces and at least four segments */
        ck_assert_uint_ge(tel_of(&res, "cpu_segments"), 8);
        vks_scan_result_finish(&res);
    }
    ck_assert_uint_eq(stat_of(c, "cpu.unbounded_pieces"), 3 * 4);
    struct scan_hits want = {0};
    ck_assert_int_eq(refscan_buffer(ref, a, sizeof(a), SCAN_ALL, &want), 0);
    ck_assert_uint_gt(want.n, 20000);
    struct vks_scan_result res;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 9000, &res); /* past CPUSCAN_CHECK_EVERY */
    ck_assert_uint_eq(res.n_hits, 9000);
    for (uint32_t i = 0; i < 9000; i++)
        ck_assert_msg(res.hits[i].rule == want.v[i].rule && res.hits[i].end == want.v[i].end,
                      "hit %u: (%u, %llu), refscan (%u, %llu)", i, res.hits[i].rule,
                      (unsigned long long)res.hits[i].end, want.v[i].rule,
                      (unsigned long long)want.v[i].end);
    ck_assert(res.buffers[0].truncated);
    vks_scan_result_finish(&res);
    scan_hits_finish(&want);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
    /* A hit bomb of the unbounded `gap` (an end at every other byte): its
     * pieces pass the raw-match limit (65,536 at this max-hits), so the
     * buffer's unbounded groups are walked whole instead, as before pieces,
     * with the same answer. */
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "4", "--max-hits", "16384"));
    c = connect_ok(&d);
    cat = load(c, mixed, N);
    static uint8_t bomb[1 << 20];
    for (size_t i = 0; i < sizeof(bomb); i++)
        bomb[i] = i & 1 ? 'q' : 'a';
    vb = inline_buf(bomb, sizeof(bomb));
    scan(c, cat, &vb, 1, VKS_REPORT_COUNT, 0, &res);
    check(ref, &res, 0, bomb, sizeof(bomb), SCAN_COUNT);
    vks_scan_result_finish(&res);
    ck_assert_uint_eq(stat_of(c, "cpu.piece_joins_whole"), 1);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A regular file (not a sealed memfd) is read by several threads in parts
 * of 32 MiB at least: matches across every part boundary and at the file's
 * last byte are found, exactly, and a range inside the file as well. */
START_TEST(test_large_file_parallel_read)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2"));
    struct vks_client *c = connect_ok(&d);
    static const struct rdef needle[] = {{"n", "needle", NULL, RULE_LITERAL}};
    struct vks_catalog *cat = load(c, needle, 1);
    char path[] = "/tmp/vks-engine-big-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    const uint64_t size = 72ull << 20, step = 1ull << 20;
    ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
    uint64_t n_planted = 0;
    /* "needle" across every MiB boundary (so across every read part), and
     * ending at the last byte */
    for (uint64_t at = step - 3; at + 6 <= size; at += step, n_planted++)
        ck_assert_int_eq(pwrite(fd, "needle", 6, (off_t)at), 6);
    ck_assert_int_eq(pwrite(fd, "needle", 6, (off_t)(size - 6)), 6);
    n_planted++;
    struct vks_buffer vb = {.kind = VKS_BUFFER_FD, .fd = fd};
    struct vks_scan_result res;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    ck_assert_int_eq(res.buffers[0].code, 0);
    ck_assert_uint_eq(res.n_hits, n_planted);
    for (uint64_t i = 0; i + 1 < n_planted; i++)
        ck_assert_uint_eq(res.hits[i].end, (i + 1) * step + 3);
    ck_assert_uint_eq(res.hits[n_planted - 1].end, size);
    vks_scan_result_finish(&res);
    /* A range: [5 MiB - 3 + 1, 70 MiB), offsets relative to its start. */
    vb.offset = 5 * step - 2;
    vb.length = 65 * step;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    ck_assert_int_eq(res.buffers[0].code, 0);
    ck_assert_uint_eq(res.n_hits, 64); /* the one at 5 MiB starts before the range */
    ck_assert_uint_eq(res.hits[0].end, 6 * step + 3 - vb.offset);
    vks_scan_result_finish(&res);
    close(fd);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* --engine cpu without --cpu-threads scans on every core (nothing else
 * scans); the count is in stats. */
START_TEST(test_cpu_engine_every_core)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu"));
    struct vks_client *c = connect_ok(&d);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    ck_assert_uint_eq(stat_of(c, "cpu_threads"), (uint64_t)(cores > 1 ? cores : 1));
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A hit bomb with max_hits: the reply carries max_hits, the buffer is
 * marked truncated, and the engine says how many it dropped at the source
 * instead of keeping them. Count mode counts every match without a list. */
static void hit_bomb(struct vks_client *c, bool cpu)
{
    static const struct rdef dot[] = {{"dot", ".", "s", RULE_REGEX}};
    struct vks_catalog *cat = load(c, dot, 1);
    static uint8_t bomb[60000], tail[100];
    memset(bomb, 'x', sizeof(bomb));
    memset(tail, 'y', sizeof(tail));
    struct vks_buffer vb[2] = {inline_buf(bomb, sizeof(bomb)), inline_buf(tail, sizeof(tail))};
    struct vks_scan_result res;
    scan(c, cat, vb, 2, VKS_REPORT_ALL, 10, &res);
    ck_assert_uint_eq(res.n_hits, 10);
    for (uint32_t i = 0; i < 10; i++)
        ck_assert(res.hits[i].buffer == 0 && res.hits[i].end == i + 1);
    ck_assert(res.buffers[0].truncated);
    ck_assert(res.buffers[1].truncated);
    ck_assert_uint_eq(tel_of(&res, "hits_dropped"), sizeof(bomb) + sizeof(tail) - 10);
    ck_assert_uint_eq(tel_of(&res, "engine"), cpu ? 1 : 0);
    vks_scan_result_finish(&res);
    scan(c, cat, vb, 2, VKS_REPORT_COUNT, 10, &res);
    ck_assert_uint_eq(res.n_hits, 2);
    ck_assert_uint_eq(res.hits[0].count, sizeof(bomb));
    ck_assert_uint_eq(res.hits[1].count, sizeof(tail));
    ck_assert_uint_eq(tel_of(&res, "hits_dropped"), 0);
    vks_scan_result_finish(&res);
    /* A limit past CPUSCAN_CHECK_EVERY: running segments learn that earlier
     * ones hold it and stop keeping; the reply is still the first 6000. */
    static uint8_t big[200000];
    memset(big, 'x', sizeof(big));
    struct vks_buffer bb = inline_buf(big, sizeof(big));
    scan(c, cat, &bb, 1, VKS_REPORT_ALL, 6000, &res);
    ck_assert_uint_eq(res.n_hits, 6000);
    for (uint32_t i = 0; i < 6000; i++)
        ck_assert_uint_eq(res.hits[i].end, i + 1);
    ck_assert(res.buffers[0].truncated);
    ck_assert_uint_eq(tel_of(&res, "hits_dropped"), sizeof(big) - 6000);
    vks_scan_result_finish(&res);
    vks_catalog_destroy(cat);
}

START_TEST(test_max_hits_at_source_cpu)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2", "--cpu-segment-bytes", "4K"));
    struct vks_client *c = connect_ok(&d);
    hit_bomb(c, true);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* One CPU thread: each buffer is one task, which must still keep the first
 * hit past max_hits so the reply can say it was truncated (as when a GPU
 * batch is re-run on the CPU engine of a 2-core host). */
START_TEST(test_max_hits_one_task_cpu)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "1"));
    struct vks_client *c = connect_ok(&d);
    hit_bomb(c, true);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* --engine auto where the best Vulkan device is a CPU (lavapipe): even a
 * batch far over cpu-max-work scans on the CPU engine, no GPU engine is
 * started, and the CPU engine has every core. */
START_TEST(test_auto_prefers_cpu_engine)
{
    struct daemon d;
    daemon_start(&d, ARGS("--cpu-max-work", "1K"));
    struct vks_client *c = connect_ok(&d);
    struct vks_server_info info;
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    bool gpu_present = false, active = false;
    for (uint32_t i = 0; i < info.n_devices; i++) {
        gpu_present |= strcmp(info.devices[i].type, "cpu") != 0;
        active |= info.devices[i].active;
    }
    ck_assert(active == gpu_present); /* lavapipe is listed, not used */
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[20000];
    make_data(a, sizeof(a));
    struct vks_buffer vb = inline_buf(a, sizeof(a));
    struct vks_scan_result res;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    check(ref, &res, 0, a, sizeof(a), SCAN_ALL);
    ck_assert_uint_eq(tel_of(&res, "engine"), gpu_present ? 0 : 1);
    ck_assert_uint_eq(stat_of(c, "engines"), gpu_present ? 2 : 1);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!gpu_present) /* no GPU engine: the core left for it scans too */
        ck_assert_uint_eq(stat_of(c, "cpu_threads"), (uint64_t)(cores > 1 ? cores : 1));
    vks_scan_result_finish(&res);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Under auto, `cpu-max-work` counts bytes times the catalog's CPU weight:
 * 20 KB of a catalog of bounded DFA groups scans on the CPU engine, the same
 * bytes of a forward-confirmed one (which the CPU engine walks whole) on
 * the GPU engine (lavapipe, named as the device), both exact. */
START_TEST(test_auto_weighs_catalogs)
{
    static const struct rdef confirm[] = {
        /* not `[a-z]+token`, which the compiler cuts to `[a-z]token` */
        {"lead", "[a-z][a-z]*token[a-z]*", NULL, RULE_REGEX},
        {"lit", "needle", NULL, RULE_LITERAL},
    };
    struct catalog *refs[2] = {compile(bounded, N_BOUNDED), compile(confirm, 2)};
    uint32_t w0 = catalog_cpu_weight(refs[0]);
    ck_assert_uint_le(20000ull * w0, 256u << 10);
    bool confirmed = false; /* what the daemon's own compile makes of it too */
    struct rule_src src[2];
    for (int i = 0; i < 2; i++)
        src[i] = (struct rule_src){
            confirm[i].id, confirm[i].kind, confirm[i].pattern, strlen(confirm[i].pattern), 0, 0};
    struct rules_result res0 = {0};
    struct rules_options ro = {0};
    ck_assert_int_eq(rules_compile(src, 2, &ro, &res0, NULL), 0);
    for (uint32_t g = 0; g < catalog_nfa_count(res0.catalog); g++) {
        struct catalog_nfa cn;
        catalog_nfa(res0.catalog, g, &cn);
        confirmed |= (cn.flags & CAT_GF_CONFIRM) != 0;
    }
    ck_assert(confirmed);
    ck_assert_uint_gt(20000ull * catalog_cpu_weight(res0.catalog), 256u << 10);
    rules_result_finish(&res0);

    struct daemon d;
    daemon_start(&d, ARGS("--engine", "auto", "--device", "0", "--cpu-max-wait-us", "1000000"));
    struct vks_client *c = connect_ok(&d);
    static uint8_t a[20000];
    make_data(a, sizeof(a));
    for (size_t p = 100; p + 40 < sizeof(a); p += 997)
        memcpy(a + p, " abtokenxy ", 11);
    struct vks_buffer vb = inline_buf(a, sizeof(a));
    for (int k = 0; k < 2; k++) {
        struct vks_catalog *cat = k == 0 ? load(c, bounded, N_BOUNDED) : load(c, confirm, 2);
        struct vks_scan_result res;
        scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
        check(refs[k], &res, 0, a, sizeof(a), SCAN_ALL);
        ck_assert_msg(tel_of(&res, "engine") == (k == 0 ? 1u : 0u), "catalog %d ran on engine %llu",
                      k, (unsigned long long)tel_of(&res, "engine"));
        vks_scan_result_finish(&res);
        vks_catalog_destroy(cat);
    }
    for (int k = 0; k < 2; k++)
        catalog_destroy(refs[k]);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- GPU failures re-run on the CPU ------------------------------------ */

/* A 1 ms batch timeout on lavapipe: the batch times out on the device and
 * its scan is answered by the CPU engine, exactly. (A real GPU may finish
 * 1 MiB within 1 ms: there only the hits are checked.) */
START_TEST(test_gpu_timeout_retried_on_cpu)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "gpu", "--gpu-timeout-ms", "1"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[1 << 20];
    make_data(a, sizeof(a));
    struct vks_buffer vb = inline_buf(a, sizeof(a));
    struct vks_scan_result res;
    struct vks_server_info info;
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    bool lavapipe = info.n_devices > 0 && strcmp(info.devices[0].type, "cpu") == 0;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    check(ref, &res, 0, a, sizeof(a), SCAN_ALL);
    if (lavapipe) {
        ck_assert_uint_eq(tel_of(&res, "cpu_retry"), ETIMEDOUT);
        ck_assert_uint_gt(tel_of(&res, "cpu_segments"), 0);
        ck_assert_uint_ge(stat_of(c, "engine.0.cpu_retries"), 1);
    }
    vks_scan_result_finish(&res);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A device budget of 2 MiB: a 3 MB buffer cannot fit (-E2BIG) and is
 * scanned on the CPU; a small one still runs on the GPU. */
START_TEST(test_gpu_too_big_retried_on_cpu)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "gpu", "--device-budget", "2M"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[3000000];
    make_data(a, sizeof(a));
    const size_t sizes[2] = {sizeof(a), 3000};
    for (int k = 0; k < 2; k++) {
        struct vks_buffer vb = inline_buf(a, sizes[k]);
        struct vks_scan_result res;
        scan(c, cat, &vb, 1, VKS_REPORT_COUNT, 0, &res);
        check(ref, &res, 0, a, sizes[k], SCAN_COUNT);
        ck_assert_uint_eq(tel_of(&res, "cpu_retry"), k == 0 ? E2BIG : 0);
        ck_assert_uint_eq(tel_of(&res, "engine"), 0);
        vks_scan_result_finish(&res);
    }
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* One scan whose buffers fit the device one by one but not together (a
 * device budget of 6 MiB, eight buffers of about 1 MB; on the H200 the same
 * path takes a scan of files over the 4 GiB one batch indexes): it runs on
 * the GPU in slices of whole buffers, one batch each (gpu_slices), with
 * every buffer's hits exact, in every report mode; it used to go whole to
 * the CPU engine (cpu_retry E2BIG). */
START_TEST(test_gpu_scan_in_slices)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "gpu", "--device-budget", "6M"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    enum { N = 8, LEN = 1000000 };
    static uint8_t a[N][LEN];
    struct vks_buffer vb[N];
    for (int i = 0; i < N; i++) {
        make_data(a[i], LEN);
        vb[i] = inline_buf(a[i], LEN - 977 * i);
    }
    const enum vks_report modes[] = {VKS_REPORT_ALL, VKS_REPORT_COUNT};
    const enum scan_mode smodes[] = {SCAN_ALL, SCAN_COUNT};
    for (int m = 0; m < 2; m++) {
        struct vks_scan_result res;
        scan(c, cat, vb, N, modes[m], 0, &res);
        for (int i = 0; i < N; i++)
            check(ref, &res, (uint32_t)i, a[i], vb[i].len, smodes[m]);
        ck_assert_uint_eq(tel_of(&res, "engine"), 0);
        ck_assert_uint_eq(tel_of(&res, "cpu_retry"), 0);
        ck_assert_uint_ge(tel_of(&res, "gpu_slices"), 2);
        vks_scan_result_finish(&res);
    }
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- several GPU engines ----------------------------------------------- */

/* `devices 0,0`: two GPU engines on one device. Scans alternate between
 * them (ties go round), each uploads the catalog once, the hits are exact;
 * stats and `vkscan status` show both; max_hits bounds the GPU path. */
START_TEST(test_two_gpu_engines)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "gpu", "--devices", "0,0"));
    struct vks_client *c = connect_ok(&d);
    struct vks_server_info info;
    ck_assert_int_eq(vks_client_info(c, &info), 0);
    ck_assert(info.n_devices > 0 && info.devices[0].active);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[6000];
    uint64_t uploads[2] = {0, 0}, used[2] = {0, 0};
    for (int k = 0; k < 6; k++) {
        make_data(a, sizeof(a));
        struct vks_buffer vb = inline_buf(a, sizeof(a));
        struct vks_scan_result res;
        scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
        check(ref, &res, 0, a, sizeof(a), SCAN_ALL);
        uint64_t e = tel_of(&res, "engine_index");
        ck_assert_uint_lt(e, 2);
        used[e]++;
        uploads[e] += tel_of(&res, "catalog_uploads");
        ck_assert_uint_eq(tel_of(&res, "engine"), 0);
        tel_of(&res, "wall_ns");
        tel_of(&res, "device_idle_ns");
        vks_scan_result_finish(&res);
    }
    ck_assert_uint_gt(used[0], 0);
    ck_assert_uint_gt(used[1], 0);
    ck_assert_uint_eq(uploads[0], 1); /* resident after the first batch on each engine */
    ck_assert_uint_eq(uploads[1], 1);
    ck_assert_uint_eq(stat_of(c, "engines"), 3);
    ck_assert_uint_eq(stat_of(c, "engine.0.batches"), used[0]);
    ck_assert_uint_eq(stat_of(c, "engine.1.batches"), used[1]);
    ck_assert_uint_eq(stat_of(c, "engine.1.kind"), 0);
    ck_assert_uint_eq(stat_of(c, "engine.2.kind"), 1);
    hit_bomb(c, false);

    const char *cli = getenv("VKSCAN");
    ck_assert_msg(cli != NULL, "VKSCAN is not set: run through meson test");
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' status", cli, d.sock);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char out[8192] = {0};
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    ck_assert_int_eq(pclose(p), 0);
    ck_assert_msg(strstr(out, "engine 0:") != NULL && strstr(out, "engine 1:") != NULL &&
                      strstr(out, "engine 2:") != NULL && strstr(out, "busy") != NULL,
                  "status shows no engines:\n%s", out);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A bad `devices` value stops vkscand at start with what is accepted. */
START_TEST(test_bad_devices)
{
    static const char *const bad[] = {"1,x", "0;1", "99", "-1", ","};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd),
                 "'%s' --config '' --socket /tmp/vke-bad.sock --state-dir /tmp/vke-bad "
                 "--engine cpu --devices '%s' 2>&1",
                 getenv("VKSCAND"), bad[i]);
        FILE *p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        char out[2048] = {0};
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        int st = pclose(p);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0, "devices '%s' was accepted", bad[i]);
        ck_assert_msg(strstr(out, "devices '") != NULL, "devices '%s': %s", bad[i], out);
    }
}
END_TEST

/* ---- small scans under load -------------------------------------------- */

struct loader {
    const char *sock;
    struct vks_catalog *cat;
    const uint8_t *data;
    size_t len;
    volatile int done;
};

static void *load_thread(void *arg)
{
    struct loader *l = arg;
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    if (vks_client_connect(l->sock, NULL, &c, &err) == 0) {
        struct vks_buffer vb = inline_buf(l->data, l->len);
        struct vks_scan_options so;
        vks_scan_options_init(&so);
        so.mode = VKS_REPORT_COUNT;
        struct vks_scan_result res = {0};
        vks_client_scan(c, vks_catalog_fingerprint(l->cat), &vb, 1, &so, &res, &err);
        vks_scan_result_finish(&res);
        vks_client_close(c);
    }
    __atomic_store_n(&l->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* --engine auto with a GPU engine (lavapipe named with --device): small
 * batches scan on the CPU engine while its queue is empty; while a large
 * batch keeps the CPU queue busy, they go to the GPU. */
START_TEST(test_small_batches_overflow_to_gpu)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "auto", "--device", "0", "--cpu-threads", "1",
                          "--cpu-segment-bytes", "256", "--cpu-max-work", "1G", "--cpu-max-wait-us",
                          "0"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t small[512], big[1 << 20];
    make_data(small, sizeof(small));
    make_data(big, sizeof(big));
    struct vks_buffer vb = inline_buf(small, sizeof(small));
    struct vks_scan_result res;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    check(ref, &res, 0, small, sizeof(small), SCAN_ALL);
    ck_assert_uint_eq(tel_of(&res, "engine"), 1); /* the CPU queue is empty */
    vks_scan_result_finish(&res);
    bool on_gpu = false;
    for (int round = 0; round < 20 && !on_gpu; round++) {
        struct loader l = {d.sock, cat, big, sizeof(big), 0};
        pthread_t th;
        ck_assert_int_eq(pthread_create(&th, NULL, load_thread, &l), 0);
        while (!__atomic_load_n(&l.done, __ATOMIC_ACQUIRE) && !on_gpu) {
            scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
            check(ref, &res, 0, small, sizeof(small), SCAN_ALL);
            on_gpu = tel_of(&res, "engine") == 0;
            vks_scan_result_finish(&res);
        }
        pthread_join(th, NULL);
    }
    ck_assert_msg(on_gpu, "no small scan went to the GPU while the CPU queue was busy");
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- work scanned once (issue 15) -------------------------------------- */

/* An unlinked temporary file holding `len` bytes of `d`. */
static int temp_file(const uint8_t *d, size_t len)
{
    char path[] = "/tmp/vks-engine-once-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    ck_assert_int_eq(pwrite(fd, d, len, 0), (ssize_t)len);
    return fd;
}

/* Buffer `ba` of `a` and buffer `bb` of `b` have the same reply: hits,
 * truncation, status and bytes. */
static void same_buffer(const struct vks_scan_result *a, uint32_t ba,
                        const struct vks_scan_result *b, uint32_t bb, const char *what)
{
    struct scan_hits ha = {0}, hb = {0};
    for (size_t i = 0; i < a->n_hits; i++) {
        if (a->hits[i].buffer == ba)
            scan_hits_push(&ha, a->hits[i].rule, a->hits[i].end, a->hits[i].count);
    }
    for (size_t i = 0; i < b->n_hits; i++) {
        if (b->hits[i].buffer == bb)
            scan_hits_push(&hb, b->hits[i].rule, b->hits[i].end, b->hits[i].count);
    }
    assert_same(&ha, &hb, what);
    ck_assert_msg(a->buffers[ba].truncated == b->buffers[bb].truncated, "%s: truncated", what);
    ck_assert_int_eq(a->buffers[ba].code, b->buffers[bb].code);
    ck_assert_uint_eq(a->buffers[ba].bytes, b->buffers[bb].bytes);
    scan_hits_finish(&ha);
    scan_hits_finish(&hb);
}

/* One request names the same file twice, and a range of it twice: each is
 * read and scanned once, and every buffer's reply equals that of the same
 * bytes sent inline (never deduplicated), in every mode, also when
 * max_hits cuts the first copy short (the copy is then scanned again). */
START_TEST(test_dedup_in_one_request)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2", "--cpu-segment-bytes", "256",
                          "--result-cache-bytes", "0"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[20000];
    make_data(a, sizeof(a));
    int fd = temp_file(a, sizeof(a));
    struct vks_buffer whole = {.kind = VKS_BUFFER_FD, .fd = fd};
    struct vks_buffer part = {.kind = VKS_BUFFER_FD, .fd = fd, .offset = 100, .length = 5000};
    struct vks_buffer fds[5] = {whole, inline_buf(a, 3000), whole, part, part};
    struct vks_buffer inl[5] = {inline_buf(a, sizeof(a)), inline_buf(a, 3000),
                                inline_buf(a, sizeof(a)), inline_buf(a + 100, 5000),
                                inline_buf(a + 100, 5000)};
    const enum vks_report modes[3] = {VKS_REPORT_ALL, VKS_REPORT_FIRST, VKS_REPORT_COUNT};
    const uint32_t limits[3] = {0, 7, 40};
    for (int m = 0; m < 3; m++) {
        for (int l = 0; l < 3; l++) {
            struct vks_scan_result rf, ri;
            scan(c, cat, fds, 5, modes[m], limits[l], &rf);
            scan(c, cat, inl, 5, modes[m], limits[l], &ri);
            char what[64];
            for (uint32_t b = 0; b < 5; b++) {
                snprintf(what, sizeof(what), "mode %d max_hits %u buffer %u", m, limits[l], b);
                same_buffer(&rf, b, &ri, b, what);
            }
            ck_assert_uint_eq(rf.n_hits, ri.n_hits);
            ck_assert_uint_eq(tel_of(&rf, "buffers_deduplicated"), 2);
            ck_assert_uint_eq(tel_of(&rf, "bytes_not_scanned"), sizeof(a) + 5000);
            ck_assert_uint_eq(tel_of(&rf, "batch_bytes"), sizeof(a) + 3000 + 5000);
            ck_assert_uint_eq(tel_of(&ri, "buffers_deduplicated"), 0);
            if (limits[l] == 0) {
                check(ref, &rf, 2, a, sizeof(a), (enum scan_mode)m);
                check(ref, &rf, 4, a + 100, 5000, (enum scan_mode)m);
            }
            vks_scan_result_finish(&rf);
            vks_scan_result_finish(&ri);
        }
    }
    ck_assert_uint_eq(stat_of(c, "dedup.buffers"), 2 * 9);
    ck_assert_uint_eq(stat_of(c, "dedup.bytes_not_scanned"), 9 * (sizeof(a) + 5000));
    close(fd);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

struct scanner {
    struct vks_client *c;
    const uint8_t *fp;
    struct vks_buffer vb;
    struct vks_scan_result res;
    int rc;
};

static void *scan_thread(void *arg)
{
    struct scanner *s = arg;
    struct vks_error err = {0};
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    memset(&s->res, 0, sizeof(s->res));
    s->rc = vks_client_scan(s->c, s->fp, &s->vb, 1, &so, &s->res, &err);
    return NULL;
}

/* Two clients scan the same file while one engine thread is busy with a
 * third: their requests land in one batch (equal batch_id), the file is
 * scanned once, and both replies equal refscan's. */
START_TEST(test_dedup_across_requests)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "1", "--inflight-batches", "1",
                          "--result-cache-bytes", "0"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[30000], big[4 << 20];
    make_data(a, sizeof(a));
    make_data(big, sizeof(big));
    int fd = temp_file(a, sizeof(a));
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    struct scanner blk = {connect_ok(&d), fp, inline_buf(big, sizeof(big)), {0}, 0};
    struct scanner s1 = {connect_ok(&d), fp, {.kind = VKS_BUFFER_FD, .fd = fd}, {0}, 0};
    struct scanner s2 = s1;
    s2.c = connect_ok(&d);
    bool together = false;
    for (int round = 0; round < 30 && !together; round++) {
        pthread_t tb, t1, t2;
        ck_assert_int_eq(pthread_create(&tb, NULL, scan_thread, &blk), 0);
        usleep(5000); /* the blocker first, mostly; a round where it is not is retried */
        ck_assert_int_eq(pthread_create(&t1, NULL, scan_thread, &s1), 0);
        ck_assert_int_eq(pthread_create(&t2, NULL, scan_thread, &s2), 0);
        pthread_join(tb, NULL);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        ck_assert_int_eq(blk.rc, 0);
        ck_assert_int_eq(s1.rc, 0);
        ck_assert_int_eq(s2.rc, 0);
        /* Together or not, both are right. */
        check(ref, &s1.res, 0, a, sizeof(a), SCAN_ALL);
        check(ref, &s2.res, 0, a, sizeof(a), SCAN_ALL);
        same_buffer(&s1.res, 0, &s2.res, 0, "two requests");
        together = tel_of(&s1.res, "batch_id") == tel_of(&s2.res, "batch_id");
        uint64_t dups =
            tel_of(&s1.res, "buffers_deduplicated") + tel_of(&s2.res, "buffers_deduplicated");
        ck_assert_uint_eq(dups, together ? 1 : 0);
        if (together) {
            ck_assert_uint_eq(tel_of(&s1.res, "batch_bytes"), sizeof(a));
            ck_assert_uint_eq(tel_of(&s1.res, "bytes_not_scanned") +
                                  tel_of(&s2.res, "bytes_not_scanned"),
                              sizeof(a));
        }
        vks_scan_result_finish(&blk.res);
        vks_scan_result_finish(&s1.res);
        vks_scan_result_finish(&s2.res);
    }
    ck_assert_msg(together, "the two scans never shared a batch");
    vks_client_close(blk.c);
    vks_client_close(s1.c);
    vks_client_close(s2.c);
    close(fd);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Sets the file's mtime `secs` from now (atime too); its ctime becomes now. */
static void set_mtime(int fd, long secs)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct timespec ts[2] = {{now.tv_sec + secs, 0}, {now.tv_sec + secs, 0}};
    ck_assert_int_eq(futimens(fd, ts), 0);
}

/* Lets every file's last change (ctime) fall more than a second behind, so
 * results can be cached (the racy-clean rule). */
static void age(void)
{
    usleep(1200 * 1000);
}

static uint64_t hits_in(const struct vks_scan_result *r, uint32_t b)
{
    uint64_t n = 0;
    for (size_t i = 0; i < r->n_hits; i++)
        n += r->hits[i].buffer == b;
    return n;
}

/* A file scanned twice without a change is scanned once: the second reply
 * comes from the result cache, equal to the first. Changed with the same
 * size and mtime (what a coarse clock gives within one tick), it is
 * scanned again: its ctime moved. Right after that change it stays out of
 * the cache (racily clean): without that rule the third scan here would
 * come from the cache. A file whose mtime is in the future is never cached. */
START_TEST(test_cache_unchanged_files)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2"));
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    struct catalog *ref = compile(bounded, N_BOUNDED);
    static uint8_t a[20000], b[20000];
    make_data(a, sizeof(a));
    make_data(b, sizeof(b));
    int fd = temp_file(a, sizeof(a));
    set_mtime(fd, -3600);
    age();
    struct vks_buffer vb = {.kind = VKS_BUFFER_FD, .fd = fd};
    struct vks_scan_result r1, r2;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &r1);
    check(ref, &r1, 0, a, sizeof(a), SCAN_ALL);
    ck_assert_uint_eq(tel_of(&r1, "cache_hits"), 0);
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &r2);
    ck_assert_uint_eq(tel_of(&r2, "cache_hits"), 1);
    ck_assert_uint_eq(tel_of(&r2, "bytes_not_scanned"), sizeof(a));
    ck_assert_uint_eq(tel_of(&r2, "batch_bytes"), 0);
    same_buffer(&r1, 0, &r2, 0, "from the cache");
    vks_scan_result_finish(&r2);
    /* Another report mode or a smaller max_hits: the same entry serves
     * what the mode asks for, cut at max_hits like a scan. */
    scan(c, cat, &vb, 1, VKS_REPORT_FIRST, 0, &r2);
    check(ref, &r2, 0, a, sizeof(a), SCAN_FIRST); /* another key: scanned */
    vks_scan_result_finish(&r2);
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 5, &r2);
    ck_assert_uint_eq(tel_of(&r2, "cache_hits"), 1);
    ck_assert_uint_eq(r2.n_hits, 5);
    ck_assert(r2.buffers[0].truncated);
    for (uint32_t i = 0; i < 5; i++)
        ck_assert(r2.hits[i].end == r1.hits[i].end && r2.hits[i].rule == r1.hits[i].rule);
    vks_scan_result_finish(&r2);
    vks_scan_result_finish(&r1);
    /* Same size, new content, the old mtime. */
    ck_assert_int_eq(pwrite(fd, b, sizeof(b), 0), (ssize_t)sizeof(b));
    set_mtime(fd, -3600);
    for (int i = 0; i < 2; i++) {
        scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &r1);
        check(ref, &r1, 0, b, sizeof(b), SCAN_ALL);
        ck_assert_msg(tel_of(&r1, "cache_hits") == 0, "scan %d of a just-changed file was cached",
                      i);
        vks_scan_result_finish(&r1);
    }
    /* An mtime in the future stays racy. */
    set_mtime(fd, 3600);
    age();
    for (int i = 0; i < 2; i++) {
        scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &r1);
        check(ref, &r1, 0, b, sizeof(b), SCAN_ALL);
        ck_assert_uint_eq(tel_of(&r1, "cache_hits"), 0);
        vks_scan_result_finish(&r1);
    }
    ck_assert_uint_eq(stat_of(c, "result_cache.hits"), 2);
    close(fd);
    catalog_destroy(ref);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* In a child running as uid `uid`, with the descriptor inherited: the same
 * file and rules as root's cached scan are scanned, not served from root's
 * entry; its own second scan is its own entry. A bit mask of failures. */
static int other_tenant_scan(const struct daemon *d, uid_t uid, int fd, uint64_t want_hits)
{
    if (setgid(uid) != 0 || setuid(uid) != 0)
        return 1;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 2;
    struct vks_rule vr[N_BOUNDED];
    for (size_t i = 0; i < N_BOUNDED; i++)
        vr[i] = (struct vks_rule){bounded[i].id,
                                  bounded[i].kind == RULE_LITERAL ? VKS_RULE_LITERAL
                                  : bounded[i].kind == RULE_HEX   ? VKS_RULE_HEX
                                                                  : VKS_RULE_REGEX,
                                  bounded[i].pattern, 0, bounded[i].flags};
    struct vks_catalog *cat = NULL;
    if (vks_client_catalog_load(c, vr, N_BOUNDED, NULL, &cat, NULL) != 0)
        return 4;
    struct vks_buffer vb = {.kind = VKS_BUFFER_FD, .fd = fd};
    int fail = 0;
    for (int i = 0; i < 2; i++) {
        struct vks_scan_result res = {0};
        if (vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, NULL, &res, NULL) != 0)
            return 8;
        const struct vks_stat *ch = vks_stat_find(res.telemetry, res.n_telemetry, "cache_hits");
        if (ch == NULL || ch->u != (uint64_t)i)
            fail |= 16 << i; /* the first is scanned, the second is its own entry */
        if (res.n_hits != want_hits)
            fail |= 64;
        vks_scan_result_finish(&res);
    }
    vks_catalog_destroy(cat);
    vks_client_close(c);
    return fail;
}

/* Tenant B never gets tenant A's cached results. */
START_TEST(test_cache_per_tenant)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_cache_per_tenant: needs root to switch uid; skipped\n");
        return;
    }
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2", "--socket-mode", "0666"));
    chmod(d.dir, 0755);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load(c, bounded, N_BOUNDED);
    static uint8_t a[8000];
    make_data(a, sizeof(a));
    int fd = temp_file(a, sizeof(a));
    set_mtime(fd, -3600);
    age();
    struct vks_buffer vb = {.kind = VKS_BUFFER_FD, .fd = fd};
    struct vks_scan_result res;
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    uint64_t n = res.n_hits;
    ck_assert_uint_gt(n, 0);
    vks_scan_result_finish(&res);
    scan(c, cat, &vb, 1, VKS_REPORT_ALL, 0, &res);
    ck_assert_uint_eq(tel_of(&res, "cache_hits"), 1); /* root's own entry */
    vks_scan_result_finish(&res);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0)
        _exit(other_tenant_scan(&d, 65534, fd, n));
    int st;
    waitpid(child, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "other tenant: mask %d", WEXITSTATUS(st));
    ck_assert_uint_eq(stat_of(c, "result_cache.entries"), 2);
    close(fd);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A flood of distinct files keeps the cache within result-cache-bytes:
 * old entries are evicted, the newest still serve rescans, and every reply
 * is right. */
START_TEST(test_cache_bounded)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2", "--result-cache-bytes", "16K"));
    struct vks_client *c = connect_ok(&d);
    static const struct rdef needle[] = {{"n", "needle", NULL, RULE_LITERAL}};
    struct vks_catalog *cat = load(c, needle, 1);
    enum { N_FILES = 240, PER_SCAN = 24 };
    int fds[N_FILES];
    for (int i = 0; i < N_FILES; i++) {
        char text[128];
        int len =
            snprintf(text, sizeof(text), "file %d: needle, %*s needle needle", i, i % 40, "x");
        fds[i] = temp_file((const uint8_t *)text, (size_t)len);
        set_mtime(fds[i], -3600);
    }
    age();
    for (int round = 0; round < 2; round++) {
        for (int f = 0; f < N_FILES; f += PER_SCAN) {
            struct vks_buffer vb[PER_SCAN];
            for (int k = 0; k < PER_SCAN; k++)
                vb[k] = (struct vks_buffer){.kind = VKS_BUFFER_FD, .fd = fds[f + k]};
            struct vks_scan_result res;
            scan(c, cat, vb, PER_SCAN, VKS_REPORT_ALL, 0, &res);
            ck_assert_uint_eq(res.n_hits, 3 * PER_SCAN);
            for (uint32_t k = 0; k < PER_SCAN; k++)
                ck_assert_uint_eq(hits_in(&res, k), 3);
            vks_scan_result_finish(&res);
            ck_assert_uint_le(stat_of(c, "result_cache.bytes"), 16384);
        }
    }
    ck_assert_uint_eq(stat_of(c, "result_cache.limit"), 16384);
    ck_assert_uint_gt(stat_of(c, "result_cache.evictions"), 0);
    ck_assert_uint_lt(stat_of(c, "result_cache.entries"), N_FILES);
    ck_assert_uint_ge(stat_of(c, "result_cache.inserts"), N_FILES);
    /* The newest are still there. */
    struct vks_buffer last = {.kind = VKS_BUFFER_FD, .fd = fds[N_FILES - 1]};
    struct vks_scan_result res;
    scan(c, cat, &last, 1, VKS_REPORT_ALL, 0, &res);
    ck_assert_uint_eq(tel_of(&res, "cache_hits"), 1);
    ck_assert_uint_eq(res.n_hits, 3);
    vks_scan_result_finish(&res);
    for (int i = 0; i < N_FILES; i++)
        close(fds[i]);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Runs `vkscan scan` on one file; returns its exit status. */
static int cli_scan(const struct daemon *d, const char *flags, const char *path)
{
    const char *cli = getenv("VKSCAN");
    ck_assert_msg(cli != NULL, "VKSCAN is not set: run through meson test");
    char cmd[768];
    snprintf(cmd, sizeof(cmd), "'%s' scan --socket '%s' -e needle %s '%s' >/dev/null", cli, d->sock,
             flags, path);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `cache: false` (vks_scan_options.no_cache, vkscan scan --no-cache) reads
 * and scans the file, neither using nor filling the cache; without it the
 * reply marks the buffers that came from the cache. */
START_TEST(test_cache_bypass)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2"));
    struct vks_client *c = connect_ok(&d);
    static const struct rdef needle[] = {{"n", "needle", NULL, RULE_LITERAL}};
    struct vks_catalog *cat = load(c, needle, 1);
    static const char text[] = "a needle, another needle";
    int fd = temp_file((const uint8_t *)text, sizeof(text) - 1);
    char path[64];
    snprintf(path, sizeof(path), "/tmp/vks-engine-cli-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    set_mtime(fd, -3600);
    age();
    struct vks_buffer vb[2] = {{.kind = VKS_BUFFER_FD, .fd = fd},
                               inline_buf((const uint8_t *)text, 8)};
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.no_cache = true;
    struct vks_error err = {0};
    struct vks_scan_result res;
    for (int i = 0; i < 2; i++) { /* a bypass does not fill it either */
        ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), vb, 2, &so, &res, &err),
                         0);
        ck_assert_uint_eq(res.n_hits, 3);
        ck_assert(!res.buffers[0].cached);
        ck_assert_uint_eq(tel_of(&res, "cache_hits"), 0);
        ck_assert_uint_eq(tel_of(&res, "batch_bytes"), sizeof(text) - 1 + 8);
        vks_scan_result_finish(&res);
    }
    ck_assert_uint_eq(stat_of(c, "result_cache.inserts"), 0);
    for (int i = 0; i < 2; i++) {
        scan(c, cat, vb, 2, VKS_REPORT_ALL, 0, &res);
        ck_assert_uint_eq(res.n_hits, 3);
        ck_assert(res.buffers[0].cached == (i == 1));
        ck_assert(!res.buffers[1].cached);
        ck_assert_uint_eq(res.buffers[0].bytes, sizeof(text) - 1);
        ck_assert_uint_eq(tel_of(&res, "cache_hits"), (uint64_t)i);
        vks_scan_result_finish(&res);
    }
    /* With the cache on, the second scan came from it: now bypass again. */
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), vb, 2, &so, &res, &err), 0);
    ck_assert(!res.buffers[0].cached);
    ck_assert_uint_eq(tel_of(&res, "bytes_not_scanned"), 0);
    vks_scan_result_finish(&res);
    ck_assert_uint_eq(stat_of(c, "result_cache.hits"), 1);
    /* The CLI: --no-cache twice leaves the counters alone; plain twice is one hit. */
    ck_assert_int_eq(cli_scan(&d, "--no-cache", path), 0);
    ck_assert_int_eq(cli_scan(&d, "--no-cache", path), 0);
    ck_assert_uint_eq(stat_of(c, "result_cache.hits"), 1);
    ck_assert_uint_eq(stat_of(c, "result_cache.inserts"), 1);
    ck_assert_int_eq(cli_scan(&d, "", path), 0);
    ck_assert_int_eq(cli_scan(&d, "", path), 0);
    ck_assert_uint_eq(stat_of(c, "result_cache.hits"), 2);
    unlink(path);
    close(fd);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A descriptor without read access (O_PATH, O_WRONLY) names the file but
 * not its bytes: it never gets the hits of a readable descriptor of the same
 * file in its batch, nor the result cache's; it fails with BAD_FD. */
START_TEST(test_unreadable_descriptor_gets_nothing)
{
    struct daemon d;
    daemon_start(&d, ARGS("--engine", "cpu", "--cpu-threads", "2"));
    struct vks_client *c = connect_ok(&d);
    static const struct rdef needle[] = {{"n", "needle", NULL, RULE_LITERAL}};
    struct vks_catalog *cat = load(c, needle, 1);
    char path[64];
    snprintf(path, sizeof(path), "/tmp/vks-engine-path-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("needle needle needle", f);
    fclose(f);
    int rd = open(path, O_RDONLY | O_CLOEXEC);
    int op = open(path, O_PATH | O_CLOEXEC);
    int wr = open(path, O_WRONLY | O_CLOEXEC);
    ck_assert(rd >= 0 && op >= 0 && wr >= 0);
    set_mtime(rd, -3600);
    age();
    struct vks_buffer vb[3] = {{.kind = VKS_BUFFER_FD, .fd = rd},
                               {.kind = VKS_BUFFER_FD, .fd = op},
                               {.kind = VKS_BUFFER_FD, .fd = wr}};
    struct vks_scan_result res;
    for (int round = 0; round < 2; round++) { /* the second: rd from the cache */
        scan(c, cat, vb, 3, VKS_REPORT_ALL, 0, &res);
        ck_assert_int_eq(res.buffers[0].code, 0);
        ck_assert(res.buffers[0].cached == (round == 1));
        ck_assert_uint_eq(hits_in(&res, 0), 3);
        for (uint32_t b = 1; b < 3; b++) {
            ck_assert_int_eq(res.buffers[b].code, -VKS_E_BAD_FD);
            ck_assert(!res.buffers[b].cached);
            ck_assert_uint_eq(hits_in(&res, b), 0);
        }
        ck_assert_uint_eq(tel_of(&res, "buffers_deduplicated"), 0);
        ck_assert_uint_eq(tel_of(&res, "cache_hits"), (uint64_t)round);
        vks_scan_result_finish(&res);
    }
    close(rd);
    close(op);
    close(wr);
    unlink(path);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Finalizes `a` with scan_hits_finalize and its copy `b` with the two-sort
 * reference, asserts they are equal (`tag`: the case, in the message), and
 * frees both. */
static void finalize_equals_sorting(struct scan_hits *a, struct scan_hits *b,
                                    const struct catalog *cat, int mode, uint32_t tag)
{
    scan_hits_finalize(a, cat, (enum scan_mode)mode);
    scan_hits_finalize_sorting(b, cat, (enum scan_mode)mode);
    ck_assert_uint_eq(a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
        ck_assert_msg(a->v[i].rule == b->v[i].rule && a->v[i].end == b->v[i].end &&
                          a->v[i].count == b->v[i].count,
                      "mode %d case %u entry %zu: (%u, %llu, %u) against the reference's "
                      "(%u, %llu, %u)",
                      mode, tag, i, a->v[i].rule, (unsigned long long)a->v[i].end, a->v[i].count,
                      b->v[i].rule, (unsigned long long)b->v[i].end, b->v[i].count);
    scan_hits_finish(a);
    scan_hits_finish(b);
}

static int cand_order(const void *a, const void *b)
{
    const struct refscan_cand *x = a, *y = b;
    if (x->nfa != y->nfa)
        return x->nfa < y->nfa ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* refscan_gate_sort: (nfa, end) order without repeats, as packed keys in
 * radix passes (lists of 48 and more) or by comparison; against qsort and
 * a dedup, for short and long lists, ends of up to 20 and 48 bits, group
 * numbers of up to 4 and 16 bits, and ends so wide that the keys do not
 * fit 64 bits (the comparison sort). */
START_TEST(test_gate_sort)
{
    static const size_t ns[] = {2, 47, 48, 1000, 50000};
    static const unsigned end_bits[] = {20, 48, 62}, nfa_bits[] = {4, 16, 16};
    for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
        for (size_t b = 0; b < 3; b++) {
            struct refscan_gate g = {0};
            size_t n = ns[a];
            struct refscan_cand *want = malloc(n * sizeof(*want));
            for (size_t i = 0; i < n; i++) {
                uint64_t end = (((uint64_t)rnd(1u << 30) << 32) | rnd(1u << 30)) &
                               (((uint64_t)1 << end_bits[b]) - 1);
                uint32_t nfa = rnd(1u << nfa_bits[b]);
                if (i > 0 && rnd(4) == 0) /* repeats */
                    nfa = want[i - 1].nfa, end = want[i - 1].end;
                want[i] = (struct refscan_cand){.nfa = nfa, .end = end};
                ck_assert_int_eq(refscan_gate_push(&g, nfa, end), 0);
            }
            qsort(want, n, sizeof(*want), cand_order);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (k == 0 || cand_order(&want[k - 1], &want[i]) != 0)
                    want[k++] = want[i];
            refscan_gate_sort(&g);
            ck_assert_uint_eq(g.n, k);
            for (size_t i = 0; i < k; i++)
                ck_assert_msg(g.v[i].nfa == want[i].nfa && g.v[i].end == want[i].end,
                              "n %zu case %zu: %zu is (%u, %llu), want (%u, %llu)", n, b, i,
                              g.v[i].nfa, (unsigned long long)g.v[i].end, want[i].nfa,
                              (unsigned long long)want[i].end);
            refscan_gate_finish(&g);
            free(want);
        }
    }
}
END_TEST

/* Long hit lists take scan_hits_finalize's radix path; it must give exactly
 * what the two-sort reference gives, in every mode, with duplicate
 * (rule, end) pairs and a single-match rule ("once"). */
START_TEST(test_finalize_radix_equals_sorting)
{
    struct catalog *cat = compile(bounded, N_BOUNDED);
    uint32_t n_rules = catalog_rule_count(cat);
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        for (uint32_t round = 0; round < 4; round++) {
            struct scan_hits a = {0}, b = {0};
            uint32_t n = 5000 + rnd(20000);
            uint64_t span = round == 3 ? 50 : 1u << (8 + 4 * round); /* dense to sparse */
            for (uint32_t i = 0; i < n; i++) {
                uint32_t rule = rnd(n_rules);
                uint64_t end = 1 + (uint64_t)rnd((uint32_t)span) * (round == 2 ? 4096 : 1);
                ck_assert_int_eq(scan_hits_push(&a, rule, end, 1), 0);
                if (rnd(4) == 0) /* an exact duplicate */
                    ck_assert_int_eq(scan_hits_push(&a, rule, end, 1), 0);
            }
            for (size_t i = 0; i < a.n; i++)
                ck_assert_int_eq(scan_hits_push(&b, a.v[i].rule, a.v[i].end, 1), 0);
            ck_assert_uint_ge(a.n, 4096); /* the radix path's threshold */
            finalize_equals_sorting(&a, &b, cat, mode, round);
        }
    }
    catalog_destroy(cat);
}
END_TEST

/* Lists of mode `all` against a catalog without single-match rules take
 * scan_hits_finalize's packed-key path without a reporter (finalize_keys),
 * other modes the sorting path below 4,096 hits and the reporter above; in
 * every mode, at the lengths where the way changes (1, 2, the insertion
 * sort's 47 and 48, the stack's 256 and 257, the reporter's 4,095 and
 * 4,096), with repeats, it must give what the two-sort reference gives, and
 * an end too large to pack must fall back to the reference (and give the
 * same).
 * Fails when the packed path drops a distinct hit, keeps a repeat, or
 * orders by rule first. */
START_TEST(test_finalize_plain_equals_sorting)
{
    struct catalog *cat = compile(unbounded, sizeof(unbounded) / sizeof(unbounded[0]));
    static const uint32_t lens[] = {1, 2, 47, 48, 200, 256, 257, 1000, 4095, 4096, 6000};
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            for (int huge = 0; huge < 2; huge++) {
                struct scan_hits a = {0}, b = {0};
                uint32_t span = lens[li] < 64 ? 16 : lens[li];
                while (a.n < lens[li]) {
                    uint64_t end = 1 + rnd(span);
                    if (huge && a.n == 0)
                        end = (uint64_t)1 << 41; /* over the packed keys' end bits */
                    ck_assert_int_eq(scan_hits_push(&a, rnd(2), end, 1), 0);
                    if (rnd(3) == 0 && a.n < lens[li]) /* an exact repeat */
                        ck_assert_int_eq(scan_hits_push(&a, a.v[a.n - 1].rule, end, 1), 0);
                }
                for (size_t i = 0; i < a.n; i++)
                    ck_assert_int_eq(scan_hits_push(&b, a.v[i].rule, a.v[i].end, 1), 0);
                finalize_equals_sorting(&a, &b, cat, mode, lens[li]);
            }
        }
    }
    catalog_destroy(cat);
}
END_TEST

/* ---- gated bit-NFA groups (rules/factor.h) ---------------------------- */

static const struct rdef gated[] = {
    {"key", "\\bkey[^\\n]{0,60}end", NULL, RULE_REGEX},
    {"tok", "tok(?:en|EN)[a-z0-9]{8,20}\\b", "i", RULE_REGEX},
    {"sec", "\\Bsecret\\w{4,40}", NULL, RULE_REGEX},
    {"alt", "(?:abc|xyz)[0-9]{2,30}Q", "H", RULE_REGEX},
    {"eol", "[0-9]{3,9}zzq$", "m", RULE_REGEX},
};
#define N_GATED (sizeof(gated) / sizeof(gated[0]))

/* Factors planted often, close together and at both ends of the buffer. */
static void make_gated_data(uint8_t *buf, size_t len)
{
    static const char alpha[] = "aZ09_ x-\n7Qb";
    static const char *const plants[] = {
        "key",     "end",       "token",     "TOKEN",      "xsecret",         "abc",
        "xyz",     "zzq\n",     "123456789", " key = end", "Token0123abcd9 ", "_secretword",
        "xyz123Q", "12345zzq\n"};
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    memcpy(buf, "xyz12Q", 6);
    memcpy(buf + len - 3, "key", 3);
    for (size_t p = 6; p + 16 < len - 3; p += 1 + rnd(50)) {
        const char *s = plants[rnd(14)];
        memcpy(buf + p, s, strlen(s));
    }
}

static int engine_push(void *ctx, uint32_t rule, uint64_t end)
{
    return scan_hits_push(ctx, rule, end, 1);
}

/* Every group walked in full, as before factors: the reference. */
static void full_walk(const struct catalog *cat, const uint8_t *buf, size_t len,
                      enum scan_mode mode, struct scan_hits *out)
{
    for (uint32_t g = 0; g < catalog_group_count(cat); g++)
        ck_assert_int_eq(refscan_group_range(cat, g, buf, len, 0, 0, len, engine_push, out), 0);
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++)
        ck_assert_int_eq(refscan_nfa_range(cat, g, buf, len, 0, 0, len, engine_push, out), 0);
    scan_hits_finalize(out, cat, mode);
}

/* Segments of gated catalogs equal refscan_buffer, which equals walking
 * every group in full; _i 1: every rule forced onto the bit-NFA engine. */
START_TEST(test_gated_segments)
{
    struct catalog *cat = compile_with(gated, N_GATED, _i == 1);
    uint32_t n_gated = 0;
    for (uint32_t g = 0; g < catalog_nfa_count(cat); g++) {
        struct catalog_nfa cn;
        catalog_nfa(cat, g, &cn);
        n_gated += (cn.flags & CAT_GF_GATED) != 0;
    }
    ck_assert_uint_ge(n_gated, 1);
    ck_assert_uint_ne(cpuscan_lookback(cat), CPUSCAN_UNSEGMENTABLE);
    static uint8_t buf[6000];
    make_gated_data(buf, sizeof(buf));
    static const size_t segs[] = {1, 5, 7, 64, 1000};
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0}, full = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, sizeof(buf), (enum scan_mode)mode, &want), 0);
        full_walk(cat, buf, sizeof(buf), (enum scan_mode)mode, &full);
        ck_assert_uint_ge(want.n, 4);
        assert_same(&want, &full, "gated refscan_buffer vs full walks");
        /* with the plan's fast paths (gated groups windowed), and without
         * (left FULL: walked around the catalog's factor ends, which must
         * reach back by the gated groups' longest match) */
        for (int fast = 1; fast >= 0; fast--) {
            cpuplan_set_fast(fast);
            for (size_t s = 0; s < sizeof(segs) / sizeof(segs[0]); s++) {
                struct scan_hits got = {0};
                uint64_t dropped = 0;
                segmented(cat, buf, sizeof(buf), segs[s], 1 + (int)(s % 2), (enum scan_mode)mode, 0,
                          UINT64_MAX, &got, &dropped);
                char what[80];
                snprintf(what, sizeof(what), "gated, fast %d, mode %d segments of %zu", fast, mode,
                         segs[s]);
                assert_same(&got, &want, what);
                scan_hits_finish(&got);
            }
        }
        cpuplan_set_fast(true);
        scan_hits_finish(&want);
        scan_hits_finish(&full);
    }
    catalog_destroy(cat);
}
END_TEST

/* `rules` compiled with every rule of selective factors gated
 * (gate_states 1), all on the bit-NFA when `bitnfa`; some group must be
 * forward-confirmed. */
static struct rules_result compile_confirmed(const struct rdef *rules, size_t n, bool bitnfa)
{
    struct rule_src src[16];
    ck_assert_uint_le(n, 16);
    for (size_t i = 0; i < n; i++) {
        uint32_t f = 0;
        if (rules[i].flags != NULL)
            ck_assert_int_eq(rules_parse_flags(rules[i].flags, strlen(rules[i].flags), &f, NULL),
                             0);
        src[i] = (struct rule_src){
            rules[i].id, rules[i].kind, rules[i].pattern, strlen(rules[i].pattern), f, 0};
    }
    struct rules_result res = {0};
    struct rules_options ro = {.force_bitnfa = bitnfa, .gate_states = 1};
    ck_assert_int_eq(rules_compile(src, n, &ro, &res, NULL), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    uint32_t confirm = 0;
    for (uint32_t g = 0; g < catalog_nfa_count(res.catalog); g++) {
        struct catalog_nfa cn;
        catalog_nfa(res.catalog, g, &cn);
        confirm += (cn.flags & CAT_GF_CONFIRM) != 0;
    }
    ck_assert_uint_ge(confirm, 1);
    return res;
}

/* Unbounded rules gated by forward confirmation (CAT_GF_CONFIRM), every
 * rule with selective factors gated (gate_states 1: their DFAs are small,
 * so the default would keep them DFAs): the CPU engine's scan ==
 * refscan_buffer == every group walked in full, in every mode. _i 1: every
 * rule forced onto the bit-NFA. */
START_TEST(test_confirm_segments)
{
    static const struct rdef rules[] = {
        {"fwd", "\\bkey[a-z ]*=[0-9]+", NULL, RULE_REGEX},
        /* not `[a-z]+token`, which the compiler cuts to `[a-z]token` */
        {"lead", "[a-z][a-z]*token[a-z]*", NULL, RULE_REGEX},
        {"mid", "x[0-9]{1,5}xyz[^\\n]*Q", "m", RULE_REGEX},
        {"end", "secret\\w+$", "mi", RULE_REGEX},
        {"one", "abc[^#]*zzq", "H", RULE_REGEX},
        {"lit", "12345", NULL, RULE_LITERAL},
    };
    struct rules_result res = compile_confirmed(rules, sizeof(rules) / sizeof(rules[0]), _i == 1);
    /* unbounded groups: the daemon scans such a catalog as one segment */
    ck_assert_uint_eq(cpuscan_lookback(res.catalog), CPUSCAN_UNSEGMENTABLE);
    static uint8_t buf[6000];
    make_gated_data(buf, sizeof(buf));
    static const size_t segs[] = {sizeof(buf)};
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0}, full = {0};
        ck_assert_int_eq(refscan_buffer(res.catalog, buf, sizeof(buf), (enum scan_mode)mode, &want),
                         0);
        full_walk(res.catalog, buf, sizeof(buf), (enum scan_mode)mode, &full);
        ck_assert_uint_ge(want.n, 4);
        assert_same(&want, &full, "confirmed refscan_buffer vs full walks");
        for (size_t k = 0; k < sizeof(segs) / sizeof(segs[0]); k++) {
            struct scan_hits got = {0};
            uint64_t dropped = 0;
            segmented(res.catalog, buf, sizeof(buf), segs[k], 1, (enum scan_mode)mode, 0,
                      UINT64_MAX, &got, &dropped);
            assert_same(&got, &want, "confirmed, CPU engine");
            scan_hits_finish(&got);
        }
        scan_hits_finish(&want);
        scan_hits_finish(&full);
    }
    rules_result_finish(&res);
}
END_TEST

/* ---- the CPU fast paths (rules/cpulit.c, rules/cpuplan.c) -------------- */

/* Letters with both cases, a newline and binary bytes: caseless matches,
 * overlaps and nested strings are common. */
static const uint8_t lit_alpha[] = {'a', 'b', 'A', 'B', 'c', 0x00, 0xff, '\n', 'Z', 'z'};

struct lit_hit {
    uint32_t id;
    uint64_t end;
};

struct lit_hits {
    struct lit_hit v[40000];
    size_t n;
};

static int lit_push(void *ctx, uint32_t id, uint64_t end)
{
    struct lit_hits *h = ctx;
    ck_assert_uint_lt(h->n, 40000);
    h->v[h->n++] = (struct lit_hit){id, end};
    return 0;
}

/* Entry e occurs at s (its caseless letters in either case). */
static bool lit_at(const struct cpulit_entry *e, const uint8_t *buf, size_t len, size_t s)
{
    if (s + e->len > len)
        return false;
    for (uint32_t k = 0; k < e->len; k++) {
        uint8_t t = buf[s + k];
        if (t != e->bytes[k] && !(e->fold[k] && (t | 0x20) == e->bytes[k]))
            return false;
    }
    return true;
}

/* Random strings of min_len..20 bytes, some copies, prefixes and suffixes
 * of others, caseless letters at random; ids are input order. `max` over
 * 4096: exactly max strings. */
static size_t random_lits(struct cpulit_entry *v, uint8_t (*b)[20], uint8_t (*m)[20], size_t max,
                          uint32_t min_len)
{
    size_t n = max > 4096 ? max : 1 + rnd((uint32_t)max);
    for (size_t i = 0; i < n; i++) {
        uint32_t len = min_len + rnd((rnd(3) == 0 ? 20 : 9) - min_len + 1);
        len = len > 20 ? 20 : len;
        size_t from = i > 0 && rnd(3) == 0 ? rnd((uint32_t)i) : i;
        for (uint32_t k = 0; k < len; k++) {
            uint8_t c =
                from != i && k < v[from].len ? b[from][k] : lit_alpha[rnd(sizeof(lit_alpha))];
            if (from != i && rnd(2) == 0 && len <= v[from].len) /* a suffix instead */
                c = b[from][v[from].len - len + k];
            bool fold = c >= 'a' && c <= 'z' && rnd(2) == 0;
            if (c >= 'A' && c <= 'Z' && rnd(2) == 0) {
                c |= 0x20;
                fold = true;
            }
            b[i][k] = c;
            m[i][k] = fold ? 0x20 : 0;
        }
        v[i] = (struct cpulit_entry){b[i], m[i], len, (uint32_t)i, 0};
    }
    return n;
}

/* The matcher against a byte-by-byte search, for random sets (strings of
 * 1 to 20 bytes, so every filter width; both strides), windows and buffer
 * edges. */
START_TEST(test_cpulit_equals_naive)
{
    static uint8_t b[5000][20], m[5000][20];
    static struct cpulit_entry v[5000];
    static struct lit_hits got, want;
    uint32_t strides = 0;
    for (int round = 0; round < 40; round++) {
        size_t max = round < 14 ? 12 : round < 36 ? 200 : 5000;
        size_t n = random_lits(v, b, m, max, round < 28 ? 1 : 6);
        struct cpulit *lit;
        ck_assert_int_eq(cpulit_create(v, n, &lit), 0);
        strides |= 1u << cpulit_stride(lit);
        size_t len = 1 + rnd(round < 36 ? 3000 : 600);
        uint8_t *buf = malloc(len); /* exactly len: ASan sees a read past it */
        for (size_t i = 0; i < len; i++)
            buf[i] = lit_alpha[rnd(sizeof(lit_alpha))];
        for (size_t p = 0; p < len; p += 1 + rnd(40)) {
            const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
            for (uint32_t k = 0; k < e->len && p + k < len; k++)
                buf[p + k] = e->fold[k] && rnd(2) ? e->bytes[k] ^ 0x20 : e->bytes[k];
        }
        for (int w = 0; w < 6; w++) {
            size_t begin = w == 0 ? 0 : rnd((uint32_t)len);
            uint64_t hi = w < 2 ? len : begin + rnd((uint32_t)(len - begin + 1));
            uint64_t lo = w < 2 ? 0 : begin + rnd(30);
            got.n = want.n = 0;
            ck_assert_int_eq(cpulit_scan(lit, buf, len, begin, lo, hi, lit_push, &got), 0);
            for (size_t s = begin; s < hi; s++)
                for (size_t i = 0; i < n; i++)
                    if (lit_at(&v[i], buf, hi, s) && s + v[i].len > lo)
                        lit_push(&want, v[i].id, s + v[i].len);
            ck_assert_msg(got.n == want.n, "round %d window %d: %zu hits, naive %zu", round, w,
                          got.n, want.n);
            for (size_t i = 0; i < want.n; i++)
                ck_assert_msg(got.v[i].id == want.v[i].id && got.v[i].end == want.v[i].end,
                              "round %d window %d hit %zu: (%u,%llu), naive (%u,%llu)", round, w, i,
                              got.v[i].id, (unsigned long long)got.v[i].end, want.v[i].id,
                              (unsigned long long)want.v[i].end);
        }
        free(buf);
        cpulit_destroy(lit);
    }
    ck_assert_uint_eq(strides, 6); /* both strides ran */
    ck_assert_int_eq(cpulit_create(v, 0, &(struct cpulit *){NULL}), -EINVAL);
    v[0].len = 0;
    ck_assert_int_eq(cpulit_create(v, 1, &(struct cpulit *){NULL}), -EINVAL);
}
END_TEST

/* Strings that share their first bytes in crowds, as phrases do (`the`
 * heads hundreds of them): the confirmation table splits those slots by
 * longer prefixes, again where the crowd goes on (rules/cpulit.c
 * split_slot). Against the byte-by-byte search, hits in order (equal
 * starts in entry order, which the split's sort must keep), with
 * caseless letters; _i 1: CPULIT_ONCE strings sharing ids, where the
 * shorter of two matching at one end reports. */
START_TEST(test_cpulit_split_slots)
{
    static const char *const heads[] = {"the a", "the h", "the ho", "and", "of"};
    static const char words[] = "abAhoz e";
    static uint8_t b[600][20], m[600][20];
    static struct cpulit_entry v[600];
    static struct lit_hits got, want;
    size_t n = 0;
    while (n < 600) {
        const char *h = heads[rnd(5)];
        uint32_t len = (uint32_t)strlen(h), extra = 1 + rnd(9);
        for (uint32_t k = 0; k < len; k++)
            b[n][k] = (uint8_t)h[k];
        for (uint32_t k = 0; k < extra; k++)
            b[n][len + k] = (uint8_t)words[rnd(sizeof(words) - 1)];
        len += extra;
        for (uint32_t k = 0; k < len; k++) {
            bool letter = b[n][k] >= 'a' && b[n][k] <= 'z';
            m[n][k] = letter && rnd(3) == 0 ? 0x20 : 0;
        }
        bool dup = false; /* equal strings of one id: which reports is open */
        for (size_t o = 0; o < n && !dup; o++)
            dup = v[o].len == len && memcmp(b[o], b[n], len) == 0;
        if (dup)
            continue;
        /* _i 1: ids shared by pairs of strings, one the other's suffix
         * now and then (both match at one end) */
        uint32_t id = _i == 1 ? (uint32_t)n / 2 : (uint32_t)n;
        v[n] = (struct cpulit_entry){b[n], m[n], len, id, _i == 1 ? CPULIT_ONCE : 0};
        n++;
    }
    struct cpulit *lit;
    ck_assert_int_eq(cpulit_create(v, n, &lit), 0);
    ck_assert_uint_eq(cpulit_min_len(lit), 3);
    /* `the` (by 6 bytes), `the ho` (by 7), `and` (by 4) */
    ck_assert_uint_ge(cpulit_split_slots(lit), 3);
    size_t len = 20000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)words[rnd(sizeof(words) - 1)];
    for (size_t p = 0; p + 20 < len; p += 1 + rnd(12)) {
        const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
        for (uint32_t k = 0; k < e->len; k++)
            buf[p + k] = e->fold[k] && rnd(2) ? e->bytes[k] ^ 0x20 : e->bytes[k];
    }
    got.n = want.n = 0;
    ck_assert_int_eq(cpulit_scan(lit, buf, len, 0, 0, len, lit_push, &got), 0);
    for (size_t s = 0; s < len; s++)
        for (size_t i = 0; i < n; i++) {
            if (!lit_at(&v[i], buf, len, s))
                continue;
            bool yields = false; /* a shorter string of its id ends there too */
            for (size_t o = 0; _i == 1 && o < n && !yields; o++)
                yields = o != i && v[o].id == v[i].id && v[o].len < v[i].len &&
                         lit_at(&v[o], buf, len, s + v[i].len - v[o].len);
            if (!yields)
                lit_push(&want, v[i].id, s + v[i].len);
        }
    ck_assert_uint_ge(want.n, 1000);
    ck_assert_uint_eq(got.n, want.n);
    for (size_t i = 0; i < want.n; i++)
        ck_assert_msg(got.v[i].id == want.v[i].id && got.v[i].end == want.v[i].end,
                      "hit %zu: (%u,%llu), naive (%u,%llu)", i, got.v[i].id,
                      (unsigned long long)got.v[i].end, want.v[i].id,
                      (unsigned long long)want.v[i].end);
    free(buf);
    cpulit_destroy(lit);
}
END_TEST

/* rules_options.literal_group for compile_ids (0: automatic). */
static int literal_mode;

/* Compiles owned patterns; flags as letters; rule i's id is "r<id[i]>"
 * (id NULL: "r<i>"). */
static struct catalog *compile_ids(char **pat, const char **flags, enum rule_kind *kind,
                                   const uint32_t *id, size_t n, bool bitnfa)
{
    struct rule_src *src = calloc(n, sizeof(*src));
    char(*ids)[24] = calloc(n, 24);
    for (size_t i = 0; i < n; i++) {
        uint32_t f = 0;
        ck_assert_int_eq(rules_parse_flags(flags[i], strlen(flags[i]), &f, NULL), 0);
        snprintf(ids[i], 24, "r%u", id != NULL ? id[i] : (uint32_t)i);
        src[i] = (struct rule_src){ids[i], kind[i], pat[i], strlen(pat[i]), f, 0};
    }
    struct rules_result res = {0};
    struct rules_options ro = {.force_bitnfa = bitnfa,
                               .gate_bits = UINT32_MAX, /* as chosen */
                               .literal_group = literal_mode};
    ck_assert_int_eq(rules_compile(src, n, &ro, &res, NULL), 0);
    ck_assert_uint_eq(res.n_rejects, 0);
    struct catalog *cat = res.catalog;
    res.catalog = NULL;
    rules_result_finish(&res);
    free(src);
    free(ids);
    return cat;
}

static struct catalog *compile_src(char **pat, const char **flags, enum rule_kind *kind, size_t n,
                                   bool bitnfa)
{
    return compile_ids(pat, flags, kind, NULL, n, bitnfa);
}

/* Segmented scans (segments of segs[0..nsegs) bytes) on 1-3 threads, every
 * mode, equal refscan_buffer. */
static void segs_equal_refscan(const struct catalog *cat, const uint8_t *buf, size_t len,
                               const char *what, const size_t *segs, size_t nsegs)
{
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0};
        ck_assert_int_eq(refscan_buffer(cat, buf, len, (enum scan_mode)mode, &want), 0);
        ck_assert_uint_ge(want.n, mode == SCAN_ALL ? 5 : 2);
        for (size_t s = 0; s < nsegs; s++) {
            struct scan_hits got = {0};
            uint64_t dropped = 0;
            segmented(cat, buf, len, segs[s], 1 + (int)(s % 3), (enum scan_mode)mode, 0, UINT64_MAX,
                      &got, &dropped);
            char msg[96];
            snprintf(msg, sizeof(msg), "%s, mode %d segments of %zu", what, mode, segs[s]);
            assert_same(&got, &want, msg);
            scan_hits_finish(&got);
        }
        if (mode == SCAN_ALL) { /* a limit keeps refscan's prefix */
            struct scan_hits got = {0};
            uint64_t dropped = 0;
            segmented(cat, buf, len, 700, 2, SCAN_ALL, 7, 7, &got, &dropped);
            struct scan_hits prefix = want;
            prefix.n = want.n < 7 ? want.n : 7;
            assert_same(&got, &prefix, what);
            scan_hits_finish(&got);
        }
        scan_hits_finish(&want);
    }
}

/* segs_equal_refscan with segments of 1 byte to the whole buffer (1 MiB). */
static void fast_equals_refscan(const struct catalog *cat, const uint8_t *buf, size_t len,
                                const char *what)
{
    static const size_t segs[] = {1, 3, 17, 500, 4096, 1u << 20};
    segs_equal_refscan(cat, buf, len, what, segs, sizeof(segs) / sizeof(segs[0]));
}

/* Random literal rules (binary bytes as \xHH, caseless, single-match,
 * nested and repeated strings): every group takes the literal path, and
 * segmented scans equal refscan. _i 1: bit-NFA groups. */
START_TEST(test_literal_groups_equal_refscan)
{
    static uint8_t b[200][20], m[200][20];
    static struct cpulit_entry v[200];
    for (int round = 0; round < 3; round++) {
        size_t n = 0;
        while (n < 3) { /* strings of 3 bytes and more */
            n = random_lits(v, b, m, 120, 1);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (v[i].len >= 3)
                    v[k++] = v[i];
            n = k;
        }
        char **pat = calloc(n, sizeof(*pat));
        const char **flags = calloc(n, sizeof(*flags));
        enum rule_kind *kind = calloc(n, sizeof(*kind));
        for (size_t i = 0; i < n; i++) {
            pat[i] = calloc(v[i].len * 4 + 1, 1);
            bool ci = false;
            for (uint32_t k = 0; k < v[i].len; k++) {
                sprintf(pat[i] + 4 * k, "\\x%02x", v[i].bytes[k]);
                ci |= v[i].fold[k] != 0;
            }
            kind[i] = RULE_REGEX;
            flags[i] = ci ? (i % 5 == 0 ? "iH" : "i") : (i % 7 == 0 ? "H" : "");
            for (uint32_t k = 0; ci && k < v[i].len; k++)
                m[i][k] = v[i].bytes[k] >= 'a' && v[i].bytes[k] <= 'z' ? 0x20 : 0;
        }
        struct catalog *cat = compile_src(pat, flags, kind, n, _i == 1);
        struct cpuplan *plan;
        ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
        uint32_t factor_groups = 0;
        for (uint32_t g = 0; g < plan->n_dfa; g++) {
            struct catalog_group cg;
            catalog_group(cat, g, &cg);
            factor_groups += (cg.flags & CAT_GF_FACTOR) != 0;
        }
        ck_assert_uint_eq(plan->n_lit_groups, plan->n_dfa + plan->n_nfa - factor_groups);
        ck_assert(!plan->gated_full);
        ck_assert_ptr_nonnull(plan->lit);
        cpuplan_put(plan);
        size_t len = 30000;
        uint8_t *buf = malloc(len);
        for (size_t i = 0; i < len; i++)
            buf[i] = lit_alpha[rnd(sizeof(lit_alpha))];
        for (size_t p = 0; p < len; p += 1 + rnd(60)) {
            const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
            for (uint32_t k = 0; k < e->len && p + k < len; k++)
                buf[p + k] = m[e - v][k] && rnd(2) ? e->bytes[k] ^ 0x20 : e->bytes[k];
        }
        memcpy(buf, v[0].bytes, v[0].len); /* at both ends */
        memcpy(buf + len - v[1 % n].len, v[1 % n].bytes, v[1 % n].len);
        fast_equals_refscan(cat, buf, len, "literals");
        free(buf);
        catalog_destroy(cat);
        for (size_t i = 0; i < n; i++)
            free(pat[i]);
        free(pat);
        free(flags);
        free(kind);
    }
}
END_TEST

/* Regexes with factors (counted classes, alternations, caseless, \b, ^,
 * $, multi-line): every group walked in windows only, equal to refscan.
 * _i 1: gated bit-NFA groups, which the plan compiles again as DFA groups
 * (its shadow catalog) and walks in windows. */
START_TEST(test_window_groups_equal_refscan)
{
    static char *const pats[] = {
        "abc[0-9]{2,4}xyz",
        "qqa[a-z]{0,6}bcd",
        "pre(mid|zqmid|midx)suf",
        "\\bwor[a-z]{2,5}d\\b",
        "beef[0-9a-f]{4}cafe",
        "^star[a-z]?t",
        "en[dx]d$",
        "abq.{0,3}cd",
        "^line",
        "x[yz]\\s?q",
    };
    static const char *flags[] = {"", "", "", "", "i", "", "", "H", "m", ""};
    enum rule_kind kind[10];
    for (int i = 0; i < 10; i++)
        kind[i] = RULE_REGEX;
    struct catalog *cat = compile_src((char **)pats, flags, kind, 10, _i == 1);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    if (_i == 0) {
        ck_assert_uint_eq(plan->n_window_groups + plan->n_lit_groups, plan->n_nfa + plan->n_dfa);
    } else { /* gated bit-NFA groups: compiled again as DFA groups, windowed */
        uint32_t factor_groups = 0;
        for (uint32_t g = 0; g < plan->n_dfa; g++) {
            struct catalog_group cg;
            catalog_group(cat, g, &cg);
            factor_groups += (cg.flags & CAT_GF_FACTOR) != 0;
        }
        ck_assert_uint_ge(plan->n_shadow_groups, 1);
        ck_assert_uint_eq(plan->n_shadow_groups + plan->n_window_groups + plan->n_lit_groups,
                          plan->n_dfa + plan->n_nfa - factor_groups);
        ck_assert_ptr_nonnull(plan->shadow);
        const struct cpuplan *sp = plan->shadow_plan;
        ck_assert_uint_eq(sp->n_window_groups, sp->n_dfa + sp->n_nfa);
    }
    cpuplan_put(plan);
    static const char *const plants[] = {
        "abc12xyz", "qqabcd",       "QQAxbcd",      "premidsuf", "prezqmidsuf", " word ",
        "worxyzd_", "BEEF12aFcafe", "beef0000CAFE", "start",     "\nend",       "exd\n",
        "abqxxcd",  "\nline",       "xyq",          "xz q",      "zzz"};
    static const char alpha[] = "abcdeqrstxyz0123 \nEF";
    size_t len = 30000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 16 < len; p += 1 + rnd(50)) {
        const char *x = plants[rnd(17)];
        memcpy(buf + p, x, strlen(x));
    }
    memcpy(buf, "start", 5);
    memcpy(buf + len - 4, "end", 3);
    buf[len - 1] = '\n';
    fast_equals_refscan(cat, buf, len, "windows");
    /* factors everywhere: more candidates than a segment keeps (4096),
     * so the window groups are walked in full */
    for (size_t p = 0; p + 8 <= len; p += 8)
        memcpy(buf + p, p % 24 == 0 ? "abc12xyz" : p % 24 == 8 ? "qqabcd x" : "abc1abc2", 8);
    fast_equals_refscan(cat, buf, len, "dense windows");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* The plan compiles gated groups again only when it can use the result
 * (rules/cpuplan.c, small_dfas_only): `dtf[A-Za-z0-9_-]{20,37}` has 40
 * positions but a DFA of over 16,384 states, which the compiler leaves
 * gated even without gating, so its group is not compiled again (it
 * was, for seconds, and thrown away); `uzv[a-f0-9]{32}[a-f0-9]{40}` has
 * counters adding up to 72 but a small DFA, so it is compiled again and
 * used. Hits equal refscan's either way. */
START_TEST(test_shadow_only_when_usable)
{
    static char *const usable[] = {"abc[0-9]{2,4}xyz", "uzv[a-f0-9]{32}[a-f0-9]{40}"};
    static char *const unusable[] = {"abc[0-9]{2,4}xyz", "dtf[A-Za-z0-9_-]{20,37}"};
    static const char *flags[] = {"", ""};
    enum rule_kind kind[] = {RULE_REGEX, RULE_REGEX};
    struct catalog *cat =
        compile_src(_i == 0 ? (char **)usable : (char **)unusable, flags, kind, 2, true);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    ck_assert_uint_ge(plan->n_nfa, 1);
    ck_assert_uint_eq(plan->n_shadow_compiled > 0, plan->n_shadow_groups > 0);
    if (_i == 0) {
        ck_assert_uint_eq(plan->n_shadow_compiled, 2);
        ck_assert_ptr_nonnull(plan->shadow);
    } else {
        ck_assert_uint_eq(plan->n_shadow_compiled, 0);
        ck_assert_ptr_null(plan->shadow);
        ck_assert_uint_ge(plan->n_window_groups, 1);
    }
    cpuplan_put(plan);
    static const char *const plants[] = {
        "abc12xyz", "dtfAb-_0123456789abcdefgh", "dtfdtfdtfdtfdtfdtfdtfdtfdtf",
        "uzv0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567"};
    static const char alpha[] = "abcdefxyz0123-_ \nDTF";
    size_t len = 30000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 80 < len; p += 1 + rnd(200)) {
        const char *x = plants[rnd(4)];
        memcpy(buf + p, x, strlen(x));
    }
    fast_equals_refscan(cat, buf, len, _i == 0 ? "usable shadow" : "no shadow");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

static int cmp_lit_hit(const void *a, const void *b)
{
    const struct lit_hit *x = a, *y = b;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* CPULIT_ONCE entries sharing ids (a third of the ids shared, suffixes,
 * copies and case variants of each other): each (id, end) once, exactly
 * the naive search's pairs; entries without the flag as before. */
START_TEST(test_cpulit_once)
{
    static uint8_t b[300][20], m[300][20];
    static struct cpulit_entry v[300];
    static struct lit_hits got, want;
    for (int round = 0; round < 40; round++) {
        size_t n = random_lits(v, b, m, 300, 1 + rnd(4));
        uint32_t nid = 1 + (uint32_t)n / 3;
        for (size_t i = 0; i < n; i++) {
            v[i].id = rnd(nid);
            v[i].flags = round % 4 == 3 && i % 5 == 0 ? 0 : CPULIT_ONCE;
        }
        struct cpulit *lit;
        ck_assert_int_eq(cpulit_create(v, n, &lit), 0);
        size_t len = 2000 + rnd(3000);
        uint8_t *buf = malloc(len);
        for (size_t i = 0; i < len; i++)
            buf[i] = lit_alpha[rnd(sizeof(lit_alpha))];
        for (size_t p = 0; p < len; p += 1 + rnd(20)) {
            const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
            for (uint32_t k = 0; k < e->len && p + k < len; k++)
                buf[p + k] = e->fold[k] && rnd(2) ? e->bytes[k] ^ 0x20 : e->bytes[k];
        }
        size_t begin = rnd(2) ? 0 : rnd(64);
        uint64_t lo = begin + rnd(40), hi = len - rnd(40);
        got.n = want.n = 0;
        ck_assert_int_eq(cpulit_scan(lit, buf, len, begin, lo, hi, lit_push, &got), 0);
        /* the naive pairs: ONCE entries' (id, end) once, others each */
        for (size_t s = begin; s < len; s++) {
            for (size_t i = 0; i < n; i++) {
                uint64_t end = s + v[i].len;
                if (end <= lo || end > hi || !lit_at(&v[i], buf, len, s))
                    continue;
                bool dup = false;
                for (size_t j = 0; j < want.n && (v[i].flags & CPULIT_ONCE); j++)
                    dup |= want.v[j].id == (v[i].id | 1u << 31) && want.v[j].end == end;
                if (!dup)
                    lit_push(&want, v[i].id | (v[i].flags & CPULIT_ONCE ? 1u << 31 : 0), end);
            }
        }
        for (size_t j = 0; j < want.n; j++)
            want.v[j].id &= ~(1u << 31);
        qsort(got.v, got.n, sizeof(*got.v), cmp_lit_hit);
        qsort(want.v, want.n, sizeof(*want.v), cmp_lit_hit);
        ck_assert_uint_eq(got.n, want.n);
        for (size_t j = 0; j < want.n; j++) {
            ck_assert_uint_eq(got.v[j].id, want.v[j].id);
            ck_assert_uint_eq(got.v[j].end, want.v[j].end);
        }
        free(buf);
        cpulit_destroy(lit);
    }
}
END_TEST

/* The colleague's case: a:needle12, b:zzzz, a:edle12 report as refscan
 * does, under rule 0 and once at 10 (the literal path gave (0, 10),
 * (2, 10), (2, 19)). */
START_TEST(test_shared_id_literals)
{
    static const struct rdef r[] = {{"a", "needle12", NULL, RULE_LITERAL},
                                    {"b", "zzzz", NULL, RULE_LITERAL},
                                    {"a", "edle12", NULL, RULE_LITERAL}};
    struct catalog *cat = compile(r, 3);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    ck_assert_uint_eq(plan->n_lit_groups, plan->n_dfa + plan->n_nfa);
    cpuplan_put(plan);
    const char *text = "xxneedle12yy edle12";
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0}, got = {0};
        uint64_t dropped = 0;
        ck_assert_int_eq(
            refscan_buffer(cat, (const uint8_t *)text, strlen(text), (enum scan_mode)mode, &want),
            0);
        ck_assert_uint_eq(want.n, mode == SCAN_ALL ? 2 : 1);
        ck_assert_uint_eq(want.v[0].rule, 0);
        segmented(cat, (const uint8_t *)text, strlen(text), 1u << 20, 1, (enum scan_mode)mode, 0,
                  UINT64_MAX, &got, &dropped);
        assert_same(&got, &want, "shared id");
        scan_hits_finish(&want);
        scan_hits_finish(&got);
    }
    catalog_destroy(cat);
}
END_TEST

/* Random literal rule sets whose rules share ids (a third of the ids
 * shared; suffixes, copies and case variants of each other; caseless and
 * single-match rules): the literal path equals refscan in every mode.
 * _i 1: bit-NFA groups. */
START_TEST(test_shared_id_groups_equal_refscan)
{
    static uint8_t b[200][20], m[200][20];
    static struct cpulit_entry v[200];
    for (int round = 0; round < 4; round++) {
        size_t n = 0;
        while (n < 6) {
            n = random_lits(v, b, m, 150, 3);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (v[i].len >= 3)
                    v[k++] = v[i];
            n = k;
        }
        char **pat = calloc(n, sizeof(*pat));
        const char **flags = calloc(n, sizeof(*flags));
        enum rule_kind *kind = calloc(n, sizeof(*kind));
        uint32_t *id = calloc(n, sizeof(*id));
        uint32_t nid = 1 + (uint32_t)n / 3;
        for (size_t i = 0; i < n; i++) {
            pat[i] = calloc(v[i].len * 4 + 1, 1);
            bool ci = false;
            for (uint32_t k = 0; k < v[i].len; k++) {
                sprintf(pat[i] + 4 * k, "\\x%02x", v[i].bytes[k]);
                ci |= v[i].fold[k] != 0;
            }
            kind[i] = RULE_REGEX;
            id[i] = rnd(nid);
            /* single-match by id: rules of one id have one set of flags' H */
            bool h = id[i] % 4 == 1;
            flags[i] = ci ? (h ? "iH" : "i") : (h ? "H" : "");
            for (uint32_t k = 0; ci && k < v[i].len; k++)
                m[i][k] = v[i].bytes[k] >= 'a' && v[i].bytes[k] <= 'z' ? 0x20 : 0;
        }
        struct catalog *cat = compile_ids(pat, flags, kind, id, n, _i == 1);
        struct cpuplan *plan;
        ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
        ck_assert_ptr_nonnull(plan->lit);
        ck_assert_uint_ge(plan->n_lit_groups, 1);
        cpuplan_put(plan);
        size_t len = 20000;
        uint8_t *buf = malloc(len);
        for (size_t i = 0; i < len; i++)
            buf[i] = lit_alpha[rnd(sizeof(lit_alpha))];
        for (size_t p = 0; p < len; p += 1 + rnd(40)) {
            const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
            for (uint32_t k = 0; k < e->len && p + k < len; k++)
                buf[p + k] = m[e - v][k] && rnd(2) ? e->bytes[k] ^ 0x20 : e->bytes[k];
        }
        fast_equals_refscan(cat, buf, len, "shared-id literals");
        free(buf);
        catalog_destroy(cat);
        for (size_t i = 0; i < n; i++)
            free(pat[i]);
        free(pat);
        free(flags);
        free(kind);
        free(id);
    }
}
END_TEST

/* Window groups and shadow groups (_i 1: gated bit-NFA groups compiled
 * again) whose rules share ids, some able to match at one end: refscan's
 * hits, under each id's first rule, once. */
START_TEST(test_shared_id_windows_equal_refscan)
{
    static char *const pats[] = {"abc[0-9]{2,4}xyz", "c[0-9]{2}xyz",        "qqa[a-z]{0,6}bcd",
                                 "a[a-z]{0,3}bcd",   "beef[0-9a-f]{4}cafe", "f[0-9a-f]{2}cafe",
                                 "pre(mid|zq)suf",   "x[yz]\\s?q"};
    static const char *flags[] = {"", "", "", "", "i", "i", "H", "H"};
    static const uint32_t id[] = {5, 1, 5, 2, 3, 3, 4, 4};
    enum rule_kind kind[8];
    for (int i = 0; i < 8; i++)
        kind[i] = RULE_REGEX;
    struct catalog *cat = compile_ids((char **)pats, flags, kind, id, 8, _i == 1);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    if (_i == 1)
        ck_assert_uint_ge(plan->n_shadow_groups, 1);
    else
        ck_assert_uint_ge(plan->n_window_groups + plan->n_lit_groups, 1);
    cpuplan_put(plan);
    static const char *const plants[] = {"abc12xyz", "abc123xyz",    "qqabcd",       "qqaxbcd",
                                         "axbcd",    "BEEF12aFcafe", "beef0000CAFE", "premidsuf",
                                         "prezqsuf", "xyq",          "xz q",         "c77xyz"};
    static const char alpha[] = "abcdeqrstxyz0123 \nEF";
    size_t len = 30000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 16 < len; p += 1 + rnd(50)) {
        const char *x = plants[rnd(12)];
        memcpy(buf + p, x, strlen(x));
    }
    fast_equals_refscan(cat, buf, len, "shared-id windows");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* Literal groups (CAT_GF_LITERAL, no DFA rows): random literal sets of
 * 4 to 20 bytes (binary, caseless, shared ids, single-match by id) compiled
 * as one literal group and as DFA groups: refscan over the literal group
 * equals refscan over the DFAs in every mode, and the CPU engine equals
 * both (fast_equals_refscan, segments and threads); the catalog holds one
 * group of one state. Also: automatic mode picks it for a large set only,
 * and a set with a regex never gets it. */
START_TEST(test_literal_group_kind)
{
    static uint8_t b[200][20], m[200][20];
    static struct cpulit_entry v[200];
    for (int round = 0; round < 4; round++) {
        size_t n = 0;
        while (n < 6) {
            n = random_lits(v, b, m, 150, 4);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (v[i].len >= 4)
                    v[k++] = v[i];
            n = k;
        }
        char **pat = calloc(n, sizeof(*pat));
        const char **flags = calloc(n, sizeof(*flags));
        enum rule_kind *kind = calloc(n, sizeof(*kind));
        uint32_t *id = calloc(n, sizeof(*id));
        uint32_t nid = round % 2 ? 1 + (uint32_t)n / 3 : (uint32_t)n;
        for (size_t i = 0; i < n; i++) {
            pat[i] = calloc(v[i].len * 4 + 1, 1);
            bool ci = false;
            for (uint32_t k = 0; k < v[i].len; k++) {
                sprintf(pat[i] + 4 * k, "\\x%02x", v[i].bytes[k]);
                ci |= v[i].fold[k] != 0;
            }
            kind[i] = RULE_REGEX;
            id[i] = round % 2 ? rnd(nid) : (uint32_t)i;
            bool h = id[i] % 5 == 1;
            flags[i] = ci ? (h ? "iH" : "i") : (h ? "H" : "");
            for (uint32_t k = 0; ci && k < v[i].len; k++)
                m[i][k] = v[i].bytes[k] >= 'a' && v[i].bytes[k] <= 'z' ? 0x20 : 0;
        }
        literal_mode = 1;
        struct catalog *lit = compile_ids(pat, flags, kind, id, n, false);
        literal_mode = -1;
        struct catalog *dfa = compile_ids(pat, flags, kind, id, n, false);
        literal_mode = 0;
        ck_assert_uint_eq(catalog_group_count(lit), 1);
        ck_assert_uint_eq(catalog_nfa_count(lit), 0);
        struct catalog_group cg;
        catalog_group(lit, 0, &cg);
        ck_assert_uint_eq(cg.flags, CAT_GF_LITERAL);
        ck_assert_uint_eq(cg.n_states, 1);
        ck_assert_uint_eq(cg.n_rules, n);
        catalog_group(dfa, 0, &cg);
        ck_assert_uint_eq(cg.flags & CAT_GF_LITERAL, 0);
        size_t wl, wd;
        catalog_words(lit, &wl);
        catalog_words(dfa, &wd);
        ck_assert_uint_lt(wl, wd);
        size_t len = 20000;
        uint8_t *buf = malloc(len);
        for (size_t i = 0; i < len; i++)
            buf[i] = lit_alpha[rnd(sizeof(lit_alpha))];
        for (size_t p = 0; p < len; p += 1 + rnd(40)) {
            const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
            for (uint32_t k = 0; k < e->len && p + k < len; k++)
                buf[p + k] = m[e - v][k] && rnd(2) ? e->bytes[k] ^ 0x20 : e->bytes[k];
        }
        for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
            struct scan_hits a = {0}, d = {0};
            ck_assert_int_eq(refscan_buffer(lit, buf, len, (enum scan_mode)mode, &a), 0);
            ck_assert_int_eq(refscan_buffer(dfa, buf, len, (enum scan_mode)mode, &d), 0);
            assert_same(&a, &d, "literal group vs DFA groups");
            scan_hits_finish(&a);
            scan_hits_finish(&d);
        }
        fast_equals_refscan(lit, buf, len, "literal group");
        cpuplan_set_fast(false); /* the plan without fast paths keeps them */
        fast_equals_refscan(lit, buf, len, "literal group, no fast paths");
        cpuplan_set_fast(true);
        free(buf);
        catalog_destroy(lit);
        catalog_destroy(dfa);
        for (size_t i = 0; i < n; i++)
            free(pat[i]);
        free(pat);
        free(flags);
        free(kind);
        free(id);
    }
    /* automatic: a small set keeps its DFA; a regex anywhere: DFAs */
    char *small[] = {"needle", "haystack", "x\\d+y"};
    const char *fl[] = {"", "", ""};
    enum rule_kind kd[] = {RULE_LITERAL, RULE_LITERAL, RULE_REGEX};
    struct catalog *c = compile_ids(small, fl, kd, NULL, 2, false);
    struct catalog_group cg;
    catalog_group(c, 0, &cg);
    ck_assert_uint_eq(cg.flags & CAT_GF_LITERAL, 0);
    catalog_destroy(c);
    literal_mode = 1;
    c = compile_ids(small, fl, kd, NULL, 3, false);
    literal_mode = 0;
    for (uint32_t g = 0; g < catalog_group_count(c); g++) {
        catalog_group(c, g, &cg);
        ck_assert_uint_eq(cg.flags & CAT_GF_LITERAL, 0);
    }
    catalog_destroy(c);
}
END_TEST

/* One plan per catalog, shared: the cache hands out the same one. */
/* ---- two-byte factors (rules/cpupair.c) and dense factors ----------------- */

/* Scans buf[begin..hi) with a matcher of pairs v[0..n) (ids below 8) and
 * checks the reports against a naive search: each (id, end) with lo < end
 * once, none else, in increasing end order. */
static void check_pairs(const struct cpulit_entry *v, size_t n, const uint8_t *buf, size_t len,
                        size_t begin, uint64_t lo, uint64_t hi, const char *what, int round)
{
    struct cpupair *pm;
    ck_assert_int_eq(cpupair_create(v, n, &pm), 0);
    static struct lit_hits got;
    got.n = 0;
    ck_assert_int_eq(cpupair_scan(pm, buf, len, begin, lo, hi, lit_push, &got), 0);
    size_t k = 0;
    for (size_t s = begin; s + 2 <= hi; s++) {
        if (s + 2 <= lo)
            continue;
        bool seen[8] = {false}; /* one report per (id, end) */
        for (size_t i = 0; i < n; i++) {
            if (!lit_at(&v[i], buf, len, s) || seen[v[i].id])
                continue;
            seen[v[i].id] = true;
            bool found = false;
            for (size_t j = 0; j < got.n; j++)
                found |= got.v[j].id == v[i].id && got.v[j].end == s + 2;
            ck_assert_msg(found, "%s round %d: pair %zu at %zu not reported", what, round, i, s);
            k++;
        }
    }
    ck_assert_msg(got.n == k, "%s round %d: %zu reports, %zu expected", what, round, got.n, k);
    for (size_t j = 1; j < got.n; j++)
        ck_assert_uint_le(got.v[j - 1].end, got.v[j].end);
    cpupair_destroy(pm);
}

/* The pair matcher against a naive search: random pairs over a
 * small alphabet (caseless letters among them, shared ids, repeats), random
 * windows and buffer edges; reports in increasing start order. */
START_TEST(test_cpupair_equals_naive)
{
    static const uint8_t alpha[] = {'a', 'B', 'q', 0x00, 0xff, 0x82, '\n', 0x7f};
    for (int round = 0; round < 20; round++) {
        uint8_t b[40][2], m[40][2];
        struct cpulit_entry v[40];
        size_t n = 1 + rnd(40);
        for (size_t i = 0; i < n; i++) {
            for (int k = 0; k < 2; k++) {
                uint8_t c = alpha[rnd(sizeof(alpha))];
                bool fold = (c | 0x20) >= 'a' && (c | 0x20) <= 'z' && rnd(2) == 0;
                b[i][k] = fold ? (uint8_t)(c | 0x20) : c;
                m[i][k] = fold ? 0x20 : 0;
            }
            v[i] = (struct cpulit_entry){b[i], m[i], 2, (uint32_t)rnd(8), 0};
        }
        uint8_t buf[600];
        size_t len = 2 + rnd(sizeof(buf) - 2);
        for (size_t i = 0; i < len; i++)
            buf[i] = alpha[rnd(sizeof(alpha))] ^ (rnd(4) == 0 ? 0x20 : 0);
        size_t begin = rnd((uint32_t)len);
        uint64_t lo = begin + rnd(4), hi = lo + rnd((uint32_t)(len - begin) + 1);
        hi = hi > len ? len : hi;
        check_pairs(v, n, buf, len, begin, lo, hi, "mixed", round);
    }
    /* what the plan takes as a factor */
    ck_assert(cpupair_rare(0x82, 0xb7) && cpupair_rare('M', 0x00) && cpupair_rare(0x01, 'a'));
    ck_assert(!cpupair_rare('a', 'b') && !cpupair_rare(0x00, 0x00) && !cpupair_rare('\n', ' '));
}
END_TEST

/* The pair matcher's skipping scan (cpupair_fast: every pair but at most
 * 8 holds a byte text seldom has): text with a few odd bytes, pairs
 * planted at random and next to the scan's 64-byte blocks' edges, runs of
 * binary that fill a block with candidates, up to 10 text-only pairs
 * (caseless ones count twice or four times) and random windows, against
 * the naive search; the AVX2 and SSE2 scans in turn. */
START_TEST(test_cpupair_fast_equals_naive)
{
    static const uint8_t odd[] = {0x00, 0x01, 0x1f, 0x7f, 0x80, 0x82, 0xb7, 0xff};
    static const uint8_t text[] = {'a', 'b', 'Q', 'z', ' ', '\n', '\t', '\r', '=', '3'};
    static uint8_t buf[5000];
    unsigned fast_rounds = 0;
    for (int round = 0; round < 200; round++) {
        uint8_t b[30][2], m[30][2];
        struct cpulit_entry v[30];
        size_t n_odd = rnd(20), n_text = rnd(round % 3 == 0 ? 11 : 5);
        size_t n = n_odd + n_text > 0 ? n_odd + n_text : 1;
        for (size_t i = 0; i < n; i++) {
            bool odd_pair = i < n_odd;
            int oddk = (int)rnd(2); /* which byte of an odd pair is odd */
            for (int k = 0; k < 2; k++) {
                uint8_t c = odd_pair && (k == oddk || rnd(3) == 0) ? odd[rnd(sizeof(odd))]
                                                                   : text[rnd(sizeof(text))];
                bool fold = (c | 0x20) >= 'a' && (c | 0x20) <= 'z' && rnd(3) == 0;
                b[i][k] = fold ? (uint8_t)(c | 0x20) : c;
                m[i][k] = fold ? 0x20 : 0;
            }
            v[i] = (struct cpulit_entry){b[i], m[i], 2, (uint32_t)rnd(8), 0};
        }
        size_t len = 2 + rnd(sizeof(buf) - 2);
        for (size_t i = 0; i < len; i++)
            buf[i] = text[rnd(sizeof(text))] ^ (rnd(8) == 0 ? 0x20 : 0);
        for (size_t i = 0, o = rnd(30); i < o; i++) /* a few odd bytes */
            buf[rnd((uint32_t)len)] = odd[rnd(sizeof(odd))];
        if (round % 4 == 1) /* a run of binary: dense blocks */
            for (size_t i = rnd((uint32_t)len), e = i + rnd(300); i < e && i < len; i++)
                buf[i] = (uint8_t)rnd(256);
        size_t begin = rnd((uint32_t)len);
        uint64_t lo = begin + rnd(4), hi = lo + rnd((uint32_t)(len - begin) + 1);
        hi = hi > len ? len : hi;
        size_t s0 = lo >= 1 && lo - 1 > begin ? lo - 1 : begin; /* the first start */
        for (size_t i = 0, pl = 2 + rnd(40); i < pl; i++) {     /* planted, some at block edges */
            const struct cpulit_entry *e = &v[rnd((uint32_t)n)];
            size_t at = rnd(3) == 0 ? s0 + 64 * rnd(80) + 62 + rnd(4) : rnd((uint32_t)len);
            if (at + 2 > len)
                continue;
            for (int k = 0; k < 2; k++)
                buf[at + k] = e->bytes[k] ^ (e->fold[k] && rnd(2) ? 0x20 : 0);
        }
        /* odd rounds: the SSE2 scan where the CPU has AVX2 */
        if (round % 2)
            setenv("VKS_NO_AVX2", "1", 1);
        else
            unsetenv("VKS_NO_AVX2");
        struct cpupair *pm;
        ck_assert_int_eq(cpupair_create(v, n, &pm), 0);
        fast_rounds += cpupair_fast(pm);
        cpupair_destroy(pm);
        check_pairs(v, n, buf, len, begin, lo, hi, "fast", round);
    }
    unsetenv("VKS_NO_AVX2");
#if defined(__SSE2__) /* elsewhere every scan is the plain one */
    ck_assert_uint_gt(fast_rounds, 100);
    ck_assert_uint_lt(fast_rounds, 200);
#else
    ck_assert_uint_eq(fast_rounds, 0);
#endif
}
END_TEST

/* Binary signatures whose only factors are two exact bytes (regexes and
 * hex strings with jumps, one caseless, one whose pairs are common text
 * and stays on the catalog's own gate): the pair matcher finds their
 * factors, their groups are walked in windows, and segmented scans equal
 * refscan. _i 1: bit-NFA groups (gated; the plan may compile them again
 * as DFAs, whose plan then holds the pairs). */
START_TEST(test_pair_factors_equal_refscan)
{
    static char *const pats[] = {
        "\\x82\\xb7.{5,30}\\x0e\\xee",
        "\\x7f\\x1a[a-z]{2,9}\\x39\\xbe",
        "c7 51 [3-13] 47 e3",
        "\\x01a.{0,4}zz\\x02",
        "ab.{3}cd",
        "\\xde\\xad(\\x01|\\x02)\\xbe\\xef",
    };
    static const char *flags[] = {"s", "", "", "is", "", ""};
    enum rule_kind kind[6] = {RULE_REGEX, RULE_REGEX, RULE_HEX, RULE_REGEX, RULE_REGEX, RULE_REGEX};
    struct catalog *cat = compile_src((char **)pats, flags, kind, 6, _i == 1);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    const struct cpuplan *holder = plan->pair != NULL ? plan : plan->shadow_plan;
    ck_assert_msg(holder != NULL && holder->pair != NULL, "no pair matcher");
    ck_assert_uint_ge(holder->n_window_groups, 1);
    cpuplan_put(plan);
    static const char *const plants[] = {"\x82\xb7"
                                         "abcde\n\x0e\xee",
                                         "\x7f\x1a"
                                         "abc\x39\xbe",
                                         "\xc7\x51"
                                         "0123456\x47\xe3",
                                         "\x01"
                                         "Ax"
                                         "zz\x02",
                                         "abxyzcd",
                                         "\xde\xad\x02\xbe\xef",
                                         "\x82\xb7\x0e\xee",
                                         "\x01"
                                         "azz\x02"};
    static const uint8_t alpha[] = {'a', 'b', 'z', 'c', 'd', ' ', '\n', 0x00, 0x82, 0xee, 0x01};
    size_t len = 40000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = alpha[rnd(sizeof(alpha))];
    for (size_t p = 0; p + 24 < len; p += 1 + rnd(80)) {
        const char *x = plants[rnd(8)];
        memcpy(buf + p, x, strlen(x));
    }
    memcpy(buf, "\xde\xad\x01\xbe\xef", 5);
    memcpy(buf + len - 9,
           "\x7f\x1a"
           "abc\x39\xbe",
           7);
    fast_equals_refscan(cat, buf, len, "pairs");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* One window group's factor on nearly every line of a 512 KiB buffer (more
 * candidates than the scan keeps): that group is walked in full, the other
 * group keeps its windows, and the hits equal refscan's. */
START_TEST(test_dense_factor_walked_in_full)
{
    static char *const pats[] = {"abcd[0-9]{1,3}x", "qrst[0-9]{1,3}y", "mnop.{0,5}z"};
    static const char *flags[] = {"", "", ""};
    enum rule_kind kind[3] = {RULE_REGEX, RULE_REGEX, RULE_REGEX};
    struct catalog *cat = compile_src((char **)pats, flags, kind, 3, false);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    ck_assert_uint_eq(plan->n_window_groups, plan->n_dfa + plan->n_nfa);
    cpuplan_put(plan);
    size_t len = 1u << 19; /* 8,192 candidates kept at most in one piece */
    uint8_t *buf = malloc(len);
    static const char alpha[] = "abcdqrst0123456789xyz \n";
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    size_t dense = 0;
    for (size_t p = 0; p + 16 < len; p += 8 + rnd(40), dense++) {
        const char *x = rnd(2) ? "abcd12x" : "abcd";
        memcpy(buf + p, x, strlen(x));
    }
    ck_assert_uint_gt(dense, 8192);
    for (size_t p = 5; p + 16 < len; p += 1000 + rnd(5000)) {
        const char *x = rnd(2) ? "qrst7y" : "mnop..z";
        memcpy(buf + p, x, strlen(x));
    }
    static const size_t segs[] = {4096, 1u << 20}; /* no 1-byte segments: too many */
    segs_equal_refscan(cat, buf, len, "dense factor", segs, 2);
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* Forward-confirmed (unbounded, gated) rules: the CPU engine walks the
 * catalog with its plan (window groups, pairs; a group whose factor has 3
 * bytes in full) and the confirmed groups around the catalog's factor
 * ends, equal to refscan_buffer and to every group walked in full, in
 * every mode. */
START_TEST(test_confirm_with_plan)
{
    static const struct rdef rules[] = {
        {"fwd", "\\bkeyz[a-z ]*=[0-9]+", NULL, RULE_REGEX},
        /* an unbounded lead: not `[a-z]+`, which the compiler cuts */
        {"lead", "[a-z][a-z]*tokenq[a-z]*", NULL, RULE_REGEX},
        {"mid", "xx[0-9]{1,5}wxyz[^\\n]*Q", "m", RULE_REGEX},
        {"win", "beef[0-9a-f]{4}cafe", "i", RULE_REGEX},
        {"pair", "\\x82\\xb7.{3}\\x0e", "s", RULE_REGEX},
        {"one", "abcde[^#]*zzq", "H", RULE_REGEX},
        {"weak", "key[a-z]{2}9", NULL, RULE_REGEX},
    };
    struct rules_result res = compile_confirmed(rules, sizeof(rules) / sizeof(rules[0]), _i == 1);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(res.catalog, true, &plan), 0);
    ck_assert(plan->gated_full); /* the confirmed groups, around the factor ends */
    /* `key[a-z]{2}9`'s only factor has 3 bytes: walked in full here */
    ck_assert_uint_lt(plan->n_window_groups + plan->n_shadow_groups + plan->n_lit_groups,
                      plan->n_dfa + plan->n_nfa);
    cpuplan_put(plan);
    static const char *const plants[] = {" keyz a b=12",
                                         "xtokenqyy",
                                         "xx123wxyz..Q",
                                         "BEEF12aFcafe",
                                         "\x82\xb7"
                                         "abc\x0e",
                                         "abcde zz zzq",
                                         "keyz=",
                                         "tokenq",
                                         "\nxx1wxyzQ",
                                         "abcde#zzq",
                                         "keyab9"};
    static const char alpha[] = "aZ09_ x-\n7Qbz=q";
    size_t len = 30000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 16 < len; p += 1 + rnd(70)) {
        const char *x = plants[rnd(11)];
        memcpy(buf + p, x, strlen(x));
    }
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0}, full = {0}, got = {0};
        ck_assert_int_eq(refscan_buffer(res.catalog, buf, len, (enum scan_mode)mode, &want), 0);
        full_walk(res.catalog, buf, len, (enum scan_mode)mode, &full);
        ck_assert_uint_ge(want.n, mode == SCAN_ALL ? 50 : 5);
        assert_same(&want, &full, "confirmed refscan_buffer vs full walks");
        uint64_t dropped = 0;
        segmented(res.catalog, buf, len, len, 1, (enum scan_mode)mode, 0, UINT64_MAX, &got,
                  &dropped);
        assert_same(&got, &want, "confirmed with the plan, CPU engine");
        scan_hits_finish(&got);
        scan_hits_finish(&want);
        scan_hits_finish(&full);
    }
    free(buf);
    rules_result_finish(&res);
}
END_TEST

/* In a forward-confirmed catalog the plan takes no 3-byte factor; a rule
 * whose best strings have 3 bytes falls back to its next best, here the
 * rare pair after the gap, instead of walking its group in full
 * (rules/cpuplan.c consider). Equal to refscan_buffer in every mode, with
 * the pair's and the head's bytes planted apart too. */
START_TEST(test_confirm_pair_fallback)
{
    static const struct rdef rules[] = {
        {"fwd", "with\\s+hercules", NULL, RULE_REGEX},
        {"bin", "\\x20\\x9c\\x2b.{3,6}\\x8c\\x35", "s", RULE_REGEX},
    };
    struct rule_src src[2];
    for (size_t i = 0; i < 2; i++) {
        uint32_t f = 0;
        if (rules[i].flags != NULL)
            ck_assert_int_eq(rules_parse_flags(rules[i].flags, strlen(rules[i].flags), &f, NULL),
                             0);
        src[i] = (struct rule_src){
            rules[i].id, rules[i].kind, rules[i].pattern, strlen(rules[i].pattern), f, 0};
    }
    struct rules_result res = {0};
    struct rules_options ro = {0}; /* the defaults: `bin` stays a DFA */
    ck_assert_int_eq(rules_compile(src, 2, &ro, &res, NULL), 0);
    bool confirm = false;
    for (uint32_t g = 0; g < catalog_nfa_count(res.catalog); g++) {
        struct catalog_nfa cn;
        catalog_nfa(res.catalog, g, &cn);
        confirm |= (cn.flags & CAT_GF_CONFIRM) != 0;
    }
    ck_assert(confirm);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(res.catalog, true, &plan), 0);
    uint32_t bin = UINT32_MAX;
    for (uint32_t r = 0; r < catalog_rule_count(res.catalog); r++) {
        struct catalog_rule cr;
        catalog_rule(res.catalog, r, &cr);
        if (cr.id_len == 3 && memcmp(cr.id, "bin", 3) == 0)
            bin = cr.group;
    }
    ck_assert_uint_lt(bin, plan->n_dfa);
    ck_assert_int_eq(plan->mode[bin], CPUPLAN_WINDOW);
    ck_assert_ptr_nonnull(plan->pair);
    /* `fwd` is left FULL (confirmed); its factor's strings are in the
     * literal matcher, so the catalog's factor group is not walked */
    ck_assert(plan->gate_merged);
    cpuplan_put(plan);
    static const char *const plants[] = {"with  hercules",
                                         "\x20\x9c\x2b"
                                         "abc\x8c\x35",
                                         "\x20\x9c\x2b"
                                         "abcdef\x8c\x35",
                                         "\x20\x9c\x2b"
                                         "abcdefg\x8c\x35",
                                         "\x8c\x35",
                                         "\x20\x9c\x2b"};
    static const char alpha[] = "aZ09_ x-\n7Qbz=q \x9c\x8c";
    size_t len = 30000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 16 < len; p += 1 + rnd(90)) {
        const char *x = plants[rnd(6)];
        memcpy(buf + p, x, strlen(x));
    }
    for (int mode = SCAN_ALL; mode <= SCAN_COUNT; mode++) {
        struct scan_hits want = {0}, got = {0};
        ck_assert_int_eq(refscan_buffer(res.catalog, buf, len, (enum scan_mode)mode, &want), 0);
        ck_assert_uint_ge(want.n, mode == SCAN_ALL ? 50 : 2);
        uint64_t dropped = 0;
        segmented(res.catalog, buf, len, len, 1, (enum scan_mode)mode, 0, UINT64_MAX, &got,
                  &dropped);
        assert_same(&got, &want, "a 3-byte head's pair, CPU engine");
        scan_hits_finish(&got);
        scan_hits_finish(&want);
    }
    free(buf);
    rules_result_finish(&res);
}
END_TEST

/* Window rules with a second factor (cpuplan.h struct cpuplan_second):
 * a candidate with no string of it within the rule's longest match on
 * either side is dropped before its window is walked. The second comes
 * after the factor, before it, as a caseless set, and within, at and past
 * the span; every segment size equals refscan in every mode. _i 1:
 * bit-NFA groups. */
START_TEST(test_second_factor_equal_refscan)
{
    static char *const pats[] = {"inflamed[^\\n]{0,100}chinese", "abcd[0-9]{2,40}(xyz|qrs)",
                                 "key7[a-z ]{0,30}sunburnt", "\\bzeta_[0-9]{4}\\b"};
    static const char *flags[] = {"", "i", "", ""};
    enum rule_kind kind[4] = {RULE_REGEX, RULE_REGEX, RULE_REGEX, RULE_REGEX};
    struct catalog *cat = compile_src((char **)pats, flags, kind, 4, _i == 1);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    /* not `zeta_` (one factor only); gated groups' rules in the shadow */
    const struct cpuplan *sp = plan->shadow_plan;
    ck_assert_uint_eq(plan->n_second + (sp != NULL ? sp->n_second : 0), 3);
    for (uint32_t k = 0; k < plan->n_second; k++)
        ck_assert_int_eq(plan->mode[plan->second[k].group], CPUPLAN_WINDOW);
    for (uint32_t k = 0; sp != NULL && k < sp->n_second; k++)
        ck_assert_int_eq(sp->mode[sp->second[k].group], CPUPLAN_WINDOW);
    cpuplan_put(plan);
    static const char *const plants[] = {
        "inflamed", "chinese", "\n",       "ABCD12",           "abcd7",      "XyZ",
        "qrs",      "key7",    "sunburnt", "key7 ab sunburnt", "zeta_1234 ", "      "};
    static const char alpha[] = "abcdefghij klm\n0123";
    size_t len = 60000;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    /* plants 1-140 bytes apart: seconds inside and outside the spans */
    for (size_t p = 0; p + 16 < len; p += 1 + rnd(rnd(4) == 0 ? 140 : 30)) {
        const char *x = plants[rnd(12)];
        memcpy(buf + p, x, strlen(x));
    }
    fast_equals_refscan(cat, buf, len, "second factors");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* DFA groups walked over the whole range (no factor, idle bytes too
 * rare to skip): long ranges are walked as four interleaved lanes (cpuscan.c
 * dfa_lanes), whose matches straddle the lanes' borders here (`[^\n]{5}`
 * ends at most bytes); equal to
 * refscan in every mode, with single-match, caseless and \b rules. */
START_TEST(test_dfa_lanes_equal_refscan)
{
    static char *const pats[] = {"[a-c][0-9]{1,3}x", "\\bq.{2,6}r", "[xz][0-9a]{2}", "b[ac]{1,5}3",
                                 "[^\\n]{5}"};
    static const char *flags[] = {"", "H", "i", "", ""};
    enum rule_kind kind[5] = {RULE_REGEX, RULE_REGEX, RULE_REGEX, RULE_REGEX, RULE_REGEX};
    struct catalog *cat = compile_src((char **)pats, flags, kind, 5, false);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    ck_assert_uint_eq(plan->n_window_groups + plan->n_lit_groups, 0);
    cpuplan_put(plan);
    /* lanes from 16 KiB; idle bytes (' ', '\n') come in runs too short to
     * skip, so the walk turns to the table, and lanes, after 64 of them */
    size_t len = 120000;
    uint8_t *buf = malloc(len);
    static const char alpha[] = "abcABC0123xXzZq r\n";
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    static const size_t segs[] = {4096, 100000, 1u << 20};
    segs_equal_refscan(cat, buf, len, "lanes", segs, 3);
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* A pair of lowercase (or caseless) letters is no factor: text is full of
 * them (`ey`); a pair with a digit, a capital or punctuation is
 * (`pK`, `3b`), as docs/engine.md "Pairs of bytes" says. _i picks the
 * rule; both equal refscan. */
START_TEST(test_lowercase_pairs_not_factors)
{
    static char *const pats[4][2] = {{"ey[0-9]{2}", "0123"},
                                     {"(?i)ey[0-9]{2}", "0123"},
                                     {"pK[0-9]{2}", "0123"},
                                     {"3b[0-9]{2}", "0123"}};
    static const char *flags[] = {"", ""};
    enum rule_kind kind[2] = {RULE_REGEX, RULE_LITERAL};
    struct catalog *cat = compile_src((char **)pats[_i], flags, kind, 2, false);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    struct catalog_rule cr;
    catalog_rule(cat, 0, &cr);
    ck_assert_int_eq(plan->mode[cr.group], _i < 2 ? CPUPLAN_FULL : CPUPLAN_WINDOW);
    ck_assert(_i < 2 ? plan->pair == NULL : plan->pair != NULL);
    cpuplan_put(plan);
    size_t len = 30000;
    uint8_t *buf = malloc(len);
    static const char alpha[] = "eyEYpK3b0123 \n";
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    for (size_t p = 0; p + 8 < len; p += 1 + rnd(200)) {
        static const char *const plants[] = {"ey12", "EY34", "pK56", "3b78", "0123"};
        const char *x = plants[rnd(5)];
        memcpy(buf + p, x, strlen(x));
    }
    fast_equals_refscan(cat, buf, len, "pairs of letters");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

/* cpurun_scan's points, as cpurun.h defines them, found the slow way:
 * every maximal run of the class in [begin, hi) of n bytes or more gives
 * a + n, a + 2n, ... below b, then b. */
struct run_pt {
    uint32_t id;
    uint64_t end;
};

struct run_pts {
    struct run_pt v[4096];
    size_t n;
};

static int run_collect(void *ctx, uint32_t id, uint64_t end)
{
    struct run_pts *p = ctx;
    ck_assert_uint_lt(p->n, 4096);
    p->v[p->n++] = (struct run_pt){id, end};
    return 0;
}

static void runs_naive(const struct cpurun_entry *v, size_t nv, const uint8_t *buf, size_t begin,
                       size_t end, struct run_pts *out)
{
    for (size_t k = 0; k < nv; k++) {
        for (size_t a = begin; a < end;) {
            if (!((v[k].set[buf[a] / 64] >> (buf[a] % 64)) & 1)) {
                a++;
                continue;
            }
            size_t b = a;
            while (b < end && ((v[k].set[buf[b] / 64] >> (buf[b] % 64)) & 1))
                b++;
            if (b - a >= v[k].n) {
                for (size_t e = a + v[k].n; e < b; e += v[k].n)
                    out->v[out->n++] = (struct run_pt){v[k].id, e};
                out->v[out->n++] = (struct run_pt){v[k].id, b};
            }
            a = b;
        }
    }
}

/* The run matcher's points equal the slow way's, for random classes,
 * lengths 1 to 20 and ranges of a buffer of few byte values, where runs
 * of every length meet the samples at every residue. */
START_TEST(test_cpurun_equals_naive)
{
    static struct run_pts got, want;
    uint8_t buf[3000];
    for (int round = 0; round < 300; round++) {
        struct cpurun_entry v[3];
        size_t nv = 1 + rnd(3);
        for (size_t k = 0; k < nv; k++) {
            memset(&v[k], 0, sizeof(v[k]));
            for (unsigned c = 'a'; c <= 'e'; c++)
                if (rnd(2))
                    v[k].set[c / 64] |= 1ull << (c % 64);
            v[k].set['a' / 64] |= 1ull << ('a' % 64);
            v[k].n = 1 + rnd(20);
            v[k].id = (uint32_t)k + 7;
        }
        size_t len = 1 + rnd(sizeof(buf));
        uint32_t odds = 2 + rnd(30); /* a byte out of every class: 1 in odds */
        for (size_t i = 0; i < len; i++)
            buf[i] = rnd(odds) == 0 ? 'z' : (uint8_t)('a' + rnd(5));
        size_t begin = rnd((uint32_t)len), hi = begin + rnd((uint32_t)(len - begin + 1));
        if (rnd(4) == 0)
            hi = len + 10; /* past the buffer: its end */
        struct cpurun *m;
        ck_assert_int_eq(cpurun_create(v, nv, &m), 0);
        got.n = want.n = 0;
        ck_assert_int_eq(cpurun_scan(m, buf, len, begin, hi, run_collect, &got), 0);
        runs_naive(v, nv, buf, begin, hi < len ? hi : len, &want);
        ck_assert_uint_eq(got.n, want.n);
        for (size_t i = 0; i < got.n; i++) {
            ck_assert_uint_eq(got.v[i].id, want.v[i].id);
            ck_assert_uint_eq(got.v[i].end, want.v[i].end);
        }
        cpurun_destroy(m);
    }
    struct cpurun_entry bad = {.set = {0}, .n = 4, .id = 1};
    struct cpurun *m = NULL;
    ck_assert_int_eq(cpurun_create(&bad, 1, &m), -EINVAL); /* an empty class */
}
END_TEST

/* A class that is most of the data: past CPURUN_DENSE_MIN bytes the
 * matcher gives up on it (CPURUN_GAVE_UP, once, last), and its points up
 * to there are the naive ones; a sparse class beside it is scanned whole. */
START_TEST(test_cpurun_gives_up_on_dense)
{
    static struct run_pts got, want;
    static uint8_t buf[40000];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = rnd(9) == 0 ? ' ' : (uint8_t) "0123456789abcdef"[rnd(16)];
    for (size_t p = 100; p + 30 < sizeof(buf); p += 5000)
        memset(buf + p, 'Z', 20);
    struct cpurun_entry v[2] = {{.n = 16, .id = 1}, {.n = 20, .id = 2}};
    for (unsigned c = 0; c < 256; c++)
        if (strchr("0123456789abcdef", (int)c) != NULL && c != 0)
            v[0].set[c / 64] |= 1ull << (c % 64);
    v[1].set['Z' / 64] |= 1ull << ('Z' % 64);
    struct cpurun *m;
    ck_assert_int_eq(cpurun_create(v, 2, &m), 0);
    got.n = want.n = 0;
    ck_assert_int_eq(cpurun_scan(m, buf, sizeof(buf), 0, sizeof(buf), run_collect, &got), 0);
    runs_naive(v + 1, 1, buf, 0, sizeof(buf), &want);
    size_t k = 0;
    while (k < got.n && got.v[k].id == 1 && got.v[k].end != CPURUN_GAVE_UP)
        k++;
    ck_assert_uint_lt(k, got.n);
    ck_assert_uint_eq(got.v[k].id, 1);
    ck_assert(got.v[k].end == CPURUN_GAVE_UP); /* given up, once */
    for (size_t i = 0; i < k; i++)
        ck_assert_uint_lt(got.v[i].end, CPURUN_DENSE_MIN + 200);
    ck_assert_uint_eq(got.n - k - 1, want.n); /* the sparse class: every run */
    for (size_t i = 0; i < want.n; i++)
        ck_assert_uint_eq(got.v[k + 1 + i].end, want.v[i].end);
    cpurun_destroy(m);
}
END_TEST

/* Rules with no string to look for, only a long counted class (a secret
 * scanner's generic tokens): their groups are walked in windows around
 * the class's runs (cpuplan.run), and equal refscan on every segment
 * size, with runs one byte short of n, at n, and long, and at the
 * buffer's ends. `[a-z]{12}` (most of any text) gets no run pass. */
START_TEST(test_run_windows_equal_refscan)
{
    static char *const pats[] = {"\\b[a-fA-F0-9]{40}\\b", "\\d{15,16}[|%][0-9a-z_-]{27,40}",
                                 "(?:sgp_[a-f0-9]{40}|[a-f0-9]{40})[\\s;]", "[a-z]{12}Q"};
    static const char *flags[] = {"", "i", "", ""};
    enum rule_kind kind[4] = {RULE_REGEX, RULE_REGEX, RULE_REGEX, RULE_REGEX};
    bool bitnfa = _i % 2 == 1, dense = _i >= 2;
    struct catalog *one = compile_src((char **)pats + 3, flags + 3, kind, 1, bitnfa);
    struct catalog *cat = compile_src((char **)pats, flags, kind, 3, bitnfa);
    struct cpuplan *plan;
    ck_assert_int_eq(cpuplan_build(one, true, &plan), 0);
    ck_assert_ptr_null(plan->run);
    ck_assert_uint_eq(plan->n_window_groups, 0);
    cpuplan_put(plan);
    catalog_destroy(one);
    if (_i == 0) { /* a rule of 8,000 parts (`\\d` each): its run is found
                    * from a window of parts, not every stretch of them
                    * (which took 9 s to plan) */
        char *longp = malloc(16001);
        for (int i = 0; i < 8000; i++)
            memcpy(longp + 2 * i, "\\d", 2);
        longp[16000] = '\0';
        one = compile_src(&longp, flags, kind, 1, false);
        ck_assert_int_eq(cpuplan_build(one, true, &plan), 0);
        ck_assert_ptr_nonnull(plan->run);
        cpuplan_put(plan);
        catalog_destroy(one);
        free(longp);
    }
    ck_assert_int_eq(cpuplan_build(cat, true, &plan), 0);
    ck_assert_ptr_nonnull(plan->run);
    for (uint32_t r = 0; r < 3; r++) {
        struct catalog_rule cr;
        catalog_rule(cat, r, &cr);
        ck_assert_msg(plan->mode[cr.group] == CPUPLAN_WINDOW, "rule %u: mode %d", r,
                      plan->mode[cr.group]);
    }
    cpuplan_put(plan);
    size_t len = 200000;
    uint8_t *buf = malloc(len);
    /* dense: hex digits nearly everywhere (a list of hashes), so the run
     * matcher gives up and the groups are walked in full */
    static const char alpha[] = "the quick brown fox 0123 abcdef ;\n";
    static const char hexy[] = "0123456789abcdef0123456789abcdef \n;";
    for (size_t i = 0; i < len; i++)
        buf[i] =
            dense ? (uint8_t)hexy[rnd(sizeof(hexy) - 1)] : (uint8_t)alpha[rnd(sizeof(alpha) - 1)];
    static const char hex[] = "0123456789abcdefABCDEF";
    for (size_t p = 0; p + 200 < len; p += 1 + rnd(3000)) {
        size_t n = 39 + rnd(4);
        if (rnd(8) == 0)
            n = 60 + rnd(100);
        for (size_t i = 0; i < n; i++)
            buf[p + i] = (uint8_t)hex[rnd(rnd(3) == 0 ? 22 : 16)];
        if (rnd(3) == 0) { /* a card-like token */
            size_t d = 14 + rnd(4);
            for (size_t i = 0; i < d; i++)
                buf[p + n + i] = (uint8_t)('0' + rnd(10));
            buf[p + n + d] = rnd(2) ? '|' : '%';
            for (size_t i = 0; i < 30; i++)
                buf[p + n + d + 1 + i] = (uint8_t) "abcdef0123_-XYZ"[rnd(15)];
        }
        buf[p + n + 50] = ';';
    }
    for (size_t i = 0; i < 40; i++) /* at both ends */
        buf[i] = buf[len - 1 - i] = (uint8_t)hex[rnd(16)];
    /* the give-ups need 4 KiB of a segment; on hash-dense data smaller
     * segments only repeat the prose loops' windows, at a sanitizer
     * build's minutes */
    static const size_t dense_segs[] = {500, 8192, 1u << 20};
    if (dense)
        segs_equal_refscan(cat, buf, len, "class runs, dense", dense_segs, 3);
    else
        fast_equals_refscan(cat, buf, len, "class runs");
    free(buf);
    catalog_destroy(cat);
}
END_TEST

START_TEST(test_plan_cached)
{
    static const struct rdef lits[] = {{"a", "needle", NULL, RULE_LITERAL},
                                       {"b", "haystack", "i", RULE_LITERAL}};
    struct catalog *a = compile(lits, 2), *b = compile(unbounded, 2);
    struct cpuplan *pa, *pa2, *pb;
    ck_assert_int_eq(cpuplan_get(a, &pa), 0);
    ck_assert_int_eq(cpuplan_get(b, &pb), 0);
    ck_assert_int_eq(cpuplan_get(a, &pa2), 0);
    ck_assert_ptr_eq(pa, pa2);
    ck_assert_ptr_ne(pa, pb);
    ck_assert_uint_eq(pa->n_lit_groups, catalog_group_count(a));
    ck_assert_uint_lt(pb->n_lit_groups, pb->n_dfa + pb->n_nfa); /* a[^z]*q: a full walk */
    cpuplan_put(pa);
    cpuplan_put(pa2);
    cpuplan_put(pb);
    catalog_destroy(a);
    catalog_destroy(b);
}
END_TEST

Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("segments");
    tcase_set_tags(tc, "cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_segments_equal_refscan, 0, 2);
    tcase_add_test(tc, test_segment_limit);
    tcase_add_loop_test(tc, test_unbounded_one_piece, 0, 2);
    tcase_add_test(tc, test_idle_skip_equals_refscan);
    tcase_add_test(tc, test_plain_strings_equal_refscan);
    tcase_add_test(tc, test_segment_enough);
    tcase_add_test(tc, test_finalize_radix_equals_sorting);
    tcase_add_test(tc, test_finalize_plain_equals_sorting);
    tcase_add_test(tc, test_gate_sort);
    tcase_add_loop_test(tc, test_gated_segments, 0, 2);
    tcase_add_loop_test(tc, test_confirm_segments, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("fast");
    tcase_set_tags(tc, "cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cpulit_equals_naive);
    tcase_add_loop_test(tc, test_cpulit_split_slots, 0, 2);
    tcase_add_test(tc, test_cpulit_once);
    tcase_add_test(tc, test_shared_id_literals);
    tcase_add_loop_test(tc, test_shared_id_groups_equal_refscan, 0, 2);
    tcase_add_loop_test(tc, test_shared_id_windows_equal_refscan, 0, 2);
    tcase_add_test(tc, test_literal_group_kind);
    tcase_add_loop_test(tc, test_literal_groups_equal_refscan, 0, 2);
    tcase_add_loop_test(tc, test_window_groups_equal_refscan, 0, 2);
    tcase_add_loop_test(tc, test_shadow_only_when_usable, 0, 2);
    tcase_add_test(tc, test_plan_cached);
    suite_add_tcase(s, tc);
    tc = tcase_create("pairs"); /* session 30: pairs, dense factors, confirmed catalogs, lanes */
    tcase_set_tags(tc, "cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cpupair_equals_naive);
    tcase_add_test(tc, test_cpupair_fast_equals_naive);
    tcase_add_loop_test(tc, test_pair_factors_equal_refscan, 0, 2);
    tcase_add_test(tc, test_dense_factor_walked_in_full);
    tcase_add_test(tc, test_dfa_lanes_equal_refscan);
    tcase_add_loop_test(tc, test_lowercase_pairs_not_factors, 0, 4);
    tcase_add_loop_test(tc, test_confirm_with_plan, 0, 2);
    tcase_add_test(tc, test_confirm_pair_fallback);
    tcase_add_test(tc, test_cpurun_equals_naive);
    tcase_add_test(tc, test_cpurun_gives_up_on_dense);
    tcase_add_loop_test(tc, test_run_windows_equal_refscan, 0, 4);
    tcase_add_loop_test(tc, test_second_factor_equal_refscan, 0, 2);
    suite_add_tcase(s, tc);
    if (getenv("VKSCAND") == NULL || access(getenv("VKSCAND"), X_OK) != 0)
        return s;
    tc = tcase_create("daemon");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cpu_engine_segments);
    tcase_add_test(tc, test_cpu_engine_split);
    tcase_add_test(tc, test_max_hits_at_source_cpu);
    tcase_add_test(tc, test_max_hits_one_task_cpu);
    tcase_add_test(tc, test_large_file_parallel_read);
    tcase_add_test(tc, test_cpu_engine_every_core);
    tcase_add_test(tc, test_auto_prefers_cpu_engine);
    tcase_add_test(tc, test_auto_weighs_catalogs);
    tcase_add_test(tc, test_gpu_timeout_retried_on_cpu);
    tcase_add_test(tc, test_gpu_too_big_retried_on_cpu);
    tcase_add_test(tc, test_gpu_scan_in_slices);
    tcase_add_test(tc, test_two_gpu_engines);
    tcase_add_test(tc, test_bad_devices);
    tcase_add_test(tc, test_small_batches_overflow_to_gpu);
    suite_add_tcase(s, tc);
    tc = tcase_create("once");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_dedup_in_one_request);
    tcase_add_test(tc, test_dedup_across_requests);
    tcase_add_test(tc, test_cache_unchanged_files);
    tcase_add_test(tc, test_cache_per_tenant);
    tcase_add_test(tc, test_cache_bounded);
    tcase_add_test(tc, test_cache_bypass);
    tcase_add_test(tc, test_unreadable_descriptor_gets_nothing);
    suite_add_tcase(s, tc);
    return s;
}
