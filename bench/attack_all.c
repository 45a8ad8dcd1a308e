/*
 * attack_all: every attack of tests/test_attack.c at once against one
 * vkscand, while another tenant measures its 4 KiB scans (issue 8's target:
 * p99 <= 5 ms on the CPU path, daemon RSS under the bound of docs/daemon.md).
 *
 *   attack_all [--vkscand PATH] [--engine cpu|auto] [--seconds S] [--warmup S]
 *              [--max-p99-ms MS] [--attacks NAME,NAME...] [--set KEY VALUE]... [--json]
 *
 * It starts vkscand itself (default: ../daemon/vkscand next to this
 * program) on a temporary socket with the limits below, lowered so that
 * docs/daemon.md's memory bound is a number worth checking, and
 * RLIMIT_NOFILE 200, so that the connections the attackers hold run the
 * daemon out of descriptors. Each attack runs in its own process under its
 * own uid (root is needed to switch uids; without it every attacker is one
 * tenant, which the per-tenant caps then lump together):
 *
 *   idle      48 connections that send nothing (idle-timeout-ms closes them;
 *             they reconnect)
 *   slow      16 connections trickling one byte of a frame every 250 ms
 *             (frame-timeout-ms closes them)
 *   unread    4 connections pipelining 64 KiB scans with a hit every 8 bytes
 *             and never reading a reply (max-unsent-bytes closes them)
 *   half      4 connections announcing max-frame and sending 3/4 of it
 *   fds       3 uids x 60 idle connections: with the others, past the
 *             daemon's descriptor limit (accept's EMFILE path)
 *   hitbomb   1 MiB scans of a rule that matches every byte, max_hits 10
 *             and the daemon's max-hits in turn
 *   compile   catalog.load of 60 slow regexes, 4 pipelined, a new rule set
 *             each time (compile-timeout-ms stops them), every fifth asking
 *             for max_states over the ceiling
 *   scanflood 4 MiB inline scans, 4 pipelined
 *
 * --attacks runs only the named ones (to find which one costs the victim);
 * --set KEY VALUE adds `--KEY VALUE` to the daemon's flags.
 * After `warmup` seconds of attacks the victim (this process, its own uid,
 * one connection opened before the attacks) scans 4 KiB buffers one at a
 * time for `seconds`, checking every reply's hits; a sampler reads the
 * daemon's VmRSS every 10 ms. The summary gives the victim's p50/p99/max,
 * its errors and wrong replies, the peak RSS against the bound, and the
 * daemon's counters of each defence. Exit status 0 when p99 <= --max-p99-ms,
 * no error, no wrong reply and the RSS stayed under the bound; 1 otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <msgpack.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vkscan/vkscan.h"

/* ---- the daemon's limits and the bound they give ------------------------ */

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

#define L_MAX_CONNECTIONS 256ull
#define L_TENANT_CONNS    64ull
#define L_MAX_UNSENT      (1 * MIB)
#define L_MAX_HITS        4096ull
#define L_MAX_FRAME       (8 * MIB)
#define L_FRAME_BUDGET    (32 * MIB)
#define L_TENANT_BYTES    (64 * MIB)
#define L_HOST_CATALOGS   (64 * MIB)
#define L_COMPILE_THREADS 2ull
#define L_MAX_STATES      65536ull
#define L_STREAMS         4ull
#define L_STREAM_STATE    (64 * KIB)
#define DAEMON_NOFILE     200
#define N_ATTACKER_UIDS   10 /* uids 70001 .. 70010 */
#define ATTACKER_UID(k)   (70001u + (unsigned)(k))

/* What one compile may hold: the subset construction's table of max-states
 * rows of up to 256 four-byte entries, twice (unminimised and minimised).
 * An estimate: docs/daemon.md names the term without a number. */
#define COMPILE_BYTES (2ull * L_MAX_STATES * 256ull * 4ull)

static const char *const daemon_flags[] = {"--max-connections",
                                           "256",
                                           "--tenant-max-connections",
                                           "64",
                                           "--max-unsent-bytes",
                                           "1M",
                                           "--max-hits",
                                           "4096",
                                           "--max-frame",
                                           "8M",
                                           "--frame-budget",
                                           "32M",
                                           "--frame-timeout-ms",
                                           "2000",
                                           "--idle-timeout-ms",
                                           "3000",
                                           "--tenant-max-bytes",
                                           "64M",
                                           "--host-catalog-budget",
                                           "64M",
                                           "--compile-threads",
                                           "2",
                                           "--tenant-max-compiles",
                                           "1",
                                           "--compile-timeout-ms",
                                           "2000",
                                           "--max-states",
                                           "65536",
                                           "--max-rules",
                                           "1000",
                                           "--stream-max-per-tenant",
                                           "4",
                                           "--stream-max-state-bytes",
                                           "64K",
                                           NULL};

