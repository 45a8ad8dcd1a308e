/*
 * vkscand's operator interfaces, against the real binary ($VKSCAND):
 * - the metrics endpoint (metrics-listen): GET /metrics over TCP, the body
 *   parsed back as Prometheus text exposition, a counter that moves after a
 *   scan through libvkscan, 404/405 for anything else, tenant series only
 *   with metrics-tenants yes, and a clean SIGTERM with a connection open;
 * - `vkscand --check-config [FILE]`: the effective configuration on stdout
 *   and exit 0, or the error with its file and line and exit 1.
 * The daemon runs with whichever engine it picks; nothing here depends on it.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vkscan/vkscan.h"

/* ---- a daemon with the metrics endpoint ------------------------------------------- */

struct daemon {
    pid_t pid;
    char dir[64];
    char sock[128];
    int port;
    int notify_fd;
};

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void daemon_start(struct daemon *d, bool tenants)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/vkm-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/vkscand.sock", d->dir);
    char notify[96], state[128], listen[64];
    snprintf(notify, sizeof(notify), "%s/notify", d->dir);
    snprintf(state, sizeof(state), "%s/state", d->dir);
    d->port = free_port();
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", d->port);
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
        execl(bin, bin, "--config", "", "--socket", d->sock, "--state-dir", state,
              "--metrics-listen", listen, "--metrics-tenants", tenants ? "yes" : "no",
              "--log-level", "warning", (char *)NULL);
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

/* SIGTERM; returns the exit status. */
static int daemon_stop(struct daemon *d)
{
    int st;
    kill(d->pid, SIGTERM);
    ck_assert_int_eq(waitpid(d->pid, &st, 0), d->pid);
    close(d->notify_fd);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
    ck_assert_int_eq(system(cmd), 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Sends `request` and reads the whole response (the server closes). */
static char *http(int port, const char *request)
{
    int fd = tcp_connect(port);
    ck_assert_int_eq(write(fd, request, strlen(request)), (ssize_t)strlen(request));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 == cap)
            buf = realloc(buf, cap *= 2);
        ssize_t n = read(fd, buf + len, cap - len - 1);
        ck_assert_int_ge(n, 0);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

/* ---- the exposition format, parsed back ---------------------------------------------- */

struct sample {
    char name[128];
    char labels[256];
    double value;
};

struct expo {
    struct sample *v;
    size_t n;
};

/*
 * Parses a text exposition strictly enough to catch a broken one: every
 * sample line is NAME[{LABELS}] VALUE; every family has one # TYPE line
 * (counter, gauge, histogram or untyped) before its samples; a counter's
 * name ends in _total.
 */
static void parse_expo(const char *body, struct expo *e)
{
    memset(e, 0, sizeof(*e));
    char typed[256][128];
    size_t n_typed = 0;
    const char *p = body;
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        ck_assert_msg(nl != NULL, "exposition does not end in a newline");
        char line[1024];
        size_t ln = (size_t)(nl - p);
        ck_assert_uint_lt(ln, sizeof(line));
        memcpy(line, p, ln);
        line[ln] = '\0';
        p = nl + 1;
        if (strncmp(line, "# HELP ", 7) == 0)
            continue;
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128], type[32];
            ck_assert_int_eq(sscanf(line + 7, "%127s %31s", name, type), 2);
            ck_assert_msg(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                              strcmp(type, "histogram") == 0 || strcmp(type, "untyped") == 0,
                          "bad type: %s", line);
            if (strcmp(type, "counter") == 0)
                ck_assert_msg(strlen(name) > 6 && strcmp(name + strlen(name) - 6, "_total") == 0,
                              "counter without _total: %s", name);
            for (size_t i = 0; i < n_typed; i++)
                ck_assert_msg(strcmp(typed[i], name) != 0, "family typed twice: %s", name);
            ck_assert_uint_lt(n_typed, 256);
            snprintf(typed[n_typed++], sizeof(typed[0]), "%s", name);
            continue;
        }
        ck_assert_msg(line[0] != '#', "unknown comment: %s", line);
        struct sample s = {0};
        size_t k = strspn(line, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
        ck_assert_msg(k > 0 && k < sizeof(s.name), "bad sample: %s", line);
        memcpy(s.name, line, k);
        const char *rest = line + k;
        if (*rest == '{') {
            const char *close = strchr(rest, '}');
            ck_assert_msg(close != NULL, "unclosed labels: %s", line);
            snprintf(s.labels, sizeof(s.labels), "%.*s", (int)(close - rest - 1), rest + 1);
            rest = close + 1;
        }
        ck_assert_msg(*rest == ' ', "no value: %s", line);
        char *end;
        s.value = strtod(rest + 1, &end);
        ck_assert_msg(*end == '\0', "bad value: %s", line);
        /* The sample's family was typed before it (histogram suffixes). */
        bool found = false;
        for (size_t i = 0; i < n_typed && !found; i++) {
            size_t tl = strlen(typed[i]);
            found = strncmp(s.name, typed[i], tl) == 0 &&
                    (s.name[tl] == '\0' || strcmp(s.name + tl, "_bucket") == 0 ||
                     strcmp(s.name + tl, "_sum") == 0 || strcmp(s.name + tl, "_count") == 0);
        }
        ck_assert_msg(found, "sample before its # TYPE: %s", line);
        e->v = realloc(e->v, (e->n + 1) * sizeof(*e->v));
        e->v[e->n++] = s;
    }
}

