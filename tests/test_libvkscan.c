/*
 * libvkscan against a real vkscand ($VKSCAND, started on a temporary socket,
 * ready on its $NOTIFY_SOCKET): the large-buffer memfd path, the option
 * structs' struct_size handling, and a program built against the 0.2 option
 * layout ($VKSCAN_ABI_V02, tests/abi_v02.c) running against this library.
 *
 * The daemon runs with --max-frame 256K: a 1 MiB inline buffer does not fit
 * one frame, so a scan of it succeeds only when the library sent it as a
 * memfd. Results do not depend on the engine the daemon picks.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vkscan/vkscan.h"

struct daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
    int notify_fd;
};

/* Starts vkscand with `--engine engine` (NULL: the default). */
static void daemon_start_engine(struct daemon *d, const char *engine)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/vkl-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/vkscand.sock", d->dir);
    char notify[96], state[128];
    snprintf(notify, sizeof(notify), "%s/notify", d->dir);
    snprintf(state, sizeof(state), "%s/state", d->dir);
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", notify);
    ck_assert_int_eq(bind(d->notify_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char *bin = getenv("VKSCAND");
    ck_assert_msg(bin != NULL, "VKSCAND is not set: run through meson test");
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        setenv("NOTIFY_SOCKET", notify, 1);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(bin, bin, "--config", "", "--socket", d->sock, "--state-dir", state, "--max-frame",
              "256K", "--log-level", "warning", "--engine", engine ? engine : "auto", (char *)NULL);
        _exit(127);
    }
    struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
    for (int waited = 0; waited < 120000; waited += 100) {
        char buf[512] = {0};
        if (poll(&p, 1, 100) == 1 && recv(d->notify_fd, buf, sizeof(buf) - 1, 0) > 0 &&
            strstr(buf, "READY=1") != NULL)
            return;
        int st;
        ck_assert_msg(waitpid(d->pid, &st, WNOHANG) != d->pid, "vkscand exited at start");
    }
    ck_abort_msg("vkscand did not become ready");
}

static void daemon_start(struct daemon *d)
{
    daemon_start_engine(d, NULL);
}

static void daemon_stop(struct daemon *d)
{
    int st;
    kill(d->pid, SIGTERM);
    waitpid(d->pid, &st, 0);
    close(d->notify_fd);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* 1 MiB of filler with "needle" ending at byte 1000000 and at the end. */
#define BIG (1u << 20)
static char *big_buffer(void)
{
    char *b = malloc(BIG);
    ck_assert_ptr_nonnull(b);
    memset(b, 'x', BIG);
    memcpy(b + 1000000 - 6, "needle", 6);
    memcpy(b + BIG - 6, "needle", 6);
    return b;
}

static struct vks_catalog *load(struct vks_client *c)
{
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    const char text[] = "needle:/needle/\n";
    ck_assert_msg(vks_client_catalog_load_text(c, text, strlen(text), NULL, &cat, &err) == 0,
                  "load: %s", err.msg);
    return cat;
}

static uint64_t stat_of(struct vks_client *c, const char *key)
{
    struct vks_stats st;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_stats(c, &st, &err), 0);
    const struct vks_stat *v = vks_stat_find(st.stats, st.n_stats, key);
    ck_assert_ptr_nonnull(v);
    uint64_t u = v->u;
    vks_stats_finish(&st);
    return u;
}

/* Open descriptors of this process that are libvkscan's memfds. */
static int library_memfds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        if (k > 0) {
            target[k] = '\0';
            n += strstr(target, "memfd:vkscan-buffer") != NULL;
        }
    }
    closedir(d);
    return n;
}

/* A client keeps the memfds of its large inline buffers and writes the next
 * scans into them: no more than 4 stay open, a fifth buffer of a scan gets
 * a fresh one closed after the reply, close releases them, and every scan
 * sees its own bytes (the daemon, on the GPU engine, reads them at upload,
 * fd_upload_bytes). */
