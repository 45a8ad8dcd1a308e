/*
 * The CPU engine (engine.h): a pool of scanning threads. A batch is split
 * into tasks, a segment of one buffer each (rules/cpuscan.h), handed out in
 * order; the thread that finishes a batch's last task merges its hits.
 * max_hits is applied while scanning: once the tasks done in order hold a
 * job's max_hits, its later tasks keep only a marker hit.
 */
#include "engine_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vkscan/errors.h"

/* ---- the CPU engine --------------------------------------------------- */

/* Threads from which a catalog with unbounded groups is split (split_lb). */
#define SPLIT_MIN_THREADS 4u

/* A buffer is spread over every thread in pieces of at least this much. */
#define MIN_SPLIT (64u << 10)

/* The segment size for a buffer of `len` bytes of a catalog with lookback
 * `lb`: at most cpu-segment-bytes, the buffer's share of the threads when
 * that is smaller (but at least MIN_SPLIT), and at least four lookbacks so
 * the overlap stays small. The whole buffer when it cannot be split. */
static uint64_t seg_size(const struct engine *e, uint64_t lb, uint64_t len)
{
    if (lb == CPUSCAN_UNSEGMENTABLE)
        return len;
    uint64_t share = len / __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED);
    uint64_t seg = share > MIN_SPLIT ? share : MIN_SPLIT;
    if (seg > e->seg_bytes)
        seg = e->seg_bytes;
    return seg < 4 * lb ? 4 * lb : seg;
}

/* The lookback of a split scan of a buffer of `len` bytes (a catalog with
 * an unbounded group: its unbounded groups walk the whole buffer as one
 * task, its bounded ones in segments beside it, docs/engine.md "Unbounded
 * catalogs on the CPU engine"), or CPUSCAN_UNSEGMENTABLE: one task.
 * *known caches cpuscan_split_lookback's answer for the job (a pass over
 * its catalog's rules; SPLIT_UNKNOWN before the first). */
#define SPLIT_UNKNOWN (CPUSCAN_UNSEGMENTABLE - 1)
static uint64_t split_lb(const struct engine *e, const struct catalog *cat, uint64_t lb,
                         uint64_t len, uint64_t *known)
{
    /* On fewer threads the split's second factor walk (the unbounded
     * groups' gates, the bounded ones' literal matchers) costs more than
     * it saves: gitleaks-regex over 32 MiB on 2 threads, 0.27 -> 0.39 s */
    if (lb != CPUSCAN_UNSEGMENTABLE || len < 2 * MIN_SPLIT ||
        __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED) < SPLIT_MIN_THREADS)
        return CPUSCAN_UNSEGMENTABLE;
    if (*known == SPLIT_UNKNOWN)
        *known = cpuscan_split_lookback(cat);
    uint64_t s = *known;
    return s != CPUSCAN_UNSEGMENTABLE && len > seg_size(e, s, len) ? s : CPUSCAN_UNSEGMENTABLE;
}

/* A split buffer's unbounded groups run in pieces of at least this much. */
#define MIN_PIECE (256u << 10)

/* How many pieces the unbounded groups of a split buffer of `len` bytes
 * run in: one a thread, each of at least MIN_PIECE (1: one task of the
 * whole buffer, as before pieces). */
static uint32_t unbounded_pieces(const struct engine *e, uint64_t len)
{
    uint64_t n = __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED), fit = len / MIN_PIECE;
    return (uint32_t)(fit < 1 ? 1 : fit < n ? fit : n);
}

/* The raw ends one piece of a buffer of `len` bytes may hold: a share of
 * the raw-match limit, which bounds what the buffer's whole walk holds. */
static size_t piece_raw(const struct engine *e, uint64_t len)
{
    size_t share = refscan_raw_max() / unbounded_pieces(e, len);
    return share > 0 ? share : 1;
}

/* Splits the batch's CPU jobs into tasks: a buffer of a catalog whose
 * groups are all bounded is cut into segments (seg_size); a large buffer of
 * a catalog with unbounded groups into one task of those and segments of
 * the rest (split_lb); anything else is one task per buffer. */
