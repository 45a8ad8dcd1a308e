/*
 * The catalog store (store.h): entries by catalog fingerprint, rule-set
 * sources by source fingerprint, owners, host LRU, compiling, and the
 * answers to catalog.load / has / drop and scans. The disk cache under the
 * state directory is diskcache.c's.
 */
#include "store.h"

#include <errno.h>
#include <limits.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpool.h"
#include "diskcache.h"
#include "log.h"
#include "patfile.h"
#include "store_internal.h"

enum stop_why { STOP_NONE = 0, STOP_CLIENT_LEFT, STOP_TIMEOUT, STOP_SHUTDOWN };

struct compile_job {
    struct cpool_job cj;
    struct compile_job *next, *prev; /* st->compiles */
    uint64_t started_ms; /* CLOCK_MONOTONIC ms when a thread took it, 0: queued (__atomic) */
    enum stop_why why;
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

static void entry_put_back(struct store *st, struct store_entry *e);

/* ---- small helpers ---------------------------------------------------- */

static bool entry_owned(const struct store_entry *e, uid_t uid)
{
    for (size_t i = 0; i < e->n_owners; i++) {
        if (e->owners[i] == uid)
            return true;
    }
    return false;
}

int store_entry_add_owner(struct store_entry *e, uid_t uid)
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

struct store_entry *store_table_find(const struct store *st, const uint8_t fp[CATALOG_FP_LEN])
{
    for (struct store_entry *e = st->table[fp[0]]; e != NULL; e = e->hnext) {
        if (memcmp(e->fp, fp, CATALOG_FP_LEN) == 0)
            return e;
    }
    return NULL;
}

struct store_source *store_source_find(const struct store *st, const uint8_t src[CATALOG_FP_LEN])
{
    for (struct store_source *s = st->sources; s != NULL; s = s->next) {
        if (memcmp(s->src, src, CATALOG_FP_LEN) == 0)
            return s;
    }
    return NULL;
}

struct store_entry *store_entry_new(struct store *st, const uint8_t fp[CATALOG_FP_LEN])
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
struct store_source *store_source_add(struct store *st, struct store_entry *e,
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
    proto_buf_finish(&e->rules_packed[0]);
    proto_buf_finish(&e->rules_packed[1]);
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

void store_entry_free(struct store *st, struct store_entry *e)
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

void store_table_remove(struct store *st, struct store_entry *e)
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
        store_entry_free(st, e);
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

int store_entry_rules_packed(struct store *st, struct store_entry *e, bool ids_only,
                             const uint8_t **p, size_t *len, struct vks_error *err)
{
    struct proto_buf *b = &e->rules_packed[ids_only];
    if (b->len == 0) {
        uint32_t n = catalog_rule_count(e->cat);
        struct proto_rule_info *rules = calloc(n ? n : 1, sizeof(*rules));
        char *ids = malloc((size_t)n * (RULES_MAX_ID + 1) + 1);
        int rc = rules == NULL || ids == NULL
                     ? vks_error_set(err, -ENOMEM, "out of memory packing a catalog's rules")
                     : 0;
        char *q = ids;
        for (uint32_t i = 0; rc == 0 && i < n; i++) {
            struct catalog_rule r;
            catalog_rule(e->cat, i, &r);
            uint32_t l = r.id_len > RULES_MAX_ID ? RULES_MAX_ID : r.id_len;
            memcpy(q, r.id, l);
            q[l] = '\0';
            rules[i].id = q;
            q += l + 1;
            memcpy(rules[i].fp, r.fingerprint, PROTO_FP_LEN);
        }
        if (rc == 0)
            rc = proto_pack_rules(b, rules, n, ids_only, err);
        free(rules);
        free(ids);
        if (rc < 0) {
            proto_buf_finish(b);
            return rc;
        }
        e->bytes += b->len;
        st->stats.host_bytes += b->len;
    }
    *p = b->data;
    *len = b->len;
    return 0;
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

static void entry_kill(struct store *st, struct store_entry *e);

void store_catalog_read(struct store *st, struct store_entry *e, int status, struct catalog *cat,
                        const struct vks_error *read_err)
{
    struct vks_error err = {0};
    struct waiter *w = e->waiters;
    e->waiters = NULL;
    e->loading = false;
    if (status == 0) {
        if (e->cat == NULL)
            body_set(st, e, cat);
        else
            catalog_destroy(cat);
        st->stats.disk_loads++;
    } else {
        /* Unreadable (corrupt, truncated, gone): forget the entry, its
         * source records and its files, so that no later request reads
         * them again. Loads waiting on it compile their rules instead;
         * other requests learn that the catalog must be loaded again. */
        e->on_disk = false;
        st->stats.disk_read_failures++;
        if (!e->dead)
            entry_kill(st, e);
        vks_error_set(&err, -EIO,
                      "catalog cache entry unreadable (%.160s), now deleted: load the "
                      "rules again",
                      read_err != NULL ? read_err->msg : "");
    }
    while (w != NULL) {
        struct waiter *next = w->next;
        if (status != 0 && w->load != NULL) {
            store_load(st, w->uid, w->load, w->cb, w->ctx);
            free(w);
            store_entry_unref(st, e);
        } else if (status != 0 && w->has) {
            w->cb(w->ctx, 0, &(struct store_result){.known = false}, NULL);
            free(w);
            store_entry_unref(st, e);
        } else {
            deliver(st, e, w, status == 0 ? 0 : -EIO, &err);
        }
        w = next;
    }
}

/* Calls `w` back once `e` has its body, now or after a disk read. Takes
 * ownership of `w`; holds a reference on `e` until the callback ran. */
static void body_ready(struct store *st, struct store_entry *e, struct waiter *w)
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
    e->loading = true;
    if (diskcache_read_catalog(st, e) == 0)
        return; /* store_catalog_read answers the waiters */
    e->loading = false;
    e->waiters = NULL;
    struct vks_error err;
    vks_error_set(&err, -ENOMEM, "out of memory reading a cached catalog");
    for (struct waiter *x = w, *next; x != NULL; x = next) {
        next = x->next;
        deliver(st, e, x, -ENOMEM, &err);
    }
}

/* body_ready for a tenant's request: the entry counts as used now. */
static void when_ready(struct store *st, struct store_entry *e, struct waiter *w)
{
    e->last_use = ++st->tick;
    body_ready(st, e, w);
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
    for (unsigned b = 0; b < STORE_BUCKETS; b++) {
        for (const struct store_entry *e = st->table[b]; e != NULL; e = e->hnext)
            n += entry_owned(e, uid);
    }
    return n;
}

/* Takes `uid` off the owners of `e`; the last owner gone, `e` goes too. */
static void owner_remove(struct store *st, struct store_entry *e, uid_t uid)
{
    for (size_t i = 0; i < e->n_owners; i++) {
        if (e->owners[i] == uid) {
            e->owners[i] = e->owners[--e->n_owners];
            break;
        }
    }
    if (e->n_owners == 0)
        entry_kill(st, e);
    else
        diskcache_save_owners(st, e);
}

/* The least recently used catalog of `uid` that nothing holds now (no scan,
 * stream, load or disk read), or NULL when every one is in use; `n_idle`
 * gets how many such catalogs it holds. */
static struct store_entry *tenant_idle_lru(const struct store *st, uid_t uid, uint32_t *n_idle)
{
    struct store_entry *best = NULL;
    *n_idle = 0;
    for (unsigned b = 0; b < STORE_BUCKETS; b++) {
        for (struct store_entry *e = st->table[b]; e != NULL; e = e->hnext) {
            /* the disk cache's writes hold references too; they do not
             * use the catalog, and a released one is freed after them */
            if (!entry_owned(e, uid) || e->refs > e->disk_refs || e->waiters != NULL || e->loading)
                continue;
            ++*n_idle;
            if (best == NULL || e->last_use < best->last_use)
                best = e;
        }
    }
    return best;
}

/* Room for one more catalog of `uid`. A tenant at tenant-max-catalogs that
 * loads another one gives up its least recently used idle catalogs (a later
 * scan of one gets UNKNOWN_CATALOG: load it again, as the CLI does), so that
 * a user running `vkscan scan` with many rule files is never stuck; BUSY
 * only when too many are in use. With `evict` false, only says whether the
 * room can be made. */
static int tenant_room(struct store *st, uid_t uid, bool evict, struct vks_error *err)
{
    uint32_t held = store_tenant_catalogs(st, uid), n_idle;
    if (held < st->opt.tenant_max_catalogs)
        return 0;
    uint32_t over = held - st->opt.tenant_max_catalogs + 1;
    struct store_entry *victim = tenant_idle_lru(st, uid, &n_idle);
    if (n_idle < over)
        return vks_error_set(err, -VKS_E_BUSY,
                             "uid %u holds %u catalogs, the limit (tenant-max-catalogs) is %u, "
                             "and %u of them are in use by scans or streams: drop one with "
                             "catalog.drop, or retry when a scan has finished",
                             (unsigned)uid, held, st->opt.tenant_max_catalogs, held - n_idle);
    for (; evict && over > 0; over--) {
        char hex[STORE_HEX_LEN + 1];
        sodium_bin2hex(hex, sizeof(hex), victim->fp, CATALOG_FP_LEN);
        log_info("uid %u at tenant-max-catalogs (%u): catalog %.16s, its least recently used, "
                 "released for a new one",
                 (unsigned)uid, st->opt.tenant_max_catalogs, hex);
        st->stats.tenant_evictions++;
        owner_remove(st, victim, uid);
        if (over > 1)
            victim = tenant_idle_lru(st, uid, &n_idle);
    }
    return 0;
}

/* Makes `uid` an owner of `e`, within its quota. */
static int take_ownership(struct store *st, struct store_entry *e, uid_t uid, struct vks_error *err)
{
    if (entry_owned(e, uid))
        return 0;
    int rc = tenant_room(st, uid, true, err);
    if (rc != 0)
        return rc;
    if (store_entry_add_owner(e, uid) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory adding a catalog owner");
    diskcache_save_owners(st, e);
    return 0;
}

/* Answers a load or has from a known source record. */
static void answer_source(struct store *st, uid_t uid, struct store_source *s,
                          const struct proto_catalog_load *load, store_cb cb, void *ctx)
{
    bool is_load = load != NULL;
    struct store_entry *e = s->entry;
    bool had = entry_owned(e, uid); /* cached only if THIS tenant had it */
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
    w->res.cached = is_load && had;
    w->res.compile_ns = is_load && !had ? s->compile_ns : 0;
    w->load = load;
    w->uid = uid;
    w->has = !is_load;
    when_ready(st, e, w);
}

/* Forgets a catalog no one holds: out of the table now, its files deleted
 * (after any pending write, by FIFO order), freed once unreferenced. */
static void entry_kill(struct store *st, struct store_entry *e)
{
    e->dead = true;
    store_table_remove(st, e);
    if (st->forget != NULL)
        st->forget(st->forget_ctx, e->fp);
    diskcache_delete(st, e);
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
    snprintf(r->msg, sizeof(r->msg), "%.*s", (int)sizeof(r->msg) - 1, msg); /* cut to fit */
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
    struct rules_options ro = {.max_states = j->load->max_states, .cancel = &j->cj.cancel};
    int rc = rules_compile(srcs, n, &ro, &j->res, &j->err);
    if (rc == -ECANCELED)
        return rc; /* stopped: compile_done says why */
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

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void compile_work(struct cpool_job *cj)
{
    struct compile_job *j = (struct compile_job *)(void *)cj;
    __atomic_store_n(&j->started_ms, mono_ms(), __ATOMIC_RELAXED); /* store_sweep reads it */
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
/* A compile that stopped early answers why. */
static void stopped(struct compile_job *j)
{
    const struct store *st = j->st;
    if (j->why == STOP_TIMEOUT)
        vks_error_set(&j->err, -VKS_E_TIMEOUT,
                      "compiling the rule set took longer than %u ms (compile-timeout-ms): split "
                      "it, lower max_states, or ask the administrator to raise the limit",
                      st->opt.compile_timeout_ms);
    else if (j->why == STOP_SHUTDOWN)
        vks_error_set(&j->err, -VKS_E_SHUTDOWN,
                      "vkscand is shutting down and stopped the compile: load again when it "
                      "is back");
    else
        vks_error_set(&j->err, -ECANCELED, "the compile was cancelled: its client left");
    j->status = j->err.code;
}

static void compile_done(struct compile_job *j, int status)
{
    struct store *st = j->st;
    st->compiling--;
    if (j->prev != NULL)
        j->prev->next = j->next;
    else
        st->compiles = j->next;
    if (j->next != NULL)
        j->next->prev = j->prev;
    if (status == -ECANCELED || j->status == -ECANCELED) {
        stopped(j);
        st->stats.compiles_stopped++;
    }
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
    struct store_entry *e = store_table_find(st, fp);
    bool fresh = e == NULL;
    if (fresh && (e = store_entry_new(st, fp)) == NULL) {
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
        diskcache_save_catalog(st, e);
    struct store_source *s = store_source_find(st, j->src);
    if (s == NULL) {
        s = store_source_add(st, e, j->src, j->rejects, j->n_rejects);
        j->rejects = NULL;
        if (s != NULL)
            s->compile_ns = j->res.compile_ns;
        if (s != NULL)
            diskcache_save_source(st, s);
    }
    struct vks_error err;
    int rc = s == NULL ? vks_error_set(&err, -ENOMEM, "out of memory recording a rule set")
                       : take_ownership(st, e, j->uid, &err);
    if (rc != 0) {
        j->cb(j->ctx, rc, &(struct store_result){0}, &err);
    } else {
        e->last_use = ++st->tick;
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

static void compile_after(struct cpool_job *cj, int status)
{
    struct compile_job *j = (struct compile_job *)(void *)cj;
    struct store *st = j->st;
    compile_done(j, status);
    if (!store_busy(st) && st->idle != NULL)
        st->idle(st->idle_ctx);
}

void store_load(struct store *st, uid_t uid, const struct proto_catalog_load *load, store_cb cb,
                void *ctx)
{
    uint8_t src[CATALOG_FP_LEN];
    source_fingerprint(load, src);
    struct store_source *s = store_source_find(st, src);
    if (s != NULL) {
        answer_source(st, uid, s, load, cb, ctx);
        return;
    }
    struct vks_error room_err;
    if (tenant_room(st, uid, false, &room_err) != 0) {
        cb(ctx, room_err.code, &(struct store_result){0}, &room_err);
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
    j->cj.uid = uid;
    j->cj.work = compile_work;
    j->cj.done = compile_after;
    j->next = st->compiles;
    if (st->compiles != NULL)
        st->compiles->prev = j;
    st->compiles = j;
    st->compiling++;
    cpool_submit(st->opt.pool, &j->cj);
}

static void stop_compile(struct store *st, struct compile_job *j, enum stop_why why)
{
    if (j->why == STOP_NONE)
        j->why = why;
    cpool_cancel(st->opt.pool, &j->cj);
}

void store_cancel(struct store *st, void *ctx)
{
    for (struct compile_job *j = st->compiles; j != NULL; j = j->next) {
        if (j->ctx == ctx)
            stop_compile(st, j, STOP_CLIENT_LEFT);
    }
}

void store_shutdown(struct store *st)
{
    st->shutdown = true; /* no more preloads */
    for (struct compile_job *j = st->compiles; j != NULL; j = j->next)
        stop_compile(st, j, STOP_SHUTDOWN);
}

void store_sweep(struct store *st)
{
    if (st->opt.recent_save_ms != 0) {
        uint64_t t = mono_ms();
        if (t - st->recent_saved_ms >= st->opt.recent_save_ms) {
            st->recent_saved_ms = t;
            diskcache_save_recent_changed(st);
        }
    }
    uint32_t limit = st->opt.compile_timeout_ms;
    if (limit == 0 || st->compiles == NULL)
        return;
    uint64_t now = mono_ms();
    for (struct compile_job *j = st->compiles; j != NULL; j = j->next) {
        uint64_t t = __atomic_load_n(&j->started_ms, __ATOMIC_RELAXED);
        if (t != 0 && now - t >= limit)
            stop_compile(st, j, STOP_TIMEOUT);
    }
}

/* ---- the catalogs used last ------------------------------------------ */

uint32_t store_recent(const struct store *st, struct store_entry **out, uint32_t cap)
{
    /* Keeps the `cap` most recent in out[] (a small array: insertion). */
    uint32_t n = 0;
    for (unsigned b = 0; b < STORE_BUCKETS && cap > 0; b++) {
        for (struct store_entry *e = st->table[b]; e != NULL; e = e->hnext) {
            if (e->last_use == 0 || (n == cap && e->last_use <= out[n - 1]->last_use))
                continue;
            uint32_t i = n < cap ? n++ : n - 1;
            while (i > 0 && out[i - 1]->last_use < e->last_use) {
                out[i] = out[i - 1];
                i--;
            }
            out[i] = e;
        }
    }
    return n;
}

static void preload_next(struct store *st);

static void preload_read(void *ctx, int status, const struct store_result *res,
                         const struct vks_error *err)
{
    struct store *st = ctx;
    (void)err; /* an unreadable file was counted and deleted; the next one is read */
    if (status == 0)
        st->preload.cb(st->preload.ctx, 0, res, NULL);
    preload_next(st);
}

/* Reads the next catalog on the list, or reports the end. */
static void preload_next(struct store *st)
{
    while (st->preload.next < st->preload.n && !st->shutdown &&
           st->stats.host_bytes < st->opt.host_budget) {
        struct store_entry *e = store_table_find(st, st->preload.fp[st->preload.next++]);
        if (e == NULL) /* dropped since */
            continue;
        struct waiter *w = waiter_new(preload_read, st);
        if (w == NULL)
            break;
        w->res.known = true;
        body_ready(st, e, w); /* as used as before: no when_ready */
        return;
    }
    store_cb cb = st->preload.cb;
    st->preload.n = st->preload.next = 0;
    st->preload.cb = NULL;
    if (cb != NULL)
        cb(st->preload.ctx, 0, &(struct store_result){0}, NULL);
}

void store_preload(struct store *st, uint32_t n, store_cb cb, void *ctx)
{
    struct store_entry *v[DISKCACHE_RECENT_MAX];
    n = store_recent(st, v, n < DISKCACHE_RECENT_MAX ? n : DISKCACHE_RECENT_MAX);
    free(st->preload.fp);
    st->preload.fp = calloc(n ? n : 1, CATALOG_FP_LEN);
    st->preload.n = st->preload.fp != NULL ? n : 0;
    st->preload.next = 0;
    for (uint32_t i = 0; i < st->preload.n; i++)
        memcpy(st->preload.fp[i], v[i]->fp, CATALOG_FP_LEN);
    st->preload.cb = cb;
    st->preload.ctx = ctx;
    preload_next(st);
}

/* ---- has, acquire, drop ----------------------------------------------- */

void store_has(struct store *st, uid_t uid, const struct proto_catalog_ref *ref, store_cb cb,
               void *ctx)
{
    if (ref->by_source) {
        struct store_source *s = store_source_find(st, ref->fp);
        if (s != NULL && entry_owned(s->entry, uid)) {
            answer_source(st, uid, s, NULL, cb, ctx);
            return;
        }
    } else {
        struct store_entry *e = store_table_find(st, ref->fp);
        if (e != NULL && entry_owned(e, uid)) {
            struct waiter *w = waiter_new(cb, ctx);
            if (w == NULL) {
                fail(cb, ctx, -ENOMEM, "out of memory answering catalog.has");
                return;
            }
            w->res.known = true;
            w->has = true;
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
    struct store_entry *e = store_table_find(st, fp);
    if (e == NULL || !entry_owned(e, uid)) {
        char hex[STORE_HEX_LEN + 1];
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
    struct store_entry *e = store_table_find(st, fp);
    if (e == NULL || !entry_owned(e, uid))
        return 0;
    owner_remove(st, e, uid);
    return 1;
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
        int rc = diskcache_open(st, opt->state_dir, err);
        if (rc != 0) {
            free(st);
            return rc;
        }
    }
    *out = st;
    return 0;
}

bool store_busy(const struct store *st)
{
    return st->compiling > 0 || diskcache_busy(st);
}

void store_destroy(struct store *st)
{
    if (st == NULL)
        return;
    diskcache_save_recent(st);
    free(st->preload.fp);
    for (unsigned b = 0; b < STORE_BUCKETS; b++) {
        while (st->table[b] != NULL) {
            struct store_entry *e = st->table[b];
            st->table[b] = e->hnext;
            store_entry_free(st, e);
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
