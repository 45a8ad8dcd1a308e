/*
 * vkscand under hostile tenants (vkscan issue 8): each test starts the real
 * daemon ($VKSCAND) on a temporary socket with lowered limits and attacks it
 * the way the campaign did, through raw frames (proto/, msgpack-c) and
 * libvkscan, then checks that the limit held, that the attacker got the
 * documented error, and that the daemon still serves everyone else.
 *
 * The daemon runs the CPU engine (--engine cpu): these tests are about the
 * service, not the device, and must stay quick on two cores. Sizes are small
 * and limits lowered; nothing asserts on wall time.
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto.h"
#include "vkscan/vkscan.h"

/* ---- the daemon under test -------------------------------------------- */

struct daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
    char state[128];
    char notify[128];
    char log[128];
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

/* LD_PRELOAD for the next daemon_start (NULL: none). */
static const char *preload;

/* Starts vkscand (CPU engine, log to d->log) with the extra flags `extra`
 * (NULL-terminated) and, when `nofile` is not 0, that RLIMIT_NOFILE. */
static void daemon_start_lim(struct daemon *d, const char *const *extra, rlim_t nofile)
{
    char keep[64];
    snprintf(keep, sizeof(keep), "%s", d->dir); /* set: restart in that directory */
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "%s", keep[0] != '\0' ? keep : "/tmp/vka-XXXXXX");
    if (keep[0] == '\0')
        ck_assert_ptr_nonnull(mkdtemp(d->dir));
    chmod(d->dir, 0755); /* other tenants connect as another uid */
    snprintf(d->sock, sizeof(d->sock), "%s/vkscand.sock", d->dir);
    snprintf(d->state, sizeof(d->state), "%s/state", d->dir);
    snprintf(d->notify, sizeof(d->notify), "%s/notify", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/log", d->dir);
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
        const char *argv[48] = {
            bin, "--socket",      d->sock, "--state-dir", d->state, "--engine", "cpu", "--config",
            "",  "--socket-mode", "0666",  "--log-level", "warning"};
        int n = 13;
        for (int i = 0; extra != NULL && extra[i] != NULL && n < 47; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;
        setenv("NOTIFY_SOCKET", d->notify, 1);
        /* The RSS bounds below measure what the daemon holds, not what an
         * ASan build keeps in its quarantine of freed blocks (256 MiB by
         * default): keep that small. A plain build ignores the variable. */
        const char *asan = getenv("ASAN_OPTIONS");
        char opts[512];
        snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4%s", asan ? asan : "",
                 asan ? ":" : "", preload != NULL ? ":verify_asan_link_order=0" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        if (preload != NULL)
            setenv("LD_PRELOAD", preload, 1);
        int lf = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (lf >= 0)
            dup2(lf, 2);
        if (nofile != 0) {
            struct rlimit rl = {nofile, nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    ck_assert_msg(wait_ready(d, 120000), "vkscand did not become ready");
}

static void daemon_start(struct daemon *d, const char *const *extra)
{
    d->dir[0] = '\0';
    daemon_start_lim(d, extra, 0);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* SIGTERM, wait, remove the directory; returns the exit status. */
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
    close(d->notify_fd);
    nftw(d->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}

/* SIGTERM and start again in the same directory (the disk cache stays). */
static void daemon_restart(struct daemon *d)
{
    kill(d->pid, SIGTERM);
    int st;
    ck_assert_int_eq(waitpid(d->pid, &st, 0), d->pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(d->notify_fd);
    unlink(d->notify);
    daemon_start_lim(d, NULL, 0);
}

static struct vks_client *connect_ok(const struct daemon *d)
{
    struct vks_client *c = NULL;
    struct vks_error err = {0};
    int rc = vks_client_connect(d->sock, NULL, &c, &err);
    ck_assert_msg(rc == 0, "connect: %d %s", rc, err.msg);
    return c;
}

/* A stats value; `found` false when the key is absent. */
static uint64_t stat_get(struct vks_client *c, const char *key, bool *found)
{
    struct vks_stats st = {0};
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_stats(c, &st, &err), 0);
    const struct vks_stat *s = vks_stat_find(st.stats, st.n_stats, key);
    *found = s != NULL;
    uint64_t v = s != NULL ? s->u : 0;
    vks_stats_finish(&st);
    return v;
}

static uint64_t stat_of(struct vks_client *c, const char *key)
{
    bool found;
    uint64_t v = stat_get(c, key, &found);
    ck_assert_msg(found, "stats has no %s", key);
    return v;
}

/* A fresh connection's stats value (an idle timeout may have closed others). */
static uint64_t stat_now(const struct daemon *d, const char *key)
{
    struct vks_client *c = connect_ok(d);
    uint64_t v = stat_of(c, key);
    vks_client_close(c);
    return v;
}

static void expect_ping_ok(const struct daemon *d)
{
    struct vks_client *c = connect_ok(d);
    ck_assert_int_eq(vks_client_ping(c, NULL), 0);
    vks_client_close(c);
}

static const struct vks_rule rules[] = {
    {"lit", VKS_RULE_LITERAL, "needle", 0, NULL},
    {"re", VKS_RULE_REGEX, "ab[0-9]+c", 0, NULL},
};
#define N_RULES (sizeof(rules) / sizeof(rules[0]))

static struct vks_catalog *load_ok(struct vks_client *c, const struct vks_rule *r, size_t n)
{
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    int rc = vks_client_catalog_load(c, r, n, NULL, &cat, &err);
    ck_assert_msg(rc == 0, "load: %d %s", rc, err.msg);
    return cat;
}

/* VmRSS of `pid` in bytes. */
static uint64_t rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    uint64_t kb = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtoull(line + 6, NULL, 10);
    }
    fclose(f);
    return kb * 1024;
}

/* Runs `fn(d, arg)` in a child as uid `uid`; returns its exit status. */
static int as_uid(const struct daemon *d, uid_t uid, int (*fn)(const struct daemon *, void *),
                  void *arg)
{
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (setgid(uid) != 0 || setuid(uid) != 0)
            _exit(100);
        _exit(fn(d, arg));
    }
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
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

static void raw_frame(int fd, const msgpack_sbuffer *sb)
{
    uint8_t hdr[4] = {(uint8_t)(sb->size >> 24), (uint8_t)(sb->size >> 16),
                      (uint8_t)(sb->size >> 8), (uint8_t)sb->size};
    ck_assert_int_eq(proto_send(fd, hdr, 4, NULL, 0, 10000, NULL), 0);
    ck_assert_int_eq(proto_send(fd, sb->data, sb->size, NULL, 0, 10000, NULL), 0);
}

/* Reads one reply; NULL at EOF or reset. */
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
        ck_assert_msg(rc >= 0, "reading a reply: %d", rc);
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

/* Expects an error reply `code` with `id`, then (when `then_eof`) the end. */
static void expect_error(int fd, uint32_t id, int code, bool then_eof)
{
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_msg(rep != NULL, "connection closed, expected error %d", code);
    ck_assert_msg(rep->error.code == -code, "id %u: error %d (%s), expected %d", rep->id,
                  -rep->error.code, rep->error.msg, code);
    ck_assert_uint_eq(rep->id, id);
    ck_assert_msg(rep->error.msg[0] != '\0', "error %d without a message", code);
    proto_reply_destroy(rep);
    if (then_eof)
        ck_assert_ptr_null(raw_reply(fd));
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void pack_head(msgpack_packer *pk, uint32_t id, const char *op, uint32_t extra)
{
    msgpack_pack_map(pk, 2 + extra);
    pack_str(pk, "id");
    msgpack_pack_uint32(pk, id);
    pack_str(pk, "op");
    pack_str(pk, op);
}

/* A scan of one inline buffer, or of a memfd when `data` is NULL. */
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

static void send_scan(int fd, const uint8_t *fp, uint32_t id, const void *data, size_t len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_scan(&pk, id, fp, data, len);
    raw_frame(fd, &sb);
    msgpack_sbuffer_destroy(&sb);
}

static void send_ping(int fd, uint32_t id)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(&pk, id, "ping", 0);
    raw_frame(fd, &sb);
    msgpack_sbuffer_destroy(&sb);
}

/* Sends up to `len` bytes without blocking for long: stops once the peer
 * has taken nothing for `stall_ms`. Returns the bytes sent. */
static size_t push_bytes(int fd, const uint8_t *data, size_t len, int stall_ms)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, data + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            break;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, stall_ms) != 1)
            break;
    }
    return off;
}

