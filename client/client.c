/*
 * libvkscan: one connection to vkscand (vkscan/vkscan.h).
 *
 * Every call but a pipelined stream write goes through call(): encode,
 * send, wait for the reply with the same id, decode. A broken connection
 * is closed at once; idempotent calls reconnect and retry with a doubling
 * backoff. Pipelined writes (vks_stream_write_send) leave their ids in
 * `pend`; a reply that arrives while the client waits for another one, or
 * while it sends, is kept in `stash` if its id is pending and dropped
 * otherwise. Sending reads the replies that arrived first, and reads more
 * while the socket is full, so that neither side blocks on the other.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"
#include "vkscan/vkscan.h"

#define DEFAULT_CONNECT_MS 5000u
#define DEFAULT_IO_MS      30000u
#define DEFAULT_RETRIES    3u
#define DEFAULT_BACKOFF_MS 50u
#define MAX_BACKOFF_MS     2000u
#define READ_AHEAD         (16u << 10) /* reply bytes one recvmsg may take past a frame */

/* Memfds a client keeps for its large inline buffers (memfd_take): at
 * most this many, and this many bytes in all. */
#define MEMFD_KEEP       4u
#define MEMFD_KEEP_BYTES (256ull << 20)

struct vks_client {
    char *path;
    struct vks_client_options opt;
    char name[64];
    int memfd[MEMFD_KEEP]; /* -1: none */
    uint64_t memfd_size[MEMFD_KEEP];
    uint8_t *memfd_map[MEMFD_KEEP]; /* its memfd_size bytes, mapped shared */
    int fd;
    uint32_t drops; /* connections dropped so far: streams live on one */
    uint32_t next_id;
    struct proto_limits lim;
    struct proto_reader *reader;
    struct proto_buf out;
    struct vks_server_info info;
    /* pipelined writes: ids sent and not received, replies read early */
    uint32_t *pend;
    size_t n_pend, cap_pend;
    struct stashed *stash;
};

/* A reply read before anyone asked for it. */
struct stashed {
    struct stashed *next;
    struct proto_reply *rep;
};

struct vks_catalog {
    struct proto_reply *rep;
    bool sent;
};

/* Closes and unmaps kept memfd `slot`, if any. */
static void memfd_drop(struct vks_client *c, uint32_t slot)
{
    if (c->memfd_map[slot] != NULL)
        munmap(c->memfd_map[slot], (size_t)c->memfd_size[slot]);
    if (c->memfd[slot] >= 0)
        close(c->memfd[slot]);
    c->memfd_map[slot] = NULL;
    c->memfd[slot] = -1;
    c->memfd_size[slot] = 0;
}

const char *vks_strerror(int code)
{
    if (code == -VKS_E_DENIED || code == VKS_E_DENIED)
        return "not allowed to connect";
    return proto_strerror(code);
}

const char *vks_version(void)
{
    return VKS_VERSION;
}

/* The 0.2 layouts: what a struct_size of 0 stands for (vkscan.h, ABI). */
#define CLIENT_OPTIONS_BASE offsetof(struct vks_client_options, memfd_threshold)
#define LOAD_OPTIONS_BASE   offsetof(struct vks_load_options, ids_only)
/* ids_only came from 0.2's padding: the struct keeps its 0.2 size */
_Static_assert(sizeof(struct vks_load_options) == 48 || sizeof(size_t) != 8,
               "vks_load_options changed size");
#define SCAN_OPTIONS_BASE offsetof(struct vks_scan_options, no_cache)

/*
 * Copies the caller's option struct `src` over `dst` (already holding the
 * defaults, `cur` bytes): only the bytes the caller's layout has, as its
 * struct_size says, so an older, smaller struct leaves the newer fields at
 * their defaults. The copy's struct_size is ours.
 */
static void read_options(void *dst, size_t cur, const void *src, size_t base)
{
    size_t n;
    memcpy(&n, src, sizeof(n));
    if (n == 0)
        n = base;
    if (n > cur)
        n = cur; /* a newer caller: the fields this library does not know are ignored */
    if (n > sizeof(size_t))
        memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t),
               n - sizeof(size_t));
    memcpy(dst, &cur, sizeof(cur));
}

void vks_load_options_init(struct vks_load_options *opt)
{
    memset(opt, 0, sizeof(*opt));
    opt->struct_size = sizeof(*opt);
}

void vks_scan_options_init(struct vks_scan_options *opt)
{
    memset(opt, 0, sizeof(*opt));
    opt->struct_size = sizeof(*opt);
}

void vks_client_options_init(struct vks_client_options *opt)
{
    memset(opt, 0, sizeof(*opt));
    opt->struct_size = sizeof(*opt);
    opt->memfd_threshold = VKS_MEMFD_THRESHOLD_DEFAULT;
    opt->socket_buffer = VKS_SOCKET_BUFFER_DEFAULT;
    opt->connect_timeout_ms = DEFAULT_CONNECT_MS;
    opt->io_timeout_ms = DEFAULT_IO_MS;
    opt->retries = DEFAULT_RETRIES;
    opt->backoff_ms = DEFAULT_BACKOFF_MS;
    opt->max_frame = PROTO_DEFAULT_MAX_FRAME;
    opt->client_name = "libvkscan";
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- the socket ---------------------------------------------------------------- */

static void drop_connection(struct vks_client *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->drops++;
    }
    c->fd = -1;
    proto_reader_destroy(c->reader);
    c->reader = NULL;
    while (c->stash != NULL) { /* the writes of this connection's streams are gone */
        struct stashed *x = c->stash;
        c->stash = x->next;
        proto_reply_destroy(x->rep);
        free(x);
    }
    c->n_pend = 0;
}

static bool pending(const struct vks_client *c, uint32_t id)
{
    for (size_t i = 0; i < c->n_pend; i++)
        if (c->pend[i] == id)
            return true;
    return false;
}

static void pend_remove(struct vks_client *c, uint32_t id)
{
    for (size_t i = 0; i < c->n_pend; i++)
        if (c->pend[i] == id) {
            c->pend[i] = c->pend[--c->n_pend];
            return;
        }
}

/* Takes the stashed reply with `id`, or NULL. */
static struct proto_reply *unstash(struct vks_client *c, uint32_t id)
{
    for (struct stashed **p = &c->stash; *p != NULL; p = &(*p)->next) {
        if ((*p)->rep->id != id)
            continue;
        struct stashed *x = *p;
        struct proto_reply *rep = x->rep;
        *p = x->next;
        free(x);
        return rep;
    }
    return NULL;
}

/* A non-blocking connect: Unix sockets answer at once, except EAGAIN when the
 * daemon's backlog is full, which is retried until the deadline. */
static int open_socket(struct vks_client *c, struct vks_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(c->path) >= sizeof(sa.sun_path))
        return vks_error_set(err, -ENAMETOOLONG,
                             "socket path `%s` is longer than %zu bytes: use a shorter path",
                             c->path, sizeof(sa.sun_path) - 1);
    memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return vks_error_set(err, -errno, "socket(): %s", strerror(errno));
    /* Larger socket buffers for the scans that stay inline (best effort: the
     * kernel caps them at net.core.wmem_max / rmem_max). */
    int sz = (int)(c->opt.socket_buffer > INT32_MAX / 2 ? INT32_MAX / 2 : c->opt.socket_buffer);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    int64_t deadline = now_ms() + c->opt.connect_timeout_ms;
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == EAGAIN && now_ms() < deadline) {
            sleep_ms(5);
            continue;
        }
        close(fd);
        if (e == EAGAIN)
            e = ETIMEDOUT;
        return vks_error_set(err, -e,
                             "cannot connect to vkscand at %s: %s (is vkscand running, and may "
                             "this user open its socket?)",
                             c->path, strerror(e));
    }
    c->fd = fd;
    /* Read-ahead takes a reply's length prefix and body in one recvmsg;
     * read_some parses what it holds before anyone polls the socket. */
    return proto_reader_create(&c->lim, &c->reader) < 0 ||
                   proto_reader_read_ahead(c->reader, READ_AHEAD) < 0
               ? vks_error_set(err, -ENOMEM, "out of memory for a frame reader")
               : 0;
}

/*
 * An error reply with id 0 answers no request of ours (libvkscan never
 * sends id 0): vkscand refused the connection (BUSY at accept, over
 * tenant-max-connections), timed it out (TIMEOUT: idle, or a frame not
 * whole in time) or could not read a frame, and closes it. Its message
 * becomes the call's error instead of the reset that follows it, and the
 * connection is dropped. A timeout counts as a lost connection (-ECONNRESET:
 * idempotent calls reconnect and retry); the others keep their code.
 */
