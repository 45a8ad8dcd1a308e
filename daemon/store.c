/*
 * The catalog store (store.h): entries by catalog fingerprint, rule-set
 * sources by source fingerprint, owners, host LRU, and the disk cache.
 *
 * Disk layout under the state directory:
 *   catalogs/<fp>.cat     the packed catalog bytes (validated when read back)
 *   catalogs/<fp>.owners  one uid per line: who holds it
 *   sources/<src>.src     a rule set's catalog fingerprint and rejected rules
 * Every file is written to a temporary name and renamed, so a crash leaves
 * the old or the new file, never half of one. All disk operations go through
 * one FIFO run in uv_queue_work, one at a time, so a delete never overtakes
 * the write it follows.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "patfile.h"

#define HEX_LEN    (2 * CATALOG_FP_LEN)
#define N_BUCKETS  256u
#define SRC_MAGIC  0x53534b56u /* "VKSS" */
#define SRC_FORMAT 1u
#define SRC_HEADER 48u /* magic, format, compiler version, catalog fp, n_rejects */

struct store_source {
    struct store_source *next;  /* all sources */
    struct store_source *enext; /* sources of the same entry */
    uint8_t src[CATALOG_FP_LEN];
    struct store_entry *entry;
    struct rule_reject *rejects;
    size_t n_rejects;
};

struct waiter {
    struct waiter *next;
    store_cb cb;
    void *ctx;
    struct store_result res; /* entry filled in when the body arrives */
};

struct store_entry {
    struct store_entry *hnext;
    struct store_entry *lru_prev, *lru_next; /* idle, loaded, evictable */
    bool in_lru;
    uint8_t fp[CATALOG_FP_LEN];
    struct catalog *cat; /* NULL while only on disk */
    size_t bytes;
    unsigned refs;
    uid_t *owners;
    size_t n_owners, cap_owners;
    bool on_disk; /* the .cat file is written */
    bool loading;
    bool dead; /* no owner left: out of the table, freed when unreferenced */
    bool owners_writing, owners_dirty;
    struct store_source *sources;
    struct waiter *waiters;
};

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

struct compile_job {
    uv_work_t work;
    struct store *st;
    uid_t uid;
    store_cb cb;
    void *ctx;
    const struct proto_catalog_load *load;
    uint8_t src[CATALOG_FP_LEN];
    int status;
    struct vks_error err;
    struct rules_result res;
    struct rule_reject *rejects; /* merged: flag errors + compiler rejects */
    size_t n_rejects;
};

struct store {
    uv_loop_t *loop;
    struct store_options opt;
    char dir_cat[PATH_MAX], dir_src[PATH_MAX];
    bool disk;
    uint32_t compiler; /* the rules compiler version of this build */
    struct store_entry *table[N_BUCKETS];
    struct store_source *sources;
    struct store_entry *lru_head, *lru_tail; /* head = least recently used */
    struct disk_op *disk_head, *disk_tail;
    bool disk_running;
    unsigned compiling;
    store_forget_fn forget;
    void *forget_ctx;
    void (*idle)(void *ctx);
    void *idle_ctx;
    struct store_stats stats;
};

static void entry_put_back(struct store *st, struct store_entry *e);
static void disk_submit(struct store *st, struct disk_op *op);

/* ---- small helpers ---------------------------------------------------- */

static void cat_path(const struct store *st, const uint8_t fp[CATALOG_FP_LEN], const char *ext,
                     char *out, size_t cap)
{
    char hex[HEX_LEN + 1];
    catalog_fingerprint_hex(fp, hex);
    /* The directories were checked at create to leave room for the name. */
    if (snprintf(out, cap, "%s/%s.%s", st->dir_cat, hex, ext) >= (int)cap)
        out[0] = '\0';
}

