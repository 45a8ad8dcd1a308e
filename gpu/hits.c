/*
 * A collected batch's raw hits into the hits a caller gets: per buffer,
 * every (rule, end) once, in (end, rule) order, with the buffer's report
 * mode (refscan's scan_hits_finalize semantics, docs/gpu.md "Hits").
 *
 * The ring holds raw hits in the order workers flushed them, interleaved
 * across items and buffers, with copies where items overlap. A batch of
 * few hits goes the short way: a counting sort by buffer, then
 * scan_hits_finalize per buffer. A batch of many (one 1 GiB text file
 * against a dictionary: 5 M) is finished on the engine's thread pool:
 *
 *   1. bin: each thread counts its slice of the ring into bins of
 *      (buffer, end >> BIN_SHIFT); a prefix over (bin, thread) gives every
 *      thread its own place in each bin, and a second pass scatters keys
 *      (end's low bits, rule) there: no locks, no atomics;
 *   2. sort: each bin (at most a few MiB of ends, so its keys stay in
 *      cache) is radix-sorted and its copies dropped, bins spread over the
 *      threads by their key counts; where a report mode or a single-match
 *      rule keeps only a rule's first hit in a buffer ("once" hits), each
 *      task keeps the first per rule of its part and counts the rest in;
 *   3. merge: only for once hits, one pass in order across the tasks'
 *      parts (scan_reporter), which leaves each bin its count of hits;
 *   4. write: every bin at its place in the result, on the threads.
 * Only the merge is serial, and only buffers that can have once hits go
 * through it, each with what the tasks' squeeze left.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define BIN_SHIFT     22u /* ends per bin: 4 MiB of a buffer */
#define HITS_PAR_MIN  65536u
#define TASKS_PER_THR 4u

/* Whether raw hit h (buffer, rule, layer, end) lies in a re-walked part of
 * a speculative segment, where the host's hits replace the device's. */
static bool spec_dropped(const struct batch_ctx *bc, const uint32_t *h)
{
    const struct spec_fix *v = bc->eng->scratch.fixes;
    size_t a = 0, z = bc->n_fixes;
    while (a < z) { /* the first fix after (buf, layer, end) */
        size_t m = (a + z) / 2;
        const struct spec_fix *f = &v[m];
        bool before = f->buf < h[0] ||
                      (f->buf == h[0] && (f->layer < h[2] || (f->layer == h[2] && f->lo < h[3])));
        if (before)
            a = m + 1;
        else
            z = m;
    }
    if (a == 0)
        return false;
    const struct spec_fix *f = &v[a - 1];
    return f->buf == h[0] && f->layer == h[2] && h[3] > f->lo && h[3] < f->upto;
}

/* Whether raw hit h is a match to return: not a live confirmation's
 * marker, not in a re-walked part of a speculative segment. */
static bool kept(const struct batch_ctx *bc, const uint32_t *h)
{
    if (h[1] == NO_CARRY)
        return false;
    if (bc->n_fixes == 0)
        return true;
    const struct batch_scratch *s = &bc->eng->scratch;
    size_t w = h[2] / 64;
    return w >= s->fix_words || !(s->fix_layers[w] >> (h[2] % 64) & 1) || !spec_dropped(bc, h);
}

static int append_hit(struct gpu_result *res, uint32_t buf, const struct scan_hit *h)
{
    if (res->n_hits == res->cap) {
        size_t n = res->cap ? res->cap * 2 : 256;
        struct gpu_hit *p = realloc(res->hits, n * sizeof(*p));
        if (p == NULL)
            return -ENOMEM;
        res->hits = p;
        res->cap = n;
    }
    res->hits[res->n_hits++] = (struct gpu_hit){buf, h->rule, h->count, h->end};
    return 0;
}

/* The short way: a counting sort by buffer, scan_hits_finalize per buffer. */
static int finish_serial(struct batch_ctx *bc, const uint32_t *raw, uint64_t n,
                         struct gpu_result *res, struct vks_error *err)
{
    struct batch_scratch *s = &bc->eng->scratch;
    const struct gpu_batch *b = bc->batch;
    if (gpu_grow_array((void **)&s->counts, &s->counts_cap, (size_t)b->n_buffers + 1, 4) < 0 ||
        gpu_grow_array((void **)&s->pairs, &s->pairs_cap, n, 8) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory sorting %llu hits",
                             (unsigned long long)n);
    memset(s->counts, 0, ((size_t)b->n_buffers + 1) * 4);
    for (uint64_t i = 0; i < n; i++) {
        if (kept(bc, &raw[i * 4]))
            s->counts[raw[i * 4] + 1]++;
    }
    for (uint32_t i = 0; i < b->n_buffers; i++)
        s->counts[i + 1] += s->counts[i];
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t *h = &raw[i * 4];
        if (kept(bc, h))
            s->pairs[s->counts[h[0]]++] = (uint64_t)h[3] << 32 | h[1];
    }
    size_t start = 0, fh = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        size_t end = s->counts[i];
        bool fixed = fh < bc->n_fix_hits && s->fix_hits[fh].buffer == i;
        if (end == start && !fixed)
            continue;
        s->one.n = 0;
        for (size_t k = start; k < end; k++) {
            if (scan_hits_push(&s->one, (uint32_t)s->pairs[k], s->pairs[k] >> 32, 1) < 0)
                return vks_error_set(err, -ENOMEM, "out of memory collecting hits");
        }
        for (; fh < bc->n_fix_hits && s->fix_hits[fh].buffer == i; fh++) {
            if (scan_hits_push(&s->one, s->fix_hits[fh].rule, s->fix_hits[fh].end, 1) < 0)
                return vks_error_set(err, -ENOMEM, "out of memory collecting hits");
        }
        scan_hits_finalize(&s->one, b->catalogs[b->buffers[i].catalog], b->buffers[i].mode);
        for (size_t k = 0; k < s->one.n; k++) {
            if (append_hit(res, i, &s->one.v[k]) < 0)
                return vks_error_set(err, -ENOMEM, "out of memory returning hits");
        }
        start = end;
    }
    return 0;
}