static int closed_by_daemon(struct vks_client *c, struct proto_reply *rep, struct vks_error *err)
{
    int code = rep->error.code == -VKS_E_TIMEOUT ? -ECONNRESET : rep->error.code;
    vks_error_set(err, code, "vkscand closed the connection: %s", rep->error.msg);
    proto_reply_destroy(rep);
    drop_connection(c);
    return code;
}

/*
 * Reads and decodes the replies the socket holds, until the one with `id`
 * (0: none) is complete, and returns 1 with it in *out. Others are stashed
 * when pending, dropped otherwise. Returns 0 when the socket is empty
 * (-EAGAIN of a non-blocking read), or an error.
 */
static int read_some(struct vks_client *c, uint32_t id, struct proto_reply **out,
                     struct vks_error *err)
{
    for (;;) {
        int rc = proto_reader_recv(c->reader, c->fd, err);
        if (rc == PROTO_RECV_EOF)
            return vks_error_set(err, -ECONNRESET, "vkscand closed the connection");
        if (rc == -EAGAIN)
            return 0;
        if (rc == -ENOMEM) {
            /* The reader refuses further input: this connection is done. */
            drop_connection(c);
            return vks_error_set(err, -ENOMEM, "out of memory reading a reply from vkscand");
        }
        if (rc < 0)
            return rc;
        if (rc != PROTO_RECV_FRAME)
            continue;
        struct proto_frame f;
        struct proto_reply *rep = NULL;
        proto_reader_take(c->reader, &f);
        rc = proto_reply_decode(&f, &c->lim, &rep, err);
        if (rc == -ENOMEM) /* the frame was read whole: the connection stays in step */
            return vks_error_set(err, -ENOMEM, "out of memory decoding a reply from vkscand");
        if (rc < 0) {
            char why[sizeof(err->msg)]; /* err->msg cannot be both source and target */
            snprintf(why, sizeof(why), "%s", err != NULL ? err->msg : "");
            return vks_error_set(err, -VKS_E_PROTOCOL, "vkscand sent a malformed reply (%s): %s",
                                 proto_strerror(rc), why);
        }
        if (id != 0 && rep->id == id) {
            *out = rep;
            return 1;
        }
        if (rep->id == 0 && rep->error.code != 0)
            return closed_by_daemon(c, rep, err);
        struct stashed *x = pending(c, rep->id) ? malloc(sizeof(*x)) : NULL;
        if (x == NULL) {
            if (pending(c, rep->id)) {
                proto_reply_destroy(rep); /* a pipelined write's reply is lost */
                return vks_error_set(err, -ENOMEM, "out of memory keeping a reply");
            }
            proto_reply_destroy(rep); /* a reply to no request of ours */
            continue;
        }
        *x = (struct stashed){.next = c->stash, .rep = rep};
        c->stash = x;
    }
}

/* Waits until the reply with `id` has arrived (or was stashed before) or
 * the deadline passes. */
static int read_reply(struct vks_client *c, uint32_t id, int64_t deadline, struct proto_reply **out,
                      struct vks_error *err)
{
    if ((*out = unstash(c, id)) != NULL)
        return 0;
    for (;;) {
        int rc = read_some(c, id, out, err);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return vks_error_set(err, -ETIMEDOUT,
                                 "no reply from vkscand within the timeout: raise "
                                 "io_timeout_ms or check the daemon");
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR)
            return vks_error_set(err, -errno, "poll(): %s", strerror(errno));
    }
}

static int send_frames(struct vks_client *c, const int *fds, size_t n_fds, struct vks_error *err);

/* Sends c->out (with `fds` on its first byte); a send that found the
 * connection closed reports vkscand's reason when it left one. */
static int send_out(struct vks_client *c, const int *fds, size_t n_fds, struct vks_error *err)
{
    int rc = send_frames(c, fds, n_fds, err);
    if (rc == -EPIPE || rc == -ECONNRESET) {
        /* vkscand may have answered with its reason (an id-0 error: a
         * refused connection) and closed before this request went out:
         * the reason is still in the socket */
        struct vks_error why = {0};
        int r2 = read_some(c, 0, NULL, &why);
        if (r2 < 0 && c->fd < 0) {
            if (err != NULL)
                *err = why;
            return r2;
        }
    }
    return rc;
}

/* Sends c->out. With pipelined writes in flight it first takes the
 * replies that arrived, and keeps taking them while the socket is full:
 * the daemon stops reading a client whose replies pile up, and closes one
 * that leaves too many unread. */
static int send_frames(struct vks_client *c, const int *fds, size_t n_fds, struct vks_error *err)
{
    if (c->n_pend == 0)
        return proto_send(c->fd, c->out.data, c->out.len, fds, n_fds, (int)c->opt.io_timeout_ms,
                          err);
    int64_t deadline = now_ms() + c->opt.io_timeout_ms;
    size_t off = 0;
    for (;;) {
        int rc = read_some(c, 0, NULL, err);
        if (rc < 0)
            return rc;
        rc = proto_send_some(c->fd, c->out.data, c->out.len, &off, fds, n_fds, err);
        if (rc != -EAGAIN)
            return rc;
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return vks_error_set(err, -ETIMEDOUT,
                                 "sending a request timed out: vkscand stopped reading");
        struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLOUT};
        if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR)
            return vks_error_set(err, -errno, "poll(): %s", strerror(errno));
    }
}

static uint32_t take_id(struct vks_client *c)
{
    uint32_t id = c->next_id++;
    if (c->next_id == 0)
        c->next_id = 1;
    return id;
}

/* A reply that carries an error becomes the call's error. */
static int reply_error(struct proto_reply **rep, struct vks_error *err)
{
    int rc = (*rep)->error.code;
    if (rc == 0)
        return 0;
    vks_error_set(err, rc, "vkscand: %s", (*rep)->error.msg);
    proto_reply_destroy(*rep);
    *rep = NULL;
    return rc;
}

/* Whether an error means "the connection is gone", which a retry can heal. */
static bool is_lost(int rc)
{
    return rc == -ECONNRESET || rc == -EPIPE || rc == -ENOTCONN || rc == -ECONNREFUSED ||
           rc == -ENOENT || rc == -ECONNABORTED || rc == -VKS_E_SHUTDOWN;
}

/* One attempt: send `req` (with `fds`) and wait for its reply. */
static int exchange(struct vks_client *c, struct proto_request *req, const int *fds, size_t n_fds,
                    uint32_t extra_ms, struct proto_reply **out, struct vks_error *err)
{
    req->id = take_id(c);
    proto_buf_reset(&c->out);
    int rc = proto_request_encode(&c->out, req, err);
    if (rc < 0)
        return rc;
    int64_t deadline = now_ms() + c->opt.io_timeout_ms + extra_ms;
    rc = send_out(c, fds, n_fds, err);
    if (rc < 0)
        return rc;
    rc = read_reply(c, req->id, deadline, out, err);
    return rc == 0 ? reply_error(out, err) : rc;
}

static int do_hello(struct vks_client *c, struct vks_error *err);

static int reconnect(struct vks_client *c, struct vks_error *err)
{
    drop_connection(c);
    int rc = open_socket(c, err);
    return rc < 0 ? rc : do_hello(c, err);
}

/*
 * Runs one request to completion. Idempotent requests survive a lost
 * connection: reconnect, hello, resend, up to opt.retries times.
 */
static int call(struct vks_client *c, struct proto_request *req, const int *fds, size_t n_fds,
                bool idempotent, uint32_t extra_ms, struct proto_reply **out, struct vks_error *err)
{
    uint32_t backoff = c->opt.backoff_ms;
    for (uint32_t attempt = 0;; attempt++) {
        int rc = c->fd >= 0 ? 0 : reconnect(c, err);
        if (rc == 0)
            rc = exchange(c, req, fds, n_fds, extra_ms, out, err);
        if (rc == 0)
            return 0;
        if (!is_lost(rc)) {
            /* After a timeout or a garbled reply the stream position is unknown. */
            if (rc == -ETIMEDOUT || rc == -VKS_E_PROTOCOL)
                drop_connection(c);
            return rc;
        }
        drop_connection(c);
        if (!idempotent || attempt >= c->opt.retries) {
            char why[sizeof(err->msg)]; /* err->msg cannot be both source and target */
            snprintf(why, sizeof(why), "%s",
                     err != NULL && err->msg[0] != '\0' ? err->msg : proto_strerror(rc));
            return vks_error_set(err, idempotent ? -VKS_E_CLOSED : rc,
                                 "connection to vkscand at %s lost%s: %s", c->path,
                                 idempotent ? " and the retries ran out" : "", why);
        }
        sleep_ms(backoff);
        backoff = backoff * 2 > MAX_BACKOFF_MS ? MAX_BACKOFF_MS : backoff * 2;
    }
}