/* docs/daemon.md "Memory bound", for T tenants, above `base`. */
static uint64_t memory_bound(uint64_t base, uint64_t tenants)
{
    uint64_t reply = 24 * L_MAX_HITS + 16 * KIB;
    uint64_t frames = L_FRAME_BUDGET > L_MAX_FRAME ? L_FRAME_BUDGET : L_MAX_FRAME;
    return base + L_MAX_CONNECTIONS * (4 * KIB + L_MAX_UNSENT + reply) + frames +
           L_MAX_CONNECTIONS * 64 * KIB + tenants * (L_TENANT_BYTES + L_MAX_FRAME) +
           L_HOST_CATALOGS + L_COMPILE_THREADS * COMPILE_BYTES +
           tenants * L_STREAMS * L_STREAM_STATE;
}

/* ---- small helpers ------------------------------------------------------ */

static char sock_path[108];
static volatile sig_atomic_t stopping;
static double deadline; /* attackers: stop at this time too */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool done(void)
{
    return stopping || now_s() > deadline;
}

static void on_term(int sig)
{
    (void)sig;
    stopping = 1;
}

/* A non-blocking connection to the daemon, or -1 (backlog full, EMFILE...). */
static int nb_connect(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends what the socket takes within `wait_ms`; returns bytes sent, or -1
 * when the peer closed. */
static ssize_t send_some(int fd, const void *p, size_t len, int wait_ms)
{
    size_t off = 0;
    while (off < len && !done()) {
        ssize_t n = send(fd, (const uint8_t *)p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, wait_ms) != 1 || (pf.revents & (POLLERR | POLLHUP)))
            return (pf.revents & (POLLERR | POLLHUP)) ? -1 : (ssize_t)off;
    }
    return (ssize_t)off;
}

/* Sends one whole frame (a frame left half sent would garble the next), waiting as
 * long as the daemon does not read; -1 when it closed or the attack is over. */
static int send_frame(int fd, const msgpack_sbuffer *sb)
{
    uint8_t hdr[4] = {(uint8_t)(sb->size >> 24), (uint8_t)(sb->size >> 16),
                      (uint8_t)(sb->size >> 8), (uint8_t)sb->size};
    const uint8_t *part[2] = {hdr, (const uint8_t *)sb->data};
    size_t len[2] = {4, sb->size};
    for (int k = 0; k < 2; k++)
        for (size_t off = 0; off < len[k];) {
            if (done())
                return -1;
            ssize_t n = send_some(fd, part[k] + off, len[k] - off, 100);
            if (n < 0)
                return -1;
            off += (size_t)n;
        }
    return 0;
}

/* Reads and drops whatever has arrived; -1 at EOF or reset. */
static int drain(int fd)
{
    static uint8_t sink[1 << 16];
    for (;;) {
        ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return -1;
        return 0;
    }
}

/* Reads whole reply frames (4-byte length, body), dropping them; returns how
 * many completed within `wait_ms`, or -1 at EOF. `st` keeps a partial frame's
 * remaining length across calls. */
struct frame_state {
    uint8_t hdr[4];
    size_t have_hdr;
    size_t left;
};

static int read_frames(int fd, struct frame_state *st, int wait_ms)
{
    static uint8_t sink[1 << 16];
    int frames = 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, wait_ms) != 1)
        return 0;
    for (;;) {
        size_t want = st->have_hdr < 4 ? 4 - st->have_hdr
                                       : (st->left < sizeof(sink) ? st->left : sizeof(sink));
        uint8_t *dst = st->have_hdr < 4 ? st->hdr + st->have_hdr : sink;
        ssize_t n = want == 0 ? 0 : recv(fd, dst, want, MSG_DONTWAIT);
        if (want != 0 && n == 0)
            return -1;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? frames : -1;
        if (st->have_hdr < 4) {
            st->have_hdr += (size_t)n;
            if (st->have_hdr == 4)
                st->left = (size_t)st->hdr[0] << 24 | (size_t)st->hdr[1] << 16 |
                           (size_t)st->hdr[2] << 8 | st->hdr[3];
        } else {
            st->left -= (size_t)n;
        }
        if (st->have_hdr == 4 && st->left == 0) {
            frames++;
            st->have_hdr = 0;
        }
    }
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

