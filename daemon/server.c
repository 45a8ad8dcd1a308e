/*
 * The server (server.h): listening, accepting, signals, batching scans onto
 * the engine, deadlines, draining.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cpool.h"
#include "log.h"
#include "notify.h"
#include "refscan.h"
#include "session.h"
#include "stream.h"

#define ACCEPTS_PER_WAKEUP 64
#define ACCEPT_BACKOFF_MS  100u  /* EMFILE/ENFILE: pause accepting this long */
#define ACCEPT_LOG_MS      5000u /* and log the condition at most this often */

struct server {
    uv_loop_t loop;
    struct daemon_config cfg;
    int argc;
    char **argv;
    int listen_fd;
    bool bound; /* we created the socket file (unlink it at exit) */
    uv_poll_t listen_poll;
    bool listening;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t deadline_timer, drain_timer;
    uv_timer_t accept_timer; /* EMFILE backoff */
    uv_timer_t sweep_timer;  /* frame and idle timeouts */
    uv_idle_t later_idle;    /* runs the sessions in `later` */
    struct session *later;   /* sessions whose read-ahead frames wait (session.c links them) */
    uint64_t sweep_ms;
    uint64_t frame_reserved; /* frame-budget bytes held by sessions */
    uint64_t accept_log_ms;  /* when the EMFILE condition was last logged */
    uint64_t accept_quiet;   /* EMFILE hits since then */
    struct sched *sched;
    struct store *store;
    struct cpool *cpool; /* compiles (the store's), own threads */
    struct engine *engine;
    struct engine_batch *express; /* the express-lane batch in the engine, or NULL */
    struct session **sessions;
    uint32_t n_sessions, cap_sessions;
    struct server_counters counters;
    uint64_t start_ns;
    /* Start-up phases (ns) for the ready line: main's start, reading the
     * configuration, the disk cache index and the socket. */
    uint64_t main_ns, t_config, t_index, t_socket;
    uint64_t ready_ns;      /* when the engine reported ready */
    uint32_t preload_warms; /* preloaded catalogs still warming on the GPU engines */
    bool preload_listed;    /* the store read every catalog it preloads */
    bool draining, finished;
    bool handles_open;
    bool loop_replies; /* not engine-replies: no replies on engine threads */
    int exit_code;
};

/* ---- accessors -------------------------------------------------------- */

uv_loop_t *server_loop(struct server *srv)
{
    return &srv->loop;
}

const struct daemon_config *server_config(const struct server *srv)
{
    return &srv->cfg;
}

struct sched *server_sched(struct server *srv)
{
    return srv->sched;
}

struct store *server_store(struct server *srv)
{
    return srv->store;
}

struct engine *server_engine(struct server *srv)
{
    return srv->engine;
}

struct server_counters *server_counters(struct server *srv)
{
    return &srv->counters;
}

uint64_t server_start_ns(const struct server *srv)
{
    return srv->start_ns;
}

bool server_draining(const struct server *srv)
{
    return srv->draining;
}

void server_proto_limits(const struct server *srv, struct proto_limits *out)
{
    const struct daemon_config *c = &srv->cfg;
    memset(out, 0, sizeof(*out));
    out->max_frame =
        c->max_frame > PROTO_MAX_FRAME_CEILING ? PROTO_MAX_FRAME_CEILING : (uint32_t)c->max_frame;
    out->max_buffers = c->max_buffers;
    out->max_rules = c->max_rules;
    out->max_hits = c->max_hits;
    proto_limits_normalize(out);
}

static struct sched_limits sched_limits_of(const struct daemon_config *c)
{
    return (struct sched_limits){.quantum = c->quantum,
                                 .tenant_max_requests = c->tenant_max_requests,
                                 .tenant_max_bytes = c->tenant_max_bytes,
                                 .batch_max_ns = (uint64_t)c->batch_max_ms * 1000000u};
}

static struct store_options store_options_of(const struct daemon_config *c, struct cpool *pool)
{
    return (struct store_options){.state_dir = c->state_dir,
                                  .host_budget = c->host_catalog_budget,
                                  .tenant_max_catalogs = c->tenant_max_catalogs,
                                  .pool = pool,
                                  .compile_timeout_ms = c->compile_timeout_ms,
                                  .recent_save_ms = c->recent_save_ms};
}

