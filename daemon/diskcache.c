/*
 * The disk cache (diskcache.h): file helpers, the FIFO of disk operations,
 * persisting entries and sources, and reading the index at start.
 */
#include "diskcache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "store_internal.h"

#define SRC_MAGIC  0x53534b56u /* "VKSS" */
#define SRC_FORMAT 1u
#define SRC_HEADER 48u /* magic, format, compiler version, catalog fp, n_rejects */

enum disk_kind { DISK_WRITE, DISK_READ_CATALOG, DISK_DELETE };

struct disk_op {
    uv_work_t work;
    struct disk_op *next;
    struct store *st;
    enum disk_kind kind;
    struct store_entry *entry; /* referenced while the op runs */
    char **paths;              /* DISK_WRITE: [0]; DISK_DELETE: all */
    size_t n_paths;
    uint8_t *data; /* DISK_WRITE: owned bytes, or NULL to write the catalog */
    size_t len;
    void (*done)(struct disk_op *op); /* loop thread */
    int status;
    struct catalog *cat; /* DISK_READ_CATALOG result */
    struct vks_error err;
};

/* ---- paths ------------------------------------------------------------ */

static void cat_path(const struct store *st, const uint8_t fp[CATALOG_FP_LEN], const char *ext,
                     char *out, size_t cap)
{
    char hex[STORE_HEX_LEN + 1];
    catalog_fingerprint_hex(fp, hex);
    /* The directories were checked at create to leave room for the name. */
    if (snprintf(out, cap, "%s/%s.%s", st->dir_cat, hex, ext) >= (int)cap)
        out[0] = '\0';
}

static void src_path(const struct store *st, const uint8_t src[CATALOG_FP_LEN], char *out,
                     size_t cap)
{
    char hex[STORE_HEX_LEN + 1];
    catalog_fingerprint_hex(src, hex);
    if (snprintf(out, cap, "%s/%s.src", st->dir_src, hex) >= (int)cap)
        out[0] = '\0';
}

static int hex_decode(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char c = s[2 * i + (size_t)k];
            unsigned d = (c >= '0' && c <= '9')   ? (unsigned)(c - '0')
                         : (c >= 'a' && c <= 'f') ? (unsigned)(c - 'a' + 10)
                                                  : 16u;
            if (d > 15)
                return -EINVAL;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* ---- the disk FIFO ---------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int write_file(const char *path, const void *data, size_t len, struct vks_error *err)
{
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return vks_error_set(err, -errno, "cannot create %s: %s", tmp, strerror(errno));
    const uint8_t *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int rc = n < 0 ? -errno : -EIO;
            close(fd);
            unlink(tmp);
            return vks_error_set(err, rc, "cannot write %s: %s", tmp, strerror(-rc));
        }
        p += n;
        left -= (size_t)n;
    }
    /* The descriptor is closed whatever fdatasync says: a full disk must not
     * leak one descriptor per failed write. */
    int rc = fdatasync(fd) != 0 ? -errno : 0;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0) {
        unlink(tmp);
        return vks_error_set(err, rc, "cannot save %s: %s", path, strerror(-rc));
    }
    return 0;
}

