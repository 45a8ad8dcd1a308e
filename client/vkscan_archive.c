/*
 * vkscan scan -z (vkscan_archive.h): members of archives and compressed
 * files, decompressed by libarchive into memfds.
 *
 * Every byte libarchive hands over counts toward the archive's total,
 * also the bytes of a member that is too large to scan (they are read and
 * dropped: skipping a member of a compressed tar decompresses it all the
 * same), so --max-archive-bytes bounds the work one archive can cause.
 */
#include "vkscan_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vkscan_cli.h"

#define NEST_MAX 1          /* archives inside archives opened, below the top */
#define CHUNK    (1u << 16) /* bytes libarchive decompresses into at once */

struct unpack {
    const struct unpack_limits *lim;
    const struct unpack_visitor *v;
    const char *top; /* the archive named by the caller */
    size_t top_len;
    uint64_t total; /* bytes decompressed, nested archives included */
    bool stop;      /* total_max passed: no more reading */
    char buf[CHUNK];
};

/*
 * libarchive, opened when the first archive is read: linked, it and what
 * it pulls in (libxml2, ICU, libstdc++, five codecs) cost every vkscan
 * command 2 ms of start-up on the development machine, archives or not.
 */
static struct {
    bool tried, ok;
    char why[192];
    __typeof__(&archive_error_string) error_string;
    __typeof__(&archive_read_new) read_new;
    __typeof__(&archive_read_support_filter_gzip) read_support_filter_gzip;
    __typeof__(&archive_read_support_filter_xz) read_support_filter_xz;
    __typeof__(&archive_read_support_filter_zstd) read_support_filter_zstd;
    __typeof__(&archive_read_support_filter_bzip2) read_support_filter_bzip2;
    __typeof__(&archive_read_support_filter_lz4) read_support_filter_lz4;
    __typeof__(&archive_read_support_format_tar) read_support_format_tar;
    __typeof__(&archive_read_support_format_zip) read_support_format_zip;
    __typeof__(&archive_read_support_format_empty) read_support_format_empty;
    __typeof__(&archive_read_support_format_raw) read_support_format_raw;
    __typeof__(&archive_read_open_fd) read_open_fd;
    __typeof__(&archive_read_data) read_data;
    __typeof__(&archive_read_next_header) read_next_header;
    __typeof__(&archive_format) format;
    __typeof__(&archive_filter_count) filter_count;
    __typeof__(&archive_read_free) read_free;
    __typeof__(&archive_entry_filetype) entry_filetype;
    __typeof__(&archive_entry_hardlink) entry_hardlink;
    __typeof__(&archive_entry_pathname) entry_pathname;
} la;

/* dlsym into a function pointer (POSIX guarantees the representation). */
static bool la_sym(void *h, void *slot, const char *name)
{
    void *p = dlsym(h, name);
    memcpy(slot, &p, sizeof(p));
    return p != NULL;
}