/* ---- sessions --------------------------------------------------------- */

void server_session_add(struct server *srv, struct session *s)
{
    if (srv->n_sessions == srv->cap_sessions) {
        uint32_t cap = srv->cap_sessions ? 2 * srv->cap_sessions : 16;
        struct session **v = realloc(srv->sessions, cap * sizeof(*v));
        if (v == NULL) {
            session_close(s); /* cannot track it: refuse it */
            return;
        }
        srv->sessions = v;
        srv->cap_sessions = cap;
    }
    srv->sessions[srv->n_sessions++] = s;
}

void server_session_remove(struct server *srv, struct session *s)
{
    for (uint32_t i = 0; i < srv->n_sessions; i++) {
        if (srv->sessions[i] == s) {
            srv->sessions[i] = srv->sessions[--srv->n_sessions];
            return;
        }
    }
}

uint32_t server_session_count(const struct server *srv)
{
    return srv->n_sessions;
}

uint32_t server_uid_sessions(const struct server *srv, uid_t uid)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < srv->n_sessions; i++)
        n += session_uid(srv->sessions[i]) == uid;
    return n;
}

uint32_t server_session_uids(const struct server *srv, uid_t *out, uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < srv->n_sessions; i++) {
        uid_t u = session_uid(srv->sessions[i]);
        uint32_t k = 0;
        while (k < n && out[k] != u)
            k++;
        if (k == n && n < cap)
            out[n++] = u;
    }
    return n;
}

bool server_frame_reserve(struct server *srv, uint64_t bytes)
{
    if (srv->frame_reserved != 0 && srv->frame_reserved + bytes > srv->cfg.frame_budget)
        return false;
    srv->frame_reserved += bytes;
    return true;
}

static void resume_all(struct server *srv);

void server_frame_release(struct server *srv, uint64_t bytes)
{
    srv->frame_reserved -= bytes;
    resume_all(srv);
}

uint64_t server_frame_reserved(const struct server *srv)
{
    return srv->frame_reserved;
}

void server_resume_tenant(struct server *srv, uid_t uid)
{
    for (uint32_t i = 0; i < srv->n_sessions; i++) {
        if (session_uid(srv->sessions[i]) == uid)
            session_resume(srv->sessions[i]);
    }
}

/* ---- batches ---------------------------------------------------------- */

/* A scan of at most this many bytes may take the express lane. */
#define EXPRESS_BYTES (64u << 10)

/* Engine thread: a batch the CPU engine finished has its scan replies
 * encoded and written there (session_scan_finished), so the loop only reads
 * requests and frees them (issue 10: the loop bound 4 KiB scans at 64
 * clients). GPU batches are left to the loop: their engine thread's next
 * batch waits for it. */
static void batch_finished(struct engine_batch *b)
{
    if (b->tel.gpu)
        return;
    for (struct engine_job *j = b->jobs; j != NULL; j = j->next) {
        if (j->done == NULL)
            session_scan_finished(j, &b->tel);
    }
}

/* Hands the jobs linked from `first` to the engine as one batch; NULL when
 * out of memory (the jobs are then answered INTERNAL). */
static struct engine_batch *submit_jobs(struct server *srv, struct sched_job *first)
{
    struct engine_batch *b = calloc(1, sizeof(*b));
    struct engine_job **tail = b != NULL ? &b->jobs : NULL;
    for (struct sched_job *j = first, *next; j != NULL; j = next) {
        next = j->next;
        struct engine_job *ej = j->engine_job ? j->engine_job(j) : session_job_engine(j);
        ej->next = NULL;
        if (b == NULL) {
            ej->status = vks_error_set(&ej->err, -VKS_E_INTERNAL,
                                       "out of memory "
                                       "forming a batch: retry");
            if (ej->done != NULL)
                ej->done(ej, &(struct engine_telemetry){0});
            else
                session_scan_done(ej, &(struct engine_telemetry){0});
            continue;
        }
        *tail = ej;
        tail = &ej->next;
    }
    if (b != NULL) {
        b->finished = srv->loop_replies ? NULL : batch_finished;
        engine_submit(srv->engine, b);
    }
    return b;
}

