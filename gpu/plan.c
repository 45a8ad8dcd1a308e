/*
 * Batch planning: the launch policy (workgroup size, segment size, worker
 * cap, loop budget) with its plan cache, the haystack layout, the work items
 * (segments of bounded groups, chained rounds of unbounded ones) and each
 * dispatch's pipeline shape. docs/gpu.md describes the layout.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "lit.h"

#define ALIGN16(x) (((x) + 15u) & ~(uint64_t)15u)

static uint32_t log2_u64(uint64_t v)
{
    uint32_t r = 0;
    while (v >>= 1)
        r++;
    return r;
}

static uint64_t catalogs_hash(const struct gpu_batch *b)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        const uint8_t *fp = catalog_fingerprint(b->catalogs[c]);
        for (uint32_t k = 0; k < 8; k++)
            h = (h ^ fp[k]) * 1099511628211ull;
    }
    return h;
}

/* The literal kernel's smallest automatic segment. Each segment costs the
 * host about 5 ns to plan (an item of 16 bytes) and a thread its walk: at
 * 256 bytes a 64 MB batch planned 262,144 items in 1.27 ms to save 0.37 ms
 * of kernel (H100 host, docs/PERFORMANCE.md "Session 32"); 512 halves the
 * items for the walk of 527 bytes instead of 271. */
#define LIT_SEG_MIN 512u

/* The launch policy: workgroup size, segment size, worker cap and loop
 * budget from the device's limits and the batch's size. */
static void make_plan(const struct gpu_engine *eng, uint64_t total, struct launch_plan *p)
{
    const struct gpu_device_info *d = &eng->info;
    bool cpu = d->type == GPU_DEVICE_CPU;
    uint32_t smem = (d->max_shared_bytes - 256 * 4 - 256) / 4;
    p->smem_cap = smem & ~1023u;
    if (p->smem_cap < 1024)
        p->smem_cap = smem;
    p->wg = eng->opt.workgroup_size;
    if (p->wg == 0)
        p->wg = cpu ? 64 : 1024;
    if (p->wg > d->max_workgroup_size)
        p->wg = d->max_workgroup_size;
    /* Threads the device keeps busy at once. A 1024-wide workgroup caps the
     * kernel at 64 registers, one such workgroup per multiprocessor (H200:
     * measured best, docs/PERFORMANCE.md). */
    uint64_t resident = cpu ? 1024 : 65536;
    if (d->sm_count)
        resident = (uint64_t)d->sm_count * p->wg;
    uint64_t seg = 32768;
    while (seg > 2048 && seg * resident > total)
        seg /= 2;
    p->seg_bytes = eng->opt.segment_bytes ? eng->opt.segment_bytes : (uint32_t)seg;
    /* The literal kernel walks a segment's bytes plus its longest string's
     * (no DFA lookback), so on a GPU its segments shrink further for small
     * batches, to LIT_SEG_MIN, until every multiprocessor has a workgroup:
     * a 12 MB batch of flow writes ran as 6 workgroups of 2 KiB segments,
     * 0.53 ms of kernel whatever its size (H100 host, docs/PERFORMANCE.md
     * "Session 32"). plan_lit keeps a segment at least 8 strings long. */
    uint64_t lseg = seg;
    while (!cpu && lseg > LIT_SEG_MIN && lseg * resident > total)
        lseg /= 2;
    p->lit_seg_bytes = eng->opt.segment_bytes ? eng->opt.segment_bytes : (uint32_t)lseg;
    p->step_budget = d->loop_budget == 0xffffffffu ? NO_BUDGET : d->loop_budget - 4096;
    if (eng->opt.chain_bytes)
        p->chain_bytes = eng->opt.chain_bytes;
    else
        p->chain_bytes = p->step_budget == NO_BUDGET ? 0xfffffff0u : 512u * 1024u;
    p->max_workgroups = cpu ? 0xffffffffu : (uint32_t)((resident + p->wg - 1) / p->wg);
    if (eng->opt.max_workgroups)
        p->max_workgroups = eng->opt.max_workgroups;
}

static void get_plan(struct gpu_engine *eng, const struct gpu_batch *b, uint64_t total,
                     uint64_t max_len, struct batch_ctx *bc)
{
    struct plan_key key = {
        .catalogs = catalogs_hash(b),
        .n_buffers = b->n_buffers,
        .size_log2 = log2_u64(total),
        .max_len_log2 = log2_u64(max_len),
    };
    eng->tick++;
    struct plan_entry *slot = &eng->plans[0];
    for (uint32_t i = 0; i < PLAN_CACHE; i++) {
        struct plan_entry *e = &eng->plans[i];
        if (e->used && memcmp(&e->key, &key, sizeof(key)) == 0) {
            e->last_use = eng->tick;
            bc->plan = e->plan;
            bc->tel->plan_cache_hit = true;
            return;
        }
        if (!e->used || e->last_use < slot->last_use)
            slot = e;
    }
    make_plan(eng, total, &bc->plan);
    *slot = (struct plan_entry){.key = key, .plan = bc->plan, .last_use = eng->tick, .used = true};
}

int gpu_grow_array(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (q == NULL)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

static int push_item(struct batch_scratch *s, size_t *n, uint32_t buf, uint32_t lo, uint32_t hi,
                     uint32_t chain)
{
    if (gpu_grow_array((void **)&s->meta, &s->meta_cap, *n + 1, 16) < 0)
        return -ENOMEM;
    uint32_t *w = &s->meta[*n * 4];
    w[0] = buf;
    w[1] = lo;
    w[2] = hi;
    w[3] = chain;
    (*n)++;
    return 0;
}

static bool group_bounded(const struct batch_ctx *bc, uint32_t c, const struct catalog_group *g)
{
    if (g->maxlen == CATALOG_UNBOUNDED || g->maxlen == 0)
        return false;
    if (bc->plan.step_budget == NO_BUDGET)
        return true;
    return (uint64_t)bc->seg[c] + g->maxlen - 1 <= bc->chain[c];
}

/* Whether DFA group k of catalog c is left to the literal kernel. */
static bool lit_routed(const struct batch_ctx *bc, uint32_t c, uint32_t k)
{
    return bc->lit_route[c] && k < bc->lit[c]->n_dfa && bc->lit[c]->route[k];
}

static int add_range(struct batch_ctx *bc, uint32_t c, uint32_t g, uint32_t round, uint32_t items,
                     uint32_t n, uint32_t carry, uint32_t max_cost)
{
    struct batch_scratch *s = &bc->eng->scratch;
    if (n == 0)
        return 0;
    if (gpu_grow_array((void **)&s->ranges, &s->ranges_cap, bc->n_ranges + 1, sizeof(*s->ranges)) <
        0)
        return -ENOMEM;
    s->ranges[bc->n_ranges++] = (struct scan_range){
        .cat = c,
        .group = g,
        .round = round,
        .items = items,
        .n_items = n,
        .carry_base = carry,
        .spec_base = NO_CARRY,
        .max_cost = max_cost,
        .cap = NO_CARRY,
    };
    bc->items_total += n;
    if (round + 1 > bc->rounds)
        bc->rounds = round + 1;
    return 0;
}

/* Loop iterations the kernel may run for an item of `walk` bytes of
 * catalog c: 16 bytes per iteration, up to 4 x 15 unaligned ends (the
 * lookback and the item are two walks), and the accept loops of a match
 * at every position. */
static uint32_t walk_cost(const struct batch_ctx *bc, uint32_t c, uint64_t walk)
{
    uint64_t cost = (walk + 15) / 16 + 64 + (walk + 1) * bc->acc_iters[c];
    return cost > 0xfffffff0u ? 0xfffffff0u : (uint32_t)cost;
}

/* The same for an item of a fused range (shaders/scan.comp f_walk): an
 * iteration per 4 bytes, up to 2 x 3 unaligned ends. */
static uint32_t fused_cost(const struct batch_ctx *bc, uint32_t c, uint64_t walk)
{
    uint64_t cost = (walk + 3) / 4 + 64 + (walk + 1) * bc->acc_iters[c];
    return cost > 0xfffffff0u ? 0xfffffff0u : (uint32_t)cost;
}

/* Worst accept-loop iterations per byte of catalog c: the most accept
 * entries of any state, twice with the subgroup writer (count, then
 * write, shaders/scan.comp flush). */
static uint32_t accept_iters(const struct gpu_engine *eng, const struct catalog *cat)
{
    uint32_t most = 0;
    struct catalog_group g;
    for (uint32_t k = 0; k < catalog_group_count(cat); k++) {
        catalog_group(cat, k, &g);
        for (uint32_t a = 0; a + g.first_accept < g.n_states; a++) {
            uint32_t n = g.accept_index[a + 1] - g.accept_index[a];
            if (n > most)
                most = n;
        }
    }
    /* The subgroup writer loops over its queued steps twice (count, then
     * write) and over each one's entries. A subgroup flushes together
     * when some lane has more than 8 queued, at most once per 9 bytes (a
     * lane queues one step a byte), up to 24 steps: the loops of one
     * flush run as long as its fullest lane's (lavapipe counts one SIMD
     * group's iterations), under 6 x (entries + 1) a byte. */
    if (eng->writer == GPU_HITS_SUBGROUP)
        return most ? 6 * most + 6 : 0;
    return most;
}

/* Whether DFA group k of catalog c may be stepped in a fused pass with
 * others (when bounded): it reports, it is not the literal kernel's, and
 * its states fit the fused kernel's u16 rows. */
static bool fusable(const struct batch_ctx *bc, uint32_t c, uint32_t k,
                    const struct catalog_group *g)
{
    return !(g->flags & CAT_GF_FACTOR) && !lit_routed(bc, c, k) && g->n_states <= 65536 &&
           g->maxlen != CATALOG_UNBOUNDED && g->maxlen != 0;
}

/* Most groups the fused ranges of catalog c step together: n fusable
 * groups in ceil(n / F) ranges of near-equal size (F: fuse_groups), or 1
 * when fusion is off or has fewer than two groups to fuse. */
static uint32_t fuse_width(const struct batch_ctx *bc, uint32_t c)
{
    uint32_t f = bc->eng->opt.fuse_groups;
    if (f == 0 || f > GPU_FUSE_MAX)
        f = GPU_FUSE_MAX;
    if (f < 2)
        return 1;
    uint32_t n = 0;
    struct catalog_group g;
    for (uint32_t k = 0; k < catalog_group_count(bc->batch->catalogs[c]); k++) {
        catalog_group(bc->batch->catalogs[c], k, &g);
        n += fusable(bc, c, k, &g);
    }
    if (n < 2)
        return 1;
    uint32_t ranges = (n + f - 1) / f;
    return (n + ranges - 1) / ranges;
}

/* Fits catalog c's segments and chained walks to the device's loop budget
 * (lavapipe); elsewhere they are the plan's. `fuse`: most groups a range
 * of the catalog steps together (each may report at every byte). */
static void fit_budget(struct batch_ctx *bc, uint32_t c, uint32_t max_bounded, uint32_t fuse)
{
    const struct launch_plan *p = &bc->plan;
    bc->seg[c] = p->seg_bytes;
    bc->chain[c] = p->chain_bytes;
    bc->acc_iters[c] = 0;
    if (p->step_budget == NO_BUDGET)
        return;
    bc->acc_iters[c] = accept_iters(bc->eng, bc->batch->catalogs[c]) * fuse;
    uint64_t fill = (256 * fuse + p->smem_cap) / p->wg + 8 + fuse;
    /* 96: walk_cost's 64 for unaligned ends and room for rounding */
    uint64_t usable = (p->step_budget - fill - 96 - bc->acc_iters[c]) >> bc->eng->cut_shift;
    /* loop iterations per 16 bytes: 1 (a group's walk), 4 (fused, fused_cost) */
    uint64_t bytes = usable * 16 / (16 * (uint64_t)bc->acc_iters[c] + (fuse > 1 ? 4 : 1));
    bytes &= ~(uint64_t)15;
    /* a few bytes at least: with the budget halved by repeated cut loops
     * (cut_shift) this reached 0, and chained rounds of 0 bytes divided by
     * zero (found with an experimental plan that under-counted its loops);
     * a walk still too long is cut again, down to the -EIO the re-runs end in */
    if (bytes < 16)
        bytes = 16;
    if (bytes < bc->chain[c])
        bc->chain[c] = (uint32_t)bytes;
    if (max_bounded > 0 && bc->seg[c] + (uint64_t)max_bounded - 1 > bytes)
        bc->seg[c] = bytes > max_bounded + 16u ? (uint32_t)(bytes - max_bounded + 1) : 16u;
}

/* Fusable groups of one catalog that plan_bounded collects; any past them
 * get ranges of their own. */
#define FUSE_COLLECT 256u

/* Shared-memory words of a group's transition rows (u16 entries, two a
 * word; all fused groups have u16 states). */
static uint32_t group_row_words(const struct catalog_group *g)
{
    uint64_t words = ((uint64_t)g->n_states * g->n_classes + 1) / 2;
    return words > 0xffffffffu ? 0xffffffffu : (uint32_t)words;
}

/*
 * Splits the shared transition words `cap` between n groups wanting
 * want[i] words each: the smallest wants are met first, the rest shares
 * what is left evenly (each group's first rows are its hottest). Writes
 * each share to got[i] and returns their sum.
 */
static uint32_t smem_shares(const uint32_t *want, uint32_t *got, uint32_t n, uint32_t cap)
{
    bool done[GPU_FUSE_MAX] = {false};
    uint32_t left = cap, total = 0;
    for (uint32_t round = 0; round < n; round++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < n; i++) {
            if (!done[i] && (best == UINT32_MAX || want[i] < want[best]))
                best = i;
        }
        uint32_t share = left / (n - round);
        got[best] = want[best] < share ? want[best] : share;
        done[best] = true;
        left -= got[best];
        total += got[best];
    }
    return total;
}

