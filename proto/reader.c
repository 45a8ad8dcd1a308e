/*
 * proto: the frame accumulator and the socket helpers (SCM_RIGHTS).
 *
 * The reader is a two-state machine: HEADER collects the 4-byte big-endian
 * length, BODY collects exactly that many bytes, then the frame waits in
 * `cur` until proto_reader_take. A bad length is fatal because nothing after
 * it can be trusted to be a frame boundary; the reader then stays failed.
 *
 * With read-ahead (proto_reader_read_ahead) a recvmsg may take more than
 * the current frame: the bytes past it wait in `ra` and are parsed before
 * the socket is asked again, so a small request costs one recvmsg, not two
 * (its length prefix, then its body). Descriptors then need an owner: the
 * protocol sends them with the first byte of their frame, and the kernel
 * ends a read with the message that carried them, so they belong to the
 * last frame that starts within the read; they wait in `pend` until the
 * parse reaches that frame's first byte.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "proto.h"

#define BODY_MIN_ALLOC (64u << 10)
#define NO_PEND        SIZE_MAX

struct proto_reader {
    struct proto_limits lim;
    uint8_t hdr[PROTO_HEADER_LEN];
    size_t hdr_len;
    bool in_body;
    bool complete;
    uint32_t body_len;
    size_t got;
    size_t cap;
    struct proto_frame cur;
    int failed; /* 0, or the fatal code it reports forever */
    /* read-ahead: ra[ra_off..ra_len) was received and is not parsed yet */
    uint8_t *ra;
    size_t ra_cap, ra_off, ra_len;
    /* descriptors received with bytes in ra: they go to the frame whose
     * first byte is ra[pend_at] (NO_PEND: none wait) */
    int *pend;
    size_t n_pend, pend_at;
    int pend_error;
};

int proto_reader_create(const struct proto_limits *lim, struct proto_reader **out)
{
    struct proto_reader *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    if (lim != NULL)
        r->lim = *lim;
    proto_limits_normalize(&r->lim);
    r->pend_at = NO_PEND;
    *out = r;
    return 0;
}

int proto_reader_read_ahead(struct proto_reader *r, size_t bytes)
{
    if (r->ra_cap != 0 || bytes == 0)
        return 0;
    r->ra = malloc(bytes);
    r->pend = malloc(PROTO_MAX_FDS_CEILING * sizeof(int));
    if (r->ra == NULL || r->pend == NULL) {
        free(r->ra);
        free(r->pend);
        r->ra = NULL;
        r->pend = NULL;
        return -ENOMEM;
    }
    r->ra_cap = bytes;
    return 0;
}

static void drop_pending(struct proto_reader *r)
{
    for (size_t i = 0; i < r->n_pend; i++)
        close(r->pend[i]);
    r->n_pend = 0;
    r->pend_error = 0;
    r->pend_at = NO_PEND;
}

void proto_reader_destroy(struct proto_reader *r)
{
    if (r == NULL)
        return;
    proto_frame_finish(&r->cur);
    drop_pending(r);
    free(r->pend);
    free(r->ra);
    free(r);
}

bool proto_reader_idle(const struct proto_reader *r)
{
    return r->hdr_len == 0 && !r->in_body && !r->complete && r->ra_off == r->ra_len;
}

bool proto_reader_buffered(const struct proto_reader *r)
{
    return r->ra_off < r->ra_len;
}

uint32_t proto_reader_frame_len(const struct proto_reader *r)
{
    return r->in_body || r->complete ? r->body_len : 0;
}

static int fail(struct proto_reader *r, int code, struct vks_error *err, const char *what)
{
    r->failed = code;
    return vks_error_set(err, code, "%s: the stream cannot be resynchronised; close the connection",
                         what);
}