void server_kick(struct server *srv)
{
    if (srv->engine == NULL || !engine_serving(srv->engine))
        return;
    /* inflight-batches on each engine, plus, per GPU engine, one queued
     * behind them that it uploads while they run */
    while (engine_pending(srv->engine) < srv->cfg.inflight_batches * engine_count(srv->engine) +
                                             engine_get_info(srv->engine)->gpu_engines) {
        struct sched_job *first;
        size_t n = sched_next_batch(srv->sched, srv->cfg.batch_max_bytes,
                                    srv->cfg.batch_max_buffers, &first);
        if (n == 0)
            return;
        submit_jobs(srv, first);
    }
    /* The engine is full, possibly of a flood's large batches: one small
     * scan at a time goes past them (the CPU engine keeps a thread for small
     * batches), so another tenant's 4 KiB scan does not wait for a large
     * batch to finish (issue 8, bench/attack_all: 50 ms behind a flood of
     * 4 MiB scans). With one CPU thread there is no such thread: the scan
     * would only wait in the engine instead, past its queue deadline. */
    struct sched_job *first;
    if (srv->express == NULL && engine_get_info(srv->engine)->cpu_threads >= 2 &&
        sched_next_small(srv->sched, EXPRESS_BYTES, &first) != 0)
        srv->express = submit_jobs(srv, first);
}

static void resume_all(struct server *srv)
{
    for (uint32_t i = 0; i < srv->n_sessions; i++)
        session_resume(srv->sessions[i]);
}

static void on_batch_done(struct engine *eng, struct engine_batch *b, void *ctx)
{
    (void)eng;
    struct server *srv = ctx;
    if (b == srv->express)
        srv->express = NULL;
    const struct engine_telemetry *t = &b->tel;
    metrics_hist_observe(&srv->counters.hist_gpu, t->gpu ? t->gpu_tel.kernel_ns : t->scan_ns);
    sched_observe(srv->sched, t->bytes, t->wall_ns != 0 ? t->wall_ns : t->fd_read_ns + t->scan_ns);
    for (struct engine_job *j = b->jobs, *next; j != NULL; j = next) {
        next = j->next; /* the job's memory goes with its request */
        if (j->done != NULL)
            j->done(j, &b->tel);
        else
            session_scan_done(j, &b->tel);
    }
    free(b);
    resume_all(srv);
    server_kick(srv);
    server_check_drained(srv);
}

static void on_deadline(uv_timer_t *t)
{
    struct server *srv = t->data;
    struct sched_job *first;
    sched_take_expired(srv->sched, uv_hrtime(), &first);
    for (struct sched_job *j = first, *next; j != NULL; j = next) {
        next = j->next;
        session_scan_expired(j);
    }
    resume_all(srv);
    server_watch_deadlines(srv);
    server_check_drained(srv);
}

void server_watch_deadlines(struct server *srv)
{
    uint64_t next = sched_next_deadline(srv->sched);
    if (next == 0) {
        uv_timer_stop(&srv->deadline_timer);
        return;
    }
    uint64_t now = uv_hrtime();
    uint64_t ms = next > now ? (next - now) / 1000000u + 1 : 0;
    uv_timer_start(&srv->deadline_timer, on_deadline, ms, 0);
}

/* ---- listening -------------------------------------------------------- */

static void on_accept(uv_poll_t *h, int status, int events);

static void on_accept_backoff(uv_timer_t *t)
{
    struct server *srv = t->data;
    if (!srv->listening || srv->draining)
        return;
    int rc = uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
    if (rc != 0)
        log_err("cannot accept connections again: %s", uv_strerror(rc));
}

/* accept() ran out of descriptors: the pending connection stays in the
 * backlog and the socket stays readable, so polling on would spin. Stop
 * accepting for ACCEPT_BACKOFF_MS and log at most every ACCEPT_LOG_MS. */