static void src_path(const struct store *st, const uint8_t src[CATALOG_FP_LEN], char *out,
                     size_t cap)
{
    char hex[HEX_LEN + 1];
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

static bool entry_owned(const struct store_entry *e, uid_t uid)
{
    for (size_t i = 0; i < e->n_owners; i++) {
        if (e->owners[i] == uid)
            return true;
    }
    return false;
}

static int entry_add_owner(struct store_entry *e, uid_t uid)
{
    if (entry_owned(e, uid))
        return 0;
    if (e->n_owners == e->cap_owners) {
        size_t cap = e->cap_owners ? 2 * e->cap_owners : 4;
        uid_t *v = realloc(e->owners, cap * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        e->owners = v;
        e->cap_owners = cap;
    }
    e->owners[e->n_owners++] = uid;
    return 1;
}

static struct store_entry *table_find(const struct store *st, const uint8_t fp[CATALOG_FP_LEN])
{
    for (struct store_entry *e = st->table[fp[0]]; e != NULL; e = e->hnext) {
        if (memcmp(e->fp, fp, CATALOG_FP_LEN) == 0)
            return e;
    }
    return NULL;
}

static struct store_source *source_find(const struct store *st, const uint8_t src[CATALOG_FP_LEN])
{
    for (struct store_source *s = st->sources; s != NULL; s = s->next) {
        if (memcmp(s->src, src, CATALOG_FP_LEN) == 0)
            return s;
    }
    return NULL;
}

static struct store_entry *entry_new(struct store *st, const uint8_t fp[CATALOG_FP_LEN])
{
    struct store_entry *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    memcpy(e->fp, fp, CATALOG_FP_LEN);
    e->hnext = st->table[fp[0]];
    st->table[fp[0]] = e;
    st->stats.catalogs++;
    return e;
}

static void source_free(struct store_source *s)
{
    free(s->rejects);
    free(s);
}

/* Adds a source record for `e`; takes ownership of `rejects`, also on
 * failure. */
static struct store_source *source_add(struct store *st, struct store_entry *e,
                                       const uint8_t src[CATALOG_FP_LEN],
                                       struct rule_reject *rejects, size_t n_rejects)
{
    struct store_source *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        free(rejects);
        return NULL;
    }
    memcpy(s->src, src, CATALOG_FP_LEN);
    s->entry = e;
    s->rejects = rejects;
    s->n_rejects = n_rejects;
    s->next = st->sources;
    st->sources = s;
    s->enext = e->sources;
    e->sources = s;
    return s;
}

/* ---- host LRU --------------------------------------------------------- */

static void lru_remove(struct store *st, struct store_entry *e)
{
    if (!e->in_lru)
        return;
    if (e->lru_prev != NULL)
        e->lru_prev->lru_next = e->lru_next;
    else
        st->lru_head = e->lru_next;
    if (e->lru_next != NULL)
        e->lru_next->lru_prev = e->lru_prev;
    else
        st->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
    e->in_lru = false;
}

static void lru_push(struct store *st, struct store_entry *e)
{
    e->lru_next = NULL;
    e->lru_prev = st->lru_tail;
    if (st->lru_tail != NULL)
        st->lru_tail->lru_next = e;
    else
        st->lru_head = e;
    st->lru_tail = e;
    e->in_lru = true;
}

static void body_drop(struct store *st, struct store_entry *e)
{
    if (e->cat == NULL)
        return;
    catalog_destroy(e->cat);
    e->cat = NULL;
    st->stats.host_bytes -= e->bytes;
    st->stats.in_memory--;
}

static void body_set(struct store *st, struct store_entry *e, struct catalog *cat)
{
    size_t words;
    catalog_words(cat, &words);
    e->cat = cat;
    e->bytes = words * 4;
    st->stats.host_bytes += e->bytes;
    st->stats.in_memory++;
}

/* Frees idle bodies that are safe on disk, least recently used first, until
 * the host budget holds. */
static void lru_trim(struct store *st)
{
    while (st->lru_head != NULL && st->stats.host_bytes > st->opt.host_budget) {
        struct store_entry *e = st->lru_head;
        lru_remove(st, e);
        if (e->refs > 0 || e->waiters != NULL)
            continue; /* referenced again since it went idle: not evictable */
        body_drop(st, e);
        st->stats.host_evictions++;
    }
}

static void entry_free(struct store *st, struct store_entry *e)
{
    lru_remove(st, e);
    body_drop(st, e);
    while (e->sources != NULL) {
        struct store_source *s = e->sources;
        e->sources = s->enext;
        source_free(s);
    }
    free(e->owners);
    free(e);
}

static void table_remove(struct store *st, struct store_entry *e)
{
    for (struct store_entry **p = &st->table[e->fp[0]]; *p != NULL; p = &(*p)->hnext) {
        if (*p == e) {
            *p = e->hnext;
            break;
        }
    }
    st->stats.catalogs--;
}

void store_entry_ref(struct store_entry *e)
{
    e->refs++;
}

/* An unreferenced entry becomes evictable (when on disk) or is freed (dead). */
static void entry_put_back(struct store *st, struct store_entry *e)
{
    if (e->refs > 0 || e->waiters != NULL || e->loading)
        return;
    if (e->dead) {
        entry_free(st, e);
        return;
    }
    if (e->cat != NULL && e->on_disk) {
        lru_remove(st, e); /* most recently used goes to the tail */
        lru_push(st, e);
        lru_trim(st);
    }
}

void store_entry_unref(struct store *st, struct store_entry *e)
{
    if (e == NULL)
        return;
    e->refs--;
    entry_put_back(st, e);
}

const struct catalog *store_entry_catalog(const struct store_entry *e)
{
    return e->cat;
}

const uint8_t *store_entry_fp(const struct store_entry *e)
{
    return e->fp;
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
    if (fdatasync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        int rc = -errno;
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
        if (op->status == 0)
            op->status = catalog_from_bytes(buf, len, &op->cat, &op->err);
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
    if (op->entry != NULL)
        store_entry_unref(st, op->entry);
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
    if (e != NULL)
        store_entry_ref(e);
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

static void save_catalog(struct store *st, struct store_entry *e)
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

static void owners_save(struct store *st, struct store_entry *e);

static void owners_written(struct disk_op *op)
{
    struct store_entry *e = op->entry;
    e->owners_writing = false;
    if (e->owners_dirty && !e->dead) {
        e->owners_dirty = false;
        owners_save(op->st, e);
    }
}

static void owners_save(struct store *st, struct store_entry *e)
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

static void source_save(struct store *st, const struct store_source *s)
{
    if (!st->disk)
        return;
    size_t len = SRC_HEADER;
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
    op->len = (size_t)(p - op->data);
    src_path(st, s->src, op->paths[0], PATH_MAX);
    disk_submit(st, op);
}

/* Parses a .src file; returns 0 and the rejects (owned by the caller). */
static int source_parse(const uint8_t *p, size_t len, uint32_t compiler, uint8_t fp[CATALOG_FP_LEN],
                        struct rule_reject **out, size_t *n_out)
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
    *out = v;
    *n_out = n;
    return 0;
bad:
    free(v);
    return -EINVAL;
}

/* ---- bodies and waiters ----------------------------------------------- */

static void deliver(struct store *st, struct store_entry *e, struct waiter *w, int status,
                    const struct vks_error *err)
{
    w->res.entry = status == 0 ? e : NULL;
    if (status != 0)
        w->res.known = false;
    w->cb(w->ctx, status, &w->res, err);
    free(w);
    store_entry_unref(st, e);
}

static void body_loaded(struct disk_op *op)
{
    struct store *st = op->st;
    struct store_entry *e = op->entry;
    e->loading = false;
    if (op->status == 0) {
        if (e->cat == NULL)
            body_set(st, e, op->cat);
        else
            catalog_destroy(op->cat);
        op->cat = NULL;
        st->stats.disk_loads++;
    } else {
        e->on_disk = false; /* unreadable: the next load of its rules compiles again */
        vks_error_set(&op->err, -EIO,
                      "catalog cache entry unreadable (%.180s): load the "
                      "rules again",
                      op->err.msg);
    }
    struct waiter *w = e->waiters;
    e->waiters = NULL;
    while (w != NULL) {
        struct waiter *next = w->next;
        deliver(st, e, w, op->status == 0 ? 0 : -EIO, &op->err);
        w = next;
    }
}

/* Calls `w` back once `e` has its body, now or after a disk read. Takes
 * ownership of `w`; holds a reference on `e` until the callback ran. */
static void when_ready(struct store *st, struct store_entry *e, struct waiter *w)
{
    store_entry_ref(e);
    if (e->cat != NULL) {
        st->stats.memory_hits++;
        deliver(st, e, w, 0, NULL);
        return;
    }
    w->next = e->waiters;
    e->waiters = w;
    if (e->loading)
        return;
    struct vks_error err;
    struct disk_op *op = disk_op_new(st, DISK_READ_CATALOG, e, 1);
    if (op == NULL) {
        e->waiters = NULL;
        vks_error_set(&err, -ENOMEM, "out of memory reading a cached catalog");
        for (struct waiter *x = w, *next; x != NULL; x = next) {
            next = x->next;
            deliver(st, e, x, -ENOMEM, &err);
        }
        return;
    }
    cat_path(st, e->fp, "cat", op->paths[0], PATH_MAX);
    op->done = body_loaded;
    e->loading = true;
    disk_submit(st, op);
}

static struct waiter *waiter_new(store_cb cb, void *ctx)
{
    struct waiter *w = calloc(1, sizeof(*w));
    if (w != NULL) {
        w->cb = cb;
        w->ctx = ctx;
    }
    return w;
}

static void fail(store_cb cb, void *ctx, int code, const char *fmt, ...) VKS_PRINTF(4, 5);

static void fail(store_cb cb, void *ctx, int code, const char *fmt, ...)
{
    struct vks_error err = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof(err.msg), fmt, ap);
    va_end(ap);
    struct store_result res = {0};
    cb(ctx, code, &res, &err);
}

uint32_t store_tenant_catalogs(const struct store *st, uid_t uid)
{
    uint32_t n = 0;
    for (unsigned b = 0; b < N_BUCKETS; b++) {
        for (const struct store_entry *e = st->table[b]; e != NULL; e = e->hnext)
            n += entry_owned(e, uid);
    }
    return n;
}

/* Makes `uid` an owner of `e`, within its quota. */
static int take_ownership(struct store *st, struct store_entry *e, uid_t uid, struct vks_error *err)
{
    if (entry_owned(e, uid))
        return 0;
    uint32_t held = store_tenant_catalogs(st, uid);
    if (held >= st->opt.tenant_max_catalogs)
        return vks_error_set(err, -VKS_E_BUSY,
                             "uid %u holds %u catalogs, the limit "
                             "(tenant-max-catalogs) is %u: drop one with catalog.drop first",
                             (unsigned)uid, held, st->opt.tenant_max_catalogs);
    if (entry_add_owner(e, uid) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory adding a catalog owner");
    owners_save(st, e);
    return 0;
}

/* Answers a load or has from a known source record. */
static void answer_source(struct store *st, uid_t uid, struct store_source *s, bool is_load,
                          store_cb cb, void *ctx)
{
    struct store_entry *e = s->entry;
    if (is_load) {
        struct vks_error err;
        int rc = take_ownership(st, e, uid, &err);
        if (rc != 0) {
            cb(ctx, rc, &(struct store_result){0}, &err);
            return;
        }
        st->stats.cache_hits++;
    }
    struct waiter *w = waiter_new(cb, ctx);
    if (w == NULL) {
        fail(cb, ctx, -ENOMEM, "out of memory answering a catalog request");
        return;
    }
    w->res.known = true;
    w->res.source = s->src;
    w->res.rejects = s->rejects;
    w->res.n_rejects = s->n_rejects;
    w->res.cached = is_load;
    when_ready(st, e, w);
}

/* Forgets a catalog no one holds: out of the table now, its files deleted
 * (after any pending write, by FIFO order), freed once unreferenced. */
static void entry_kill(struct store *st, struct store_entry *e)
{
    size_t n_src = 0;
    for (struct store_source *s = e->sources; s != NULL; s = s->enext)
        n_src++;
    e->dead = true;
    table_remove(st, e);
    if (st->forget != NULL)
        st->forget(st->forget_ctx, e->fp);
    struct disk_op *op = st->disk ? disk_op_new(st, DISK_DELETE, NULL, 2 + n_src) : NULL;
    if (op != NULL) {
        cat_path(st, e->fp, "cat", op->paths[0], PATH_MAX);
        cat_path(st, e->fp, "owners", op->paths[1], PATH_MAX);
        size_t i = 2;
        for (struct store_source *s = e->sources; s != NULL; s = s->enext)
            src_path(st, s->src, op->paths[i++], PATH_MAX);
        disk_submit(st, op);
    }
    /* Unlisted now so no lookup finds them; freed with the entry, since
     * waiting callbacks may still point at their rejects. */
    for (struct store_source **p = &st->sources; *p != NULL;) {
        if ((*p)->entry == e)
            *p = (*p)->next;
        else
            p = &(*p)->next;
    }
    entry_put_back(st, e);
}

/* ---- compiling -------------------------------------------------------- */

static void sink_hash(void *ctx, const void *data, size_t len)
{
    crypto_generichash_update(ctx, data, (unsigned long long)len);
}

static void source_fingerprint(const struct proto_catalog_load *load, uint8_t out[CATALOG_FP_LEN])
{
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, CATALOG_FP_LEN);
    proto_source_canon(load, sink_hash, &h);
    crypto_generichash_final(&h, out, CATALOG_FP_LEN);
}

static int push_reject(struct compile_job *j, uint32_t index, uint32_t line, const char *id,
                       const char *msg)
{
    struct rule_reject *v = realloc(j->rejects, (j->n_rejects + 1) * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    j->rejects = v;
    struct rule_reject *r = &v[j->n_rejects++];
    memset(r, 0, sizeof(*r));
    r->index = index;
    r->line = line;
    snprintf(r->id, sizeof(r->id), "%s", id);
    snprintf(r->msg, sizeof(r->msg), "%s", msg);
    return 0;
}

static int cmp_reject(const void *a, const void *b)
{
    const struct rule_reject *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Compiles `srcs[0..n)`, whose input indexes are `index[i]` in the request,
 * and merges the compiler's rejects with the ones already in `j`. */
static int compile_sources(struct compile_job *j, const struct rule_src *srcs,
                           const uint32_t *index, size_t n)
{
    struct rules_options ro = {.max_states = j->load->max_states};
    int rc = rules_compile(srcs, n, &ro, &j->res, &j->err);
    if (rc != 0) {
        if (rc != -ENOMEM)
            vks_error_set(&j->err, -VKS_E_RULES, "the rule set cannot be compiled: %.200s",
                          j->err.msg);
        return rc == -ENOMEM ? rc : -VKS_E_RULES;
    }
    for (size_t i = 0; i < j->res.n_rejects; i++) {
        struct rule_reject r = j->res.rejects[i];
        r.index = index[r.index];
        if (push_reject(j, r.index, r.line, r.id, r.msg) != 0)
            return vks_error_set(&j->err, -ENOMEM, "out of memory collecting rejects");
        j->rejects[j->n_rejects - 1].pos = r.pos;
    }
    if (j->n_rejects > 1)
        qsort(j->rejects, j->n_rejects, sizeof(*j->rejects), cmp_reject);
    return 0;
}

/* The rule list form of catalog.load: flags are parsed here, so a rule with
 * unknown flag letters is a reject like any other bad rule. */
static int compile_list(struct compile_job *j)
{
    const struct proto_catalog_load *load = j->load;
    struct rule_src *srcs = calloc(load->n_rules ? load->n_rules : 1, sizeof(*srcs));
    uint32_t *index = calloc(load->n_rules ? load->n_rules : 1, sizeof(*index));
    int rc = 0;
    size_t n = 0;
    if (srcs == NULL || index == NULL) {
        rc = vks_error_set(&j->err, -ENOMEM, "out of memory compiling %u rules", load->n_rules);
        goto out;
    }
    for (uint32_t i = 0; i < load->n_rules && rc == 0; i++) {
        const struct proto_rule *r = &load->rules[i];
        struct vks_error ferr;
        uint32_t flags = 0;
        if (rules_parse_flags(r->flags, strlen(r->flags), &flags, &ferr) != 0) {
            rc = push_reject(j, i, 0, r->id, ferr.msg);
            continue;
        }
        srcs[n] = (struct rule_src){.id = r->id,
                                    .kind = (enum rule_kind)r->kind,
                                    .pattern = r->pattern,
                                    .len = r->pattern_len,
                                    .flags = flags};
        index[n++] = i;
    }
    if (rc == 0)
        rc = compile_sources(j, srcs, index, n);
    else
        vks_error_set(&j->err, rc, "out of memory collecting rejects");
out:
    free(srcs);
    free(index);
    return rc;
}

/* The pattern-file form of catalog.load: lines that are not rules are
 * rejects with their line numbers; rules are indexed in file order. */
static int compile_text(struct compile_job *j)
{
    struct patfile pf = {0};
    int rc = patfile_parse(j->load->text, j->load->text_len, &pf, &j->err);
    uint32_t *index = rc == 0 ? calloc(pf.n ? pf.n : 1, sizeof(*index)) : NULL;
    if (rc == 0 && index == NULL)
        rc = vks_error_set(&j->err, -ENOMEM, "out of memory compiling a pattern file");
    for (size_t i = 0; rc == 0 && i < pf.n_rejects; i++) {
        const struct rule_reject *r = &pf.rejects[i];
        rc = push_reject(j, r->index, r->line, r->id, r->msg);
        if (rc == 0)
            j->rejects[j->n_rejects - 1].pos = r->pos;
        else
            vks_error_set(&j->err, rc, "out of memory collecting rejects");
    }
    for (size_t i = 0; rc == 0 && i < pf.n; i++)
        index[i] = (uint32_t)i;
    if (rc == 0)
        rc = compile_sources(j, pf.rules, index, pf.n);
    free(index);
    patfile_finish(&pf);
    return rc;
}

static void compile_work(uv_work_t *w)
{
    struct compile_job *j = w->data;
    j->status = j->load->has_text ? compile_text(j) : compile_list(j);
}

static void compile_job_free(struct compile_job *j)
{
    rules_result_finish(&j->res);
    free(j->rejects);
    free(j);
}

/* Files the compiled catalog under its fingerprint (sharing an equal one
 * that is already known), records the source and answers the load. */
static void compile_done(uv_work_t *w, int status)
{
    struct compile_job *j = w->data;
    struct store *st = j->st;
    st->compiling--;
    if (status == UV_ECANCELED && j->status == 0)
        j->status = vks_error_set(&j->err, -ECANCELED, "the daemon is shutting down");
    if (j->status != 0) {
        j->cb(j->ctx, j->status, &(struct store_result){0}, &j->err);
        compile_job_free(j);
        return;
    }
    st->stats.compiles++;
    st->stats.compile_ns += j->res.compile_ns;
    struct catalog *cat = j->res.catalog;
    j->res.catalog = NULL;
    const uint8_t *fp = catalog_fingerprint(cat);
    struct store_entry *e = table_find(st, fp);
    bool fresh = e == NULL;
    if (fresh && (e = entry_new(st, fp)) == NULL) {
        catalog_destroy(cat);
        fail(j->cb, j->ctx, -ENOMEM, "out of memory storing a catalog");
        compile_job_free(j);
        return;
    }
    if (e->cat == NULL)
        body_set(st, e, cat);
    else
        catalog_destroy(cat);
    if (!e->on_disk)
        save_catalog(st, e);
    struct store_source *s = source_find(st, j->src);
    if (s == NULL) {
        s = source_add(st, e, j->src, j->rejects, j->n_rejects);
        j->rejects = NULL;
        if (s != NULL)
            source_save(st, s);
    }
    struct vks_error err;
    int rc = s == NULL ? vks_error_set(&err, -ENOMEM, "out of memory recording a rule set")
                       : take_ownership(st, e, j->uid, &err);
    if (rc != 0) {
        j->cb(j->ctx, rc, &(struct store_result){0}, &err);
    } else {
        store_entry_ref(e);
        struct store_result res = {.known = true,
                                   .entry = e,
                                   .source = s->src,
                                   .rejects = s->rejects,
                                   .n_rejects = s->n_rejects,
                                   .compile_ns = j->res.compile_ns};
        j->cb(j->ctx, 0, &res, NULL);
        store_entry_unref(st, e);
    }
    if (e->n_owners == 0)
        entry_kill(st, e); /* nobody could take it (quota): forget it again */
    else
        entry_put_back(st, e);
    compile_job_free(j);
}

static void compile_after(uv_work_t *w, int status)
{
    struct store *st = ((struct compile_job *)w->data)->st;
    compile_done(w, status);
    if (!store_busy(st) && st->idle != NULL)
        st->idle(st->idle_ctx);
}

void store_load(struct store *st, uid_t uid, const struct proto_catalog_load *load, store_cb cb,
                void *ctx)
{
    uint8_t src[CATALOG_FP_LEN];
    source_fingerprint(load, src);
    struct store_source *s = source_find(st, src);
    if (s != NULL) {
        answer_source(st, uid, s, true, cb, ctx);
        return;
    }
    uint32_t held = store_tenant_catalogs(st, uid);
    if (held >= st->opt.tenant_max_catalogs) {
        fail(cb, ctx, -VKS_E_BUSY,
             "uid %u holds %u catalogs, the limit (tenant-max-catalogs) "
             "is %u: drop one with catalog.drop first",
             (unsigned)uid, held, st->opt.tenant_max_catalogs);
        return;
    }
    struct compile_job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        fail(cb, ctx, -ENOMEM, "out of memory starting a compile");
        return;
    }
    j->st = st;
    j->uid = uid;
    j->cb = cb;
    j->ctx = ctx;
    j->load = load;
    memcpy(j->src, src, CATALOG_FP_LEN);
    j->work.data = j;
    int rc = uv_queue_work(st->loop, &j->work, compile_work, compile_after);
    if (rc != 0) {
        fail(cb, ctx, -ENOMEM, "cannot queue the compile: %s", uv_strerror(rc));
        free(j);
        return;
    }
    st->compiling++;
}

/* ---- has, acquire, drop ----------------------------------------------- */

void store_has(struct store *st, uid_t uid, const struct proto_catalog_ref *ref, store_cb cb,
               void *ctx)
{
    if (ref->by_source) {
        struct store_source *s = source_find(st, ref->fp);
        if (s != NULL && entry_owned(s->entry, uid)) {
            answer_source(st, uid, s, false, cb, ctx);
            return;
        }
    } else {
        struct store_entry *e = table_find(st, ref->fp);
        if (e != NULL && entry_owned(e, uid)) {
            struct waiter *w = waiter_new(cb, ctx);
            if (w == NULL) {
                fail(cb, ctx, -ENOMEM, "out of memory answering catalog.has");
                return;
            }
            w->res.known = true;
            if (e->sources != NULL) {
                w->res.source = e->sources->src;
                w->res.rejects = e->sources->rejects;
                w->res.n_rejects = e->sources->n_rejects;
            }
            when_ready(st, e, w);
            return;
        }
    }
    /* Unknown, or held only by other tenants: the same answer, so a tenant
     * cannot probe what others have loaded. */
    struct store_result res = {.known = false};
    cb(ctx, 0, &res, NULL);
}

void store_acquire(struct store *st, uid_t uid, const uint8_t fp[CATALOG_FP_LEN], store_cb cb,
                   void *ctx)
{
    struct store_entry *e = table_find(st, fp);
    if (e == NULL || !entry_owned(e, uid)) {
        char hex[HEX_LEN + 1];
        catalog_fingerprint_hex(fp, hex);
        fail(cb, ctx, -VKS_E_UNKNOWN_CATALOG,
             "catalog %.16s... is not loaded by uid %u: "
             "send catalog.load first",
             hex, (unsigned)uid);
        return;
    }
    struct waiter *w = waiter_new(cb, ctx);
    if (w == NULL) {
        fail(cb, ctx, -ENOMEM, "out of memory starting a scan");
        return;
    }
    w->res.known = true;
    when_ready(st, e, w);
}

int store_drop(struct store *st, uid_t uid, const uint8_t fp[CATALOG_FP_LEN])
{
    struct store_entry *e = table_find(st, fp);
    if (e == NULL || !entry_owned(e, uid))
        return 0;
    for (size_t i = 0; i < e->n_owners; i++) {
        if (e->owners[i] == uid) {
            e->owners[i] = e->owners[--e->n_owners];
            break;
        }
    }
    if (e->n_owners == 0)
        entry_kill(st, e);
    else
        owners_save(st, e);
    return 1;
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
        if (entry_add_owner(e, (uid_t)v) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* Returns true when `name` is "<64 hex>.<ext>" and fills `fp`. */
static bool name_fp(const char *name, const char *ext, uint8_t fp[CATALOG_FP_LEN])
{
    size_t n = strlen(name);
    if (n != HEX_LEN + 1 + strlen(ext) || name[HEX_LEN] != '.' ||
        strcmp(name + HEX_LEN + 1, ext) != 0)
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
        struct store_entry *e = table_find(st, fp);
        if (e == NULL)
            e = entry_new(st, fp);
        if (e != NULL) {
            e->on_disk = true;
            if (parse_owners(data, len, e) != 0)
                st->stats.disk_errors++;
            if (e->n_owners == 0) {
                table_remove(st, e);
                entry_free(st, e);
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
        if (read_file(path, &data, &len, 1 << 28, NULL) != 0 ||
            source_parse(data, len, st->compiler, fp, &rejects, &n) != 0) {
            unlink(path); /* unreadable or stale: the next load of its rules compiles */
            free(data);
            continue;
        }
        free(data);
        struct store_entry *e = table_find(st, fp);
        if (e == NULL || source_find(st, src) != NULL)
            free(rejects); /* its catalog is gone: the next load compiles */
        else
            source_add(st, e, src, rejects, n);
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

int store_create(uv_loop_t *loop, const struct store_options *opt, struct store **out,
                 struct vks_error *err)
{
    struct store *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return vks_error_set(err, -ENOMEM, "out of memory creating the catalog store");
    st->loop = loop;
    store_set_options(st, opt);
    if (opt->state_dir != NULL && opt->state_dir[0] != '\0') {
        int n1 = snprintf(st->dir_cat, sizeof(st->dir_cat), "%s/catalogs", opt->state_dir);
        int n2 = snprintf(st->dir_src, sizeof(st->dir_src), "%s/sources", opt->state_dir);
        if (n1 >= (int)sizeof(st->dir_cat) - (int)HEX_LEN - 16 ||
            n2 >= (int)sizeof(st->dir_src) - (int)HEX_LEN - 16) {
            free(st);
            return vks_error_set(err, -ENAMETOOLONG, "state directory path too long: %s",
                                 opt->state_dir);
        }
        int rc = compiler_version(&st->compiler, err);
        if (rc == 0)
            rc = make_dir(opt->state_dir, err);
        if (rc == 0)
            rc = make_dir(st->dir_cat, err);
        if (rc == 0)
            rc = make_dir(st->dir_src, err);
        if (rc != 0) {
            free(st);
            return rc;
        }
        st->disk = true;
        index_catalogs(st);
        index_sources(st);
    }
    *out = st;
    return 0;
}

bool store_busy(const struct store *st)
{
    return st->compiling > 0 || st->disk_running || st->disk_head != NULL;
}

void store_destroy(struct store *st)
{
    if (st == NULL)
        return;
    for (unsigned b = 0; b < N_BUCKETS; b++) {
        while (st->table[b] != NULL) {
            struct store_entry *e = st->table[b];
            st->table[b] = e->hnext;
            entry_free(st, e);
        }
    }
    free(st);
}

void store_set_options(struct store *st, const struct store_options *opt)
{
    st->opt = *opt;
    st->opt.state_dir = NULL; /* fixed at create */
    if (st->opt.tenant_max_catalogs == 0)
        st->opt.tenant_max_catalogs = UINT32_MAX;
}

void store_set_idle(struct store *st, void (*fn)(void *ctx), void *ctx)
{
    st->idle = fn;
    st->idle_ctx = ctx;
}

void store_set_forget(struct store *st, store_forget_fn fn, void *ctx)
{
    st->forget = fn;
    st->forget_ctx = ctx;
}

void store_get_stats(const struct store *st, struct store_stats *out)
{
    *out = st->stats;
}