/* ---- 4: a client that never reads its replies ------------------------- */

START_TEST(test_unread_replies_close)
{
    struct daemon d;
    const char *const flags[] = {"--max-unsent-bytes", "256K", NULL};
    daemon_start(&d, flags);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES);
    /* Every 8 bytes a hit: each reply is tens of KiB. */
    static uint8_t data[64 << 10];
    for (size_t i = 0; i + 8 <= sizeof(data); i += 8)
        memcpy(data + i, "needle! ", 8);
    int fd = raw_connect(&d);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    uint64_t rss0 = rss_of(d.pid);
    /* Pipeline scans and read nothing; the daemon closes us at the limit. */
    size_t sent = 0;
    for (uint32_t i = 0; i < 200; i++) {
        uint8_t hdr[4];
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        pack_scan(&pk, i + 1, vks_catalog_fingerprint(cat), data, sizeof(data));
        hdr[0] = (uint8_t)(sb.size >> 24), hdr[1] = (uint8_t)(sb.size >> 16);
        hdr[2] = (uint8_t)(sb.size >> 8), hdr[3] = (uint8_t)sb.size;
        size_t a = push_bytes(fd, hdr, 4, 500);
        size_t b = a == 4 ? push_bytes(fd, (const uint8_t *)sb.data, sb.size, 500) : 0;
        msgpack_sbuffer_destroy(&sb);
        if (a != 4 || b != sb.size)
            break; /* the daemon stopped reading us, or closed */
        sent++;
    }
    ck_assert_uint_gt(sent, 0);
    /* The daemon closed the connection for its unread replies. */
    for (int i = 0; i < 600 && stat_of(c, "output_limit_closes") == 0; i++)
        usleep(50000);
    ck_assert_uint_eq(stat_of(c, "output_limit_closes"), 1);
    ck_assert_uint_eq(stat_of(c, "limit.max_unsent_bytes"), 256 << 10);
    /* What it held for us stays far below what we asked it to hold. */
    ck_assert_uint_lt(rss_of(d.pid), rss0 + (64ull << 20));
    struct proto_reply *rep;
    while ((rep = raw_reply(fd)) != NULL)
        proto_reply_destroy(rep); /* some replies, then the end */
    close(fd);
    expect_ping_ok(&d);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 5: half-sent frames ---------------------------------------------- */