static void accept_backoff(struct server *srv, int e)
{
    srv->counters.accept_fd_limit++;
    srv->accept_quiet++;
    uint64_t now = uv_now(&srv->loop);
    if (srv->accept_log_ms == 0 || now - srv->accept_log_ms >= ACCEPT_LOG_MS) {
        log_warn("accept failed: %s (%llu times since the last report): pausing accepts for %u "
                 "ms; raise LimitNOFILE or lower max-connections",
                 strerror(e), (unsigned long long)srv->accept_quiet, ACCEPT_BACKOFF_MS);
        srv->accept_log_ms = now;
        srv->accept_quiet = 0;
    }
    uv_poll_stop(&srv->listen_poll);
    uv_timer_start(&srv->accept_timer, on_accept_backoff, ACCEPT_BACKOFF_MS, 0);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    struct server *srv = h->data;
    (void)events;
    if (status < 0) {
        log_err("listening socket failed: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < ACCEPTS_PER_WAKEUP && !srv->draining; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            accept_backoff(srv, errno);
            return;
        }
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                log_warn("accept failed: %s", strerror(errno));
            return;
        }
        srv->counters.connections_total++;
        if (srv->n_sessions >= srv->cfg.max_connections) {
            srv->counters.connections_refused++;
            log_warn("refused a connection: %u open, the limit (max-connections) is %u",
                     srv->n_sessions, srv->cfg.max_connections);
            close(fd);
            continue;
        }
        struct session *s;
        int rc = session_create(srv, fd, &s);
        if (rc == -EUSERS)
            log_debug("refused a connection over tenant-max-connections");
        else if (rc != 0)
            log_warn("cannot serve a new connection: %s", strerror(-rc));
    }
}

static void on_sweep(uv_timer_t *t)
{
    struct server *srv = t->data;
    uint64_t now = uv_now(&srv->loop);
    store_sweep(srv->store);
    for (uint32_t i = srv->n_sessions; i > 0; i--) {
        if (i <= srv->n_sessions)
            session_sweep(srv->sessions[i - 1], now);
    }
    stream_spare_trim(now);
}

/* Runs the timeout sweep at a quarter of the shortest timeout or
 * recent-save-ms (10 ms to 1 s), or not at all when all are off. */
static void arm_sweep(struct server *srv)
{
    uint64_t a = srv->cfg.frame_timeout_ms, b = srv->cfg.idle_timeout_ms;
    uint64_t m = a == 0 ? b : b == 0 ? a : a < b ? a : b;
    uint64_t c = srv->cfg.compile_timeout_ms;
    m = m == 0 ? c : c == 0 ? m : m < c ? m : c;
    uint64_t st = srv->cfg.stream_idle_timeout_ms; /* daemon/stream.c */
    m = m == 0 ? st : st == 0 ? m : m < st ? m : st;
    uint64_t rs = srv->cfg.recent_save_ms; /* store_sweep writes the recent list */
    m = m == 0 ? rs : rs == 0 ? m : m < rs ? m : rs;
    uint64_t every = m / 4 < 10 ? 10 : m / 4 > 1000 ? 1000 : m / 4;
    if (m == 0) {
        uv_timer_stop(&srv->sweep_timer);
        srv->sweep_ms = 0;
    } else if (every != srv->sweep_ms) {
        uv_timer_start(&srv->sweep_timer, on_sweep, every, every);
        srv->sweep_ms = every;
    }
}

/* Gives the socket file we bound to cfg->socket_group (a name or gid). */
static int chown_socket(struct server *srv, struct vks_error *err)
{
    const char *name = srv->cfg.socket_group;
    if (name[0] == '\0')
        return 0;
    char *end;
    gid_t gid = (gid_t)strtoul(name, &end, 10);
    if (*end != '\0') {
        const struct group *g = getgrnam(name);
        if (g == NULL)
            return vks_error_set(err, -ENOENT,
                                 "socket-group %s is no group on this host: create it or "
                                 "choose another",
                                 name);
        gid = g->gr_gid;
    }
    if (chown(srv->cfg.socket_path, (uid_t)-1, gid) != 0)
        return vks_error_set(err, -errno,
                             "cannot give %s to group %s: %s: vkscand must be a member of the "
                             "group (or root)",
                             srv->cfg.socket_path, name, strerror(errno));
    return 0;
}

/* Binds cfg->socket_path, replacing a stale socket file but not a live
 * daemon's. */