/* ---- the pool's way ---------------------------------------------------- */

#define ONCE_TAB_MAX (16u << 20) /* entries of the per-task first-hit tables */

struct hit_job {
    const struct batch_ctx *bc;
    const uint32_t *raw;
    uint64_t n;
    uint32_t slices; /* of the ring, one per thread; the fix hits are one more */
    uint32_t n_bins;
    unsigned rule_bits;
    uint64_t rule_mask;
    const uint32_t *n_rules; /* per batch catalog */
    const uint32_t *base;    /* per buffer: its first bin; [n_buffers]: n_bins */
    const uint32_t *bin_buf; /* per bin: its buffer */
    uint32_t *cnt;           /* (slice, bin): a count, then where the slice writes next */
    uint64_t *start;         /* per bin: where its keys begin; [n_bins]: all */
    uint32_t *kept;          /* per bin: keys left after dropping copies */
    uint64_t *keys, *tmp;
    const uint32_t *task_bin; /* sort tasks: first bin of each, [n_tasks]: n_bins */
    /* report modes: a "once" hit is one of a rule that reports only its
     * first hit per buffer (SCAN_FIRST, SCAN_COUNT, RULE_F_SINGLEMATCH) */
    bool squeeze;                                  /* some hit may be a once hit */
    const uint8_t *single[GPU_MAX_BATCH_CATALOGS]; /* per rule; NULL: none single */
    uint32_t most;                                 /* rules of the largest catalog */
    uint32_t *once_tab;                            /* per sort task: stamp[most], at[most] */
    uint32_t *count; /* per key: its count, 0 once it is dropped (squeeze) */
    uint64_t *out;   /* per bin: where its hits go in res->hits */
    struct gpu_hit *hits;
};

/* Bin of one raw hit and its key, or false for a hit that is not kept
 * (markers, re-walked spans; a rule or buffer out of range cannot come
 * from the kernel, and is left out rather than trusted). */
static bool bin_of(const struct hit_job *j, uint32_t buf, uint32_t rule, uint64_t end,
                   uint32_t *bin, uint64_t *key)
{
    const struct gpu_batch *b = j->bc->batch;
    if (buf >= b->n_buffers || rule >= j->n_rules[b->buffers[buf].catalog])
        return false;
    uint64_t sub = end >> BIN_SHIFT;
    uint32_t first = j->base[buf], span = j->base[buf + 1] - first;
    if (sub >= span)
        return false;
    *bin = first + (uint32_t)sub;
    *key = (end & (((uint64_t)1 << BIN_SHIFT) - 1)) << j->rule_bits | rule;
    return true;
}

/* Slice t of the ring (or, t == slices - 1 of slices + 1, the fix hits):
 * count (scatter false) or place (scatter true) its kept hits. */
static void bin_slice(struct hit_job *j, uint32_t t, bool scatter)
{
    uint32_t *cnt = j->cnt + (size_t)t * j->n_bins;
    uint32_t bin;
    uint64_t key;
    if (t == j->slices) {
        const struct batch_ctx *bc = j->bc;
        for (size_t i = 0; i < bc->n_fix_hits; i++) {
            const struct gpu_hit *h = &bc->eng->scratch.fix_hits[i];
            if (!bin_of(j, h->buffer, h->rule, h->end, &bin, &key))
                continue;
            if (scatter)
                j->keys[cnt[bin]++] = key;
            else
                cnt[bin]++;
        }
        return;
    }
    uint64_t lo = j->n * t / j->slices, hi = j->n * (t + 1) / j->slices;
    for (uint64_t i = lo; i < hi; i++) {
        const uint32_t *h = &j->raw[i * 4];
        if (!kept(j->bc, h) || !bin_of(j, h[0], h[1], h[3], &bin, &key))
            continue;
        if (scatter)
            j->keys[cnt[bin]++] = key;
        else
            cnt[bin]++;
    }
}

static void count_task(void *ctx, uint32_t t)
{
    bin_slice(ctx, t, false);
}

static void scatter_task(void *ctx, uint32_t t)
{
    bin_slice(ctx, t, true);
}

/* Counts per (row, bin) into where each row writes next in each bin, bin
 * after bin; start[bin] is where the bin begins, start[n_bins] all keys. */
static uint64_t bins_prefix(uint32_t *cnt, uint64_t *start, uint32_t n_bins, uint32_t rows)
{
    uint64_t at = 0;
    for (uint32_t bin = 0; bin < n_bins; bin++) {
        start[bin] = at;
        for (uint32_t t = 0; t < rows; t++) {
            uint32_t *c = &cnt[(size_t)t * n_bins + bin];
            uint32_t m = *c;
            *c = (uint32_t)at;
            at += m;
        }
    }
    start[n_bins] = at;
    return at;
}

/* Tasks of about equal keys, whole bins each: tb[t] is task t's first bin,
 * tb[n] = n_bins; returns n (at most `most`). */
static uint32_t split_tasks(const uint64_t *start, uint32_t n_bins, size_t most, uint32_t *tb)
{
    uint32_t n = 0;
    uint64_t per = start[n_bins] / most + 1;
    tb[0] = 0;
    for (uint32_t bin = 0; bin < n_bins; bin++) {
        if (start[bin + 1] - start[tb[n]] >= per && n + 1 < most)
            tb[++n] = bin + 1;
    }
    if (tb[n] < n_bins)
        tb[++n] = n_bins;
    return n;
}

/* Sorts k[0..m) and drops its copies; returns the keys left. */
static uint32_t sort_unique(uint64_t *k, uint64_t *tmp, uint64_t m)
{
    scan_sort_u64(k, tmp, m);
    uint32_t w = 0;
    for (uint64_t i = 0; i < m; i++)
        if (w == 0 || k[i] != k[w - 1])
            k[w++] = k[i];
    return w;
}