/* ---- hello ----------------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

static void fill_info(struct vks_server_info *info, const struct proto_hello_reply *h)
{
    memset(info, 0, sizeof(*info));
    info->protocol = h->version;
    copy_str(info->server, sizeof(info->server), h->server);
    info->max_frame = h->limits.max_frame;
    info->max_buffers = h->limits.max_buffers;
    info->max_rules = h->limits.max_rules;
    info->max_fds = h->limits.max_fds;
    info->max_hits = h->limits.max_hits;
    info->n_devices = h->n_devices < VKS_MAX_DEVICES ? h->n_devices : VKS_MAX_DEVICES;
    for (uint32_t i = 0; i < info->n_devices; i++) {
        struct vks_device *d = &info->devices[i];
        d->index = h->devices[i].index;
        copy_str(d->name, sizeof(d->name), h->devices[i].name);
        copy_str(d->type, sizeof(d->type), h->devices[i].type);
        d->memory = h->devices[i].memory;
        d->active = h->devices[i].active;
    }
}

/* hello on the current connection, without retries (call() retries around it). */
static int do_hello(struct vks_client *c, struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_HELLO};
    struct proto_reply *rep = NULL;
    req.u.hello.version = PROTO_VERSION;
    req.u.hello.min_version = PROTO_VERSION_MIN;
    req.u.hello.client = c->name;
    req.u.hello.read_ahead = true; /* send_frames: one frame per sendmsg with descriptors */
    int rc = exchange(c, &req, NULL, 0, 0, &rep, err);
    if (rc < 0)
        return rc;
    uint32_t v = rep->u.hello.version;
    if (v < PROTO_VERSION_MIN || v > PROTO_VERSION) {
        proto_reply_destroy(rep);
        return vks_error_set(err, -VKS_E_VERSION,
                             "vkscand chose protocol version %u, this libvkscan speaks %u..%u: "
                             "install matching versions",
                             v, PROTO_VERSION_MIN, PROTO_VERSION);
    }
    fill_info(&c->info, &rep->u.hello);
    proto_reply_destroy(rep);
    return 0;
}

int vks_client_connect(const char *socket_path, const struct vks_client_options *opt,
                       struct vks_client **out, struct vks_error *err)
{
    if (socket_path == NULL || out == NULL)
        return vks_error_set(err, -EINVAL, "vks_client_connect needs a socket path and `out`");
    struct vks_client *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->path = strdup(socket_path)) == NULL) {
        free(c);
        return vks_error_set(err, -ENOMEM, "out of memory for a client");
    }
    vks_client_options_init(&c->opt);
    if (opt != NULL)
        read_options(&c->opt, sizeof(c->opt), opt, CLIENT_OPTIONS_BASE);
    if (c->opt.memfd_threshold == 0)
        c->opt.memfd_threshold = VKS_MEMFD_THRESHOLD_DEFAULT;
    if (c->opt.socket_buffer == 0)
        c->opt.socket_buffer = VKS_SOCKET_BUFFER_DEFAULT;
    copy_str(c->name, sizeof(c->name), c->opt.client_name ? c->opt.client_name : "libvkscan");
    c->opt.client_name = NULL;
    if (c->opt.connect_timeout_ms == 0)
        c->opt.connect_timeout_ms = DEFAULT_CONNECT_MS;
    if (c->opt.io_timeout_ms == 0)
        c->opt.io_timeout_ms = DEFAULT_IO_MS;
    if (c->opt.backoff_ms == 0)
        c->opt.backoff_ms = 1;
    c->fd = -1;
    for (uint32_t i = 0; i < MEMFD_KEEP; i++)
        c->memfd[i] = -1;
    c->next_id = 1;
    proto_buf_init(&c->out);
    c->lim = (struct proto_limits){.max_frame = c->opt.max_frame};
    proto_limits_normalize(&c->lim);
    c->lim.max_array = UINT32_MAX; /* replies are bounded by the frame size */
    c->lim.max_rules = UINT32_MAX;
    c->lim.max_hits = UINT32_MAX;
    c->lim.max_buffers = UINT32_MAX;
    int rc = reconnect(c, err);
    if (rc < 0) {
        vks_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void vks_client_close(struct vks_client *c)
{
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < MEMFD_KEEP; i++)
        memfd_drop(c, i);
    drop_connection(c);
    proto_buf_finish(&c->out);
    free(c->pend);
    free(c->path);
    free(c);
}

int vks_client_hello(struct vks_client *c, struct vks_server_info *info, struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_HELLO};
    struct proto_reply *rep = NULL;
    req.u.hello.version = PROTO_VERSION;
    req.u.hello.min_version = PROTO_VERSION_MIN;
    req.u.hello.client = c->name;
    req.u.hello.read_ahead = true;
    int rc = call(c, &req, NULL, 0, true, 0, &rep, err);
    if (rc < 0)
        return rc;
    fill_info(&c->info, &rep->u.hello);
    proto_reply_destroy(rep);
    if (info != NULL)
        *info = c->info;
    return 0;
}

int vks_client_info(const struct vks_client *c, struct vks_server_info *info)
{
    if (c == NULL || info == NULL)
        return -EINVAL;
    *info = c->info;
    return 0;
}

int vks_client_ping(struct vks_client *c, struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_PING};
    struct proto_reply *rep = NULL;
    int rc = call(c, &req, NULL, 0, true, 0, &rep, err);
    proto_reply_destroy(rep);
    return rc;
}

/* ---- catalogs -------------------------------------------------------------------- */

static void hash_sink(void *ctx, const void *data, size_t len)
{
    crypto_generichash_update(ctx, data, len);
}

static int source_fp(const struct proto_catalog_load *load, uint8_t out[VKS_FP_LEN],
                     struct vks_error *err)
{
    crypto_generichash_state st;
    if (sodium_init() < 0)
        return vks_error_set(err, -ENOSYS, "libsodium failed to initialise");
    crypto_generichash_init(&st, NULL, 0, VKS_FP_LEN);
    proto_source_canon(load, hash_sink, &st);
    crypto_generichash_final(&st, out, VKS_FP_LEN);
    return 0;
}

/* Builds the wire form of a rules array; `rules` points into `out`'s array. */
static int make_load(const struct vks_rule *in, size_t n, const struct vks_load_options *opt,
                     struct proto_catalog_load *load, struct vks_error *err)
{
    memset(load, 0, sizeof(*load));
    load->max_states = opt != NULL ? opt->max_states : 0;
    load->ids_only = opt != NULL && opt->ids_only;
    if (n > UINT32_MAX)
        return vks_error_set(err, -EINVAL, "%zu rules do not fit one catalog", n);
    load->rules = calloc(n ? n : 1, sizeof(*load->rules));
    if (load->rules == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory for %zu rules", n);
    load->n_rules = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        struct proto_rule *r = &load->rules[i];
        size_t len = in[i].pattern_len;
        if (in[i].id == NULL || in[i].pattern == NULL || (unsigned)in[i].kind > 2) {
            free(load->rules);
            return vks_error_set(err, -EINVAL,
                                 "rule %zu needs an id, a pattern and a kind (literal, hex or "
                                 "regex)",
                                 i);
        }
        if (len == 0)
            len = strlen(in[i].pattern);
        r->id = in[i].id;
        r->kind = (enum proto_rule_kind)in[i].kind;
        r->pattern = in[i].pattern;
        r->pattern_len = (uint32_t)len;
        r->flags = in[i].flags != NULL ? in[i].flags : "";
    }
    return 0;
}

/* The caller's load options in this library's layout (NULL: defaults). */
static const struct vks_load_options *load_options(const struct vks_load_options *in,
                                                   struct vks_load_options *buf)
{
    vks_load_options_init(buf);
    if (in != NULL)
        read_options(buf, sizeof(*buf), in, LOAD_OPTIONS_BASE);
    return buf;
}

