/*
 * Client connections (session.h): frame I/O on a raw non-blocking socket
 * watched by a uv_poll_t (libuv's stream API cannot hand over descriptors
 * that arrive with SCM_RIGHTS, so proto_reader_recv does the recvmsg), and the
 * ops of docs/protocol.md.
 */
#include "session.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "proto.h"
#include "session_host.h"
#include "stats.h"
#include "store.h"
#include "stream.h"

#define FRAMES_PER_WAKEUP 16u
#define OUT_HIGH_WATER    (8u << 20)  /* unsent reply bytes before we stop reading */
#define SMALL_FRAME       (64u << 10) /* frames up to this size skip the frame budget */

/* One request with work in flight (compile, disk load, queued or running
 * scan). Holds a session reference; freed when its reply is written. */
struct request {
    struct request *next, *prev; /* the session's live requests */
    struct session *s;
    struct proto_request *req;
    uint64_t t_recv;
    /* scans */
    struct sched_job sj;
    struct engine_job ej;
    struct engine_buf *bufs;
    struct store_entry *entry;
    uint64_t t_queued, t_dispatched;
    uint32_t max_hits;
    uint64_t reply_room; /* bytes of hits its reply may hold (reply_hit_room) */
    uint64_t held;       /* frame bytes counted with sched_tenant_hold */
    uint32_t weight;     /* what it counts in n_reqs: its writes or closes for a
                          * stream.writes or a stream.close of many, else 1 */
    /* A scan reply made on the engine thread (session_scan_finished): the
     * frame, what became of it, and what the loop counts for it. */
    struct proto_buf early;
    int early_state;    /* enum early */
    bool early_counted; /* counted by the engine thread before its write */
    uint32_t early_hits;
    uint64_t early_bytes, t_reply;
};

enum early {
    EARLY_NONE,    /* the loop builds the reply (or an error) */
    EARLY_ENCODED, /* encoded, not written: the loop queues `early` */
    EARLY_SENT,    /* written whole to the socket */
    EARLY_QUEUED,  /* written in part, the rest moved to the session's out */
    EARLY_FAILED,  /* the socket failed while writing it: close */
};

/* A stream.writes of 4,096 writes holds as much daemon memory (a queued
 * write each) as 4,096 stream.writes requests do: it counts as many
 * toward tenant-max-requests, so a client cannot queue max_buffers times
 * more than the limit says by batching. */
static uint32_t request_weight(const struct proto_request *req)
{
    uint32_t n = req->op == PROTO_OP_STREAM_WRITES  ? req->u.writes.n_buffers
                 : req->op == PROTO_OP_STREAM_CLOSE ? req->u.stream.n_streams
                                                    : 1;
    return n ? n : 1;
}

struct session {
    struct server *srv;
    int fd;
    uv_poll_t poll;
    int events; /* what the poll handle watches now */
    unsigned refs;
    bool closed;     /* session_close ran */
    bool fatal;      /* a framing error was answered: close once it is written */
    bool eof;        /* the peer shut down its writing side */
    bool rdhup_seen; /* stop watching UV_DISCONNECT (level-triggered) */
    bool paused;     /* backpressure */
    bool close_when_done;
    bool denied;       /* not in allow-uids / allow-gids: the first request gets DENIED */
    bool admin;        /* root or in admin-gids: stats shows every tenant */
    bool budget_wait;  /* a frame's body waits for the frame budget */
    bool read_ahead;   /* the reader reads past frames (hello's read_ahead) */
    uint64_t reserved; /* frame-budget bytes this session holds */
    uint64_t t_frame;  /* uv_now when the current frame started (or reading resumed); 0: none */
    uint64_t t_active; /* uv_now of the last sign of life (frame in, reply out) */
    uid_t uid;
    pid_t pid;
    struct sched_tenant *tenant;
    struct proto_reader *reader;
    /* The output: the socket's writes, the unsent bytes and `shut` (the
     * session is closed: write nothing more) under out_mu, because an
     * engine thread writes scan replies too (session_scan_finished). */
    pthread_mutex_t out_mu;
    bool shut;
    struct proto_buf out;
    size_t out_off;
    size_t out_left;  /* out.len - out_off, stored under out_mu, read without
                       * it (atomic): the loop asks on every poll update */
    uint32_t n_early; /* replies written by engine threads, requests not yet
                       * freed (atomic) */
    struct request *reqs;
    uint32_t n_reqs;
    struct stream_set *streams; /* stream.* (daemon/stream.c) */
    /* Frames in the reader's read-ahead wake no poll: while some wait and
     * the session may read, it is on the server's `later` list (holding a
     * reference), run before the loop next polls. */
    struct session *later_next;
    bool later_queued;
};

#define CONTAINER(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static void update_poll(struct session *s);
static void flush(struct session *s);
static bool finished(struct session *s);

static void session_unref(struct session *s)
{
    if (--s->refs > 0)
        return;
    struct server *srv = s->srv;
    sched_tenant_put(server_sched(srv), s->tenant);
    if (s->reserved != 0)
        server_frame_release(srv, s->reserved);
    proto_reader_destroy(s->reader);
    proto_buf_finish(&s->out);
    pthread_mutex_destroy(&s->out_mu);
    server_session_remove(srv, s);
    free(s);
    server_check_drained(srv);
}

uid_t session_uid(const struct session *s)
{
    return s->uid;
}

/* Bytes encoded and not yet written. An engine thread may add some; the
 * loop then learns it from session_scan_done, which writes them. */
static size_t unsent(const struct session *s)
{
    return __atomic_load_n(&s->out_left, __ATOMIC_RELAXED);
}

/* Publishes what `out` holds now (out_mu held). */
static void out_changed(struct session *s)
{
    __atomic_store_n(&s->out_left, s->out.len - s->out_off, __ATOMIC_RELAXED);
}

bool session_idle(const struct session *s)
{
    return s->n_reqs == 0 && unsent(s) == 0;
}

/* ---- requests --------------------------------------------------------- */

static struct request *request_new(struct session *s, struct proto_request *req, uint64_t t)
{
    struct request *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->s = s;
    r->req = req;
    r->t_recv = t;
    r->held = req->frame.len;
    sched_tenant_hold(s->tenant, (int64_t)r->held);
    r->next = s->reqs;
    if (s->reqs != NULL)
        s->reqs->prev = r;
    s->reqs = r;
    r->weight = request_weight(req);
    s->n_reqs += r->weight;
    s->refs++;
    return r;
}

static void request_free(struct request *r)
{
    struct session *s = r->s;
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        s->reqs = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    s->n_reqs -= r->weight;
    if (r->entry != NULL)
        store_entry_unref(server_store(s->srv), r->entry);
    engine_job_finish(&r->ej);
    free(r->bufs);
    proto_buf_finish(&r->early);
    proto_request_destroy(r->req);
    bool was_over = sched_tenant_holds_too_much(server_sched(s->srv), s->tenant);
    sched_tenant_hold(s->tenant, -(int64_t)r->held);
    free(r);
    if (was_over)
        server_resume_tenant(s->srv, s->uid); /* its other connections may read again */
    if (!s->closed) {
        s->t_active = uv_now(server_loop(s->srv));
        if (s->close_when_done && finished(s))
            session_close(s);
        else
            update_poll(s);
    }
    session_unref(s);
}

/* ---- writing ---------------------------------------------------------- */

static bool peer_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