static bool la_open(void)
{
    if (la.tried)
        return la.ok;
    la.tried = true;
    void *h = dlopen("libarchive.so.13", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        h = dlopen("libarchive.so", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(la.why, sizeof(la.why), "%s", dlerror());
        return false;
    }
    bool ok = true;
    ok = ok && la_sym(h, &la.error_string, "archive_error_string");
    ok = ok && la_sym(h, &la.read_new, "archive_read_new");
    ok = ok && la_sym(h, &la.read_support_filter_gzip, "archive_read_support_filter_gzip");
    ok = ok && la_sym(h, &la.read_support_filter_xz, "archive_read_support_filter_xz");
    ok = ok && la_sym(h, &la.read_support_filter_zstd, "archive_read_support_filter_zstd");
    ok = ok && la_sym(h, &la.read_support_filter_bzip2, "archive_read_support_filter_bzip2");
    ok = ok && la_sym(h, &la.read_support_filter_lz4, "archive_read_support_filter_lz4");
    ok = ok && la_sym(h, &la.read_support_format_tar, "archive_read_support_format_tar");
    ok = ok && la_sym(h, &la.read_support_format_zip, "archive_read_support_format_zip");
    ok = ok && la_sym(h, &la.read_support_format_empty, "archive_read_support_format_empty");
    ok = ok && la_sym(h, &la.read_support_format_raw, "archive_read_support_format_raw");
    ok = ok && la_sym(h, &la.read_open_fd, "archive_read_open_fd");
    ok = ok && la_sym(h, &la.read_data, "archive_read_data");
    ok = ok && la_sym(h, &la.read_next_header, "archive_read_next_header");
    ok = ok && la_sym(h, &la.format, "archive_format");
    ok = ok && la_sym(h, &la.filter_count, "archive_filter_count");
    ok = ok && la_sym(h, &la.read_free, "archive_read_free");
    ok = ok && la_sym(h, &la.entry_filetype, "archive_entry_filetype");
    ok = ok && la_sym(h, &la.entry_hardlink, "archive_entry_hardlink");
    ok = ok && la_sym(h, &la.entry_pathname, "archive_entry_pathname");
    if (!ok) {
        snprintf(la.why, sizeof(la.why), "this libarchive lacks a function vkscan needs");
        dlclose(h);
        return false;
    }
    la.ok = true; /* h stays open until exit */
    return true;
}

bool unpack_sniff(int fd)
{
    static const struct {
        size_t off, len;
        const char *magic;
    } kinds[] = {
        {0, 2, "\x1f\x8b"}, /* gzip */
        {0, 6,
         "\xfd"
         "7zXZ\0"},                 /* xz */
        {0, 4, "\x28\xb5\x2f\xfd"}, /* zstd */
        {0, 3, "BZh"},              /* bzip2 */
        {0, 4, "\x04\x22\x4d\x18"}, /* lz4 */
        {0, 4, "PK\x03\x04"},       /* zip */
        {0, 4, "PK\x05\x06"},       /* zip, empty */
        {257, 5, "ustar"},          /* tar: POSIX, pax and GNU */
    };
    unsigned char head[262];
    ssize_t n = pread(fd, head, sizeof(head), 0);
    for (size_t i = 0; n > 0 && i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if ((size_t)n >= kinds[i].off + kinds[i].len &&
            memcmp(head + kinds[i].off, kinds[i].magic, kinds[i].len) == 0)
            return true;
    }
    return false;
}

/* A compressed file's one member: its name without the directory (inside
 * an archive, without the path to it) and without the compression suffix;
 * `data` when it has no such suffix (standard input, say). */
static void raw_name(const char *path, char *out, size_t cap)
{
    static const char *const suffixes[] = {".gz", ".xz", ".zst", ".zstd", ".bz2", ".lz4", ".z"};
    const char *b = path;
    for (const char *p = path; *p != '\0'; p++) {
        if (*p == '/' || *p == '!')
            b = p + 1;
    }
    size_t n = strlen(b);
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        size_t l = strlen(suffixes[i]);
        if (n > l && strcmp(b + n - l, suffixes[i]) == 0) {
            snprintf(out, cap, "%.*s", (int)(n - l), b);
            return;
        }
    }
    snprintf(out, cap, "data");
}

__attribute__((format(printf, 3, 4))) static void problem(struct unpack *u, const char *name,
                                                          const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    u->v->problem(u->v->ctx, name, msg);
}

/* libarchive's reason for the last failure. */
static const char *why(struct archive *a)
{
    const char *s = la.error_string(a);
    return s != NULL ? s : "unreadable";
}

/* The archive's total passed --max-archive-bytes: said once, on the
 * archive the caller named, and nothing more is read. */
static void over_total(struct unpack *u)
{
    char cap[32];
    cli_fmt_bytes(u->lim->total_max, cap, sizeof(cap));
    problem(u, u->top,
            "more than --max-archive-bytes (%s) decompressed (a decompression bomb?): the "
            "rest of the archive is skipped; raise --max-archive-bytes to read it all",
            cap);
    u->stop = true;
}

static struct archive *reader_open(int fd)
{
    struct archive *a = la.read_new();
    if (a == NULL)
        return NULL;
    la.read_support_filter_gzip(a);
    la.read_support_filter_xz(a);
    la.read_support_filter_zstd(a);
    la.read_support_filter_bzip2(a);
    la.read_support_filter_lz4(a);
    la.read_support_format_tar(a);
    la.read_support_format_zip(a);
    la.read_support_format_empty(a);
    la.read_support_format_raw(a);
    /* a failure here shows at the first header, with libarchive's reason */
    if (lseek(fd, 0, SEEK_SET) == 0)
        la.read_open_fd(a, fd, CHUNK);
    return a;
}