int vks_source_fingerprint(const struct vks_rule *rules, size_t n,
                           const struct vks_load_options *opt, uint8_t out[VKS_FP_LEN],
                           struct vks_error *err)
{
    struct proto_catalog_load load;
    struct vks_load_options lo;
    opt = load_options(opt, &lo);
    int rc = make_load(rules, n, opt, &load, err);
    if (rc < 0)
        return rc;
    rc = source_fp(&load, out, err);
    free(load.rules);
    return rc;
}

static int make_text_load(const char *text, size_t len, const struct vks_load_options *opt,
                          struct proto_catalog_load *load, struct vks_error *err)
{
    memset(load, 0, sizeof(*load));
    if (text == NULL || len > UINT32_MAX)
        return vks_error_set(err, -EINVAL, "pattern text is NULL or over 4 GiB");
    load->has_text = true;
    load->text = text;
    load->text_len = (uint32_t)len;
    load->max_states = opt != NULL ? opt->max_states : 0;
    load->ids_only = opt != NULL && opt->ids_only;
    return 0;
}

int vks_source_fingerprint_text(const char *text, size_t len, const struct vks_load_options *opt,
                                uint8_t out[VKS_FP_LEN], struct vks_error *err)
{
    struct proto_catalog_load load;
    struct vks_load_options lo;
    opt = load_options(opt, &lo);
    int rc = make_text_load(text, len, opt, &load, err);
    return rc < 0 ? rc : source_fp(&load, out, err);
}

static int new_catalog(struct proto_reply *rep, bool sent, struct vks_catalog **out,
                       struct vks_error *err)
{
    struct vks_catalog *cat = calloc(1, sizeof(*cat));
    if (cat == NULL) {
        proto_reply_destroy(rep);
        return vks_error_set(err, -ENOMEM, "out of memory for a catalog");
    }
    cat->rep = rep;
    cat->sent = sent;
    *out = cat;
    return 0;
}

/* catalog.has by source fingerprint, then catalog.load when unknown. */
static int load_catalog(struct vks_client *c, struct proto_catalog_load *load, bool always_send,
                        struct vks_catalog **out, struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_CATALOG_HAS};
    struct proto_reply *rep = NULL;
    req.u.ref.by_source = true;
    req.u.ref.ids_only = load->ids_only;
    int rc = source_fp(load, req.u.ref.fp, err);
    if (rc == 0 && !always_send) {
        rc = call(c, &req, NULL, 0, true, 0, &rep, err);
        if (rc == 0 && rep->u.catalog.known)
            return new_catalog(rep, false, out, err);
        proto_reply_destroy(rep);
        rep = NULL;
    }
    if (rc < 0)
        return rc;
    req = (struct proto_request){.op = PROTO_OP_CATALOG_LOAD};
    req.u.load = *load;
    rc = call(c, &req, NULL, 0, true, 0, &rep, err);
    return rc < 0 ? rc : new_catalog(rep, true, out, err);
}

int vks_client_catalog_load(struct vks_client *c, const struct vks_rule *rules, size_t n,
                            const struct vks_load_options *opt, struct vks_catalog **out,
                            struct vks_error *err)
{
    struct proto_catalog_load load;
    struct vks_load_options lo;
    opt = load_options(opt, &lo);
    int rc = make_load(rules, n, opt, &load, err);
    if (rc < 0)
        return rc;
    rc = load_catalog(c, &load, opt != NULL && opt->always_send, out, err);
    free(load.rules);
    return rc;
}

int vks_client_catalog_load_text(struct vks_client *c, const char *text, size_t len,
                                 const struct vks_load_options *opt, struct vks_catalog **out,
                                 struct vks_error *err)
{
    struct proto_catalog_load load;
    struct vks_load_options lo;
    opt = load_options(opt, &lo);
    int rc = make_text_load(text, len, opt, &load, err);
    return rc < 0 ? rc : load_catalog(c, &load, opt != NULL && opt->always_send, out, err);
}

int vks_client_catalog_has(struct vks_client *c, const uint8_t fp[VKS_FP_LEN], bool *known,
                           struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_CATALOG_HAS};
    struct proto_reply *rep = NULL;
    memcpy(req.u.ref.fp, fp, VKS_FP_LEN);
    int rc = call(c, &req, NULL, 0, true, 0, &rep, err);
    if (rc == 0)
        *known = rep->u.catalog.known;
    proto_reply_destroy(rep);
    return rc;
}

int vks_client_catalog_drop(struct vks_client *c, const uint8_t fp[VKS_FP_LEN], bool *dropped,
                            struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_CATALOG_DROP};
    struct proto_reply *rep = NULL;
    memcpy(req.u.ref.fp, fp, VKS_FP_LEN);
    int rc = call(c, &req, NULL, 0, false, 0, &rep, err);
    if (rc == 0 && dropped != NULL)
        *dropped = rep->u.dropped;
    proto_reply_destroy(rep);
    return rc;
}

void vks_catalog_destroy(struct vks_catalog *cat)
{
    if (cat == NULL)
        return;
    proto_reply_destroy(cat->rep);
    free(cat);
}

const uint8_t *vks_catalog_fingerprint(const struct vks_catalog *cat)
{
    return cat->rep->u.catalog.fingerprint;
}

const uint8_t *vks_catalog_source(const struct vks_catalog *cat)
{
    return cat->rep->u.catalog.source;
}

bool vks_catalog_rules_sent(const struct vks_catalog *cat)
{
    return cat->sent;
}

bool vks_catalog_cached(const struct vks_catalog *cat)
{
    return cat->rep->u.catalog.cached;
}

size_t vks_catalog_rule_count(const struct vks_catalog *cat)
{
    return cat->rep->u.catalog.n_rules;
}

const char *vks_catalog_rule_id(const struct vks_catalog *cat, size_t i)
{
    return i < cat->rep->u.catalog.n_rules ? cat->rep->u.catalog.rules[i].id : NULL;
}

const uint8_t *vks_catalog_rule_fingerprint(const struct vks_catalog *cat, size_t i)
{
    const struct proto_catalog_result *c = &cat->rep->u.catalog;
    return i < c->n_rules && !c->ids_only ? c->rules[i].fp : NULL;
}

size_t vks_catalog_reject_count(const struct vks_catalog *cat)
{
    return cat->rep->u.catalog.n_rejects;
}

int vks_catalog_reject(const struct vks_catalog *cat, size_t i, struct vks_reject *out)
{
    if (i >= cat->rep->u.catalog.n_rejects)
        return -EINVAL;
    const struct proto_reject *r = &cat->rep->u.catalog.rejects[i];
    *out = (struct vks_reject){
        .index = r->index, .line = r->line, .pos = r->pos, .id = r->id, .message = r->message};
    return 0;
}

/* ---- scans ------------------------------------------------------------------------ */

/*
 * A sealed memfd holding `len` bytes of `data`: the daemon maps it instead
 * of reading the bytes through the socket. Returns the descriptor, or -1
 * (the buffer then stays inline).
 */