/*
 * Ranges of catalog c's fusable bounded groups fused[0..n) over the items
 * [first, first + n_items): up to fuse_width groups a range, each with its
 * group table in meta (GPU_FUSE_WORDS uvec4 per group, shaders/scan.comp
 * G_*): (n_classes, acc_row, first_accept, layer), (classmap, trans,
 * accidx, accepts), (trans_words, first s_tr word, s_tr words, 0), the
 * four start states. A lone group keeps a range of its own.
 */
static int fuse_ranges(struct batch_ctx *bc, uint32_t c, const uint32_t *fused, uint32_t n,
                       uint32_t first, uint32_t n_items, uint64_t walk)
{
    uint32_t cost = walk_cost(bc, c, walk);
    const struct catalog *cat = bc->batch->catalogs[c];
    struct batch_scratch *s = &bc->eng->scratch;
    size_t words;
    const uint32_t *base = catalog_words(cat, &words);
    uint32_t width = fuse_width(bc, c);
    uint32_t ranges = n ? (n + width - 1) / width : 0;
    for (uint32_t r = 0, at = 0; r < ranges; r++) {
        uint32_t m = (n - at + (ranges - r) - 1) / (ranges - r); /* near-equal sizes */
        if (m == 1) {
            if (add_range(bc, c, fused[at], 0, first, n_items, NO_CARRY, cost) < 0)
                return -ENOMEM;
            at++;
            continue;
        }
        struct catalog_group g[GPU_FUSE_MAX];
        uint32_t want[GPU_FUSE_MAX], got[GPU_FUSE_MAX], maxlen = 0;
        for (uint32_t i = 0; i < m; i++) {
            catalog_group(cat, fused[at + i], &g[i]);
            want[i] = group_row_words(&g[i]);
            if (g[i].maxlen > maxlen)
                maxlen = g[i].maxlen;
        }
        /* the class maps take 256 words a group; make_plan's cap has one */
        uint32_t cap =
            bc->plan.smem_cap > 256 * (m - 1) + 1024 ? bc->plan.smem_cap - 256 * (m - 1) : 1024;
        uint32_t total = smem_shares(want, got, m, cap);
        uint32_t smem = (total + 1023u) & ~1023u; /* few pipeline shapes */
        uint32_t gtab = (uint32_t)bc->n_meta;
        for (uint32_t i = 0, soff = 0; i < m; i++) {
            const struct catalog_group *q = &g[i];
            uint32_t w[4][4] = {
                {q->n_classes, q->first_accept * q->n_classes, q->first_accept, fused[at + i]},
                {(uint32_t)(q->classmap - base), (uint32_t)(q->trans - base),
                 (uint32_t)(q->accept_index - base), (uint32_t)(q->accepts - base)},
                {q->n_states * q->n_classes, soff, got[i], 0},
                {q->start[0], q->start[1], q->start[2], q->start[3]},
            };
            soff += got[i];
            for (uint32_t j = 0; j < GPU_FUSE_WORDS; j++) {
                if (push_item(s, &bc->n_meta, w[j][0], w[j][1], w[j][2], w[j][3]) < 0)
                    return -ENOMEM;
            }
        }
        if (add_range(bc, c, fused[at], 0, first, n_items, NO_CARRY, fused_cost(bc, c, walk)) < 0)
            return -ENOMEM;
        struct scan_range *sr = &s->ranges[bc->n_ranges - 1];
        sr->fuse = m;
        sr->gtab = gtab;
        sr->look = maxlen;
        sr->smem_words = smem < cap ? smem : total;
        bc->tel->fused_groups += m - 1;
        at += m;
    }
    return 0;
}

/* Bounded groups of catalog c share one segment list: segments own end
 * offsets (s, t]; the kernel starts each maxlen-1 bytes early. Fusable
 * ones are stepped several to a pass over it (fuse_ranges). */
static int plan_bounded(struct batch_ctx *bc, uint32_t c, uint32_t max_bounded)
{
    const struct gpu_batch *b = bc->batch;
    struct batch_scratch *s = &bc->eng->scratch;
    uint32_t seg = bc->seg[c];
    uint32_t first = (uint32_t)bc->n_meta;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        if (b->buffers[i].catalog != c)
            continue;
        uint64_t len = b->buffers[i].len;
        for (uint64_t lo = 0; lo < len; lo += seg) {
            uint64_t hi = lo + seg < len ? lo + seg : len;
            if (push_item(s, &bc->n_meta, i, (uint32_t)lo, (uint32_t)hi, 0) < 0)
                return -ENOMEM;
        }
    }
    uint32_t n = (uint32_t)bc->n_meta - first;
    uint32_t cost = walk_cost(bc, c, (uint64_t)seg + max_bounded);
    uint32_t fused[FUSE_COLLECT], n_fused = 0;
    bool fuse = fuse_width(bc, c) > 1;
    struct catalog_group g;
    for (uint32_t k = 0; k < catalog_group_count(b->catalogs[c]); k++) {
        catalog_group(b->catalogs[c], k, &g);
        if ((g.flags & CAT_GF_FACTOR) || lit_routed(bc, c, k)) /* factor: reports nothing */
            continue;
        if (!group_bounded(bc, c, &g))
            continue;
        if (fuse && fusable(bc, c, k, &g) && n_fused < FUSE_COLLECT) {
            fused[n_fused++] = k;
            continue;
        }
        if (add_range(bc, c, k, 0, first, n, NO_CARRY, cost) < 0)
            return -ENOMEM;
    }
    return fuse_ranges(bc, c, fused, n_fused, first, n, (uint64_t)seg + max_bounded);
}

/* Whether DFA group k of catalog c is walked as an unbounded one. */
static bool group_unbounded(const struct batch_ctx *bc, uint32_t c, uint32_t k,
                            const struct catalog_group *g)
{
    return !group_bounded(bc, c, g) && !(g->flags & CAT_GF_FACTOR) && !lit_routed(bc, c, k);
}

/* Speculative segments of unbounded DFA groups (docs/gpu.md, "Unbounded
 * groups in parallel"): at least this many end offsets each, so that the
 * lookback costs a few percent. */
#define SPEC_SEGMENT (16u * 1024u)

/*
 * Unbounded DFA groups of catalog c in segments, whatever the buffers'
 * lengths: segment (lo, hi] is walked from `lookback` bytes before lo
 * from a start state, as a bounded group's is, and records its states at
 * lo and hi (qs words from spec_base). For most data the walk forgets the
 * unknown past within the lookback and the guess at lo is the true state;
 * the host checks every guess against where the segment before ended and
 * re-walks the rare wrong ones (gpu/batch.c). So no item walks more than
 * a segment and its lookback, however long the buffer. Returns 0,
 * -ENOMEM, or 1 when speculation is off or the device's loop budget
 * leaves it no room (the caller walks in chained rounds instead).
 */
static int plan_spec(struct batch_ctx *bc, uint32_t c)
{
    const struct gpu_engine *eng = bc->eng;
    const struct gpu_batch *b = bc->batch;
    if (eng->opt.spec_lookback == UINT32_MAX)
        return 1;
    uint64_t look = eng->opt.spec_lookback ? eng->opt.spec_lookback : GPU_SPEC_LOOKBACK;
    uint64_t chain = bc->chain[c];
    if (look > chain / 4)
        look = (chain / 4) & ~(uint64_t)15;
    uint64_t seg = eng->opt.segment_bytes ? eng->opt.segment_bytes : bc->plan.seg_bytes;
    if (!eng->opt.segment_bytes && seg < SPEC_SEGMENT)
        seg = SPEC_SEGMENT;
    if (seg + look > chain)
        seg = (chain - look) & ~(uint64_t)15;
    if (seg < 16)
        return 1;
    struct batch_scratch *s = &bc->eng->scratch;
    uint32_t first = (uint32_t)bc->n_meta;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        uint64_t len = b->buffers[i].len;
        if (b->buffers[i].catalog != c)
            continue;
        for (uint64_t lo = 0; lo < len; lo += seg) {
            uint64_t hi = lo + seg < len ? lo + seg : len;
            if (push_item(s, &bc->n_meta, i, (uint32_t)lo, (uint32_t)hi, 0) < 0)
                return -ENOMEM;
        }
    }
    uint32_t n = (uint32_t)bc->n_meta - first;
    uint32_t cost = walk_cost(bc, c, seg + look);
    struct catalog_group g;
    for (uint32_t k = 0; k < catalog_group_count(b->catalogs[c]); k++) {
        catalog_group(b->catalogs[c], k, &g);
        if (!group_unbounded(bc, c, k, &g) || n == 0)
            continue;
        if (add_range(bc, c, k, 0, first, n, NO_CARRY, cost) < 0)
            return -ENOMEM;
        s->ranges[bc->n_ranges - 1].spec_base = bc->n_spec;
        s->ranges[bc->n_ranges - 1].look = (uint32_t)look;
        bc->n_spec += 2 * n;
        bc->tel->spec_items += n;
    }
    return 0;
}

/* Unbounded groups walk each buffer from its start; a walk longer than
 * chain_bytes is cut into rounds that hand the DFA state over in carry[]. */
static int plan_chained(struct batch_ctx *bc, uint32_t c, uint64_t longest)
{
    const struct gpu_batch *b = bc->batch;
    struct batch_scratch *s = &bc->eng->scratch;
    uint64_t chain = bc->chain[c];
    uint32_t rounds = (uint32_t)((longest + chain - 1) / chain);
    uint32_t cost = walk_cost(bc, c, chain);
    struct catalog_group g;
    uint32_t n_groups = catalog_group_count(b->catalogs[c]);
    for (uint32_t r = 0; r < rounds; r++) {
        uint32_t first = (uint32_t)bc->n_meta;
        for (uint32_t i = 0; i < b->n_buffers; i++) {
            uint64_t len = b->buffers[i].len, lo = r * chain;
            if (b->buffers[i].catalog != c || lo >= len)
                continue;
            uint64_t hi = lo + chain < len ? lo + chain : len;
            if (push_item(s, &bc->n_meta, i, (uint32_t)lo, (uint32_t)hi, i) < 0)
                return -ENOMEM;
        }
        uint32_t n = (uint32_t)bc->n_meta - first, ug = 0;
        for (uint32_t k = 0; k < n_groups; k++) {
            catalog_group(b->catalogs[c], k, &g);
            if (!group_unbounded(bc, c, k, &g))
                continue;
            uint32_t carry = (bc->n_carry / b->n_buffers + ug++) * b->n_buffers;
            if (add_range(bc, c, k, r, first, n, carry, cost) < 0)
                return -ENOMEM;
        }
    }
    return 0;
}

/* Loop iterations of scan_nfa.comp per range list: one per range plus one
 * per word each range spans. */
static uint64_t ranges_cost(const struct catalog_nfa *g, uint32_t first, uint32_t n)
{
    uint64_t t = 0;
    for (uint32_t r = first; r < first + n; r++)
        t += 1 + (g->ranges[2 * r + 1] >> 5) - (g->ranges[2 * r] >> 5) + 1;
    return t;
}

/* Loop iterations of scan_nfa.comp per byte, worst case: the walk, the
 * clear, shift and reach loops over every word, every exception and every
 * accept entry tested. */
static uint64_t nfa_byte_cost(const struct catalog_nfa *g)
{
    /* 20: the two passes over exceptions and the binary search for the
     * first narrow one near the live words (log2 of up to 65536 entries) */
    uint64_t t = 1 + 3 * (uint64_t)g->n_words + g->n_exc + g->n_acc + 20;
    for (uint32_t x = 0; x < g->n_exc; x++) {
        const uint32_t *e = g->exc + (size_t)x * CAT_X_WORDS;
        t += ranges_cost(g, e[CAT_X_FIRST], e[CAT_X_NSRC] + e[CAT_X_NTGT]);
    }
    for (uint32_t a = 0; a < g->n_acc; a++) {
        const uint32_t *e = g->acc + (size_t)a * CAT_X_WORDS;
        t += ranges_cost(g, e[CAT_A_FIRST], e[CAT_A_NSRC]);
    }
    return t;
}