static void pack_scan(msgpack_sbuffer *sb, uint32_t id, const uint8_t *fp, const void *data,
                      size_t len)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    pack_head(&pk, id, "scan", 2);
    pack_str(&pk, "catalog");
    msgpack_pack_bin(&pk, 32);
    msgpack_pack_bin_body(&pk, fp, 32);
    pack_str(&pk, "buffers");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    pack_str(&pk, "data");
    msgpack_pack_bin(&pk, len);
    msgpack_pack_bin_body(&pk, data, len);
}

/* A load of `n` regexes built from overlapping classes with repeats, no
 * literal factor: every one goes through subset construction (as
 * tests/test_attack.c's pack_slow_load). */
static void pack_slow_load(msgpack_sbuffer *sb, uint32_t id, uint32_t seed, int n,
                           uint64_t max_states)
{
    static const char *const cls[8] = {"[a-h]", "[i-p]", "[q-x]", "[0-7]",
                                       "[A-H]", "[I-P]", "[a-p]", "[h-x]"};
    static const char *const rep[5] = {"", "+", "{1,3}", "*", "{2,6}"};
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    pack_head(&pk, id, "catalog.load", max_states != 0 ? 2 : 1);
    if (max_states != 0) {
        pack_str(&pk, "max_states");
        msgpack_pack_uint64(&pk, max_states);
    }
    pack_str(&pk, "rules");
    msgpack_pack_array(&pk, (uint32_t)n);
    uint32_t x = 2463534242u ^ seed * 2654435761u;
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
        snprintf(id_s, sizeof(id_s), "s%u-%d", seed, i);
        msgpack_pack_map(&pk, 3);
        pack_str(&pk, "id");
        pack_str(&pk, id_s);
        pack_str(&pk, "kind");
        pack_str(&pk, "regex");
        pack_str(&pk, "pattern");
        pack_str(&pk, pat);
    }
}

/* Connects through libvkscan, retrying while the daemon is out of
 * descriptors; NULL when the attack is over first. */
static struct vks_client *client_connect(void)
{
    struct vks_client *c = NULL;
    while (!done()) {
        if (vks_client_connect(sock_path, NULL, &c, NULL) == 0)
            return c;
        usleep(50000);
    }
    return NULL;
}

/* Loads `rules` on a fresh connection; the fingerprint goes to fp. */
static int load_fp(const struct vks_rule *rules, size_t n, uint8_t fp[32])
{
    struct vks_client *c = client_connect();
    if (c == NULL)
        return -1;
    struct vks_catalog *cat = NULL;
    int rc = vks_client_catalog_load(c, rules, n, NULL, &cat, NULL);
    if (rc == 0) {
        memcpy(fp, vks_catalog_fingerprint(cat), 32);
        vks_catalog_destroy(cat);
    }
    vks_client_close(c);
    return rc;
}

static const struct vks_rule needle_rules[] = {
    {"lit", VKS_RULE_LITERAL, "needle", 0, NULL},
    {"re", VKS_RULE_REGEX, "ab[0-9]+c", 0, NULL},
};

/* ---- the attacks (each in its own process) ----------------------------- */

struct counters {
    uint64_t connects, closes, sent, replies, errors;
};

static void report(const char *name, const struct counters *k)
{
    fprintf(stderr,
            "attack %-9s connects %llu, closed by the daemon %llu, requests/frames sent %llu, "
            "replies %llu, failed connects or requests %llu\n",
            name, (unsigned long long)k->connects, (unsigned long long)k->closes,
            (unsigned long long)k->sent, (unsigned long long)k->replies,
            (unsigned long long)k->errors);
}

/* Holds `n` silent connections, reconnecting those the daemon closes. */
static void hold_idle(const char *name, int n)
{
    int fds[64];
    struct counters k = {0};
    for (int i = 0; i < n; i++)
        fds[i] = -1;
    while (!done()) {
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0) {
                fds[i] = nb_connect();
                fds[i] >= 0 ? k.connects++ : k.errors++;
            } else if (drain(fds[i]) < 0) {
                close(fds[i]);
                fds[i] = -1;
                k.closes++;
            }
        }
        usleep(100000);
    }
    report(name, &k);
}