/* A frame's length prefix (big-endian). */
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int header_done(struct proto_reader *r, struct vks_error *err)
{
    uint32_t len = be32(r->hdr);
    if (len == 0) {
        r->failed = -VKS_E_BAD_FRAME;
        return vks_error_set(err, -VKS_E_BAD_FRAME,
                             "frame length is 0 (a frame holds one msgpack map): the stream "
                             "cannot be resynchronised; close the connection");
    }
    if (len > r->lim.max_frame) {
        r->failed = -VKS_E_FRAME_TOO_LARGE;
        return vks_error_set(err, -VKS_E_FRAME_TOO_LARGE,
                             "frame of %u bytes is over the limit of %u bytes: send smaller "
                             "requests (pass large inputs as file descriptors) or raise "
                             "max_frame; the connection will be closed",
                             len, r->lim.max_frame);
    }
    r->body_len = len;
    r->in_body = true;
    r->got = 0;
    return 0;
}

/* Makes room for more body bytes: the buffer doubles from BODY_MIN_ALLOC up
 * to the frame length, so memory follows the bytes that really arrived.
 * Returns the bytes that may be written at data + got. */
static int body_room(struct proto_reader *r, size_t *room, struct vks_error *err)
{
    if (r->got == r->cap) {
        size_t cap = r->cap == 0 ? BODY_MIN_ALLOC : r->cap * 2;
        if (cap > r->body_len)
            cap = r->body_len;
        uint8_t *p = realloc(r->cur.data, cap);
        if (p == NULL)
            return fail(r, -ENOMEM, err, "out of memory for a frame body");
        r->cur.data = p;
        r->cap = cap;
    }
    *room = r->cap - r->got;
    return 0;
}

/* Accounts `n` body bytes just written at data + got. */
static int body_add(struct proto_reader *r, size_t n)
{
    r->got += n;
    if (r->got < r->body_len)
        return 0;
    r->cur.len = r->body_len;
    r->complete = true;
    r->in_body = false;
    r->hdr_len = 0;
    return 1;
}

int proto_reader_feed(struct proto_reader *r, const void *data, size_t n, size_t *used,
                      struct vks_error *err)
{
    const uint8_t *p = data;
    size_t off = 0;
    *used = 0;
    if (r->failed != 0)
        return vks_error_set(err, r->failed, "the stream already failed; close the connection");
    if (r->complete)
        return 1;
    while (off < n) {
        if (!r->in_body) {
            size_t k = PROTO_HEADER_LEN - r->hdr_len;
            k = k < n - off ? k : n - off;
            memcpy(r->hdr + r->hdr_len, p + off, k);
            r->hdr_len += k;
            off += k;
            *used = off;
            if (r->hdr_len < PROTO_HEADER_LEN)
                return 0;
            int rc = header_done(r, err);
            if (rc < 0)
                return rc;
            continue;
        }
        size_t room = 0;
        int rc = body_room(r, &room, err);
        if (rc < 0)
            return rc;
        size_t k = room < n - off ? room : n - off;
        memcpy(r->cur.data + r->got, p + off, k);
        off += k;
        *used = off;
        if (body_add(r, k) == 1)
            return 1;
    }
    return 0;
}

/* Gives descriptors to the current frame, closing (and flagging) those
 * over the limit; `error` is a flag take_fds found (0: none). */
static void give_fds(struct proto_reader *r, const int *fds, size_t n, int error)
{
    if (error != 0)
        r->cur.fd_error = error;
    for (size_t i = 0; i < n; i++) {
        if (r->cur.fds == NULL)
            r->cur.fds = malloc(r->lim.max_fds * sizeof(int));
        if (r->cur.fds == NULL || r->cur.n_fds >= r->lim.max_fds) {
            close(fds[i]);
            r->cur.fd_error = -VKS_E_TOO_MANY_FDS;
            continue;
        }
        r->cur.fds[r->cur.n_fds++] = fds[i];
    }
}

/* Collects the descriptors of every SCM_RIGHTS message into fds[0..*n)
 * (room for PROTO_MAX_FDS_CEILING, the most one message can carry here).
 * A truncated control message with room to spare in our buffer means the
 * kernel could not install the descriptors in this process (EMFILE/ENFILE):
 * that is flagged BUSY, not blamed on the sender. Returns the flag, or 0. */
