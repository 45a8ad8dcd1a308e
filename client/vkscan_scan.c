/*
 * vkscan scan (vkscan_cli.h): files and directories through vkscand.
 *
 * `scan` opens every file itself and hands the daemon its descriptor, so the
 * daemon never opens a path with its own rights. Files are batched into scan
 * requests (up to the descriptor limit hello reports); several requests are in
 * flight at once, one per worker thread and connection, and their results are
 * printed in the order the files were found. Directories are walked by
 * vkscan_walk.c; the rules of all -r files and -e patterns are joined by
 * vkscan_ruleset.c; with -z, archives and compressed files are opened by
 * vkscan_archive.c and each member is scanned as a file of its own.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "vkscan/vkscan.h"
#include "vkscan_archive.h"
#include "vkscan_cli.h"
#include "patfile.h"
#include "vkscan_ruleset.h"
#include "vkscan_walk.h"

#define STDIN_LABEL     "(standard input)"
#define MAX_JOBS        16u
#define BATCH_MAX_FILES 64u                 /* descriptors per request, at most */
#define BATCH_BYTES     (64ull << 20)       /* bytes per request we aim for */
#define SCAN_IO_MS      (10u * 60u * 1000u) /* wait for one scan reply */
#define ARCHIVE_BYTES   (1ull << 30)        /* --max-archive-bytes by default */
#define STREAM_PIECE    (16ull << 20)       /* bytes per stream write read here, at most */
#define FILE_PIECE      (16ull << 20)       /* bytes per descriptor write of a large file */
#define STREAM_WINDOW   4                   /* a large file's stream writes in flight */
#define TAIL_POLL_US    200000u             /* --tail: sleep at the end of the file */

/* ---- output helpers ------------------------------------------------------- */

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

/* `{"type":"TYPE","path":"..."` with "path_base64" when the name is not
 * UTF-8: the start of every --json record about a file. */
static void json_path(FILE *f, const char *type, const char *path)
{
    bool lossy = false;
    fprintf(f, "{\"type\":\"%s\",\"path\":", type);
    cli_json_str(f, path, &lossy);
    if (lossy) {
        fputs(",\"path_base64\":\"", f);
        base64(f, (const unsigned char *)path, strlen(path));
        fputc('"', f);
    }
}

/* The "archive" and "member" fields of a record about a member of an
 * archive (path is ARCHIVE!MEMBER): nothing for a file of its own. */
static void json_member(FILE *f, const char *path, size_t archive_len)
{
    if (archive_len == 0)
        return;
    char *archive = strndup(path, archive_len);
    fputs(",\"archive\":", f);
    cli_json_str(f, archive != NULL ? archive : "", NULL);
    fputs(",\"member\":", f);
    cli_json_str(f, path + archive_len + 1, NULL);
    free(archive);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- vkscan scan: the batch pipeline ------------------------------------- */

enum out_mode { OUT_MATCHES, OUT_COUNT, OUT_LIST };

enum color_mode { COLOR_AUTO, COLOR_ALWAYS, COLOR_NEVER };

struct scan_opts {
    const char **rules; /* -r, in order (argv, borrowed) */
    size_t n_rules;
    const char **exprs; /* -e */
    size_t n_exprs;
    const char **globs; /* --glob, and --exclude as "!GLOB" */
    size_t n_globs;
    char **owned; /* the "!GLOB" strings made for --exclude */
    size_t n_owned;
    enum vks_report report;
    enum out_mode out;
    enum color_mode color_mode;
    bool json, quiet, line_numbers, stats, strict;
    bool search_zip; /* -z */
    struct walk_opts walk;
    uint64_t max_filesize;      /* 0: no limit */
    uint64_t max_archive_bytes; /* -z: what one archive may decompress to */
    unsigned jobs;
    bool tail;          /* --tail: follow one growing file until SIGINT */
    bool no_cache;      /* --no-cache: every file is read and scanned again */
    bool only_matching; /* -o: print the matched bytes (asks for every start) */
};

struct file_ent {
    char *path; /* as printed: ARCHIVE!MEMBER for a member of an archive */
    int fd;
    uint64_t offset, size;
    size_t archive_len; /* a member: the length of ARCHIVE in path; else 0 */
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
    struct vks_load_options load_opt; /* ids only */
    struct ruleset rs;
    struct walk *walk;
    bool color;
    bool telemetry; /* VKSCAN_TELEMETRY set */
    uint8_t fp[VKS_FP_LEN];
    struct vks_client *streams; /* stream.* requests (pipes, large files, --tail) */
    size_t batch_files;         /* files per request */
    uint64_t batch_bytes;
    uint64_t max_bytes; /* the daemon's per-request limit */
    bool starts;        /* -o, or a rule with flag L: pipes are read whole (streams have none) */

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
    uint64_t files, bytes, hits, rejected, errors;
    double t0, drawn_at;
    bool progress, progress_shown;
    bool printing; /* batch_print runs */
};

/* VKSCAN_TELEMETRY set: the reply's telemetry of each request on standard
 * error, one line (where a scan's time went: queue, fd reads, upload, run,
 * readback). */
static void print_telemetry(const struct batch *b, double rpc_s)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    fprintf(stderr, "vkscan: telemetry (%zu buffers): client_rpc_ns=%.0f", b->n, rpc_s * 1e9);
    for (size_t i = 0; i < b->res.n_telemetry; i++) {
        const struct vks_stat *t = &b->res.telemetry[i];
        if (t->is_float)
            fprintf(stderr, " %s=%g", t->key, t->f);
        else
            fprintf(stderr, " %s=%llu", t->key, (unsigned long long)t->u);
    }
    fputc('\n', stderr);
    pthread_mutex_unlock(&mu);
}

/* Scans one batch on a worker's connection. BUSY is retried with backoff;
 * UNKNOWN_CATALOG (the daemon evicted or restarted without its cache) loads
 * the rules again once. */