static void cpu_prepare(struct engine *e, struct engine_batch *b)
{
    struct bstate *st = b->priv;
    if (!st->loaded) {
        b->tel.engine = e->n_gpu; /* the CPU engine's stats index */
        engine_batch_load(e, b);
    }
    st->js = calloc(st->n_jobs ? st->n_jobs : 1, sizeof(*st->js));
    uint64_t n_tasks = 0;
    for (size_t i = 0; st->js != NULL && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        struct jstate *js = &st->js[i];
        js->run = j->status == 0 && (b->target == CPU_ENGINE || j->cpu_retry != 0);
        if (!js->run)
            continue;
        uint64_t lb = cpuscan_lookback(j->cat), known = SPLIT_UNKNOWN;
        for (uint32_t k = 0; k < j->n_bufs; k++) {
            const struct engine_buf *eb = &j->bufs[k];
            if (eb->status != 0 || eb->skip)
                continue;
            uint64_t blb = split_lb(e, j->cat, lb, eb->len, &known);
            uint64_t seg = seg_size(e, blb != CPUSCAN_UNSEGMENTABLE ? blb : lb, eb->len);
            n_tasks += (eb->len <= seg ? 1 : (eb->len + seg - 1) / seg) +
                       (blb != CPUSCAN_UNSEGMENTABLE ? unbounded_pieces(e, eb->len) : 0);
        }
    }
    st->tasks = calloc(n_tasks ? n_tasks : 1, sizeof(*st->tasks));
    if (st->js == NULL || st->tasks == NULL) {
        for (size_t i = 0; i < st->n_jobs; i++) {
            if (st->jobs[i]->status == 0 && (st->js == NULL || st->js[i].run))
                engine_job_fail(st->jobs[i], -VKS_E_INTERNAL, "out of memory splitting the scan");
        }
        free(st->tasks);
        st->tasks = NULL;
        return;
    }
    uint32_t t = 0;
    for (size_t i = 0; i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        struct jstate *js = &st->js[i];
        js->t0 = t;
        if (!js->run)
            continue;
        uint64_t lb = cpuscan_lookback(j->cat), known = SPLIT_UNKNOWN;
        for (uint32_t k = 0; k < j->n_bufs; k++) {
            const struct engine_buf *eb = &j->bufs[k];
            if (eb->status != 0 || eb->skip)
                continue;
            uint64_t blb = split_lb(e, j->cat, lb, eb->len, &known);
            uint64_t seg = seg_size(e, blb != CPUSCAN_UNSEGMENTABLE ? blb : lb, eb->len);
            enum cpuscan_groups part = CPUSCAN_ALL;
            if (blb != CPUSCAN_UNSEGMENTABLE) { /* the unbounded groups first: the longest tasks */
                uint32_t np = unbounded_pieces(e, eb->len);
                for (uint32_t p = 0; p < np; p++)
                    st->tasks[t++] = (struct ctask){.job = (uint32_t)i,
                                                    .buf = k,
                                                    .lo = eb->len * p / np,
                                                    .hi = eb->len * (p + 1) / np,
                                                    .groups = CPUSCAN_UNBOUNDED,
                                                    .piece = np > 1};
                part = CPUSCAN_BOUNDED;
            }
            if (eb->len <= seg) {
                st->tasks[t++] = (struct ctask){
                    .job = (uint32_t)i, .buf = k, .lo = 0, .hi = eb->len, .groups = part};
                continue;
            }
            for (uint64_t lo = 0; lo < eb->len; lo += seg)
                st->tasks[t++] = (struct ctask){.job = (uint32_t)i,
                                                .buf = k,
                                                .lo = lo,
                                                .hi = lo + seg < eb->len ? lo + seg : eb->len,
                                                .groups = part};
        }
        js->nt = t - js->t0;
    }
    st->n_tasks = t;
    b->tel.segments = t;
}

/* The pieces of a split buffer's unbounded groups, tasks[0..n), joined
 * into one part (cpuscan_unbounded_join) in their first task's place. */
