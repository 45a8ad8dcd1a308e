/*
 * vkscan: the command-line tool (docs/vkscan.1 is its manual).
 *
 *   vkscan scan -r RULES PATH...   scan files through vkscand (libvkscan)
 *   vkscan status                  what the daemon runs and holds
 *                                  (vkscan_status.c)
 *   vkscan rules check FILE        compile a pattern file locally and report
 *   vkscan rules scan FILE PATH..  scan files locally with the CPU reference
 *                                  scanner (no daemon), grep -b style output
 *
 * Exit codes follow grep: 0 a match (or success), 1 no match, 2 an error
 * (for `rules check`: 1 when some rule was rejected).
 *
 * `scan` opens every file itself and hands the daemon its descriptor, so the
 * daemon never opens a path with its own rights. Files are batched into scan
 * requests (up to the descriptor limit hello reports); several requests are in
 * flight at once, one per worker thread and connection, and their results are
 * printed in the order the files were found.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "vkscan/vkscan.h"
#include "vkscan_cli.h"

#define STDIN_LABEL     "(standard input)"
#define MAX_JOBS        16u
#define BATCH_MAX_FILES 64u                 /* descriptors per request, at most */
#define BATCH_BYTES     (64ull << 20)       /* bytes per request we aim for */
#define SCAN_IO_MS      (10u * 60u * 1000u) /* wait for one scan reply */

/* ---- files ---------------------------------------------------------------- */

int cli_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int rc = buf == NULL ? -ENOMEM : ferror(f) ? -EIO : 0;
    if (f != stdin)
        fclose(f);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = n;
    return 0;
}

void cli_print_reject(const char *file, uint32_t line, uint32_t pos, const char *id,
                      const char *msg)
{
    fprintf(stderr, "%s:%u: rule '%s' rejected at column %u: %s\n", file, line, id, pos + 1, msg);
}

/* ---- talking to vkscand ------------------------------------------------- */

const char *cli_socket_path = NULL;

const char *cli_daemon_socket(void)
{
    if (cli_socket_path != NULL)
        return cli_socket_path;
    const char *env = getenv("VKSCAN_SOCKET");
    return env != NULL && env[0] != '\0' ? env : CLI_DEFAULT_SOCKET;
}

int cli_daemon_connect(uint32_t io_ms, bool quiet, struct vks_client **out)
{
    struct vks_client_options opt;
    vks_client_options_init(&opt);
    opt.client_name = "vkscan";
    if (io_ms != 0)
        opt.io_timeout_ms = io_ms;
    struct vks_error err = {0};
    const char *path = cli_daemon_socket();
    int rc = vks_client_connect(path, &opt, out, &err);
    if (rc == 0 || quiet)
        return rc == 0 ? 0 : 2;
    if (rc == -ENOENT || rc == -ECONNREFUSED || rc == -ENOTDIR)
        fprintf(stderr,
                "vkscan: vkscand is not running at %s: start it with systemctl start "
                "vkscand\n",
                path);
    else if (rc == -EACCES || rc == -EPERM)
        fprintf(stderr,
                "vkscan: may not open vkscand's socket %s: %s: join the vkscan group "
                "(usermod -aG vkscan $USER) and log in again\n",
                path, strerror(-rc));
    else
        fprintf(stderr, "vkscan: %s\n", err.msg);
    return 2;
}