static int scan_batch(struct worker *w, struct batch *b)
{
    struct scan *s = w->s;
    struct vks_scan_options so;
    vks_scan_options_init(&so);
    so.mode = s->opt.report;
    so.no_cache = s->opt.no_cache;
    so.starts = s->opt.only_matching; /* rules without L need them too */
    bool reloaded = false;
    for (unsigned attempt = 0;; attempt++) {
        double t = now_s();
        int rc = vks_client_scan(w->client, s->fp, b->bufs, b->n, &so, &b->res, &b->err);
        if (rc == 0 && s->telemetry)
            print_telemetry(b, now_s() - t);
        if (rc == -VKS_E_BUSY && attempt < 8) {
            usleep(50000u << (attempt < 5 ? attempt : 5));
            continue;
        }
        if (rc != -VKS_E_UNKNOWN_CATALOG || reloaded)
            return rc;
        struct vks_catalog *cat = NULL;
        rc = vks_client_catalog_load_text(w->client, s->rs.text, s->rs.len, &s->load_opt, &cat,
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

/* A file that could not be scanned (`error`: exit status 2) or only a
 * warning, on stderr and, with --json, as a record. */
static void batch_drain(struct scan *s);

static void problem(struct scan *s, const char *path, const char *msg, bool error)
{
    /* What was found before this file prints before its message, as in grep:
     * errors are rare, so the pipeline may drain for them. */
    if (!s->printing && s->slots != NULL)
        batch_drain(s);
    progress_clear(s);
    fprintf(stderr, "vkscan: %s: %s\n", path, msg);
    if (s->opt.json && !s->opt.quiet) {
        json_path(stdout, error ? "error" : "warning", path);
        fputs(",\"message\":", stdout);
        cli_json_str(stdout, msg, NULL);
        fputs("}\n", stdout);
    }
    if (error) {
        s->failed = true;
        s->errors++;
    }
}

static void warn_path(struct scan *s, const char *path, const char *fmt, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof(msg), fmt, what);
    problem(s, path, msg, true);
}

/* Where -n counts lines in one file: `line` newlines before byte `pos`. */
struct line_cursor {
    uint64_t pos, line;
};

/* The line (from 1) of the last byte of a match that ends at `end`, read from
 * the file's own descriptor; hits come in end order, so the cursor only
 * moves forward but for a rare step back. */
static uint64_t line_of(const struct file_ent *fe, struct line_cursor *c, uint64_t end)
{
    uint64_t target = end > 0 ? end - 1 : 0;
    target = target < fe->size ? target : fe->size;
    if (target < c->pos)
        *c = (struct line_cursor){0};
    char buf[1 << 16];
    while (c->pos < target) {
        size_t want = target - c->pos < sizeof(buf) ? (size_t)(target - c->pos) : sizeof(buf);
        ssize_t got = pread(fe->fd, buf, want, (off_t)(fe->offset + c->pos));
        if (got <= 0)
            break;
        for (const char *p = buf; (p = memchr(p, '\n', (size_t)(buf + got - p))) != NULL; p++)
            c->line++;
        c->pos += (uint64_t)got;
    }
    return c->line + 1;
}

/* One match (or, with -c, one rule's count) as text. */
static void print_text_hit(const struct scan *s, const char *path, const struct vks_hit *h,
                           const char *id, uint64_t line)
{
    const char *mag = s->color ? "\033[35m" : "", *grn = s->color ? "\033[32m" : "";
    const char *red = s->color ? "\033[1;31m" : "", *off = s->color ? "\033[0m" : "";
    printf("%s%s%s:", mag, path, off);
    if (s->opt.out == OUT_COUNT) {
        printf("%s%s%s:%u\n", red, id, off, h->count);
        return;
    }
    if (line > 0)
        printf("%s%llu%s:", grn, (unsigned long long)line, off);
    printf("%llu:%s%s%s\n", (unsigned long long)h->end, red, id, off);
}

/* -o: the bytes [start, end) of a file, escaped so that a line stays one
 * line: printable ASCII as itself, \\ \t \n \r, any other byte as \xHH;
 * with `json`, as the inside of a JSON string (other bytes as \u00HH). */
static void print_bytes(const struct file_ent *fe, uint64_t start, uint64_t end, bool json)
{
    uint8_t buf[1 << 16];
    for (uint64_t at = start; at < end;) {
        size_t want = end - at < sizeof(buf) ? (size_t)(end - at) : sizeof(buf);
        ssize_t got = pread(fe->fd, buf, want, (off_t)(fe->offset + at));
        if (got <= 0)
            return; /* the file shrank: print what there was */
        for (ssize_t i = 0; i < got; i++) {
            uint8_t c = buf[i];
            if (c == '\\' || (json && c == '"'))
                printf("\\%c", c);
            else if (c == '\t' || c == '\n' || c == '\r')
                printf("\\%c", c == '\t' ? 't' : c == '\n' ? 'n' : 'r');
            else if (c >= 0x20 && c < 0x7f)
                putchar(c);
            else
                printf(json ? "\\u%04x" : "\\x%02x", c);
        }
        at += (uint64_t)got;
    }
}

/* -o: one match as PATH:[LINE:]START-END:RULE:BYTES. */
static void print_only_hit(const struct scan *s, const struct file_ent *fe, const struct vks_hit *h,
                           const char *id, uint64_t line)
{
    if (h->start == VKS_NO_START) { /* a daemon without starts */
        print_text_hit(s, fe->path, h, id, line);
        return;
    }
    const char *mag = s->color ? "\033[35m" : "", *grn = s->color ? "\033[32m" : "";
    const char *red = s->color ? "\033[1;31m" : "", *off = s->color ? "\033[0m" : "";
    printf("%s%s%s:", mag, fe->path, off);
    if (line > 0)
        printf("%s%llu%s:", grn, (unsigned long long)line, off);
    printf("%llu-%llu:%s:%s", (unsigned long long)h->start, (unsigned long long)h->end, id, red);
    print_bytes(fe, h->start, h->end, false);
    printf("%s\n", off);
}

static void print_json_hit(const struct scan *s, const struct file_ent *fe, const struct vks_hit *h,
                           const char *id, uint64_t line)
{
    json_path(stdout, "match", fe->path);
    json_member(stdout, fe->path, fe->archive_len);
    printf(",\"offset\":%llu", (unsigned long long)h->end);
    if (line > 0)
        printf(",\"line_number\":%llu", (unsigned long long)line);
    fputs(",\"rule\":", stdout);
    cli_json_str(stdout, id, NULL);
    printf(",\"rule_index\":%u", h->rule);
    if (s->opt.out == OUT_COUNT)
        printf(",\"count\":%u", h->count);
    if (h->start != VKS_NO_START && s->opt.out != OUT_COUNT)
        printf(",\"start\":%llu", (unsigned long long)h->start);
    if (h->start != VKS_NO_START && s->opt.only_matching && fe->fd >= 0) {
        fputs(",\"text\":\"", stdout);
        print_bytes(fe, h->start, h->end, true);
        putchar('"');
    }
    fputs("}\n", stdout);
}

/* Prints one file's hits (res->hits[*k..] for buffer `i`), advancing *k. */
static void print_file(struct scan *s, const struct batch *b, size_t i, size_t *k)
{
    const struct vks_scan_result *r = &b->res;
    const struct file_ent *fe = &b->files[i];
    const struct vks_buffer_result *br = i < r->n_buffers ? &r->buffers[i] : NULL;
    if (br == NULL || br->code != 0)
        warn_path(s, fe->path, "%s (skipped)",
                  br != NULL && br->message ? br->message : "no result");
    else if (br->truncated)
        warn_path(s, fe->path, "%s",
                  "the daemon reported only the first matches (past max-hits, or "
                  "past what one reply holds): use --count, or raise max-hits in "
                  "vkscand.conf");
    bool print = !s->opt.quiet && s->opt.out != OUT_LIST;
    bool lines = s->opt.line_numbers && s->opt.out == OUT_MATCHES;
    struct line_cursor lc = {0};
    size_t n = 0;
    for (; *k < r->n_hits && r->hits[*k].buffer == i; (*k)++, n++) {
        const struct vks_hit *h = &r->hits[*k];
        s->hits += s->opt.out == OUT_COUNT ? h->count : 1;
        if (!print)
            continue;
        const char *id = vks_catalog_rule_id(s->cat, h->rule);
        id = id != NULL ? id : "?";
        uint64_t line = lines ? line_of(fe, &lc, h->end) : 0;
        if (s->opt.json)
            print_json_hit(s, fe, h, id, line);
        else if (s->opt.only_matching && s->opt.out == OUT_MATCHES)
            print_only_hit(s, fe, h, id, line);
        else
            print_text_hit(s, fe->path, h, id, line);
    }
    if (n > 0 && s->opt.out == OUT_LIST && !s->opt.quiet) {
        if (s->opt.json) {
            json_path(stdout, "match", fe->path);
            json_member(stdout, fe->path, fe->archive_len);
            printf(",\"rules_matched\":%zu}\n", n);
        } else {
            printf("%s%s%s\n", s->color ? "\033[35m" : "", fe->path, s->color ? "\033[0m" : "");
        }
    }
    s->matched |= n > 0;
}

/* Prints a finished batch in file order and releases its files. */
static void batch_print(struct scan *s, struct batch *b)
{
    s->printing = true;
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
    s->printing = false;
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

/* ---- streams: pipes, files over max-scan-bytes, --tail ------------------ */

/*
 * One input scanned as a stream (docs/protocol.md, "Streams"): its bytes go
 * to vkscand in writes as they are read, and a match that straddles two
 * reads is found all the same. Nothing is buffered past one write.
 */
struct sink {
    const char *path;
    struct vks_stream *st;
    uint64_t start;     /* stream offset of the current write */
    uint64_t lines;     /* '\n' before `start` (-n) */
    uint8_t prev[2];    /* the two bytes before `start` (prev[1] the last) */
    const uint8_t *buf; /* the current write */
    size_t len;
    size_t cur; /* -n: newlines of buf[0..cur) are in `cur_lines` */
    uint64_t cur_lines;
    uint32_t *count;   /* -c: matches per rule */
    uint8_t *seen;     /* --first, -l: the rule matched */
    uint32_t *order;   /* -c: rules in order of their first match */
    size_t n_order, n; /* n: matches reported */
};

/* The line (from 1) of the byte before `end`. Hits of a write end at most
 * two bytes before it (a match that waited for the next byte). */
static uint64_t sink_line(struct sink *k, uint64_t end)
{
    uint64_t last = end > 0 ? end - 1 : 0;
    if (last + 2 == k->start)
        return k->lines + 1 - (k->prev[0] == '\n') - (k->prev[1] == '\n');
    if (last + 1 == k->start)
        return k->lines + 1 - (k->prev[1] == '\n');
    size_t at = (size_t)(last - k->start);
    at = at < k->len ? at : k->len;
    if (at < k->cur) {
        k->cur = 0;
        k->cur_lines = 0;
    }
    for (; k->cur < at; k->cur++)
        k->cur_lines += k->buf[k->cur] == '\n';
    return k->lines + k->cur_lines + 1;
}

/* The write is done: its bytes move behind `start`. */
static void sink_advance(struct sink *k)
{
    for (size_t i = 0; i < k->len; i++)
        k->lines += k->buf[i] == '\n';
    if (k->len >= 2)
        memcpy(k->prev, k->buf + k->len - 2, 2);
    else if (k->len == 1) {
        k->prev[0] = k->prev[1];
        k->prev[1] = k->buf[0];
    }
    k->start += k->len;
    k->buf = NULL;
    k->len = k->cur = 0;
    k->cur_lines = 0;
}

/* Prints (or, with -c and -l, counts) the matches of one write or close. */
static void sink_hits(struct scan *s, struct sink *k, const struct vks_scan_result *r)
{
    struct file_ent fe = {.path = (char *)k->path};
    bool print = !s->opt.quiet && s->opt.out == OUT_MATCHES;
    for (size_t i = 0; i < r->n_hits; i++) {
        const struct vks_hit *h = &r->hits[i];
        bool first = !k->seen[h->rule];
        k->seen[h->rule] = 1;
        if (s->opt.out == OUT_COUNT) {
            if (first)
                k->order[k->n_order++] = h->rule;
            k->count[h->rule] += h->count; /* the stream counts in vkscand */
            continue;
        }
        if (s->opt.report == VKS_REPORT_FIRST && !first)
            continue;
        k->n++;
        s->hits++;
        if (!print)
            continue;
        const char *id = vks_catalog_rule_id(s->cat, h->rule);
        id = id != NULL ? id : "?";
        uint64_t line = s->opt.line_numbers ? sink_line(k, h->end) : 0;
        if (s->opt.json)
            print_json_hit(s, &fe, h, id, line);
        else
            print_text_hit(s, k->path, h, id, line);
    }
    if (r->n_buffers > 0 && r->buffers[0].truncated)
        problem(s, k->path,
                "a write had more matches than the daemon reports (max-hits): raise max-hits in "
                "vkscand.conf",
                true);
    fflush(stdout);
}

/* -c and -l: what only the end of the input can say. */
static void sink_summary(struct scan *s, struct sink *k)
{
    struct file_ent fe = {.path = (char *)k->path};
    for (size_t i = 0; i < k->n_order; i++) {
        struct vks_hit h = {
            .rule = k->order[i], .count = k->count[k->order[i]], .start = VKS_NO_START};
        s->hits += h.count;
        k->n++;
        const char *id = vks_catalog_rule_id(s->cat, h.rule);
        if (s->opt.quiet)
            continue;
        if (s->opt.json)
            print_json_hit(s, &fe, &h, id != NULL ? id : "?", 0);
        else
            print_text_hit(s, k->path, &h, id != NULL ? id : "?", 0);
    }
    if (k->n > 0 && s->opt.out == OUT_LIST && !s->opt.quiet) {
        if (s->opt.json) {
            json_path(stdout, "match", k->path);
            printf(",\"rules_matched\":%zu}\n", k->n);
        } else {
            printf("%s%s%s\n", s->color ? "\033[35m" : "", k->path, s->color ? "\033[0m" : "");
        }
    }
    s->matched |= k->n > 0;
    fflush(stdout);
}

/* Opens the stream of one input (on its own connection, made once). */
static int sink_open(struct scan *s, struct sink *k, const char *path)
{
    size_t nr = vks_catalog_rule_count(s->cat);
    *k = (struct sink){.path = path};
    k->count = calloc(nr + 1, sizeof(*k->count));
    k->seen = calloc(nr + 1, 1);
    k->order = calloc(nr + 1, sizeof(*k->order));
    if (k->count == NULL || k->seen == NULL || k->order == NULL) {
        warn_path(s, path, "%s (skipped)", "out of memory");
        return -ENOMEM;
    }
    if (s->streams == NULL && cli_daemon_connect(SCAN_IO_MS, false, &s->streams) != 0) {
        s->failed = true;
        s->errors++;
        return -ECONNREFUSED;
    }
    /* -c, -l and --first need a count per rule, not every match: the
     * daemon counts, and a hit-dense input does not come back match by
     * match (nor past max-hits) */
    struct vks_stream_options so;
    vks_stream_options_init(&so);
    so.mode = s->opt.report == VKS_REPORT_ALL ? VKS_REPORT_ALL : VKS_REPORT_COUNT;
    struct vks_error err = {0};
    int rc = vks_stream_open(s->streams, s->fp, &so, &k->st, &err);
    if (rc != 0)
        warn_path(s, path, "%s (skipped)", err.msg);
    else if (s->opt.only_matching && s->opt.out == OUT_MATCHES && !s->opt.quiet)
        problem(s, path,
                "read as a stream (a pipe, /proc, --tail or over max-scan-bytes), which has no "
                "match starts: -o prints its matches without their bytes",
                false);
    return rc;
}

/* Scans `len` bytes at `buf` (or, with buf NULL, of `fd` from `offset`). */
static int sink_write(struct scan *s, struct sink *k, const uint8_t *buf, int fd, uint64_t offset,
                      size_t len)
{
    struct vks_scan_result r;
    struct vks_error err = {0};
    int rc = buf != NULL ? vks_stream_write(k->st, buf, len, &r, &err)
                         : vks_stream_write_fd(k->st, fd, offset, len, &r, &err);
    if (rc != 0) {
        warn_path(s, k->path, "%s (the rest is not scanned)", err.msg);
        return rc;
    }
    k->buf = buf;
    k->len = buf != NULL ? len : 0;
    sink_hits(s, k, &r);
    vks_scan_result_finish(&r);
    if (buf == NULL) /* -n needs the bytes: fd writes are read back for it */
        k->start += len;
    else
        sink_advance(k);
    s->bytes += len;
    return 0;
}

/* The reply of the stream's oldest write in flight, a descriptor write of
 * `len` bytes sent with vks_stream_write_fd_send. */
static int sink_recv(struct scan *s, struct sink *k, size_t len)
{
    struct vks_scan_result r;
    struct vks_error err = {0};
    int rc = vks_stream_write_recv(k->st, &r, &err);
    if (rc != 0) {
        warn_path(s, k->path, "%s (the rest is not scanned)", err.msg);
        return rc;
    }
    k->buf = NULL;
    k->len = 0;
    sink_hits(s, k, &r);
    vks_scan_result_finish(&r);
    k->start += len;
    s->bytes += len;
    return 0;
}

/* After a failed write: takes the replies of the writes still in flight
 * (errors once one failed: docs/protocol.md "Streams"), so the close that
 * follows is not refused for them. */
static void sink_drain(struct sink *k)
{
    for (uint32_t n = k->st != NULL ? vks_stream_inflight(k->st) : 0; n > 0; n--) {
        struct vks_scan_result r;
        struct vks_error err = {0};
        if (vks_stream_write_recv(k->st, &r, &err) == 0)
            vks_scan_result_finish(&r);
    }
}

/* Ends the stream: the matches only the end decides, and -c / -l. */
static void sink_close(struct scan *s, struct sink *k, bool ok)
{
    struct vks_scan_result r;
    struct vks_error err = {0};
    if (k->st != NULL) {
        int rc = vks_stream_close(k->st, ok ? &r : NULL, &err);
        if (rc != 0 && ok)
            warn_path(s, k->path, "%s", err.msg);
        else if (ok) {
            sink_hits(s, k, &r);
            vks_scan_result_finish(&r);
        }
        if (ok)
            sink_summary(s, k);
        s->files++;
    }
    free(k->count);
    free(k->seen);
    free(k->order);
}

/* A pipe, a terminal or a file whose size cannot be trusted: read and
 * written piece by piece. Borrows `in`. */
static void stream_input(struct scan *s, const char *label, int in)
{
    batch_drain(s); /* what came before prints first */
    struct sink k;
    bool ok = sink_open(s, &k, label) == 0;
    size_t cap = s->max_bytes < (1u << 20) ? (size_t)s->max_bytes : (1u << 20);
    uint8_t *buf = ok ? malloc(cap) : NULL;
    ok = ok && buf != NULL;
    while (ok) {
        ssize_t n = read(in, buf, cap);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            warn_path(s, label, "%s (the rest is not scanned)", strerror(errno));
            ok = false;
        }
        if (n <= 0)
            break;
        ok = sink_write(s, &k, buf, -1, 0, (size_t)n) == 0;
    }
    sink_close(s, &k, ok);
    free(buf);
}

/* A file over the daemon's max-scan-bytes: its descriptor in pieces of at
 * most that many bytes (and FILE_PIECE), STREAM_WINDOW of them in flight, so that vkscand
 * begins a piece while the middle of the one before is on the GPU
 * (docs/engine.md "Streams"). With -n the pieces are read here too (for
 * the line count), one at a time. Takes ownership of `fd` and `path`. */
static void stream_file(struct scan *s, char *path, int fd, uint64_t offset, uint64_t size)
{
    batch_drain(s);
    struct sink k;
    bool ok = sink_open(s, &k, path) == 0;
    /* by descriptor no byte passes through here. 16 MiB is the most of a
     * catalog with unbounded groups whose middle vkscand sends to the GPU
     * (STREAMSCAN_WHOLE_READ_MAX), and no slower than 256 MiB for bounded
     * catalogs (docs/PERFORMANCE.md "Session 47"); read here (-n), a piece
     * is a buffer of ours */
    uint64_t want = s->opt.line_numbers ? STREAM_PIECE : FILE_PIECE;
    uint64_t piece = s->max_bytes < want ? s->max_bytes : want;
    if (!s->opt.line_numbers) {
        for (uint64_t sent = 0, done = 0; ok && done < size;) {
            if (sent < size && vks_stream_inflight(k.st) < STREAM_WINDOW) {
                uint64_t n = size - sent < piece ? size - sent : piece;
                struct vks_error err = {0};
                ok = vks_stream_write_fd_send(k.st, fd, offset + sent, n, &err) == 0;
                if (!ok)
                    warn_path(s, path, "%s (the rest is not scanned)", err.msg);
                sent += n;
                continue;
            }
            size_t n = (size_t)(size - done < piece ? size - done : piece);
            ok = sink_recv(s, &k, n) == 0;
            done += n;
        }
        if (!ok)
            sink_drain(&k);
        sink_close(s, &k, ok);
        close(fd);
        free(path);
        return;
    }
    uint8_t *buf = ok ? malloc((size_t)piece) : NULL;
    ok = ok && buf != NULL;
    for (uint64_t at = 0; ok && at < size; at += piece) {
        size_t n = (size_t)(size - at < piece ? size - at : piece);
        if (buf != NULL && pread(fd, buf, n, (off_t)(offset + at)) != (ssize_t)n) {
            warn_path(s, path, "%s (the rest is not scanned)", "short read");
            ok = false;
            break;
        }
        ok = sink_write(s, &k, buf, fd, offset + at, n) == 0;
    }
    sink_close(s, &k, ok);
    free(buf);
    close(fd);
    free(path);
}

static volatile sig_atomic_t tail_stop;

static void on_sigint(int sig)
{
    (void)sig;
    tail_stop = 1;
}

/* --tail FILE: scans what the file holds, then what is appended to it, as
 * `tail -f` shows it, until SIGINT; then closes the stream (its last
 * matches) and returns. A file that shrinks is read again from its start. */
static void tail_file(struct scan *s, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        warn_path(s, path, "%s (skipped)", strerror(errno));
        return;
    }
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old); /* no SA_RESTART: the sleep ends at once */
    struct sink k;
    bool ok = sink_open(s, &k, path) == 0;
    size_t cap = s->max_bytes < (1u << 20) ? (size_t)s->max_bytes : (1u << 20);
    uint8_t *buf = ok ? malloc(cap) : NULL;
    ok = ok && buf != NULL;
    uint64_t at = 0;
    while (ok && !tail_stop) {
        ssize_t n = pread(fd, buf, cap, (off_t)at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            warn_path(s, path, "%s (stopped)", strerror(errno));
            ok = false;
        } else if (n == 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (uint64_t)st.st_size < at) {
                problem(s, path, "file truncated: following it from its new end", false);
                at = (uint64_t)st.st_size;
            }
            usleep(TAIL_POLL_US);
        } else {
            ok = sink_write(s, &k, buf, -1, 0, (size_t)n) == 0;
            at += (uint64_t)n;
        }
    }
    sink_close(s, &k, ok);
    sigaction(SIGINT, &old, NULL);
    free(buf);
    close(fd);
}