static uint32_t nfa_item_cost(const struct catalog_nfa *g, uint64_t walk)
{
    uint64_t cost = (walk + 1) * nfa_byte_cost(g) + 5 * (uint64_t)g->n_words + 64;
    return cost > 0xfffffff0u ? 0xfffffff0u : (uint32_t)cost;
}

/* Pushes one item per `step` bytes of every buffer of catalog c from byte
 * `from` on (chained rounds: one round's slice, carry slot = buffer). */
static int nfa_items(struct batch_ctx *bc, uint32_t c, uint64_t from, uint64_t step, bool chained)
{
    const struct gpu_batch *b = bc->batch;
    struct batch_scratch *s = &bc->eng->scratch;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        uint64_t len = b->buffers[i].len;
        if (b->buffers[i].catalog != c)
            continue;
        for (uint64_t lo = from; lo < len; lo += step) {
            uint64_t hi = lo + step < len ? lo + step : len;
            if (push_item(s, &bc->n_meta, i, (uint32_t)lo, (uint32_t)hi, chained ? i : 0) < 0)
                return -ENOMEM;
            if (chained)
                break;
        }
    }
    return 0;
}

/* The factor ends of every buffer of catalog c (gates[i] for buffer i),
 * found on the host by refscan_factor_ends: one walk of the factor group
 * serves every gated group of the catalog. */
struct plan_gates {
    struct refscan_gate *v; /* n_buffers entries, empty for other catalogs */
    /* a bit per (buffer, bit-NFA group) with a factor end, has_words a
     * buffer (NULL: not built, every pair is searched): a batch of 16,384
     * buffers and 176 gated groups (gitleaks-regex as 64 KiB buffers) has
     * 2.9 M pairs, nearly all without an end, each tested by a bit
     * instead of two binary searches */
    uint64_t *has;
    uint32_t has_words;
    /* per buffer read at upload, per entry of v[i]: the run start of its
     * end found ahead (plan_runs) for the groups runs_wanted; NULL: none */
    uint64_t **runs;
};

/* Builds pg->has for the buffers of catalog c (n_nfa bit-NFA groups);
 * left NULL when the batch has few buffers or no memory. */
static void gates_index(struct plan_gates *pg, const struct gpu_batch *b, uint32_t c,
                        uint32_t n_nfa)
{
    if (pg->v == NULL || b->n_buffers < 32 || n_nfa == 0)
        return;
    uint32_t w = (n_nfa + 63) / 64;
    uint64_t *has = calloc((size_t)b->n_buffers * w, sizeof(*has));
    if (has == NULL)
        return;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        if (b->buffers[i].catalog != c)
            continue;
        const struct refscan_gate *gate = &pg->v[i];
        uint64_t *h = has + (size_t)i * w;
        for (size_t m = 0; m < gate->n; m++)
            if (gate->v[m].nfa < n_nfa)
                h[gate->v[m].nfa >> 6] |= 1ull << (gate->v[m].nfa & 63);
    }
    pg->has = has;
    pg->has_words = w;
}

/* Whether buffer i may hold a factor end of group k. */
static bool gates_has(const struct plan_gates *pg, uint32_t i, uint32_t k)
{
    return pg->has == NULL || (pg->has[(size_t)i * pg->has_words + (k >> 6)] >> (k & 63)) & 1;
}

/* Where item generators put their items: the batch's meta (the engine's
 * scratch and bc->n_meta), or a group's own list while groups are planned
 * on the upload threads (plan_pre). */
struct item_sink {
    struct batch_scratch *s;
    size_t *n;
};

struct window_job {
    struct item_sink out;
    uint32_t buf;
    uint64_t seg;
};

/* One merged window of end offsets (lo, hi]: items of at most `seg` ends,
 * each starting maxlen-1 bytes early in the kernel, as segments do. */