static int take_fds(struct msghdr *msg, int *fds, size_t *n)
{
    int error = 0;
    *n = 0;
    if (msg->msg_flags & MSG_CTRUNC) {
        size_t got = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                got += (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        error = got < PROTO_MAX_FDS_CEILING ? -VKS_E_BUSY : -VKS_E_TOO_MANY_FDS;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *src = CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, src + i * sizeof(int), sizeof(int));
            if (*n < PROTO_MAX_FDS_CEILING) {
                fds[(*n)++] = fd;
            } else {
                close(fd);
                error = -VKS_E_TOO_MANY_FDS;
            }
        }
    }
    return error;
}

/* Where the last frame that starts within a read's ra bytes ra[0..n)
 * begins, or NO_PEND when none does (the read only continued the current
 * frame). `direct_done`: the read went into the current frame's body first
 * and completed it, so ra[0] starts the next frame. */
static size_t last_start(const struct proto_reader *r, size_t n, bool direct_done)
{
    uint64_t pos = 0;
    size_t last = NO_PEND;
    if (!direct_done && r->in_body)
        return NO_PEND;
    if (!direct_done && r->hdr_len > 0) { /* this frame began in an earlier read */
        size_t k = PROTO_HEADER_LEN - r->hdr_len;
        if (n < k)
            return NO_PEND;
        uint8_t h[PROTO_HEADER_LEN];
        memcpy(h, r->hdr, r->hdr_len);
        memcpy(h + r->hdr_len, r->ra, k);
        pos = k + (uint64_t)be32(h);
    }
    while (pos < n) {
        last = (size_t)pos;
        if (n - pos < PROTO_HEADER_LEN)
            break;
        pos += PROTO_HEADER_LEN + (uint64_t)be32(r->ra + pos);
    }
    return last;
}

/* Gives the waiting descriptors to the current frame. */
static void give_pending(struct proto_reader *r)
{
    give_fds(r, r->pend, r->n_pend, r->pend_error);
    r->n_pend = 0;
    r->pend_error = 0;
    r->pend_at = NO_PEND;
}

/* Parses read-ahead bytes up to the end of the current frame (feed stops
 * there): returns PROTO_RECV_FRAME when they complete it, PROTO_RECV_MORE
 * when they ran out, or a fatal error. Waiting descriptors join their frame
 * at its first byte, which is where a call starts when it starts a frame. */
static int parse_ahead(struct proto_reader *r, struct vks_error *err)
{
    if (r->pend_at == r->ra_off && r->hdr_len == 0 && !r->in_body)
        give_pending(r);
    size_t used = 0;
    int rc = proto_reader_feed(r, r->ra + r->ra_off, r->ra_len - r->ra_off, &used, err);
    r->ra_off += used;
    if (rc != 0)
        return rc < 0 ? rc : PROTO_RECV_FRAME;
    r->ra_off = r->ra_len = 0; /* feed took them all */
    if (r->pend_at != NO_PEND) /* not reached (cannot happen): the old owner */
        give_pending(r);
    return PROTO_RECV_MORE;
}