static void read_archive(struct unpack *u, int fd, const char *path, int depth);

/* Writes n bytes of u->buf to `fd`; returns 0 or -errno. */
static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/*
 * Decompresses the current member (`name` is ARCHIVE!MEMBER) into a memfd
 * and hands it on, or opens it as a nested archive. Returns false when the
 * archive cannot be read further (corrupt, or over its total).
 */
static bool read_member(struct unpack *u, struct archive *a, const char *path, const char *name,
                        int depth)
{
    int fd = memfd_create("vkscan-member", MFD_CLOEXEC);
    int err = fd < 0 ? -errno : 0;
    uint64_t size = 0;
    bool too_big = false;
    for (;;) {
        la_ssize_t n = la.read_data(a, u->buf, sizeof(u->buf));
        if (n == 0)
            break;
        if (n < 0) {
            if (fd >= 0)
                close(fd);
            if (n == ARCHIVE_FATAL) {
                problem(u, path, "corrupt archive at '%s': %s (the rest is skipped)",
                        name + strlen(path) + 1, why(a));
                return false;
            }
            problem(u, name, "%s (skipped)", why(a));
            return true;
        }
        u->total += (uint64_t)n;
        if (u->total > u->lim->total_max) {
            if (fd >= 0)
                close(fd);
            over_total(u);
            return false;
        }
        too_big |= size + (uint64_t)n > u->lim->member_max;
        if (too_big || err != 0)
            continue; /* read on: the total counts these bytes too */
        err = write_all(fd, u->buf, (size_t)n);
        size += (uint64_t)n;
    }
    if (err != 0 || too_big) {
        char m[32];
        cli_fmt_bytes(u->lim->member_max, m, sizeof(m));
        if (err != 0)
            problem(u, name, "cannot hold the member in a memfd: %s (skipped)", strerror(-err));
        else
            problem(u, name,
                    "more than vkscand scans in one request (%s) once decompressed: raise "
                    "max-scan-bytes (skipped)",
                    m);
        if (fd >= 0)
            close(fd);
        return true;
    }
    if (depth < NEST_MAX && unpack_sniff(fd)) {
        read_archive(u, fd, name, depth + 1);
        close(fd);
        return !u->stop;
    }
    u->v->member(u->v->ctx, name, u->top_len, fd, size);
    return true;
}

/* Reads every member of the archive on `fd` named `path`. */
static void read_archive(struct unpack *u, int fd, const char *path, int depth)
{
    struct archive *a = reader_open(fd);
    if (a == NULL) {
        problem(u, path, "out of memory opening the archive (skipped)");
        return;
    }
    while (!u->stop) {
        struct archive_entry *e;
        int r = la.read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            problem(u, path, "corrupt or unsupported archive: %s (the rest is skipped)", why(a));
            break;
        }
        bool raw = la.format(a) == ARCHIVE_FORMAT_RAW;
        if (raw && la.filter_count(a) <= 1) {
            /* tar or zip magic, but neither format could read it */
            problem(u, path, "corrupt archive: its first header cannot be read (skipped)");
            break;
        }
        if (la.entry_filetype(e) != AE_IFREG || la.entry_hardlink(e) != NULL)
            continue; /* directories, links; a hard link's bytes are its target's */
        const char *inside = la.entry_pathname(e);
        char member[1024], *name = NULL;
        if (raw)
            raw_name(path, member, sizeof(member));
        else
            snprintf(member, sizeof(member), "%s", inside != NULL ? inside : "?");
        if (asprintf(&name, "%s!%s", path, member) < 0) {
            problem(u, path, "out of memory (the rest is skipped)");
            break;
        }
        bool go_on = read_member(u, a, path, name, depth);
        free(name);
        if (!go_on)
            break;
    }
    la.read_free(a);
}

void unpack_members(int fd, const char *path, const struct unpack_limits *lim,
                    const struct unpack_visitor *v)
{
    struct unpack *u = malloc(sizeof(*u));
    if (u == NULL) {
        v->problem(v->ctx, path, "out of memory opening the archive (skipped)");
        return;
    }
    *u = (struct unpack){.lim = lim, .v = v, .top = path, .top_len = strlen(path)};
    if (la_open())
        read_archive(u, fd, path, 0);
    else
        problem(u, path, "cannot read archives without libarchive (%s): install libarchive13",
                la.why);
    free(u);
}
