/*
 * The metrics endpoint (metrics_http.h): a deliberately small HTTP/1.x
 * responder. One request per connection: read the head (at most 8 KiB,
 * within 10 s), answer, close. The body is rendered by common/prom.c from
 * the same stats map the stats op returns.
 */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "config.h"
#include "log.h"
#include "prom.h"
#include "server.h"
#include "stats.h"

#define HEAD_MAX     8192
#define CONN_MAX     16
#define CONN_TIMEOUT 10000 /* ms to send the request head */
#define TENANTS_MAX  256   /* uids listed with metrics-tenants yes */

struct metrics_http {
    struct server *srv;
    uv_loop_t *loop;
    uv_tcp_t listener;
    bool listening;
    uint32_t n_conns;
    uint32_t n_open; /* handles not yet closed (listener, connections, timers) */
    struct conn *conns;
};

struct conn {
    struct metrics_http *m;
    struct conn *next;
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    char head[HEAD_MAX];
    size_t len;
    char *reply;
    bool answered;
    int closing; /* handles of this connection still open */
};

int metrics_http_parse_addr(const char *text, struct sockaddr_storage *sa, struct vks_error *err)
{
    char host[64];
    const char *colon = strrchr(text, ':');
    const char *h = text;
    size_t hlen = colon != NULL ? (size_t)(colon - text) : 0;
    if (hlen >= 2 && text[0] == '[' && text[hlen - 1] == ']') {
        h = text + 1;
        hlen -= 2;
    }
    char *end = NULL;
    unsigned long port = colon != NULL ? strtoul(colon + 1, &end, 10) : 0;
    memset(sa, 0, sizeof(*sa));
    if (colon == NULL || hlen == 0 || hlen >= sizeof(host) || end == colon + 1 || *end != '\0' ||
        port == 0 || port > 65535)
        goto bad;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)sa) == 0 && strchr(host, ':') == NULL)
        return 0;
    if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)sa) == 0 && h != text)
        return 0;
bad:
    return vks_error_set(err, -EINVAL,
                         "metrics-listen '%s' is not HOST:PORT: use an address literal and a "
                         "port, such as 127.0.0.1:9464 or [::1]:9464",
                         text);
}

/* ---- rendering ------------------------------------------------------------------ */

static void add_list(struct prom_stat *out, size_t *n, const struct stats_list *l, bool tenant,
                     bool has_uid, uid_t uid)
{
    for (uint32_t i = 0; i < l->n; i++) {
        bool is_tenant = strncmp(l->v[i].key, "tenant.", 7) == 0;
        if (is_tenant != tenant || (tenant && strcmp(l->v[i].key, "tenant.uid") == 0))
            continue;
        out[(*n)++] = (struct prom_stat){.key = l->v[i].key,
                                         .is_float = l->v[i].is_float,
                                         .u = l->v[i].u,
                                         .f = l->v[i].f,
                                         .has_uid = has_uid,
                                         .uid = (uint64_t)uid};
    }
}

/* The exposition text (malloc'd, NUL-terminated), or NULL. */
static char *render(struct metrics_http *m, size_t *len)
{
    const struct daemon_config *cfg = server_config(m->srv);
    uid_t uids[TENANTS_MAX];
    uint32_t n_uids = cfg->metrics_tenants ? server_session_uids(m->srv, uids, TENANTS_MAX) : 0;
    struct stats_list *l = malloc(sizeof(*l));
    struct prom_stat *ps =
        calloc(sizeof(l->v) / sizeof(l->v[0]) * (1 + (size_t)n_uids), sizeof(*ps));
    struct stats_list *tl = malloc(sizeof(*tl) * (n_uids ? n_uids : 1));
    char *buf = NULL;
    *len = 0;
    if (l != NULL && ps != NULL && tl != NULL) {
        size_t n = 0;
        stats_collect(m->srv, 0, l);
        add_list(ps, &n, l, false, false, 0);
        for (uint32_t i = 0; i < n_uids; i++) {
            stats_collect(m->srv, uids[i], &tl[i]);
            add_list(ps, &n, &tl[i], true, true, uids[i]);
        }
        char server[64];
        snprintf(server, sizeof(server), "vkscand %s", VKS_VERSION);
        FILE *f = open_memstream(&buf, len);
        if (f != NULL) {
            int rc = prom_write(f, server, PROTO_VERSION, ps, n);
            if (fclose(f) != 0 || rc != 0) {
                free(buf);
                buf = NULL;
            }
        }
    }
    free(tl);
    free(ps);
    free(l);
    return buf;
}

/* ---- connections ---------------------------------------------------------------- */

static void conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct metrics_http *m = c->m;
    m->n_open--;
    if (--c->closing > 0)
        return;
    for (struct conn **p = &m->conns; *p != NULL; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    m->n_conns--;
    free(c->reply);
    free(c);
}

static void conn_close(struct conn *c)
{
    if (c->closing > 0)
        return;
    c->closing = 2;
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
    uv_close((uv_handle_t *)&c->timer, conn_closed);
}

static void written(uv_write_t *req, int status)
{
    (void)status;
    conn_close(req->data);
}