static int make_memfd(const void *data, size_t len)
{
    int fd = memfd_create("vkscan-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    const char *p = data;
    size_t off = 0;
    while (off < len) {
        ssize_t k = write(fd, p + off, len - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)k;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * The client's kept memfd `slot` holding `len` bytes of `data` at offset 0,
 * or -1 when none can be kept for it (the caller makes a fresh one). Kept
 * memfds are written again by the next scan, so they are sealed against
 * shrinking only (F_SEAL_SHRINK: a daemon that maps one cannot be cut short
 * under it), and stay mapped here: the next scan's bytes are one memcpy
 * into pages that exist and are mapped, where a fresh memfd also allocates,
 * zeroes and maps its pages and frees them after the reply. Safe because a
 * client has one request in flight: the daemon is done with the previous
 * contents when the next scan writes.
 */
/* Kept memfd `slot` with room for `len` bytes, mapped at c->memfd_map[slot];
 * its descriptor or -1. */
static int memfd_slot(struct vks_client *c, uint32_t slot, size_t len)
{
    uint64_t held = 0;
    for (uint32_t i = 0; i < MEMFD_KEEP; i++)
        held += i != slot ? c->memfd_size[i] : 0;
    if (slot >= MEMFD_KEEP || held + len > MEMFD_KEEP_BYTES)
        return -1;
    if (c->memfd[slot] < 0) {
        int fd = memfd_create("vkscan-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
            return -1;
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
            close(fd);
            return -1;
        }
        c->memfd[slot] = fd;
    }
    if (len > c->memfd_size[slot]) { /* grow: never shrinks (sealed) */
        if (c->memfd_map[slot] != NULL)
            munmap(c->memfd_map[slot], (size_t)c->memfd_size[slot]);
        c->memfd_map[slot] = NULL;
        void *m = MAP_FAILED;
        if (ftruncate(c->memfd[slot], (off_t)len) == 0)
            m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd[slot], 0);
        if (m == MAP_FAILED) {
            memfd_drop(c, slot);
            return -1;
        }
        c->memfd_map[slot] = m;
        c->memfd_size[slot] = len;
    }
    return c->memfd[slot];
}

static int memfd_take(struct vks_client *c, uint32_t slot, const void *data, size_t len)
{
    int fd = memfd_slot(c, slot, len);
    if (fd >= 0)
        memcpy(c->memfd_map[slot], data, len);
    return fd;
}

/* Translates the caller's buffers; fd buffers get consecutive descriptor
 * indexes in `fds`. Inline buffers of c->opt.memfd_threshold bytes or more
 * become memfds while descriptors are left (the daemon's max_fds): the
 * client's kept ones (memfd_take), else fresh sealed ones, whose
 * descriptors are also listed in `own` (*n_own), for the caller to close. */
static int make_scan(struct vks_client *c, const struct vks_buffer *in, size_t n,
                     struct proto_scan *s, int *fds, size_t *n_fds, int *own, size_t *n_own,
                     struct vks_error *err)
{
    size_t kept = 0; /* kept memfds this scan uses (memfd_take's slots) */
    size_t max_fds = c->info.max_fds != 0 && c->info.max_fds < PROTO_MAX_FDS_CEILING
                         ? c->info.max_fds
                         : PROTO_MAX_FDS_CEILING;
    size_t explicit_fds = 0, n_small = 0;
    uint64_t small = 0; /* inline bytes of the buffers under the threshold */
    for (size_t i = 0; i < n; i++) {
        explicit_fds += in[i].kind == VKS_BUFFER_FD;
        if (in[i].kind == VKS_BUFFER_INLINE && in[i].len > 0 &&
            (uint64_t)in[i].len < c->opt.memfd_threshold) {
            small += in[i].len;
            n_small++;
        }
    }
    /* Small inline buffers that add up to the threshold travel packed in
     * one kept memfd, as ranges of it (many writes of a flow reassembler,
     * many small files): one copy here instead of the socket's two. */
    int pack_fd = -1;
    uint32_t pack_index = 0;
    uint64_t pack_at = 0;
    if (n_small > 1 && small >= c->opt.memfd_threshold && small <= SIZE_MAX &&
        explicit_fds + *n_fds < max_fds && (pack_fd = memfd_slot(c, 0, (size_t)small)) >= 0) {
        kept = 1;
        pack_index = (uint32_t)*n_fds;
        fds[(*n_fds)++] = pack_fd;
    }
    for (size_t i = 0; i < n; i++) {
        struct proto_buffer *b = &s->buffers[i];
        if (in[i].kind == VKS_BUFFER_INLINE) {
            if (in[i].data == NULL && in[i].len > 0)
                return vks_error_set(err, -EINVAL, "buffer %zu has no data", i);
            if (pack_fd >= 0 && in[i].len > 0 && (uint64_t)in[i].len < c->opt.memfd_threshold) {
                memcpy(c->memfd_map[0] + pack_at, in[i].data, in[i].len);
                *b = (struct proto_buffer){.is_fd = true,
                                           .fd_index = pack_index,
                                           .offset = pack_at,
                                           .length = in[i].len,
                                           .has_length = true};
                pack_at += in[i].len;
                continue;
            }
            if (in[i].len > 0 && (uint64_t)in[i].len >= c->opt.memfd_threshold &&
                explicit_fds + kept + *n_own < max_fds) {
                int fd = memfd_take(c, (uint32_t)kept, in[i].data, in[i].len);
                if (fd >= 0)
                    kept++;
                else if ((fd = make_memfd(in[i].data, in[i].len)) >= 0)
                    own[(*n_own)++] = fd;
                if (fd >= 0) {
                    b->is_fd = true;
                    b->fd_index = (uint32_t)*n_fds;
                    b->has_length = true;
                    b->length = in[i].len;
                    fds[(*n_fds)++] = fd;
                    continue;
                }
            }
            b->data = in[i].data;
            b->len = in[i].len;
            continue;
        }
        if (in[i].kind != VKS_BUFFER_FD || in[i].fd < 0)
            return vks_error_set(err, -EINVAL, "buffer %zu: kind or descriptor is invalid", i);
        /* ranges of one descriptor share its entry: a frame carries each
         * descriptor once */
        size_t at = 0;
        while (at < *n_fds && fds[at] != in[i].fd)
            at++;
        if (at == *n_fds && *n_fds >= PROTO_MAX_FDS_CEILING)
            return vks_error_set(err, -VKS_E_TOO_MANY_FDS,
                                 "more than %u descriptors in one request: split it",
                                 PROTO_MAX_FDS_CEILING);
        b->is_fd = true;
        b->fd_index = (uint32_t)at;
        b->offset = in[i].offset;
        b->has_length = in[i].length != 0;
        b->length = in[i].length;
        if (at == *n_fds)
            fds[(*n_fds)++] = in[i].fd;
    }
    return 0;
}

static int fill_scan_result(struct proto_reply *rep, struct vks_scan_result *res,
                            struct vks_error *err)
{
    const struct proto_scan_reply *s = &rep->u.scan;
    memset(res, 0, sizeof(*res));
    res->hits = calloc(s->n_hits ? s->n_hits : 1, sizeof(*res->hits));
    res->buffers = calloc(s->n_buffers ? s->n_buffers : 1, sizeof(*res->buffers));
    res->telemetry = calloc(s->n_telemetry ? s->n_telemetry : 1, sizeof(*res->telemetry));
    res->priv = rep;
    if (res->hits == NULL || res->buffers == NULL || res->telemetry == NULL) {
        uint32_t n_hits = s->n_hits; /* `s` lives in `rep`, which finish frees */
        vks_scan_result_finish(res);
        return vks_error_set(err, -ENOMEM, "out of memory for %u hits", n_hits);
    }
    for (uint32_t i = 0; i < s->n_hits; i++) {
        const struct proto_hit *h = &s->hits[i];
        res->hits[i] = (struct vks_hit){.buffer = h->buffer,
                                        .rule = h->rule,
                                        .end = h->end,
                                        .count = h->count,
                                        .rule_id = h->rule_id,
                                        .start = h->has_start ? h->start : VKS_NO_START};
    }
    for (uint32_t i = 0; i < s->n_buffers; i++) {
        const struct proto_buffer_status *b = &s->buffers[i];
        res->buffers[i] = (struct vks_buffer_result){.code = b->code,
                                                     .message = b->message,
                                                     .bytes = b->bytes,
                                                     .hits = b->hits,
                                                     .truncated = b->truncated,
                                                     .cached = b->cached};
    }
    for (uint32_t i = 0; i < s->n_telemetry; i++) {
        const struct proto_stat *t = &s->telemetry[i];
        res->telemetry[i] =
            (struct vks_stat){.key = t->key, .is_float = t->is_float, .u = t->u, .f = t->f};
    }
    res->n_hits = s->n_hits;
    res->n_buffers = s->n_buffers;
    res->n_telemetry = s->n_telemetry;
    return 0;
}

int vks_client_scan(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN],
                    const struct vks_buffer *buffers, size_t n, const struct vks_scan_options *opt,
                    struct vks_scan_result *res, struct vks_error *err)
{
    int fds[PROTO_MAX_FDS_CEILING];
    int own[PROTO_MAX_FDS_CEILING];
    size_t n_fds = 0, n_own = 0;
    struct proto_request req = {.op = PROTO_OP_SCAN};
    struct proto_reply *rep = NULL;
    struct proto_scan *s = &req.u.scan;
    struct vks_scan_options so;
    memset(res, 0, sizeof(*res));
    if (n > UINT32_MAX || (n > 0 && buffers == NULL))
        return vks_error_set(err, -EINVAL, "scan needs 0..2^32-1 buffers, got %zu", n);
    memcpy(s->catalog, catalog, VKS_FP_LEN);
    if (opt != NULL) {
        vks_scan_options_init(&so);
        read_options(&so, sizeof(so), opt, SCAN_OPTIONS_BASE);
        opt = &so;
        s->mode = (enum proto_report)opt->mode;
        s->max_hits = opt->max_hits;
        s->timeout_ms = opt->timeout_ms;
        s->rule_ids = opt->rule_ids;
        s->no_cache = opt->no_cache;
        s->starts = opt->starts;
    }
    s->buffers = calloc(n ? n : 1, sizeof(*s->buffers));
    if (s->buffers == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory for %zu buffers", n);
    s->n_buffers = (uint32_t)n;
    int rc = make_scan(c, buffers, n, s, fds, &n_fds, own, &n_own, err);
    if (rc == 0)
        rc = call(c, &req, fds, n_fds, true, s->timeout_ms, &rep, err);
    for (size_t i = 0; i < n_own; i++)
        close(own[i]);
    free(s->buffers);
    return rc < 0 ? rc : fill_scan_result(rep, res, err);
}

void vks_scan_result_finish(struct vks_scan_result *res)
{
    if (res == NULL)
        return;
    free(res->hits);
    free(res->buffers);
    free(res->telemetry);
    proto_reply_destroy(res->priv);
    memset(res, 0, sizeof(*res));
}

/* ---- stats ------------------------------------------------------------------------ */

int vks_client_stats(struct vks_client *c, struct vks_stats *out, struct vks_error *err)
{
    struct proto_request req = {.op = PROTO_OP_STATS};
    struct proto_reply *rep = NULL;
    memset(out, 0, sizeof(*out));
    int rc = call(c, &req, NULL, 0, true, 0, &rep, err);
    if (rc < 0)
        return rc;
    const struct proto_stats_reply *s = &rep->u.stats;
    out->stats = calloc(s->n_stats ? s->n_stats : 1, sizeof(*out->stats));
    out->priv = rep;
    if (out->stats == NULL) {
        uint32_t n_stats = s->n_stats; /* `s` lives in `rep`, which finish frees */
        vks_stats_finish(out);
        return vks_error_set(err, -ENOMEM, "out of memory for %u counters", n_stats);
    }
    for (uint32_t i = 0; i < s->n_stats; i++)
        out->stats[i] = (struct vks_stat){.key = s->stats[i].key,
                                          .is_float = s->stats[i].is_float,
                                          .u = s->stats[i].u,
                                          .f = s->stats[i].f};
    out->n_stats = s->n_stats;
    return 0;
}

void vks_stats_finish(struct vks_stats *s)
{
    if (s == NULL)
        return;
    free(s->stats);
    proto_reply_destroy(s->priv);
    memset(s, 0, sizeof(*s));
}

const struct vks_stat *vks_stat_find(const struct vks_stat *stats, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(stats[i].key, key) == 0)
            return &stats[i];
    }
    return NULL;
}

