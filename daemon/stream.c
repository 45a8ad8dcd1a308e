/*
 * Streams of one connection (stream.h). Each stream is a rules/streamscan
 * state plus a reference to its catalog's store entry. The per-tenant
 * stream count is service-wide (one table, loop thread only).
 */
#include "stream.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "session.h"
#include "session_host.h"
#include "stats.h"
#include "streamscan.h"

#define READ_CHUNK  (1u << 20) /* fd writes are read and scanned in pieces of this size */
#define MAX_EXPIRED 64u        /* expired ids remembered per connection, for the error */

struct stream {
    struct stream *next;
    uint32_t id;
    struct streamscan *scan; /* NULL once expired */
    struct store_entry *entry;
    uint64_t t_active; /* uv_now of the last request */
    size_t state_bytes;
};

struct stream_set {
    struct server *srv;
    uid_t uid;
    uint32_t next_id;
    uint32_t n_expired;
    struct stream *list;
};

/* Open streams per uid, over all connections. */
struct tenant_streams {
    struct tenant_streams *next;
    uid_t uid;
    uint32_t n;
};
static struct tenant_streams *tenants;

static struct {
    uint64_t open, opened, closed, expired, dropped, writes, bytes, hits, state_bytes;
} counters;

static struct tenant_streams *tenant_of(uid_t uid, bool create)
{
    for (struct tenant_streams *t = tenants; t != NULL; t = t->next)
        if (t->uid == uid)
            return t;
    if (!create)
        return NULL;
    struct tenant_streams *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->uid = uid;
    t->next = tenants;
    tenants = t;
    return t;
}

static void tenant_put(uid_t uid)
{
    struct tenant_streams **p = &tenants;
    for (; *p != NULL && (*p)->uid != uid; p = &(*p)->next)
        ;
    if (*p == NULL || --(*p)->n > 0)
        return;
    struct tenant_streams *t = *p;
    *p = t->next;
    free(t);
}

int stream_set_create(struct server *srv, uid_t uid, struct stream_set **out)
{
    struct stream_set *set = calloc(1, sizeof(*set));
    if (set == NULL)
        return -ENOMEM;
    set->srv = srv;
    set->uid = uid;
    set->next_id = 1;
    *out = set;
    return 0;
}

/* Frees the stream's state and catalog reference; the entry stays. */
static void stream_release(struct stream_set *set, struct stream *st)
{
    if (st->scan == NULL)
        return;
    streamscan_destroy(st->scan);
    st->scan = NULL;
    store_entry_unref(server_store(set->srv), st->entry);
    st->entry = NULL;
    counters.open--;
    counters.state_bytes -= st->state_bytes;
    tenant_put(set->uid);
}

static void stream_remove(struct stream_set *set, struct stream *st)
{
    struct stream **p = &set->list;
    for (; *p != st; p = &(*p)->next)
        ;
    *p = st->next;
    if (st->scan == NULL)
        set->n_expired--;
    stream_release(set, st);
    free(st);
}

void stream_set_destroy(struct stream_set *set)
{
    if (set == NULL)
        return;
    while (set->list != NULL) {
        counters.dropped += set->list->scan != NULL;
        stream_remove(set, set->list);
    }
    free(set);
}

void stream_open(struct stream_set *set, struct session *s, const struct proto_request *req,
                 struct store_entry *entry)
{
    const struct daemon_config *cfg = server_config(set->srv);
    const struct catalog *cat = store_entry_catalog(entry);
    size_t size = streamscan_size(cat);
    struct tenant_streams *t = tenant_of(set->uid, false);
    char msg[256];
    if (t != NULL && t->n >= cfg->stream_max_per_tenant) {
        snprintf(msg, sizeof(msg),
                 "uid %u has %u streams open, the limit (stream-max-per-tenant) is %u: close "
                 "streams you are done with",
                 (unsigned)set->uid, t->n, cfg->stream_max_per_tenant);
        session_send_error(s, req->id, req->op, -VKS_E_BUSY, msg);
        return;
    }
    if (size > cfg->stream_max_state_bytes) {
        snprintf(msg, sizeof(msg),
                 "a stream of this catalog needs %zu bytes of state, the limit "
                 "(stream-max-state-bytes) is %llu: split the rule set or scan whole buffers",
                 size, (unsigned long long)cfg->stream_max_state_bytes);
        session_send_error(s, req->id, req->op, -VKS_E_LIMIT, msg);
        return;
    }
    struct stream *st = calloc(1, sizeof(*st));
    if (t == NULL)
        t = tenant_of(set->uid, true); /* made only for a stream that opens */
    if (t == NULL || st == NULL || streamscan_create(cat, &st->scan) != 0) {
        if (t != NULL && t->n == 0) {
            t->n = 1;
            tenant_put(set->uid); /* forgets the empty entry */
        }
        free(st);
        session_send_error(s, req->id, req->op, -ENOMEM, "out of memory opening a stream");
        return;
    }
    st->id = set->next_id++;
    if (set->next_id == 0)
        set->next_id = 1;
    st->entry = entry;
    store_entry_ref(entry);
    st->state_bytes = size;
    st->t_active = uv_now(server_loop(set->srv));
    st->next = set->list;
    set->list = st;
    t->n++;
    counters.open++;
    counters.opened++;
    counters.state_bytes += size;
    struct proto_reply rep = {.id = req->id, .op = req->op};
    rep.u.stream = (struct proto_stream_reply){.stream = st->id, .state_bytes = size};
    session_send_reply(s, &rep);
}