static void atk_idle(void)
{
    hold_idle("idle", 48);
}

static void atk_fds(void)
{
    hold_idle("fds", 60);
}

/* One byte of a 512-byte frame every 250 ms on each of 16 connections. */
static void atk_slow(void)
{
    enum { N = 16 };
    int fds[N];
    size_t off[N];
    uint8_t frame[516] = {0, 0, 2, 0};
    memset(frame + 4, 0x80, 512); /* an empty map, 512 times: never valid */
    struct counters k = {0};
    for (int i = 0; i < N; i++)
        fds[i] = -1, off[i] = 0;
    while (!done()) {
        for (int i = 0; i < N; i++) {
            if (fds[i] < 0) {
                fds[i] = nb_connect();
                off[i] = 0;
                fds[i] >= 0 ? k.connects++ : k.errors++;
                continue;
            }
            if (drain(fds[i]) < 0 ||
                send(fds[i], frame + off[i] % sizeof(frame), 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
                close(fds[i]);
                fds[i] = -1;
                k.closes++;
                continue;
            }
            off[i]++;
            k.sent++;
        }
        usleep(250000);
    }
    report("slow", &k);
}

/* Pipelines hit-heavy scans on 4 connections and reads nothing. */
static void atk_unread(void)
{
    enum { N = 4 };
    uint8_t fp[32];
    struct counters k = {0};
    if (load_fp(needle_rules, 2, fp) != 0) {
        fprintf(stderr, "attack unread: cannot load its catalog\n");
        return;
    }
    static uint8_t data[64 << 10];
    for (size_t i = 0; i + 8 <= sizeof(data); i += 8)
        memcpy(data + i, "needle! ", 8);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_scan(&sb, 1, fp, data, sizeof(data));
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = -1;
    while (!done()) {
        for (int i = 0; i < N; i++) {
            if (fds[i] < 0) {
                fds[i] = nb_connect();
                if (fds[i] >= 0) {
                    int small = 4096;
                    setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
                }
                fds[i] >= 0 ? k.connects++ : k.errors++;
                continue;
            }
            if (send_frame(fds[i], &sb) != 0) {
                /* closed, or not read any more: a closed one fails its
                 * next send; a paused one is tried again */
                struct pollfd pf = {.fd = fds[i], .events = 0};
                if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLERR | POLLHUP))) {
                    close(fds[i]);
                    fds[i] = -1;
                    k.closes++;
                }
                continue;
            }
            k.sent++;
        }
        usleep(5000);
    }
    msgpack_sbuffer_destroy(&sb);
    report("unread", &k);
}

/* Announces max-frame and sends 3/4 of it on 4 connections, then waits for
 * the frame timeout to close them. */
static void atk_half(void)
{
    enum { N = 4 };
    static uint8_t junk[6 << 20];
    memset(junk, 0x90, sizeof(junk));
    int fds[N];
    size_t off[N];
    struct counters k = {0};
    for (int i = 0; i < N; i++)
        fds[i] = -1, off[i] = 0;
    while (!done()) {
        for (int i = 0; i < N; i++) {
            if (fds[i] < 0) {
                fds[i] = nb_connect();
                off[i] = 0;
                if (fds[i] < 0) {
                    k.errors++;
                    continue;
                }
                k.connects++;
                uint8_t hdr[4] = {0, 0x80, 0, 0}; /* 8 MiB */
                if (send_some(fds[i], hdr, 4, 100) != 4) {
                    close(fds[i]);
                    fds[i] = -1;
                    continue;
                }
                k.sent++;
            }
            ssize_t n = 0;
            if (off[i] < sizeof(junk))
                n = send_some(fds[i], junk + off[i], sizeof(junk) - off[i], 10);
            if (n < 0 || drain(fds[i]) < 0) {
                close(fds[i]);
                fds[i] = -1;
                k.closes++;
                continue;
            }
            off[i] += (size_t)n;
        }
        usleep(20000);
    }
    report("half", &k);
}