START_TEST(test_half_sent_frames)
{
    struct daemon d;
    const char *const flags[] = {"--max-frame", "4M", "--frame-budget", "1M", "--frame-timeout-ms",
                                 "60000",       NULL};
    daemon_start(&d, flags);
    expect_ping_ok(&d);
    uint64_t rss0 = rss_of(d.pid);
    enum { N = 8 };
    static uint8_t junk[3 << 20];
    memset(junk, 0x90, sizeof(junk));
    int fds[N];
    size_t pushed = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(&d);
        uint8_t hdr[4] = {0, 0x40, 0, 0}; /* 4 MiB announced */
        ck_assert_uint_eq(push_bytes(fds[i], hdr, 4, 1000), 4);
        pushed += push_bytes(fds[i], junk, sizeof(junk), 300);
    }
    struct vks_client *c = connect_ok(&d);
    /* One frame holds the budget (one always may, up to max-frame); the
     * others wait with nothing but their length prefix read. */
    ck_assert_uint_le(stat_of(c, "frame_budget_used"), 4u << 20);
    ck_assert_uint_ge(stat_of(c, "frame_budget_waits"), N - 1);
    uint64_t grown = rss_of(d.pid) - rss0;
    ck_assert_msg(grown < (12ull << 20), "RSS grew by %llu bytes for %zu half-sent bytes",
                  (unsigned long long)grown, pushed);
    ck_assert_int_eq(vks_client_ping(c, NULL), 0); /* still serving */
    for (int i = 0; i < N; i++)
        close(fds[i]);
    for (int i = 0; i < 600 && stat_of(c, "frame_budget_used") != 0; i++)
        usleep(20000);
    ck_assert_uint_eq(stat_of(c, "frame_budget_used"), 0);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_frame_timeout)
{
    struct daemon d;
    const char *const flags[] = {"--frame-timeout-ms", "300", NULL};
    daemon_start(&d, flags);
    /* Two bytes of a length prefix, then silence. */
    int a = raw_connect(&d);
    ck_assert_int_eq(send(a, "\0\0", 2, 0), 2);
    /* A header and half a body, then silence. */
    int b = raw_connect(&d);
    ck_assert_int_eq(send(b,
                          "\0\0\0\x10"
                          "abcdefgh",
                          12, 0),
                     12);
    expect_error(a, 0, VKS_E_TIMEOUT, true);
    expect_error(b, 0, VKS_E_TIMEOUT, true);
    close(a);
    close(b);
    ck_assert_uint_eq(stat_now(&d, "frame_timeouts"), 2);
    expect_ping_ok(&d);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 6: one uid's idle connections lock out the rest ------------------ */

static int other_pings(const struct daemon *d, void *arg)
{
    (void)arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    int rc = vks_client_ping(c, NULL) == 0 ? 0 : 2;
    vks_client_close(c);
    return rc;
}

START_TEST(test_tenant_connection_cap)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_tenant_connection_cap: needs root to switch uid; skipped\n");
        return;
    }
    struct daemon d;
    const char *const flags[] = {"--tenant-max-connections",
                                 "4",
                                 "--max-connections",
                                 "6",
                                 "--idle-timeout-ms",
                                 "600000",
                                 NULL};
    daemon_start(&d, flags);
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = raw_connect(&d);
        send_ping(fds[i], 1); /* each one is surely accepted */
        struct proto_reply *rep = raw_reply(fds[i]);
        ck_assert_ptr_nonnull(rep);
        proto_reply_destroy(rep);
    }
    int over = raw_connect(&d);
    expect_error(over, 0, VKS_E_BUSY, true);
    close(over);
    /* libvkscan reports the refusal itself, not the reset after it */
    struct vks_client *refused = NULL;
    struct vks_error rerr = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &refused, &rerr), -VKS_E_BUSY);
    ck_assert_ptr_null(refused);
    ck_assert_msg(strstr(rerr.msg, "tenant-max-connections") != NULL, "%s", rerr.msg);
    /* Another uid still gets in. */
    ck_assert_int_eq(as_uid(&d, 65534, other_pings, NULL), 0);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    struct vks_client *c = NULL;
    for (int i = 0; i < 100 && vks_client_connect(d.sock, NULL, &c, NULL) != 0; i++)
        usleep(50000); /* until the daemon has seen the closes */
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_ge(stat_of(c, "connections_refused_tenant"), 1);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_idle_timeout)
{
    struct daemon d;
    const char *const flags[] = {"--idle-timeout-ms", "300", NULL};
    daemon_start(&d, flags);
    int fd = raw_connect(&d);
    send_ping(fd, 7);
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_uint_eq(rep->id, 7);
    proto_reply_destroy(rep);
    expect_error(fd, 0, VKS_E_TIMEOUT, true); /* then silence closes it */
    close(fd);
    ck_assert_uint_ge(stat_now(&d, "idle_closes"), 1);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 7: EMFILE ---------------------------------------------------------- */

static unsigned count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    unsigned n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

START_TEST(test_accept_emfile)
{
    struct daemon d = {.pid = 0};
    const char *const flags[] = {"--tenant-max-connections", "1000", "--cpu-threads", "2", NULL};
    daemon_start_lim(&d, flags, 128);
    enum { N = 200 };
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = raw_connect(&d); /* the backlog takes what accept cannot */
    /* Give the daemon a while in the condition. */
    send_ping(fds[0], 1);
    struct proto_reply *rep = raw_reply(fds[0]);
    ck_assert_ptr_nonnull(rep);
    proto_reply_destroy(rep);
    usleep(1000 * 1000);
    unsigned lines = count_lines(d.log, "accept failed");
    ck_assert_uint_ge(lines, 1);
    ck_assert_msg(lines <= 3, "%u log lines about accept in one second", lines);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    /* Accepting again once descriptors are free. */
    struct vks_client *c = NULL;
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++) {
        rc = vks_client_connect(d.sock, NULL, &c, NULL);
        if (rc != 0)
            usleep(50000);
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(vks_client_ping(c, NULL), 0);
    ck_assert_uint_ge(stat_of(c, "accept_fd_limit"), 1);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* Sends a scan of memfd `mfd` (the descriptor goes with the frame's first
 * byte). */
static void send_fd_scan(int fd, const uint8_t *fp, uint32_t id, int mfd)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(&pk, id, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "fd");
    msgpack_pack_uint32(&pk, 0);
    uint8_t hdr[4] = {(uint8_t)(sb.size >> 24), (uint8_t)(sb.size >> 16), (uint8_t)(sb.size >> 8),
                      (uint8_t)sb.size};
    ck_assert_int_eq(proto_send(fd, hdr, 4, &mfd, 1, 10000, NULL), 0);
    ck_assert_int_eq(proto_send(fd, sb.data, sb.size, NULL, 0, 10000, NULL), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* A descriptor the daemon cannot take because it is out of them (found by
 * bench/attack_all: libvkscan sends large inline buffers as memfds) was
 * answered TOO_MANY_FDS, "more than 64 descriptors came with one frame",
 * blaming a client that sent one. It is BUSY, and the connection goes on. */
START_TEST(test_fd_scan_at_emfile)
{
    struct daemon d = {.pid = 0};
    const char *const flags[] = {"--tenant-max-connections", "1000", "--cpu-threads", "2", NULL};
    daemon_start_lim(&d, flags, 128);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    int fd = raw_connect(&d);
    send_ping(fd, 1); /* accepted before the descriptors run out */
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    proto_reply_destroy(rep);
    int mfd = memfd_create("vka-emfile", MFD_CLOEXEC);
    ck_assert_int_ge(mfd, 0);
    ck_assert_int_eq(write(mfd, "a needle here", 13), 13);
    enum { N = 200 };
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = raw_connect(&d);
    for (int i = 0; i < 100 && stat_of(c, "accept_fd_limit") == 0; i++)
        usleep(20000);
    ck_assert_uint_ge(stat_of(c, "accept_fd_limit"), 1);
    /* The daemon frees a descriptor for a moment while it turns away a
     * connection at EMFILE (its reserve descriptor), so a scan may slip
     * in then: it must succeed, and a later one must get BUSY, never
     * TOO_MANY_FDS. */
    bool busy = false;
    for (uint32_t i = 0; i < 50 && !busy; i++) {
        send_fd_scan(fd, fp, 2 + i, mfd);
        rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        ck_assert_uint_eq(rep->id, 2 + i);
        ck_assert_msg(rep->error.code == -VKS_E_BUSY || rep->error.code == 0,
                      "error %d (%s), expected BUSY", -rep->error.code, rep->error.msg);
        busy = rep->error.code == -VKS_E_BUSY;
        if (busy)
            ck_assert_ptr_nonnull(strstr(rep->error.msg, "out of file descriptors"));
        else
            usleep(20000);
        proto_reply_destroy(rep);
    }
    ck_assert(busy);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    /* Once descriptors are free, the same scan on the same connection. */
    bool ok = false;
    for (uint32_t i = 0; i < 100 && !ok; i++) {
        send_fd_scan(fd, fp, 100 + i, mfd);
        rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->error.code == 0 || rep->error.code == -VKS_E_BUSY, "error %d (%s)",
                      -rep->error.code, rep->error.msg);
        ok = rep->error.code == 0;
        if (ok)
            ck_assert_uint_eq(rep->u.scan.n_hits, 1);
        proto_reply_destroy(rep);
        if (!ok)
            usleep(50000);
    }
    ck_assert(ok);
    close(mfd);
    close(fd);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 11: stats are per tenant ----------------------------------------- */

static int other_stats(const struct daemon *d, void *arg)
{
    (void)arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    struct vks_stats st = {0};
    int fail = 0;
    if (vks_client_stats(c, &st, NULL) != 0)
        return 2;
    if (vks_stat_find(st.stats, st.n_stats, "scans") != NULL ||
        vks_stat_find(st.stats, st.n_stats, "bytes_scanned") != NULL ||
        vks_stat_find(st.stats, st.n_stats, "requests") != NULL)
        fail |= 4; /* service-wide volume is not this tenant's business */
    const struct vks_stat *u = vks_stat_find(st.stats, st.n_stats, "tenant.uid");
    if (u == NULL || u->u != 65534)
        fail |= 8;
    if (vks_stat_find(st.stats, st.n_stats, "limit.max_frame") == NULL)
        fail |= 16;
    vks_stats_finish(&st);
    vks_client_close(c);
    return fail;
}

START_TEST(test_stats_per_tenant)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_stats_per_tenant: needs root to switch uid; skipped\n");
        return;
    }
    struct daemon d;
    daemon_start(&d, NULL);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES);
    uint8_t data[] = "a needle here";
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data) - 1};
    struct vks_scan_result res = {0};
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, NULL, &res, NULL), 0);
    vks_scan_result_finish(&res);
    ck_assert_int_eq(as_uid(&d, 65534, other_stats, NULL), 0);
    ck_assert_uint_eq(stat_of(c, "scans"), 1); /* root sees the service */
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