/* The stream `id` names, or NULL after an error reply. An expired stream
 * gets its TIMEOUT error once, then is forgotten. */
static struct stream *find(struct stream_set *set, struct session *s,
                           const struct proto_request *req)
{
    char msg[256];
    uint32_t id = req->u.stream.stream;
    for (struct stream *st = set ? set->list : NULL; st != NULL; st = st->next) {
        if (st->id != id)
            continue;
        if (st->scan != NULL)
            return st;
        snprintf(msg, sizeof(msg),
                 "stream %u was closed after it was idle for %u ms (stream-idle-timeout-ms) and "
                 "its matches across that point are lost: open a new stream",
                 id, server_config(set->srv)->stream_idle_timeout_ms);
        session_send_error(s, req->id, req->op, -VKS_E_TIMEOUT, msg);
        stream_remove(set, st);
        return NULL;
    }
    snprintf(msg, sizeof(msg),
             "stream %u is not open on this connection: open one with stream.open (stream ids "
             "belong to the connection that opened them)",
             id);
    session_send_error(s, req->id, req->op, -VKS_E_BAD_VALUE, msg);
    return NULL;
}

/* Reads the fd range of a write and scans it in pieces. */
static int write_fd(struct stream *st, const struct proto_buffer *b, uint64_t max,
                    struct scan_hits *hits, uint64_t *bytes, char *msg, size_t cap)
{
    struct stat sb;
    if (fstat(b->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(msg, cap, "the descriptor is not a regular file or memfd: pass an open file");
        return -VKS_E_BAD_FD;
    }
    uint64_t size = (uint64_t)sb.st_size;
    uint64_t len = b->has_length ? b->length : size - (b->offset < size ? b->offset : size);
    if (b->offset > size || len > size - b->offset) {
        snprintf(msg, cap, "range %llu+%llu is outside the file of %llu bytes",
                 (unsigned long long)b->offset, (unsigned long long)len, (unsigned long long)size);
        return -VKS_E_BAD_FD;
    }
    if (len > max) {
        snprintf(msg, cap,
                 "the write has %llu bytes, the limit (max-scan-bytes) is %llu: write less at "
                 "a time",
                 (unsigned long long)len, (unsigned long long)max);
        return -VKS_E_LIMIT;
    }
    uint8_t *buf = malloc(len < READ_CHUNK ? (len ? len : 1) : READ_CHUNK);
    if (buf == NULL)
        return -ENOMEM;
    int rc = 0;
    for (uint64_t done = 0; done < len && rc == 0;) {
        size_t want = len - done < READ_CHUNK ? (size_t)(len - done) : READ_CHUNK;
        ssize_t n = pread(b->fd, buf, want, (off_t)(b->offset + done));
        if (n <= 0) {
            snprintf(msg, cap, "reading the descriptor failed at byte %llu: %s",
                     (unsigned long long)(b->offset + done), n < 0 ? strerror(errno) : "EOF");
            rc = -VKS_E_BAD_FD;
            break;
        }
        rc = streamscan_write(st->scan, buf, (size_t)n, hits);
        done += (uint64_t)n;
        *bytes = done;
    }
    free(buf);
    return rc;
}

/* Answers a write or close with its hits (at most max-hits: truncated). */
static void reply_hits(struct stream_set *set, struct session *s, const struct proto_request *req,
                       struct stream *st, const struct scan_hits *hits, uint64_t bytes)
{
    uint32_t max = server_config(set->srv)->max_hits;
    uint32_t n = hits->n < max ? (uint32_t)hits->n : max;
    struct proto_hit *v = calloc(n ? n : 1, sizeof(*v));
    if (v == NULL) {
        session_send_error(s, req->id, req->op, -ENOMEM, "out of memory for the hits");
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        v[i] = (struct proto_hit){.rule = hits->v[i].rule, .end = hits->v[i].end, .count = 1};
    struct proto_buffer_status status = {.bytes = bytes, .hits = n, .truncated = hits->n > n};
    struct proto_stat tel[2] = {
        {.key = "stream_offset", .u = streamscan_offset(st->scan)},
        {.key = "state_bytes", .u = st->state_bytes},
    };
    struct proto_reply rep = {.id = req->id, .op = req->op};
    rep.u.scan = (struct proto_scan_reply){.hits = v,
                                           .n_hits = n,
                                           .buffers = &status,
                                           .n_buffers = 1,
                                           .telemetry = tel,
                                           .n_telemetry = 2};
    counters.hits += n;
    session_send_reply(s, &rep);
    free(v);
}

static void op_write(struct stream_set *set, struct session *s, const struct proto_request *req,
                     struct stream *st)
{
    const struct proto_buffer *b = &req->u.stream.buffer;
    uint64_t max = server_config(set->srv)->max_scan_bytes, bytes = 0;
    struct scan_hits hits = {0};
    char msg[256] = "";
    int rc;
    if (!b->is_fd && b->len > max) {
        snprintf(msg, sizeof(msg),
                 "the write has %llu bytes, the limit (max-scan-bytes) is %llu: write less at "
                 "a time",
                 (unsigned long long)b->len, (unsigned long long)max);
        rc = -VKS_E_LIMIT;
    } else if (!b->is_fd) {
        rc = streamscan_write(st->scan, b->data, (size_t)b->len, &hits);
        bytes = b->len;
    } else {
        rc = write_fd(st, b, max, &hits, &bytes, msg, sizeof(msg));
    }
    counters.writes++;
    counters.bytes += bytes;
    if (rc == 0) {
        reply_hits(set, s, req, st, &hits, bytes);
    } else if (bytes == 0 && rc != -ENOMEM) {
        session_send_error(s, req->id, req->op, rc, msg); /* nothing scanned: stream intact */
    } else {
        char m[300];
        snprintf(m, sizeof(m), "the write failed after %llu bytes (%s): the stream is closed",
                 (unsigned long long)bytes, msg[0] ? msg : "out of memory");
        session_send_error(s, req->id, req->op, rc == -ENOMEM ? -VKS_E_INTERNAL : rc, m);
        stream_remove(set, st);
    }
    scan_hits_finish(&hits);
}

void stream_op(struct stream_set *set, struct session *s, const struct proto_request *req)
{
    struct stream *st = find(set, s, req);
    if (st == NULL)
        return;
    st->t_active = uv_now(server_loop(set->srv));
    if (req->op == PROTO_OP_STREAM_WRITE) {
        op_write(set, s, req, st);
        return;
    }
    struct scan_hits hits = {0};
    if (streamscan_close(st->scan, &hits) == 0)
        reply_hits(set, s, req, st, &hits, 0);
    else
        session_send_error(s, req->id, req->op, -ENOMEM, "out of memory closing the stream");
    scan_hits_finish(&hits);
    counters.closed++;
    stream_remove(set, st);
}

void stream_set_sweep(struct stream_set *set, uint64_t now_ms)
{
    if (set == NULL)
        return;
    uint32_t idle = server_config(set->srv)->stream_idle_timeout_ms;
    if (idle == 0)
        return;
    for (struct stream *st = set->list, *next; st != NULL; st = next) {
        next = st->next;
        if (st->scan == NULL || now_ms - st->t_active < idle)
            continue;
        log_notice("uid %u: stream %u idle for %u ms (stream-idle-timeout-ms): closed",
                   (unsigned)set->uid, st->id, idle);
        stream_release(set, st);
        counters.expired++;
        if (++set->n_expired > MAX_EXPIRED)
            stream_remove(set, st); /* forgotten: its id gets "not open" */
    }
}

void stream_stats_add(const struct daemon_config *cfg, struct stats_list *l)
{
    stats_add_u(l, "limit.stream_max_per_tenant", cfg->stream_max_per_tenant);
    stats_add_u(l, "limit.stream_max_state_bytes", cfg->stream_max_state_bytes);
    stats_add_u(l, "limit.stream_idle_timeout_ms", cfg->stream_idle_timeout_ms);
    stats_add_u(l, "stream.open", counters.open);
    stats_add_u(l, "stream.opened", counters.opened);
    stats_add_u(l, "stream.closed", counters.closed);
    stats_add_u(l, "stream.expired", counters.expired);
    stats_add_u(l, "stream.dropped", counters.dropped);
    stats_add_u(l, "stream.writes", counters.writes);
    stats_add_u(l, "stream.bytes", counters.bytes);
    stats_add_u(l, "stream.hits", counters.hits);
    stats_add_u(l, "stream.state_bytes", counters.state_bytes);
}
