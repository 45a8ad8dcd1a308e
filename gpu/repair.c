/*
 * The host's part of a collected pass, before its hits are grouped
 * (docs/gpu.md): speculative segments whose guessed start state was wrong
 * are walked again from the state their predecessor ended in, and
 * confirmation items that reached their cap with a live state are walked
 * forward on the host (on the upload threads when there are several).
 * Both leave "fixes" (device hits to drop) and "fix hits" (hits to add),
 * which gpu_finish_hits (hits.c) merges.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Buffer i's bytes while its batch is collected: the caller's, or (read
 * by a callback) the copy in the frame's upload memory. */
static const uint8_t *buffer_bytes(const struct batch_ctx *bc, uint32_t i)
{
    const struct gpu_buffer *b = &bc->batch->buffers[i];
    if (b->data != NULL || b->len == 0)
        return b->data;
    const struct gpu_engine *eng = bc->eng;
    const uint8_t *base = eng->direct && eng->hay.map != NULL ? eng->hay.map : eng->staging.map;
    return base + eng->scratch.offs[i];
}

/* A list of hits of one buffer that a walk appends to: the fix hits (the
 * host's matches) or the unhits (the guessed walk's, which a counted range
 * counted on the device and the finish takes out again). */
struct fix_ctx {
    struct gpu_hit **v;
    size_t *cap, *n;
    uint32_t buf;
};

static int fix_hit(void *ctx, uint32_t rule, uint64_t end)
{
    struct fix_ctx *f = ctx;
    if (gpu_grow_array((void **)f->v, f->cap, *f->n + 1, sizeof(struct gpu_hit)) < 0)
        return -ENOMEM;
    (*f->v)[(*f->n)++] = (struct gpu_hit){f->buf, rule, 1, end};
    return 0;
}

/* Records that the host re-walked item `it` (buffer, lo, hi) of range sr
 * up to `upto`: the device's hits there are dropped (spec_dropped). */
static int record_fix(struct batch_ctx *bc, const struct scan_range *sr, const uint32_t *it,
                      uint64_t upto)
{
    struct batch_scratch *s = &bc->eng->scratch;
    if (gpu_grow_array((void **)&s->fixes, &s->fixes_cap, bc->n_fixes + 1, sizeof(*s->fixes)) < 0)
        return -ENOMEM;
    s->fixes[bc->n_fixes++] = (struct spec_fix){it[0], sr->group, it[1], upto};
    bc->tel->spec_fixes++;
    bc->tel->spec_fix_bytes += (upto > it[2] ? it[2] : upto) - it[1];
    return 0;
}