static bool is_once(const struct hit_job *j, const struct gpu_buffer *gb, uint32_t rule)
{
    const uint8_t *single = j->single[gb->catalog];
    return gb->mode != SCAN_ALL || (single != NULL && single[rule]);
}

/* Of bin's m sorted keys, keeps every hit of the rules that report all and
 * the first of each once rule in this task's part of the buffer, adding
 * the others' counts to it (SCAN_COUNT); returns the keys kept. */
static uint32_t squeeze_bin(struct hit_job *j, uint32_t t, uint32_t bin, uint64_t *k, uint32_t m)
{
    uint32_t buf = j->bin_buf[bin];
    const struct gpu_buffer *gb = &j->bc->batch->buffers[buf];
    uint32_t *stamp = j->once_tab + (size_t)t * 2 * j->most, *at = stamp + j->most;
    uint64_t first = j->start[bin];
    uint32_t w = 0;
    for (uint32_t x = 0; x < m; x++) {
        uint32_t rule = (uint32_t)(k[x] & j->rule_mask);
        if (is_once(j, gb, rule)) {
            if (stamp[rule] == buf + 1) {
                const uint8_t *single = j->single[gb->catalog];
                if (gb->mode == SCAN_COUNT && (single == NULL || !single[rule]))
                    j->count[at[rule]]++;
                continue;
            }
            stamp[rule] = buf + 1;
            at[rule] = (uint32_t)(first + w);
        }
        k[w] = k[x];
        j->count[first + w++] = 1;
    }
    return w;
}

/* Sort task t: its bins sorted, copies dropped (each (rule, end) of a
 * buffer lies in one bin, so this is every copy), once hits squeezed. */
static void sort_task(void *ctx, uint32_t t)
{
    struct hit_job *j = ctx;
    if (j->squeeze)
        memset(j->once_tab + (size_t)t * 2 * j->most, 0, (size_t)j->most * 4);
    for (uint32_t b = j->task_bin[t]; b < j->task_bin[t + 1]; b++) {
        uint64_t s = j->start[b];
        uint64_t *k = j->keys + s;
        uint32_t w = sort_unique(k, j->tmp + s, j->start[b + 1] - s);
        j->kept[b] = j->squeeze ? squeeze_bin(j, t, b, k, w) : w;
    }
}

/* Write task t: its bins' hits at their places in the result. */
static void write_task(void *ctx, uint32_t t)
{
    struct hit_job *j = ctx;
    for (uint32_t b = j->task_bin[t]; b < j->task_bin[t + 1]; b++) {
        uint32_t buf = j->bin_buf[b];
        const uint64_t *k = j->keys + j->start[b];
        const uint32_t *count = j->squeeze ? j->count + j->start[b] : NULL;
        uint64_t high = (uint64_t)(b - j->base[buf]) << BIN_SHIFT, o = j->out[b];
        for (uint32_t x = 0; x < j->kept[b]; x++) {
            uint32_t c = count != NULL ? count[x] : 1;
            if (c != 0)
                j->hits[o++] = (struct gpu_hit){buf, (uint32_t)(k[x] & j->rule_mask), c,
                                                high | k[x] >> j->rule_bits};
        }
    }
}

/* The first hit of each once rule in each buffer, across the tasks' parts
 * of it: in (end, rule) order, the first stays and takes the counts of the
 * others (which are dropped). Then every bin's place in the result. */
static int merge_once(struct hit_job *j, struct vks_error *err)
{
    const struct gpu_batch *b = j->bc->batch;
    struct scan_reporter rep[GPU_MAX_BATCH_CATALOGS];
    bool have[GPU_MAX_BATCH_CATALOGS] = {false};
    int rc = 0;
    for (uint32_t i = 0; i < b->n_buffers && rc == 0; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        uint32_t c = gb->catalog;
        bool any_once = gb->mode != SCAN_ALL || j->single[c] != NULL;
        for (uint32_t bin = j->base[i]; bin < j->base[i + 1]; bin++)
            j->out[bin] = j->kept[bin];
        if (!j->squeeze || !any_once)
            continue;
        if (!have[c]) {
            if (scan_reporter_init(&rep[c], b->catalogs[c]) < 0) {
                rc = vks_error_set(err, -ENOMEM, "out of memory applying report modes");
                break;
            }
            have[c] = true;
        }
        scan_reporter_buffer(&rep[c]);
        for (uint32_t bin = j->base[i]; bin < j->base[i + 1]; bin++) {
            const uint64_t *k = j->keys + j->start[bin];
            uint32_t *count = j->count + j->start[bin];
            for (uint32_t x = 0; x < j->kept[bin]; x++) {
                uint32_t rule = (uint32_t)(k[x] & j->rule_mask);
                if (!is_once(j, gb, rule))
                    continue;
                uint64_t first;
                switch (scan_reporter_take(&rep[c], gb->mode, rule, j->start[bin] + x, &first)) {
                case SCAN_TAKE_NEW:
                    break;
                case SCAN_TAKE_COUNT:
                    j->count[first] += count[x];
                    count[x] = 0;
                    j->out[bin]--;
                    break;
                case SCAN_TAKE_DROP:
                    count[x] = 0;
                    j->out[bin]--;
                    break;
                }
            }
        }
    }
    for (uint32_t c = 0; c < GPU_MAX_BATCH_CATALOGS; c++)
        if (have[c])
            scan_reporter_finish(&rep[c]);
    return rc;
}

static unsigned bits_for(uint64_t v)
{
    unsigned n = 0;
    while (n < 64 && (v >> n) != 0)
        n++;
    return n;
}

/* Which of the batch's rules report once per buffer (RULE_F_SINGLEMATCH),
 * per catalog; whether any hit of the batch may be a once hit. */