/* Whether the socket holds bytes not read yet (also true at EOF). */
static bool readable_now(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* A session closing when done (SIGTERM drain) is done when idle, and, unless
 * the peer shut down its side, when no pipelined request is left unread (in
 * the socket or in the reader's read-ahead):
 * those get SHUTDOWN replies rather than a connection reset. */
static bool finished(struct session *s)
{
    if (!session_idle(s) || proto_reader_buffered(s->reader))
        return false;
    return s->eof || s->fatal || s->rdhup_seen || !readable_now(s->fd);
}

/* Counts a reply to `op` by result (stats requests.<op>.ok / .error). */
static void count_reply(struct session *s, enum proto_op op, bool ok)
{
    struct server_counters *c = server_counters(s->srv);
    unsigned i = (unsigned)op < PROTO_OP_COUNT ? (unsigned)op : PROTO_OP_NONE;
    __atomic_fetch_add(ok ? &c->replies_ok[i] : &c->replies_error[i], 1, __ATOMIC_RELAXED);
}

static void send_reply(struct session *s, const struct proto_reply *rep)
{
    if (s->closed)
        return;
    struct vks_error err;
    pthread_mutex_lock(&s->out_mu);
    int rc = proto_reply_encode(&s->out, rep, &err);
    out_changed(s);
    pthread_mutex_unlock(&s->out_mu);
    count_reply(s, rep->op, rc == 0);
    if (rc != 0) {
        log_err("uid %u: cannot encode the %s reply to request %u: %s", (unsigned)s->uid,
                proto_op_name(rep->op) ? proto_op_name(rep->op) : "error", rep->id, err.msg);
        char msg[300];
        snprintf(msg, sizeof(msg), "the reply could not be encoded (%.200s)%s", err.msg,
                 rc == -E2BIG ? ": ask for fewer hits (max_hits)" : "");
        pthread_mutex_lock(&s->out_mu);
        proto_error_encode(&s->out, rep->id, rep->op, -VKS_E_INTERNAL, msg, NULL);
        out_changed(s);
        pthread_mutex_unlock(&s->out_mu);
        server_counters(s->srv)->errors++;
    }
    flush(s);
}

static void send_error(struct session *s, uint32_t id, enum proto_op op, int code, const char *msg)
{
    if (s->closed)
        return;
    if (code > -VKS_E_BASE || code < -VKS_E_MAX_CODE) {
        /* A local failure (-errno): the wire only carries VKS_E_* codes. */
        char m[300];
        snprintf(m, sizeof(m), "vkscand failed: %.200s (%s)", msg, strerror(-code));
        send_error(s, id, op, -VKS_E_INTERNAL, m);
        return;
    }
    server_counters(s->srv)->errors++;
    count_reply(s, op, false);
    struct vks_error err;
    pthread_mutex_lock(&s->out_mu);
    int rc = proto_error_encode(&s->out, id, op, code, msg, &err);
    out_changed(s);
    pthread_mutex_unlock(&s->out_mu);
    if (rc != 0)
        log_err("cannot encode an error reply: %s", err.msg);
    flush(s);
}

/* Writes from `p` until done or the socket is full (out_mu held). Returns
 * the bytes written, or -1 when the peer is gone (EPIPE, ECONNRESET). */
static ssize_t write_some(int fd, const uint8_t *p, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    return (ssize_t)off;
}

static void flush(struct session *s)
{
    pthread_mutex_lock(&s->out_mu);
    ssize_t n = write_some(s->fd, s->out.data + s->out_off, s->out.len - s->out_off);
    s->out_off += n > 0 ? (size_t)n : 0;
    size_t left = s->out.len - s->out_off;
    if (n >= 0 && left == 0) {
        proto_buf_reset(&s->out);
        s->out_off = 0;
    } else if (n >= 0 && s->out_off > s->out.len / 2) {
        memmove(s->out.data, s->out.data + s->out_off, left);
        s->out.len = left;
        s->out_off = 0;
    }
    out_changed(s);
    pthread_mutex_unlock(&s->out_mu);
    if (n < 0) {
        session_close(s); /* the peer is gone */
        return;
    }
    if (left == 0) {
        s->t_active = uv_now(server_loop(s->srv));
        if (s->fatal || (s->close_when_done && finished(s))) {
            session_close(s);
            return;
        }
    } else if (left > server_config(s->srv)->max_unsent_bytes) {
        /* The client does not read its replies: Redis's output buffer limit.
         * Pausing reads alone is not enough, queued work keeps replying. */
        server_counters(s->srv)->output_limit_closes++;
        log_warn("uid %u pid %d: %zu reply bytes unread, over max-unsent-bytes (%llu): closing "
                 "the connection",
                 (unsigned)s->uid, (int)s->pid, left,
                 (unsigned long long)server_config(s->srv)->max_unsent_bytes);
        session_close(s);
        return;
    }
    update_poll(s);
}

/* ---- polling and backpressure ----------------------------------------- */

/* Reserves the frame budget for a frame whose length prefix arrived; false
 * while the budget is full (the session waits, holding no body bytes). */
static bool frame_budget(struct session *s)
{
    uint32_t want = proto_reader_frame_len(s->reader);
    if (want <= SMALL_FRAME || s->reserved != 0)
        return true; /* small frames cost little and must not wait behind big ones */
    if (!server_frame_reserve(s->srv, want)) {
        if (!s->budget_wait)
            server_counters(s->srv)->frame_budget_waits++;
        s->budget_wait = true;
        return false;
    }
    s->reserved = want;
    s->budget_wait = false;
    s->t_frame = uv_now(server_loop(s->srv)); /* its clock starts now */
    return true;
}

static bool may_read(struct session *s)
{
    const struct daemon_config *cfg = server_config(s->srv);
    /* While draining (close_when_done without EOF) pipelined requests are
     * still read, to be answered with SHUTDOWN. */
    if (s->closed || s->fatal || s->eof)
        return false;
    uint64_t high =
        cfg->max_unsent_bytes / 2 < OUT_HIGH_WATER ? cfg->max_unsent_bytes / 2 : OUT_HIGH_WATER;
    bool over = sched_tenant_over(server_sched(s->srv), s->tenant) ||
                sched_tenant_holds_too_much(server_sched(s->srv), s->tenant) ||
                s->n_reqs >= cfg->tenant_max_requests || unsent(s) >= high;
    if (over && !s->paused)
        server_counters(s->srv)->backpressure++;
    if (!over && !frame_budget(s))
        over = true;
    if (!over && s->paused && s->t_frame != 0)
        s->t_frame = uv_now(server_loop(s->srv)); /* not the peer's delay */
    s->paused = over;
    return !over;
}

static void on_poll(uv_poll_t *h, int status, int events);

/* Puts the session on the server's `later` list (see struct session). */
static void read_later(struct session *s)
{
    if (s->later_queued)
        return;
    struct session **head = server_later(s->srv);
    s->later_queued = true;
    s->refs++;
    s->later_next = *head;
    *head = s;
}

static void update_poll(struct session *s)
{
    if (s->closed)
        return;
    int ev = 0;
    if (may_read(s)) {
        ev |= UV_READABLE;
        if (proto_reader_buffered(s->reader))
            read_later(s);
    }
    if (unsent(s) > 0)
        ev |= UV_WRITABLE;
    if (!s->rdhup_seen)
        ev |= UV_DISCONNECT;
    if (ev == s->events)
        return;
    s->events = ev;
    int rc = ev ? uv_poll_start(&s->poll, ev, on_poll) : uv_poll_stop(&s->poll);
    if (rc != 0) {
        log_err("uid %u: cannot watch the connection: %s", (unsigned)s->uid, uv_strerror(rc));
        session_close(s);
    }
}

static void on_readable(struct session *s);

struct session *session_run_later(struct session *s)
{
    struct session *next = s->later_next;
    s->later_next = NULL;
    s->later_queued = false;
    if (!s->closed)
        on_readable(s);
    session_unref(s);
    return next;
}

void session_resume(struct session *s)
{
    if (s->paused)
        update_poll(s);
}

/* Reading reached the end of the stream. Peer gone entirely (killed,
 * closed): drop its work. Only half-closed: it still reads, so answer what
 * it asked first. */
static void on_eof(struct session *s)
{
    s->rdhup_seen = true;
    if (peer_gone(s->fd)) {
        session_close(s);
        return;
    }
    s->eof = true;
    session_close_when_done(s);
}

/* The peer hung up while we were not reading (backpressure): a dead client
 * loses its queued work now; a half-closed one is read to the end later. */
static void on_disconnect(struct session *s)
{
    s->rdhup_seen = true;
    if (peer_gone(s->fd))
        session_close(s);
    else
        update_poll(s);
}

/* ---- hello, ping, stats ----------------------------------------------- */

static const char *device_type(enum gpu_device_type t)
{
    switch (t) {
    case GPU_DEVICE_DISCRETE:
        return "discrete";
    case GPU_DEVICE_INTEGRATED:
        return "integrated";
    case GPU_DEVICE_CPU:
        return "cpu";
    case GPU_DEVICE_VIRTUAL:
        return "virtual";
    case GPU_DEVICE_OTHER:
        break;
    }
    return "other";
}

static uint64_t local_memory(const struct gpu_device_info *d)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < d->n_heaps; i++)
        m += d->heaps[i].device_local ? d->heaps[i].size : 0;
    return m;
}