static int join_pieces(const struct engine_job *j, struct ctask *tasks, uint32_t n,
                       struct cpuscan_scratch *scr)
{
    uint64_t *lo = malloc(n * sizeof(*lo));
    struct cpuscan_part *parts = malloc(n * sizeof(*parts));
    int rc = lo != NULL && parts != NULL ? 0 : -ENOMEM, prc = 0;
    for (uint32_t k = 0; rc == 0 && k < n; k++) {
        lo[k] = tasks[k].lo;
        parts[k] = tasks[k].part;
        prc = prc != 0 ? prc : tasks[k].rc;
    }
    const struct engine_buf *eb = &j->bufs[tasks[0].buf];
    struct cpuscan_part joined = {0};
    if (rc == 0)
        rc = scr == NULL
                 ? -ENOMEM
                 : cpuscan_unbounded_join(j->cat, eb->data, (size_t)eb->len, parts, lo, n, prc,
                                          j->mode, j->max_hits ? j->max_hits + 1 : 0, scr, &joined);
    for (uint32_t k = 0; rc == 0 && k < n; k++) {
        cpuscan_part_finish(&tasks[k].part);
        tasks[k].rc = 0;
    }
    if (rc == 0)
        tasks[0].part = joined;
    else
        cpuscan_part_finish(&joined);
    free(lo);
    free(parts);
    return rc;
}

/* Merges each CPU job's parts into its hits: per buffer in order, at most
 * max_hits over the job plus one marker per buffer with more; a split
 * buffer's unbounded pieces are joined first (on `scr`, the finishing
 * thread's scratch). */
static void cpu_finish(struct engine *e, struct engine_batch *b, struct cpuscan_scratch *scr)
{
    struct bstate *st = b->priv;
    for (size_t i = 0; st->js != NULL && st->tasks != NULL && i < st->n_jobs; i++) {
        struct engine_job *j = st->jobs[i];
        struct jstate *js = &st->js[i];
        if (!js->run || j->status != 0)
            continue;
        free(j->hits);
        j->hits = NULL;
        j->n_hits = 0;
        uint64_t budget = engine_job_budget(j), kept = 0;
        size_t cap = 0;
        struct scan_hits out = {0};
        int rc = 0;
        for (uint32_t t = js->t0; t < js->t0 + js->nt && rc == 0;) {
            uint32_t end = t, np = 0;
            while (end < js->t0 + js->nt && st->tasks[end].buf == st->tasks[t].buf)
                end++;
            while (t + np < end && st->tasks[t + np].piece)
                np++;
            if (np > 0) /* the pieces' errors are the join's to read */
                rc = join_pieces(j, &st->tasks[t], np, scr);
            for (uint32_t k = t + (np > 0); rc == 0 && k < end; k++)
                rc = st->tasks[k].rc;
            /* parts of one buffer are contiguous; merge wants an array of
             * them (the joined pieces in the first one's place) */
            uint32_t first = t + (np > 0 ? np - 1 : 0);
            struct cpuscan_part *parts = malloc((end - t) * sizeof(*parts));
            if (parts == NULL)
                rc = -ENOMEM;
            if (rc == 0 && np > 0)
                parts[0] = st->tasks[t].part;
            for (uint32_t k = first + (np > 0); rc == 0 && k < end; k++)
                parts[k - first] = st->tasks[k].part;
            out.n = 0;
            if (rc == 0)
                rc = cpuscan_merge(j->cat, j->mode, parts, end - first, budget - kept, true, &out,
                                   &j->hits_dropped);
            free(parts);
            for (size_t h = 0; rc == 0 && h < out.n; h++) {
                if (kept < budget)
                    kept++; /* past it: the marker, counted as dropped by the merge */
                rc = engine_job_push_hit(j, &cap, st->tasks[t].buf, out.v[h].rule, out.v[h].count,
                                         out.v[h].end);
            }
            t = end;
        }
        scan_hits_finish(&out);
        if (rc == -E2BIG) { /* refscan_buffer_bounded: a catalog walked whole, a hit-dense buffer */
            char msg[256];
            snprintf(msg, sizeof(msg),
                     "a buffer has more than %llu raw matches (4 x max-hits) of a catalog with "
                     "unbounded rules, whose buffers are matched whole: scan smaller buffers, or "
                     "raise max-hits",
                     (unsigned long long)refscan_raw_limit());
            engine_job_fail(j, -VKS_E_LIMIT, msg);
        } else if (rc != 0)
            engine_job_fail(
                j, -VKS_E_INTERNAL,
                "out of memory collecting hits: lower max_hits or scan smaller buffers");
    }
    (void)e;
}