static int find_single(struct hit_job *j, struct batch_scratch *s)
{
    const struct gpu_batch *b = j->bc->batch;
    size_t need = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++)
        if (catalog_rule_flags_any(b->catalogs[c]) & RULE_F_SINGLEMATCH)
            need += j->n_rules[c];
    if (need > 0 && gpu_grow_array((void **)&s->single, &s->single_cap, need, 1) < 0)
        return -ENOMEM;
    size_t at = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        j->single[c] = NULL;
        if (!(catalog_rule_flags_any(b->catalogs[c]) & RULE_F_SINGLEMATCH))
            continue;
        for (uint32_t r = 0; r < j->n_rules[c]; r++) {
            struct catalog_rule cr;
            catalog_rule(b->catalogs[c], r, &cr);
            s->single[at + r] = (cr.flags & RULE_F_SINGLEMATCH) != 0;
        }
        j->single[c] = &s->single[at];
        at += j->n_rules[c];
    }
    for (uint32_t i = 0; i < b->n_buffers && !j->squeeze; i++)
        j->squeeze = b->buffers[i].mode != SCAN_ALL || j->single[b->buffers[i].catalog] != NULL;
    return 0;
}

static int finish_pool(struct batch_ctx *bc, const uint32_t *raw, uint64_t n,
                       struct gpu_result *res, struct vks_error *err)
{
    struct batch_scratch *s = &bc->eng->scratch;
    const struct gpu_batch *b = bc->batch;
    struct upload_pool *pool = bc->eng->pool;
    uint32_t n_rules[GPU_MAX_BATCH_CATALOGS] = {0}, most = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        n_rules[c] = catalog_rule_count(b->catalogs[c]);
        most = n_rules[c] > most ? n_rules[c] : most;
    }
    struct hit_job j = {.bc = bc, .raw = raw, .n = n, .n_rules = n_rules, .most = most};
    j.rule_bits = bits_for(most ? most - 1 : 0);
    j.rule_mask = ((uint64_t)1 << j.rule_bits) - 1;
    if (j.rule_bits + BIN_SHIFT > 64)
        return finish_serial(bc, raw, n, res, err);
    j.slices = upload_pool_threads(pool);
    uint64_t bins = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++)
        bins += (b->buffers[i].len >> BIN_SHIFT) + 1;
    uint64_t keys = n + bc->n_fix_hits;
    if (bins >= UINT32_MAX / (j.slices + 1) || keys >= UINT32_MAX)
        return finish_serial(bc, raw, n, res, err);
    if (find_single(&j, s) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory reading the rules' report flags");
    j.n_bins = (uint32_t)bins;
    size_t n_tasks_most = (size_t)j.slices * TASKS_PER_THR;
    size_t tab_tasks = most ? ONCE_TAB_MAX / (2 * (size_t)most) : SIZE_MAX; /* whose tables fit */
    if (j.squeeze && n_tasks_most > tab_tasks)
        n_tasks_most = tab_tasks > 0 ? tab_tasks : 1;
    if (gpu_grow_array((void **)&s->bin_base, &s->bin_base_cap, (size_t)b->n_buffers + 1, 4) < 0 ||
        gpu_grow_array((void **)&s->bin_cnt, &s->bin_cnt_cap, (size_t)(j.slices + 1) * bins, 4) <
            0 ||
        gpu_grow_array((void **)&s->bin_start, &s->bin_start_cap, bins + 1, 8) < 0 ||
        gpu_grow_array((void **)&s->bin_kept, &s->bin_kept_cap, bins, 4) < 0 ||
        gpu_grow_array((void **)&s->bin_buf, &s->bin_buf_cap, bins, 4) < 0 ||
        gpu_grow_array((void **)&s->bin_out, &s->bin_out_cap, bins, 8) < 0 ||
        gpu_grow_array((void **)&s->task_bin, &s->task_bin_cap, n_tasks_most + 1, 4) < 0 ||
        gpu_grow_array((void **)&s->keys, &s->keys_cap, 2 * keys + 1, 8) < 0 ||
        (j.squeeze &&
         (gpu_grow_array((void **)&s->key_cnt, &s->key_cnt_cap, keys + 1, 4) < 0 ||
          gpu_grow_array((void **)&s->once_tab, &s->once_tab_cap, n_tasks_most * 2 * most, 4) < 0)))
        return vks_error_set(err, -ENOMEM, "out of memory sorting %llu hits",
                             (unsigned long long)keys);
    uint32_t *base = s->bin_base;
    base[0] = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        base[i + 1] = base[i] + (uint32_t)(b->buffers[i].len >> BIN_SHIFT) + 1;
        for (uint32_t bin = base[i]; bin < base[i + 1]; bin++)
            s->bin_buf[bin] = i;
    }
    j.base = base;
    j.bin_buf = s->bin_buf;
    j.cnt = s->bin_cnt;
    j.start = s->bin_start;
    j.kept = s->bin_kept;
    j.keys = s->keys;
    j.tmp = s->keys + keys;
    j.count = s->key_cnt;
    j.once_tab = s->once_tab;
    j.out = s->bin_out;
    memset(j.cnt, 0, (size_t)(j.slices + 1) * bins * 4);

    upload_pool_run(pool, count_task, &j, j.slices + 1);
    bins_prefix(j.cnt, j.start, j.n_bins, j.slices + 1);
    upload_pool_run(pool, scatter_task, &j, j.slices + 1);
    /* tasks of about equal keys, whole bins each: sort, then write */
    uint32_t n_tasks = split_tasks(j.start, j.n_bins, n_tasks_most, s->task_bin);
    j.task_bin = s->task_bin;
    upload_pool_run(pool, sort_task, &j, n_tasks);
    int rc = merge_once(&j, err);
    if (rc != 0)
        return rc;
    uint64_t total = res->n_hits;
    for (uint32_t bin = 0; bin < j.n_bins; bin++) {
        uint64_t m = j.out[bin];
        j.out[bin] = total;
        total += m;
    }
    if (gpu_grow_array((void **)&res->hits, &res->cap, total, sizeof(*res->hits)) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory returning %llu hits",
                             (unsigned long long)(total - res->n_hits));
    j.hits = res->hits;
    upload_pool_run(pool, write_task, &j, n_tasks);
    res->n_hits = total;
    return 0;
}