START_TEST(large_inline_buffers_reuse_memfds)
{
    struct daemon d;
    daemon_start_engine(&d, "gpu");
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0);
    struct vks_catalog *cat = load(c);
    int before = library_memfds();
    enum { N = 5 };
    char *b[N];
    struct vks_buffer bufs[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(BIG + 64);
        ck_assert_ptr_nonnull(b[i]);
        memset(b[i], 'x', BIG + 64);
        bufs[i] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = b[i], .len = BIG};
    }
    for (int round = 0; round < 3; round++) {
        size_t n = round == 2 ? N : 1;
        for (size_t i = 0; i < n; i++) {
            memset(b[i], 'x', BIG + 64);
            size_t at = 1000 + (size_t)round * 300000 + i * 7;
            memcpy(b[i] + at, "needle", 6); /* moves every round: old bytes would show */
            bufs[i].len = BIG + (size_t)(round == 1) * 64; /* grows the kept memfd */
        }
        struct vks_scan_result res;
        int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, n, NULL, &res, &err);
        ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
        ck_assert_uint_eq(res.n_hits, n);
        for (size_t i = 0; i < n; i++) {
            ck_assert_int_eq(res.buffers[i].code, 0);
            ck_assert_uint_eq(res.buffers[i].bytes, bufs[i].len);
            ck_assert_uint_eq(res.hits[i].buffer, i);
            ck_assert_uint_eq(res.hits[i].end, 1000 + (size_t)round * 300000 + i * 7 + 6);
        }
        /* sealed against shrinking, and read at upload all the same */
        const struct vks_stat *up =
            vks_stat_find(res.telemetry, res.n_telemetry, "fd_upload_bytes");
        ck_assert_ptr_nonnull(up);
        uint64_t sent = 0;
        for (size_t i = 0; i < n; i++)
            sent += bufs[i].len;
        ck_assert_uint_eq(up->u, sent);
        vks_scan_result_finish(&res);
        ck_assert_int_eq(library_memfds() - before, round == 2 ? 4 : 1);
    }
    vks_client_close(c);
    ck_assert_int_eq(library_memfds(), before);
    for (int i = 0; i < N; i++)
        free(b[i]);
    vks_catalog_destroy(cat);
    daemon_stop(&d);
}
END_TEST

START_TEST(large_inline_buffer_goes_by_memfd)
{
    struct daemon d;
    daemon_start(&d);
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0);
    struct vks_catalog *cat = load(c);
    char *b = big_buffer();
    struct vks_buffer bufs[2] = {{.kind = VKS_BUFFER_INLINE, .data = "a needle", .len = 8},
                                 {.kind = VKS_BUFFER_INLINE, .data = b, .len = BIG}};
    struct vks_scan_result res;
    uint64_t before = stat_of(c, "tenant.served_bytes");
    /* The frame limit is 256 KiB: 1 MiB inline would be refused. */
    int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 2, NULL, &res, &err);
    ck_assert_msg(rc == 0, "scan: %d %s", rc, err.msg);
    ck_assert_uint_eq(res.n_buffers, 2);
    ck_assert_int_eq(res.buffers[1].code, 0);
    ck_assert_uint_eq(res.buffers[1].bytes, BIG);
    ck_assert_uint_eq(res.n_hits, 3);
    ck_assert_uint_eq(res.hits[0].buffer, 0);
    ck_assert_uint_eq(res.hits[0].end, 8);
    ck_assert_uint_eq(res.hits[1].buffer, 1);
    ck_assert_uint_eq(res.hits[1].end, 1000000);
    ck_assert_uint_eq(res.hits[2].end, BIG);
    vks_scan_result_finish(&res);
    ck_assert_uint_eq(stat_of(c, "tenant.served_bytes") - before, BIG + 8);
    vks_client_close(c);

    /* The control: with the memfd path off the same scan cannot be sent. */
    struct vks_client_options o;
    vks_client_options_init(&o);
    ck_assert_uint_eq(o.struct_size, sizeof(o));
    ck_assert_uint_eq(o.memfd_threshold, VKS_MEMFD_THRESHOLD_DEFAULT);
    o.memfd_threshold = UINT64_MAX;
    o.retries = 0;
    ck_assert_int_eq(vks_client_connect(d.sock, &o, &c, &err), 0);
    rc = vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 2, NULL, &res, &err);
    ck_assert_int_ne(rc, 0);
    vks_client_close(c);

    /* A threshold above the buffer keeps it inline: refused again. */
    o.memfd_threshold = 2u << 20;
    ck_assert_int_eq(vks_client_connect(d.sock, &o, &c, &err), 0);
    rc = vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 2, NULL, &res, &err);
    ck_assert_int_ne(rc, 0);
    vks_client_close(c);
    free(b);
    vks_catalog_destroy(cat);
    daemon_stop(&d);
}
END_TEST