/* ---- output helpers ----------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c < 0x80             ? 1
                 : (c & 0xe0) == 0xc0 ? 2
                 : (c & 0xf0) == 0xe0 ? 3
                 : (c & 0xf8) == 0xf0 ? 4
                                      : 0;
    if (len == 0 || len > n || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4))
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    }
    if ((len == 3 && c == 0xe0 && s[1] < 0xa0) || (len == 3 && c == 0xed && s[1] >= 0xa0) ||
        (len == 4 && c == 0xf0 && s[1] < 0x90) || (len == 4 && c == 0xf4 && s[1] >= 0x90))
        return 0;
    return len;
}

void cli_json_str(FILE *f, const char *s, bool *lossy)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len(p + i, n - i);
        if (len == 0) {
            fputs("\\ufffd", f);
            if (lossy != NULL)
                *lossy = true;
            i++;
        } else if (p[i] == '"' || p[i] == '\\') {
            fprintf(f, "\\%c", p[i++]);
        } else if (p[i] < 0x20) {
            fprintf(f, "\\u%04x", p[i++]);
        } else {
            fwrite(p + i, 1, len, f);
            i += len;
        }
    }
    fputc('"', f);
}

static void base64(FILE *f, const unsigned char *s, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        fputc(tab[v >> 18], f);
        fputc(tab[(v >> 12) & 63], f);
        fputc(i + 1 < n ? tab[(v >> 6) & 63] : '=', f);
        fputc(i + 2 < n ? tab[v & 63] : '=', f);
    }
}

/* `"path":"...",` with "path_base64" when the name is not UTF-8. */
static void json_path(FILE *f, const char *path)
{
    bool lossy = false;
    fputs("{\"path\":", f);
    cli_json_str(f, path, &lossy);
    if (lossy) {
        fputs(",\"path_base64\":\"", f);
        base64(f, (const unsigned char *)path, strlen(path));
        fputc('"', f);
    }
}