static int bind_socket(struct server *srv, struct vks_error *err)
{
    const char *path = srv->cfg.socket_path;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return vks_error_set(err, -ENAMETOOLONG,
                             "socket path %s is longer than %zu bytes: "
                             "choose a shorter --socket",
                             path, sizeof(sa.sun_path) - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return vks_error_set(err, -errno, "cannot create a socket: %s", strerror(errno));
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode)) {
            close(fd);
            return vks_error_set(err, -EEXIST,
                                 "%s exists and is not a socket: remove it or "
                                 "choose another --socket",
                                 path);
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            close(fd);
            return vks_error_set(err, -EADDRINUSE,
                                 "another vkscand is listening on %s: stop "
                                 "it first or choose another --socket",
                                 path);
        }
        unlink(path);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        chmod(path, srv->cfg.socket_mode) != 0 || listen(fd, SOMAXCONN) != 0) {
        int rc = -errno;
        close(fd);
        return vks_error_set(err, rc,
                             "cannot listen on %s: %s: check that its directory "
                             "exists and is writable",
                             path, strerror(-rc));
    }
    int rc = chown_socket(srv, err);
    if (rc != 0) {
        close(fd);
        unlink(path);
        return rc;
    }
    srv->listen_fd = fd;
    srv->bound = true;
    return 0;
}

static int open_listener(struct server *srv, struct vks_error *err)
{
    int fd = notify_listen_fd(err);
    if (fd >= 0) {
        srv->listen_fd = fd;
        log_info("using the socket passed by the service manager (socket activation)");
    } else if (fd != -ENOENT) {
        return fd;
    } else {
        int rc = bind_socket(srv, err);
        if (rc != 0)
            return rc;
    }
    int rc = uv_poll_init(&srv->loop, &srv->listen_poll, srv->listen_fd);
    if (rc != 0) {
        close(srv->listen_fd);
        srv->listen_fd = -1;
        return vks_error_set(err, rc, "cannot watch the socket: %s", uv_strerror(rc));
    }
    srv->listen_poll.data = srv;
    srv->listening = true;
    return 0;
}

static void close_listener(struct server *srv)
{
    if (!srv->listening)
        return;
    srv->listening = false;
    uv_close((uv_handle_t *)&srv->listen_poll, NULL);
    close(srv->listen_fd);
    srv->listen_fd = -1;
    if (srv->bound)
        unlink(srv->cfg.socket_path);
}

/* ---- sessions with frames read ahead ---------------------------------- */

static void on_later(uv_idle_t *h);

struct session **server_later(struct server *srv)
{
    if (srv->handles_open && !uv_is_active((uv_handle_t *)&srv->later_idle))
        uv_idle_start(&srv->later_idle, on_later);
    return &srv->later;
}

static void run_later(struct server *srv)
{
    struct session *s = srv->later;
    srv->later = NULL;
    while (s != NULL)
        s = session_run_later(s);
}

/* Runs before the loop polls: frames that wait in a session's read-ahead
 * are not announced by the socket, so they are handled from here. */
static void on_later(uv_idle_t *h)
{
    struct server *srv = h->data;
    uv_idle_stop(h);
    run_later(srv);
}

/* ---- draining and signals --------------------------------------------- */

static void close_handles(struct server *srv)
{
    if (!srv->handles_open)
        return;
    run_later(srv); /* their references */
    srv->handles_open = false;
    uv_close((uv_handle_t *)&srv->later_idle, NULL);
    uv_close((uv_handle_t *)&srv->sig_term, NULL);
    uv_close((uv_handle_t *)&srv->sig_int, NULL);
    uv_close((uv_handle_t *)&srv->sig_hup, NULL);
    uv_close((uv_handle_t *)&srv->deadline_timer, NULL);
    uv_close((uv_handle_t *)&srv->drain_timer, NULL);
    uv_close((uv_handle_t *)&srv->accept_timer, NULL);
    uv_close((uv_handle_t *)&srv->sweep_timer, NULL);
}

void server_check_drained(struct server *srv)
{
    if (!srv->draining || srv->finished)
        return;
    if (srv->n_sessions > 0 || (srv->engine && engine_pending(srv->engine) > 0) ||
        store_busy(srv->store))
        return;
    srv->finished = true;
    log_notice("drained: exiting");
    engine_close(srv->engine);
    srv->engine = NULL;
    close_listener(srv);
    close_handles(srv);
}

static void on_drain_timeout(uv_timer_t *t)
{
    struct server *srv = t->data;
    log_warn("drain timeout (%u ms) passed: closing %u connections with work still pending",
             srv->cfg.drain_timeout_ms, srv->n_sessions);
    for (uint32_t i = srv->n_sessions; i > 0; i--)
        session_close(srv->sessions[i - 1]);
    server_check_drained(srv);
}