/* Scans 1 MiB of bytes that every position matches. */
static void atk_hitbomb(void)
{
    static const struct vks_rule dot[] = {{"dot", VKS_RULE_REGEX, ".", 0, "s"}};
    struct counters k = {0};
    struct vks_client *c = client_connect();
    if (c == NULL)
        return;
    k.connects++;
    struct vks_catalog *cat = NULL;
    if (vks_client_catalog_load(c, dot, 1, NULL, &cat, NULL) != 0) {
        fprintf(stderr, "attack hitbomb: cannot load its catalog\n");
        vks_client_close(c);
        return;
    }
    static uint8_t data[1 << 20];
    memset(data, 'x', sizeof(data));
    struct vks_buffer b = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data)};
    for (uint32_t i = 0; !done(); i++) {
        struct vks_scan_options o;
        vks_scan_options_init(&o);
        o.max_hits = i % 2 == 0 ? 10 : 0;
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        int rc = vks_client_scan(c, vks_catalog_fingerprint(cat), &b, 1, &o, &res, &err);
        k.sent++;
        if (rc == 0) {
            k.replies++;
            vks_scan_result_finish(&res);
        } else if (k.errors++ == 0) {
            fprintf(stderr, "attack hitbomb: scan failed: %d %s\n", rc, err.msg);
        }
        if (rc != 0 && rc != -VKS_E_LIMIT && rc != -VKS_E_BUSY)
            break;
    }
    vks_catalog_destroy(cat);
    vks_client_close(c);
    report("hitbomb", &k);
}

/* Keeps 4 slow loads in flight, each a rule set not seen before. */
static void atk_compile(void)
{
    struct counters k = {0};
    struct frame_state st = {0};
    int fd = -1, inflight = 0;
    uint32_t seed = (uint32_t)getpid() * 7919u;
    while (!done()) {
        if (fd < 0) {
            fd = nb_connect();
            inflight = 0;
            memset(&st, 0, sizeof(st));
            fd >= 0 ? k.connects++ : k.errors++;
            if (fd < 0) {
                usleep(100000);
                continue;
            }
        }
        while (inflight < 4) {
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            uint64_t ms = seed % 5 == 0 ? (1ull << 31) : 0; /* over max-states: LIMIT */
            pack_slow_load(&sb, seed, seed, 60, ms);
            seed++;
            int rc = send_frame(fd, &sb);
            msgpack_sbuffer_destroy(&sb);
            if (rc != 0)
                break;
            inflight++;
            k.sent++;
        }
        int got = read_frames(fd, &st, 100);
        if (got < 0) {
            close(fd);
            fd = -1;
            k.closes++;
            continue;
        }
        inflight -= got;
        k.replies += (uint64_t)got;
    }
    if (fd >= 0)
        close(fd);
    report("compile", &k);
}

/* Keeps 4 scans of 4 MiB in flight. */
static void atk_scanflood(void)
{
    uint8_t fp[32];
    struct counters k = {0};
    if (load_fp(needle_rules, 2, fp) != 0) {
        fprintf(stderr, "attack scanflood: cannot load its catalog\n");
        return;
    }
    static uint8_t data[4 << 20];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof(data); i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (uint8_t)('a' + (x >> 16) % 26);
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_scan(&sb, 1, fp, data, sizeof(data));
    struct frame_state st = {0};
    int fd = -1, inflight = 0;
    while (!done()) {
        if (fd < 0) {
            fd = nb_connect();
            inflight = 0;
            memset(&st, 0, sizeof(st));
            fd >= 0 ? k.connects++ : k.errors++;
            if (fd < 0) {
                usleep(100000);
                continue;
            }
        }
        while (inflight < 4 && send_frame(fd, &sb) == 0) {
            inflight++;
            k.sent++;
        }
        int got = read_frames(fd, &st, 50);
        if (got < 0) {
            close(fd);
            fd = -1;
            k.closes++;
            continue;
        }
        inflight -= got;
        k.replies += (uint64_t)got;
    }
    if (fd >= 0)
        close(fd);
    msgpack_sbuffer_destroy(&sb);
    report("scanflood", &k);
}

static const struct attack {
    const char *name;
    void (*fn)(void);
} attacks[N_ATTACKER_UIDS] = {
    {"idle", atk_idle},       {"slow", atk_slow},
    {"unread", atk_unread},   {"half", atk_half},
    {"fds", atk_fds},         {"fds", atk_fds},
    {"fds", atk_fds},         {"hitbomb", atk_hitbomb},
    {"compile", atk_compile}, {"scanflood", atk_scanflood},
};