/* ---- counting instead of sorting --------------------------------------- */

#define COUNT_TAB_MAX (8u << 20) /* (thread, buffer, rule) entries of the tables */

struct count_job {
    const struct batch_ctx *bc;
    const uint32_t *raw;
    uint64_t n;
    uint32_t slices;
    const uint32_t *n_rules; /* per batch catalog */
    const uint64_t *base;    /* per buffer: its first entry; [n_buffers]: entries */
    uint32_t *tab;           /* per slice: counts[entries], then first ends[entries] */
};

static uint32_t *count_tab(const struct count_job *j, uint32_t t)
{
    return j->tab + (size_t)t * 2 * j->base[j->bc->batch->n_buffers];
}

/* Slice t of the ring into table t: per (buffer, rule) its hits and its
 * first end. Markers and out-of-range words are left out, as bin_of does. */
static void count_slice(void *ctx, uint32_t t)
{
    struct count_job *j = ctx;
    const struct gpu_batch *b = j->bc->batch;
    uint64_t entries = j->base[b->n_buffers];
    uint32_t *cnt = count_tab(j, t), *first = cnt + entries;
    memset(cnt, 0, entries * sizeof(*cnt));
    memset(first, 0xff, entries * sizeof(*first));
    uint64_t lo = j->n * t / j->slices, hi = j->n * (t + 1) / j->slices;
    for (uint64_t i = lo; i < hi; i++) {
        const uint32_t *h = &j->raw[i * 4];
        if (h[0] >= b->n_buffers || h[1] >= j->n_rules[b->buffers[h[0]].catalog])
            continue;
        uint64_t e = j->base[h[0]] + h[1];
        cnt[e]++;
        if (h[3] < first[e])
            first[e] = h[3];
    }
}

/* Piece t of the entries: every slice's table summed into table 0. */
static void count_merge(void *ctx, uint32_t t)
{
    struct count_job *j = ctx;
    uint64_t entries = j->base[j->bc->batch->n_buffers];
    uint64_t lo = entries * t / j->slices, hi = entries * (t + 1) / j->slices;
    uint32_t *cnt = count_tab(j, 0), *first = cnt + entries;
    for (uint32_t s = 1; s < j->slices; s++) {
        const uint32_t *c = count_tab(j, s), *f = c + entries;
        for (uint64_t e = lo; e < hi; e++) {
            cnt[e] += c[e];
            first[e] = f[e] < first[e] ? f[e] : first[e];
        }
    }
}

/* Buffer i's rules with a count (cnt[r] and first[r], r < nr) as hits at
 * dst, in (end, rule) order: count 1 in mode first and for single-match
 * rules (single[r]; NULL: none). keys: scratch for 2 nr. Returns how many. */
static uint32_t put_counts(struct gpu_hit *dst, uint32_t i, const struct gpu_buffer *gb,
                           const uint32_t *cnt, const uint32_t *first, uint32_t nr,
                           const uint8_t *single, unsigned rule_bits, uint64_t *keys)
{
    uint32_t m = 0;
    for (uint32_t r = 0; r < nr; r++)
        if (cnt[r] != 0)
            keys[m++] = (uint64_t)first[r] << rule_bits | r;
    scan_sort_u64(keys, keys + m, m);
    for (uint32_t x = 0; x < m; x++) {
        uint32_t r = (uint32_t)(keys[x] & (((uint64_t)1 << rule_bits) - 1));
        bool once = gb->mode == SCAN_FIRST || (single != NULL && single[r]);
        dst[x] = (struct gpu_hit){i, r, once ? 1 : cnt[r], keys[x] >> rule_bits};
    }
    return m;
}

/*
 * The finish of a batch whose buffers all report per rule (count, first)
 * and whose hits cannot repeat (bc->hits_unique): a rule's hits in a
 * buffer are its distinct ends, so its count is how many there are and
 * its hit the first of them. The ring is counted on the threads into a
 * table per thread, the tables summed, and each buffer's rules put in
 * (end, rule) order: no bins and no sort of every hit (a 1 GiB text
 * against dict-10 is 5 M raw hits and 43 k rules). Returns 1 when the
 * batch is not such a batch or its tables would be too large.
 */