void cli_fmt_bytes(uint64_t v, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    unsigned u = 0;
    while (d >= 1024 && u < 4) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)v);
    else
        snprintf(buf, cap, "%.1f %s", d, units[u]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- vkscan scan: the batch pipeline ------------------------------------- */

enum out_mode { OUT_MATCHES, OUT_COUNT, OUT_LIST };

struct scan_opts {
    const char *rules;
    enum vks_report report;
    enum out_mode out;
    bool json;
    unsigned jobs;
};

struct file_ent {
    char *path; /* as printed */
    int fd;
    uint64_t size;
};

enum slot_state { SLOT_FREE, SLOT_READY, SLOT_RUNNING, SLOT_DONE };

struct batch {
    enum slot_state state;
    struct file_ent *files;
    struct vks_buffer *bufs;
    size_t n;
    uint64_t bytes;
    int rc;
    struct vks_error err;
    struct vks_scan_result res;
};

struct scan;

struct worker {
    pthread_t thread;
    struct scan *s;
    struct vks_client *client;
};

struct scan {
    struct scan_opts opt;
    struct vks_client *main;
    struct vks_catalog *cat;
    char *rules_text;
    size_t rules_len;
    uint8_t fp[VKS_FP_LEN];
    size_t batch_files; /* files per request */
    uint64_t batch_bytes;
    uint64_t max_bytes; /* the daemon's per-request limit */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct batch *slots;
    size_t n_slots;
    size_t head; /* oldest batch not yet printed (sequence number) */
    size_t tail; /* the batch being filled */
    size_t next; /* the next batch a worker takes */
    bool closing;
    struct worker workers[MAX_JOBS];
    unsigned n_workers;

    bool matched, failed;
    uint64_t files, bytes, hits;
    double t0, drawn_at;
    bool progress, progress_shown;
};

/* Scans one batch on a worker's connection. BUSY is retried with backoff;
 * UNKNOWN_CATALOG (the daemon evicted or restarted without its cache) loads
 * the rules again once. */
static int scan_batch(struct worker *w, struct batch *b)
{
    struct scan *s = w->s;
    struct vks_scan_options so = {.mode = s->opt.report};
    bool reloaded = false;
    for (unsigned attempt = 0;; attempt++) {
        int rc = vks_client_scan(w->client, s->fp, b->bufs, b->n, &so, &b->res, &b->err);
        if (rc == -VKS_E_BUSY && attempt < 8) {
            usleep(50000u << (attempt < 5 ? attempt : 5));
            continue;
        }
        if (rc != -VKS_E_UNKNOWN_CATALOG || reloaded)
            return rc;
        struct vks_catalog *cat = NULL;
        rc = vks_client_catalog_load_text(w->client, s->rules_text, s->rules_len, NULL, &cat,
                                          &b->err);
        if (rc != 0)
            return rc;
        bool same = memcmp(vks_catalog_fingerprint(cat), s->fp, VKS_FP_LEN) == 0;
        vks_catalog_destroy(cat);
        if (!same)
            return vks_error_set(&b->err, -VKS_E_UNKNOWN_CATALOG,
                                 "the daemon compiled the "
                                 "rules into another catalog while the scan ran: run it again");
        reloaded = true;
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct scan *s = w->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        struct batch *b = &s->slots[s->next % s->n_slots];
        while (!s->closing && !(s->next < s->tail && b->state == SLOT_READY)) {
            pthread_cond_wait(&s->cv, &s->mu);
            b = &s->slots[s->next % s->n_slots];
        }
        if (s->next >= s->tail || b->state != SLOT_READY)
            break;
        s->next++;
        b->state = SLOT_RUNNING;
        pthread_mutex_unlock(&s->mu);
        b->rc = scan_batch(w, b);
        pthread_mutex_lock(&s->mu);
        b->state = SLOT_DONE;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void progress_clear(struct scan *s)
{
    if (s->progress_shown) {
        fputs("\r\033[K", stderr);
        s->progress_shown = false;
    }
}

static void progress_draw(struct scan *s, bool force)
{
    double now = now_s();
    if (!s->progress || (!force && (now - s->t0 < 1.0 || now - s->drawn_at < 0.25)))
        return;
    double secs = now - s->t0 > 1e-3 ? now - s->t0 : 1e-3;
    char b[32];
    cli_fmt_bytes(s->bytes, b, sizeof(b));
    double rate = (double)s->bytes / secs;
    fprintf(stderr, "\r\033[Kvkscan: %llu files, %s, %.2f %s, %llu hits",
            (unsigned long long)s->files, b, rate >= 1e9 ? rate / 1e9 : rate / 1e6,
            rate >= 1e9 ? "GB/s" : "MB/s", (unsigned long long)s->hits);
    s->drawn_at = now;
    s->progress_shown = true;
}

static void warn_path(struct scan *s, const char *path, const char *fmt, const char *what)
{
    progress_clear(s);
    fprintf(stderr, "vkscan: %s: ", path);
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    s->failed = true;
}

/* Prints one file's hits (res->hits[*k..] for buffer `i`), advancing *k. */
static void print_file(struct scan *s, const struct batch *b, size_t i, size_t *k)
{
    const struct vks_scan_result *r = &b->res;
    const char *path = b->files[i].path;
    const struct vks_buffer_result *br = i < r->n_buffers ? &r->buffers[i] : NULL;
    if (br == NULL || br->code != 0)
        warn_path(s, path, "%s (skipped)", br != NULL && br->message ? br->message : "no result");
    else if (br->truncated)
        warn_path(s, path, "%s",
                  "the daemon reported only the first max-hits matches: raise "
                  "max-hits in vkscand.conf or use --count");
    size_t n = 0;
    for (; *k < r->n_hits && r->hits[*k].buffer == i; (*k)++, n++) {
        const struct vks_hit *h = &r->hits[*k];
        const char *id = vks_catalog_rule_id(s->cat, h->rule);
        id = id != NULL ? id : "?";
        if (s->opt.out == OUT_LIST)
            continue;
        if (!s->opt.json && s->opt.out == OUT_COUNT) {
            printf("%s:%u:%s\n", path, h->count, id);
        } else if (!s->opt.json) {
            printf("%s:%llu:%s\n", path, (unsigned long long)h->end, id);
        } else {
            json_path(stdout, path);
            printf(",\"offset\":%llu,\"rule\":", (unsigned long long)h->end);
            cli_json_str(stdout, id, NULL);
            printf(",\"rule_index\":%u", h->rule);
            if (s->opt.out == OUT_COUNT)
                printf(",\"count\":%u", h->count);
            fputs("}\n", stdout);
        }
    }
    if (n > 0 && s->opt.out == OUT_LIST) {
        if (s->opt.json) {
            json_path(stdout, path);
            printf(",\"rules_matched\":%zu}\n", n);
        } else {
            printf("%s\n", path);
        }
    }
    s->hits += n;
    s->matched |= n > 0;
}

/* Prints a finished batch in file order and releases its files. */
static void batch_print(struct scan *s, struct batch *b)
{
    progress_clear(s);
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->rc == 0)
            print_file(s, b, i, &k);
        else
            warn_path(s, b->files[i].path, "%s (skipped)", b->err.msg);
        close(b->files[i].fd);
        free(b->files[i].path);
    }
    fflush(stdout);
    s->files += b->n;
    s->bytes += b->bytes;
    if (b->rc == 0)
        vks_scan_result_finish(&b->res);
    b->n = 0;
    b->bytes = 0;
    b->state = SLOT_FREE;
    progress_draw(s, false);
}

/* Starts one more worker thread on `c`; takes ownership of `c`, also on
 * failure. Main thread only (it alone counts the workers). */
static int worker_start(struct scan *s, struct vks_client *c)
{
    struct worker *w = &s->workers[s->n_workers];
    w->s = s;
    w->client = c;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        vks_client_close(c);
        return -EAGAIN;
    }
    s->n_workers++;
    return 0;
}