static pid_t start_attack(int k, double until)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGTERM, on_term);
    signal(SIGPIPE, SIG_IGN);
    deadline = until;
    if (geteuid() == 0 && (setgid(ATTACKER_UID(k)) != 0 || setuid(ATTACKER_UID(k)) != 0)) {
        fprintf(stderr, "attack %s: cannot switch to uid %u\n", attacks[k].name, ATTACKER_UID(k));
        _exit(2);
    }
    attacks[k].fn();
    _exit(0);
}

/* ---- the daemon -------------------------------------------------------- */

struct daemon {
    pid_t pid;
    char dir[64];
    char log[128];
};

static uint64_t rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    uint64_t kb = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}

/* --set KEY VALUE: more daemon flags (--KEY VALUE), after the defaults. */
static const char *extra_flags[32];
static int n_extra;

static int daemon_start(struct daemon *d, const char *bin, const char *engine)
{
    snprintf(d->dir, sizeof(d->dir), "/tmp/vkatk-XXXXXX");
    if (mkdtemp(d->dir) == NULL)
        return -1;
    chmod(d->dir, 0755); /* attackers connect as other uids */
    char state[128];
    snprintf(sock_path, sizeof(sock_path), "%s/vkscand.sock", d->dir);
    snprintf(state, sizeof(state), "%s/state", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/log", d->dir);
    d->pid = fork();
    if (d->pid < 0)
        return -1;
    if (d->pid == 0) {
        const char *argv[80] = {bin,      "--socket",      sock_path, "--state-dir",
                                state,    "--engine",      engine,    "--config",
                                "",       "--socket-mode", "0666",    "--log-level",
                                "warning"};
        int n = 13;
        for (int i = 0; daemon_flags[i] != NULL; i++)
            argv[n++] = daemon_flags[i];
        for (int i = 0; i < n_extra && n < 79; i++)
            argv[n++] = extra_flags[i];
        argv[n] = NULL;
        int lf = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (lf >= 0)
            dup2(lf, 2);
        struct rlimit rl = {DAEMON_NOFILE, DAEMON_NOFILE};
        setrlimit(RLIMIT_NOFILE, &rl);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 1200; i++) {
        struct vks_client *c = NULL;
        if (vks_client_connect(sock_path, NULL, &c, NULL) == 0 && vks_client_ping(c, NULL) == 0) {
            vks_client_close(c);
            return 0;
        }
        if (c != NULL)
            vks_client_close(c);
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            return -1;
        }
        usleep(100000);
    }
    return -1;
}

/* ---- the RSS sampler --------------------------------------------------- */

struct sampler {
    pid_t pid;
    volatile bool stop;
    uint64_t peak;
    pthread_t th;
};

static void *sample(void *arg)
{
    struct sampler *s = arg;
    while (!s->stop) {
        uint64_t r = rss_of(s->pid);
        if (r > s->peak)
            s->peak = r;
        usleep(10000);
    }
    return NULL;
}

/* ---- the victim -------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The daemon's telemetry of the victim's scans, as means: where its time
 * went (docs/daemon.md). */
static const char *const tel_keys[] = {"total_ns", "queue_ns", "scan_ns", "batch_requests"};
#define N_TEL (sizeof(tel_keys) / sizeof(tel_keys[0]))

struct victim {
    uint64_t tel[N_TEL];
    uint64_t *lat_ns;
    size_t n, cap;
    uint64_t errors, wrong;
    char first_error[320];
};

/* 4 KiB scans, one at a time, until `until`; every reply must hold the 4
 * needles the buffer has. */
static void victim_run(struct vks_client *c, const uint8_t *fp, double until, struct victim *v)
{
    static uint8_t data[4096];
    uint32_t x = 777;
    for (size_t i = 0; i < sizeof(data); i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (uint8_t)('a' + (x >> 16) % 26);
    }
    for (int k = 0; k < 4; k++)
        memcpy(data + 100 + 1000 * k, "needle", 6);
    struct vks_buffer b = {.kind = VKS_BUFFER_INLINE, .data = data, .len = sizeof(data)};
    while (now_s() < until) {
        struct vks_scan_result res = {0};
        struct vks_error err = {0};
        double t0 = now_s();
        int rc = vks_client_scan(c, fp, &b, 1, NULL, &res, &err);
        double t1 = now_s();
        if (rc != 0) {
            if (v->errors++ == 0)
                snprintf(v->first_error, sizeof(v->first_error), "%d %s", rc, err.msg);
            usleep(1000);
            continue;
        }
        if (res.n_hits != 4)
            v->wrong++;
        for (size_t k = 0; k < N_TEL; k++) {
            const struct vks_stat *e = vks_stat_find(res.telemetry, res.n_telemetry, tel_keys[k]);
            v->tel[k] += e != NULL ? e->u : 0;
        }
        vks_scan_result_finish(&res);
        if (v->n == v->cap) {
            v->cap = v->cap ? 2 * v->cap : 65536;
            v->lat_ns = realloc(v->lat_ns, v->cap * sizeof(*v->lat_ns));
            if (v->lat_ns == NULL)
                abort();
        }
        v->lat_ns[v->n++] = (uint64_t)((t1 - t0) * 1e9);
    }
}