static void respond(struct conn *c, const char *status, const char *extra, const char *type,
                    const char *body, size_t body_len)
{
    c->answered = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    char head[512];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                      "Connection: close\r\n\r\n",
                      status, type, body_len, extra);
    c->reply = malloc((size_t)hn + body_len);
    if (c->reply == NULL) {
        conn_close(c);
        return;
    }
    memcpy(c->reply, head, (size_t)hn);
    memcpy(c->reply + hn, body, body_len);
    uv_buf_t b = uv_buf_init(c->reply, (unsigned)((size_t)hn + body_len));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, written) != 0)
        conn_close(c);
}

static void respond_text(struct conn *c, const char *status, const char *extra, const char *text)
{
    respond(c, status, extra, "text/plain; charset=utf-8", text, strlen(text));
}

/* The head is complete: answer the request line. */
static void handle(struct conn *c)
{
    char method[16], target[256], version[16];
    const char *eol = strstr(c->head, "\r\n");
    size_t ln = eol != NULL ? (size_t)(eol - c->head) : 0;
    char line[512];
    if (ln == 0 || ln >= sizeof(line)) {
        respond_text(c, "400 Bad Request", "", "bad request line\n");
        return;
    }
    memcpy(line, c->head, ln);
    line[ln] = '\0';
    if (sscanf(line, "%15s %255s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0) {
        respond_text(c, "400 Bad Request", "", "bad request line\n");
        return;
    }
    char *q = strchr(target, '?');
    if (q != NULL)
        *q = '\0';
    if (strcmp(target, "/metrics") != 0) {
        respond_text(c, "404 Not Found", "", "only /metrics is served here\n");
        return;
    }
    if (strcmp(method, "GET") != 0) {
        respond_text(c, "405 Method Not Allowed", "Allow: GET\r\n", "use GET\n");
        return;
    }
    size_t len;
    char *body = render(c->m, &len);
    if (body == NULL) {
        respond_text(c, "500 Internal Server Error", "", "out of memory\n");
        return;
    }
    respond(c, "200 OK", "", "text/plain; version=0.0.4; charset=utf-8", body, len);
    free(body);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    *buf = uv_buf_init(c->head + c->len, (unsigned)(HEAD_MAX - 1 - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    struct conn *c = s->data;
    if (n < 0) {
        conn_close(c);
        return;
    }
    c->len += (size_t)n;
    c->head[c->len] = '\0';
    if (c->answered)
        return;
    if (strstr(c->head, "\r\n\r\n") != NULL || strstr(c->head, "\n\n") != NULL)
        handle(c);
    else if (c->len >= HEAD_MAX - 1)
        respond_text(c, "431 Request Header Fields Too Large", "", "request head too large\n");
}

static void on_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

static void on_connection(uv_stream_t *l, int status)
{
    struct metrics_http *m = l->data;
    if (status < 0)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (c == NULL || uv_tcp_init(m->loop, &c->tcp) != 0) {
        free(c);
        return;
    }
    c->m = m;
    c->tcp.data = c;
    c->timer.data = c;
    uv_timer_init(m->loop, &c->timer);
    uv_unref((uv_handle_t *)&c->tcp);
    uv_unref((uv_handle_t *)&c->timer);
    c->next = m->conns;
    m->conns = c;
    m->n_conns++;
    m->n_open += 2;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 || m->n_conns > CONN_MAX ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timeout, CONN_TIMEOUT, 0);
}

/* ---- the listener --------------------------------------------------------------- */

static void listener_closed(uv_handle_t *h)
{
    struct metrics_http *m = h->data;
    m->n_open--;
}

int metrics_http_create(struct server *srv, const char *addr, struct metrics_http **out,
                        struct vks_error *err)
{
    struct sockaddr_storage sa;
    int rc = metrics_http_parse_addr(addr, &sa, err);
    if (rc != 0)
        return rc;
    struct metrics_http *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory for the metrics endpoint");
    m->srv = srv;
    m->loop = server_loop(srv);
    uv_tcp_init(m->loop, &m->listener);
    m->listener.data = m;
    m->listening = true;
    m->n_open = 1;
    uv_unref((uv_handle_t *)&m->listener);
    rc = uv_tcp_bind(&m->listener, (const struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&m->listener, 16, on_connection);
    if (rc != 0) {
        vks_error_set(err, rc,
                      "metrics-listen %s: cannot listen: %s: pick a free port or leave "
                      "metrics-listen empty",
                      addr, uv_strerror(rc));
        metrics_http_destroy(m);
        return rc;
    }
    log_notice("metrics on http://%s/metrics", addr);
    *out = m;
    return 0;
}

void metrics_http_destroy(struct metrics_http *m)
{
    if (m == NULL)
        return;
    if (m->listening)
        uv_close((uv_handle_t *)&m->listener, listener_closed);
    m->listening = false;
    for (struct conn *c = m->conns; c != NULL; c = c->next)
        conn_close(c);
    while (m->n_open > 0)
        uv_run(m->loop, UV_RUN_NOWAIT);
    free(m);
}