/* Hands the batch being filled to the workers and waits until the next slot
 * is free, printing finished batches in order on the way. Connections open
 * as batches need them: a scan of one batch uses one; without a connection
 * to spare (max-connections) the workers there are carry on. */
static void batch_submit(struct scan *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->slots[s->tail % s->n_slots].n > 0) {
        s->slots[s->tail % s->n_slots].state = SLOT_READY;
        s->tail++;
        pthread_cond_broadcast(&s->cv);
    }
    if (s->n_workers < s->opt.jobs && s->tail > s->n_workers) {
        struct vks_client *c;
        pthread_mutex_unlock(&s->mu);
        if (cli_daemon_connect(SCAN_IO_MS, true, &c) == 0)
            worker_start(s, c);
        pthread_mutex_lock(&s->mu);
    }
    for (;;) {
        struct batch *b = &s->slots[s->head % s->n_slots];
        if (s->head < s->tail && b->state == SLOT_DONE) {
            pthread_mutex_unlock(&s->mu);
            batch_print(s, b);
            pthread_mutex_lock(&s->mu);
            s->head++;
            continue;
        }
        if (s->tail - s->head < s->n_slots)
            break;
        pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Waits for every batch in flight and prints them in order. */
static void batch_drain(struct scan *s)
{
    batch_submit(s);
    pthread_mutex_lock(&s->mu);
    while (s->head < s->tail) {
        struct batch *b = &s->slots[s->head % s->n_slots];
        if (b->state != SLOT_DONE) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        batch_print(s, b);
        pthread_mutex_lock(&s->mu);
        s->head++;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Takes ownership of `fd` and `path`, also on failure. */
static void add_fd(struct scan *s, char *path, int fd, uint64_t offset, uint64_t size)
{
    if (path == NULL) {
        close(fd);
        warn_path(s, "vkscan", "%s", "out of memory");
        return;
    }
    if (size > s->max_bytes) {
        char b[32], m[32], msg[128];
        cli_fmt_bytes(size, b, sizeof(b));
        cli_fmt_bytes(s->max_bytes, m, sizeof(m));
        snprintf(msg, sizeof(msg),
                 "%s, more than vkscand scans in one request (%s): raise "
                 "max-scan-bytes",
                 b, m);
        warn_path(s, path, "%s (skipped)", msg);
        close(fd);
        free(path);
        return;
    }
    struct batch *b = &s->slots[s->tail % s->n_slots];
    if (b->n > 0 && (b->n == s->batch_files || b->bytes + size > s->batch_bytes)) {
        batch_submit(s);
        b = &s->slots[s->tail % s->n_slots];
    }
    b->files[b->n] = (struct file_ent){.path = path, .fd = fd, .size = size};
    b->bufs[b->n] =
        (struct vks_buffer){.kind = VKS_BUFFER_FD, .fd = fd, .offset = offset, .length = size};
    b->n++;
    b->bytes += size;
    /* A zero length means "to the end" on the wire: say 0 bytes another way. */
    if (size == 0)
        b->bufs[b->n - 1] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = "", .len = 0};
}

/* Copies a pipe, a terminal or a device into a memfd the daemon can read. */
static void add_stream(struct scan *s, const char *label, int in)
{
    int fd = memfd_create("vkscan-input", MFD_CLOEXEC);
    if (fd < 0) {
        warn_path(s, label, "cannot create a memfd: %s (skipped)", strerror(errno));
        return;
    }
    static char buf[1 << 16];
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (n > 0 && write(fd, buf, (size_t)n) != n)) {
            warn_path(s, label, "%s (skipped)", strerror(errno));
            close(fd);
            return;
        }
        if (n == 0)
            break;
        total += (uint64_t)n;
    }
    add_fd(s, strdup(label), fd, 0, total);
}