/* Option structs: struct_size 0 reads the 0.2 fields only; an explicit
 * small struct_size leaves the later fields at their defaults. */
START_TEST(option_structs_carry_their_size)
{
    struct daemon d;
    daemon_start(&d);
    struct vks_client *c;
    struct vks_error err = {0};
    struct vks_client_options o;
    memset(&o, 0xff, sizeof(o)); /* garbage past the 0.2 fields */
    o.struct_size = 0;
    o.connect_timeout_ms = 5000;
    o.io_timeout_ms = 30000;
    o.retries = 1;
    o.backoff_ms = 10;
    o.max_frame = 1u << 20;
    o.client_name = "sized";
    ck_assert_int_eq(vks_client_connect(d.sock, &o, &c, &err), 0);
    struct vks_catalog *cat = load(c);
    char *b = big_buffer();
    struct vks_buffer buf = {.kind = VKS_BUFFER_INLINE, .data = b, .len = BIG};
    struct vks_scan_options so;
    memset(&so, 0xff, sizeof(so));
    so.struct_size = offsetof(struct vks_scan_options, no_cache); /* the 0.2 layout */
    so.mode = VKS_REPORT_COUNT;
    so.max_hits = 0;
    so.timeout_ms = 0;
    so.rule_ids = true;
    struct vks_scan_result res;
    int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), &buf, 1, &so, &res, &err);
    ck_assert_msg(rc == 0, "scan: %s", err.msg); /* memfd by default: the garbage was not read */
    ck_assert_uint_eq(res.n_hits, 1);
    ck_assert_uint_eq(res.hits[0].count, 2);
    ck_assert_str_eq(res.hits[0].rule_id, "needle");
    vks_scan_result_finish(&res);

    struct vks_load_options lo;
    vks_load_options_init(&lo);
    ck_assert_uint_eq(lo.struct_size, sizeof(lo));
    lo.always_send = true;
    struct vks_catalog *cat2 = NULL;
    ck_assert_int_eq(vks_client_catalog_load_text(c, "a:/b/\n", 6, &lo, &cat2, &err), 0);
    ck_assert(vks_catalog_rules_sent(cat2));
    vks_catalog_destroy(cat2);
    free(b);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    daemon_stop(&d);
}
END_TEST

/* ids_only: the daemon sends a catalog's rule ids without fingerprints,
 * for a load that compiles and for one answered by catalog.has; the ids
 * and their order are those of the full form, which still comes with its
 * fingerprints on the same daemon. */
START_TEST(catalog_ids_only)
{
    struct daemon d;
    daemon_start(&d);
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0);
    const char text[] = "r-one:/needle/\nr-two:/ne+dle/i\nr-three:/xyz/\n";
    struct vks_load_options lo;
    vks_load_options_init(&lo);
    lo.ids_only = true;
    struct vks_catalog *cats[3] = {NULL};
    for (int i = 0; i < 3; i++) { /* compiles (ids only), has (full), has (ids only) */
        struct vks_load_options *o = i == 1 ? NULL : &lo;
        ck_assert_msg(vks_client_catalog_load_text(c, text, strlen(text), o, &cats[i], &err) == 0,
                      "load %d: %s", i, err.msg);
        ck_assert(vks_catalog_rules_sent(cats[i]) == (i == 0));
        ck_assert_uint_eq(vks_catalog_rule_count(cats[i]), 3);
    }
    for (size_t r = 0; r < 3; r++) {
        ck_assert_str_eq(vks_catalog_rule_id(cats[0], r), vks_catalog_rule_id(cats[1], r));
        ck_assert_str_eq(vks_catalog_rule_id(cats[2], r), vks_catalog_rule_id(cats[1], r));
        ck_assert_ptr_null(vks_catalog_rule_fingerprint(cats[0], r));
        ck_assert_ptr_null(vks_catalog_rule_fingerprint(cats[2], r));
        ck_assert_ptr_nonnull(vks_catalog_rule_fingerprint(cats[1], r));
    }
    ck_assert_str_eq(vks_catalog_rule_id(cats[0], 1), "r-two");
    ck_assert_mem_eq(vks_catalog_fingerprint(cats[0]), vks_catalog_fingerprint(cats[1]),
                     VKS_FP_LEN);
    const uint8_t *fp0 = vks_catalog_rule_fingerprint(cats[1], 0);
    const uint8_t *fp1 = vks_catalog_rule_fingerprint(cats[1], 1);
    ck_assert(memcmp(fp0, fp1, VKS_FP_LEN) != 0);
    char *b = big_buffer();
    struct vks_buffer buf = {.kind = VKS_BUFFER_INLINE, .data = b, .len = BIG};
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.mode = VKS_REPORT_COUNT;
    so.rule_ids = true;
    struct vks_scan_result res;
    ck_assert_msg(vks_client_scan(c, vks_catalog_fingerprint(cats[0]), &buf, 1, &so, &res, &err) ==
                      0,
                  "scan: %s", err.msg);
    ck_assert_uint_eq(res.n_hits, 2); /* r-one and r-two, twice each */
    for (size_t i = 0; i < res.n_hits; i++) {
        ck_assert_uint_eq(res.hits[i].count, 2);
        ck_assert_str_eq(res.hits[i].rule_id, vks_catalog_rule_id(cats[0], res.hits[i].rule));
    }
    vks_scan_result_finish(&res);
    free(b);
    for (int i = 0; i < 3; i++)
        vks_catalog_destroy(cats[i]);
    vks_client_close(c);
    daemon_stop(&d);
}
END_TEST