/* A batch whose tasks cover at most this many bytes is small: its tasks are
 * taken before those of larger batches queued ahead of it. */
#define SMALL_BATCH (256u << 10)

static bool small_batch(const struct bstate *st)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < st->n_tasks && sum <= SMALL_BATCH; i++)
        sum += st->tasks[i].hi - st->tasks[i].lo;
    return sum <= SMALL_BATCH;
}

/* cpu_head changed (mu held): place() reads its age without mu. */
static void cpu_head_note(struct engine *e)
{
    __atomic_store_n(&e->cpu_oldest_ns, e->cpu_head != NULL ? e->cpu_head->submit_ns : 0,
                     __ATOMIC_RELAXED);
}

/* Tasks of at most this many bytes are tiny: a thread claims several at a
 * time, up to CLAIM_MAX, so a batch of 4 KiB scans costs the pool one lock
 * round per claim instead of per scan, and wakes one thread per claim (with
 * 64 clients of 4 KiB scans, batches of about 22 tasks woke all 15 threads
 * of the H200's pool, which then queued on the engine's lock for 5 us tasks:
 * futex waits were 40% of vkscand's samples, session 25). */
#define TINY_TASK (16u << 10)
#define CLAIM_MAX 4u

static bool tiny(const struct ctask *t)
{
    return t->hi - t->lo <= TINY_TASK;
}

/* How many tasks from task `i` on one claim takes: the consecutive tiny
 * ones, at most CLAIM_MAX; one task that is not tiny. */
static uint32_t claim_at(const struct bstate *st, uint32_t i)
{
    uint32_t n = 0;
    while (n < CLAIM_MAX && i + n < st->n_tasks && tiny(&st->tasks[i + n]))
        n++;
    return n > 0 ? n : 1;
}

/* The claims a prepared batch's tasks make. */
static uint32_t claims(const struct bstate *st)
{
    uint32_t c = 0;
    for (uint32_t i = 0; i < st->n_tasks; i += claim_at(st, i))
        c++;
    return c;
}

/*
 * Finds work for a pool thread (mu held): a batch to prepare or a task, in
 * queue order, except that a small batch's tasks (or a new batch, which is
 * prepared to learn its size) go before the tasks of a large batch ahead,
 * and that with two threads or more one thread never takes a large batch's
 * task: a buffer that cannot be split (an unbounded rule) is one task that
 * may run for 100 ms, and a small scan that the server let past a flood's
 * batches (its express lane) would wait for one (bench/attack_all). *large
 * says whether the task counts in cpu_large_running.
 */