static int window_items(void *ctx, uint64_t lo, uint64_t hi)
{
    struct window_job *j = ctx;
    for (uint64_t x = lo; x < hi; x += j->seg) {
        uint64_t y = x + j->seg < hi ? x + j->seg : hi;
        if (push_item(j->out.s, j->out.n, j->buf, (uint32_t)x, (uint32_t)y, 0) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* The first of a buffer's factor ends (sorted by group, then end) from
 * index a on whose group is k or later: a catalog may have hundreds of
 * gated groups. */
static size_t gate_lower_from(const struct refscan_gate *gate, size_t a, uint32_t k)
{
    size_t z = gate->n;
    while (a < z) {
        size_t m = a + (z - a) / 2;
        if (gate->v[m].nfa < k)
            a = m + 1;
        else
            z = m;
    }
    return a;
}

static size_t gate_lower(const struct refscan_gate *gate, uint32_t k)
{
    return gate_lower_from(gate, 0, k);
}

/* The first of gate->v[a..z) (one group's ends, ascending) that ends at
 * or after `end`. */
static size_t gate_end_lower(const struct refscan_gate *gate, size_t a, size_t z, uint64_t end)
{
    while (a < z) {
        size_t m = a + (z - a) / 2;
        if (gate->v[m].end < end)
            a = m + 1;
        else
            z = m;
    }
    return a;
}

/* Which bytes of the buffers an item generator plans: every buffer in
 * [lo, hi) whole, or, with `cut`, buffer lo alone and in it the match
 * ends in (blo, bhi] (windows) or the factor ends in [blo, bhi)
 * (confirmation pieces): plan_pre's parts of one large buffer. */
struct plan_part {
    uint32_t lo, hi;
    bool cut;
    uint64_t blo, bhi;
};

/* Items of gated bit-NFA group k only around its factors' ends. */
static int gated_items(const struct batch_ctx *bc, uint32_t c, uint32_t k,
                       const struct catalog_nfa *g, uint64_t seg, const struct plan_gates *pg,
                       struct plan_part part, struct item_sink out)
{
    const struct gpu_batch *b = bc->batch;
    for (uint32_t i = part.lo; i < part.hi; i++) {
        if (b->buffers[i].catalog != c || !gates_has(pg, i, k))
            continue;
        const struct refscan_gate *gate = &pg->v[i];
        size_t a = gate_lower(gate, k), z = gate_lower(gate, k + 1);
        uint64_t wlo = 0, whi = b->buffers[i].len;
        if (part.cut) { /* the ends whose window [e - 1, e + maxlen] meets (blo, bhi] */
            wlo = part.blo;
            whi = part.bhi < whi ? part.bhi : whi;
            a = gate_end_lower(gate, a, z, wlo > g->maxlen ? wlo - g->maxlen : 0);
            z = gate_end_lower(gate, a, z, whi + 1);
        }
        if (z == a)
            continue;
        struct window_job j = {out, i, seg};
        int rc = refscan_gate_windows(g->maxlen, &gate->v[a].end, z - a,
                                      sizeof(struct refscan_cand) / sizeof(uint64_t),
                                      b->buffers[i].len, wlo, whi, window_items, &j);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Forward confirmation items (refscan_confirm_items): start intervals less
 * than CONFIRM_GAP bytes apart are walked as one item (a new item costs
 * about as much as walking the gap), long ones are cut into pieces of at
 * most a segment of starts, and a buffer gets at most one item per
 * CONFIRM_SPAN bytes (at least CONFIRM_MIN): past that gap and piece grow.
 * Allowing more starts than the factors ask for only costs work (every
 * match found is a match), but each item walks until its state dies,
 * which for a rule like `key(?s).*x` is the buffer's end: the cap bounds
 * such a buffer's work to its item count times its length. Text with
 * common factors (gitleaks-regex: caseless `key`, `token`, `pass`) gets
 * many short items instead of one walk over most of the buffer. */
#define CONFIRM_GAP  64u
#define CONFIRM_SPAN 256u
#define CONFIRM_MIN  16u

struct confirm_job {
    struct item_sink out;
    uint32_t buf;
};

static int confirm_piece(void *ctx, uint64_t a, uint64_t b)
{
    struct confirm_job *j = ctx;
    return push_item(j->out.s, j->out.n, j->buf, (uint32_t)a, (uint32_t)b, 0);
}

/* How far past its starts a confirmation item walks before it leaves a
 * live walk to the host (gpu/batch.c confirm_finish): GPU_CONFIRM_CAP, or
 * the option; NO_CARRY (no cap) when a whole buffer fits an item's loop
 * budget, as before; else what the budget leaves beside a piece of
 * starts (`*piece`, cut to fit), or 0: no confirmation items fit, the
 * group is walked in chained rounds. */
static uint64_t confirm_cap(const struct gpu_engine *eng, uint64_t avail, uint64_t longest,
                            uint64_t *piece)
{
    uint64_t cap = eng->opt.confirm_cap ? eng->opt.confirm_cap : GPU_CONFIRM_CAP;
    if (avail == UINT64_MAX)
        return cap;
    if (longest + 16 <= avail && !eng->opt.confirm_cap)
        return NO_CARRY;
    if (avail < 2 * CONFIRM_SPAN + 16)
        return 0;
    if (*piece > (avail - 16) / 2)
        *piece = (avail - 16) / 2;
    return cap < avail - 16 - *piece ? cap : avail - 16 - *piece;
}

/* Groups whose lookback is longer than this (or unbounded) get their
 * run starts found ahead in buffers read at upload (plan_runs). */
#define RUN_LOOKBACK (4u << 10)

static bool runs_wanted(const struct catalog_nfa *g)
{
    return g->span != NULL && (g->lookback == CATALOG_UNBOUNDED || g->lookback > RUN_LOOKBACK);
}

/* Items of forward-confirmed (CAT_GF_CONFIRM) group k around its factors'
 * ends: starts in [e - lookback, e), merged and cut as above; each item
 * (buffer, a, b) is walked from a until the state dies at or after b (the
 * kernel runs an unbounded group's item that is not chained so). Items
 * that overlap may report the same (rule, end): scan_hits_finalize drops
 * the copy. */
static int confirm_items(const struct batch_ctx *bc, uint32_t c, uint32_t k,
                         const struct catalog_nfa *g, const struct plan_gates *pg, uint64_t gap,
                         uint64_t piece, bool grow, struct plan_part part, struct item_sink out)
{
    const struct gpu_batch *b = bc->batch;
    int rc = 0;
    for (uint32_t i = part.lo; i < part.hi && rc == 0; i++) {
        if (b->buffers[i].catalog != c || !gates_has(pg, i, k))
            continue;
        const struct refscan_gate *gate = &pg->v[i];
        size_t a = gate_lower(gate, k), z = gate_lower(gate, k + 1);
        uint64_t bytes = b->buffers[i].len, floor = 0;
        if (part.cut) {
            /* this part's factor ends; their starts may lie before blo,
             * but not before the group's last end in an earlier part:
             * start intervals [from(e), e) have from() ascending with e,
             * so the earlier parts' intervals hold every start below
             * that end (without the floor, a group of unbounded lookback
             * walked every earlier part's bytes again in each part) */
            size_t first = a;
            z = gate_end_lower(gate, a, z, part.bhi);
            a = gate_end_lower(gate, a, z, part.blo);
            floor = a > first ? gate->v[a - 1].end : 0;
            bytes = (part.bhi < bytes ? part.bhi : bytes) - part.blo;
        }
        if (z == a) /* no factor of this group: nothing to confirm */
            continue;
        struct confirm_job j = {out, i};
        size_t most = bytes / CONFIRM_SPAN;
        if (!grow)
            most = SIZE_MAX; /* pieces stay within the loop budget */
        /* a buffer read at upload has no bytes here: its run starts were
         * found ahead (plan_runs), or it has the lookback alone */
        struct refscan_starts st = {
            .lookback = g->lookback,
            .span = g->span,
            .buf = b->buffers[i].read == NULL ? b->buffers[i].data : NULL,
            .runs =
                pg->runs != NULL && pg->runs[i] != NULL && runs_wanted(g) ? pg->runs[i] + a : NULL,
            .floor = floor,
        };
        rc = refscan_confirm_items(&st, &gate->v[a].end, z - a,
                                   sizeof(struct refscan_cand) / sizeof(uint64_t), gap, piece,
                                   most > CONFIRM_MIN ? most : CONFIRM_MIN, confirm_piece, &j);
    }
    return rc < 0 ? -ENOMEM : 0;
}

static void plan_gates_finish(struct plan_gates *pg, uint32_t n)
{
    for (uint32_t i = 0; pg->v != NULL && i < n; i++)
        refscan_gate_finish(&pg->v[i]);
    free(pg->v);
    pg->v = NULL;
}

/* One piece (lo, hi] of one buffer's factor walk, on the host. */
struct gate_job {
    const struct catalog *cat;
    const uint8_t *data;
    size_t len;
    uint64_t lo, hi;
    uint32_t buf;
    struct refscan_gate out;
    int rc;
};

/* Shared by the factor-walk threads: the next job to take. */
struct gate_pool {
    struct gate_job *jobs;
    size_t n, next;
    pthread_mutex_t lock;
};

static void *gate_worker(void *arg)
{
    struct gate_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n)
            return NULL;
        struct gate_job *j = &p->jobs[i];
        j->rc = refscan_factor_scan(j->cat, j->data, j->len, j->lo, j->hi, &j->out);
        if (j->rc == 0) /* sorted here, on the walk's threads: gate_join only places */
            refscan_gate_sort(&j->out);
    }
}

/* Pieces of at least this many bytes: a thread's start-up and a piece's
 * re-walked factor length (16 bytes) stay small against its walk. */
#define GATE_PIECE   (1u << 18)
#define GATE_THREADS 16u

/* Runs jobs[0..n) on up to GATE_THREADS threads (this one included). */
static void gate_run(struct gate_job *jobs, size_t n)
{
    struct gate_pool p = {.jobs = jobs, .n = n};
    pthread_t th[GATE_THREADS];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t want = cores < 1 ? 1 : (size_t)cores, started = 0;
    want = want < GATE_THREADS ? want : GATE_THREADS;
    want = want < n ? want : n;
    if (pthread_mutex_init(&p.lock, NULL) != 0) {
        for (size_t i = 0; i < n; i++) { /* no lock: walk them here, one by one */
            jobs[i].rc = refscan_factor_scan(jobs[i].cat, jobs[i].data, jobs[i].len, jobs[i].lo,
                                             jobs[i].hi, &jobs[i].out);
            if (jobs[i].rc == 0)
                refscan_gate_sort(&jobs[i].out);
        }
        return;
    }
    for (; started + 1 < want; started++)
        if (pthread_create(&th[started], NULL, gate_worker, &p) != 0)
            break;
    gate_worker(&p);
    for (size_t t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    pthread_mutex_destroy(&p.lock);
}

/* The jobs of catalog c's buffers: each buffer in pieces of at least
 * GATE_PIECE bytes, about as many pieces in all as threads. */
static struct gate_job *gate_jobs(const struct gpu_batch *b, uint32_t c, size_t *n_out)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++)
        total += b->buffers[i].catalog == c ? b->buffers[i].len : 0;
    uint64_t piece = total / GATE_THREADS > GATE_PIECE ? total / GATE_THREADS : GATE_PIECE;
    size_t n = 0, cap = 0;
    struct gate_job *jobs = NULL;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        for (uint64_t lo = 0; gb->catalog == c && (lo < gb->len || lo == 0); lo += piece) {
            if (gpu_grow_array((void **)&jobs, &cap, n + 1, sizeof(*jobs)) < 0) {
                free(jobs);
                return NULL;
            }
            uint64_t hi = lo + piece < gb->len ? lo + piece : gb->len;
            jobs[n++] = (struct gate_job){.cat = b->catalogs[c],
                                          .data = gb->data,
                                          .len = gb->len,
                                          .lo = lo,
                                          .hi = hi,
                                          .buf = i};
            if (hi == gb->len)
                break;
        }
    }
    *n_out = n;
    return jobs != NULL ? jobs : calloc(1, sizeof(*jobs));
}

/* Places the candidates of one buffer's pieces jobs[0..n) (each sorted by
 * (group, end), their ends in ascending disjoint ranges) into `to`, sorted
 * by (group, end): per group, the pieces' runs one after another. A sort
 * of the whole buffer's candidates on this thread cost most of a 1 GiB
 * text file's plan (gitleaks-regex: millions of factor ends). */
static int gate_place(const struct gate_job *jobs, size_t n, uint32_t n_groups,
                      struct refscan_gate *to)
{
    size_t total = 0;
    size_t *at = calloc((size_t)n_groups + 1, sizeof(*at));
    if (at == NULL)
        return -ENOMEM;
    for (size_t k = 0; k < n; k++) {
        total += jobs[k].out.n;
        for (size_t x = 0; x < jobs[k].out.n; x++)
            at[jobs[k].out.v[x].nfa + 1]++;
    }
    for (uint32_t g = 0; g < n_groups; g++)
        at[g + 1] += at[g];
    to->v = malloc((total ? total : 1) * sizeof(*to->v));
    if (to->v == NULL) {
        free(at);
        return -ENOMEM;
    }
    to->cap = total ? total : 1;
    to->n = total;
    for (size_t k = 0; k < n; k++)
        for (size_t x = 0; x < jobs[k].out.n; x++)
            to->v[at[jobs[k].out.v[x].nfa]++] = jobs[k].out.v[x];
    free(at);
    return 0;
}

/* Joins the pieces' candidates into pg->v[buffer], sorted; frees them. */
static int gate_join(struct gate_job *jobs, size_t n, uint32_t n_groups, struct plan_gates *pg)
{
    int rc = 0;
    for (size_t a = 0, z; a < n; a = z) {
        for (z = a + 1; z < n && jobs[z].buf == jobs[a].buf; z++)
            ;
        for (size_t k = a; k < z; k++)
            rc = rc != 0 ? rc : jobs[k].rc;
        if (rc == 0)
            rc = gate_place(jobs + a, z - a, n_groups, &pg->v[jobs[a].buf]);
        for (size_t k = a; k < z; k++)
            refscan_gate_finish(&jobs[k].out);
    }
    return rc;
}

/* Finds the factor ends of catalog c's buffers when it has gated groups:
 * the host walks the factor group over every byte, in pieces on up to 16
 * threads (issue 9: 3.5 s/GiB on one). */
static int plan_gates_find(struct batch_ctx *bc, uint32_t c, struct plan_gates *pg)
{
    const struct gpu_batch *b = bc->batch;
    const struct catalog *cat = b->catalogs[c];
    bool any = false;
    for (uint32_t k = 0; k < catalog_nfa_count(cat) && !any; k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        any = (g.flags & CAT_GF_GATED) != 0;
    }
    pg->v = NULL;
    if (!any)
        return 0;
    pg->v = calloc(b->n_buffers ? b->n_buffers : 1, sizeof(*pg->v));
    size_t n = 0;
    struct gate_job *jobs = pg->v != NULL ? gate_jobs(b, c, &n) : NULL;
    if (jobs == NULL)
        return -ENOMEM;
    gate_run(jobs, n);
    int rc = gate_join(jobs, n, catalog_nfa_count(cat), pg);
    free(jobs);
    return rc;
}

/* Whether a bounded gated group's lead makes confirmation items cheaper
 * than windows of ends. A window walks 2 x maxlen around a lone candidate
 * with every start edge firing, a confirmation lead + at most maxlen with
 * starts only in the lead; when the two differ by little, windows win, as
 * merged windows make fewer and longer items. H200, 1 GiB in 1 MiB
 * buffers: regex-500's group (lead 13, maxlen 15) 24 ms of kernel in
 * windows, 55 ms confirmed; gitleaks-regex's groups (leads 16-93, maxlen
 * 73-1020) 375 ms in windows, 138 ms confirmed (docs/PERFORMANCE.md). */
static bool lead_pays(const struct catalog_nfa *g)
{
    return g->lookback != 0 && ((uint64_t)g->maxlen >= 2ull * g->lookback ||
                                (uint64_t)g->maxlen >= g->lookback + 32ull);
}

/* How plan_nfa plans bit-NFA group k of catalog c, and with what: the
 * decisions alone, so that the costly item lists of gated groups can be
 * made on the upload threads first (plan_pre) and used in order after. */
enum nfa_way {
    WAY_CONFIRM, /* CAT_GF_CONFIRM: forward confirmation, capped at `cap` */
    WAY_LEAD,    /* bounded, gated, its lead pays: confirmation items, walk dies in maxlen */
    WAY_WINDOWS, /* bounded, gated: windows of `seg` ends around the factors */
    WAY_BOUNDED, /* bounded, ungated: segments of `seg` */
    WAY_OTHER,   /* speculative segments or chained rounds */
};

struct nfa_plan {
    enum nfa_way way;
    struct catalog_nfa g;
    uint64_t avail; /* loop budget of an item, in bytes (UINT64_MAX: none) */
    uint64_t piece; /* WAY_CONFIRM, WAY_LEAD: a piece of starts */
    uint64_t cap;   /* WAY_CONFIRM */
    uint64_t seg;   /* WAY_WINDOWS, WAY_BOUNDED */
    bool grow;      /* WAY_CONFIRM, WAY_LEAD: refscan_confirm_items may grow pieces */
};

static void nfa_plan(const struct batch_ctx *bc, uint32_t c, uint32_t k, uint64_t longest,
                     const struct plan_gates *pg, struct nfa_plan *np)
{
    const struct launch_plan *p = &bc->plan;
    struct catalog_nfa *g = &np->g;
    catalog_nfa(bc->batch->catalogs[c], k, g);
    uint64_t avail = UINT64_MAX, per = nfa_byte_cost(g);
    if (p->step_budget != NO_BUDGET) {
        /* what gpu_pick_pipelines adds on top of an item's cost, and then some */
        uint64_t fill = 256 / p->wg + 32 + 5 * (uint64_t)g->n_words + 64;
        uint64_t usable = p->step_budget > fill ? (p->step_budget - fill) >> bc->eng->cut_shift : 0;
        avail = usable / per;
        avail = avail > 1 ? avail - 1 : 1;
    }
    np->avail = avail;
    /* forward confirmation: an item walks at most `cap` bytes past its
     * starts (to its buffer's end when the whole buffer fits an item) */
    np->piece = p->seg_bytes;
    np->cap = confirm_cap(bc->eng, avail, longest, &np->piece);
    if ((g->flags & CAT_GF_CONFIRM) && pg->v != NULL && np->cap != 0) {
        np->way = WAY_CONFIRM;
        np->grow = p->step_budget == NO_BUDGET;
        return;
    }
    bool bounded = g->maxlen != CATALOG_UNBOUNDED && (uint64_t)g->maxlen + 16 <= avail;
    /* a bounded gated group that knows its lead (compiler version 7) is
     * confirmed forward as well: starts only in [e - lead, e), each walk
     * dead within maxlen of its last start; refscan_gated_range walks it
     * so on the CPU. Where a piece cannot fit the loop budget it takes
     * windows instead. */
    if (bounded && (g->flags & CAT_GF_GATED) && lead_pays(g) && pg->v != NULL &&
        !bc->eng->opt.gate_windows &&
        (avail == UINT64_MAX || avail >= (uint64_t)g->maxlen + 16 + CONFIRM_SPAN)) {
        np->way = WAY_LEAD;
        np->piece = p->seg_bytes;
        if (avail != UINT64_MAX && np->piece > avail - g->maxlen - 16)
            np->piece = avail - g->maxlen - 16;
        np->grow = avail == UINT64_MAX;
        return;
    }
    if (bounded) {
        np->seg = p->seg_bytes;
        if (avail - g->maxlen < np->seg)
            np->seg = avail - g->maxlen;
        np->way = (g->flags & CAT_GF_GATED) && pg->v != NULL ? WAY_WINDOWS : WAY_BOUNDED;
        return;
    }
    np->way = WAY_OTHER;
}

/* Whether a group planned so has item lists made from factor ends. */
static bool way_gated(enum nfa_way w)
{
    return w == WAY_CONFIRM || w == WAY_LEAD || w == WAY_WINDOWS;
}

/* The items of a group planned WAY_CONFIRM, WAY_LEAD or WAY_WINDOWS, in
 * buffers lo..hi-1: a buffer's items depend on that buffer alone. */
static int nfa_way_items(const struct batch_ctx *bc, uint32_t c, uint32_t k,
                         const struct nfa_plan *np, const struct plan_gates *pg,
                         struct plan_part part, struct item_sink out)
{
    if (np->way == WAY_WINDOWS)
        return gated_items(bc, c, k, &np->g, np->seg, pg, part, out);
    return confirm_items(bc, c, k, &np->g, pg, CONFIRM_GAP, np->piece, np->grow, part, out);
}

/*
 * Bit-NFA group `group` (engine index) of catalog c, ungated and unbounded
 * (or bounded with a lookback over the loop budget): speculative segments
 * as plan_spec's, each walked from `look` bytes early with an empty state,
 * its state vectors at lo and hi in the queue state (2 * n_words words an
 * item). Segments are at least 512 bytes per state word, so the vectors
 * read back stay under 1/64 of the haystack. Returns 0, -ENOMEM, or 1:
 * off or no room in the loop budget (the caller chains).
 */
static int plan_nfa_spec(struct batch_ctx *bc, uint32_t c, uint32_t group,
                         const struct catalog_nfa *g, uint64_t avail)
{
    const struct gpu_engine *eng = bc->eng;
    if (eng->opt.spec_lookback == UINT32_MAX)
        return 1;
    uint64_t look = eng->opt.spec_lookback ? eng->opt.spec_lookback : GPU_SPEC_LOOKBACK;
    if (avail != UINT64_MAX && look > avail / 4)
        look = avail / 4;
    uint64_t seg = eng->opt.segment_bytes ? eng->opt.segment_bytes : bc->plan.seg_bytes;
    if (!eng->opt.segment_bytes && seg < SPEC_SEGMENT)
        seg = SPEC_SEGMENT;
    if (!eng->opt.segment_bytes && seg < 512u * g->n_words)
        seg = 512u * g->n_words;
    if (avail != UINT64_MAX && seg + look + 16 > avail) {
        if (avail < look + 32)
            return 1;
        seg = avail - look - 16;
    }
    uint32_t first = (uint32_t)bc->n_meta;
    if (nfa_items(bc, c, 0, seg, false) < 0)
        return -ENOMEM;
    uint32_t n = (uint32_t)bc->n_meta - first;
    if (n == 0)
        return 0;
    if (add_range(bc, c, group, 0, first, n, NO_CARRY, nfa_item_cost(g, seg + look)) < 0)
        return -ENOMEM;
    struct scan_range *sr = &bc->eng->scratch.ranges[bc->n_ranges - 1];
    sr->nfa = true;
    sr->spec_base = bc->n_spec;
    sr->look = (uint32_t)look;
    bc->n_spec += 2 * n * g->n_words;
    bc->tel->spec_items += n;
    return 0;
}

/*
 * Bit-NFA group k of catalog c: bounded groups are cut into segments that
 * start maxlen-1 bytes early (as DFA groups are), gated ones only around
 * their factors' ends; forward-confirmed ones (CAT_GF_CONFIRM) get one
 * item per merged start interval when a whole buffer fits one item's loop
 * budget (always on the H200); unbounded ones, and
 * bounded ones whose lookback alone is over the device's loop budget
 * (lavapipe), walk each buffer in chained rounds that hand the state vector
 * over in carry[]. The loop budget sets the bytes one item may walk.
 */
/* One task's items (plan_pre). */
struct pre_part {
    struct batch_scratch s; /* only meta and meta_cap are used */
    size_t n;
    int rc;
};

/* A group's items made ahead on the upload threads (plan_pre): its tasks'
 * lists in order, copied once, into the batch's items (pre_copy). */
struct pre_items {
    bool made;          /* else the group is planned in place */
    struct nfa_plan np; /* its decisions, taken before the threads start */
    struct pre_part *parts;
    uint32_t n_parts;
    size_t n;
    int rc;
};

/* Copies of the parts of one group's items into the batch's, each part on
 * a pool thread where there are many: one pass over the items' 16 bytes
 * each (7 M items, 112 MB, for wordy-300's 1 GiB file; two serial copies
 * before). */
struct pre_copy_job {
    const struct pre_items *pi;
    uint32_t *dst;    /* the first item's words */
    const size_t *at; /* per part: its first item's index from dst */
};

static void pre_copy_part(void *ctx, uint32_t t)
{
    const struct pre_copy_job *j = ctx;
    const struct pre_part *pp = &j->pi->parts[t];
    if (pp->n > 0)
        memcpy(&j->dst[j->at[t] * 4], pp->s.meta, pp->n * 16);
}

/* Items of at least this many bytes are copied on the pool's threads
 * (test_gpu's gated batches of a few thousand items take that way too). */
#define PRE_COPY_POOL (64u << 10)

static void pre_copy(struct batch_ctx *bc, const struct pre_items *pi, uint32_t *dst)
{
    size_t *at = pi->n_parts > 1 ? malloc(pi->n_parts * sizeof(*at)) : NULL;
    size_t n = 0;
    for (uint32_t t = 0; at != NULL && t < pi->n_parts; t++) {
        at[t] = n;
        n += pi->parts[t].n;
    }
    struct pre_copy_job j = {pi, dst, at};
    if (at != NULL && bc->eng->pool != NULL && pi->n * 16 >= PRE_COPY_POOL) {
        upload_pool_run(bc->eng->pool, pre_copy_part, &j, pi->n_parts);
    } else {
        for (uint32_t t = 0, k = 0; t < pi->n_parts; k += pi->parts[t++].n)
            if (pi->parts[t].n > 0)
                memcpy(&dst[(size_t)k * 4], pi->parts[t].s.meta, pi->parts[t].n * 16);
    }
    free(at);
}

static int plan_nfa(struct batch_ctx *bc, uint32_t c, uint32_t k, uint64_t longest,
                    const struct plan_gates *pg, struct pre_items *pre)
{
    const struct launch_plan *p = &bc->plan;
    struct nfa_plan np;
    nfa_plan(bc, c, k, longest, pg, &np);
    const struct catalog_nfa *g = &np.g;
    uint32_t group = catalog_group_count(bc->batch->catalogs[c]) + k;
    uint32_t first = (uint32_t)bc->n_meta;
    if (way_gated(np.way)) {
        struct item_sink main = {&bc->eng->scratch, &bc->n_meta};
        int rc;
        if (pre != NULL) { /* made ahead: append them */
            rc = pre->rc;
            if (rc == 0 && gpu_grow_array((void **)&bc->eng->scratch.meta,
                                          &bc->eng->scratch.meta_cap, bc->n_meta + pre->n, 16) < 0)
                rc = -ENOMEM;
            if (rc == 0 && pre->n > 0) {
                pre_copy(bc, pre, &bc->eng->scratch.meta[bc->n_meta * 4]);
                bc->n_meta += pre->n;
            }
        } else {
            rc = nfa_way_items(bc, c, k, &np, pg, (struct plan_part){.hi = bc->batch->n_buffers},
                               main);
        }
        if (rc < 0)
            return -ENOMEM;
        uint32_t n = (uint32_t)bc->n_meta - first;
        if (n == 0)
            return 0;
        /* bytes the costliest item walks */
        uint64_t walk = np.way == WAY_LEAD      ? np.piece + g->maxlen
                        : np.way == WAY_WINDOWS ? np.seg + g->maxlen
                        : np.cap == NO_CARRY
                            ? longest
                            : (longest < np.piece + np.cap ? longest : np.piece + np.cap);
        if (add_range(bc, c, group, 0, first, n, NO_CARRY, nfa_item_cost(g, walk)) < 0)
            return -ENOMEM;
        struct scan_range *sr = &bc->eng->scratch.ranges[bc->n_ranges - 1];
        sr->nfa = true;
        /* a confirmation piece's walk runs on past its starts */
        sr->overlap = np.way != WAY_WINDOWS;
        if (np.way == WAY_CONFIRM) {
            sr->cap = (uint32_t)np.cap;
            bc->has_confirm |= np.cap != NO_CARRY;
        } else if (np.way == WAY_LEAD) {
            sr->confirm = true; /* cap NO_CARRY: the walk dies within maxlen */
        }
        return 0;
    }
    if (np.way == WAY_BOUNDED) {
        if (nfa_items(bc, c, 0, np.seg, false) < 0)
            return -ENOMEM;
        uint32_t n = (uint32_t)bc->n_meta - first;
        if (n == 0)
            return 0;
        if (add_range(bc, c, group, 0, first, n, NO_CARRY, nfa_item_cost(g, np.seg + g->maxlen)) <
            0)
            return -ENOMEM;
        bc->eng->scratch.ranges[bc->n_ranges - 1].nfa = true;
        return 0;
    }
    uint64_t avail = np.avail;
    int rc = plan_nfa_spec(bc, c, group, g, avail);
    if (rc <= 0)
        return rc;
    uint64_t chain = p->step_budget == NO_BUDGET ? p->chain_bytes : avail;
    uint32_t carry = bc->n_carry;
    bc->n_carry += g->n_words * bc->batch->n_buffers;
    for (uint64_t lo = 0; lo < longest; lo += chain) {
        first = (uint32_t)bc->n_meta;
        if (nfa_items(bc, c, lo, chain, true) < 0)
            return -ENOMEM;
        uint32_t n = (uint32_t)bc->n_meta - first;
        if (n == 0)
            continue;
        if (add_range(bc, c, group, (uint32_t)(lo / chain), first, n, carry,
                      nfa_item_cost(g, chain)) < 0)
            return -ENOMEM;
        bc->eng->scratch.ranges[bc->n_ranges - 1].nfa = true;
    }
    return 0;
}

/* Gated groups of catalog c planned ahead: their item lists (windows or
 * confirmation pieces from every buffer's factor ends, most of a gated
 * catalog's plan: 176 groups and 0.9 M factor ends per GiB for
 * gitleaks-regex) made on the upload threads, a task per (group, part of
 * the batch), each into its own list. A batch of few groups and many
 * buffers (leads.rules: two gated groups, 4,096 buffers of 64 KiB) is cut
 * into parts of whole buffers, one of few buffers (the CLI's one file) into
 * parts of the buffers' bytes, so that every thread gets about two tasks;
 * one of many groups takes a task per group. The parts of a group are
 * joined in buffer and offset order and plan_nfa appends the groups in
 * group order. */
struct pre_task {
    uint32_t g;      /* the g-th gated group, ks[g] */
    uint32_t lo, hi; /* its parts[lo..hi) */
};

struct pre_job {
    const struct batch_ctx *bc;
    uint32_t c;
    const struct plan_gates *pg;
    const uint32_t *ks; /* the gated groups */
    const struct plan_part *parts;
    const struct pre_task *tasks; /* a group's tasks together, in part order */
    const uint32_t *first;        /* per gated group: its first task; one more at the end */
    struct pre_items *out;
    struct pre_part *part; /* per task */
};

/* Bytes a part of a cut buffer holds at least: its binary searches and a
 * window or piece cut at its edges stay small against its ends. */
#define PRE_PIECE (1u << 20)

static void pre_task(void *ctx, uint32_t t)
{
    struct pre_job *j = ctx;
    const struct pre_task *pt = &j->tasks[t];
    uint32_t k = j->ks[pt->g];
    struct pre_part *pp = &j->part[t];
    pp->rc = 0;
    for (uint32_t p = pt->lo; p < pt->hi && pp->rc == 0; p++)
        pp->rc = nfa_way_items(j->bc, j->c, k, &j->out[k].np, j->pg, j->parts[p],
                               (struct item_sink){&pp->s, &pp->n});
}

/* Hands the tasks of the g-th gated group (ks[g]), in order, to its
 * pre_items (their lists are copied once, by plan_nfa's pre_copy). */
static void pre_join(struct pre_job *j, uint32_t g)
{
    struct pre_items *pi = &j->out[j->ks[g]];
    struct pre_part *pp = &j->part[j->first[g]];
    uint32_t np = j->first[g + 1] - j->first[g];
    pi->rc = 0;
    pi->n = 0;
    pi->parts = malloc(np * sizeof(*pi->parts));
    if (pi->parts == NULL) {
        pi->rc = -ENOMEM;
        for (uint32_t p = 0; p < np; p++)
            free(pp[p].s.meta);
        return;
    }
    pi->n_parts = np;
    for (uint32_t p = 0; p < np; p++) {
        if (pp[p].rc < 0)
            pi->rc = pp[p].rc;
        pi->n += pp[p].n;
        pi->parts[p] = pp[p];
        pp[p].s.meta = NULL;
    }
}

/* The factor ends of each gated group in catalog c's buffers, into
 * ends[g] for ks[g] (g_of[k]: that g, or UINT32_MAX; k < n_nfa): each buffer's ends
 * are sorted by group, so a binary search per group present in it. */
static void pre_weigh(const struct batch_ctx *bc, uint32_t c, const struct plan_gates *pg,
                      const uint32_t *g_of, uint32_t n_nfa, uint64_t *ends)
{
    const struct gpu_batch *b = bc->batch;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        if (b->buffers[i].catalog != c)
            continue;
        const struct refscan_gate *gate = &pg->v[i];
        for (size_t m = 0, z; m < gate->n; m = z) {
            uint32_t k = gate->v[m].nfa;
            z = gate_lower_from(gate, m + 1, k + 1); /* the first end of a later group */
            if (k < n_nfa && g_of[k] != UINT32_MAX)
                ends[g_of[k]] += z - m;
        }
    }
}