static int admin_stats(const struct daemon *d, void *arg)
{
    (void)arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    struct vks_stats st = {0};
    if (vks_client_stats(c, &st, NULL) != 0)
        return 2;
    const struct vks_stat *a = vks_stat_find(st.stats, st.n_stats, "admin");
    int fail = vks_stat_find(st.stats, st.n_stats, "scans") == NULL || a == NULL || a->u != 1;
    vks_stats_finish(&st);
    vks_client_close(c);
    return fail ? 4 : 0;
}

/* A member of admin-gids sees the service-wide figures like root. */
START_TEST(test_stats_admin_gids)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_stats_admin_gids: needs root to switch uid; skipped\n");
        return;
    }
    struct daemon d;
    const char *const flags[] = {"--admin-gids", "65534", NULL};
    daemon_start(&d, flags);
    ck_assert_int_eq(as_uid(&d, 65534, admin_stats, NULL), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 12: SIGTERM with pipelined requests unread ----------------------- */

/* Both with exact reads and with read-ahead (a hello that allows it): then
 * the ten scans behind the long one sit in the reader's read-ahead, not in
 * the socket, and must not be taken for none. */
START_TEST(test_drain_answers_unread)
{
    struct daemon d;
    const char *const flags[] = {
        "--tenant-max-requests", "1", "--max-scan-bytes", "1G", "--tenant-max-bytes", "1G", NULL};
    daemon_start(&d, flags);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    int mfd = memfd_create("vka-big", MFD_CLOEXEC);
    ck_assert_int_ge(mfd, 0);
    ck_assert_int_eq(ftruncate(mfd, 512 << 20), 0);
    int fd = raw_connect(&d);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (_i == 1) {
        pack_head(&pk, 999, "hello", 2);
        pack_str(&pk, "version");
        msgpack_pack_uint32(&pk, 1);
        pack_str(&pk, "read_ahead");
        msgpack_pack_true(&pk);
        raw_frame(fd, &sb);
        msgpack_sbuffer_clear(&sb);
        struct proto_reply *hello = raw_reply(fd);
        ck_assert_ptr_nonnull(hello);
        ck_assert_int_eq(hello->error.code, 0);
        proto_reply_destroy(hello);
        ck_assert_uint_eq(stat_of(c, "read_ahead"), 2); /* libvkscan's and this one */
    }
    /* A long scan (512 MiB from a memfd), then ten more the daemon will not
     * read while it runs (tenant-max-requests 1), then SIGTERM. */
    pack_head(&pk, 1, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "fd");
    msgpack_pack_uint32(&pk, 0);
    uint8_t hdr[4] = {(uint8_t)(sb.size >> 24), (uint8_t)(sb.size >> 16), (uint8_t)(sb.size >> 8),
                      (uint8_t)sb.size};
    ck_assert_int_eq(proto_send(fd, hdr, 4, &mfd, 1, 10000, NULL), 0);
    ck_assert_int_eq(proto_send(fd, sb.data, sb.size, NULL, 0, 10000, NULL), 0);
    msgpack_sbuffer_destroy(&sb);
    close(mfd);
    for (uint32_t i = 0; i < 10; i++)
        send_scan(fd, fp, 100 + i, "needle", 6);
    kill(d.pid, SIGTERM);
    unsigned shut = 0, ok = 0;
    for (;;) {
        struct proto_reply *rep = raw_reply(fd);
        if (rep == NULL)
            break;
        if (rep->error.code == -VKS_E_SHUTDOWN)
            shut++;
        else if (rep->error.code == 0)
            ok++;
        else
            ck_abort_msg("id %u: error %d %s", rep->id, -rep->error.code, rep->error.msg);
        proto_reply_destroy(rep);
    }
    ck_assert_uint_eq(ok + shut, 11); /* every request answered: none reset */
    ck_assert_uint_ge(shut, 1);
    close(fd);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    int st;
    ck_assert_int_eq(waitpid(d.pid, &st, 0), d.pid);
    d.pid = 0;
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    daemon_stop(&d);
}
END_TEST

/* ---- 10: a lone tenant's backlog goes in pieces ---------------------- */

static uint64_t rep_tel(const struct proto_reply *rep, const char *key)
{
    for (uint32_t i = 0; i < rep->u.scan.n_telemetry; i++) {
        if (strcmp(rep->u.scan.telemetry[i].key, key) == 0)
            return rep->u.scan.telemetry[i].u;
    }
    ck_abort_msg("telemetry has no %s", key);
    return 0;
}

struct tenant_b {
    int go[2], out[2];
};

/* Tenant B: loads its catalog, waits for "go", scans 6 bytes, reports the
 * batch its scan ran in. */
static int tenant_b_scan(const struct daemon *d, void *arg)
{
    struct tenant_b *b = arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    struct vks_catalog *cat = NULL;
    if (vks_client_catalog_load(c, rules, N_RULES, NULL, &cat, NULL) != 0)
        return 2;
    char go;
    if (write(b->out[1], "r", 1) != 1 || read(b->go[0], &go, 1) != 1)
        return 3;
    uint8_t data[] = "needle";
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = 6};
    struct vks_scan_result res = {0};
    if (vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, NULL, &res, NULL) != 0)
        return 4;
    const struct vks_stat *id = vks_stat_find(res.telemetry, res.n_telemetry, "batch_id");
    uint64_t v = id != NULL ? id->u : 0;
    if (write(b->out[1], &v, sizeof(v)) != (ssize_t)sizeof(v))
        return 5;
    vks_scan_result_finish(&res);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    return 0;
}