/* tests/abi_v02.c declares the 0.2 structs itself and runs against this
 * library: connect, load, a 1 MiB scan (by memfd) and stats. */
START_TEST(program_built_against_v02_layout_runs)
{
    const char *prog = getenv("VKSCAN_ABI_V02");
    ck_assert_msg(prog != NULL, "VKSCAN_ABI_V02 is not set: run through meson test");
    struct daemon d;
    daemon_start(&d);
    pid_t pid = fork();
    if (pid == 0) {
        execl(prog, prog, d.sock, (char *)NULL);
        _exit(127);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "abi_v02 failed (status %d)", st);
    daemon_stop(&d);
}
END_TEST

/* Hits of rules with flag L carry the leftmost start on the GPU engine
 * (lavapipe) and on the CPU engine, inline and memfd buffers alike; other
 * rules get VKS_NO_START unless the scan asks for `starts`; a stream of a
 * catalog with L rules is refused. */
START_TEST(starts_on_both_engines)
{
    static const char *const engines[] = {"gpu", "cpu"};
    struct daemon d;
    daemon_start_engine(&d, engines[_i]);
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0);
    const char text[] = "a:/foo.*bar/L\nb:/bar/\nc:/x\\d+y/iL\nn:/ne+dle/L\n";
    struct vks_catalog *cat = NULL;
    ck_assert_msg(vks_client_catalog_load_text(c, text, strlen(text), NULL, &cat, &err) == 0,
                  "load: %s", err.msg);
    ck_assert_uint_eq(vks_catalog_rule_count(cat), 4);
    const char small[] = "foo..foo bar X12Y xx";
    char *b = big_buffer(); /* needle ends at 1000000 and at BIG */
    struct vks_buffer bufs[2] = {{.kind = VKS_BUFFER_INLINE, .data = small, .len = strlen(small)},
                                 {.kind = VKS_BUFFER_INLINE, .data = b, .len = BIG}};
    for (int all = 0; all < 2; all++) {
        struct vks_scan_options so;
        vks_scan_options_init(&so);
        so.starts = all;
        struct vks_scan_result res;
        int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 2, &so, &res, &err);
        ck_assert_msg(rc == 0, "scan: %s", err.msg);
        const struct vks_stat *eng = vks_stat_find(res.telemetry, res.n_telemetry, "engine");
        ck_assert_ptr_nonnull(eng);
        ck_assert_uint_eq(eng->u, _i); /* 0: the GPU engine, 1: the CPU engine */
        unsigned seen = 0;
        for (size_t i = 0; i < res.n_hits; i++) {
            const struct vks_hit *h = &res.hits[i];
            const char *id = vks_catalog_rule_id(cat, h->rule);
            if (strcmp(id, "a") == 0) { /* foo.*bar from the first foo */
                ck_assert_uint_eq(h->end, 12);
                ck_assert_uint_eq(h->start, 0);
            } else if (strcmp(id, "b") == 0) {
                ck_assert_uint_eq(h->start, all ? h->end - 3 : VKS_NO_START);
            } else if (strcmp(id, "c") == 0) {
                ck_assert_uint_eq(h->start, 13);
                ck_assert_uint_eq(h->end, 17);
            } else {
                ck_assert_uint_eq(h->buffer, 1);
                ck_assert_uint_eq(h->start, h->end - 6);
            }
            seen |= 1u << (id[0] - 'a' < 4 ? id[0] - 'a' : 3);
        }
        ck_assert_uint_eq(res.n_hits, 5);
        ck_assert_uint_eq(seen, 0xf);
        vks_scan_result_finish(&res);
    }
    /* first and count modes: the start of each rule's first match */
    for (int mode = VKS_REPORT_FIRST; mode <= VKS_REPORT_COUNT; mode++) {
        struct vks_scan_options so;
        vks_scan_options_init(&so);
        so.mode = (enum vks_report)mode;
        struct vks_scan_result res;
        ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), bufs, 2, &so, &res, &err),
                         0);
        ck_assert_uint_eq(res.n_hits, 4);
        for (size_t i = 0; i < res.n_hits; i++) {
            const struct vks_hit *h = &res.hits[i];
            if (strcmp(vks_catalog_rule_id(cat, h->rule), "n") == 0) {
                ck_assert_uint_eq(h->end, 1000000);
                ck_assert_uint_eq(h->start, 1000000 - 6);
                ck_assert_uint_eq(h->count, mode == VKS_REPORT_COUNT ? 2 : 1);
            }
        }
        vks_scan_result_finish(&res);
    }
    struct vks_stream *st = NULL;
    ck_assert_int_eq(vks_stream_open(c, vks_catalog_fingerprint(cat), NULL, &st, &err),
                     -VKS_E_BAD_VALUE);
    ck_assert_ptr_nonnull(strstr(err.msg, "flag L"));
    free(b);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    daemon_stop(&d);
}
END_TEST