/* The value of the sample `name` whose labels contain `label` (or any). */
static double expo_get(const struct expo *e, const char *name, const char *label)
{
    for (size_t i = 0; i < e->n; i++) {
        if (strcmp(e->v[i].name, name) == 0 &&
            (label == NULL || strstr(e->v[i].labels, label) != NULL))
            return e->v[i].value;
    }
    return NAN;
}

static bool expo_has_prefix(const struct expo *e, const char *prefix)
{
    for (size_t i = 0; i < e->n; i++) {
        if (strncmp(e->v[i].name, prefix, strlen(prefix)) == 0)
            return true;
    }
    return false;
}

/* GET /metrics: status 200, the exposition content type, the body parsed. */
static void scrape(int port, struct expo *e)
{
    char *r = http(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.1 200 ", 13) == 0, "response: %.80s", r);
    ck_assert_ptr_nonnull(strstr(r, "Content-Type: text/plain; version=0.0.4"));
    char *body = strstr(r, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    const char *cl = strstr(r, "Content-Length: ");
    ck_assert_ptr_nonnull(cl);
    ck_assert_uint_eq(strtoul(cl + 16, NULL, 10), strlen(body + 4));
    parse_expo(body + 4, e);
    free(r);
}

static void scan_once(const char *sock)
{
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(sock, NULL, &c, &err), 0);
    struct vks_catalog *cat;
    ck_assert_int_eq(vks_client_catalog_load_text(c, "x:/abc/\n", 8, NULL, &cat, &err), 0);
    struct vks_buffer b = {.kind = VKS_BUFFER_INLINE, .data = "..abc..abc", .len = 10};
    struct vks_scan_result res;
    ck_assert_int_eq(vks_client_scan(c, vks_catalog_fingerprint(cat), &b, 1, NULL, &res, &err), 0);
    ck_assert_uint_eq(res.n_hits, 2);
    vks_scan_result_finish(&res);
    vks_catalog_destroy(cat);
    vks_client_close(c);
}

START_TEST(metrics_endpoint_counts_a_scan)
{
    struct daemon d;
    daemon_start(&d, false);
    struct expo before, after;
    scrape(d.port, &before);
    ck_assert(!isnan(expo_get(&before, "vkscand_info", "server=\"vkscand ")));
    double scans0 = expo_get(&before, "vkscand_scans_total", NULL);
    double bytes0 = expo_get(&before, "vkscand_scanned_bytes_total", NULL);
    ck_assert(!isnan(scans0) && !isnan(bytes0));
    ck_assert(!isnan(expo_get(&before, "vkscand_limit", "name=\"max_hits\"")));
    ck_assert(!isnan(expo_get(&before, "vkscand_scan_total_seconds_bucket", "le=\"+Inf\"")));
    /* No per-tenant series unless metrics-tenants yes. */
    ck_assert(!expo_has_prefix(&before, "vkscand_tenant_"));

    scan_once(d.sock);
    scrape(d.port, &after);
    ck_assert(expo_get(&after, "vkscand_scans_total", NULL) == scans0 + 1);
    ck_assert(expo_get(&after, "vkscand_scanned_bytes_total", NULL) == bytes0 + 10);
    ck_assert(expo_get(&after, "vkscand_hits_total", NULL) >= 2);
    ck_assert(expo_get(&after, "vkscand_requests_total", "op=\"scan\",result=\"ok\"") >= 1);
    ck_assert(!expo_has_prefix(&after, "vkscand_tenant_"));
    free(before.v);
    free(after.v);

    /* Only GET /metrics. */
    char *r = http(d.port, "GET / HTTP/1.1\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.1 404 ", 13) == 0, "%.40s", r);
    free(r);
    r = http(d.port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.1 405 ", 13) == 0, "%.40s", r);
    ck_assert_ptr_nonnull(strstr(r, "Allow: GET"));
    free(r);
    r = http(d.port, "nonsense\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.1 400 ", 13) == 0, "%.40s", r);
    free(r);

    /* A scraper that connected and said nothing does not hold up SIGTERM. */
    int idle = tcp_connect(d.port);
    ck_assert_int_eq(daemon_stop(&d), 0);
    close(idle);
}
END_TEST