static int finish_counts(struct batch_ctx *bc, const uint32_t *raw, uint64_t n,
                         struct gpu_result *res, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    struct batch_scratch *s = &eng->scratch;
    const struct gpu_batch *b = bc->batch;
    if (!bc->hits_unique || eng->opt.count_direct < 0 || bc->n_fixes != 0 || bc->n_fix_hits != 0)
        return 1;
    for (uint32_t i = 0; i < b->n_buffers; i++)
        if (b->buffers[i].mode != SCAN_COUNT && b->buffers[i].mode != SCAN_FIRST)
            return 1;
    uint32_t n_rules[GPU_MAX_BATCH_CATALOGS] = {0}, most = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        n_rules[c] = catalog_rule_count(b->catalogs[c]);
        most = n_rules[c] > most ? n_rules[c] : most;
    }
    struct count_job j = {
        .bc = bc, .raw = raw, .n = n, .slices = upload_pool_threads(eng->pool), .n_rules = n_rules};
    if (gpu_grow_array((void **)&s->cbase, &s->cbase_cap, (size_t)b->n_buffers + 1, 8) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory counting %llu hits",
                             (unsigned long long)n);
    uint64_t entries = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        s->cbase[i] = entries;
        entries += n_rules[b->buffers[i].catalog];
    }
    s->cbase[b->n_buffers] = entries;
    if (entries == 0 || entries * j.slices > COUNT_TAB_MAX)
        return 1;
    struct hit_job hj = {.bc = bc, .n_rules = n_rules, .most = most};
    unsigned rule_bits = bits_for(most ? most - 1 : 0);
    if (find_single(&hj, s) < 0 ||
        gpu_grow_array((void **)&s->ctab, &s->ctab_cap, 2 * entries * j.slices, 4) < 0 ||
        gpu_grow_array((void **)&s->keys, &s->keys_cap, 2 * (size_t)most + 1, 8) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory counting %llu hits",
                             (unsigned long long)n);
    j.base = s->cbase;
    j.tab = s->ctab;
    upload_pool_run(eng->pool, count_slice, &j, j.slices);
    upload_pool_run(eng->pool, count_merge, &j, j.slices);
    const uint32_t *cnt = count_tab(&j, 0), *first = cnt + entries;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        uint32_t nr = n_rules[gb->catalog];
        uint64_t e0 = s->cbase[i];
        if (gpu_grow_array((void **)&res->hits, &res->cap, res->n_hits + nr, sizeof(*res->hits)) <
            0)
            return vks_error_set(err, -ENOMEM, "out of memory returning %u hits", nr);
        res->n_hits += put_counts(res->hits + res->n_hits, i, gb, cnt + e0, first + e0, nr,
                                  hj.single[gb->catalog], rule_bits, s->keys);
    }
    bc->tel->hits_counted = n;
    return 0;
}

/*
 * Counting on the device (docs/gpu.md): each counted buffer's table (from
 * the buffer table's third word: per rule its count and its least end's
 * complement, in the queue state read back) added to the hits the ring
 * gave that buffer, one hit per rule with a match, in (end, rule) order.
 * Other buffers' hits are kept as they are.
 */
static int merge_counts(struct batch_ctx *bc, struct gpu_result *res, struct vks_error *err)
{
    struct batch_scratch *s = &bc->eng->scratch;
    const struct gpu_batch *b = bc->batch;
    const uint32_t *qs = bc->eng->qs_host.map;
    uint32_t n_rules[GPU_MAX_BATCH_CATALOGS] = {0}, most = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        n_rules[c] = catalog_rule_count(b->catalogs[c]);
        most = n_rules[c] > most ? n_rules[c] : most;
    }
    struct hit_job hj = {.bc = bc, .n_rules = n_rules, .most = most};
    size_t cap = res->n_hits + bc->n_count / 2;
    struct gpu_hit *out = malloc((cap ? cap : 1) * sizeof(*out));
    if (out == NULL || find_single(&hj, s) < 0 ||
        gpu_grow_array((void **)&s->ctab, &s->ctab_cap, 2 * (size_t)most + 1, 4) < 0 ||
        gpu_grow_array((void **)&s->keys, &s->keys_cap, 2 * (size_t)most + 1, 8) < 0) {
        free(out);
        return vks_error_set(err, -ENOMEM, "out of memory adding the device's counts");
    }
    unsigned rule_bits = bits_for(most ? most - 1 : 0);
    uint64_t device = 0;
    size_t n = 0, at = 0, un = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        size_t a = at;
        while (at < res->n_hits && res->hits[at].buffer == i)
            at++;
        uint32_t tab = s->meta[(size_t)i * 4 + 2];
        while (un < bc->n_unhits && s->unhits[un].buffer < i)
            un++;
        if (tab == NO_CARRY) {
            memcpy(out + n, res->hits + a, (at - a) * sizeof(*out));
            n += at - a;
            continue;
        }
        const struct gpu_buffer *gb = &b->buffers[i];
        uint32_t nr = n_rules[gb->catalog], *cnt = s->ctab, *first = cnt + nr;
        for (uint32_t r = 0; r < nr; r++) {
            cnt[r] = qs[tab + 2 * r];
            first[r] = ~qs[tab + 2 * r + 1];
            device += cnt[r];
        }
        /* the guessed walks of repaired segments: counted by the device,
         * replaced by the host's walks (in the ring's hits); their least
         * ends are the true walks' too (gpu_unhits_unsure) */
        for (; un < bc->n_unhits && s->unhits[un].buffer == i; un++) {
            uint32_t r = s->unhits[un].rule;
            cnt[r] -= cnt[r] > 0;
            device -= device > 0;
        }
        for (size_t x = a; x < at; x++) {
            const struct gpu_hit *h = &res->hits[x];
            if (h->end < first[h->rule])
                first[h->rule] = (uint32_t)h->end;
            cnt[h->rule] += h->count;
        }
        n += put_counts(out + n, i, gb, cnt, first, nr, hj.single[gb->catalog], rule_bits, s->keys);
    }
    free(res->hits);
    res->hits = out;
    res->cap = cap;
    res->n_hits = n;
    bc->tel->hits_device_counted = device;
    return 0;
}

int gpu_finish_hits(struct batch_ctx *bc, const uint32_t *raw, uint64_t n, struct gpu_result *res,
                    struct vks_error *err)
{
    uint64_t t = gpu_now_ns();
    bc->tel->readback_ns = t - bc->t_read;
    bc->tel->hits_counted = 0;
    uint32_t least = bc->eng->opt.hits_parallel_min ? bc->eng->opt.hits_parallel_min : HITS_PAR_MIN;
    bool many = n + bc->n_fix_hits >= least;
    int rc = many ? finish_counts(bc, raw, n, res, err) : finish_serial(bc, raw, n, res, err);
    if (rc == 1) /* not a batch to count */
        rc = finish_pool(bc, raw, n, res, err);
    bc->tel->hits_device_counted = 0;
    if (rc == 0 && bc->n_count > 0)
        rc = merge_counts(bc, res, err);
    bc->tel->finalize_ns = gpu_now_ns() - t;
    return rc;
}

/* ---- the factor pass's ends (gpu_gather_gates) -------------------------- */