/* Cached hits carry no starts: a scan that wants them reads the file even
 * when the result cache has it (a catalog without L shows it would). */
START_TEST(starts_bypass_result_cache)
{
    struct daemon d;
    daemon_start_engine(&d, "cpu");
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0);
    char path[160];
    snprintf(path, sizeof(path), "%s/file.txt", d.dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "xx needle yy", 12), 12);
    struct timespec old[2] = {{.tv_sec = time(NULL) - 3600}, {.tv_sec = time(NULL) - 3600}};
    ck_assert_int_eq(futimens(fd, old), 0);
    usleep(1200 * 1000); /* the change time must be a second old to be cached */
    struct vks_buffer vb = {.kind = VKS_BUFFER_FD, .fd = fd};
    static const char *const texts[2] = {"b:/needle/\n", "a:/ne+dle/L\nb:/needle/\n"};
    for (int k = 0; k < 2; k++) {
        struct vks_catalog *cat = NULL;
        ck_assert_int_eq(
            vks_client_catalog_load_text(c, texts[k], strlen(texts[k]), NULL, &cat, &err), 0);
        for (int i = 0; i < 2; i++) {
            struct vks_scan_result res;
            ck_assert_int_eq(
                vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, NULL, &res, &err), 0);
            ck_assert_uint_eq(res.n_hits, (size_t)k + 1);
            /* without L the second scan is the cache's; with L never */
            ck_assert(res.buffers[0].cached == (k == 0 && i == 1));
            for (size_t h = 0; h < res.n_hits; h++) {
                const char *id = vks_catalog_rule_id(cat, res.hits[h].rule);
                ck_assert_uint_eq(res.hits[h].start, id[0] == 'a' ? 3 : VKS_NO_START);
            }
            vks_scan_result_finish(&res);
        }
        vks_catalog_destroy(cat);
    }
    close(fd);
    vks_client_close(c);
    daemon_stop(&d);
}
END_TEST

Suite *libvkscan_suite(void)
{
    Suite *s = suite_create("libvkscan");
    TCase *t = tcase_create("daemon");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, large_inline_buffer_goes_by_memfd);
    tcase_add_test(t, large_inline_buffers_reuse_memfds);
    tcase_add_test(t, option_structs_carry_their_size);
    tcase_add_test(t, catalog_ids_only);
    tcase_add_test(t, program_built_against_v02_layout_runs);
    tcase_add_loop_test(t, starts_on_both_engines, 0, 2);
    tcase_add_test(t, starts_bypass_result_cache);
    suite_add_tcase(s, t);
    return s;
}