/* Takes ownership of `fd` and `path`, also on failure; `archive_len` as in
 * struct file_ent. */
static void add_fd_at(struct scan *s, char *path, int fd, uint64_t offset, uint64_t size,
                      size_t archive_len)
{
    if (path == NULL) {
        close(fd);
        warn_path(s, "vkscan", "%s", "out of memory");
        return;
    }
    if (size > s->max_bytes && archive_len == 0) {
        stream_file(s, path, fd, offset, size); /* in pieces, as a stream */
        return;
    }
    if (size > s->max_bytes) {
        char b[32], m[32], msg[160];
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
    b->files[b->n] = (struct file_ent){
        .path = path, .fd = fd, .offset = offset, .size = size, .archive_len = archive_len};
    b->bufs[b->n] =
        (struct vks_buffer){.kind = VKS_BUFFER_FD, .fd = fd, .offset = offset, .length = size};
    b->n++;
    b->bytes += size;
    /* A zero length means "to the end" on the wire: say 0 bytes another way. */
    if (size == 0)
        b->bufs[b->n - 1] = (struct vks_buffer){.kind = VKS_BUFFER_INLINE, .data = "", .len = 0};
}

static void add_fd(struct scan *s, char *path, int fd, uint64_t offset, uint64_t size)
{
    add_fd_at(s, path, fd, offset, size, 0);
}

/* ---- -z: members of archives and compressed files ------------------------ */

static void unpacked_member(void *ctx, const char *name, size_t archive_len, int fd, uint64_t size)
{
    add_fd_at(ctx, strdup(name), fd, 0, size, archive_len);
}

static void unpack_problem(void *ctx, const char *name, const char *msg)
{
    problem(ctx, name, msg, true);
}

/* A whole file at offset 0 of `fd`: with -z, an archive or a compressed
 * file is read member by member (its own bytes are not scanned); anything
 * else is scanned as it is. Takes ownership of `fd` and `path`. */
static void add_file(struct scan *s, char *path, int fd, uint64_t size)
{
    if (!s->opt.search_zip || path == NULL || !unpack_sniff(fd)) {
        add_fd(s, path, fd, 0, size);
        return;
    }
    const struct unpack_limits lim = {.member_max = s->max_bytes,
                                      .total_max = s->opt.max_archive_bytes};
    const struct unpack_visitor v = {
        .ctx = s, .member = unpacked_member, .problem = unpack_problem};
    unpack_members(fd, path, &lim, &v);
    close(fd);
    free(path);
}

/*
 * Copies a pipe, a terminal, a device or a file whose size cannot be trusted
 * (procfs, sysfs: st_size is 0 or a page) into a memfd the daemon can read,
 * up to the daemon's max-scan-bytes. Borrows `in`.
 */
static void add_stream(struct scan *s, const char *label, int in)
{
    /* Standard input and pipes are streams: no end is known in advance.
     * -z must see the whole input to unpack it, and starts (-o, flag L) need
     * whole buffers; a device or a procfs file keeps the max-scan-bytes
     * bound (/dev/zero would never end). */
    struct stat st;
    bool pipe_like = in == STDIN_FILENO ||
                     (fstat(in, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)));
    if (!s->opt.search_zip && pipe_like && !s->starts) {
        stream_input(s, label, in);
        return;
    }
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
        if (total > s->max_bytes) {
            char m[32], msg[200];
            cli_fmt_bytes(s->max_bytes, m, sizeof(m));
            snprintf(msg, sizeof(msg),
                     "more than vkscand scans in one request (%s) read from it: raise "
                     "max-scan-bytes (skipped)",
                     m);
            problem(s, label, msg, true);
            close(fd);
            return;
        }
    }
    add_file(s, strdup(label), fd, total);
}