int proto_reader_recv(struct proto_reader *r, int sock, struct vks_error *err)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * PROTO_MAX_FDS_CEILING)];
    } ctl;
    struct iovec iov[2];
    int niov = 1;
    size_t direct = 0; /* bytes iov[0] takes straight into the frame */
    if (r->failed != 0)
        return vks_error_set(err, r->failed, "the stream already failed; close the connection");
    if (r->complete)
        return PROTO_RECV_FRAME;
    if (r->ra_off < r->ra_len)
        return parse_ahead(r, err);
    if (!r->in_body) {
        if (r->ra_cap != 0) {
            iov[0] = (struct iovec){.iov_base = r->ra, .iov_len = r->ra_cap};
        } else {
            iov[0].iov_base = r->hdr + r->hdr_len;
            iov[0].iov_len = PROTO_HEADER_LEN - r->hdr_len;
        }
    } else {
        size_t room = 0;
        int rc = body_room(r, &room, err);
        if (rc < 0)
            return rc;
        iov[0].iov_base = r->cur.data + r->got;
        iov[0].iov_len = room;
        direct = room;
        if (r->ra_cap != 0 && room == r->body_len - r->got) { /* the read may finish it */
            iov[1] = (struct iovec){.iov_base = r->ra, .iov_len = r->ra_cap};
            niov = 2;
        }
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    ssize_t n;
    do {
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK)
            return -EAGAIN;
        return vks_error_set(err, -e, "reading from the socket failed: %s", strerror(e));
    }
    int fds[PROTO_MAX_FDS_CEILING];
    size_t n_fds = 0;
    int fd_error = take_fds(&msg, fds, &n_fds);
    bool into_ra = r->ra_cap != 0 && (!r->in_body || (size_t)n > direct);
    size_t n_ra = !into_ra ? 0 : r->in_body ? (size_t)n - direct : (size_t)n;
    if (n_fds != 0 || fd_error != 0) {
        size_t at = into_ra ? last_start(r, n_ra, r->in_body) : NO_PEND;
        if (at == NO_PEND) {
            give_fds(r, fds, n_fds, fd_error);
        } else {
            memcpy(r->pend, fds, n_fds * sizeof(int));
            r->n_pend = n_fds;
            r->pend_error = fd_error;
            r->pend_at = at;
        }
    }
    if (n == 0) {
        if (proto_reader_idle(r))
            return PROTO_RECV_EOF;
        return vks_error_set(err, -ECONNRESET,
                             "the peer closed the connection in the middle of a frame");
    }
    if (into_ra) {
        r->ra_off = 0;
        r->ra_len = n_ra;
        if (!r->in_body)
            return parse_ahead(r, err);
        body_add(r, direct); /* the body is whole: the rest waits in ra */
        return PROTO_RECV_FRAME;
    }
    if (!r->in_body) {
        r->hdr_len += (size_t)n;
        if (r->hdr_len < PROTO_HEADER_LEN)
            return PROTO_RECV_MORE;
        return header_done(r, err);
    }
    return body_add(r, (size_t)n) == 1 ? PROTO_RECV_FRAME : PROTO_RECV_MORE;
}

int proto_reader_take(struct proto_reader *r, struct proto_frame *out)
{
    if (!r->complete)
        return -EAGAIN;
    *out = r->cur;
    memset(&r->cur, 0, sizeof(r->cur));
    r->complete = false;
    r->got = 0;
    r->cap = 0;
    r->body_len = 0;
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until `sock` is writable or the deadline (-1: none) passes. */
static int wait_writable(int sock, int64_t deadline, struct vks_error *err)
{
    for (;;) {
        int t = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0)
                return vks_error_set(err, -ETIMEDOUT,
                                     "sending a frame timed out: the peer stopped reading");
            t = left > 60000 ? 60000 : (int)left;
        }
        struct pollfd pfd = {.fd = sock, .events = POLLOUT};
        int rc = poll(&pfd, 1, t);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return vks_error_set(err, -errno, "poll on the socket failed: %s", strerror(errno));
    }
}

int proto_send_some(int sock, const void *data, size_t len, size_t *off, const int *fds,
                    size_t n_fds, struct vks_error *err)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * PROTO_MAX_FDS_CEILING)];
    } ctl;
    if (n_fds > PROTO_MAX_FDS_CEILING || (n_fds > 0 && len == 0))
        return vks_error_set(err, -EINVAL,
                             "%zu descriptors with %zu bytes: at most %u, and "
                             "descriptors need at least one byte to travel with",
                             n_fds, len, PROTO_MAX_FDS_CEILING);
    const uint8_t *p = data;
    while (*off < len) {
        struct iovec iov = {.iov_base = (void *)(p + *off), .iov_len = len - *off};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (*off == 0 && n_fds > 0) {
            memset(ctl.buf, 0, sizeof(ctl.buf));
            msg.msg_control = ctl.buf;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
            *off += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return -EAGAIN;
        return vks_error_set(err, -errno, "sending a frame failed: %s", strerror(errno));
    }
    return 0;
}

int proto_send(int sock, const void *data, size_t len, const int *fds, size_t n_fds, int timeout_ms,
               struct vks_error *err)
{
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    size_t off = 0;
    for (;;) {
        int rc = proto_send_some(sock, data, len, &off, fds, n_fds, err);
        if (rc != -EAGAIN)
            return rc;
        rc = wait_writable(sock, deadline, err);
        if (rc < 0)
            return rc;
    }
}