/* ---- streams ---------------------------------------------------------------------- */

struct vks_stream {
    struct vks_client *c;
    uint32_t id;
    uint32_t drops; /* c->drops when opened: another value, the stream is gone */
    uint64_t state_bytes;
    uint64_t offset;
    /* Why the stream is unusable, or "": a write whose reply was lost may
     * have been applied, so its matches and the offset are unknown. */
    char broken[160];
    /* pipelined writes in flight, oldest first: a ring of request ids, in
     * q_inline until more are in flight (a stream that is only written
     * synchronously never allocates) */
    uint32_t *q;
    uint32_t q_head, q_n, q_cap;
    uint32_t q_inline[4];
};

/* A stream handle, not open yet. */
static struct vks_stream *stream_new(void)
{
    struct vks_stream *s = calloc(1, sizeof(*s));
    if (s != NULL) {
        s->q = s->q_inline;
        s->q_cap = 4;
    }
    return s;
}

static void stream_free(struct vks_stream *s)
{
    if (s->q != s->q_inline)
        free(s->q);
    free(s);
}

void vks_stream_options_init(struct vks_stream_options *opt)
{
    memset(opt, 0, sizeof(*opt));
    opt->struct_size = sizeof(*opt);
}

int vks_stream_open(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN],
                    const struct vks_stream_options *opt, struct vks_stream **out,
                    struct vks_error *err)
{
    struct vks_stream_options so;
    vks_stream_options_init(&so);
    if (opt != NULL)
        read_options(&so, sizeof(so), opt, sizeof(size_t));
    *out = NULL;
    struct vks_stream *s = stream_new();
    if (s == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory for a stream");
    struct proto_request req = {.op = PROTO_OP_STREAM_OPEN};
    struct proto_reply *rep = NULL;
    memcpy(req.u.stream.catalog, catalog, VKS_FP_LEN);
    req.u.stream.mode = (enum proto_report)so.mode;
    /* not retried: a stream opened on a connection that then broke is gone */
    int rc = call(c, &req, NULL, 0, false, 0, &rep, err);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->c = c;
    s->drops = c->drops;
    s->id = rep->u.stream.stream;
    s->state_bytes = rep->u.stream.state_bytes;
    proto_reply_destroy(rep);
    *out = s;
    return 0;
}

int vks_stream_open_many(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN], size_t n,
                         struct vks_stream **out, struct vks_error *err)
{
    if (n == 0 || n > UINT32_MAX || out == NULL)
        return vks_error_set(err, -EINVAL, "stream.open of %zu streams: open 1 or more", n);
    memset(out, 0, n * sizeof(*out));
    for (size_t i = 0; i < n; i++)
        if ((out[i] = stream_new()) == NULL) {
            for (size_t j = 0; j < i; j++)
                free(out[j]);
            memset(out, 0, n * sizeof(*out));
            return vks_error_set(err, -ENOMEM, "out of memory for %zu streams", n);
        }
    struct proto_request req = {.op = PROTO_OP_STREAM_OPEN};
    struct proto_reply *rep = NULL;
    memcpy(req.u.stream.catalog, catalog, VKS_FP_LEN);
    req.u.stream.count = (uint32_t)n;
    int rc = call(c, &req, NULL, 0, false, 0, &rep, err);
    if (rc == 0 && rep->u.stream.n_streams != n) {
        uint32_t got = rep->u.stream.n_streams;
        proto_reply_destroy(rep);
        rc = vks_error_set(err, -VKS_E_PROTOCOL,
                           "vkscand answered a stream.open of %zu streams with %u ids (a daemon "
                           "before stream.open `count`?)",
                           n, got);
    }
    if (rc < 0) {
        for (size_t i = 0; i < n; i++) {
            free(out[i]);
            out[i] = NULL;
        }
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        out[i]->c = c;
        out[i]->drops = c->drops;
        out[i]->id = rep->u.stream.streams[i];
        out[i]->state_bytes = rep->u.stream.state_bytes;
    }
    proto_reply_destroy(rep);
    return 0;
}

uint64_t vks_stream_state_bytes(const struct vks_stream *s)
{
    return s->state_bytes;
}

uint64_t vks_stream_offset(const struct vks_stream *s)
{
    return s->offset;
}

/* Whether `rc` came from the daemon's own error reply: the request was
 * refused, so nothing of it was applied. */
static bool daemon_refused(int rc)
{
    return -rc >= VKS_E_BASE && rc != -VKS_E_PROTOCOL && rc != -VKS_E_CLOSED;
}

/* 0 when the stream can take a request, else its error. */
static int stream_usable(struct vks_stream *s, struct vks_error *err)
{
    if (s->broken[0] == '\0' && (s->c->drops != s->drops || s->c->fd < 0))
        snprintf(s->broken, sizeof(s->broken), "its connection to vkscand was lost");
    if (s->broken[0] == '\0')
        return 0;
    s->q_n = 0; /* the replies of its writes in flight are gone with it */
    return vks_error_set(err, -VKS_E_CLOSED,
                         "stream %u is unusable: %s, so its matches and offset since "
                         "then are unknown: open a new stream and write from a known "
                         "offset",
                         s->id, s->broken);
}

/* A write whose reply is lost (timeout, garbled or undecodable reply,
 * memory, lost connection) may have been applied by the daemon: the stream
 * is then unusable, and says so, rather than lose matches and offsets
 * silently. After a timeout or a garbled reply the connection is out of
 * step and is dropped; so is one that broke. */