static void add_stdin(struct scan *s)
{
    struct stat st;
    if (fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode)) {
        off_t pos = lseek(STDIN_FILENO, 0, SEEK_CUR);
        int fd = dup(STDIN_FILENO);
        uint64_t size = (uint64_t)st.st_size;
        uint64_t off = pos <= 0 ? 0 : (uint64_t)pos < size ? (uint64_t)pos : size;
        if (fd >= 0) {
            add_fd(s, strdup(STDIN_LABEL), fd, off, size - off);
            return;
        }
    }
    add_stream(s, STDIN_LABEL, STDIN_FILENO);
}

/* Opens a regular file (or, named on the command line, any readable file). */
static void add_path(struct scan *s, const char *path, bool named)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        warn_path(s, path, "%s (skipped)", strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    if (S_ISREG(st.st_mode)) {
        add_fd(s, strdup(path), fd, 0, (uint64_t)st.st_size);
        return;
    }
    if (named && !S_ISDIR(st.st_mode)) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        add_stream(s, path, fd);
    }
    close(fd);
}

static int skip_dots(const struct dirent *d)
{
    return strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0;
}

/*
 * Walks a directory in name order. Symbolic links found on the way are
 * followed to files but not to directories (no loops), and a dangling one is
 * reported like any file that cannot be opened. Sockets, FIFOs and devices
 * met on the way are skipped.
 */
static void add_dir(struct scan *s, const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, skip_dots, alphasort);
    if (n < 0) {
        warn_path(s, dir, "%s (skipped)", strerror(errno));
        return;
    }
    size_t dlen = strlen(dir);
    bool slash = dlen > 0 && dir[dlen - 1] == '/';
    for (int i = 0; i < n; i++) {
        char *child = NULL;
        struct stat st;
        if (asprintf(&child, "%s%s%s", dir, slash ? "" : "/", names[i]->d_name) < 0)
            child = NULL;
        if (child == NULL) {
            warn_path(s, dir, "%s", "out of memory");
        } else if (lstat(child, &st) != 0) {
            warn_path(s, child, "%s (skipped)", strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            add_dir(s, child);
        } else if (S_ISLNK(st.st_mode)) {
            if (stat(child, &st) != 0)
                warn_path(s, child, "%s (skipped)", strerror(errno));
            else if (S_ISREG(st.st_mode))
                add_path(s, child, false);
        } else if (S_ISREG(st.st_mode)) {
            add_path(s, child, false);
        }
        free(child);
        free(names[i]);
    }
    free(names);
}

static void add_arg(struct scan *s, const char *arg)
{
    struct stat st;
    if (strcmp(arg, "-") == 0)
        add_stdin(s);
    else if (stat(arg, &st) != 0)
        warn_path(s, arg, "%s (skipped)", strerror(errno));
    else if (S_ISDIR(st.st_mode))
        add_dir(s, arg);
    else
        add_path(s, arg, true);
}

/* Descriptors held at once: every slot's files, plus a margin. */
static size_t fd_budget(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max && rl.rlim_cur < 65536) {
        rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur > 64 ? (size_t)rl.rlim_cur - 64 : 0;
}

/* Sizes batches from the daemon's limits: those of the hello libvkscan got
 * at connect, and the byte limits from stats. */
static void scan_limits(struct scan *s)
{
    struct vks_server_info info;
    struct vks_error err = {0};
    s->batch_files = BATCH_MAX_FILES;
    s->max_bytes = UINT64_MAX;
    if (vks_client_info(s->main, &info) == 0) {
        if (info.max_fds > 0 && info.max_fds < s->batch_files)
            s->batch_files = info.max_fds;
        if (info.max_buffers > 0 && info.max_buffers < s->batch_files)
            s->batch_files = info.max_buffers;
    }
    struct vks_stats st = {0};
    if (vks_client_stats(s->main, &st, &err) == 0) {
        const char *keys[] = {"limit.max_scan_bytes", "limit.tenant_max_bytes"};
        for (size_t i = 0; i < 2; i++) {
            const struct vks_stat *v = vks_stat_find(st.stats, st.n_stats, keys[i]);
            if (v != NULL && v->u > 0 && v->u < s->max_bytes)
                s->max_bytes = v->u;
        }
        vks_stats_finish(&st);
    }
    s->batch_bytes = BATCH_BYTES < s->max_bytes ? BATCH_BYTES : s->max_bytes;
    s->n_slots = 2 * (size_t)s->opt.jobs;
    size_t budget = fd_budget();
    while (s->n_slots > 1 && s->n_slots * s->batch_files > budget)
        s->n_slots--;
    while (s->batch_files > 1 && s->n_slots * s->batch_files > budget)
        s->batch_files /= 2;
}