START_TEST(metrics_tenants_adds_uid_series)
{
    struct daemon d;
    daemon_start(&d, true);
    struct vks_client *c;
    struct vks_error err = {0};
    ck_assert_int_eq(vks_client_connect(d.sock, NULL, &c, &err), 0); /* stays open */
    struct expo e;
    scrape(d.port, &e);
    char uid[64];
    snprintf(uid, sizeof(uid), "uid=\"%u\"", (unsigned)getuid());
    ck_assert(!isnan(expo_get(&e, "vkscand_tenant_catalogs", uid)));
    ck_assert(!isnan(expo_get(&e, "vkscand_tenant_served_scans_total", uid)));
    free(e.v);
    vks_client_close(c);
    ck_assert_int_eq(daemon_stop(&d), 0);
}
END_TEST

/* ---- vkscand --check-config ----------------------------------------------------------- */

/* Runs vkscand with `args` (NULL-terminated); stdout and stderr captured. */
static int run_vkscand(const char *const *args, char *out, size_t out_cap, char *errs,
                       size_t err_cap)
{
    int po[2], pe[2];
    ck_assert_int_eq(pipe(po), 0);
    ck_assert_int_eq(pipe(pe), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        const char *argv[16] = {getenv("VKSCAND")};
        for (int i = 0; args[i] != NULL && i < 14; i++)
            argv[i + 1] = args[i];
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    size_t no = 0, ne = 0;
    ssize_t k;
    while ((k = read(po[0], out + no, out_cap - 1 - no)) > 0)
        no += (size_t)k;
    while ((k = read(pe[0], errs + ne, err_cap - 1 - ne)) > 0)
        ne += (size_t)k;
    out[no] = errs[ne] = '\0';
    close(po[0]);
    close(pe[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(check_config_prints_effective_values)
{
    char path[] = "/tmp/vkc-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, "# a comment\nmax-hits 1234\nmetrics-listen 127.0.0.1:9464\n"
                     "tenant-max-bytes 3M\n");
    static char out[65536], errs[4096];
    const char *args[] = {"--check-config", path, "--max-buffers", "77", NULL};
    int rc = run_vkscand(args, out, sizeof(out), errs, sizeof(errs));
    ck_assert_msg(rc == 0, "exit %d: %s", rc, errs);
    ck_assert_ptr_nonnull(strstr(out, path));
    ck_assert_ptr_nonnull(strstr(out, "\nmax-hits 1234\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nmax-buffers 77\n")); /* flags win */
    ck_assert_ptr_nonnull(strstr(out, "\ntenant-max-bytes 3145728\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nmetrics-listen 127.0.0.1:9464\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nmetrics-tenants no\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nsocket-mode 0660\n"));
    ck_assert_ptr_nonnull(strstr(out, "\nmax-frame 67108864\n")); /* a default */

    /* An error names the file and line, and the exit status is 1. */
    write_file(path, "max-hits 10\n\nmax-hits lots\n");
    const char *bad[] = {"--check-config", path, NULL};
    rc = run_vkscand(bad, out, sizeof(out), errs, sizeof(errs));
    ck_assert_int_eq(rc, 1);
    char where[64];
    snprintf(where, sizeof(where), "%s:3", path);
    ck_assert_msg(strstr(errs, where) != NULL, "stderr: %s", errs);
    ck_assert_ptr_nonnull(strstr(errs, "max-hits"));

    write_file(path, "no-such-key 1\n");
    rc = run_vkscand(bad, out, sizeof(out), errs, sizeof(errs));
    ck_assert_int_eq(rc, 1);
    snprintf(where, sizeof(where), "%s:1", path);
    ck_assert_msg(strstr(errs, where) != NULL && strstr(errs, "no-such-key") != NULL, "%s", errs);

    write_file(path, "metrics-listen localhost\n");
    rc = run_vkscand(bad, out, sizeof(out), errs, sizeof(errs));
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(errs, "metrics-listen") != NULL, "%s", errs);

    /* A missing named file is an error too. */
    unlink(path);
    rc = run_vkscand(bad, out, sizeof(out), errs, sizeof(errs));
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(errs, path));

    /* Without FILE: defaults (and the default file when it exists). */
    const char *none[] = {"--check-config", "--config", "", NULL};
    rc = run_vkscand(none, out, sizeof(out), errs, sizeof(errs));
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(out, "(config file: none)"));
    ck_assert_ptr_nonnull(strstr(out, "\nmetrics-listen \n"));
}
END_TEST

Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *t = tcase_create("http");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, metrics_endpoint_counts_a_scan);
    tcase_add_test(t, metrics_tenants_adds_uid_series);
    suite_add_tcase(s, t);
    t = tcase_create("check-config");
    tcase_add_test(t, check_config_prints_effective_values);
    suite_add_tcase(s, t);
    return s;
}