static int stream_lost(struct vks_stream *s, bool write, int rc, struct vks_error *err)
{
    if (daemon_refused(rc))
        return rc;
    if (write)
        snprintf(s->broken, sizeof(s->broken),
                 "the reply of the write at offset %llu was lost (%.80s)",
                 (unsigned long long)s->offset, err != NULL ? err->msg : proto_strerror(rc));
    if (rc == -ETIMEDOUT || rc == -VKS_E_PROTOCOL || is_lost(rc))
        drop_connection(s->c);
    if (!is_lost(rc))
        return rc;
    char why[sizeof(err->msg)]; /* err->msg cannot be both source and target */
    snprintf(why, sizeof(why), "%s",
             err != NULL && err->msg[0] != '\0' ? err->msg : proto_strerror(rc));
    return vks_error_set(err, rc, "connection to vkscand at %s lost: %s", s->c->path, why);
}

/* Sends a stream.write or stream.close without waiting for its reply; the
 * id joins the stream's queue and the client's pending set. */
static int stream_send(struct vks_stream *s, struct proto_request *req, const int *fds,
                       size_t n_fds, struct vks_error *err)
{
    struct vks_client *c = s->c;
    int rc = stream_usable(s, err);
    if (rc < 0)
        return rc;
    if (s->q_n == s->q_cap || c->n_pend == c->cap_pend) {
        uint32_t qc = s->q_n == s->q_cap ? 2 * s->q_cap : s->q_cap;
        uint32_t *q = qc != s->q_cap ? malloc(qc * sizeof(*q)) : s->q;
        size_t pc = c->n_pend == c->cap_pend ? (c->cap_pend ? 2 * c->cap_pend : 16) : c->cap_pend;
        uint32_t *pend = pc != c->cap_pend ? realloc(c->pend, pc * sizeof(*pend)) : c->pend;
        if (pend != NULL) {
            c->pend = pend;
            c->cap_pend = pc;
        }
        if (q == NULL || pend == NULL) {
            if (q != s->q)
                free(q);
            return vks_error_set(err, -ENOMEM, "out of memory queueing a stream request");
        }
        if (q != s->q) { /* unroll the ring */
            for (uint32_t i = 0; i < s->q_n; i++)
                q[i] = s->q[(s->q_head + i) % s->q_cap];
            if (s->q != s->q_inline)
                free(s->q);
            s->q = q;
            s->q_head = 0;
            s->q_cap = qc;
        }
    }
    req->id = take_id(c);
    req->u.stream.stream = s->id;
    proto_buf_reset(&c->out);
    rc = proto_request_encode(&c->out, req, err);
    if (rc < 0)
        return rc; /* nothing was sent */
    rc = send_out(c, fds, n_fds, err);
    if (rc < 0) { /* part of the frame may have gone: the connection is out of step */
        stream_lost(s, req->op == PROTO_OP_STREAM_WRITE, rc, err);
        drop_connection(c);
        return rc;
    }
    s->q[(s->q_head + s->q_n++) % s->q_cap] = req->id;
    c->pend[c->n_pend++] = req->id;
    return 0;
}

/* Waits for the reply of the stream's oldest request in flight and fills
 * `res` (NULL: discarded) from it. */
static int stream_recv(struct vks_stream *s, bool write, struct vks_scan_result *res,
                       struct vks_error *err)
{
    struct vks_client *c = s->c;
    int rc = stream_usable(s, err);
    if (rc < 0)
        return rc;
    uint32_t id = s->q[s->q_head];
    struct proto_reply *rep = NULL;
    rc = read_reply(c, id, now_ms() + c->opt.io_timeout_ms, &rep, err);
    s->q_head = (s->q_head + 1) % s->q_cap;
    s->q_n--;
    pend_remove(c, id);
    if (rc == 0)
        rc = reply_error(&rep, err);
    if (rc < 0)
        return stream_lost(s, write, rc, err);
    if (rep->u.scan.n_buffers > 0)
        s->offset += rep->u.scan.buffers[0].bytes;
    if (res == NULL) {
        proto_reply_destroy(rep);
        return 0;
    }
    return fill_scan_result(rep, res, err);
}

/* A stream.write or stream.close, to its reply. */
static int stream_call(struct vks_stream *s, struct proto_request *req, const int *fds,
                       size_t n_fds, struct vks_scan_result *res, struct vks_error *err)
{
    if (s->q_n > 0 && stream_usable(s, err) == 0)
        return vks_error_set(err, -EBUSY,
                             "stream %u has %u pipelined writes in flight: take their replies "
                             "with vks_stream_write_recv first",
                             s->id, s->q_n);
    int rc = stream_send(s, req, fds, n_fds, err);
    return rc < 0 ? rc : stream_recv(s, req->op == PROTO_OP_STREAM_WRITE, res, err);
}

/* The request of a write of `len` bytes at `data`, or of a descriptor
 * range when *fd >= 0 on return (a large inline write moves into a sealed
 * memfd, which the caller closes). */
static int write_request(struct vks_stream *s, const void *data, size_t len,
                         struct proto_request *req, int *fd, struct vks_error *err)
{
    *fd = -1;
    *req = (struct proto_request){.op = PROTO_OP_STREAM_WRITE};
    if (data == NULL && len > 0)
        return vks_error_set(err, -EINVAL, "stream write of %zu bytes has no data", len);
    if (len > 0 && (uint64_t)len >= s->c->opt.memfd_threshold &&
        (*fd = make_memfd(data, len)) >= 0) { /* large writes travel as a sealed memfd */
        req->u.stream.buffer =
            (struct proto_buffer){.is_fd = true, .offset = 0, .length = len, .has_length = true};
        return 0;
    }
    req->u.stream.buffer = (struct proto_buffer){.data = data, .len = len};
    return 0;
}

static int fd_request(int fd, uint64_t offset, uint64_t length, struct proto_request *req,
                      struct vks_error *err)
{
    *req = (struct proto_request){.op = PROTO_OP_STREAM_WRITE};
    if (fd < 0)
        return vks_error_set(err, -EINVAL, "stream write: descriptor %d is invalid", fd);
    req->u.stream.buffer = (struct proto_buffer){
        .is_fd = true, .offset = offset, .length = length, .has_length = length != 0};
    return 0;
}

int vks_stream_write(struct vks_stream *s, const void *data, size_t len,
                     struct vks_scan_result *res, struct vks_error *err)
{
    memset(res, 0, sizeof(*res));
    struct proto_request req;
    int fd;
    int rc = write_request(s, data, len, &req, &fd, err);
    if (rc == 0)
        rc = stream_call(s, &req, fd >= 0 ? &fd : NULL, fd >= 0, res, err);
    if (fd >= 0)
        close(fd);
    return rc;
}

int vks_stream_write_fd(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                        struct vks_scan_result *res, struct vks_error *err)
{
    memset(res, 0, sizeof(*res));
    struct proto_request req;
    int rc = fd_request(fd, offset, length, &req, err);
    return rc < 0 ? rc : stream_call(s, &req, &fd, 1, res, err);
}

int vks_stream_write_many(struct vks_stream *const *streams, const struct vks_buffer *buffers,
                          size_t n, struct vks_scan_result *res, struct vks_error *err)
{
    memset(res, 0, sizeof(*res));
    if (n == 0)
        return 0;
    if (streams == NULL || buffers == NULL || n > UINT32_MAX)
        return vks_error_set(err, -EINVAL, "stream.writes needs 1..2^32-1 streams and buffers");
    struct vks_client *c = streams[0]->c;
    for (size_t i = 0; i < n; i++) {
        struct vks_stream *s = streams[i];
        if (s->c != c)
            return vks_error_set(err, -EINVAL,
                                 "write %zu: stream %u belongs to another client: one "
                                 "vks_stream_write_many goes over one connection",
                                 i, s->id);
        int rc = stream_usable(s, err);
        if (rc < 0)
            return rc;
        if (s->q_n > 0)
            return vks_error_set(err, -EBUSY,
                                 "stream %u has %u pipelined writes in flight: take their "
                                 "replies with vks_stream_write_recv first",
                                 s->id, s->q_n);
    }
    int fds[PROTO_MAX_FDS_CEILING];
    int own[PROTO_MAX_FDS_CEILING];
    size_t n_fds = 0, n_own = 0;
    struct proto_scan tmp = {.n_buffers = (uint32_t)n};
    struct proto_request req = {.op = PROTO_OP_STREAM_WRITES};
    struct proto_reply *rep = NULL;
    uint32_t *ids = malloc(n * sizeof(*ids));
    tmp.buffers = calloc(n, sizeof(*tmp.buffers));
    int rc = ids == NULL || tmp.buffers == NULL
                 ? vks_error_set(err, -ENOMEM, "out of memory for %zu writes", n)
                 : make_scan(c, buffers, n, &tmp, fds, &n_fds, own, &n_own, err);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            ids[i] = streams[i]->id;
        req.u.writes = (struct proto_stream_writes){.streams = ids,
                                                    .n_streams = (uint32_t)n,
                                                    .buffers = tmp.buffers,
                                                    .n_buffers = (uint32_t)n};
        rc = exchange(c, &req, fds, n_fds, 0, &rep, err);
        if (rc < 0 && !daemon_refused(rc)) {
            for (size_t i = 1; i < n; i++) /* the first says why, below */
                snprintf(streams[i]->broken, sizeof(streams[i]->broken),
                         "the reply of a stream.writes was lost");
            stream_lost(streams[0], true, rc, err);
        }
    }
    for (size_t i = 0; i < n_own; i++)
        close(own[i]);
    free(ids);
    free(tmp.buffers);
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < rep->u.scan.n_buffers && i < n; i++) {
        const struct proto_buffer_status *b = &rep->u.scan.buffers[i];
        streams[i]->offset += b->bytes;
        if (b->code != 0 && b->bytes > 0) /* applied in part: the daemon closed the stream */
            snprintf(streams[i]->broken, sizeof(streams[i]->broken),
                     "a write failed after %llu of its bytes", (unsigned long long)b->bytes);
    }
    return fill_scan_result(rep, res, err);
}