START_TEST(test_small_scan_not_behind_backlog)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_small_scan_not_behind_backlog: needs root; skipped\n");
        return;
    }
    struct daemon d;
    const char *const flags[] = {"--inflight-batches",
                                 "1",
                                 "--batch-max-ms",
                                 "1",
                                 "--max-scan-bytes",
                                 "1G",
                                 "--tenant-max-bytes",
                                 "2G",
                                 NULL};
    daemon_start(&d, flags);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    struct tenant_b b;
    ck_assert_int_eq(pipe(b.go), 0);
    ck_assert_int_eq(pipe(b.out), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(100);
        _exit(tenant_b_scan(&d, &b));
    }
    char ready;
    ck_assert_int_eq(read(b.out[0], &ready, 1), 1);
    /* A: one long scan (the engine is busy), then a backlog of 32 x 1 MiB. */
    int a = raw_connect(&d);
    int mfd = memfd_create("vka-long", MFD_CLOEXEC);
    ck_assert_int_ge(mfd, 0);
    ck_assert_int_eq(ftruncate(mfd, 256 << 20), 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(&pk, 1, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "fd");
    msgpack_pack_uint32(&pk, 0);
    uint8_t hdr[4] = {(uint8_t)(sb.size >> 24), (uint8_t)(sb.size >> 16), (uint8_t)(sb.size >> 8),
                      (uint8_t)sb.size};
    ck_assert_int_eq(proto_send(a, hdr, 4, &mfd, 1, 10000, NULL), 0);
    ck_assert_int_eq(proto_send(a, sb.data, sb.size, NULL, 0, 10000, NULL), 0);
    msgpack_sbuffer_destroy(&sb);
    close(mfd);
    static uint8_t mib[1 << 20];
    memset(mib, 'q', sizeof(mib));
    for (uint32_t i = 0; i < 32; i++)
        send_scan(a, fp, 100 + i, mib, sizeof(mib));
    /* The long scan's reply: its batch is done and the next one formed from
     * A's backlog; B arrives now. */
    struct proto_reply *rep = raw_reply(a);
    ck_assert_ptr_nonnull(rep);
    ck_assert_msg(rep->error.code == 0 && rep->id == 1, "long scan: %s", rep->error.msg);
    proto_reply_destroy(rep);
    ck_assert_int_eq(write(b.go[1], "g", 1), 1);
    uint64_t last_a = 0;
    for (int i = 0; i < 32; i++) {
        rep = raw_reply(a);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->error.code == 0, "scan %u: %s", rep->id, rep->error.msg);
        uint64_t id = rep_tel(rep, "batch_id");
        last_a = id > last_a ? id : last_a;
        proto_reply_destroy(rep);
    }
    uint64_t b_batch = 0;
    ck_assert_int_eq(read(b.out[0], &b_batch, sizeof(b_batch)), (ssize_t)sizeof(b_batch));
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_msg(b_batch < last_a,
                  "B's scan ran in batch %llu, after A's whole backlog (last %llu)",
                  (unsigned long long)b_batch, (unsigned long long)last_a);
    close(a);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 10: a small scan beside buffers that cannot be split ------------ */