#define GATES_PAR_MIN  65536u
#define GATES_BINS_MAX (1u << 20) /* (slice, bin) counters of the pool's way */
#define GATES_RANGES   6u         /* at most 2^6 end ranges per (buffer, group) */

/*
 * The pool's way: a bin is (buffer, group, range of ends), the ranges
 * 2^rbits equal parts of the buffer, so that one group whose factor is
 * common in the data (most of the ends) is still sorted by many tasks.
 * Bins in order are a buffer's ends by group, then by end.
 */
struct gate_job {
    const uint32_t *raw;
    uint64_t n;
    uint32_t slices, n_groups, n_buffers, n_bins;
    uint32_t rbits;        /* log2 of the ranges per (buffer, group) */
    const uint32_t *shift; /* per buffer: an end's range is end >> shift */
    uint32_t *cnt;         /* (slice, bin) */
    uint64_t *start;       /* per bin; [n_bins]: all */
    uint32_t *kept;        /* per bin, after the sort */
    uint64_t *out;         /* per bin: where its ends go in its buffer's list */
    uint64_t *keys, *tmp;
    const uint32_t *task_bin;
    struct refscan_gate *gates;
};

static uint32_t gate_bin(const struct gate_job *j, const uint32_t *h)
{
    uint64_t r = (uint64_t)h[3] >> j->shift[h[0]];
    uint64_t last = ((uint64_t)1 << j->rbits) - 1;
    return ((h[0] * j->n_groups + h[1]) << j->rbits) + (uint32_t)(r < last ? r : last);
}

static void gate_slice(struct gate_job *j, uint32_t t, bool scatter)
{
    uint32_t *cnt = j->cnt + (size_t)t * j->n_bins;
    uint64_t lo = j->n * t / j->slices, hi = j->n * (t + 1) / j->slices;
    for (uint64_t i = lo; i < hi; i++) {
        const uint32_t *h = &j->raw[i * 4];
        if (h[0] >= j->n_buffers || h[1] >= j->n_groups)
            continue;
        uint32_t bin = gate_bin(j, h);
        if (scatter)
            j->keys[cnt[bin]++] = h[3];
        else
            cnt[bin]++;
    }
}

static void gate_count_task(void *ctx, uint32_t t)
{
    gate_slice(ctx, t, false);
}

static void gate_scatter_task(void *ctx, uint32_t t)
{
    gate_slice(ctx, t, true);
}

static void gate_sort_task(void *ctx, uint32_t t)
{
    struct gate_job *j = ctx;
    for (uint32_t b = j->task_bin[t]; b < j->task_bin[t + 1]; b++) {
        uint64_t s = j->start[b];
        j->kept[b] = sort_unique(j->keys + s, j->tmp + s, j->start[b + 1] - s);
    }
}

static void gate_write_task(void *ctx, uint32_t t)
{
    struct gate_job *j = ctx;
    uint32_t per_buf = j->n_groups << j->rbits;
    for (uint32_t b = j->task_bin[t]; b < j->task_bin[t + 1]; b++) {
        struct refscan_cand *v = j->gates[b / per_buf].v + j->out[b];
        uint32_t g = (b % per_buf) >> j->rbits;
        const uint64_t *k = j->keys + j->start[b];
        for (uint32_t x = 0; x < j->kept[b]; x++)
            v[x] = (struct refscan_cand){.nfa = g, .end = k[x]};
    }
}

/* Each buffer's gate list made from its sorted bins: where each bin's ends
 * go, then the copies on the threads. */
static int gates_from_bins(struct batch_ctx *bc, struct gate_job *j, uint32_t n_tasks)
{
    uint32_t per_buf = j->n_groups << j->rbits;
    for (uint32_t i = 0; i < j->n_buffers; i++) {
        uint64_t m = 0;
        for (uint32_t b = i * per_buf; b < (i + 1) * per_buf; b++) {
            j->out[b] = m;
            m += j->kept[b];
        }
        if (m == 0)
            continue;
        struct refscan_gate *gate = &j->gates[i];
        gate->v = malloc(m * sizeof(*gate->v));
        if (gate->v == NULL)
            return -ENOMEM;
        gate->cap = gate->n = m;
        bc->tel->factor_ends += m;
    }
    upload_pool_run(bc->eng->pool, gate_write_task, j, n_tasks);
    return 0;
}

/* The way by buffer, for few ends or many buffers: a counting sort by
 * buffer, then each buffer's (group, end) keys radix-sorted into its gate
 * list, whole buffers a task (on the upload threads when `par`). */
struct buf_gate_job {
    struct batch_ctx *bc;
    uint64_t *key, *tmp;
    const uint64_t *start; /* per buffer; [n_buffers]: all */
    const uint32_t *task_buf;
    atomic_int rc;
};

static void buf_gate_task(void *ctx, uint32_t t)
{
    struct buf_gate_job *j = ctx;
    for (uint32_t i = j->task_buf[t]; i < j->task_buf[t + 1]; i++) {
        uint64_t lo = j->start[i], m = j->start[i + 1] - lo;
        if (m == 0)
            continue;
        const uint64_t *key = j->key + lo;
        uint32_t w = sort_unique(j->key + lo, j->tmp + lo, m);
        struct refscan_gate *g = &j->bc->gates[i];
        g->v = malloc(w * sizeof(*g->v));
        if (g->v == NULL) {
            atomic_store(&j->rc, -ENOMEM);
            return;
        }
        g->cap = g->n = w;
        for (uint32_t k = 0; k < w; k++)
            g->v[k] =
                (struct refscan_cand){.nfa = (uint32_t)(key[k] >> 32), .end = (uint32_t)key[k]};
    }
}