static int read_file(const char *path, uint8_t **data, size_t *len, size_t max,
                     struct vks_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return vks_error_set(err, -errno, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size > max) {
        close(fd);
        return vks_error_set(err, -EINVAL, "%s is not a regular file of at most %zu bytes", path,
                             max);
    }
    uint8_t *buf = malloc(sb.st_size > 0 ? (size_t)sb.st_size : 1);
    size_t got = 0;
    while (buf != NULL && got < (size_t)sb.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (buf == NULL || got != (size_t)sb.st_size) {
        free(buf);
        return vks_error_set(err, buf == NULL ? -ENOMEM : -EIO, "cannot read %s", path);
    }
    *data = buf;
    *len = got;
    return 0;
}

static void disk_work(uv_work_t *w)
{
    struct disk_op *op = w->data;
    switch (op->kind) {
    case DISK_WRITE:
        if (op->data != NULL) {
            op->status = write_file(op->paths[0], op->data, op->len, &op->err);
        } else {
            size_t words;
            const uint32_t *p = catalog_words(op->entry->cat, &words);
            op->status = write_file(op->paths[0], p, words * 4, &op->err);
        }
        break;
    case DISK_READ_CATALOG: {
        uint8_t *buf = NULL;
        size_t len = 0;
        op->status = read_file(op->paths[0], &buf, &len, (size_t)1 << 32, &op->err);
        if (op->status == 0) /* malloc'd: aligned for the words, which it takes over */
            op->status = catalog_from_words((uint32_t *)(void *)buf, len, &op->cat, &op->err);
        else
            free(buf);
        if (op->status == 0 &&
            memcmp(catalog_fingerprint(op->cat), op->entry->fp, CATALOG_FP_LEN) != 0) {
            catalog_destroy(op->cat);
            op->cat = NULL;
            op->status =
                vks_error_set(&op->err, -EIO, "%s does not hash to its name", op->paths[0]);
        }
        break;
    }
    case DISK_DELETE:
        for (size_t i = 0; i < op->n_paths; i++) {
            if (unlink(op->paths[i]) != 0 && errno != ENOENT && op->status == 0)
                op->status = vks_error_set(&op->err, -errno, "cannot delete %s: %s", op->paths[i],
                                           strerror(errno));
        }
        break;
    }
}

static void disk_op_free(struct disk_op *op)
{
    for (size_t i = 0; i < op->n_paths; i++)
        free(op->paths[i]);
    free(op->paths);
    free(op->data);
    free(op);
}

static void disk_start(struct store *st);

static void disk_after(uv_work_t *w, int status)
{
    struct disk_op *op = w->data;
    struct store *st = op->st;
    if (status == UV_ECANCELED && op->status == 0)
        op->status = vks_error_set(&op->err, -ECANCELED, "disk operation cancelled");
    if (op->status != 0) {
        st->stats.disk_errors++;
        log_warn("catalog cache: %s", op->err.msg);
    }
    st->disk_running = false;
    if (op->done != NULL)
        op->done(op);
    if (op->entry != NULL) {
        op->entry->disk_refs--;
        store_entry_unref(st, op->entry);
    }
    disk_op_free(op);
    disk_start(st);
    if (!store_busy(st) && st->idle != NULL)
        st->idle(st->idle_ctx);
}

static void disk_start(struct store *st)
{
    if (st->disk_running || st->disk_head == NULL)
        return;
    struct disk_op *op = st->disk_head;
    st->disk_head = op->next;
    if (st->disk_head == NULL)
        st->disk_tail = NULL;
    op->work.data = op;
    int rc = uv_queue_work(st->loop, &op->work, disk_work, disk_after);
    if (rc != 0) {
        op->status = vks_error_set(&op->err, rc, "cannot queue disk work: %s", uv_strerror(rc));
        st->disk_running = true;
        disk_after(&op->work, 0);
        return;
    }
    st->disk_running = true;
}

static struct disk_op *disk_op_new(struct store *st, enum disk_kind kind, struct store_entry *e,
                                   size_t n_paths)
{
    struct disk_op *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    op->paths = calloc(n_paths, sizeof(char *));
    if (op->paths == NULL) {
        free(op);
        return NULL;
    }
    for (size_t i = 0; i < n_paths; i++) {
        op->paths[i] = malloc(PATH_MAX);
        if (op->paths[i] == NULL) {
            op->n_paths = i;
            disk_op_free(op);
            return NULL;
        }
    }
    op->n_paths = n_paths;
    op->st = st;
    op->kind = kind;
    op->entry = e;
    if (e != NULL) {
        store_entry_ref(e);
        e->disk_refs++;
    }
    return op;
}

static void disk_submit(struct store *st, struct disk_op *op)
{
    op->next = NULL;
    if (st->disk_tail != NULL)
        st->disk_tail->next = op;
    else
        st->disk_head = op;
    st->disk_tail = op;
    disk_start(st);
}

/* ---- persisting ------------------------------------------------------- */

static void catalog_written(struct disk_op *op)
{
    if (op->status == 0) {
        op->entry->on_disk = true;
        op->st->stats.disk_writes++;
    }
}

void diskcache_save_catalog(struct store *st, struct store_entry *e)
{
    if (!st->disk)
        return;
    struct disk_op *op = disk_op_new(st, DISK_WRITE, e, 1);
    if (op == NULL)
        return; /* stays in memory only: still correct, just not cached */
    cat_path(st, e->fp, "cat", op->paths[0], PATH_MAX);
    op->done = catalog_written;
    disk_submit(st, op);
}

static void owners_written(struct disk_op *op)
{
    struct store_entry *e = op->entry;
    e->owners_writing = false;
    if (e->owners_dirty && !e->dead) {
        e->owners_dirty = false;
        diskcache_save_owners(op->st, e);
    }
}

void diskcache_save_owners(struct store *st, struct store_entry *e)
{
    if (!st->disk || e->dead)
        return;
    if (e->owners_writing) {
        e->owners_dirty = true;
        return;
    }
    struct disk_op *op = disk_op_new(st, DISK_WRITE, e, 1);
    if (op == NULL)
        return;
    op->data = malloc(e->n_owners * 12 + 1);
    if (op->data == NULL) {
        e->disk_refs--;
        store_entry_unref(st, e);
        disk_op_free(op);
        return;
    }
    for (size_t i = 0; i < e->n_owners; i++)
        op->len += (size_t)sprintf((char *)op->data + op->len, "%u\n", (unsigned)e->owners[i]);
    cat_path(st, e->fp, "owners", op->paths[0], PATH_MAX);
    op->done = owners_written;
    e->owners_writing = true;
    disk_submit(st, op);
}

void diskcache_save_source(struct store *st, const struct store_source *s)
{
    if (!st->disk)
        return;
    size_t len = SRC_HEADER + 8; /* + the compile time, after the rejects */
    for (size_t i = 0; i < s->n_rejects; i++)
        len += 16 + strlen(s->rejects[i].id) + strlen(s->rejects[i].msg);
    struct disk_op *op = disk_op_new(st, DISK_WRITE, NULL, 1);
    if (op == NULL || (op->data = malloc(len)) == NULL) {
        if (op != NULL)
            disk_op_free(op);
        return;
    }
    uint8_t *p = op->data;
    put_u32(p, SRC_MAGIC);
    put_u32(p + 4, SRC_FORMAT);
    put_u32(p + 8, st->compiler);
    memcpy(p + 12, s->entry->fp, CATALOG_FP_LEN);
    put_u32(p + 44, (uint32_t)s->n_rejects);
    p += SRC_HEADER;
    for (size_t i = 0; i < s->n_rejects; i++) {
        const struct rule_reject *r = &s->rejects[i];
        uint32_t il = (uint32_t)strlen(r->id), ml = (uint32_t)strlen(r->msg);
        put_u32(p, r->index);
        put_u32(p + 4, r->line);
        put_u32(p + 8, r->pos);
        put_u32(p + 12, il << 16 | ml);
        memcpy(p + 16, r->id, il);
        memcpy(p + 16 + il, r->msg, ml);
        p += 16 + il + ml;
    }
    /* The original compile time, so that a tenant new to this rule set after a
     * restart is told the same as before it (catalog.load compile_ns). */
    put_u32(p, (uint32_t)s->compile_ns);
    put_u32(p + 4, (uint32_t)(s->compile_ns >> 32));
    p += 8;
    op->len = (size_t)(p - op->data);
    src_path(st, s->src, op->paths[0], PATH_MAX);
    disk_submit(st, op);
}

/* Parses a .src file; returns 0 and the rejects (owned by the caller) and
 * the compile time (0 in files written before it was recorded). */
static int source_parse(const uint8_t *p, size_t len, uint32_t compiler, uint8_t fp[CATALOG_FP_LEN],
                        struct rule_reject **out, size_t *n_out, uint64_t *compile_ns)
{
    if (len < SRC_HEADER || get_u32(p) != SRC_MAGIC || get_u32(p + 4) != SRC_FORMAT)
        return -EINVAL;
    if (get_u32(p + 8) != compiler)
        return -ESTALE; /* another compiler version: its mapping means nothing now */
    memcpy(fp, p + 12, CATALOG_FP_LEN);
    uint32_t n = get_u32(p + 44);
    if (n > (len - SRC_HEADER) / 16)
        return -EINVAL;
    struct rule_reject *v = calloc(n ? n : 1, sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    size_t off = SRC_HEADER;
    for (uint32_t i = 0; i < n; i++) {
        if (len - off < 16)
            goto bad;
        uint32_t lens = get_u32(p + off + 12);
        size_t il = lens >> 16, ml = lens & 0xffff;
        if (il > RULES_MAX_ID || ml >= sizeof(v[i].msg) || len - off - 16 < il + ml)
            goto bad;
        v[i].index = get_u32(p + off);
        v[i].line = get_u32(p + off + 4);
        v[i].pos = get_u32(p + off + 8);
        memcpy(v[i].id, p + off + 16, il);
        memcpy(v[i].msg, p + off + 16 + il, ml);
        off += 16 + il + ml;
    }
    *compile_ns = len - off >= 8 ? get_u32(p + off) | (uint64_t)get_u32(p + off + 4) << 32 : 0;
    *out = v;
    *n_out = n;
    return 0;
bad:
    free(v);
    return -EINVAL;
}

/* ---- the index at start ----------------------------------------------- */

static int parse_owners(const uint8_t *p, size_t len, struct store_entry *e)
{
    size_t i = 0;
    while (i < len) {
        unsigned long v = 0;
        size_t start = i;
        while (i < len && p[i] >= '0' && p[i] <= '9' && v <= UINT32_MAX)
            v = v * 10 + (unsigned long)(p[i++] - '0');
        if (i == start || i >= len || p[i] != '\n' || v > UINT32_MAX)
            return -EINVAL;
        i++;
        if (store_entry_add_owner(e, (uid_t)v) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* Returns true when `name` is "<64 hex>.<ext>" and fills `fp`. */
static bool name_fp(const char *name, const char *ext, uint8_t fp[CATALOG_FP_LEN])
{
    size_t n = strlen(name);
    if (n != STORE_HEX_LEN + 1 + strlen(ext) || name[STORE_HEX_LEN] != '.' ||
        strcmp(name + STORE_HEX_LEN + 1, ext) != 0)
        return false;
    return hex_decode(name, CATALOG_FP_LEN, fp) == 0;
}

static void index_catalogs(struct store *st)
{
    DIR *d = opendir(st->dir_cat);
    if (d == NULL)
        return;
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        uint8_t fp[CATALOG_FP_LEN];
        if (!name_fp(de->d_name, "owners", fp))
            continue;
        uint8_t *data = NULL;
        size_t len = 0;
        struct stat sb;
        cat_path(st, fp, "cat", path, sizeof(path));
        bool has_cat = stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
        if (snprintf(path, sizeof(path), "%s/%s", st->dir_cat, de->d_name) >= (int)sizeof(path))
            continue;
        if (!has_cat || read_file(path, &data, &len, 1 << 24, NULL) != 0) {
            st->stats.disk_errors++;
            continue;
        }
        struct store_entry *e = store_table_find(st, fp);
        if (e == NULL)
            e = store_entry_new(st, fp);
        if (e != NULL) {
            e->on_disk = true;
            if (parse_owners(data, len, e) != 0)
                st->stats.disk_errors++;
            if (e->n_owners == 0) {
                store_table_remove(st, e);
                store_entry_free(st, e);
            }
        }
        free(data);
    }
    closedir(d);
}

static void index_sources(struct store *st)
{
    DIR *d = opendir(st->dir_src);
    if (d == NULL)
        return;
    struct dirent *de;
    struct store_source *s;
    char path[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        uint8_t src[CATALOG_FP_LEN], fp[CATALOG_FP_LEN];
        if (!name_fp(de->d_name, "src", src))
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", st->dir_src, de->d_name) >= (int)sizeof(path))
            continue;
        uint8_t *data = NULL;
        size_t len = 0;
        struct rule_reject *rejects = NULL;
        size_t n = 0;
        uint64_t compile_ns = 0;
        if (read_file(path, &data, &len, 1 << 28, NULL) != 0 ||
            source_parse(data, len, st->compiler, fp, &rejects, &n, &compile_ns) != 0) {
            unlink(path); /* unreadable or stale: the next load of its rules compiles */
            free(data);
            continue;
        }
        free(data);
        struct store_entry *e = store_table_find(st, fp);
        if (e == NULL || store_source_find(st, src) != NULL)
            free(rejects); /* its catalog is gone: the next load compiles */
        else if ((s = store_source_add(st, e, src, rejects, n)) != NULL)
            s->compile_ns = compile_ns;
    }
    closedir(d);
}

/* The compiler version is in every packed catalog's header; compiling one
 * tiny rule is the way to learn it without a rules/ API for it. */
static int compiler_version(uint32_t *out, struct vks_error *err)
{
    struct rule_src r = {.id = "v", .kind = RULE_LITERAL, .pattern = "v", .len = 1};
    struct rules_options ro = {0};
    struct rules_result res = {0};
    int rc = rules_compile(&r, 1, &ro, &res, err);
    if (rc != 0)
        return rc;
    size_t n;
    *out = catalog_words(res.catalog, &n)[CAT_H_COMPILER];
    rules_result_finish(&res);
    return 0;
}

static int make_dir(const char *path, struct vks_error *err)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return vks_error_set(err, -errno,
                             "cannot create %s: %s: set --state-dir to a writable "
                             "directory",
                             path, strerror(errno));
    return 0;
}

/* ---- reading and deleting --------------------------------------------- */

static void catalog_read(struct disk_op *op)
{
    store_catalog_read(op->st, op->entry, op->status, op->cat, &op->err);
    op->cat = NULL;
}

int diskcache_read_catalog(struct store *st, struct store_entry *e)
{
    struct disk_op *op = disk_op_new(st, DISK_READ_CATALOG, e, 1);
    if (op == NULL)
        return -ENOMEM;
    cat_path(st, e->fp, "cat", op->paths[0], PATH_MAX);
    op->done = catalog_read;
    disk_submit(st, op);
    return 0;
}

void diskcache_delete(struct store *st, const struct store_entry *e)
{
    if (!st->disk)
        return;
    size_t n_src = 0;
    for (const struct store_source *s = e->sources; s != NULL; s = s->enext)
        n_src++;
    struct disk_op *op = disk_op_new(st, DISK_DELETE, NULL, 2 + n_src);
    if (op == NULL)
        return;
    cat_path(st, e->fp, "cat", op->paths[0], PATH_MAX);
    cat_path(st, e->fp, "owners", op->paths[1], PATH_MAX);
    size_t i = 2;
    for (const struct store_source *s = e->sources; s != NULL; s = s->enext)
        src_path(st, s->src, op->paths[i++], PATH_MAX);
    disk_submit(st, op);
}

bool diskcache_busy(const struct store *st)
{
    return st->disk_running || st->disk_head != NULL;
}

/* ---- the catalogs used last ------------------------------------------- */

/* The recent list's text in `text` (DISKCACHE_RECENT_MAX lines at most);
 * its length. */
static size_t recent_text(const struct store *st, char *text)
{
    struct store_entry *v[DISKCACHE_RECENT_MAX];
    uint32_t n = store_recent(st, v, DISKCACHE_RECENT_MAX);
    size_t len = 0;
    for (uint32_t i = 0; i < n; i++) {
        catalog_fingerprint_hex(v[i]->fp, text + len);
        len += STORE_HEX_LEN;
        text[len++] = '\n';
    }
    return len;
}

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

void diskcache_save_recent(struct store *st)
{
    if (!st->disk)
        return;
    char text[DISKCACHE_RECENT_MAX * (STORE_HEX_LEN + 1) + 1];
    size_t len = recent_text(st, text);
    char path[PATH_MAX];
    struct vks_error err = {0};
    if (snprintf(path, sizeof(path), "%s/recent", st->dir_cat) < (int)sizeof(path) &&
        write_file(path, text, len, &err) != 0)
        log_warn("catalog cache: %s: the next start preloads no catalog", err.msg);
    st->recent_hash = fnv1a(text, len);
}

void diskcache_save_recent_changed(struct store *st)
{
    if (!st->disk)
        return;
    char text[DISKCACHE_RECENT_MAX * (STORE_HEX_LEN + 1) + 1];
    size_t len = recent_text(st, text);
    uint64_t h = fnv1a(text, len);
    if (h == st->recent_hash)
        return;
    struct disk_op *op = disk_op_new(st, DISK_WRITE, NULL, 1);
    if (op == NULL || (op->data = malloc(len ? len : 1)) == NULL ||
        snprintf(op->paths[0], PATH_MAX, "%s/recent", st->dir_cat) >= PATH_MAX) {
        if (op != NULL)
            disk_op_free(op);
        return; /* the next sweep tries again */
    }
    memcpy(op->data, text, len);
    op->len = len;
    st->recent_hash = h;
    disk_submit(st, op);
}

/* Reads <state-dir>/catalogs/recent (diskcache_save_recent): the entries
 * it names get last_use n..1, most recent first. */
static void index_recent(struct store *st)
{
    char path[PATH_MAX];
    uint8_t *data = NULL;
    size_t len = 0;
    if (snprintf(path, sizeof(path), "%s/recent", st->dir_cat) >= (int)sizeof(path) ||
        read_file(path, &data, &len, DISKCACHE_RECENT_MAX * (STORE_HEX_LEN + 1), NULL) != 0)
        return;
    uint32_t n = (uint32_t)(len / (STORE_HEX_LEN + 1));
    for (uint32_t i = 0; i < n; i++) {
        uint8_t fp[CATALOG_FP_LEN];
        const char *line = (const char *)data + (size_t)i * (STORE_HEX_LEN + 1);
        struct store_entry *e = NULL;
        if (line[STORE_HEX_LEN] == '\n' && hex_decode(line, CATALOG_FP_LEN, fp) == 0)
            e = store_table_find(st, fp);
        if (e != NULL && e->last_use == 0)
            e->last_use = n - i;
    }
    st->tick = n;
    free(data);
}

int diskcache_open(struct store *st, const char *state_dir, struct vks_error *err)
{
    int n1 = snprintf(st->dir_cat, sizeof(st->dir_cat), "%s/catalogs", state_dir);
    int n2 = snprintf(st->dir_src, sizeof(st->dir_src), "%s/sources", state_dir);
    if (n1 >= (int)sizeof(st->dir_cat) - (int)STORE_HEX_LEN - 16 ||
        n2 >= (int)sizeof(st->dir_src) - (int)STORE_HEX_LEN - 16)
        return vks_error_set(err, -ENAMETOOLONG, "state directory path too long: %s", state_dir);
    int rc = compiler_version(&st->compiler, err);
    if (rc == 0)
        rc = make_dir(state_dir, err);
    if (rc == 0)
        rc = make_dir(st->dir_cat, err);
    if (rc == 0)
        rc = make_dir(st->dir_src, err);
    if (rc != 0)
        return rc;
    st->disk = true;
    index_catalogs(st);
    index_sources(st);
    index_recent(st);
    /* The list as read is the list on disk: the first sweep writes only a
     * change. Before, it wrote an empty list at once, over the last run's
     * list when no catalog of it was left, and a reader could see the empty
     * file before the first scan's list replaced it. */
    char text[DISKCACHE_RECENT_MAX * (STORE_HEX_LEN + 1) + 1];
    st->recent_hash = fnv1a(text, recent_text(st, text));
    return 0;
}