struct tenant_c {
    int go[2], done[2];
};

/* Tenant C: loads the catalog, waits for "go", scans 6 bytes, reports. */
static int tenant_c_scan(const struct daemon *d, void *arg)
{
    struct tenant_c *tc = arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    struct vks_catalog *cat = NULL;
    if (vks_client_catalog_load(c, rules, N_RULES, NULL, &cat, NULL) != 0)
        return 2;
    char go;
    if (write(tc->done[1], "r", 1) != 1 || read(tc->go[0], &go, 1) != 1)
        return 3;
    uint8_t data[] = "needle";
    struct vks_buffer vb = {.kind = VKS_BUFFER_INLINE, .data = data, .len = 6};
    struct vks_scan_result res = {0};
    if (vks_client_scan(c, vks_catalog_fingerprint(cat), &vb, 1, NULL, &res, NULL) != 0 ||
        res.n_hits != 1)
        return 4;
    if (write(tc->done[1], "d", 1) != 1)
        return 5;
    vks_scan_result_finish(&res);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    return 0;
}

/* The catalog's `ab[0-9]+c` is unbounded, so a buffer is one task on the CPU
 * engine, however large: two of them used to take both threads, and another
 * tenant's 6-byte scan waited for one to end (bench/attack_all: 50 ms behind
 * 4 MiB scans). Now one thread is kept for small batches and the server lets
 * one small scan past a full engine: C's reply comes before A's first. */
START_TEST(test_small_scan_beside_unsplittable)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_small_scan_beside_unsplittable: needs root; skipped\n");
        return;
    }
    struct daemon d;
    const char *const flags[] = {
        "--cpu-threads", "2", "--max-scan-bytes", "1G", "--tenant-max-bytes", "2G", NULL};
    daemon_start(&d, flags);
    struct vks_client *c = connect_ok(&d);
    struct vks_catalog *cat = load_ok(c, rules, N_RULES);
    const uint8_t *fp = vks_catalog_fingerprint(cat);
    struct tenant_c tc;
    ck_assert_int_eq(pipe(tc.go), 0);
    ck_assert_int_eq(pipe(tc.done), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(100);
        _exit(tenant_c_scan(&d, &tc));
    }
    char ready;
    ck_assert_int_eq(read(tc.done[0], &ready, 1), 1);
    /* A: two scans of 256 MiB of "ab12" (a candidate every 4 bytes, no match). */
    int mfd = memfd_create("vka-unsplit", MFD_CLOEXEC);
    ck_assert_int_ge(mfd, 0);
    static uint8_t chunk[1 << 20];
    for (size_t i = 0; i < sizeof(chunk); i += 4)
        memcpy(chunk + i, "ab12", 4);
    for (int i = 0; i < 256; i++)
        ck_assert_int_eq(write(mfd, chunk, sizeof(chunk)), (ssize_t)sizeof(chunk));
    int a = raw_connect(&d);
    send_fd_scan(a, fp, 1, mfd);
    send_fd_scan(a, fp, 2, mfd);
    close(mfd);
    usleep(300000); /* let both start: the order below is what is checked */
    ck_assert_int_eq(write(tc.go[1], "g", 1), 1);
    char done;
    ck_assert_int_eq(read(tc.done[0], &done, 1), 1);
    ck_assert_int_eq(done, 'd');
    /* C is done; A's scans are not (each is seconds of one thread). */
    struct pollfd p = {.fd = a, .events = POLLIN};
    ck_assert_msg(poll(&p, 1, 0) == 0, "A's 256 MiB scan was answered before C's 6 bytes");
    for (int i = 0; i < 2; i++) {
        struct proto_reply *rep = raw_reply(a);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->error.code == 0, "scan %u: %s", rep->id, rep->error.msg);
        proto_reply_destroy(rep);
    }
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(a);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 15: client bytes echoed in replies are valid UTF-8 ------------- */

START_TEST(test_replies_are_utf8)
{
    struct daemon d;
    daemon_start(&d, NULL);
    int fd = raw_connect(&d);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_head(&pk, 5,
              "sc\xff\xfe\xc0\xaf"
              "an",
              0);
    raw_frame(fd, &sb);
    msgpack_sbuffer_clear(&sb);
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->error.code, -VKS_E_UNKNOWN_OP);
    ck_assert(proto_utf8_valid((const uint8_t *)rep->error.msg, strlen(rep->error.msg)));
    ck_assert_ptr_nonnull(strstr(rep->error.msg, "sc\xef\xbf\xbd"));
    proto_reply_destroy(rep);
    /* A rule id that is not UTF-8 comes back with U+FFFD in its place. */
    pack_head(&pk, 6, "catalog.load", 1);
    pack_str(&pk, "rules");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "id");
    pack_str(&pk, "r\xc3\x28");
    pack_str(&pk, "kind");
    pack_str(&pk, "literal");
    pack_str(&pk, "pattern");
    pack_str(&pk, "needle");
    raw_frame(fd, &sb);
    msgpack_sbuffer_destroy(&sb);
    rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_msg(rep->error.code == 0, "load: %s", rep->error.msg);
    ck_assert_uint_eq(rep->u.catalog.n_rules, 1);
    const char *id = rep->u.catalog.rules[0].id;
    ck_assert(proto_utf8_valid((const uint8_t *)id, strlen(id)));
    ck_assert_str_eq(id, "r\xef\xbf\xbd(");
    proto_reply_destroy(rep);
    close(fd);
    expect_ping_ok(&d);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 8 and 9: compiles ------------------------------------------------ */

/* A catalog.load of `n` regex rules, distinct per `seed`: ten overlapping
 * classes with repeats each, no literal factor, so every rule goes through
 * DFA construction and minimisation. 60 of them took 2 s of compiling on
 * one core of the 2-core development machine (the compiler's later speed-ups
 * made the earlier word-and-digits rules compile in milliseconds). */