/* About `want` parts of catalog c's share of the batch, into *out (NULL
 * when no memory); returns their number. Whole buffers, at least 16 a
 * part, while there are enough of them; else runs of whole buffers of
 * about `piece` bytes (at least PRE_PIECE), a buffer longer than that cut
 * into pieces of `piece` bytes, its last piece open-ended. */
static uint32_t pre_parts(const struct batch_ctx *bc, uint32_t c, uint32_t want,
                          struct plan_part **out)
{
    const struct gpu_batch *b = bc->batch;
    uint32_t nb = b->n_buffers, n = 0;
    *out = NULL;
    if (nb / 16 >= want) {
        struct plan_part *v = calloc(want, sizeof(*v));
        for (uint32_t p = 0; v != NULL && p < want; p++)
            v[p] = (struct plan_part){.lo = (uint32_t)((uint64_t)nb * p / want),
                                      .hi = (uint32_t)((uint64_t)nb * (p + 1) / want)};
        *out = v;
        return v != NULL ? want : 0;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < nb; i++)
        total += b->buffers[i].catalog == c ? b->buffers[i].len : 0;
    uint64_t piece = total / want > PRE_PIECE ? total / want : PRE_PIECE;
    /* at most: a part per run and one more per cut buffer, a piece each */
    struct plan_part *v = calloc(2 * (total / piece + 1) + nb, sizeof(*v));
    if (v == NULL)
        return 0;
    uint64_t run = UINT64_MAX; /* bytes of the open run v[n - 1]; UINT64_MAX: none */
    for (uint32_t i = 0; i < nb; i++) {
        uint64_t len = b->buffers[i].len;
        if (b->buffers[i].catalog != c)
            continue;
        if (len > piece) {
            for (uint64_t lo = 0; lo < len; lo += piece)
                v[n++] = (struct plan_part){i, i + 1, true, lo,
                                            lo + piece < len ? lo + piece : UINT64_MAX};
            run = UINT64_MAX;
            continue;
        }
        if (run != UINT64_MAX && run + len <= piece) {
            v[n - 1].hi = i + 1;
            run += len;
            continue;
        }
        v[n++] = (struct plan_part){.lo = i, .hi = i + 1};
        run = len;
    }
    *out = v;
    return n;
}