static bool cpu_take(struct engine *e, struct engine_batch **bp, struct ctask **tp, uint32_t *np,
                     bool *large)
{
    uint32_t n = __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED);
    bool large_ok = n < 2 || e->cpu_large_running < n - 1;
    struct engine_batch *prev = NULL, *pick = NULL, *pick_prev = NULL;
    for (struct engine_batch *b = e->cpu_head; b != NULL; prev = b, b = b->next) {
        struct bstate *st = b->priv;
        if (b->state == B_NEW) {
            b->state = B_PREPARING;
            *bp = b;
            *tp = NULL;
            return true;
        }
        if (b->state != B_PREPARED || st->next_task >= st->n_tasks)
            continue;
        bool small = small_batch(st);
        if (small || (pick == NULL && large_ok)) {
            pick = b;
            pick_prev = prev;
            *large = !small;
            if (small)
                break;
        }
    }
    if (pick == NULL)
        return false;
    if (*large)
        e->cpu_large_running++;
    struct bstate *st = pick->priv;
    uint32_t first = st->next_task;
    uint32_t n_claim = *large ? 1 : claim_at(st, first);
    st->next_task += n_claim;
    for (uint32_t k = first; k < first + n_claim; k++) {
        struct ctask *t = &st->tasks[k];
        struct engine_job *j = st->jobs[t->job];
        /* one past max_hits: a buffer scanned as one task still has the
         * first hit past the limit, the merge's truncation marker */
        t->limit = st->js[t->job].full ? 1 : (j->max_hits ? (uint64_t)j->max_hits + 1 : 0);
    }
    if (st->next_task == st->n_tasks) { /* all handed out: off the queue */
        if (pick_prev != NULL)
            pick_prev->next = pick->next;
        else
            e->cpu_head = pick->next;
        if (e->cpu_tail == pick)
            e->cpu_tail = pick_prev;
        cpu_head_note(e);
    }
    *bp = pick;
    *tp = &st->tasks[first];
    *np = n_claim;
    return true;
}

static void cpu_unlink(struct engine *e, struct engine_batch *b)
{
    struct engine_batch *prev = NULL;
    for (struct engine_batch *x = e->cpu_head; x != NULL; prev = x, x = x->next) {
        if (x != b)
            continue;
        if (prev != NULL)
            prev->next = b->next;
        else
            e->cpu_head = b->next;
        if (e->cpu_tail == b)
            e->cpu_tail = prev;
        cpu_head_note(e);
        return;
    }
}

/* A task is done (mu held): advances its job's prefix. Returns whether the
 * batch is complete. */
static bool cpu_task_done(struct engine_batch *b, struct ctask *t)
{
    struct bstate *st = b->priv;
    struct jstate *js = &st->js[t->job];
    struct engine_job *j = st->jobs[t->job];
    t->done = true;
    __atomic_store_n(&t->published, t->part.plain, __ATOMIC_RELAXED);
    while (js->prefix < js->nt && st->tasks[js->t0 + js->prefix].done) {
        js->plain += st->tasks[js->t0 + js->prefix].part.plain;
        js->prefix++;
    }
    if (j->mode == SCAN_ALL && j->max_hits != 0 && js->plain >= j->max_hits)
        js->full = true;
    return ++st->done_tasks == st->n_tasks;
}

static void cpu_complete(struct engine *e, struct engine_batch *b, uint64_t busy,
                         struct cpuscan_scratch *scr)
{
    cpu_finish(e, b, scr);
    pthread_mutex_lock(&e->mu);
    e->cpu_busy_ns += busy;
    e->cpu_batches++;
    e->cpu_bytes += b->target == CPU_ENGINE ? b->tel.bytes : 0;
    e->cpu_retries += b->target != CPU_ENGINE;
    pthread_mutex_unlock(&e->mu);
    if (b->target == CPU_ENGINE)
        b->tel.scan_ns = engine_now_ns() - ((struct bstate *)b->priv)->start_ns - b->tel.fd_read_ns;
    engine_batch_post(e, b);
}

/* A running task asks whether the tasks before it in its job already hold
 * max_hits (cpuscan_enough_fn): each publishes a lower bound of what it
 * keeps, so the sum is one too. A task that cut itself may have published
 * more than it keeps, but only after its own predecessors held max_hits. */
struct watch {
    struct bstate *st;
    struct ctask *t;
};

static bool enough(void *ctx, uint64_t kept)
{
    struct watch *w = ctx;
    __atomic_store_n(&w->t->published, kept, __ATOMIC_RELAXED);
    const struct jstate *js = &w->st->js[w->t->job];
    const struct engine_job *j = w->st->jobs[w->t->job];
    uint64_t sum = 0;
    /* tasks before this one hold earlier hits, but for a split buffer's
     * unbounded groups (its first task), whose hits lie anywhere in it */
    for (const struct ctask *k = &w->st->tasks[js->t0]; k < w->t && sum < j->max_hits; k++)
        if (k->buf != w->t->buf || k->groups != CPUSCAN_UNBOUNDED)
            sum += __atomic_load_n(&k->published, __ATOMIC_RELAXED);
    return j->max_hits != 0 && sum >= j->max_hits;
}