static void pack_slow_load(msgpack_packer *pk, uint32_t id, int seed, int n, uint64_t max_states)
{
    static const char *const cls[8] = {"[a-h]", "[i-p]", "[q-x]", "[0-7]",
                                       "[A-H]", "[I-P]", "[a-p]", "[h-x]"};
    static const char *const rep[5] = {"", "+", "{1,3}", "*", "{2,6}"};
    pack_head(pk, id, "catalog.load", max_states != 0 ? 2 : 1);
    if (max_states != 0) {
        pack_str(pk, "max_states");
        msgpack_pack_uint64(pk, max_states);
    }
    pack_str(pk, "rules");
    msgpack_pack_array(pk, (uint32_t)n);
    uint32_t x = 2463534242u ^ (uint32_t)seed * 2654435761u;
    for (int i = 0; i < n; i++) {
        char pat[256], id_s[32];
        size_t len = 0;
        for (int k = 0; k < 10; k++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            len += (size_t)snprintf(pat + len, sizeof(pat) - len, "%s%s", cls[x % 8],
                                    rep[(x >> 8) % 5]);
        }
        snprintf(id_s, sizeof(id_s), "s%d-%d", seed, i);
        msgpack_pack_map(pk, 3);
        pack_str(pk, "id");
        pack_str(pk, id_s);
        pack_str(pk, "kind");
        pack_str(pk, "regex");
        pack_str(pk, "pattern");
        pack_str(pk, pat);
    }
}

static void send_slow_load(int fd, uint32_t id, int seed, int n, uint64_t max_states)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_slow_load(&pk, id, seed, n, max_states);
    raw_frame(fd, &sb);
    msgpack_sbuffer_destroy(&sb);
}

START_TEST(test_max_states_ceiling)
{
    struct daemon d;
    const char *const flags[] = {"--max-states", "100000", NULL};
    daemon_start(&d, flags);
    int fd = raw_connect(&d);
    send_slow_load(fd, 1, 0, 2, 4000000000ull);
    expect_error(fd, 1, VKS_E_LIMIT, false);
    send_slow_load(fd, 2, 0, 2, 100001);
    expect_error(fd, 2, VKS_E_LIMIT, false);
    send_slow_load(fd, 3, 0, 2, 100000); /* at the ceiling: fine */
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_msg(rep->error.code == 0, "load at the ceiling: %s", rep->error.msg);
    proto_reply_destroy(rep);
    close(fd);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

static int load_one_rule(const struct daemon *d, void *arg)
{
    (void)arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    static const struct vks_rule one[] = {{"b", VKS_RULE_LITERAL, "tenant-b", 0, NULL}};
    struct vks_catalog *cat = NULL;
    int rc = vks_client_catalog_load(c, one, 1, NULL, &cat, NULL) == 0 ? 0 : 2;
    vks_catalog_destroy(cat);
    vks_client_close(c);
    return rc;
}

/* Tenant A's slow compiles fill nothing but A's share of the compile pool:
 * tenant B's one-rule load answers before any of A's compiles finish. Then
 * SIGTERM stops A's compiles: their loads get SHUTDOWN, not a result. */
START_TEST(test_compiles_isolated_and_drained)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_compiles_isolated_and_drained: needs root; skipped\n");
        return;
    }
    struct daemon d;
    const char *const flags[] = {"--compile-threads", "2", "--tenant-max-compiles", "1", NULL};
    daemon_start(&d, flags);
    int a = raw_connect(&d);
    for (int i = 0; i < 4; i++)
        send_slow_load(a, 10 + (uint32_t)i, i + 1, 40, 0);
    ck_assert_int_eq(as_uid(&d, 65534, load_one_rule, NULL), 0);
    struct pollfd p = {.fd = a, .events = POLLIN};
    ck_assert_msg(poll(&p, 1, 0) == 0, "one of A's compiles finished before B's load answered");
    kill(d.pid, SIGTERM);
    unsigned ok = 0, shut = 0;
    struct proto_reply *rep;
    while ((rep = raw_reply(a)) != NULL) {
        if (rep->error.code == 0)
            ok++;
        else if (rep->error.code == -VKS_E_SHUTDOWN)
            shut++;
        else
            ck_abort_msg("load %u: %d %s", rep->id, -rep->error.code, rep->error.msg);
        proto_reply_destroy(rep);
    }
    ck_assert_uint_eq(ok + shut, 4);
    ck_assert_uint_ge(shut, 3); /* at most the running one could finish first */
    close(a);
    int st;
    ck_assert_int_eq(waitpid(d.pid, &st, 0), d.pid);
    d.pid = 0;
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    daemon_stop(&d);
}
END_TEST