static void op_hello(struct session *s, const struct proto_request *req)
{
    const struct proto_hello *h = &req->u.hello;
    uint32_t lo = h->min_version ? h->min_version : h->version;
    uint32_t chosen = h->version < PROTO_VERSION ? h->version : PROTO_VERSION;
    if (chosen < lo || chosen < PROTO_VERSION_MIN) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "the client speaks protocol versions %u..%u, vkscand %u..%u: "
                 "use a libvkscan of the daemon's version",
                 lo, h->version, PROTO_VERSION_MIN, PROTO_VERSION);
        send_error(s, req->id, req->op, -VKS_E_VERSION, msg);
        return;
    }
    /* The client sends descriptors with one frame's bytes per sendmsg, so
     * the reader may take a request's length prefix and body, or several
     * requests, in one recvmsg (proto.h: proto_reader_read_ahead). */
    uint64_t ahead = server_config(s->srv)->read_ahead;
    if (h->read_ahead && ahead > 0 && !s->read_ahead &&
        proto_reader_read_ahead(s->reader, (size_t)ahead) == 0) {
        s->read_ahead = true;
        server_counters(s->srv)->read_ahead++;
    }
    const struct engine_info *info = engine_get_info(server_engine(s->srv));
    struct proto_device devs[16];
    uint32_t n = info->n_devices < 16 ? info->n_devices : 16;
    for (uint32_t i = 0; i < n; i++) {
        const struct gpu_device_info *d = &info->devices[i];
        devs[i] = (struct proto_device){.index = d->index,
                                        .name = d->name,
                                        .type = device_type(d->type),
                                        .memory = local_memory(d),
                                        .active = d->index < 32 &&
                                                  (info->active_devices >> d->index & 1)};
    }
    struct proto_reply rep = {.id = req->id, .op = req->op};
    rep.u.hello = (struct proto_hello_reply){.version = chosen,
                                             .min_version = PROTO_VERSION_MIN,
                                             .server = "vkscand " VKS_VERSION,
                                             .devices = devs,
                                             .n_devices = n};
    server_proto_limits(s->srv, &rep.u.hello.limits);
    send_reply(s, &rep);
}

static void op_stats(struct session *s, const struct proto_request *req)
{
    struct stats_list l;
    stats_collect_as(s->srv, s->uid, s->admin, &l);
    struct proto_reply rep = {.id = req->id, .op = req->op};
    rep.u.stats = (struct proto_stats_reply){.stats = l.v, .n_stats = l.n};
    send_reply(s, &rep);
}

/* ---- catalogs --------------------------------------------------------- */

/* Encodes a catalog.load / catalog.has result: the catalog's rules (ids and
 * fingerprints, packed once per catalog by the store) and the rejected
 * rules. */
static void reply_catalog(struct session *s, const struct proto_request *req,
                          const struct store_result *res)
{
    struct proto_reply rep = {.id = req->id, .op = req->op};
    struct proto_catalog_result *c = &rep.u.catalog;
    c->known = res->known;
    struct proto_reject *rejects = NULL;
    if (res->known) {
        struct vks_error err = {0};
        bool ids = req->op == PROTO_OP_CATALOG_LOAD ? req->u.load.ids_only : req->u.ref.ids_only;
        int rc = store_entry_rules_packed(server_store(s->srv), res->entry, ids, &c->rules_packed,
                                          &c->rules_packed_len, &err);
        if (rc < 0) {
            send_error(s, req->id, req->op, rc, err.msg);
            return;
        }
        rejects = calloc(res->n_rejects ? res->n_rejects : 1, sizeof(*rejects));
        if (rejects == NULL) {
            send_error(s, req->id, req->op, -ENOMEM, "out of memory building the reply");
            return;
        }
        memcpy(c->fingerprint, store_entry_fp(res->entry), PROTO_FP_LEN);
        if (res->source != NULL)
            memcpy(c->source, res->source, PROTO_FP_LEN);
        c->cached = res->cached; /* per tenant: never says what others loaded */
        c->compile_ns = res->compile_ns;
        c->n_rules = catalog_rule_count(store_entry_catalog(res->entry));
        c->ids_only = ids;
        for (size_t i = 0; i < res->n_rejects; i++) {
            const struct rule_reject *r = &res->rejects[i];
            rejects[i] = (struct proto_reject){
                .index = r->index, .line = r->line, .pos = r->pos, .id = r->id, .message = r->msg};
        }
        c->rejects = rejects;
        c->n_rejects = (uint32_t)res->n_rejects;
    }
    send_reply(s, &rep);
    free(rejects);
}

static void on_catalog(void *ctx, int status, const struct store_result *res,
                       const struct vks_error *err)
{
    struct request *r = ctx;
    if (status != 0)
        send_error(r->s, r->req->id, r->req->op, status, err->msg);
    else
        reply_catalog(r->s, r->req, res);
    request_free(r);
}

static void op_catalog(struct session *s, struct proto_request *req, uint64_t t)
{
    struct request *r = request_new(s, req, t);
    if (r == NULL) {
        send_error(s, req->id, req->op, -ENOMEM, "out of memory queueing the request");
        proto_request_destroy(req);
        return;
    }
    const struct daemon_config *cfg = server_config(s->srv);
    if (req->op == PROTO_OP_CATALOG_LOAD && req->u.load.max_states > cfg->max_states) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "max_states %u is above this daemon's ceiling (max-states) of %u: ask for at "
                 "most %u, or leave it out for the compiler's default",
                 req->u.load.max_states, cfg->max_states, cfg->max_states);
        send_error(s, req->id, req->op, -VKS_E_LIMIT, msg);
        request_free(r);
        return;
    }
    if (req->op == PROTO_OP_CATALOG_LOAD)
        store_load(server_store(s->srv), s->uid, &req->u.load, on_catalog, r);
    else
        store_has(server_store(s->srv), s->uid, &req->u.ref, on_catalog, r);
}

static void op_drop(struct session *s, const struct proto_request *req)
{
    if (req->u.ref.by_source) {
        send_error(s, req->id, req->op, -VKS_E_BAD_VALUE,
                   "catalog.drop takes the catalog `fingerprint`, not a source fingerprint");
        return;
    }
    struct proto_reply rep = {.id = req->id, .op = req->op};
    rep.u.dropped = store_drop(server_store(s->srv), s->uid, req->u.ref.fp) == 1;
    send_reply(s, &rep);
}

/* ---- scans ------------------------------------------------------------ */

/* Checks each buffer and sums the bytes; fd buffers are checked with fstat
 * (metadata only, no data read on the loop thread). */