int vks_stream_write_send(struct vks_stream *s, const void *data, size_t len, struct vks_error *err)
{
    struct proto_request req;
    int fd;
    int rc = write_request(s, data, len, &req, &fd, err);
    if (rc == 0)
        rc = stream_send(s, &req, fd >= 0 ? &fd : NULL, fd >= 0, err);
    if (fd >= 0)
        close(fd); /* the message in the socket holds its own reference */
    return rc;
}

int vks_stream_write_fd_send(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                             struct vks_error *err)
{
    struct proto_request req;
    int rc = fd_request(fd, offset, length, &req, err);
    return rc < 0 ? rc : stream_send(s, &req, &fd, 1, err);
}

int vks_stream_write_recv(struct vks_stream *s, struct vks_scan_result *res, struct vks_error *err)
{
    memset(res, 0, sizeof(*res));
    if (s->q_n == 0)
        return vks_error_set(err, -EINVAL,
                             "stream %u has no pipelined write in flight: send one with "
                             "vks_stream_write_send",
                             s->id);
    return stream_recv(s, true, res, err);
}

uint32_t vks_stream_inflight(const struct vks_stream *s)
{
    return s->q_n;
}

int vks_stream_close(struct vks_stream *s, struct vks_scan_result *res, struct vks_error *err)
{
    if (res != NULL)
        memset(res, 0, sizeof(*res));
    if (s == NULL)
        return 0;
    struct proto_request req = {.op = PROTO_OP_STREAM_CLOSE};
    int rc;
    if (s->c->fd < 0 || s->c->drops != s->drops) {
        rc = vks_error_set(err, -VKS_E_CLOSED, "the connection of stream %u is gone", s->id);
    } else if (s->q_n > 0) {
        /* the one failure that leaves the stream open: its writes' hits
         * are still to be taken */
        return vks_error_set(err, -EBUSY,
                             "stream %u has %u pipelined writes in flight: take their replies "
                             "with vks_stream_write_recv, then close it",
                             s->id, s->q_n);
    } else {
        s->broken[0] = '\0'; /* an unusable stream is still closed, to free the daemon's state */
        rc = stream_call(s, &req, NULL, 0, res, err);
    }
    stream_free(s);
    return rc;
}

int vks_stream_close_many(struct vks_stream *const *streams, size_t n, struct vks_scan_result *res,
                          struct vks_error *err)
{
    if (res != NULL)
        memset(res, 0, sizeof(*res));
    if (n == 0)
        return 0;
    if (streams == NULL || n > UINT32_MAX)
        return vks_error_set(err, -EINVAL, "stream.close of %zu streams", n);
    struct vks_client *c = streams[0]->c;
    for (size_t i = 0; i < n; i++) {
        if (streams[i]->c != c)
            return vks_error_set(err, -EINVAL,
                                 "stream %u belongs to another client: one "
                                 "vks_stream_close_many goes over one connection",
                                 streams[i]->id);
        if (streams[i]->q_n > 0)
            return vks_error_set(err, -EBUSY,
                                 "stream %u has %u pipelined writes in flight: take their "
                                 "replies with vks_stream_write_recv, then close it",
                                 streams[i]->id, streams[i]->q_n);
    }
    int rc;
    uint32_t *ids = malloc(n * sizeof(*ids));
    if (c->fd < 0 || streams[0]->drops != c->drops) {
        rc = vks_error_set(err, -VKS_E_CLOSED, "the connection of the streams is gone");
    } else if (ids == NULL) {
        rc = vks_error_set(err, -ENOMEM, "out of memory closing %zu streams", n);
    } else {
        for (size_t i = 0; i < n; i++)
            ids[i] = streams[i]->id;
        struct proto_request req = {.op = PROTO_OP_STREAM_CLOSE};
        req.u.stream.streams = ids;
        req.u.stream.n_streams = (uint32_t)n;
        struct proto_reply *rep = NULL;
        rc = exchange(c, &req, NULL, 0, 0, &rep, err);
        if (rc < 0 && !daemon_refused(rc))
            rc = stream_lost(streams[0], false, rc, err);
        else if (rc == 0)
            rc = res != NULL ? fill_scan_result(rep, res, err) : (proto_reply_destroy(rep), 0);
    }
    free(ids);
    for (size_t i = 0; i < n; i++) { /* the streams end here whatever the reply said */
        stream_free(streams[i]);
    }
    return rc;
}

/* ---- the VKSCAN_0 calls: hits of the layout before `start` --------------------------- */

/* struct vks_hit up to `start`: what a program built before it indexes. */
#define HIT_V0_SIZE offsetof(struct vks_hit, start)

/* Packs the hits to the old stride, in place (each moves down or stays). */
static void hits_to_v0(struct vks_scan_result *res)
{
    for (size_t i = 1; res != NULL && i < res->n_hits; i++)
        memmove((char *)res->hits + i * HIT_V0_SIZE, &res->hits[i], HIT_V0_SIZE);
}

/* Not in any header: the linker exports them as the VKSCAN_0 versions of
 * the calls (vkscan.map); static would hide them from the assembler. */
int compat_client_scan_v0(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN],
                          const struct vks_buffer *buffers, size_t n,
                          const struct vks_scan_options *opt, struct vks_scan_result *res,
                          struct vks_error *err);
int compat_stream_write_v0(struct vks_stream *s, const void *data, size_t len,
                           struct vks_scan_result *res, struct vks_error *err);
int compat_stream_write_fd_v0(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                              struct vks_scan_result *res, struct vks_error *err);
int compat_stream_close_v0(struct vks_stream *s, struct vks_scan_result *res,
                           struct vks_error *err);

/* Only libvkscan.so has the version nodes (vkscan.map); the Python
 * package's stand-alone build compiles this file into its module. */
#ifdef VKS_SYMBOL_VERSIONS
__asm__(".symver compat_client_scan_v0,vks_client_scan@VKSCAN_0");
__asm__(".symver compat_stream_write_v0,vks_stream_write@VKSCAN_0");
__asm__(".symver compat_stream_write_fd_v0,vks_stream_write_fd@VKSCAN_0");
__asm__(".symver compat_stream_close_v0,vks_stream_close@VKSCAN_0");
#endif

int compat_client_scan_v0(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN],
                          const struct vks_buffer *buffers, size_t n,
                          const struct vks_scan_options *opt, struct vks_scan_result *res,
                          struct vks_error *err)
{
    int rc = vks_client_scan(c, catalog, buffers, n, opt, res, err);
    hits_to_v0(res);
    return rc;
}

int compat_stream_write_v0(struct vks_stream *s, const void *data, size_t len,
                           struct vks_scan_result *res, struct vks_error *err)
{
    int rc = vks_stream_write(s, data, len, res, err);
    hits_to_v0(res);
    return rc;
}

int compat_stream_write_fd_v0(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                              struct vks_scan_result *res, struct vks_error *err)
{
    int rc = vks_stream_write_fd(s, fd, offset, length, res, err);
    hits_to_v0(res);
    return rc;
}

int compat_stream_close_v0(struct vks_stream *s, struct vks_scan_result *res, struct vks_error *err)
{
    int rc = vks_stream_close(s, res, err);
    hits_to_v0(res);
    return rc;
}