/* Per NFA group of catalog c, its items made ahead where pre[k].made, or
 * NULL when none are (a single task, one thread, no memory: every group
 * is planned in place then). */
static struct pre_items *plan_pre(struct batch_ctx *bc, uint32_t c, uint64_t longest,
                                  const struct plan_gates *pg)
{
    uint32_t n_nfa = catalog_nfa_count(bc->batch->catalogs[c]);
    uint32_t threads = bc->eng->pool != NULL ? upload_pool_threads(bc->eng->pool) : 0;
    if (pg->v == NULL || n_nfa == 0 || threads < 2)
        return NULL;
    uint32_t *ks = malloc(n_nfa * sizeof(*ks));
    struct pre_items *out = calloc(n_nfa, sizeof(*out));
    uint32_t n = 0;
    for (uint32_t k = 0; ks != NULL && out != NULL && k < n_nfa; k++) {
        nfa_plan(bc, c, k, longest, pg, &out[k].np);
        if (way_gated(out[k].np.way))
            ks[n++] = k;
    }
    /* About two tasks a thread: a group's share of them as its share of
     * the factor ends (the items' cost), at least one task; the batch cut
     * into as many parts as the heaviest group may take. */
    uint32_t want = 2 * threads;
    struct plan_part *parts = NULL;
    uint32_t n_parts = n > 0 ? pre_parts(bc, c, want, &parts) : 0;
    uint64_t *ends = n_parts > 0 ? calloc(n, sizeof(*ends)) : NULL;
    uint32_t *first = ends != NULL ? calloc(n + 1, sizeof(*first)) : NULL;
    struct pre_task *tasks =
        first != NULL ? calloc((size_t)n + want + n_parts, sizeof(*tasks)) : NULL;
    uint32_t n_tasks = 0;
    uint32_t *g_of = tasks != NULL ? malloc(n_nfa * sizeof(*g_of)) : NULL;
    if (g_of != NULL) {
        for (uint32_t k = 0; k < n_nfa; k++)
            g_of[k] = UINT32_MAX;
        for (uint32_t g = 0; g < n; g++)
            g_of[ks[g]] = g;
        pre_weigh(bc, c, pg, g_of, n_nfa, ends);
        uint64_t all = 0;
        for (uint32_t g = 0; g < n; g++)
            all += ends[g];
        for (uint32_t g = 0; g < n; g++) {
            uint64_t m = all > 0 ? ends[g] * want / all : 0;
            uint32_t split = m < 1 ? 1 : m > n_parts ? n_parts : (uint32_t)m;
            first[g] = n_tasks;
            for (uint32_t q = 0; q < split; q++)
                tasks[n_tasks++] =
                    (struct pre_task){g, (uint32_t)((uint64_t)n_parts * q / split),
                                      (uint32_t)((uint64_t)n_parts * (q + 1) / split)};
        }
        first[n] = n_tasks;
    }
    struct pre_part *part = n_tasks >= 2 ? calloc(n_tasks, sizeof(*part)) : NULL;
    free(g_of);
    free(ends);
    if (part == NULL) {
        free(tasks);
        free(first);
        free(parts);
        free(ks);
        free(out);
        return NULL;
    }
    for (uint32_t t = 0; t < n; t++)
        out[ks[t]].made = true;
    struct pre_job j = {bc, c, pg, ks, parts, tasks, first, out, part};
    upload_pool_run(bc->eng->pool, pre_task, &j, n_tasks);
    for (uint32_t g = 0; g < n; g++)
        pre_join(&j, g);
    free(part);
    free(tasks);
    free(first);
    free(parts);
    free(ks);
    return out;
}

/*
 * Run starts found ahead (pg->runs) for catalog c's buffers read at
 * upload. Such a buffer's bytes are not in memory when its plan begins, so
 * a confirmation group's span test (where the run of span bytes before a
 * factor end begins, docs/engine.md "Forward confirmation") had the
 * lookback alone: for a group of long or no lookback (`[a-z]+@...`) every
 * start from its previous end on, which walked the whole file on the
 * device (leads.rules in the CLI: 178 ms of kernel for 1 GiB, against
 * 20-30 ms with the bytes in memory). Here the upload threads read the
 * bytes around the ends back from the file (the page cache), each window
 * once for all such groups, in tasks of about 1/(2 * threads) of a
 * buffer; a group's run carries from one window to the next within a
 * task. A run that reaches bytes not read (before a task's or a window's
 * first RUN_PAD bytes) is taken to go on (refscan_starts lo): never a
 * later start than the true one.
 */
#define RUN_PAD    (4u << 10)
#define RUN_BACK   (64u << 10) /* read before a window where a run reached RUN_PAD */
#define RUN_WINDOW (1u << 20)

struct run_task {
    uint32_t buf;
    uint64_t lo, hi; /* factor ends in [lo, hi) */
};

struct run_job {
    const struct batch_ctx *bc;
    const struct plan_gates *pg;
    const uint32_t *ks;           /* the groups runs_wanted */
    const struct catalog_nfa *gs; /* theirs */
    uint32_t n_ks;
    const struct run_task *tasks;
};

/* One window of a run task: the buffer's bytes [lo, hi) at win[lo - base]. */
struct run_win {
    const struct gpu_buffer *gb;
    uint8_t *win; /* RUN_BACK + RUN_WINDOW bytes: [base, base + that) */
    uint64_t base, lo, hi;
    bool ok;
};

static void run_point(const struct run_win *w, struct refscan_starts *st)
{
    st->buf = w->ok ? w->win + (w->lo - w->base) : NULL;
    st->lo = w->lo;
    st->hi = w->hi;
}

/* Reads [base, lo) in front of the window once; false if it has them
 * already or cannot. A read that fails leaves the lookback alone; the
 * caller's read function reports the failure for the buffer (the daemon
 * fails it as unreadable). */
static bool run_back(struct run_win *w)
{
    if (!w->ok || w->lo == w->base)
        return false;
    w->ok = w->gb->read(w->gb->read_ctx, w->win, w->base, (size_t)(w->lo - w->base)) == 0;
    w->lo = w->base;
    return w->ok;
}

static void run_task(void *ctx, uint32_t t)
{
    const struct run_job *j = ctx;
    const struct run_task *rt = &j->tasks[t];
    const struct refscan_gate *gate = &j->pg->v[rt->buf];
    uint64_t *runs = j->pg->runs[rt->buf];
    struct run_win w = {.gb = &j->bc->batch->buffers[rt->buf]};
    w.win = malloc(RUN_BACK + RUN_WINDOW);
    struct refscan_starts *st = calloc(j->n_ks, sizeof(*st));
    size_t *at = calloc(2 * (size_t)j->n_ks, sizeof(*at));
    bool mem = w.win != NULL && st != NULL && at != NULL;
    size_t *stop = mem ? at + j->n_ks : NULL;
    for (uint32_t g = 0; g < j->n_ks; g++) {
        size_t a = gate_lower(gate, j->ks[g]), z = gate_lower_from(gate, a, j->ks[g] + 1);
        z = gate_end_lower(gate, a, z, rt->hi);
        a = gate_end_lower(gate, a, z, rt->lo);
        if (!mem) { /* the lookback alone */
            struct refscan_starts look = {.lookback = j->gs[g].lookback};
            for (size_t m = a; m < z; m++)
                runs[m] = refscan_start_from(&look, gate->v[m].end);
            continue;
        }
        at[g] = a;
        stop[g] = z;
        st[g] = (struct refscan_starts){.lookback = j->gs[g].lookback, .span = j->gs[g].span};
    }
    for (;;) {
        uint64_t e0 = UINT64_MAX; /* the window starts at the first end left */
        for (uint32_t g = 0; mem && g < j->n_ks; g++)
            if (at[g] < stop[g] && gate->v[at[g]].end < e0)
                e0 = gate->v[at[g]].end;
        if (e0 == UINT64_MAX)
            break;
        w.base = e0 > RUN_BACK ? e0 - RUN_BACK : 0;
        w.lo = e0 > RUN_PAD ? e0 - RUN_PAD : 0;
        w.hi = e0 + RUN_WINDOW < w.gb->len ? e0 + RUN_WINDOW : w.gb->len;
        w.ok = w.hi > w.lo && w.gb->read(w.gb->read_ctx, w.win + (w.lo - w.base), w.lo,
                                         (size_t)(w.hi - w.lo)) == 0;
        uint64_t whi = e0 + RUN_WINDOW; /* ends in [e0, whi) */
        for (uint32_t g = 0; g < j->n_ks; g++) {
            for (; at[g] < stop[g] && gate->v[at[g]].end < whi; at[g]++) {
                uint64_t e = gate->v[at[g]].end;
                struct refscan_starts was = st[g];
                run_point(&w, &st[g]);
                runs[at[g]] = refscan_start_from(&st[g], e);
                /* a run longer than RUN_PAD: the bytes before, once */
                if (st[g].cut && run_back(&w)) {
                    st[g] = was;
                    run_point(&w, &st[g]);
                    runs[at[g]] = refscan_start_from(&st[g], e);
                }
            }
        }
    }
    free(at);
    free(st);
    free(w.win);
}

static void runs_free(struct plan_gates *pg, uint32_t n)
{
    for (uint32_t i = 0; pg->runs != NULL && i < n; i++)
        free(pg->runs[i]);
    free(pg->runs);
    pg->runs = NULL;
}

/* Whether buffer i is one of catalog c's read at upload with factor ends. */
static bool runs_buffer(const struct gpu_batch *b, const struct plan_gates *pg, uint32_t c,
                        uint32_t i)
{
    const struct gpu_buffer *gb = &b->buffers[i];
    return gb->catalog == c && gb->data == NULL && gb->read != NULL && pg->v[i].n > 0;
}

/* Fills pg->runs for catalog c's buffers read at upload, where a gated
 * group runs_wanted has ends. Without memory it leaves them NULL (the
 * lookback alone): a longer walk, never a lost match. */
static void plan_runs(struct batch_ctx *bc, uint32_t c, uint64_t longest, struct plan_gates *pg)
{
    const struct gpu_batch *b = bc->batch;
    uint32_t n_nfa = catalog_nfa_count(b->catalogs[c]), n_ks = 0;
    uint64_t total = 0; /* bytes of the buffers read at upload that have factor ends */
    for (uint32_t i = 0; i < b->n_buffers; i++)
        total += runs_buffer(b, pg, c, i) ? b->buffers[i].len : 0;
    uint32_t *ks = total > 0 ? malloc(n_nfa * sizeof(*ks)) : NULL;
    struct catalog_nfa *gs = ks != NULL ? malloc(n_nfa * sizeof(*gs)) : NULL;
    for (uint32_t k = 0; gs != NULL && k < n_nfa; k++) {
        struct nfa_plan np;
        nfa_plan(bc, c, k, longest, pg, &np);
        if ((np.way == WAY_CONFIRM || np.way == WAY_LEAD) && runs_wanted(&np.g)) {
            ks[n_ks] = k;
            gs[n_ks++] = np.g;
        }
    }
    uint32_t threads = bc->eng->pool != NULL ? upload_pool_threads(bc->eng->pool) : 1;
    uint64_t piece = total / (2 * (uint64_t)threads);
    piece = piece > 2 * RUN_WINDOW ? piece : 2 * RUN_WINDOW;
    size_t n_tasks = 0, cap = n_ks > 0 ? total / piece + b->n_buffers + 1 : 0;
    struct run_task *tasks = cap > 0 ? calloc(cap, sizeof(*tasks)) : NULL;
    pg->runs = tasks != NULL ? calloc(b->n_buffers, sizeof(*pg->runs)) : NULL;
    for (uint32_t i = 0; pg->runs != NULL && i < b->n_buffers; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        if (!runs_buffer(b, pg, c, i))
            continue;
        pg->runs[i] = malloc(pg->v[i].n * sizeof(uint64_t));
        for (uint64_t lo = 0; pg->runs[i] != NULL && lo <= gb->len; lo += piece)
            tasks[n_tasks++] =
                (struct run_task){i, lo, lo + piece > gb->len ? UINT64_MAX : lo + piece};
    }
    if (n_tasks > 0) {
        struct run_job j = {bc, pg, ks, gs, n_ks, tasks};
        if (bc->eng->pool != NULL)
            upload_pool_run(bc->eng->pool, run_task, &j, (uint32_t)n_tasks);
        else
            for (uint32_t t = 0; t < n_tasks; t++)
                run_task(&j, t);
    }
    free(tasks);
    free(gs);
    free(ks);
}