static void begin_drain(struct server *srv, const char *why)
{
    if (srv->draining)
        return;
    srv->draining = true;
    notify_send("STOPPING=1");
    log_notice("%s: no longer accepting; finishing %u connections' work", why, srv->n_sessions);
    close_listener(srv);
    store_shutdown(srv->store); /* a compile would outlast the drain timeout */
    for (uint32_t i = srv->n_sessions; i > 0; i--)
        session_close_when_done(srv->sessions[i - 1]);
    uv_timer_start(&srv->drain_timer, on_drain_timeout, srv->cfg.drain_timeout_ms, 0);
    server_check_drained(srv);
}

/* The raw matches one whole-buffer walk may keep (rules/refscan.h): 4 x
 * max-hits, at least 65,536, so that a hit-dense buffer of a catalog with
 * unbounded rules fails with LIMIT instead of taking the host's memory. */
static uint64_t raw_limit_of(const struct daemon_config *cfg)
{
    uint64_t v = 4 * (uint64_t)cfg->max_hits;
    return v > 65536 ? v : 65536;
}

static void reload(struct server *srv)
{
    notify_send("RELOADING=1");
    struct daemon_config next;
    struct vks_error err = {0};
    int rc = config_load(&next, srv->argc, srv->argv, stderr, &err);
    if (rc != 0) {
        log_err("reload failed, keeping the running configuration: %s", err.msg);
    } else {
        config_apply_reload(&srv->cfg, &next);
        struct sched_limits sl = sched_limits_of(&srv->cfg);
        sched_set_limits(srv->sched, &sl);
        struct store_options so = store_options_of(&srv->cfg, srv->cpool);
        store_set_options(srv->store, &so);
        cpool_set_tenant_max(srv->cpool, srv->cfg.tenant_max_compiles);
        refscan_set_raw_limit(raw_limit_of(&srv->cfg));
        srv->counters.reloads++;
        arm_sweep(srv);
        log_notice("configuration reloaded");
        resume_all(srv);
        server_kick(srv);
    }
    notify_send("READY=1");
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct server *srv = h->data;
    if (signum == SIGHUP)
        reload(srv);
    else
        begin_drain(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

/* ---- preloading (docs/daemon.md "Warm restart") ------------------------ */

struct preload {
    struct server *srv;
    struct store_entry *entry; /* referenced while the engines warm it */
};

static void preload_check_done(struct server *srv)
{
    if (!srv->preload_listed || srv->preload_warms > 0 || srv->counters.preload_done)
        return;
    srv->counters.preload_done = 1;
    srv->counters.preload_ns = uv_hrtime() - srv->ready_ns;
    struct store_stats ss;
    store_get_stats(srv->store, &ss);
    log_notice("preloaded %llu catalogs in %.1f ms after ready (%llu bytes in memory)",
               (unsigned long long)srv->counters.preload_catalogs, ms(srv->counters.preload_ns),
               (unsigned long long)ss.host_bytes);
}

static void on_preload_warm(void *ctx)
{
    struct preload *p = ctx;
    struct server *srv = p->srv;
    store_entry_unref(srv->store, p->entry);
    free(p);
    srv->counters.preload_catalogs++;
    srv->preload_warms--;
    preload_check_done(srv);
}

/* The store read a catalog used last (or, entry NULL, all of them): make
 * it resident on the GPU engines too. */
static void on_preload_read(void *ctx, int status, const struct store_result *res,
                            const struct vks_error *err)
{
    (void)status, (void)err;
    struct server *srv = ctx;
    if (res->entry == NULL) {
        srv->preload_listed = true;
        preload_check_done(srv);
        return;
    }
    struct preload *p = malloc(sizeof(*p));
    if (p == NULL || srv->engine == NULL) {
        free(p);
        return; /* only a head start */
    }
    p->srv = srv;
    p->entry = res->entry;
    store_entry_ref(p->entry);
    srv->preload_warms++;
    engine_warm(srv->engine, store_entry_catalog(p->entry), on_preload_warm, p);
}

static void on_engine_ready(struct engine *eng, int status, const struct vks_error *err, void *ctx)
{
    (void)eng;
    struct server *srv = ctx;
    if (!srv->listening)
        return; /* server_create failed after the engine began (no socket): it is going away */
    if (status != 0) {
        log_err("%s", err->msg);
        srv->exit_code = 1;
        begin_drain(srv, "engine failed");
        return;
    }
    if (srv->draining)
        return;
    int rc = uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
    if (rc != 0) {
        log_err("cannot accept connections: %s", uv_strerror(rc));
        srv->exit_code = 1;
        begin_drain(srv, "listen failed");
        return;
    }
    const struct engine_info *info = engine_get_info(srv->engine);
    char state[512];
    snprintf(state, sizeof(state), "READY=1\nSTATUS=serving on %s (%s)\nMAINPID=%d",
             srv->cfg.socket_path, info->gpu ? info->device.name : "CPU scanner", (int)getpid());
    notify_send(state);
    arm_sweep(srv);
    srv->ready_ns = uv_hrtime();
    srv->counters.start_ready_ns = srv->ready_ns - srv->main_ns;
    /* The engine's steps ran on its own thread, beside the loop's. */
    log_notice("vkscand %s ready on %s, engine %s, in %.1f ms (config %.1f, disk cache index "
               "%.1f, socket %.1f; engine thread: Vulkan instance and device %.1f, device list "
               "%.1f, self-test and pipelines %.1f)",
               VKS_VERSION, srv->cfg.socket_path, info->gpu ? info->device.name : "CPU",
               ms(srv->counters.start_ready_ns), ms(srv->t_config), ms(srv->t_index),
               ms(srv->t_socket), ms(info->start_open_ns), ms(info->start_list_ns),
               ms(info->start_selftest_ns));
    store_preload(srv->store, srv->cfg.preload_catalogs, on_preload_read, srv);
    server_kick(srv);
}

/* ---- life cycle ------------------------------------------------------- */

/* Under --engine auto (and cpu) connections are taken before the engine
 * reports ready: until the GPU engines have opened their devices and warmed
 * their pipelines (on the H200 most of the start: 140-170 ms of driver),
 * the CPU engine scans every batch, with the same hits. READY=1 still waits
 * for the GPU engines (on_engine_ready). docs/daemon.md "Warm restart". */
static int accept_early(struct server *srv, struct vks_error *err)
{
    int rc = uv_poll_start(&srv->listen_poll, UV_READABLE, on_accept);
    if (rc != 0)
        return vks_error_set(err, rc, "cannot accept connections: %s", uv_strerror(rc));
    arm_sweep(srv);
    srv->counters.start_accept_ns = uv_hrtime() - srv->main_ns;
    log_info("accepting on %s after %.1f ms (the CPU engine scans until any GPU engine is up)",
             srv->cfg.socket_path, ms(srv->counters.start_accept_ns));
    return 0;
}

static void on_store_idle(void *ctx)
{
    server_check_drained(ctx);
}

static int init_handles(struct server *srv, struct vks_error *err)
{
    int rc = uv_signal_init(&srv->loop, &srv->sig_term);
    rc = rc ? rc : uv_signal_init(&srv->loop, &srv->sig_int);
    rc = rc ? rc : uv_signal_init(&srv->loop, &srv->sig_hup);
    rc = rc ? rc : uv_timer_init(&srv->loop, &srv->deadline_timer);
    rc = rc ? rc : uv_timer_init(&srv->loop, &srv->drain_timer);
    rc = rc ? rc : uv_timer_init(&srv->loop, &srv->accept_timer);
    rc = rc ? rc : uv_timer_init(&srv->loop, &srv->sweep_timer);
    rc = rc ? rc : uv_idle_init(&srv->loop, &srv->later_idle);
    if (rc != 0)
        return vks_error_set(err, rc, "cannot set up signal handling: %s", uv_strerror(rc));
    srv->handles_open = true;
    srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
    srv->deadline_timer.data = srv->drain_timer.data = srv;
    srv->accept_timer.data = srv->sweep_timer.data = srv;
    srv->later_idle.data = srv;
    rc = uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
    rc = rc ? rc : uv_signal_start(&srv->sig_int, on_signal, SIGINT);
    rc = rc ? rc : uv_signal_start(&srv->sig_hup, on_signal, SIGHUP);
    if (rc != 0)
        return vks_error_set(err, rc, "cannot watch signals: %s", uv_strerror(rc));
    return 0;
}

/* The store let a catalog go for good: free its device copy too. */
static void on_catalog_forgotten(void *ctx, const uint8_t fp[CATALOG_FP_LEN])
{
    struct server *srv = ctx;
    engine_forget(srv->engine, fp);
}

int server_create(const struct daemon_config *cfg, int argc, char **argv, uint64_t main_ns,
                  struct server **out, struct vks_error *err)
{
    struct server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory starting the server");
    srv->cfg = *cfg;
    srv->argc = argc;
    srv->argv = argv;
    srv->listen_fd = -1;
    srv->start_ns = uv_hrtime();
    /* engine-replies: scan replies written by the CPU engine's threads
     * (docs/daemon.md "Who writes replies") */
    srv->loop_replies = !cfg->engine_replies;
    srv->main_ns = main_ns != 0 ? main_ns : srv->start_ns;
    srv->t_config = srv->start_ns - srv->main_ns;
    struct server_counters *c = &srv->counters;
    metrics_hist_init(&c->hist_queue_wait, "queue_wait_ns", metrics_ns_bounds, 6);
    metrics_hist_init(&c->hist_gpu, "gpu_ns", metrics_ns_bounds, 6);
    metrics_hist_init(&c->hist_scan_total, "scan_total_ns", metrics_ns_bounds, 6);
    metrics_hist_init(&c->hist_scan_bytes, "scan_bytes", metrics_byte_bounds, 6);
    int rc = uv_loop_init(&srv->loop);
    if (rc != 0) {
        free(srv);
        return vks_error_set(err, rc, "cannot create the event loop: %s", uv_strerror(rc));
    }
    uv_loop_configure(&srv->loop, UV_METRICS_IDLE_TIME); /* loop_busy_ns; best effort */
    struct sched_limits sl = sched_limits_of(cfg);
    rc = cpool_create(&srv->loop, cfg->compile_threads, cfg->tenant_max_compiles, &srv->cpool);
    if (rc != 0) {
        uv_loop_close(&srv->loop);
        free(srv);
        return vks_error_set(err, rc, "cannot start the compile threads: %s", strerror(-rc));
    }
    struct store_options so = store_options_of(cfg, srv->cpool);
    rc = init_handles(srv, err);
    if (rc == 0 && sched_create(&sl, &srv->sched) != 0)
        rc = vks_error_set(err, -ENOMEM, "out of memory creating the scheduler");
    /* The engine first: its thread opens the Vulkan device (most of the
     * start) while this one reads the disk cache index and opens the
     * socket. It reports through the loop, which runs after this. */
    refscan_set_raw_limit(raw_limit_of(cfg));
    if (rc == 0)
        rc = engine_create(&srv->loop, cfg, on_engine_ready, on_batch_done, srv, &srv->engine, err);
    uint64_t t = uv_hrtime();
    if (rc == 0)
        rc = store_create(&srv->loop, &so, &srv->store, err);
    srv->t_index = uv_hrtime() - t;
    t = uv_hrtime();
    if (rc == 0) {
        store_set_idle(srv->store, on_store_idle, srv);
        store_set_forget(srv->store, on_catalog_forgotten, srv);
        rc = open_listener(srv, err);
    }
    srv->t_socket = uv_hrtime() - t;
    if (rc == 0 && engine_serving(srv->engine))
        rc = accept_early(srv, err);
    if (rc != 0) {
        server_destroy(srv);
        return rc;
    }
    *out = srv;
    return 0;
}

int server_run(struct server *srv)
{
    uv_run(&srv->loop, UV_RUN_DEFAULT);
    return srv->exit_code;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void server_destroy(struct server *srv)
{
    if (srv == NULL)
        return;
    for (uint32_t i = srv->n_sessions; i > 0; i--)
        session_close(srv->sessions[i - 1]);
    engine_close(srv->engine);
    srv->engine = NULL;
    cpool_destroy(srv->cpool); /* stops compiles and runs their callbacks */
    srv->cpool = NULL;
    close_listener(srv);
    close_handles(srv);
    uv_walk(&srv->loop, close_any, NULL);
    uv_run(&srv->loop, UV_RUN_DEFAULT); /* close callbacks and pending work */
    if (uv_loop_close(&srv->loop) != 0)
        log_warn("event loop closed with handles still open");
    store_destroy(srv->store);
    sched_destroy(srv->sched);
    free(srv->sessions);
    free(srv);
}