/* Loads the rule file into the daemon; rejected rules are errors that do not
 * stop the scan (the other rules run). Returns 0 or an exit status. */
static int scan_load(struct scan *s)
{
    int rc = cli_read_file(s->opt.rules, &s->rules_text, &s->rules_len);
    if (rc != 0) {
        fprintf(stderr, "vkscan: cannot read %s: %s\n", s->opt.rules, strerror(-rc));
        return 2;
    }
    struct vks_error err = {0};
    rc = vks_client_catalog_load_text(s->main, s->rules_text, s->rules_len, NULL, &s->cat, &err);
    if (rc != 0) {
        fprintf(stderr, "vkscan: %s: %s\n", s->opt.rules, err.msg);
        return 2;
    }
    memcpy(s->fp, vks_catalog_fingerprint(s->cat), VKS_FP_LEN);
    for (size_t i = 0; i < vks_catalog_reject_count(s->cat); i++) {
        struct vks_reject r;
        if (vks_catalog_reject(s->cat, i, &r) == 0)
            cli_print_reject(s->opt.rules, r.line, r.pos, r.id, r.message);
        s->failed = true;
    }
    if (vks_catalog_rule_count(s->cat) == 0) {
        fprintf(stderr, "vkscan: %s: no rule could be compiled: fix the rules above\n",
                s->opt.rules);
        return 2;
    }
    return 0;
}

static int scan_start(struct scan *s)
{
    s->slots = calloc(s->n_slots, sizeof(*s->slots));
    if (s->slots == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < s->n_slots; i++) {
        s->slots[i].files = calloc(s->batch_files, sizeof(struct file_ent));
        s->slots[i].bufs = calloc(s->batch_files, sizeof(struct vks_buffer));
        if (s->slots[i].files == NULL || s->slots[i].bufs == NULL)
            return -ENOMEM;
    }
    /* The first worker scans on the connection that loaded the rules. */
    int rc = worker_start(s, s->main);
    s->main = NULL;
    return rc;
}