/* The oldest engine_cpu_task (mu held), or NULL. */
static struct engine_task *task_take(struct engine *e)
{
    struct engine_task *t = e->task_head;
    if (t != NULL && (e->task_head = t->next) == NULL)
        e->task_tail = NULL;
    return t;
}

void engine_cpu_tasks(struct engine *e, struct engine_task *first, uint32_t n)
{
    if (first == NULL)
        return;
    struct engine_task *last = first;
    while (last->next != NULL)
        last = last->next;
    pthread_mutex_lock(&e->mu);
    if (e->task_tail != NULL)
        e->task_tail->next = first;
    else
        e->task_head = first;
    e->task_tail = last;
    __atomic_add_fetch(&e->cpu_gen, 1, __ATOMIC_RELEASE);
    /* as many threads as tasks: a broadcast for a few tasks woke all 15
     * threads of the H100 host for each handful of stream writes, and they
     * met on this mutex (docs/PERFORMANCE.md "Session 32") */
    if (e->cpu_spinning) {
        e->cpu_spinning = false; /* the spinning thread takes one; the next push signals */
        n--;
    }
    if (n >= __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED))
        pthread_cond_broadcast(&e->cpu_cond);
    else
        for (uint32_t k = 0; k < n; k++)
            pthread_cond_signal(&e->cpu_cond);
    pthread_mutex_unlock(&e->mu);
}

void engine_cpu_task(struct engine *e, struct engine_task *t)
{
    t->next = NULL;
    engine_cpu_tasks(e, t, 1);
}

/* With mu held and no work queued: unless another thread spins, watches
 * for a push for up to cpu_spin_ns with mu released, so that a request
 * arriving soon after the last one is taken without a sleeping thread's
 * wake-up (tens of microseconds on an idle core, most of a 4 KiB scan's
 * latency at one client). Returns with mu held; true when it spun (the
 * caller looks at the queues again; they may be empty still). */
static bool cpu_spin(struct engine *e)
{
    if (e->cpu_spin_ns == 0 || e->cpu_spinning)
        return false;
    e->cpu_spinning = true;
    uint64_t gen = __atomic_load_n(&e->cpu_gen, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&e->mu);
    uint64_t until = engine_now_ns() + e->cpu_spin_ns;
    for (unsigned k = 0; __atomic_load_n(&e->cpu_gen, __ATOMIC_ACQUIRE) == gen; k++) {
        if ((k & 63) == 0 && engine_now_ns() >= until)
            break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&e->mu);
    e->cpu_spinning = false;
    /* the first push while it spun signalled no one: its work is this thread's */
    if (__atomic_load_n(&e->cpu_gen, __ATOMIC_ACQUIRE) != gen)
        e->cpu_spin_hits++;
    return true;
}