static double pct_ms(const uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return (double)v[i] / 1e6;
}

/* ---- main -------------------------------------------------------------- */

static const char *const stat_keys[] = {"idle_closes",
                                        "frame_timeouts",
                                        "frame_budget_waits",
                                        "output_limit_closes",
                                        "accept_fd_limit",
                                        "connections_refused",
                                        "connections_refused_tenant",
                                        "catalog_compiles",
                                        "batches",
                                        "scans"};
#define N_STAT_KEYS (sizeof(stat_keys) / sizeof(stat_keys[0]))

/* Whether attack `name` is in the comma-separated list (NULL: all). */
static bool selected(const char *list, const char *name)
{
    if (list == NULL)
        return true;
    size_t n = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const char *e = strchr(p, ',');
        size_t len = e != NULL ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p += len + (e != NULL);
    }
    return false;
}

static void usage(void)
{
    fprintf(stderr, "usage: attack_all [--vkscand PATH] [--engine cpu|auto] [--seconds S] "
                    "[--warmup S] [--max-p99-ms MS] [--attacks NAME,...] [--set KEY VALUE]... "
                    "[--json]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    char def_bin[4096];
    snprintf(def_bin, sizeof(def_bin), "%s", argv[0]);
    char bin_buf[4200];
    snprintf(bin_buf, sizeof(bin_buf), "%s/../daemon/vkscand", dirname(def_bin));
    const char *bin = getenv("VKSCAND") ? getenv("VKSCAND") : bin_buf, *engine = "cpu";
    double seconds = 20, warmup = 3, max_p99 = 5;
    bool json = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--vkscand") == 0 && i + 1 < argc)
            bin = argv[++i];
        else if (strcmp(argv[i], "--engine") == 0 && i + 1 < argc)
            engine = argv[++i];
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
            warmup = atof(argv[++i]);
        else if (strcmp(argv[i], "--max-p99-ms") == 0 && i + 1 < argc)
            max_p99 = atof(argv[++i]);
        else if (strcmp(argv[i], "--set") == 0 && i + 2 < argc && n_extra < 30) {
            static char keys[15][64];
            int k = n_extra / 2;
            snprintf(keys[k], sizeof(keys[0]), "--%s", argv[++i]);
            extra_flags[n_extra] = keys[k];
            extra_flags[n_extra + 1] = argv[++i];
            n_extra += 2;
        } else if (strcmp(argv[i], "--attacks") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else
            usage();
    }
    signal(SIGPIPE, SIG_IGN);
    if (geteuid() != 0)
        fprintf(stderr, "attack_all: not root: every attacker runs as this uid, one tenant "
                        "with the victim\n");
    struct daemon d = {0};
    if (daemon_start(&d, bin, engine) != 0) {
        fprintf(stderr, "attack_all: %s did not start (log: %s)\n", bin, d.log);
        return 2;
    }
    /* The victim connects and loads before any attack. */
    struct vks_client *c = NULL;
    struct vks_catalog *cat = NULL;
    struct vks_error err = {0};
    if (vks_client_connect(sock_path, NULL, &c, &err) != 0 ||
        vks_client_catalog_load(c, needle_rules, 2, NULL, &cat, &err) != 0) {
        fprintf(stderr, "attack_all: victim setup: %s\n", err.msg);
        kill(d.pid, SIGKILL);
        return 2;
    }
    uint64_t base = rss_of(d.pid);
    struct sampler s = {.pid = d.pid};
    pthread_create(&s.th, NULL, sample, &s);
    double t_start = now_s(), until = t_start + warmup + seconds;
    pid_t kids[N_ATTACKER_UIDS];
    int n_att = 0;
    for (int k = 0; k < N_ATTACKER_UIDS; k++)
        if (selected(only, attacks[k].name))
            kids[n_att++] = start_attack(k, until + 1);
    while (now_s() < t_start + warmup)
        usleep(50000);
    struct victim v = {0};
    victim_run(c, vks_catalog_fingerprint(cat), until, &v);
    for (int k = 0; k < n_att; k++)
        kill(kids[k], SIGTERM);
    for (int k = 0; k < n_att; k++)
        waitpid(kids[k], NULL, 0);
    s.stop = true;
    pthread_join(s.th, NULL);
    /* The daemon's counters of each defence (root sees them service-wide). */
    uint64_t stat_v[N_STAT_KEYS] = {0};
    struct vks_stats st = {0};
    bool alive = vks_client_stats(c, &st, NULL) == 0;
    if (alive) {
        for (size_t i = 0; i < N_STAT_KEYS; i++) {
            const struct vks_stat *e = vks_stat_find(st.stats, st.n_stats, stat_keys[i]);
            stat_v[i] = e != NULL ? e->u : 0;
        }
        vks_stats_finish(&st);
    }
    vks_catalog_destroy(cat);
    vks_client_close(c);
    kill(d.pid, SIGTERM);
    int wst = 0;
    waitpid(d.pid, &wst, 0);

    qsort(v.lat_ns, v.n, sizeof(*v.lat_ns), cmp_u64);
    uint64_t tenants = geteuid() == 0 ? (uint64_t)n_att + 1 : 1;
    uint64_t bound = memory_bound(base, tenants);
    double p50 = pct_ms(v.lat_ns, v.n, 0.50), p99 = pct_ms(v.lat_ns, v.n, 0.99);
    double mx = v.n ? (double)v.lat_ns[v.n - 1] / 1e6 : 0;
    bool ok = alive && v.n > 0 && p99 <= max_p99 && v.errors == 0 && v.wrong == 0 && s.peak < bound;
    if (json) {
        printf("{\"engine\":\"%s\",\"seconds\":%.1f,\"scans\":%zu,\"p50_ms\":%.3f,"
               "\"p99_ms\":%.3f,\"max_ms\":%.3f,\"errors\":%llu,\"wrong\":%llu,"
               "\"rss_base\":%llu,\"rss_peak\":%llu,\"rss_bound\":%llu",
               engine, seconds, v.n, p50, p99, mx, (unsigned long long)v.errors,
               (unsigned long long)v.wrong, (unsigned long long)base, (unsigned long long)s.peak,
               (unsigned long long)bound);
        for (size_t i = 0; i < N_STAT_KEYS; i++)
            printf(",\"%s\":%llu", stat_keys[i], (unsigned long long)stat_v[i]);
        printf(",\"ok\":%s}\n", ok ? "true" : "false");
    } else {
        printf("engine %s, %.0f s of victim scans under %d attackers (%s)\n", engine, seconds,
               n_att, geteuid() == 0 ? "one uid each" : "one uid");
        printf("victim 4 KiB scans: %zu, p50 %.3f ms, p99 %.3f ms, max %.3f ms, errors %llu, "
               "wrong replies %llu%s%s\n",
               v.n, p50, p99, mx, (unsigned long long)v.errors, (unsigned long long)v.wrong,
               v.errors ? ", first: " : "", v.errors ? v.first_error : "");
        printf("victim telemetry means:");
        for (size_t k = 0; k < N_TEL; k++)
            printf(" %s %.3f%s", tel_keys[k],
                   v.n ? (double)v.tel[k] / (double)v.n / (k < 3 ? 1e6 : 1) : 0,
                   k < 3 ? " ms" : "");
        printf("\n");
        printf("daemon RSS: base %.1f MiB, peak %.1f MiB, bound %.1f MiB (docs/daemon.md, %llu "
               "tenants)\n",
               (double)base / MIB, (double)s.peak / MIB, (double)bound / MIB,
               (unsigned long long)tenants);
        for (size_t i = 0; i < N_STAT_KEYS; i++)
            printf("  %-27s %llu\n", stat_keys[i], (unsigned long long)stat_v[i]);
        printf("daemon exit: %s %d; %s\n", WIFEXITED(wst) ? "status" : "signal",
               WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst), ok ? "PASS" : "FAIL");
    }
    free(v.lat_ns);
    if (!ok)
        fprintf(stderr, "attack_all: daemon log in %s\n", d.log);
    return ok ? 0 : 1;
}