static void add_stdin(struct scan *s)
{
    struct stat st;
    if (fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        off_t pos = lseek(STDIN_FILENO, 0, SEEK_CUR);
        int fd = dup(STDIN_FILENO);
        uint64_t size = (uint64_t)st.st_size;
        uint64_t off = pos <= 0 ? 0 : (uint64_t)pos < size ? (uint64_t)pos : size;
        if (fd >= 0 && off == 0) {
            add_file(s, strdup(STDIN_LABEL), fd, size);
            return;
        }
        if (fd >= 0) {
            add_fd(s, strdup(STDIN_LABEL), fd, off, size - off);
            return;
        }
    }
    add_stream(s, STDIN_LABEL, STDIN_FILENO);
}

/* Whether a regular file's st_size may be wrong: a file system whose files
 * are made up when read. */
static bool size_untrusted(int fd, const struct stat *st)
{
    struct statfs fs;
    if (st->st_size == 0)
        return true;
    if (fstatfs(fd, &fs) != 0)
        return false;
    switch ((unsigned long)fs.f_type) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
        return true;
    default:
        return false;
    }
}

/* Opens a regular file (or, named on the command line, any readable file
 * but a directory). A file already scanned (two links to it) is not again. */
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
    bool regular = S_ISREG(st.st_mode);
    if ((!regular && (!named || S_ISDIR(st.st_mode))) ||
        walk_seen_file(s->walk, st.st_dev, st.st_ino) ||
        (regular && s->opt.max_filesize > 0 && (uint64_t)st.st_size > s->opt.max_filesize)) {
        close(fd);
        return;
    }
    if (regular && !size_untrusted(fd, &st)) {
        add_file(s, strdup(path), fd, (uint64_t)st.st_size);
        return;
    }
    /* Only what the user named may block (a FIFO waits for its writer); a
     * walk that meets a file such as /proc/kmsg gets EAGAIN, not a hang. */
    if (named)
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    add_stream(s, path, fd);
    close(fd);
}