static int cmp_fix(const void *a, const void *b)
{
    const struct spec_fix *x = a, *y = b;
    if (x->buf != y->buf)
        return x->buf < y->buf ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int cmp_fix_hit(const void *a, const void *b)
{
    const struct gpu_hit *x = a, *y = b;
    return x->buffer < y->buffer ? -1 : x->buffer > y->buffer;
}

/*
 * Speculative ranges (gpu/plan.c plan_spec): segment j of a buffer guessed
 * its state at lo; the walk is exact from lo on when the guess equals the
 * state segment j-1 ended in (the first segment of a buffer starts at 0
 * and guesses nothing). Every guess is checked in buffer order, and the
 * wrong ones are walked again on the host until the true and the guessed
 * walk agree, recording which device hits to drop and the host's hits
 * instead.
 *
 * A re-walk needs the true state at lo: the guessed end of the segment
 * before, where that segment's guess was right or its re-walk met the
 * guessed walk again; else that re-walk's end. So the re-walks run as
 * jobs on the upload threads, one from each segment whose guess differs
 * from the guessed end of the segment before, assumed true there: a job
 * walks on into the next segments for as long as its walk does not meet
 * the guessed one (a chain whose state the guesses never catch, such as
 * an open quote, is one job). Then, in buffer order, each segment that
 * needs a re-walk takes it from the job already walking there, or from the
 * job starting there (whose assumed state is then the true one). A
 * segment no job walked is one whose job ran out of memory: the batch
 * fails with that error.
 */
/* Jobs a pool task takes at the least (gpu_options.spec_slice_jobs
 * overrides it): a job is often one segment of a few hundred bytes. */
#define SPEC_JOBS_TASK 16

struct spec_seg {
    uint32_t j;          /* item index in the range */
    bool met;            /* the walks agreed by hi: the guessed end stands */
    uint32_t out;        /* DFA, !met: the true state at hi */
    uint64_t upto;       /* where the walks agreed (hi + 1: never) */
    size_t hits, unhits; /* its hits and unhits end here in its task's lists */
    size_t vec;          /* bit-NFA, !met: the true state at hi, at its task's vecs[vec] */
};

struct spec_job {
    const struct scan_range *sr;
    uint32_t j;          /* the item it starts at */
    const uint32_t *in;  /* the assumed true state (vector) at its lo */
    uint32_t task;       /* the task that ran it, holding its segments */
    size_t seg, n_segs;  /* its segments: the task's segs[seg..seg + n_segs) */
    size_t hits, unhits; /* its first segment's hits start here */
    int rc;
};

/* A slice of the jobs run on one thread, their results in shared lists
 * (a job is often one segment of a few hundred bytes: lists per job cost
 * more than their walks). */
struct spec_task {
    struct spec_seg *segs;
    size_t n_segs, segs_cap;
    uint32_t *vecs;
    size_t n_vecs, vecs_cap;
    struct gpu_hit *hits, *unhits;
    size_t n_hits, hits_cap, n_unhits, unhits_cap;
};

struct spec_jobs {
    const struct batch_ctx *bc;
    const uint32_t *spec; /* qs words of the speculative ranges' states */
    struct spec_job *v;
    size_t n, cap;
    struct spec_task *tasks;
    uint32_t n_tasks;
    uint32_t nw_max;
};

static uint32_t range_words(const struct batch_ctx *bc, const struct scan_range *sr)
{
    if (!sr->nfa)
        return 1;
    const struct catalog *cat = bc->batch->catalogs[sr->cat];
    struct catalog_nfa g;
    catalog_nfa(cat, sr->group - catalog_group_count(cat), &g);
    return g.n_words;
}

/* Task tk's walk of item j of job x's range from the true state `truth`
 * (nw words): one more segment, with truth left at the true state at hi. */
static int spec_job_step(const struct spec_jobs *js, struct spec_task *tk, const struct spec_job *x,
                         uint32_t j, uint32_t *truth, uint32_t nw)
{
    const struct batch_ctx *bc = js->bc;
    const struct scan_range *sr = x->sr;
    const uint32_t *it = &bc->eng->scratch.meta[((size_t)sr->items + j) * 4];
    const uint32_t *st = js->spec + sr->spec_base + 2 * (size_t)j * nw;
    const struct gpu_buffer *b = &bc->batch->buffers[it[0]];
    const struct catalog *cat = bc->batch->catalogs[sr->cat];
    struct fix_ctx f = {&tk->hits, &tk->hits_cap, &tk->n_hits, it[0]};
    struct fix_ctx g = {&tk->unhits, &tk->unhits_cap, &tk->n_unhits, it[0]};
    if (gpu_grow_array((void **)&tk->segs, &tk->segs_cap, tk->n_segs + 1, sizeof(*tk->segs)) < 0)
        return -ENOMEM;
    struct spec_seg *sg = &tk->segs[tk->n_segs];
    *sg = (struct spec_seg){.j = j};
    int rc;
    if (!sr->nfa) {
        rc = refscan_group_resume(cat, sr->group, buffer_bytes(bc, it[0]), b->len, it[1], it[2],
                                  truth[0], st[0], fix_hit, &f, sr->counted ? fix_hit : NULL, &g,
                                  &sg->upto, &sg->out);
        sg->met = sg->out == UINT32_MAX;
        truth[0] = sg->met ? st[1] : sg->out;
    } else {
        rc = refscan_nfa_resume(cat, sr->group - catalog_group_count(cat), buffer_bytes(bc, it[0]),
                                b->len, it[1], it[2], truth, st, fix_hit, &f,
                                sr->counted ? fix_hit : NULL, &g, &sg->upto, &sg->met);
        if (rc == 0 && sg->met)
            memcpy(truth, st + nw, nw * sizeof(uint32_t));
        if (rc == 0 && !sg->met) {
            if (gpu_grow_array((void **)&tk->vecs, &tk->vecs_cap, tk->n_vecs + nw,
                               sizeof(uint32_t)) < 0)
                return -ENOMEM;
            sg->vec = tk->n_vecs;
            memcpy(tk->vecs + tk->n_vecs, truth, nw * sizeof(uint32_t));
            tk->n_vecs += nw;
        }
    }
    if (rc != 0)
        return -ENOMEM;
    sg->hits = tk->n_hits;
    sg->unhits = tk->n_unhits;
    tk->n_segs++;
    return 0;
}

/* Job x on task tk: from its start on, segment by segment, while its walk
 * does not meet the guessed one. */
static void spec_job_run(const struct spec_jobs *js, struct spec_task *tk, struct spec_job *x,
                         uint32_t *truth)
{
    const struct scan_range *sr = x->sr;
    uint32_t nw = range_words(js->bc, sr);
    x->seg = tk->n_segs;
    x->hits = tk->n_hits;
    x->unhits = tk->n_unhits;
    memcpy(truth, x->in, nw * sizeof(uint32_t));
    for (uint32_t j = x->j; j < sr->n_items && x->rc == 0; j++) {
        const uint32_t *it = &js->bc->eng->scratch.meta[((size_t)sr->items + j) * 4];
        const uint32_t *st = js->spec + sr->spec_base + 2 * (size_t)j * nw;
        if (j > x->j && (it[1] == 0 || memcmp(st, truth, nw * sizeof(uint32_t)) == 0))
            break; /* another buffer, or the guess right from here */
        x->rc = spec_job_step(js, tk, x, j, truth, nw);
        if (x->rc == 0 && tk->segs[tk->n_segs - 1].met)
            break;
    }
    x->n_segs = tk->n_segs - x->seg;
}

/* Task t: the jobs [n t / tasks, n (t+1) / tasks). */
static void spec_task_run(void *ctx, uint32_t t)
{
    const struct spec_jobs *js = ctx;
    struct spec_task *tk = &js->tasks[t];
    size_t a = js->n * t / js->n_tasks, z = js->n * (t + 1) / js->n_tasks;
    uint32_t *truth = malloc(js->nw_max * sizeof(uint32_t));
    for (size_t k = a; k < z; k++) {
        js->v[k].task = t;
        if (truth == NULL)
            js->v[k].rc = -ENOMEM;
        else
            spec_job_run(js, tk, &js->v[k], truth);
    }
    free(truth);
}

/* Lists the jobs of range sr: one from each segment whose guess differs
 * from the guessed end of the segment before (zeros before the first). */
static int spec_jobs_add(struct spec_jobs *js, const struct scan_range *sr, const uint32_t *zero)
{
    const struct batch_ctx *bc = js->bc;
    uint32_t nw = range_words(bc, sr);
    const uint32_t *st = js->spec + sr->spec_base;
    for (uint32_t j = 0; j < sr->n_items; j++) {
        const uint32_t *it = &bc->eng->scratch.meta[((size_t)sr->items + j) * 4];
        const uint32_t *v = st + 2 * (size_t)j * nw;
        const uint32_t *in = j == 0 ? zero : v - nw; /* the guessed end of segment j-1 */
        if (it[1] == 0 || memcmp(v, in, nw * sizeof(uint32_t)) == 0)
            continue;
        if (gpu_grow_array((void **)&js->v, &js->cap, js->n + 1, sizeof(*js->v)) < 0)
            return -ENOMEM;
        js->v[js->n++] = (struct spec_job){.sr = sr, .j = j, .in = in};
    }
    return 0;
}

static int append_hits(struct gpu_hit **v, size_t *cap, size_t *n, const struct gpu_hit *h,
                       size_t k)
{
    if (k == 0)
        return 0;
    if (gpu_grow_array((void **)v, cap, *n + k, sizeof(**v)) < 0)
        return -ENOMEM;
    memcpy(*v + *n, h, k * sizeof(*h));
    *n += k;
    return 0;
}

/* Takes segment k of job x (k < x->n_segs) as its item's re-walk: its
 * hits, its fix and the true state at hi into truth. */
static int spec_seg_take(struct batch_ctx *bc, const struct spec_jobs *js, const struct spec_job *x,
                         size_t k, const uint32_t *st, uint32_t *truth, uint32_t nw)
{
    struct batch_scratch *s = &bc->eng->scratch;
    const struct spec_task *tk = &js->tasks[x->task];
    const struct spec_seg *sg = &tk->segs[x->seg + k];
    const uint32_t *it = &s->meta[((size_t)x->sr->items + sg->j) * 4];
    size_t h0 = k > 0 ? sg[-1].hits : x->hits, u0 = k > 0 ? sg[-1].unhits : x->unhits;
    int rc =
        append_hits(&s->fix_hits, &s->fix_hits_cap, &bc->n_fix_hits, tk->hits + h0, sg->hits - h0);
    if (rc == 0)
        rc = append_hits(&s->unhits, &s->unhits_cap, &bc->n_unhits, tk->unhits + u0,
                         sg->unhits - u0);
    if (rc < 0 || record_fix(bc, x->sr, it, sg->upto) < 0)
        return -ENOMEM;
    if (sg->met)
        memcpy(truth, st + nw, nw * sizeof(uint32_t));
    else if (!x->sr->nfa)
        truth[0] = sg->out;
    else
        memcpy(truth, tk->vecs + sg->vec, nw * sizeof(uint32_t));
    return 0;
}

/* Checks range sr's guesses in order from the true states, taking each
 * wrong one's re-walk from the segments of its jobs (js->v[*k..]). */
static int spec_replay(struct batch_ctx *bc, const struct spec_jobs *js, size_t *k,
                       const struct scan_range *sr, uint32_t *truth)
{
    uint32_t nw = range_words(bc, sr);
    const uint32_t *st = js->spec + sr->spec_base;
    const struct spec_job *on = NULL; /* the job walking on from the item before */
    size_t on_seg = 0;
    memset(truth, 0, nw * sizeof(uint32_t));
    int rc = 0;
    for (uint32_t j = 0; j < sr->n_items && rc == 0; j++) {
        const uint32_t *it = &bc->eng->scratch.meta[((size_t)sr->items + j) * 4];
        const uint32_t *v = st + 2 * (size_t)j * nw;
        const struct spec_job *x = NULL;
        while (*k < js->n && js->v[*k].sr == sr && js->v[*k].j <= j)
            if (js->v[(*k)++].j == j)
                x = &js->v[*k - 1];
        const struct spec_job *cur = on;
        size_t seg = on_seg;
        on = NULL;
        if (it[1] == 0 || memcmp(v, truth, nw * sizeof(uint32_t)) == 0) {
            memcpy(truth, v + nw, nw * sizeof(uint32_t));
            continue;
        }
        /* with no job walking on into here, the true state is the guessed
         * end before, which the job starting here assumed; else, and where
         * a job stopped short, a job ran out of memory */
        if (cur == NULL && x != NULL && memcmp(x->in, truth, nw * sizeof(uint32_t)) == 0)
            cur = x, seg = 0;
        if (cur == NULL || seg >= cur->n_segs || js->tasks[cur->task].segs[cur->seg + seg].j != j)
            return -ENOMEM;
        rc = spec_seg_take(bc, js, cur, seg, v, truth, nw);
        if (!js->tasks[cur->task].segs[cur->seg + seg].met)
            on = cur, on_seg = seg + 1;
    }
    return rc;
}

static int spec_repair(struct batch_ctx *bc, const uint32_t *qs, struct vks_error *err)
{
    struct batch_scratch *s = &bc->eng->scratch;
    struct spec_jobs js = {.bc = bc, .spec = qs + QS_HEADS + bc->n_ranges};
    uint32_t nw_max = 1;
    for (size_t r = 0; r < bc->n_ranges; r++)
        if (s->ranges[r].spec_base != NO_CARRY && range_words(bc, &s->ranges[r]) > nw_max)
            nw_max = range_words(bc, &s->ranges[r]);
    uint32_t *zero = calloc(2 * (size_t)nw_max, sizeof(uint32_t)), *truth = zero + nw_max;
    int rc = zero != NULL ? 0 : -ENOMEM;
    for (size_t r = 0; r < bc->n_ranges && rc == 0; r++)
        if (s->ranges[r].spec_base != NO_CARRY)
            rc = spec_jobs_add(&js, &s->ranges[r], zero);
    struct upload_pool *pool = bc->eng->pool;
    uint32_t threads = pool != NULL ? upload_pool_threads(pool) : 1;
    js.nw_max = nw_max;
    size_t least = bc->eng->opt.spec_slice_jobs ? bc->eng->opt.spec_slice_jobs : SPEC_JOBS_TASK;
    js.n_tasks = js.n < least * 2 || threads < 2 ? 1
                 : js.n / least < 4 * threads    ? (uint32_t)(js.n / least)
                                                 : 4 * threads;
    js.tasks = rc == 0 && js.n > 0 ? calloc(js.n_tasks, sizeof(*js.tasks)) : NULL;
    if (js.tasks == NULL && js.n > 0)
        rc = -ENOMEM;
    if (rc == 0 && js.n_tasks > 1)
        upload_pool_run(pool, spec_task_run, &js, js.n_tasks);
    else if (rc == 0 && js.n > 0)
        spec_task_run(&js, 0);
    size_t k = 0;
    for (size_t r = 0; r < bc->n_ranges && rc == 0; r++)
        if (s->ranges[r].spec_base != NO_CARRY)
            rc = spec_replay(bc, &js, &k, &s->ranges[r], truth);
    for (uint32_t t = 0; js.tasks != NULL && t < js.n_tasks; t++) {
        free(js.tasks[t].segs);
        free(js.tasks[t].vecs);
        free(js.tasks[t].hits);
        free(js.tasks[t].unhits);
    }
    free(js.tasks);
    free(js.v);
    free(zero);
    return rc < 0 ? vks_error_set(err, -ENOMEM, "out of memory re-walking a speculative segment")
                  : 0;
}

/* The confirmation range of engine group `layer` for buffer `buf`. */
static const struct scan_range *confirm_range(const struct batch_ctx *bc, uint32_t buf,
                                              uint32_t layer)
{
    const struct batch_scratch *s = &bc->eng->scratch;
    for (size_t r = 0; r < bc->n_ranges; r++) {
        const struct scan_range *sr = &s->ranges[r];
        if (sr->nfa && sr->cap != NO_CARRY && sr->group == layer &&
            sr->cat == bc->batch->buffers[buf].catalog)
            return sr;
    }
    return NULL;
}

/* One (buffer, group) of confirm_finish: its live items v[0..n) and the
 * hits of its walk, kept apart so that walks can run on several threads. */
struct confirm_walk {
    const struct spec_fix *v;
    size_t n;
    struct gpu_hit *hits;
    size_t n_hits, cap;
    int rc;
};

struct confirm_job {
    const struct batch_ctx *bc;
    struct confirm_walk *w;
};

static int confirm_hit(void *ctx, uint32_t rule, uint64_t end)
{
    struct confirm_walk *w = ctx;
    uint64_t limit = refscan_raw_limit(); /* a walk that never dies may match at every byte */
    if (limit != 0 && w->n_hits >= limit)
        return -E2BIG;
    if (gpu_grow_array((void **)&w->hits, &w->cap, w->n_hits + 1, sizeof(*w->hits)) < 0)
        return -ENOMEM;
    w->hits[w->n_hits++] = (struct gpu_hit){w->v[0].buf, rule, 1, end};
    return 0;
}

/* Walks the live items of one (buffer, group) as one forward confirmation
 * on the host, from the first start to where it dies. Reads only the
 * batch's catalogs and bytes: a pool task. */
static void confirm_walk_task(void *ctx, uint32_t t)
{
    const struct confirm_job *j = ctx;
    struct confirm_walk *w = &j->w[t];
    uint64_t *iv = malloc(2 * w->n * sizeof(*iv));
    if (iv == NULL) {
        w->rc = -ENOMEM;
        return;
    }
    for (size_t k = 0; k < w->n; k++) {
        iv[2 * k] = w->v[k].lo;
        iv[2 * k + 1] = w->v[k].upto;
    }
    const struct gpu_buffer *b = &j->bc->batch->buffers[w->v[0].buf];
    const struct catalog *cat = j->bc->batch->catalogs[b->catalog];
    int rc =
        refscan_confirm_range(cat, w->v[0].layer - catalog_group_count(cat),
                              buffer_bytes(j->bc, w->v[0].buf), b->len, iv, w->n, confirm_hit, w);
    w->rc = rc == 0 || rc == -E2BIG ? rc : -ENOMEM;
    free(iv);
}

/* Runs the walks w[0..n) (on the upload threads when there are several)
 * and appends their hits to the fix hits in walk order. */
static int confirm_walk_all(struct batch_ctx *bc, struct confirm_walk *w, size_t n)
{
    struct confirm_job j = {bc, w};
    struct upload_pool *pool = bc->eng->pool;
    if (n > 1 && n <= UINT32_MAX && pool != NULL && upload_pool_threads(pool) > 1)
        upload_pool_run(pool, confirm_walk_task, &j, (uint32_t)n);
    else
        for (size_t t = 0; t < n; t++)
            confirm_walk_task(&j, (uint32_t)t);
    struct batch_scratch *s = &bc->eng->scratch;
    int rc = 0;
    for (size_t t = 0; t < n && rc == 0; t++) {
        rc = w[t].rc;
        if (rc == 0 && gpu_grow_array((void **)&s->fix_hits, &s->fix_hits_cap,
                                      bc->n_fix_hits + w[t].n_hits, sizeof(*s->fix_hits)) < 0)
            rc = -ENOMEM;
        if (rc == 0 && w[t].n_hits > 0)
            memcpy(s->fix_hits + bc->n_fix_hits, w[t].hits, w[t].n_hits * sizeof(*w[t].hits));
        bc->n_fix_hits += rc == 0 ? w[t].n_hits : 0;
        if (rc == 0 && refscan_raw_limit() != 0 && bc->n_fix_hits > refscan_raw_limit())
            rc = -E2BIG;
    }
    for (size_t t = 0; t < n; t++)
        free(w[t].hits);
    return rc;
}

/* Splits the live items v[0..nv), sorted by (buffer, group), into one walk
 * per (buffer, group) and runs them. */
static int confirm_walk_host(struct batch_ctx *bc, const struct spec_fix *v, size_t nv)
{
    size_t n = 0;
    for (size_t a = 0; a < nv; a++)
        n += a == 0 || v[a].buf != v[a - 1].buf || v[a].layer != v[a - 1].layer;
    struct confirm_walk *w = calloc(n ? n : 1, sizeof(*w));
    if (w == NULL)
        return -ENOMEM;
    n = 0;
    for (size_t a = 0, z; a < nv; a = z) {
        for (z = a + 1; z < nv && v[z].buf == v[a].buf && v[z].layer == v[a].layer; z++)
            ;
        w[n++] = (struct confirm_walk){.v = v + a, .n = z - a};
    }
    int rc = confirm_walk_all(bc, w, n);
    free(w);
    return rc;
}

/*
 * Confirmation items that reached their cap with a live state left a hit
 * with rule NONE and end = their index (shaders/scan_nfa.comp). The host
 * walks their start intervals again, per (buffer, group) as one forward
 * confirmation to where it dies: linear in what it walks, however long
 * the walks live. The (buffer, group) walks are independent, so several
 * run at once on the upload threads, each into its own hit list; the lists
 * are appended in (buffer, group) order, the order one thread gives. Their
 * hits join the device's; the copies of the device's hits up to the caps
 * go when the hits are finalized.
 */
static int confirm_finish(struct batch_ctx *bc, const uint32_t *raw, uint64_t n,
                          struct vks_error *err)
{
    uint64_t t0 = gpu_now_ns();
    struct spec_fix *v = NULL;
    size_t nv = 0, cap = 0;
    int rc = 0;
    for (uint64_t i = 0; i < n && rc == 0; i++) {
        const uint32_t *h = &raw[i * 4];
        if (h[1] != NO_CARRY)
            continue;
        const struct scan_range *sr = confirm_range(bc, h[0], h[2]);
        if (sr == NULL || h[3] >= sr->n_items)
            continue; /* cannot happen: the kernel writes these for such ranges only */
        const uint32_t *it = &bc->eng->scratch.meta[((size_t)sr->items + h[3]) * 4];
        if (gpu_grow_array((void **)&v, &cap, nv + 1, sizeof(*v)) < 0)
            rc = -ENOMEM;
        else
            v[nv++] = (struct spec_fix){h[0], h[2], it[1], it[2]};
    }
    if (nv > 1)
        qsort(v, nv, sizeof(*v), cmp_fix);
    if (rc == 0 && nv > 0)
        rc = confirm_walk_host(bc, v, nv);
    bc->tel->confirm_host += nv;
    if (nv > 0) /* the walks' time; looking for them in the raw hits is not */
        bc->tel->confirm_host_ns += gpu_now_ns() - t0;
    free(v);
    if (rc == -E2BIG)
        return vks_error_set(err, -E2BIG,
                             "the host's confirmation walks found more than %llu matches (the "
                             "raw-match bound, 4 x max-hits): split the batch",
                             (unsigned long long)refscan_raw_limit());
    return rc < 0 ? vks_error_set(err, -ENOMEM, "out of memory finishing confirmation walks") : 0;
}

int gpu_unhits_unsure(const struct batch_ctx *bc, const uint32_t *qs)
{
    const struct batch_scratch *s = &bc->eng->scratch;
    size_t f = 0; /* the fix hits of the unhit's buffer start here */
    for (size_t k = 0; k < bc->n_unhits; k++) {
        const struct gpu_hit *u = &s->unhits[k];
        uint32_t tab = s->meta[(size_t)u->buffer * 4 + 2];
        if (tab == NO_CARRY || u->end != ~qs[tab + 2 * u->rule + 1])
            continue;
        while (f < bc->n_fix_hits && s->fix_hits[f].buffer < u->buffer)
            f++;
        bool also_true = false;
        for (size_t x = f; x < bc->n_fix_hits && s->fix_hits[x].buffer == u->buffer; x++)
            also_true |= s->fix_hits[x].rule == u->rule && s->fix_hits[x].end == u->end;
        if (!also_true)
            return (int)bc->batch->buffers[u->buffer].catalog;
    }
    return -1;
}

/* Host work on a collected pass before its hits are grouped: repaired
 * speculative segments and confirmations finished on the host. */
int gpu_host_finish(struct batch_ctx *bc, const uint32_t *qs, const uint32_t *raw, uint64_t n,
                    struct vks_error *err)
{
    struct batch_scratch *s = &bc->eng->scratch;
    bc->n_fixes = bc->n_fix_hits = bc->n_unhits = 0;
    uint64_t t0 = gpu_now_ns();
    int rc = bc->n_spec > 0 ? spec_repair(bc, qs, err) : 0;
    bc->tel->spec_fix_ns += gpu_now_ns() - t0;
    if (rc == 0 && bc->has_confirm)
        rc = confirm_finish(bc, raw, n, err);
    if (bc->n_fixes > 1)
        qsort(s->fixes, bc->n_fixes, sizeof(*s->fixes), cmp_fix);
    s->fix_words = 0;
    for (size_t k = 0; rc == 0 && k < bc->n_fixes; k++) {
        size_t w = s->fixes[k].layer / 64;
        if (w >= s->fix_words) {
            if (gpu_grow_array((void **)&s->fix_layers, &s->fix_layers_cap, w + 1, 8) < 0) {
                rc = vks_error_set(err, -ENOMEM, "out of memory listing repaired segments");
                break;
            }
            memset(s->fix_layers + s->fix_words, 0, (w + 1 - s->fix_words) * 8);
            s->fix_words = w + 1;
        }
        s->fix_layers[w] |= (uint64_t)1 << (s->fixes[k].layer % 64);
    }
    if (bc->n_fix_hits > 1)
        qsort(s->fix_hits, bc->n_fix_hits, sizeof(*s->fix_hits), cmp_fix_hit);
    if (bc->n_unhits > 1)
        qsort(s->unhits, bc->n_unhits, sizeof(*s->unhits), cmp_fix_hit);
    return rc;
}