static void pre_free(struct pre_items *pre, uint32_t n_nfa)
{
    for (uint32_t k = 0; pre != NULL && k < n_nfa; k++) {
        for (uint32_t p = 0; p < pre[k].n_parts; p++)
            free(pre[k].parts[p].s.meta);
        free(pre[k].parts);
    }
    free(pre);
}

void gpu_nfa_push(const struct batch_ctx *bc, const struct scan_range *sr, uint32_t head,
                  struct nfa_push *pc)
{
    const struct catalog *cat = bc->batch->catalogs[sr->cat];
    struct catalog_nfa g;
    catalog_nfa(cat, sr->group - catalog_group_count(cat), &g);
    const uint32_t *base = catalog_words(cat, NULL);
    *pc = (struct nfa_push){
        .items = sr->items,
        .n_items = sr->n_items,
        .head = head,
        .bufs = 0,
        .carry_base = sr->carry_base,
        .max_cost = sr->max_cost,
        .hit_cap = (uint32_t)(bc->eng->hits.size / 16),
        .layer = sr->group,
        .n_words = g.n_words,
        .maxlen = g.maxlen,
        .classmap = (uint32_t)(g.classmap - base),
        .reach = (uint32_t)(g.reach - base),
        .shift = (uint32_t)(g.shift - base),
        .n_exc = g.n_exc,
        .exc = (uint32_t)(g.exc - base),
        .n_acc = g.n_acc,
        .acc = (uint32_t)(g.acc - base),
        .ranges = (uint32_t)(g.ranges - base),
        .cap = sr->cap,
        .x_narrow = g.x_narrow,
        .x_span = g.x_span,
        .count = sr->counted,
        .spec = sr->spec_base == NO_CARRY ? NO_CARRY
                                          : QS_HEADS + (uint32_t)bc->n_ranges + sr->spec_base,
    };
    if (sr->spec_base != NO_CARRY)
        pc->maxlen = sr->look + 1;
    if (sr->confirm) /* the kernel's forward-confirmation mode */
        pc->maxlen = CATALOG_UNBOUNDED;
}

/* Filter words of the literal kernel: a power of two of at most 32 KiB
 * that fits the device's shared memory. */
static uint32_t lit_filter_words(const struct gpu_engine *eng)
{
    uint32_t w = 8192, most = (eng->info.max_shared_bytes - 256) / 4;
    while (w > 256 && w > most)
        w /= 2;
    return w;
}

/* Loop iterations the literal kernel may run for an item of `walk` bytes:
 * 16 bytes per iteration, 30 unaligned ends, and a confirmation at every
 * position, the costliest one. */
static uint32_t lit_cost(const struct gpu_lit *t, uint64_t walk)
{
    uint64_t cost = (walk + 15) / 16 + 34 + walk * t->pos_cost;
    return cost > 0xfffffff0u ? 0xfffffff0u : (uint32_t)cost;
}

/* A single literal group goes to the literal kernel when its DFA rows are
 * more than this: the DFA kernel keeps the first rows in shared memory,
 * where a scan spends most of its time, and runs a group of a few hundred
 * KiB of rows at hundreds of GB/s on the H200 (literals-1000: 0.6 MB, 550
 * GB/s); tables of many MiB miss the cache (dict-10: 7 MB a group). */
#define LIT_DFA_BYTES (8u << 20)

/* Whether `cat` has a literal group (CAT_GF_LITERAL). */
static bool has_literal_group(const struct catalog *cat)
{
    for (uint32_t k = 0; k < catalog_group_count(cat); k++) {
        struct catalog_group g;
        catalog_group(cat, k, &g);
        if (g.flags & CAT_GF_LITERAL)
            return true;
    }
    return false;
}

/* Whether some literal group of `t` has more than LIT_DFA_BYTES of rows. */
static bool lit_spills(const struct catalog *cat, const struct gpu_lit *t)
{
    for (uint32_t k = 0; k < t->n_dfa; k++) {
        struct catalog_group g;
        if (!t->route[k])
            continue;
        catalog_group(cat, k, &g);
        uint64_t entries = (uint64_t)g.n_states * g.n_classes;
        uint64_t bytes = g.n_states <= 65536 ? 2 * entries : 4 * entries;
        if (bytes > LIT_DFA_BYTES)
            return true;
    }
    return false;
}

/*
 * Whether catalog c's literal groups go to the literal kernel in this
 * batch (bc->lit_route), and its segment size (*seg). Off when the option
 * says so, when the catalog has none, when (automatic) one DFA pass whose
 * rows fit shared memory serves them, or when an item would not fit the
 * device's loop budget (lavapipe with very long strings).
 */
static int plan_lit(struct batch_ctx *bc, uint32_t c, uint32_t *seg)
{
    struct gpu_engine *eng = bc->eng;
    const struct catalog *cat = bc->batch->catalogs[c];
    const struct launch_plan *p = &bc->plan;
    bc->lit[c] = NULL;
    bc->lit_route[c] = false;
    if (eng->opt.lit_kernel < 0) /* literal groups have no DFA to run instead */
        return has_literal_group(cat) ? -ENOTSUP : 0;
    int rc = gpu_lit_get(eng, cat, lit_filter_words(eng), &bc->lit[c]);
    if (rc < 0)
        return rc;
    const struct gpu_lit *t = bc->lit[c];
    /* literal groups (CAT_GF_LITERAL) have no DFA: this kernel always */
    bool must = has_literal_group(cat);
    if (must && !t->literal)
        return -E2BIG; /* its tables were over the storage-buffer range */
    if (!must &&
        (t->n_groups == 0 || (eng->opt.lit_kernel == 0 && t->n_groups < 2 && !lit_spills(cat, t))))
        return 0;
    uint64_t s = p->lit_seg_bytes;
    if (!eng->opt.segment_bytes && s < 8ull * t->maxlen)
        s = 8ull * t->maxlen < p->seg_bytes ? 8ull * t->maxlen : p->seg_bytes;
    if (p->step_budget != NO_BUDGET) {
        uint64_t fill = t->filter_words / p->wg + 8 + 64;
        uint64_t usable = p->step_budget > fill ? (p->step_budget - fill) >> eng->cut_shift : 0;
        uint64_t walk = usable > 34 ? (usable - 34) * 16 / (16 * (uint64_t)t->pos_cost + 1) : 0;
        walk &= ~(uint64_t)15;
        if (walk < t->maxlen + 16u)
            return must ? -E2BIG : 0; /* a literal group has no DFA to fall back on */
        if (walk - t->maxlen + 1 < s)
            s = walk - t->maxlen + 1;
    }
    *seg = (uint32_t)s;
    bc->lit_route[c] = true;
    gpu_lit_push_tables(bc, c);
    bc->tel->lit_groups += t->n_groups;
    return 0;
}

/* The literal kernel's range of catalog c: every buffer in segments of
 * `seg` end offsets, each walked from maxlen - 1 bytes early. */
static int lit_items(struct batch_ctx *bc, uint32_t c, uint32_t seg)
{
    uint32_t first = (uint32_t)bc->n_meta;
    if (nfa_items(bc, c, 0, seg, false) < 0)
        return -ENOMEM;
    uint32_t n = (uint32_t)bc->n_meta - first;
    const struct gpu_lit *t = bc->lit[c];
    if (n == 0)
        return 0;
    if (add_range(bc, c, 0, 0, first, n, NO_CARRY, lit_cost(t, (uint64_t)seg + t->maxlen)) < 0)
        return -ENOMEM;
    bc->eng->scratch.ranges[bc->n_ranges - 1].lit = true;
    return 0;
}

/* Index of catalog cat's factor group (CAT_GF_FACTOR), or UINT32_MAX. */
uint32_t gpu_factor_group(const struct catalog *cat)
{
    struct catalog_group g;
    for (uint32_t k = 0; k < catalog_group_count(cat); k++) {
        catalog_group(cat, k, &g);
        if (g.flags & CAT_GF_FACTOR)
            return k;
    }
    return UINT32_MAX;
}

static bool has_gated(const struct catalog *cat)
{
    for (uint32_t k = 0; k < catalog_nfa_count(cat); k++) {
        struct catalog_nfa g;
        catalog_nfa(cat, k, &g);
        if (g.flags & CAT_GF_GATED)
            return true;
    }
    return false;
}

bool gpu_plan_factor_choice(struct batch_ctx *bc)
{
    const struct gpu_batch *b = bc->batch;
    int32_t mode = bc->eng->opt.factor_pass;
    bool any = false;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        bc->gates_of[c] = false;
        const struct catalog *cat = b->catalogs[c];
        if (mode < 0 || gpu_factor_group(cat) == UINT32_MAX || !has_gated(cat))
            continue;
        uint64_t bytes = 0;
        bool read = false;
        for (uint32_t i = 0; i < b->n_buffers; i++) {
            if (b->buffers[i].catalog != c)
                continue;
            bytes += b->buffers[i].len;
            read |= b->buffers[i].data == NULL && b->buffers[i].len > 0;
        }
        bc->gates_of[c] = bytes > 0 && (mode > 0 || read || bytes >= GPU_FACTOR_PASS_MIN);
        any |= bc->gates_of[c];
    }
    return any;
}

/* The factor pass's items of catalog c: its factor group alone, every
 * buffer in segments, reporting every entry (scan_range.factor). */
static int plan_factor(struct batch_ctx *bc, uint32_t c)
{
    const struct gpu_batch *b = bc->batch;
    const struct catalog *cat = b->catalogs[c];
    uint32_t k = gpu_factor_group(cat);
    struct catalog_group g;
    catalog_group(cat, k, &g);
    fit_budget(bc, c, g.maxlen, 1);
    uint32_t seg = bc->seg[c], first = (uint32_t)bc->n_meta;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        uint64_t len = b->buffers[i].catalog == c ? b->buffers[i].len : 0;
        for (uint64_t lo = 0; lo < len; lo += seg) {
            uint64_t hi = lo + seg < len ? lo + seg : len;
            if (push_item(&bc->eng->scratch, &bc->n_meta, i, (uint32_t)lo, (uint32_t)hi, 0) < 0)
                return -ENOMEM;
        }
    }
    uint32_t n = (uint32_t)bc->n_meta - first;
    if (add_range(bc, c, k, 0, first, n, NO_CARRY, walk_cost(bc, c, (uint64_t)seg + g.maxlen)) < 0)
        return -ENOMEM;
    if (n > 0)
        bc->eng->scratch.ranges[bc->n_ranges - 1].factor = true;
    return 0;
}

static int plan_catalog(struct batch_ctx *bc, uint32_t c)
{
    const struct gpu_batch *b = bc->batch;
    uint64_t longest = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        if (b->buffers[i].catalog == c && b->buffers[i].len > longest)
            longest = b->buffers[i].len;
    }
    if (longest == 0)
        return 0;
    uint32_t lit_seg = 0;
    if (plan_lit(bc, c, &lit_seg) < 0)
        return -ENOMEM;
    if (bc->factor_phase) { /* the literal tables are looked up, not run */
        bc->lit_route[c] = false;
        return bc->gates_of[c] ? plan_factor(bc, c) : 0;
    }
    uint32_t max_bounded = 0, n_chained = 0;
    struct catalog_group g;
    for (uint32_t k = 0; k < catalog_group_count(b->catalogs[c]); k++) {
        catalog_group(b->catalogs[c], k, &g);
        if (g.maxlen != CATALOG_UNBOUNDED && g.maxlen > max_bounded && !(g.flags & CAT_GF_FACTOR) &&
            !lit_routed(bc, c, k))
            max_bounded = g.maxlen;
    }
    fit_budget(bc, c, max_bounded, fuse_width(bc, c));
    max_bounded = 0;
    for (uint32_t k = 0; k < catalog_group_count(b->catalogs[c]); k++) {
        catalog_group(b->catalogs[c], k, &g);
        /* the factor group (CAT_GF_FACTOR) reports nothing on the device:
         * its factor ends are found on the host (plan_gates_find) */
        if ((g.flags & CAT_GF_FACTOR) || lit_routed(bc, c, k))
            continue;
        if (!group_bounded(bc, c, &g))
            n_chained++;
        else if (g.maxlen > max_bounded)
            max_bounded = g.maxlen;
    }
    int rc = 0;
    if (max_bounded > 0)
        rc = plan_bounded(bc, c, max_bounded);
    if (rc == 0 && n_chained > 0)
        rc = plan_spec(bc, c);
    if (rc == 1) {
        rc = plan_chained(bc, c, longest);
        bc->n_carry += n_chained * b->n_buffers;
    }
    if (rc == 0 && bc->lit_route[c])
        rc = lit_items(bc, c, lit_seg);
    struct plan_gates pg = {NULL};
    if (rc == 0 && bc->gates_of[c])
        pg.v = bc->gates; /* the factor pass's ends, owned by the batch */
    else if (rc == 0)
        rc = plan_gates_find(bc, c, &pg);
    if (rc == 0)
        gates_index(&pg, b, c, catalog_nfa_count(b->catalogs[c]));
    uint64_t t0 = gpu_now_ns();
    if (rc == 0 && pg.v != NULL)
        plan_runs(bc, c, longest, &pg);
    bc->tel->plan_runs_ns += gpu_now_ns() - t0;
    t0 = gpu_now_ns();
    struct pre_items *pre = rc == 0 ? plan_pre(bc, c, longest, &pg) : NULL;
    bc->tel->plan_pre_ns += gpu_now_ns() - t0;
    for (uint32_t k = 0; k < catalog_nfa_count(b->catalogs[c]) && rc == 0; k++)
        rc = plan_nfa(bc, c, k, longest, &pg, pre != NULL && pre[k].made ? &pre[k] : NULL);
    pre_free(pre, catalog_nfa_count(b->catalogs[c]));
    runs_free(&pg, b->n_buffers);
    free(pg.has);
    if (!bc->gates_of[c])
        plan_gates_finish(&pg, b->n_buffers);
    return rc;
}