static void walk_file(void *ctx, const char *path)
{
    struct scan *s = ctx;
    add_path(s, path, false);
    if (s->opt.quiet && s->matched)
        walk_stop(s->walk); /* -q: the exit status is known */
}

static void walk_problem(void *ctx, const char *path, const char *msg, bool error)
{
    problem(ctx, path, msg, error);
}

static void add_arg(struct scan *s, const char *arg)
{
    struct stat st;
    if (strcmp(arg, "-") == 0) {
        add_stdin(s);
    } else if (stat(arg, &st) != 0) {
        int e = errno;
        if (lstat(arg, &st) == 0 && S_ISLNK(st.st_mode))
            problem(s, arg, "dangling symbolic link (skipped)", false);
        else
            warn_path(s, arg, "%s (skipped)", strerror(e));
    } else if (S_ISDIR(st.st_mode)) {
        const struct walk_visitor v = {.ctx = s, .file = walk_file, .problem = walk_problem};
        walk_dir(s->walk, arg, &v);
    } else {
        add_path(s, arg, true);
    }
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

/* A rejected rule, once, on stderr (and as a --json record). */
static void print_reject(struct scan *s, const struct vks_reject *r)
{
    const char *file;
    uint32_t line;
    ruleset_where(&s->rs, r->line, &file, &line);
    fputs("vkscan: warning: ", stderr);
    cli_print_reject(file, line, r->pos, r->id, r->message);
    if (s->opt.json && !s->opt.quiet) {
        fputs("{\"type\":\"reject\",\"file\":", stdout);
        cli_json_str(stdout, file, NULL);
        printf(",\"line\":%u,\"column\":%u,\"rule\":", line, r->pos + 1);
        cli_json_str(stdout, r->id, NULL);
        fputs(",\"message\":", stdout);
        cli_json_str(stdout, r->message, NULL);
        fputs("}\n", stdout);
    }
    s->rejected++;
}

/* Whether some rule has flag L: the daemon refuses such a catalog for
 * streams, so pipes are then read whole into a memfd. */
/* Whether a line of the pattern text may end in flags holding `L`: the
 * letters after its last '/', '"' or '}' (a regex's, literal's or hex
 * string's flags), trailing blanks left out. Over-approximates: a line it
 * passes is parsed. */
static bool may_want_starts(const char *text, size_t len)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl != NULL ? nl : end;
        const char *z = e;
        while (z > p && (z[-1] == ' ' || z[-1] == '\t' || z[-1] == '\r'))
            z--;
        bool L = false;
        const char *a = z;
        while (a > p && isalpha((unsigned char)a[-1]))
            L |= *--a == 'L';
        if (L && a > p && (a[-1] == '/' || a[-1] == '"' || a[-1] == '}'))
            return true;
        p = e + 1;
    }
    return false;
}