static int gather_by_buffer(struct batch_ctx *bc, const uint32_t *raw, uint64_t n, bool par)
{
    uint32_t nb = bc->batch->n_buffers;
    struct batch_scratch *s = &bc->eng->scratch;
    struct upload_pool *pool = bc->eng->pool;
    size_t most = par ? (size_t)upload_pool_threads(pool) * TASKS_PER_THR : 1;
    if (gpu_grow_array((void **)&s->bin_start, &s->bin_start_cap, (size_t)nb + 1, 8) < 0 ||
        gpu_grow_array((void **)&s->task_bin, &s->task_bin_cap, most + 1, 4) < 0 ||
        gpu_grow_array((void **)&s->keys, &s->keys_cap, 2 * n + 1, 8) < 0)
        return -ENOMEM;
    uint64_t *start = s->bin_start;
    memset(start, 0, ((size_t)nb + 1) * 8);
    for (uint64_t i = 0; i < n; i++)
        if (raw[i * 4] < nb)
            start[raw[i * 4] + 1]++;
    for (uint32_t i = 0; i < nb; i++)
        start[i + 1] += start[i];
    uint64_t *key = s->keys;
    for (uint64_t i = 0; i < n; i++) { /* start[b] moves to buffer b's end */
        const uint32_t *h = &raw[i * 4];
        if (h[0] < nb)
            key[start[h[0]]++] = (uint64_t)h[1] << 32 | h[3];
    }
    memmove(start + 1, start, (size_t)nb * 8); /* back to each buffer's start */
    start[0] = 0;
    struct buf_gate_job j = {.bc = bc, .key = key, .tmp = key + n, .start = start};
    atomic_init(&j.rc, 0);
    uint32_t n_tasks = split_tasks(start, nb, most, s->task_bin);
    j.task_buf = s->task_bin;
    if (par)
        upload_pool_run(pool, buf_gate_task, &j, n_tasks);
    else
        for (uint32_t t = 0; t < n_tasks; t++)
            buf_gate_task(&j, t);
    for (uint32_t i = 0; i < nb; i++)
        bc->tel->factor_ends += bc->gates[i].n;
    return atomic_load(&j.rc);
}

static uint32_t gate_groups(const struct gpu_batch *b)
{
    uint32_t most = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        uint32_t k = catalog_nfa_count(b->catalogs[c]);
        most = k > most ? k : most;
    }
    return most;
}

int gpu_gather_gates(struct batch_ctx *bc, const uint32_t *raw, uint64_t n)
{
    const struct gpu_batch *b = bc->batch;
    struct batch_scratch *s = &bc->eng->scratch;
    struct upload_pool *pool = bc->eng->pool;
    struct gate_job j = {.raw = raw, .n = n, .n_buffers = b->n_buffers, .n_groups = gate_groups(b)};
    bc->gates = calloc(b->n_buffers ? b->n_buffers : 1, sizeof(*bc->gates));
    if (bc->gates == NULL)
        return -ENOMEM;
    uint64_t pairs = (uint64_t)j.n_buffers * j.n_groups;
    if (pairs == 0 || n == 0)
        return 0;
    uint32_t least =
        bc->eng->opt.hits_parallel_min ? bc->eng->opt.hits_parallel_min : GATES_PAR_MIN;
    j.slices = upload_pool_threads(pool);
    if (n < least || j.slices < 2 || n >= UINT32_MAX)
        return gather_by_buffer(bc, raw, n, false);
    /* many buffers: whole buffers a task; a few: bins by range of ends */
    if (pairs * j.slices > GATES_BINS_MAX || j.n_buffers >= j.slices * TASKS_PER_THR)
        return gather_by_buffer(bc, raw, n, true);
    /* as many ranges as the counters allow, and no more than n / 64 bins */
    while (j.rbits < GATES_RANGES && (pairs << (j.rbits + 1)) * j.slices <= GATES_BINS_MAX &&
           (pairs << (j.rbits + 1)) <= n / 64)
        j.rbits++;
    uint64_t bins = pairs << j.rbits;
    j.n_bins = (uint32_t)bins;
    size_t n_tasks_most = (size_t)j.slices * TASKS_PER_THR;
    if (gpu_grow_array((void **)&s->bin_cnt, &s->bin_cnt_cap, (size_t)j.slices * bins, 4) < 0 ||
        gpu_grow_array((void **)&s->bin_start, &s->bin_start_cap, bins + 1, 8) < 0 ||
        gpu_grow_array((void **)&s->bin_kept, &s->bin_kept_cap, bins, 4) < 0 ||
        gpu_grow_array((void **)&s->bin_out, &s->bin_out_cap, bins, 8) < 0 ||
        gpu_grow_array((void **)&s->counts, &s->counts_cap, j.n_buffers, 4) < 0 ||
        gpu_grow_array((void **)&s->task_bin, &s->task_bin_cap, n_tasks_most + 1, 4) < 0 ||
        gpu_grow_array((void **)&s->keys, &s->keys_cap, 2 * n + 1, 8) < 0)
        return -ENOMEM;
    for (uint32_t i = 0; i < j.n_buffers; i++) { /* (len >> shift) < 2^rbits: ends <= len */
        unsigned w = bits_for(b->buffers[i].len);
        s->counts[i] = w > j.rbits ? w - j.rbits : 0;
    }
    j.shift = s->counts;
    j.cnt = s->bin_cnt;
    j.start = s->bin_start;
    j.kept = s->bin_kept;
    j.out = s->bin_out;
    j.keys = s->keys;
    j.tmp = s->keys + n;
    j.gates = bc->gates;
    memset(j.cnt, 0, (size_t)j.slices * bins * 4);
    upload_pool_run(pool, gate_count_task, &j, j.slices);
    bins_prefix(j.cnt, j.start, j.n_bins, j.slices);
    uint32_t n_tasks = split_tasks(j.start, j.n_bins, n_tasks_most, s->task_bin);
    j.task_bin = s->task_bin;
    upload_pool_run(pool, gate_scatter_task, &j, j.slices);
    upload_pool_run(pool, gate_sort_task, &j, n_tasks);
    return gates_from_bins(bc, &j, n_tasks);
}