static int scan_inputs(struct request *r, uint64_t *total, struct vks_error *err)
{
    const struct proto_scan *sc = &r->req->u.scan;
    r->bufs = calloc(sc->n_buffers ? sc->n_buffers : 1, sizeof(*r->bufs));
    if (r->bufs == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory queueing the scan");
    *total = 0;
    for (uint32_t i = 0; i < sc->n_buffers; i++) {
        const struct proto_buffer *pb = &sc->buffers[i];
        struct engine_buf *b = &r->bufs[i];
        b->fd = -1;
        if (!pb->is_fd) {
            b->data = pb->data;
            b->len = pb->len;
            *total += pb->len;
            continue;
        }
        /* A bad descriptor fails its own buffer only (docs/protocol.md). */
        struct stat sb;
        if (fstat(pb->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            b->status = -VKS_E_BAD_FD;
            snprintf(b->msg, sizeof(b->msg),
                     "descriptor %u is not a regular file or memfd: "
                     "pass an open file or a memfd",
                     pb->fd_index);
            continue;
        }
        uint64_t size = (uint64_t)sb.st_size;
        uint64_t len = pb->has_length ? pb->length : size - (pb->offset < size ? pb->offset : size);
        if (pb->offset > size || len > size - pb->offset) {
            b->status = -VKS_E_BAD_FD;
            snprintf(b->msg, sizeof(b->msg),
                     "range %llu+%llu is outside the file of %llu bytes: "
                     "check offset and length",
                     (unsigned long long)pb->offset, (unsigned long long)len,
                     (unsigned long long)size);
            continue;
        }
        *b = (struct engine_buf){
            .fd = pb->fd, .offset = pb->offset, .length = len, .has_length = true};
        *total += len;
    }
    return 0;
}

static void scan_queue(struct request *r, struct store_entry *e)
{
    struct session *s = r->s;
    struct server *srv = s->srv;
    const struct daemon_config *cfg = server_config(srv);
    const struct proto_scan *sc = &r->req->u.scan;
    r->entry = e;
    store_entry_ref(e);
    r->ej.cat = store_entry_catalog(e);
    r->ej.mode = (enum scan_mode)sc->mode;
    r->ej.max_hits = r->max_hits;
    r->ej.uid = (uint32_t)s->uid; /* result cache entries are the tenant's own */
    r->ej.no_cache = sc->no_cache;
    r->ej.starts = sc->starts;
    r->ej.bufs = r->bufs;
    r->ej.n_bufs = sc->n_buffers;
    r->sj.key = e;
    r->sj.n_buffers = sc->n_buffers;
    r->t_queued = uv_hrtime();
    uint32_t ms = sc->timeout_ms ? sc->timeout_ms : cfg->scan_timeout_ms;
    r->sj.deadline_ns = r->t_queued + (uint64_t)ms * 1000000u;
    if (sched_push(server_sched(srv), s->tenant, &r->sj) != 0) {
        send_error(s, r->req->id, r->req->op, -ENOMEM, "out of memory queueing the scan: retry");
        request_free(r);
        return;
    }
    server_kick(srv);
    server_watch_deadlines(srv);
    update_poll(s);
}

static void on_scan_catalog(void *ctx, int status, const struct store_result *res,
                            const struct vks_error *err)
{
    struct request *r = ctx;
    if (status != 0 || r->s->closed) {
        if (status != 0)
            send_error(r->s, r->req->id, r->req->op, status, err->msg);
        request_free(r);
        return;
    }
    scan_queue(r, res->entry);
}

/* Room for hits in one scan reply: a reply over max-unsent-bytes closes the
 * connection, and one over 64 MiB (libvkscan's default max_frame) is
 * refused by the client; what the statuses and telemetry take is kept
 * aside. A scan whose hits do not fit is cut as at max_hits. */
static uint64_t reply_hit_room(const struct daemon_config *cfg, uint32_t n_buffers)
{
    uint64_t cap = cfg->max_unsent_bytes;
    if (cap > PROTO_DEFAULT_MAX_FRAME)
        cap = PROTO_DEFAULT_MAX_FRAME;
    uint64_t aside = (64u << 10) + (uint64_t)n_buffers * 512u;
    return cap > 2 * aside ? cap - aside : cap / 2;
}

static void op_scan(struct session *s, struct proto_request *req, uint64_t t)
{
    const struct daemon_config *cfg = server_config(s->srv);
    struct vks_error err = {0};
    struct request *r = request_new(s, req, t);
    if (r == NULL) {
        send_error(s, req->id, req->op, -ENOMEM, "out of memory queueing the scan");
        proto_request_destroy(req);
        return;
    }
    uint64_t total = 0;
    int rc = scan_inputs(r, &total, &err);
    r->sj.bytes = total;
    if (rc == 0 && req->u.scan.n_buffers > cfg->max_buffers)
        rc = vks_error_set(&err, -VKS_E_TOO_MANY_BUFFERS,
                           "the scan has %u buffers, the limit "
                           "(max_buffers) is %u: split it",
                           req->u.scan.n_buffers, cfg->max_buffers);
    if (rc == 0 && total > cfg->max_scan_bytes)
        rc = vks_error_set(&err, -VKS_E_LIMIT,
                           "the scan has %llu bytes, the limit "
                           "(max_scan_bytes) is %llu: split it",
                           (unsigned long long)total, (unsigned long long)cfg->max_scan_bytes);
    if (rc == 0 && sched_job_too_big(server_sched(s->srv), total))
        rc = vks_error_set(&err, -VKS_E_BUSY,
                           "the scan has %llu bytes, more than a tenant may "
                           "queue (tenant_max_bytes %llu): split it",
                           (unsigned long long)total, (unsigned long long)cfg->tenant_max_bytes);
    if (rc != 0) {
        send_error(s, req->id, req->op, rc, err.msg);
        request_free(r);
        return;
    }
    uint32_t mh = req->u.scan.max_hits;
    r->max_hits = mh != 0 && mh < cfg->max_hits ? mh : cfg->max_hits;
    r->reply_room = reply_hit_room(cfg, req->u.scan.n_buffers);
    store_acquire(server_store(s->srv), s->uid, req->u.scan.catalog, on_scan_catalog, r);
}

struct engine_job *session_job_engine(struct sched_job *job)
{
    struct request *r = CONTAINER(job, struct request, sj);
    r->t_dispatched = uv_hrtime();
    return &r->ej;
}

static void telemetry(struct stats_list *l, const struct request *r,
                      const struct engine_telemetry *t, uint64_t now)
{
    const struct gpu_telemetry *g = &t->gpu_tel;
    stats_add_u(l, "engine", t->gpu ? 0 : 1);
    engine_telemetry_add(l, &r->ej, t);
    stats_add_u(l, "batch_id", t->batch_id);
    stats_add_u(l, "batch_requests", t->jobs);
    stats_add_u(l, "batch_buffers", t->buffers);
    stats_add_u(l, "batch_bytes", t->bytes);
    stats_add_u(l, "bytes_uploaded", g->bytes_uploaded);
    stats_add_u(l, "haystack_bytes_uploaded", g->haystack_bytes_uploaded);
    stats_add_u(l, "catalog_bytes_uploaded", g->catalog_bytes_uploaded);
    stats_add_u(l, "bytes_read_back", g->bytes_read_back);
    stats_add_u(l, "catalog_cache_hits", g->catalog_cache_hits);
    stats_add_u(l, "catalog_uploads", g->catalog_uploads);
    stats_add_u(l, "resident_catalogs", g->resident_catalogs);
    stats_add_u(l, "pipeline_cache_hits", g->pipeline_cache_hits);
    stats_add_u(l, "pipeline_compiles", g->pipeline_compiles);
    stats_add_u(l, "plan_cache_hit", g->plan_cache_hit);
    stats_add_u(l, "kernel_launches", g->kernel_launches);
    stats_add_u(l, "sync_points", g->sync_points);
    stats_add_u(l, "items_processed", g->items_processed);
    stats_add_u(l, "hit_reruns", g->hit_reruns);
    stats_add_u(l, "hit_copy_submits", g->hit_copy_submits);
    stats_add_u(l, "collect_overlapped", g->collect_overlapped);
    stats_add_u(l, "gpu_slices", g->slices);
    stats_add_u(l, "spec_fixes", g->spec_fixes);
    stats_add_u(l, "spec_fix_bytes", g->spec_fix_bytes);
    stats_add_u(l, "spec_fix_ns", g->spec_fix_ns);
    stats_add_f(l, "occupancy", g->occupancy);
    stats_add_u(l, "queue_ns", r->t_dispatched - r->t_queued);
    stats_add_u(l, "fd_read_ns", t->fd_read_ns);
    stats_add_u(l, "plan_ns", g->plan_ns);
    stats_add_u(l, "plan_pre_ns", g->plan_pre_ns);
    stats_add_u(l, "plan_runs_ns", g->plan_runs_ns);
    stats_add_u(l, "items_total", g->items_total);
    stats_add_u(l, "buffers_made_ns", g->buffers_made_ns);
    stats_add_u(l, "buffers_made_bytes", g->buffers_made_bytes);
    stats_add_u(l, "upload_ns", g->upload_ns);
    stats_add_u(l, "run_ns", t->gpu ? g->kernel_ns : t->scan_ns);
    stats_add_u(l, "readback_ns", g->readback_ns);
    stats_add_u(l, "device_ns", g->device_ns);
    stats_add_u(l, "finalize_ns", g->finalize_ns);
    stats_add_u(l, "factor_ns", g->factor_ns);
    stats_add_u(l, "factor_ends", g->factor_ends);
    stats_add_u(l, "factor_upload_ns", g->factor_upload_ns);
    stats_add_u(l, "factor_wait_ns", g->factor_wait_ns);
    stats_add_u(l, "factor_sort_ns", g->factor_read_ns + g->factor_sort_ns);
    stats_add_u(l, "hits_raw", g->hits_raw);
    stats_add_u(l, "hits_counted", g->hits_counted);
    stats_add_u(l, "hits_device_counted", g->hits_device_counted);
    stats_add_u(l, "spec_count_reruns", g->spec_count_reruns);
    stats_add_u(l, "confirm_host", g->confirm_host);
    stats_add_u(l, "confirm_host_ns", g->confirm_host_ns);
    stats_add_u(l, "scan_ns", t->scan_ns);
    stats_add_u(l, "total_ns", now - r->t_recv);
}

/* A scan reply being built: the arrays it points into. */
struct scan_reply {
    struct proto_reply rep;
    struct proto_hit *hits;
    struct proto_buffer_status *bs;
    char **ids;
    uint64_t bytes; /* scanned */
    struct stats_list l;
};

static void scan_reply_finish(const struct request *r, struct scan_reply *sr)
{
    if (sr->ids != NULL) {
        for (uint32_t i = 0; i < catalog_rule_count(r->ej.cat); i++)
            free(sr->ids[i]);
    }
    free(sr->ids);
    free(sr->hits);
    free(sr->bs);
}

/* Bytes of `v` as a msgpack unsigned integer. */
static size_t mp_uint_bytes(uint64_t v)
{
    return v < 128 ? 1 : v < 256 ? 2 : v < 65536 ? 3 : v <= UINT32_MAX ? 5 : 9;
}

/* Bytes of hit `h` in the reply (enc_scan_reply's layout). */
static size_t hit_wire_bytes(const struct request *r, const struct engine_hit *h)
{
    size_t n = 1 + mp_uint_bytes(h->buffer) + mp_uint_bytes(h->rule) + mp_uint_bytes(h->end) +
               mp_uint_bytes(h->count);
    if (r->req->u.scan.rule_ids) {
        struct catalog_rule cr;
        catalog_rule(r->ej.cat, h->rule, &cr);
        n += 5 + cr.id_len;
    } else if (h->has_start) {
        n += 1;
    }
    return n + (h->has_start ? mp_uint_bytes(h->start) : 0);
}

/* Builds the scan reply: hits in (buffer, end, rule) order, cut at
 * max_hits and at the reply's room (reply_hit_room), with each buffer's
 * status and the batch telemetry. Reads only the request and the finished
 * job, so any thread may build it; -ENOMEM (scan_reply_finish it all the
 * same). */
static int scan_reply_build(const struct request *r, const struct engine_telemetry *tel,
                            uint64_t now, struct scan_reply *sr)
{
    const struct proto_scan *sc = &r->req->u.scan;
    size_t n = r->ej.n_hits < r->max_hits ? r->ej.n_hits : r->max_hits;
    /* at 5 bytes or more a hit, only a reply of that many hits can pass */
    uint64_t room = r->reply_room;
    if ((uint64_t)n * 5 > room) {
        uint64_t used = 0;
        for (size_t i = 0; i < n; i++) {
            used += hit_wire_bytes(r, &r->ej.hits[i]);
            if (used > room) {
                n = i;
                break;
            }
        }
    }
    sr->hits = calloc(n ? n : 1, sizeof(*sr->hits));
    sr->bs = calloc(sc->n_buffers ? sc->n_buffers : 1, sizeof(*sr->bs));
    sr->ids = sc->rule_ids ? calloc(catalog_rule_count(r->ej.cat) + 1u, sizeof(char *)) : NULL;
    if (sr->hits == NULL || sr->bs == NULL || (sc->rule_ids && sr->ids == NULL))
        return -ENOMEM;
    struct proto_hit *hits = sr->hits;
    struct proto_buffer_status *bs = sr->bs;
    char **ids = sr->ids;
    for (size_t i = 0; i < r->ej.n_hits; i++) {
        const struct engine_hit *h = &r->ej.hits[i];
        if (i >= n) {
            bs[h->buffer].truncated = true;
            continue;
        }
        hits[i] = (struct proto_hit){.buffer = h->buffer,
                                     .rule = h->rule,
                                     .end = h->end,
                                     .count = h->count,
                                     .has_start = h->has_start,
                                     .start = h->start};
        bs[h->buffer].hits++;
        if (ids != NULL && ids[h->rule] == NULL) {
            struct catalog_rule cr;
            catalog_rule(r->ej.cat, h->rule, &cr);
            ids[h->rule] = strndup(cr.id, cr.id_len);
        }
        if (ids != NULL)
            hits[i].rule_id = ids[h->rule] != NULL ? ids[h->rule] : "";
    }
    sr->bytes = 0;
    for (uint32_t i = 0; i < sc->n_buffers; i++) {
        bs[i].code = r->bufs[i].status;
        bs[i].message = r->bufs[i].status != 0 ? r->bufs[i].msg : NULL;
        bs[i].bytes = r->bufs[i].status == 0 ? r->bufs[i].bytes : 0;
        bs[i].cached = r->bufs[i].status == 0 && r->bufs[i].cached;
        sr->bytes += bs[i].bytes;
    }
    sr->l.n = 0;
    telemetry(&sr->l, r, tel, now);
    sr->rep = (struct proto_reply){.id = r->req->id, .op = r->req->op};
    sr->rep.u.scan = (struct proto_scan_reply){.hits = hits,
                                               .n_hits = (uint32_t)n,
                                               .buffers = bs,
                                               .n_buffers = sc->n_buffers,
                                               .telemetry = sr->l.v,
                                               .n_telemetry = sr->l.n};
    return 0;
}

/* Counts an answered scan (stats, histograms). */
static void count_scan(struct request *r, uint32_t hits, uint64_t bytes, uint64_t now)
{
    struct server_counters *c = server_counters(r->s->srv);
    __atomic_fetch_add(&c->scans, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->scan_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->scan_hits, hits, __ATOMIC_RELAXED);
    metrics_hist_observe(&c->hist_queue_wait, r->t_dispatched - r->t_queued);
    metrics_hist_observe(&c->hist_scan_total, now - r->t_recv);
    metrics_hist_observe(&c->hist_scan_bytes, bytes);
}

/* Builds and sends the scan reply on the loop thread. */
static void reply_scan(struct request *r, const struct engine_telemetry *tel)
{
    struct session *s = r->s;
    struct scan_reply sr = {.ids = NULL};
    uint64_t now = uv_hrtime();
    if (scan_reply_build(r, tel, now, &sr) != 0) {
        send_error(s, r->req->id, r->req->op, -ENOMEM, "out of memory building the reply");
    } else {
        count_scan(r, sr.rep.u.scan.n_hits, sr.bytes, now);
        send_reply(s, &sr.rep);
    }
    scan_reply_finish(r, &sr);
}

/* Appends `n` bytes to `b`; -ENOMEM. */
static int buf_append(struct proto_buf *b, const uint8_t *p, size_t n)
{
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n)
            cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (d == NULL)
            return -ENOMEM;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

/* Writes an encoded reply of `len` bytes (out_mu held; the session not
 * shut and nothing waiting in `out`, which would have to go first). What
 * the socket does not take at once moves to `out` for the loop to write;
 * when even that fails after a part went out, the connection is broken.
 * Returns an enum early. */
static int write_frame(struct session *s, const uint8_t *p, size_t len)
{
    ssize_t n = write_some(s->fd, p, len);
    if (n < 0)
        return EARLY_FAILED;
    if ((size_t)n == len)
        return EARLY_SENT;
    proto_buf_reset(&s->out);
    s->out_off = 0;
    int rc = buf_append(&s->out, p + n, len - (size_t)n);
    out_changed(s);
    if (rc != 0)
        return n > 0 ? EARLY_FAILED : EARLY_ENCODED;
    return EARLY_QUEUED;
}

void session_scan_finished(struct engine_job *job, const struct engine_telemetry *tel)
{
    struct request *r = CONTAINER(job, struct request, ej);
    struct session *s = r->s;
    if (job->status != 0)
        return;
    struct scan_reply sr = {.ids = NULL};
    uint64_t now = uv_hrtime();
    struct vks_error err;
    int rc = scan_reply_build(r, tel, now, &sr);
    if (rc == 0)
        rc = proto_reply_encode(&r->early, &sr.rep, &err);
    if (rc == 0) {
        r->early_hits = sr.rep.u.scan.n_hits;
        r->early_bytes = sr.bytes;
        r->t_reply = now;
    }
    scan_reply_finish(r, &sr);
    if (rc != 0) {
        proto_buf_reset(&r->early); /* the loop tries again, and answers the failure */
        return;
    }
    pthread_mutex_lock(&s->out_mu);
    r->early_state = EARLY_ENCODED; /* shut, or bytes wait in out: the loop queues it */
    if (!s->shut && s->out_off == s->out.len) {
        /* counted before the client can see the reply: a stats request it
         * sends next finds the scan (the loop counts the others in
         * early_done) */
        count_reply(s, r->req->op, true);
        count_scan(r, r->early_hits, r->early_bytes, now);
        r->early_counted = true;
        r->early_state = write_frame(s, r->early.data, r->early.len);
    }
    bool out = r->early_state == EARLY_SENT || r->early_state == EARLY_QUEUED;
    if (out)
        __atomic_add_fetch(&s->n_early, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->out_mu);
    /* freed by the thread that allocated them: freed on the loop, they
     * took the allocator's lock of this thread's arena, one of the loop's
     * waits at 64 clients (docs/PERFORMANCE.md session 25) */
    engine_job_finish(job); /* the reply is encoded: the hits are not read again */
    if (out)
        proto_buf_finish(&r->early); /* gone, or its rest copied to the session's out */
}

/* The loop's part of a reply an engine thread made. */
static void early_done(struct request *r)
{
    struct session *s = r->s;
    if (r->early_state == EARLY_SENT || r->early_state == EARLY_QUEUED)
        __atomic_sub_fetch(&s->n_early, 1, __ATOMIC_RELAXED);
    if (s->closed && r->early_state == EARLY_ENCODED) {
        server_counters(s->srv)->cancelled++;
        return;
    }
    if (!r->early_counted) {
        count_reply(s, r->req->op, true);
        count_scan(r, r->early_hits, r->early_bytes, r->t_reply);
    }
    if (s->closed)
        return;
    if (r->early_state == EARLY_FAILED) {
        session_close(s); /* the peer is gone, or half a frame went out */
        return;
    }
    if (r->early_state == EARLY_ENCODED) {
        pthread_mutex_lock(&s->out_mu);
        int rc = buf_append(&s->out, r->early.data, r->early.len);
        out_changed(s);
        pthread_mutex_unlock(&s->out_mu);
        if (rc != 0) {
            send_error(s, r->req->id, r->req->op, -ENOMEM, "out of memory queueing the reply");
            return;
        }
    }
    if (r->early_state != EARLY_SENT)
        flush(s); /* what was queued; request_free updates the poll either way */
}

void session_scan_done(struct engine_job *job, const struct engine_telemetry *tel)
{
    struct request *r = CONTAINER(job, struct request, ej);
    struct session *s = r->s;
    sched_job_done(server_sched(s->srv), &r->sj);
    if (r->early_state != EARLY_NONE)
        early_done(r);
    else if (s->closed)
        server_counters(s->srv)->cancelled++;
    else if (job->status != 0)
        send_error(s, r->req->id, r->req->op, job->status, job->err.msg);
    else
        reply_scan(r, tel);
    request_free(r);
}

void session_scan_expired(struct sched_job *job)
{
    struct request *r = CONTAINER(job, struct request, sj);
    struct session *s = r->s;
    server_counters(s->srv)->timeouts++;
    char msg[160];
    snprintf(msg, sizeof(msg),
             "the scan waited %llu ms in the queue, past its timeout: raise "
             "timeout_ms or send less at once",
             (unsigned long long)((uv_hrtime() - r->t_queued) / 1000000u));
    send_error(s, r->req->id, r->req->op, -VKS_E_TIMEOUT, msg);
    request_free(r);
}

/* ---- streams (daemon/stream.c) ---------------------------------------- */

struct sched_tenant *session_tenant(struct session *s)
{
    return s->tenant;
}

void session_send_reply(struct session *s, const struct proto_reply *rep)
{
    send_reply(s, rep);
}

void session_send_encoded(struct session *s, uint32_t id, enum proto_op op, struct proto_buf *b)
{
    if (s->closed)
        return;
    count_reply(s, op, true);
    pthread_mutex_lock(&s->out_mu);
    int state = s->out_off == s->out.len ? write_frame(s, b->data, b->len) : EARLY_ENCODED;
    int rc = state == EARLY_ENCODED ? buf_append(&s->out, b->data, b->len) : 0;
    out_changed(s);
    pthread_mutex_unlock(&s->out_mu);
    if (state == EARLY_FAILED) {
        session_close(s); /* the peer is gone, or half a frame went out */
        return;
    }
    if (rc != 0) {
        send_error(s, id, op, -ENOMEM, "out of memory queueing the reply");
        return;
    }
    flush(s); /* what waits, the poll, and max-unsent-bytes */
}

void session_send_error(struct session *s, uint32_t id, enum proto_op op, int code, const char *msg)
{
    send_error(s, id, op, code, msg);
}

static void on_stream_catalog(void *ctx, int status, const struct store_result *res,
                              const struct vks_error *err)
{
    struct request *r = ctx;
    struct session *s = r->s;
    struct vks_error e = {0};
    if (status == 0 && !s->closed && s->streams == NULL &&
        stream_set_create(s->srv, s->uid, &s->streams) != 0)
        status = vks_error_set(&e, -ENOMEM, "out of memory opening a stream");
    if (status != 0 && !s->closed)
        send_error(s, r->req->id, r->req->op, status,
                   (err != NULL && e.code == 0) ? err->msg : e.msg);
    else if (status == 0 && !s->closed)
        stream_open(s->streams, s, r->req, res->entry);
    request_free(r);
}

static void op_stream_open(struct session *s, struct proto_request *req, uint64_t t)
{
    struct request *r = request_new(s, req, t);
    if (r == NULL) {
        send_error(s, req->id, req->op, -ENOMEM, "out of memory opening a stream");
        proto_request_destroy(req);
        return;
    }
    store_acquire(server_store(s->srv), s->uid, req->u.stream.catalog, on_stream_catalog, r);
}

/* stream.write and stream.close run on a pool thread (daemon/stream.c); the
 * request holds the session until session_stream_done. */
static void op_stream(struct session *s, struct proto_request *req, uint64_t t)
{
    struct request *r = request_new(s, req, t);
    if (r == NULL) {
        send_error(s, req->id, req->op, -ENOMEM, "out of memory queueing a stream request");
        proto_request_destroy(req);
        return;
    }
    stream_op(s->streams, s, req, r);
}

void session_stream_done(void *token)
{
    request_free(token);
}

/* ---- frames ----------------------------------------------------------- */

/* Answers a peer the allow lists do not admit, then closes. */
static void deny(struct session *s, uint32_t id, enum proto_op op)
{
    char msg[256];
    snprintf(msg, sizeof(msg),
             "uid %u may not use this vkscand: allow-uids / allow-gids in vkscand.conf do not "
             "list it or its groups: ask the administrator to add it (vkscand(8))",
             (unsigned)s->uid);
    send_error(s, id, op, -VKS_E_DENIED, msg);
    if (!s->closed) {
        s->fatal = true;
        flush(s);
    }
}

static void handle_frame(struct session *s, struct proto_frame *f)
{
    struct server *srv = s->srv;
    struct proto_limits lim;
    server_proto_limits(srv, &lim);
    struct proto_request *req = NULL;
    struct proto_head head = {0};
    struct vks_error err = {0};
    uint64_t t = uv_hrtime();
    int rc = proto_request_decode(f, &lim, &req, &head, &err);
    server_counters(srv)->requests[rc == 0 ? req->op : PROTO_OP_NONE]++;
    if (s->denied) {
        deny(s, rc == 0 ? req->id : head.id, rc == 0 ? req->op : head.op);
        proto_request_destroy(req);
        return;
    }
    if (rc != 0) {
        send_error(s, head.id, head.op, rc, err.msg);
        return;
    }
    if (server_draining(srv) && req->op != PROTO_OP_HELLO && req->op != PROTO_OP_PING &&
        req->op != PROTO_OP_STATS) {
        send_error(s, req->id, req->op, -VKS_E_SHUTDOWN,
                   "vkscand is shutting down and takes no new work: retry when it is back");
        proto_request_destroy(req);
        return;
    }
    switch (req->op) {
    case PROTO_OP_HELLO:
        op_hello(s, req);
        break;
    case PROTO_OP_PING: {
        struct proto_reply rep = {.id = req->id, .op = req->op};
        send_reply(s, &rep);
        break;
    }
    case PROTO_OP_STATS:
        op_stats(s, req);
        break;
    case PROTO_OP_CATALOG_DROP:
        op_drop(s, req);
        break;
    case PROTO_OP_CATALOG_LOAD:
    case PROTO_OP_CATALOG_HAS:
        op_catalog(s, req, t); /* takes req */
        return;
    case PROTO_OP_SCAN:
        op_scan(s, req, t); /* takes req */
        return;
    case PROTO_OP_STREAM_OPEN:
        op_stream_open(s, req, t); /* takes req */
        return;
    case PROTO_OP_STREAM_WRITE:
    case PROTO_OP_STREAM_CLOSE:
    case PROTO_OP_STREAM_WRITES:
        op_stream(s, req, t); /* takes req */
        return;
    case PROTO_OP_NONE:
    case PROTO_OP_COUNT:
        send_error(s, req->id, req->op, -VKS_E_UNKNOWN_OP, "unknown operation");
        break;
    }
    proto_request_destroy(req);
}

/* Reads until the socket would block (-EAGAIN, proto.h's contract), at
 * most FRAMES_PER_WAKEUP frames so one busy client cannot starve the others;
 * PROTO_RECV_MORE only means the current frame is still incomplete.
 * A frame that came while the session had nothing in flight is from a
 * client that waits for its reply (one request at a time): reading stops
 * after it instead of asking the socket once more for the -EAGAIN (a third
 * recvmsg a request, for nothing); the poll is level-triggered, so bytes
 * the client did send after it wake the loop again. A client with requests
 * in flight pipelines: it is read on to -EAGAIN. Bytes the reader read
 * ahead are parsed either way (no recvmsg); what the frame limit or
 * backpressure leaves of them is run later (update_poll). */
static void on_readable(struct session *s)
{
    unsigned frames = 0;
    bool more = true;
    while ((more || proto_reader_buffered(s->reader)) && frames < FRAMES_PER_WAKEUP &&
           may_read(s)) {
        struct vks_error err = {0};
        int rc = proto_reader_recv(s->reader, s->fd, &err);
        if (rc == -EAGAIN)
            break;
        if (rc == PROTO_RECV_MORE) {
            if (s->t_frame == 0)
                s->t_frame = uv_now(server_loop(s->srv));
            continue;
        }
        if (rc == PROTO_RECV_EOF) {
            on_eof(s);
            return;
        }
        if (rc == PROTO_RECV_FRAME) {
            struct proto_frame f;
            frames++;
            if (s->reserved != 0) {
                uint64_t held = s->reserved;
                s->reserved = 0;
                server_frame_release(s->srv, held);
            }
            s->t_frame = 0;
            s->t_active = uv_now(server_loop(s->srv));
            more = s->n_reqs > __atomic_load_n(&s->n_early, __ATOMIC_RELAXED);
            if (proto_reader_take(s->reader, &f) == 0)
                handle_frame(s, &f);
            continue;
        }
        if (rc <= -VKS_E_BASE) {
            /* The stream cannot be resynchronised: answer, then close. */
            server_counters(s->srv)->frame_errors++;
            send_error(s, 0, PROTO_OP_NONE, rc, err.msg);
            if (!s->closed) {
                s->fatal = true;
                flush(s);
            }
            return;
        }
        if (rc == -ECONNRESET && !peer_gone(s->fd)) {
            /* Half-closed in the middle of a frame: it can still read why. */
            server_counters(s->srv)->frame_errors++;
            s->rdhup_seen = true;
            send_error(s, 0, PROTO_OP_NONE, -VKS_E_BAD_FRAME,
                       "the connection ended in the "
                       "middle of a frame: send whole frames (4-byte length, then the body)");
            if (!s->closed) {
                s->fatal = true;
                flush(s);
            }
            return;
        }
        session_close(s); /* the peer is gone, or a socket error */
        return;
    }
    update_poll(s);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct session *s = h->data;
    s->refs++; /* the handlers below may close the session */
    if (status < 0) {
        session_close(s);
    } else {
        if ((events & UV_WRITABLE) && !s->closed)
            flush(s);
        if ((events & UV_READABLE) && !s->closed)
            on_readable(s);
        if ((events & UV_DISCONNECT) && !s->closed && !s->rdhup_seen &&
            !(events & UV_READABLE && may_read(s)))
            on_disconnect(s);
    }
    session_unref(s);
}

/* ---- life cycle ------------------------------------------------------- */

static void on_poll_closed(uv_handle_t *h)
{
    struct session *s = h->data;
    close(s->fd);
    s->fd = -1;
    session_unref(s);
}

/* Checks the peer against allow-uids / allow-gids: its uid, its primary
 * group and (SO_PEERGROUPS) its supplementary groups. */
static bool peer_allowed(struct server *srv, int fd, const struct ucred *cred)
{
    const struct daemon_config *cfg = server_config(srv);
    if (cfg->allow_uids.n == 0 && cfg->allow_gids.n == 0)
        return true;
    gid_t groups[256];
    uint32_t ids[256];
    size_t n = 0;
#ifdef SO_PEERGROUPS
    socklen_t len = sizeof(groups);
    if (cfg->allow_gids.n > 0 && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        n = len / sizeof(gid_t);
#else
    (void)fd;
#endif
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint32_t)groups[i];
    bool ok = config_peer_allowed(cfg, (uint32_t)cred->uid, (uint32_t)cred->gid, ids, n);
    if (!ok) {
        server_counters(srv)->connections_denied++;
        log_notice("refused pid %d uid %u gid %u: not in allow-uids / allow-gids", (int)cred->pid,
                   (unsigned)cred->uid, (unsigned)cred->gid);
    }
    return ok;
}

/* Answers a connection over tenant-max-connections with BUSY (id 0) and
 * closes it: the socket is new, so the small frame fits its buffer. */
static void refuse_busy(struct server *srv, int fd, uid_t uid)
{
    const struct daemon_config *cfg = server_config(srv);
    char msg[200];
    snprintf(msg, sizeof(msg),
             "uid %u already has %u connections open, the limit (tenant-max-connections) is "
             "%u: close idle ones or share one",
             (unsigned)uid, server_uid_sessions(srv, uid), cfg->tenant_max_connections);
    struct proto_buf b;
    proto_buf_init(&b);
    if (proto_error_encode(&b, 0, PROTO_OP_NONE, -VKS_E_BUSY, msg, NULL) == 0) {
        ssize_t n = send(fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n; /* best effort: the close says the rest */
    }
    proto_buf_finish(&b);
    server_counters(srv)->tenant_refused++;
    server_counters(srv)->errors++;
    close(fd);
}

static bool ids_have(const struct config_ids *ids, uint32_t id)
{
    for (uint32_t i = 0; i < ids->n; i++) {
        if (ids->id[i] == id)
            return true;
    }
    return false;
}

/* Root, or a peer whose primary or supplementary group is in admin-gids. */
static bool peer_admin(struct server *srv, int fd, const struct ucred *cred)
{
    const struct config_ids *admin = &server_config(srv)->admin_gids;
    if (cred->uid == 0 || ids_have(admin, (uint32_t)cred->gid))
        return true;
    if (admin->n == 0)
        return false;
#ifdef SO_PEERGROUPS
    gid_t groups[256];
    socklen_t len = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
        for (size_t i = 0; i < len / sizeof(gid_t); i++) {
            if (ids_have(admin, (uint32_t)groups[i]))
                return true;
        }
    }
#else
    (void)fd;
#endif
    return false;
}

int session_create(struct server *srv, int fd, struct session **out)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    if (server_uid_sessions(srv, cred.uid) >= server_config(srv)->tenant_max_connections) {
        refuse_busy(srv, fd, cred.uid);
        return -EUSERS;
    }
    struct session *s = calloc(1, sizeof(*s));
    struct proto_limits lim;
    server_proto_limits(srv, &lim);
    if (s == NULL || proto_reader_create(&lim, &s->reader) != 0) {
        free(s);
        close(fd);
        return -ENOMEM;
    }
    s->srv = srv;
    s->fd = fd;
    s->uid = cred.uid;
    s->pid = cred.pid;
    s->denied = !peer_allowed(srv, fd, &cred);
    s->admin = peer_admin(srv, fd, &cred);
    s->refs = 1; /* the poll handle's */
    s->t_active = uv_now(server_loop(srv));
    proto_buf_init(&s->out);
    bool mu = pthread_mutex_init(&s->out_mu, NULL) == 0;
    s->tenant = mu ? sched_tenant_get(server_sched(srv), cred.uid) : NULL;
    int rc = s->tenant == NULL ? UV_ENOMEM : uv_poll_init(server_loop(srv), &s->poll, fd);
    if (rc != 0) {
        if (mu)
            pthread_mutex_destroy(&s->out_mu);
        sched_tenant_put(server_sched(srv), s->tenant);
        proto_reader_destroy(s->reader);
        free(s);
        close(fd);
        return rc;
    }
    s->poll.data = s;
    server_session_add(srv, s);
    log_debug("connection from pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
    update_poll(s);
    *out = s;
    return 0;
}

void session_close(struct session *s)
{
    if (s->closed)
        return;
    s->closed = true;
    pthread_mutex_lock(&s->out_mu); /* engine threads write to it no more */
    s->shut = true;
    pthread_mutex_unlock(&s->out_mu);
    struct server *srv = s->srv;
    if (s->reserved != 0) { /* a half-read frame holds the budget no longer */
        uint64_t held = s->reserved;
        s->reserved = 0;
        server_frame_release(srv, held);
    }
    /* Queued scans go now; running ones and pending store work finish
     * unseen and free their request when they come back. */
    for (struct request *r = s->reqs, *next; r != NULL; r = next) {
        next = r->next;
        if (r->sj.queued) {
            sched_remove(server_sched(srv), &r->sj);
            server_counters(srv)->cancelled++;
            request_free(r);
        } else if (r->req->op == PROTO_OP_CATALOG_LOAD) {
            store_cancel(server_store(srv), r); /* its compile is no one's now */
        }
    }
    stream_set_destroy(s->streams); /* open streams end with their connection */
    s->streams = NULL;
    uv_close((uv_handle_t *)&s->poll, on_poll_closed);
    server_resume_tenant(srv, s->uid);
}

/* Answers TIMEOUT (id 0) and closes once it is written. */
static void time_out(struct session *s, const char *msg)
{
    send_error(s, 0, PROTO_OP_NONE, -VKS_E_TIMEOUT, msg);
    if (!s->closed) {
        s->fatal = true;
        flush(s);
    }
}

void session_sweep(struct session *s, uint64_t now_ms)
{
    const struct daemon_config *cfg = server_config(s->srv);
    if (s->closed || s->fatal)
        return;
    stream_set_sweep(s->streams, now_ms);
    char msg[200];
    if (cfg->frame_timeout_ms != 0 && s->t_frame != 0 && !s->paused &&
        now_ms - s->t_frame >= cfg->frame_timeout_ms) {
        server_counters(s->srv)->frame_timeouts++;
        log_notice("uid %u pid %d: a frame stayed incomplete for %u ms (frame-timeout-ms): "
                   "closing",
                   (unsigned)s->uid, (int)s->pid, cfg->frame_timeout_ms);
        snprintf(msg, sizeof(msg),
                 "a frame was not complete within %u ms (frame-timeout-ms): send whole frames "
                 "without pausing; the connection will be closed",
                 cfg->frame_timeout_ms);
        time_out(s, msg);
        return;
    }
    if (cfg->idle_timeout_ms != 0 && session_idle(s) && proto_reader_idle(s->reader) &&
        now_ms - s->t_active >= cfg->idle_timeout_ms) {
        server_counters(s->srv)->idle_closes++;
        snprintf(msg, sizeof(msg),
                 "the connection was idle for %u ms (idle-timeout-ms) and is closed: reconnect "
                 "when there is work",
                 cfg->idle_timeout_ms);
        time_out(s, msg);
    }
}

void session_close_when_done(struct session *s)
{
    if (s->closed)
        return;
    s->close_when_done = true;
    if (finished(s))
        session_close(s);
    else
        update_poll(s);
}