START_TEST(test_compile_timeout)
{
    struct daemon d;
    const char *const flags[] = {"--compile-timeout-ms", "200", NULL};
    daemon_start(&d, flags);
    int fd = raw_connect(&d);
    send_slow_load(fd, 1, 7, 60, 0);
    expect_error(fd, 1, VKS_E_TIMEOUT, false);
    send_slow_load(fd, 2, 8, 1, 0); /* a small one still compiles */
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_msg(rep->error.code == 0, "small load: %s", rep->error.msg);
    proto_reply_destroy(rep);
    close(fd);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* A compile whose client left stops: the next load (one compile thread)
 * answers before that compile could have finished. */
START_TEST(test_compile_stops_when_client_leaves)
{
    struct daemon d;
    const char *const flags[] = {"--compile-threads", "1", NULL};
    daemon_start(&d, flags);
    int a = raw_connect(&d);
    send_slow_load(a, 1, 40, 60, 0);
    struct vks_client *c = connect_ok(&d);
    /* Once A's compile runs (catalog.has answers after a loop turn), A leaves. */
    ck_assert_int_eq(vks_client_ping(c, NULL), 0);
    close(a);
    static const struct vks_rule one[] = {{"x", VKS_RULE_LITERAL, "after", 0, NULL}};
    struct vks_catalog *cat = load_ok(c, one, 1);
    ck_assert_uint_eq(stat_of(c, "catalog_compiles"), 1); /* only this one finished */
    ck_assert_uint_eq(stat_of(c, "catalog_compiles_stopped"), 1);
    vks_catalog_destroy(cat);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

static int backpressure_seen(const struct daemon *d, void *arg)
{
    (void)arg;
    struct vks_client *c = NULL;
    if (vks_client_connect(d->sock, NULL, &c, NULL) != 0)
        return 1;
    struct vks_stats st = {0};
    int rc = 2;
    for (int i = 0; i < 200 && rc != 0; i++) {
        if (vks_client_stats(c, &st, NULL) != 0)
            return 3;
        const struct vks_stat *b = vks_stat_find(st.stats, st.n_stats, "backpressure");
        rc = b != NULL && b->u >= 1 ? 0 : 2;
        vks_stats_finish(&st);
        if (rc != 0)
            usleep(20000);
    }
    vks_client_close(c);
    return rc;
}

/* Loads waiting for a compile hold their frames: a tenant's requests in
 * flight are bounded by tenant-max-bytes, not only its scans. */
START_TEST(test_pending_loads_bounded)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_pending_loads_bounded: needs root; skipped\n");
        return;
    }
    struct daemon d;
    const char *const flags[] = {
        "--tenant-max-bytes", "8K", "--compile-threads", "1", "--admin-gids", "65534", NULL};
    daemon_start(&d, flags);
    int a = raw_connect(&d);
    for (int i = 0; i < 12; i++)
        send_slow_load(a, 1 + (uint32_t)i, 60 + i, 40, 0); /* about 3 KiB each */
    ck_assert_int_eq(as_uid(&d, 65534, backpressure_seen, NULL), 0);
    close(a);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 11: catalog.load says `cached` only for what this tenant had ----- */

static int load_twice(const struct daemon *d, void *arg)
{
    (void)arg;
    int fd = raw_connect(d);
    int fail = 0;
    for (uint32_t i = 0; i < 2; i++) {
        send_slow_load(fd, i + 1, 99, 2, 0);
        struct proto_reply *rep = raw_reply(fd);
        if (rep == NULL || rep->error.code != 0)
            return 1;
        if (i == 0 && (rep->u.catalog.cached || rep->u.catalog.compile_ns == 0))
            fail |= 2; /* new to this tenant: as if it compiled */
        if (i == 1 && !rep->u.catalog.cached)
            fail |= 4;
        proto_reply_destroy(rep);
    }
    close(fd);
    return fail;
}

START_TEST(test_cached_per_tenant)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_cached_per_tenant: needs root; skipped\n");
        return;
    }
    struct daemon d;
    daemon_start(&d, NULL);
    int fd = raw_connect(&d);
    send_slow_load(fd, 1, 99, 2, 0); /* root compiles it first */
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    ck_assert_int_eq(rep->error.code, 0);
    ck_assert(!rep->u.catalog.cached);
    proto_reply_destroy(rep);
    close(fd);
    /* After a restart too (the disk cache answers): nothing says root had it. */
    daemon_restart(&d);
    ck_assert_int_eq(as_uid(&d, 65534, load_twice, NULL), 0);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- 15: the disk cache closes what it wrote, also when fdatasync fails */

static unsigned open_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    unsigned n = 0;
    while (readdir(dir) != NULL)
        n++;
    closedir(dir);
    return n;
}

START_TEST(test_fdatasync_failure_closes)
{
    const char *shim = getenv("ATTACK_SHIM");
    ck_assert_msg(shim != NULL, "ATTACK_SHIM is not set: run through meson test");
    struct daemon d;
    preload = shim;
    daemon_start(&d, NULL);
    preload = NULL;
    int fd = raw_connect(&d);
    send_slow_load(fd, 1, 500, 1, 0);
    struct proto_reply *rep = raw_reply(fd);
    ck_assert_ptr_nonnull(rep);
    proto_reply_destroy(rep);
    usleep(200000); /* the first disk writes settle */
    unsigned before = open_fds(d.pid);
    for (uint32_t i = 0; i < 20; i++) {
        send_slow_load(fd, 2 + i, 501 + (int)i, 1, 0);
        rep = raw_reply(fd);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->error.code == 0, "load %u: %s", i, rep->error.msg);
        proto_reply_destroy(rep);
    }
    struct vks_client *c = connect_ok(&d);
    for (int i = 0; i < 100 && stat_of(c, "catalog_disk_errors") < 40; i++)
        usleep(20000);
    ck_assert_uint_ge(stat_of(c, "catalog_disk_errors"), 40); /* the shim did fail them */
    vks_client_close(c);
    unsigned after = open_fds(d.pid);
    ck_assert_msg(after < before + 10, "%u descriptors open after 20 failed saves, %u before",
                  after, before);
    close(fd);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

Suite *attack_suite(void)
{
    Suite *s = suite_create("attack");
    TCase *tc = tcase_create("daemon");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_unread_replies_close);
    tcase_add_test(tc, test_half_sent_frames);
    tcase_add_test(tc, test_frame_timeout);
    tcase_add_test(tc, test_tenant_connection_cap);
    tcase_add_test(tc, test_idle_timeout);
    tcase_add_test(tc, test_accept_emfile);
    tcase_add_test(tc, test_fd_scan_at_emfile);
    tcase_add_test(tc, test_stats_per_tenant);
    tcase_add_test(tc, test_stats_admin_gids);
    tcase_add_loop_test(tc, test_drain_answers_unread, 0, 2);
    tcase_add_test(tc, test_small_scan_not_behind_backlog);
    tcase_add_test(tc, test_small_scan_beside_unsplittable);
    tcase_add_test(tc, test_replies_are_utf8);
    tcase_add_test(tc, test_fdatasync_failure_closes);
    tcase_add_test(tc, test_max_states_ceiling);
    tcase_add_test(tc, test_compiles_isolated_and_drained);
    tcase_add_test(tc, test_compile_timeout);
    tcase_add_test(tc, test_compile_stops_when_client_leaves);
    tcase_add_test(tc, test_pending_loads_bounded);
    tcase_add_test(tc, test_cached_per_tenant);
    suite_add_tcase(s, tc);
    return s;
}