static bool wants_starts(const struct ruleset *rs)
{
    if (!may_want_starts(rs->text, rs->len))
        return false; /* no second parse of a large rule file */
    struct patfile pf;
    bool any = false;
    if (patfile_parse(rs->text, rs->len, &pf, NULL) == 0) {
        for (size_t i = 0; i < pf.n && !any; i++)
            any = (pf.rules[i].flags & RULE_F_SOMLEFT) != 0;
    }
    patfile_finish(&pf);
    return any;
}

/* Loads every -r file and -e pattern into the daemon as one catalog;
 * rejected rules are warnings (the other rules run). Returns 0 or an exit
 * status. */
static int scan_load(struct scan *s)
{
    int rc = ruleset_gather(&s->rs, s->opt.rules, s->opt.n_rules, s->opt.exprs, s->opt.n_exprs);
    if (rc != 0)
        return rc;
    const char *what = s->opt.n_rules == 1 && s->opt.n_exprs == 0 ? s->opt.rules[0] : "the rules";
    struct vks_error err = {0};
    /* the command prints rule ids, never their fingerprints: 0.4 MB of reply
     * for 43 k rules instead of 1.9 */
    vks_load_options_init(&s->load_opt);
    s->load_opt.ids_only = true;
    rc = vks_client_catalog_load_text(s->main, s->rs.text, s->rs.len, &s->load_opt, &s->cat, &err);
    if (rc != 0) {
        fprintf(stderr, "vkscan: %s: %s\n", what, err.msg);
        return 2;
    }
    memcpy(s->fp, vks_catalog_fingerprint(s->cat), VKS_FP_LEN);
    s->starts = s->opt.only_matching || wants_starts(&s->rs);
    for (size_t i = 0; i < vks_catalog_reject_count(s->cat); i++) {
        struct vks_reject r;
        if (vks_catalog_reject(s->cat, i, &r) == 0)
            print_reject(s, &r);
    }
    if (vks_catalog_rule_count(s->cat) == 0) {
        fprintf(stderr, "vkscan: %s: no rule could be compiled: fix the rules above\n", what);
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
    vks_client_close(s->streams);
    ruleset_finish(&s->rs);
    walk_destroy(s->walk);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

/* --stats (text) and the --json summary record. */
static void print_summary(const struct scan *s, double secs)
{
    double gbps = secs > 0 ? (double)s->bytes / secs / 1e9 : 0;
    if (s->opt.json) {
        printf("{\"type\":\"summary\",\"files\":%llu,\"bytes\":%llu,\"matches\":%llu,"
               "\"rejected_rules\":%llu,\"errors\":%llu,\"elapsed_s\":%.6f,\"gbps\":%.3f}\n",
               (unsigned long long)s->files, (unsigned long long)s->bytes,
               (unsigned long long)s->hits, (unsigned long long)s->rejected,
               (unsigned long long)s->errors, secs, gbps);
        return;
    }
    printf("\n%llu matches\n%llu files scanned\n%llu bytes scanned\n%llu rules rejected\n"
           "%llu errors\n%.6f seconds elapsed\n%.3f GB/s\n",
           (unsigned long long)s->hits, (unsigned long long)s->files, (unsigned long long)s->bytes,
           (unsigned long long)s->rejected, (unsigned long long)s->errors, secs, gbps);
}

/* grep's exit status: a match 0, none 1, a file not scanned 2 (-q: a match
 * is 0 all the same); --strict: a rejected rule is 2 as well. */
static int scan_status(const struct scan *s)
{
    if (s->opt.strict && s->rejected > 0)
        return 2;
    if (s->opt.quiet && s->matched)
        return 0;
    return s->failed ? 2 : s->matched ? 0 : 1;
}

static bool color_wanted(enum color_mode m)
{
    if (m != COLOR_AUTO)
        return m == COLOR_ALWAYS;
    const char *term = getenv("TERM");
    return isatty(STDOUT_FILENO) && getenv("NO_COLOR") == NULL && term != NULL &&
           strcmp(term, "dumb") != 0;
}

static int run_scan(struct scan_opts *opt, int n_paths, char **paths)
{
    struct scan s = {.opt = *opt};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.color = color_wanted(opt->color_mode) && !opt->json;
    const char *tv = getenv("VKSCAN_TELEMETRY");
    s.telemetry = tv != NULL && tv[0] != '\0' && strcmp(tv, "0") != 0;
    s.t0 = now_s();
    int status = walk_create(&opt->walk, &s.walk) != 0 ? 2 : 0;
    if (status == 0)
        status = cli_daemon_connect(SCAN_IO_MS, false, &s.main);
    double t_connected = now_s();
    if (status == 0)
        status = scan_load(&s);
    double t_loaded = now_s();
    if (status == 0) {
        scan_limits(&s);
        if (scan_start(&s) != 0) {
            fprintf(stderr, "vkscan: out of memory or threads starting the scan\n");
            status = 2;
        }
    }
    if (status == 0) {
        s.progress = isatty(STDERR_FILENO) && !opt->quiet;
        if (opt->tail)
            tail_file(&s, paths[0]);
        for (int i = 0; !opt->tail && i < n_paths && !(opt->quiet && s.matched); i++)
            add_arg(&s, paths[i]);
        batch_drain(&s);
        if (s.progress && s.t0 + 1.0 < now_s()) {
            progress_draw(&s, true);
            fputc('\n', stderr);
            s.progress_shown = false;
        }
        if ((opt->stats || opt->json) && !opt->quiet)
            print_summary(&s, now_s() - s.t0);
        status = scan_status(&s);
    }
    double t_scanned = now_s();
    scan_finish(&s);
    if (s.telemetry) /* where the command's own time went, after the requests' lines */
        fprintf(stderr,
                "vkscan: client: connect_ns=%.0f rules_ns=%.0f scan_ns=%.0f finish_ns=%.0f\n",
                (t_connected - s.t0) * 1e9, (t_loaded - t_connected) * 1e9,
                (t_scanned - t_loaded) * 1e9, (now_s() - t_scanned) * 1e9);
    return status;
}

static void scan_usage(FILE *f)
{
    fprintf(f,
            "usage: vkscan scan (-r RULES | -e PATTERN)... [options] PATH...\n"
            "Rules:\n"
            "  -r, --rules FILE          pattern file (ID:/regex/flags lines); repeat for more\n"
            "  -e, --regexp PATTERN      a rule on the command line: ID:/regex/flags, or a\n"
            "                            regex that gets the id eN; repeatable\n"
            "      --strict              a rejected rule is an error (exit status 2)\n"
            "Output:\n"
            "  -n, --line-number         the line of each match's last byte, before its offset\n"
            "  -o, --only-matching       print each match's bytes: PATH:START-END:RULE:BYTES\n"
            "                            (escaped: \\xHH for bytes outside printable ASCII)\n"
            "  -c, --count               per file and rule: path:rule:count\n"
            "      --first               only the first match per rule in each file\n"
            "  -l, --files-with-matches  only the names of files with a match\n"
            "  -q, --quiet               print nothing: the exit status says it\n"
            "      --json                one JSON record a line (match, error, reject, summary)\n"
            "      --color WHEN          auto (default), always or never\n"
            "      --stats               a summary at the end: files, bytes, matches, GB/s\n"
            "Walking directories:\n"
            "      --no-ignore           do not read .gitignore and .ignore files\n"
            "      --hidden              walk files and directories whose name starts with '.'\n"
            "  -L, --follow              follow links to directories\n"
            "  -g, --glob GLOB           scan only files matching GLOB; !GLOB excludes\n"
            "      --exclude GLOB        leave out files and directories matching GLOB\n"
            "      --max-filesize SIZE   skip files larger than SIZE (bytes, or K, M, G)\n"
            "Archives:\n"
            "  -z, --search-zip          scan the members of tar and zip archives and of\n"
            "                            gzip, xz, zstd, bzip2 and lz4 files: ARCHIVE!MEMBER\n"
            "      --max-archive-bytes SIZE  stop reading an archive past SIZE decompressed\n"
            "                            (default 1G)\n"
            "Streams:\n"
            "      --tail                follow one growing FILE like tail -f (until Ctrl-C)\n"
            "Daemon:\n"
            "  -j, --jobs N              scan requests in flight (default 4, 1..16)\n"
            "      --socket PATH         vkscand's socket (default $VKSCAN_SOCKET or %s)\n"
            "      --no-cache            read and scan every file again, not the daemon's\n"
            "                            results for files that did not change\n"
            "  -h, --help                this text\n"
            "PATH may be a file, a directory (walked recursively) or - for standard input.\n"
            "Standard input, pipes and files larger than the daemon's max-scan-bytes are\n"
            "scanned as streams, piece by piece: matches across pieces are found.\n"
            "Each match prints as path:end offset:rule id; the end offset is exclusive.\n"
            "Exit status: 0 a match, 1 no match, 2 an error (a file not scanned).\n",
            CLI_DEFAULT_SOCKET);
}

/* "123", "4K", "10M", "2G" (powers of 1024). Returns 0 or -EINVAL. */
static int parse_size(const char *arg, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (shift != 0)
        end++;
    if (errno != 0 || end == arg || *end != '\0' || arg[0] == '-' || v > (UINT64_MAX >> shift))
        return -EINVAL;
    *out = (uint64_t)v << shift;
    return 0;
}

static int scan_usage_error(const char *fmt, const char *what)
{
    fputs("vkscan scan: ", stderr);
    fprintf(stderr, fmt, what);
    fputs(" (vkscan scan --help lists the options)\n", stderr);
    return 2;
}

enum {
    OPT_JSON = 256,
    OPT_FIRST,
    OPT_SOCKET,
    OPT_COLOR,
    OPT_STATS,
    OPT_STRICT,
    OPT_NO_IGNORE,
    OPT_HIDDEN,
    OPT_EXCLUDE,
    OPT_MAX_FILESIZE,
    OPT_MAX_ARCHIVE_BYTES,
    OPT_TAIL,
    OPT_NO_CACHE,
};

/* One option of `scan`; returns -1 to go on, else the exit status. */
static int scan_option(struct scan_opts *o, int c, char *arg, char **argv)
{
    switch (c) {
    case 'r':
        o->rules[o->n_rules++] = arg;
        return -1;
    case 'e':
        o->exprs[o->n_exprs++] = arg;
        return -1;
    case 'g':
        o->globs[o->n_globs++] = arg;
        return -1;
    case OPT_EXCLUDE: {
        char *g = NULL;
        if (asprintf(&g, "!%s", arg) < 0)
            return scan_usage_error("%s", "out of memory");
        o->globs[o->n_globs++] = g;
        o->owned[o->n_owned++] = g;
        return -1;
    }
    case OPT_JSON:
        o->json = true;
        return -1;
    case 'c':
        o->out = o->out == OUT_LIST ? OUT_LIST : OUT_COUNT;
        return -1;
    case OPT_FIRST:
        o->report = VKS_REPORT_FIRST;
        return -1;
    case 'l':
        o->out = OUT_LIST;
        return -1;
    case 'n':
        o->line_numbers = true;
        return -1;
    case 'o':
        o->only_matching = true;
        return -1;
    case 'q':
        o->quiet = true;
        return -1;
    case OPT_STATS:
        o->stats = true;
        return -1;
    case OPT_STRICT:
        o->strict = true;
        return -1;
    case OPT_NO_IGNORE:
        o->walk.no_ignore = true;
        return -1;
    case OPT_HIDDEN:
        o->walk.hidden = true;
        return -1;
    case OPT_NO_CACHE:
        o->no_cache = true;
        return -1;
    case 'L':
        o->walk.follow = true;
        return -1;
    case OPT_COLOR:
        if (strcmp(arg, "auto") == 0)
            o->color_mode = COLOR_AUTO;
        else if (strcmp(arg, "always") == 0)
            o->color_mode = COLOR_ALWAYS;
        else if (strcmp(arg, "never") == 0)
            o->color_mode = COLOR_NEVER;
        else
            return scan_usage_error("--color takes auto, always or never, not '%s'", arg);
        return -1;
    case OPT_MAX_FILESIZE:
        if (parse_size(arg, &o->max_filesize) != 0)
            return scan_usage_error("--max-filesize takes a size such as 4096, 512K or 10M, "
                                    "not '%s'",
                                    arg);
        return -1;
    case 'z':
        o->search_zip = true;
        return -1;
    case OPT_TAIL:
        o->tail = true;
        return -1;
    case OPT_MAX_ARCHIVE_BYTES:
        if (parse_size(arg, &o->max_archive_bytes) != 0 || o->max_archive_bytes == 0)
            return scan_usage_error("--max-archive-bytes takes a size such as 100M or 4G, "
                                    "not '%s'",
                                    arg);
        return -1;
    case OPT_SOCKET:
        cli_socket_path = arg;
        return -1;
    case 'j':
        o->jobs = (unsigned)strtoul(arg, NULL, 10);
        if (o->jobs < 1 || o->jobs > MAX_JOBS)
            return scan_usage_error("--jobs takes 1..16, not '%s'", arg);
        return -1;
    case 'h':
        scan_usage(stdout);
        return 0;
    case ':':
        return scan_usage_error("option '%s' needs a value", argv[optind - 1]);
    default:
        return scan_usage_error("unknown option '%s'", argv[optind - 1]);
    }
}

int cli_scan(int argc, char **argv)
{
    static const struct option longs[] = {
        {"rules", required_argument, NULL, 'r'},
        {"regexp", required_argument, NULL, 'e'},
        {"json", no_argument, NULL, OPT_JSON},
        {"count", no_argument, NULL, 'c'},
        {"first", no_argument, NULL, OPT_FIRST},
        {"files-with-matches", no_argument, NULL, 'l'},
        {"line-number", no_argument, NULL, 'n'},
        {"only-matching", no_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"color", required_argument, NULL, OPT_COLOR},
        {"stats", no_argument, NULL, OPT_STATS},
        {"strict", no_argument, NULL, OPT_STRICT},
        {"no-ignore", no_argument, NULL, OPT_NO_IGNORE},
        {"hidden", no_argument, NULL, OPT_HIDDEN},
        {"follow", no_argument, NULL, 'L'},
        {"glob", required_argument, NULL, 'g'},
        {"exclude", required_argument, NULL, OPT_EXCLUDE},
        {"max-filesize", required_argument, NULL, OPT_MAX_FILESIZE},
        {"search-zip", no_argument, NULL, 'z'},
        {"max-archive-bytes", required_argument, NULL, OPT_MAX_ARCHIVE_BYTES},
        {"tail", no_argument, NULL, OPT_TAIL},
        {"jobs", required_argument, NULL, 'j'},
        {"socket", required_argument, NULL, OPT_SOCKET},
        {"no-cache", no_argument, NULL, OPT_NO_CACHE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    struct scan_opts o = {.report = VKS_REPORT_ALL,
                          .out = OUT_MATCHES,
                          .jobs = 4,
                          .max_archive_bytes = ARCHIVE_BYTES};
    /* no option appears more often than there are arguments */
    o.rules = calloc((size_t)argc, sizeof(char *));
    o.exprs = calloc((size_t)argc, sizeof(char *));
    o.globs = calloc((size_t)argc, sizeof(char *));
    o.owned = calloc((size_t)argc, sizeof(char *));
    int status = -1, c;
    if (o.rules == NULL || o.exprs == NULL || o.globs == NULL || o.owned == NULL)
        status = scan_usage_error("%s", "out of memory");
    opterr = 0;
    while (status < 0 && (c = getopt_long(argc, argv, ":r:e:g:clnoqLzj:h", longs, NULL)) != -1)
        status = scan_option(&o, c, optarg, argv);
    if (status < 0 && o.n_rules == 0 && o.n_exprs == 0)
        status = scan_usage_error("%s", "no rules: give a pattern file with -r FILE or a "
                                        "pattern with -e PATTERN");
    if (status < 0 && optind >= argc)
        status = scan_usage_error("%s", "no PATH to scan: name files, directories, or - "
                                        "for standard input");
    if (status < 0 && o.tail && argc - optind != 1)
        status = scan_usage_error("%s", "--tail follows one FILE: name exactly one");
    if (status < 0) {
        if (o.out == OUT_COUNT)
            o.report = VKS_REPORT_COUNT;
        else if (o.out == OUT_LIST)
            o.report = VKS_REPORT_FIRST;
        o.walk.globs = o.globs;
        o.walk.n_globs = o.n_globs;
        status = run_scan(&o, argc - optind, argv + optind);
    }
    free(o.rules);
    free(o.exprs);
    free(o.globs);
    for (size_t i = 0; i < o.n_owned; i++)
        free(o.owned[i]);
    free(o.owned);
    return status;
}