/* Whether the planned pass can report no (rule, end) of a buffer twice:
 * only literal-kernel ranges and bounded DFA ranges, whose items own
 * disjoint ends of a buffer, of catalogs whose rules each report under
 * their own index, or (DFA groups only) whose rules that share an id are
 * in one group, where a state has one merged accept entry per report
 * index; the literal kernel matches such rules' strings apart. No
 * speculative, chained, confirmation, bit-NFA or factor range. */
static bool hits_unique(const struct batch_ctx *bc)
{
    const struct gpu_batch *b = bc->batch;
    if (bc->factor_phase || bc->n_spec != 0 || bc->n_carry != 0 || bc->has_confirm)
        return false;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        uint32_t c = b->buffers[i].catalog;
        const struct gpu_lit *t = bc->lit[c];
        if (b->buffers[i].len > 0 &&
            (t == NULL || !(t->own_reports || (t->one_group_reports && !bc->lit_route[c]))))
            return false;
    }
    const struct scan_range *r = bc->eng->scratch.ranges;
    for (size_t k = 0; k < bc->n_ranges; k++) {
        if (r[k].nfa || r[k].confirm || r[k].factor || r[k].carry_base != NO_CARRY ||
            r[k].spec_base != NO_CARRY)
            return false;
    }
    return true;
}

/* Counting tables of all buffers together, in qs words: at most 16 MiB. */
#define COUNT_WORDS_MAX (4u << 20)

/* Bytes of a buffer per word of its counting table, at least (by default):
 * a table is filled, read back and walked at every batch, so one for a
 * 10k-rule catalog (80 KiB) is kept for buffers of 320 KiB or more, which
 * a many-client batch of small scans in mode count is not. */
#define COUNT_BYTES_PER_WORD 16u

/* Batches a catalog's speculative ranges stay on the ring after they lost
 * the counting bet (gpu_engine.spec_lost). */
#define SPEC_LOST_SKIP 16u

void gpu_spec_lost(struct gpu_engine *eng, const struct catalog *cat)
{
    struct spec_lost *e = NULL;
    for (uint32_t k = 0; k < 8 && e == NULL; k++)
        if (eng->spec_lost[k].skip == 0 ||
            memcmp(eng->spec_lost[k].fp, catalog_fingerprint(cat), CATALOG_FP_LEN) == 0)
            e = &eng->spec_lost[k];
    if (e == NULL)
        e = &eng->spec_lost[eng->spec_lost_next++ % 8];
    memcpy(e->fp, catalog_fingerprint(cat), CATALOG_FP_LEN);
    e->skip = SPEC_LOST_SKIP;
}

/* Whether catalog `cat` lost the bet lately: then this batch counts down
 * one of its skips and keeps its speculative ranges on the ring. */
static bool spec_skip(struct gpu_engine *eng, const struct catalog *cat)
{
    for (uint32_t k = 0; k < 8; k++) {
        struct spec_lost *e = &eng->spec_lost[k];
        if (e->skip > 0 && memcmp(e->fp, catalog_fingerprint(cat), CATALOG_FP_LEN) == 0) {
            e->skip--;
            return true;
        }
    }
    return false;
}

/*
 * Counting on the device (docs/gpu.md): gives each buffer in mode count or
 * first a table of (count, ~first end) per rule of its catalog in qs, after
 * the speculative words, and marks the ranges whose hits go there: DFA and
 * bit-NFA ranges (bounded, chained, fused, gated windows, speculative) of
 * catalogs that report a (rule, end) once, whose items own disjoint ends,
 * and the literal kernel's where no two rules share an id. Forward
 * confirmations (`overlap`: an item's walk runs on past its starts, so
 * the piece before it may report its ends again, and the host finishes
 * capped ones) keep the ring, where the finish drops the copies; it adds
 * both (hits.c merge_counts). A speculative
 * range counts on the bet that no segment guessed its state wrong, which
 * read_passes checks (batch.c); a catalog that lost it keeps them on the
 * ring for its next SPEC_LOST_SKIP batches.
 */
static int plan_counts(struct batch_ctx *bc)
{
    const struct gpu_batch *b = bc->batch;
    int32_t opt = bc->eng->opt.count_device;
    if (bc->factor_phase || opt < 0)
        return 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++)
        if (b->buffers[i].mode != SCAN_ALL)
            bytes += b->buffers[i].len;
    if (bytes == 0 || (opt == 0 && bytes < GPU_COUNT_DEVICE_MIN))
        return 0;
    int8_t once[GPU_MAX_BATCH_CATALOGS]; /* gpu_reports_once; -1: not asked yet */
    for (uint32_t c = 0; c < b->n_catalogs; c++)
        once[c] = -1;
    uint32_t at = QS_HEADS + (uint32_t)bc->n_ranges + bc->n_spec;
    uint64_t words = 0;
    bool cats[GPU_MAX_BATCH_CATALOGS] = {false};
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        uint64_t need = 2 * (uint64_t)catalog_rule_count(b->catalogs[gb->catalog]);
        if (gb->mode == SCAN_ALL || gb->len == 0 || words + need > COUNT_WORDS_MAX ||
            (opt == 0 && gb->len < need * COUNT_BYTES_PER_WORD))
            continue;
        const struct gpu_lit *t = bc->lit[gb->catalog];
        if (once[gb->catalog] < 0 && t != NULL) /* cached with its literal tables */
            once[gb->catalog] = t->own_reports ? 2 : t->one_group_reports;
        if (once[gb->catalog] < 0) {
            int rc = gpu_reports_once(b->catalogs[gb->catalog]);
            if (rc < 0)
                return rc;
            once[gb->catalog] = (int8_t)rc;
        }
        if (once[gb->catalog] == 0)
            continue;
        bc->eng->scratch.meta[i * 4 + 2] = at + (uint32_t)words;
        words += need;
        cats[gb->catalog] = true;
    }
    bc->n_count = (uint32_t)words;
    bool spec[GPU_MAX_BATCH_CATALOGS] = {false}; /* its speculative ranges count */
    for (uint32_t c = 0; c < b->n_catalogs; c++)
        spec[c] = cats[c] && !spec_skip(bc->eng, b->catalogs[c]);
    struct scan_range *r = bc->eng->scratch.ranges;
    for (size_t k = 0; k < bc->n_ranges; k++)
        r[k].counted = cats[r[k].cat] && (!r[k].lit || once[r[k].cat] == 2) && !r[k].overlap &&
                       !r[k].factor && (r[k].spec_base == NO_CARRY || spec[r[k].cat]);
    return 0;
}

/* Lays the buffers out in the haystack (16-byte aligned), writes the buffer
 * table and the work items, and picks each range's pipeline shape. */
int gpu_plan_batch(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    const struct gpu_batch *b = bc->batch;
    struct batch_scratch *s = &eng->scratch;
    if (gpu_grow_array((void **)&s->offs, &s->offs_cap, (size_t)b->n_buffers + 1, 8) < 0 ||
        gpu_grow_array((void **)&s->meta, &s->meta_cap, b->n_buffers, 16) < 0)
        return vks_error_set(err, -ENOMEM, "out of memory planning a batch of %u buffers",
                             b->n_buffers);
    uint64_t off = 0, max_len = 0;
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        uint64_t len = b->buffers[i].len;
        s->offs[i] = off;
        uint32_t *w = &s->meta[i * 4];
        w[0] = (uint32_t)off;
        w[1] = (uint32_t)len;
        w[2] = NO_CARRY; /* its count table (plan_counts) */
        w[3] = 0;
        if (len > max_len)
            max_len = len;
        if (len > 0xfffffff0u || off + ALIGN16(len) > 0xfffffff0u)
            return vks_error_set(err, -E2BIG,
                                 "batch holds %llu bytes by buffer %u, over the 4 GiB a batch "
                                 "can index: split the batch",
                                 (unsigned long long)(off + len), i);
        off += ALIGN16(len);
    }
    s->offs[b->n_buffers] = off;
    bc->hay_bytes = off;
    bc->n_meta = b->n_buffers;
    /* planned afresh: the factor pass's plan came before this one */
    bc->n_ranges = 0;
    bc->rounds = 0;
    bc->n_carry = 0;
    bc->n_spec = 0;
    bc->n_count = 0;
    bc->items_total = 0;
    bc->workers = 0;
    bc->has_confirm = false;
    get_plan(eng, b, off, max_len, bc);
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        if (plan_catalog(bc, c) < 0)
            return vks_error_set(err, -ENOMEM, "out of memory planning work items");
    }
    bc->hits_unique = hits_unique(bc);
    return plan_counts(bc) < 0 ? vks_error_set(err, -ENOMEM, "out of memory planning a batch") : 0;
}

/* Shared-memory words for a group's hot transition rows: u16 entries
 * (two per word) when its states fit in 16 bits, rounded up to 1024 words
 * so that few pipeline shapes exist. */
static uint32_t smem_words_for(const struct launch_plan *p, const struct catalog_group *g)
{
    uint64_t entries = (uint64_t)g->n_states * g->n_classes;
    uint64_t words = g->n_states <= 65536 ? (entries + 1) / 2 : entries;
    words = (words + 1023u) & ~(uint64_t)1023u;
    return words < p->smem_cap ? (uint32_t)words : p->smem_cap;
}

/* MAX_WORDS of the bit-NFA pipeline for engine group `group`: a power of
 * two from 4, so that few pipeline shapes exist. */
static uint32_t nfa_words_for(const struct catalog *cat, uint32_t group)
{
    struct catalog_nfa g;
    catalog_nfa(cat, group - catalog_group_count(cat), &g);
    uint32_t w = 4;
    while (w < g.n_words)
        w *= 2;
    return w;
}

/* Chooses each range's pipeline and worker count. */
int gpu_pick_pipelines(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    const struct launch_plan *p = &bc->plan;
    for (size_t r = 0; r < bc->n_ranges; r++) {
        struct scan_range *sr = &eng->scratch.ranges[r];
        struct catalog_group g = {0};
        uint32_t nfa_words = 0;
        if (sr->nfa)
            nfa_words = nfa_words_for(bc->batch->catalogs[sr->cat], sr->group);
        else if (!sr->lit && !sr->fuse)
            catalog_group(bc->batch->catalogs[sr->cat], sr->group, &g);
        if (!sr->fuse) /* fused ranges: planned with their groups' shares (fuse_ranges) */
            sr->smem_words = sr->nfa   ? 0
                             : sr->lit ? bc->lit[sr->cat]->filter_words
                                       : smem_words_for(p, &g);
        uint32_t fill = (256 * (sr->fuse ? sr->fuse : 1) + sr->smem_words) / p->wg + 4 + sr->fuse;
        if (p->step_budget != NO_BUDGET && fill + sr->max_cost + 8 > p->step_budget)
            return vks_error_set(err, -E2BIG,
                                 "a work item needs %u loop iterations, over the device's "
                                 "budget of %u: lower segment_bytes or chain_bytes",
                                 sr->max_cost, p->step_budget);
        uint64_t wgs = (sr->n_items + p->wg - 1) / p->wg;
        if (wgs > p->max_workgroups)
            wgs = p->max_workgroups;
        sr->workgroups = (uint32_t)wgs;
        if (sr->workgroups > bc->tel->workgroups)
            bc->tel->workgroups = sr->workgroups;
        bc->workers += wgs * p->wg;
        struct pipe_key key = {.writer = sr->nfa || sr->lit ? 0 : eng->writer,
                               .wg = p->wg,
                               .smem_words = sr->smem_words,
                               .step_budget = p->step_budget,
                               .nfa_words = nfa_words,
                               .lit = sr->lit,
                               .fuse = sr->fuse};
        bool hit;
        int rc = gpu_pipeline_get(eng, &key, &sr->pipe, &hit, err);
        if (rc < 0)
            return rc;
        if (hit)
            bc->tel->pipeline_cache_hits++;
        else
            bc->tel->pipeline_compiles++;
    }
    return 0;
}