void engine_cpu_main(void *arg)
{
    struct engine *e = arg;
    pthread_setname_np(pthread_self(), "vks-cpu");
    struct cpuscan_scratch *scr = NULL;
    int scr_rc = cpuscan_scratch_create(&scr);
    bool task_turn = false, spun = false;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        struct engine_batch *b;
        struct ctask *t;
        uint32_t nt = 1;
        bool large = false;
        struct engine_task *task = task_turn ? task_take(e) : NULL;
        if (task == NULL && !cpu_take(e, &b, &t, &nt, &large) && (task = task_take(e)) == NULL) {
            if (e->pool_stop && e->cpu_head == NULL)
                break;
            if (!spun && cpu_spin(e)) {
                spun = true; /* once per idle stretch, then sleep */
                continue;
            }
            pthread_cond_wait(&e->cpu_cond, &e->mu);
            spun = false;
            continue;
        }
        spun = false;
        task_turn = task == NULL; /* batch work now: a task next, if one waits */
        if (task != NULL) {
            pthread_mutex_unlock(&e->mu);
            task->run(task);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        struct bstate *st = b->priv;
        uint64_t t0 = engine_now_ns();
        if (t == NULL) {
            if (b->target == CPU_ENGINE) {
                b->tel.idle_ns = 0;
                b->tel.gpu = false;
            }
            cpu_prepare(e, b);
            pthread_mutex_lock(&e->mu);
            b->state = B_PREPARED;
            bool empty = st->n_tasks == 0;
            if (empty)
                cpu_unlink(e, b);
            /* other threads for the claims past the first: this one takes
             * work again right after (a 4 KiB scan woke every thread twice,
             * for nothing, session 17), an engine task first if one waits
             * (task_turn), so then one more thread for the batch's task; a
             * spinning thread sees the generation move and takes a claim */
            uint32_t wake = claims(st) - (e->task_head == NULL && st->n_tasks > 0);
            if (wake > 0)
                __atomic_add_fetch(&e->cpu_gen, 1, __ATOMIC_RELEASE);
            if (wake >= __atomic_load_n(&e->n_cpu, __ATOMIC_RELAXED))
                pthread_cond_broadcast(&e->cpu_cond);
            else
                for (uint32_t k = 0; k < wake; k++)
                    pthread_cond_signal(&e->cpu_cond);
            pthread_mutex_unlock(&e->mu);
            if (empty)
                cpu_complete(e, b, engine_now_ns() - t0, scr);
            pthread_mutex_lock(&e->mu);
            if (!empty)
                e->cpu_busy_ns += engine_now_ns() - t0;
            continue;
        }
        for (uint32_t k = 0; k < nt; k++) {
            struct ctask *tk = t + k;
            struct engine_job *j = st->jobs[tk->job];
            const struct engine_buf *eb = &j->bufs[tk->buf];
            struct watch wt = {st, tk};
            if (scr_rc != 0)
                tk->rc = scr_rc;
            else if (tk->piece)
                tk->rc = cpuscan_unbounded_piece(j->cat, eb->data, (size_t)eb->len, tk->lo, tk->hi,
                                                 CPUSCAN_PIECE_LOOKBACK, piece_raw(e, eb->len), scr,
                                                 &tk->part);
            else
                tk->rc =
                    cpuscan_segment_groups(j->cat, tk->groups, eb->data, (size_t)eb->len, tk->lo,
                                           tk->hi, j->mode, tk->limit, enough, &wt, scr, &tk->part);
        }
        uint64_t busy = engine_now_ns() - t0;
        pthread_mutex_lock(&e->mu);
        if (large) {
            e->cpu_large_running--;
            pthread_cond_broadcast(&e->cpu_cond); /* a held-back large task may go */
        }
        bool last = false;
        for (uint32_t k = 0; k < nt; k++)
            last = cpu_task_done(b, t + k);
        if (!last)
            e->cpu_busy_ns += busy;
        pthread_mutex_unlock(&e->mu);
        if (last)
            cpu_complete(e, b, busy, scr);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    cpuscan_scratch_destroy(scr);
}

/* Queues a batch for the CPU pool: placed there, or given back by a GPU
 * engine with jobs to re-run. */
void engine_cpu_push(struct engine *e, struct engine_batch *b)
{
    uint64_t now = engine_now_ns();
    pthread_mutex_lock(&e->mu);
    b->state = B_NEW;
    b->next = NULL;
    b->submit_ns = now; /* the CPU queue wait counts from here (also for GPU re-runs) */
    if (e->cpu_tail != NULL)
        e->cpu_tail->next = b;
    else
        e->cpu_head = b;
    e->cpu_tail = b;
    cpu_head_note(e);
    __atomic_add_fetch(&e->cpu_gen, 1, __ATOMIC_RELEASE);
    if (e->cpu_spinning)
        e->cpu_spinning = false; /* the spinning thread prepares it; the next push signals */
    else
        pthread_cond_signal(&e->cpu_cond); /* any thread prepares a new batch */
    pthread_mutex_unlock(&e->mu);
}