static void scan_finish(struct scan *s)
{
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (unsigned i = 0; i < s->n_workers; i++) {
        pthread_join(s->workers[i].thread, NULL);
        vks_client_close(s->workers[i].client);
    }
    for (size_t i = 0; s->slots != NULL && i < s->n_slots; i++) {
        free(s->slots[i].files);
        free(s->slots[i].bufs);
    }
    free(s->slots);
    vks_catalog_destroy(s->cat);
    vks_client_close(s->main);
    free(s->rules_text);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static int run_scan(struct scan_opts *opt, int n_paths, char **paths)
{
    struct scan s = {.opt = *opt};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    int status = cli_daemon_connect(SCAN_IO_MS, false, &s.main);
    if (status == 0)
        status = scan_load(&s);
    if (status == 0) {
        scan_limits(&s);
        if (scan_start(&s) != 0) {
            fprintf(stderr, "vkscan: out of memory or threads starting the scan\n");
            status = 2;
        }
    }
    if (status == 0) {
        s.progress = isatty(STDERR_FILENO);
        s.t0 = now_s();
        for (int i = 0; i < n_paths; i++)
            add_arg(&s, paths[i]);
        batch_drain(&s);
        if (s.progress && s.t0 + 1.0 < now_s()) {
            progress_draw(&s, true);
            fputc('\n', stderr);
            s.progress_shown = false;
        }
        status = s.failed ? 2 : s.matched ? 0 : 1;
    }
    scan_finish(&s);
    return status;
}

static void scan_usage(FILE *f)
{
    fprintf(f,
            "usage: vkscan scan -r RULES [options] PATH...\n"
            "  -r, --rules FILE          pattern file (ID:/regex/flags lines)\n"
            "      --json                JSON lines with every field\n"
            "  -c, --count               per file and rule: the number of matches\n"
            "      --first               only the first match per rule in each file\n"
            "  -l, --files-with-matches  only the names of files with a match\n"
            "  -j, --jobs N              scan requests in flight (default 4, 1..16)\n"
            "      --socket PATH         vkscand's socket (default $VKSCAN_SOCKET or %s)\n"
            "PATH may be a file, a directory (scanned recursively) or - for standard input.\n"
            "Exit status: 0 a match, 1 no match, 2 an error.\n",
            CLI_DEFAULT_SOCKET);
}

static int cmd_scan(int argc, char **argv)
{
    static const struct option longs[] = {{"rules", required_argument, NULL, 'r'},
                                          {"json", no_argument, NULL, 'J'},
                                          {"count", no_argument, NULL, 'c'},
                                          {"first", no_argument, NULL, 'F'},
                                          {"files-with-matches", no_argument, NULL, 'l'},
                                          {"jobs", required_argument, NULL, 'j'},
                                          {"socket", required_argument, NULL, 'S'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    struct scan_opts o = {.report = VKS_REPORT_ALL, .out = OUT_MATCHES, .jobs = 4};
    int c;
    while ((c = getopt_long(argc, argv, "r:clj:h", longs, NULL)) != -1) {
        switch (c) {
        case 'r':
            o.rules = optarg;
            break;
        case 'J':
            o.json = true;
            break;
        case 'c':
            o.out = o.out == OUT_LIST ? OUT_LIST : OUT_COUNT;
            break;
        case 'F':
            o.report = VKS_REPORT_FIRST;
            break;
        case 'l':
            o.out = OUT_LIST;
            break;
        case 'S':
            cli_socket_path = optarg;
            break;
        case 'j':
            o.jobs = (unsigned)strtoul(optarg, NULL, 10);
            if (o.jobs < 1 || o.jobs > MAX_JOBS) {
                fprintf(stderr, "vkscan: --jobs takes 1..%u\n", MAX_JOBS);
                return 2;
            }
            break;
        case 'h':
            scan_usage(stdout);
            return 0;
        default:
            scan_usage(stderr);
            return 2;
        }
    }
    if (o.rules == NULL || optind >= argc) {
        scan_usage(stderr);
        return 2;
    }
    if (o.out == OUT_COUNT)
        o.report = VKS_REPORT_COUNT;
    else if (o.out == OUT_LIST)
        o.report = VKS_REPORT_FIRST;
    return run_scan(&o, argc - optind, argv + optind);
}

/* ---- main ----------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkscan [--socket PATH] COMMAND [ARGS]\n"
            "  scan -r RULES [--json] [--count] [--first] [-l] PATH...\n"
            "                          scan files and directories through vkscand\n"
            "  status [--json | --prometheus]\n"
            "                          the daemon's version, devices, catalogs, queues\n"
            "  rules check FILE        compile a pattern file here and report\n"
            "  rules scan RULES PATH.. scan files here with the CPU reference scanner\n"
            "The socket is --socket, else $VKSCAN_SOCKET, else %s.\n"
            "See vkscan(1).\n",
            CLI_DEFAULT_SOCKET);
}

int main(int argc, char **argv)
{
    int i = 1;
    while (i < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
            cli_socket_path = argv[i + 1];
            i += 2;
        } else if (strncmp(argv[i], "--socket=", 9) == 0) {
            cli_socket_path = argv[i++] + 9;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("vkscan %s (libvkscan %s)\n", VKS_VERSION, vks_version());
            return 0;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (i < argc && strcmp(argv[i], "scan") == 0)
        return cmd_scan(argc - i, argv + i);
    if (i < argc && strcmp(argv[i], "status") == 0)
        return cli_status(argc - i, argv + i);
    if (i + 1 < argc && strcmp(argv[i], "rules") == 0) {
        if (strcmp(argv[i + 1], "check") == 0)
            return cli_rules_check(argc - i - 2, argv + i + 2);
        if (strcmp(argv[i + 1], "scan") == 0)
            return cli_rules_scan(argc - i - 2, argv + i + 2);
    }
    usage(stderr);
    return 2;
}
