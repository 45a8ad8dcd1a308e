/*
 * The literal kernel's tables (lit.h), built from a catalog's rule sources.
 *
 * Every string's key is its first K bytes (K = min(8, shortest string),
 * at least GPU_LIT_MIN_KEY), each byte ORed with `fold` (0x20 when some
 * string has a caseless letter, so both cases of a letter give one key).
 * The image the kernel reads, in u32 words:
 *
 *   filter  FILTER words: a blocked Bloom filter of the keys. A key's hash
 *           `a` (mix below) picks one word (its top bits) and 4 bits in it
 *           (from a * FILTER_MUL); the kernel loads that word from shared
 *           memory at every position and looks further only when all 4
 *           bits are set.
 *   slots   open addressing by `a & slot_mask`, linear probing, at most
 *           half full: uvec4(key lo, key hi, first string, strings); 0
 *           strings marks an empty slot.
 *   lits    uvec4(byte offset, length, rule, group) per string, sorted by
 *           key, so a slot's strings are one run.
 *   bytes   the strings, packed 4 a word (caseless letters lowercase).
 *   masks   per byte 0x20 where the letter is caseless, else 0: a data
 *           byte t matches string byte p when (t | mask) == p.
 *
 * shaders/scan_lit.comp holds the same hash, key and roll; change both.
 */
#include "lit.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpuplan.h"
#include "rules.h"

#define MIX_A      0x85ebca77u
#define MIX_B      0x9e3779b1u
#define MIX_C      0x7feb352du
#define FILTER_MUL 0x846ca68bu

/* The key's hash; scan_lit.comp's mix(). */
static uint32_t mix(uint32_t lo, uint32_t hi)
{
    uint32_t a = (lo ^ (hi * MIX_A)) * MIX_B;
    a ^= a >> 16;
    a *= MIX_C;
    a ^= a >> 15;
    return a;
}

static uint32_t filter_bits(uint32_t a)
{
    uint32_t b = a * FILTER_MUL;
    return 1u << (b >> 27) | 1u << ((b >> 22) & 31u) | 1u << ((b >> 17) & 31u) |
           1u << ((b >> 12) & 31u);
}

/* ---- building ---------------------------------------------------------- */

struct entry {
    uint32_t off, len, rule, group;
    uint32_t klo, khi;
};

struct build {
    struct entry *v;
    size_t n, cap;
    struct cpuplan_string pool;
};

/* Appends string s to the pool (whose offsets must stay u32). */
static int pool_append(struct cpuplan_string *pool, const struct cpuplan_string *s)
{
    if (s->n == 0) /* an empty piece: the pool may not exist yet */
        return 0;
    if (pool->n > UINT32_MAX / 2 - s->n)
        return -ENOMEM;
    if (pool->n + s->n > pool->cap) {
        uint32_t cap = pool->cap ? pool->cap : 4096;
        while (cap < pool->n + s->n)
            cap *= 2;
        uint8_t *nb = realloc(pool->b, cap);
        if (nb != NULL)
            pool->b = nb;
        uint8_t *nm = nb != NULL ? realloc(pool->m, cap) : NULL;
        if (nm == NULL)
            return -ENOMEM;
        pool->m = nm;
        pool->cap = cap;
    }
    memcpy(pool->b + pool->n, s->b, s->n);
    memcpy(pool->m + pool->n, s->m, s->n);
    pool->n += s->n;
    return 0;
}

/* Rule r's string into b, or its group unmarked in `route`. */
static int add_rule(const struct catalog *cat, uint32_t r, uint8_t *route, struct build *b)
{
    struct catalog_rule cr;
    catalog_rule(cat, r, &cr);
    struct cpuplan_string s = {0};
    bool good = cpuplan_rule_string(cat, r, GPU_LIT_MAX_LEN, &s) == 1 && s.n >= GPU_LIT_MIN_KEY;
    int rc = 0;
    if (good && b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        struct entry *v = realloc(b->v, cap * sizeof(*v));
        rc = v != NULL ? 0 : -ENOMEM;
        if (v != NULL) {
            b->v = v;
            b->cap = cap;
        }
    }
    if (good && rc == 0) {
        b->v[b->n] = (struct entry){.off = b->pool.n, .len = s.n, .rule = r, .group = cr.group};
        rc = pool_append(&b->pool, &s);
        b->n += rc == 0;
    }
    if (!good)
        route[cr.group] = 0;
    free(s.b);
    free(s.m);
    return rc;
}

/* One thread's share of the rules: [lo, hi) of the routed groups, parsed
 * into its own build, with its own copy of `route` (groups it found not
 * literal cleared). */
struct collect_job {
    const struct catalog *cat;
    uint32_t lo, hi, n_dfa;
    uint8_t *route;
    struct build b;
    int rc;
};

static void *collect_run(void *arg)
{
    struct collect_job *j = arg;
    for (uint32_t r = j->lo; j->rc == 0 && r < j->hi; r++) {
        struct catalog_rule cr;
        catalog_rule(j->cat, r, &cr);
        if (cr.group < j->n_dfa && j->route[cr.group])
            j->rc = add_rule(j->cat, r, j->route, &j->b);
    }
    return NULL;
}

/* Appends job j's strings to b (rule order is kept: shares are in order),
 * and clears in `route` the groups it cleared. */
static int collect_join(struct collect_job *j, uint8_t *route, struct build *b)
{
    for (uint32_t g = 0; g < j->n_dfa; g++)
        route[g] &= j->route[g];
    if (b->n + j->b.n > b->cap) {
        size_t cap = b->n + j->b.n;
        struct entry *v = realloc(b->v, cap * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        b->v = v;
        b->cap = cap;
    }
    uint32_t base = b->pool.n;
    int rc = pool_append(&b->pool, &j->b.pool);
    for (size_t i = 0; rc == 0 && i < j->b.n; i++) {
        b->v[b->n] = j->b.v[i];
        b->v[b->n++].off += base;
    }
    return rc;
}

/* Threads that parse a catalog's rules (43,029 rules of dict-10: 0.19 s
 * on one core), each given at least COLLECT_RULES of them. */
#define COLLECT_THREADS 16u
#define COLLECT_RULES   1024u

/* Every routed group's strings into b, in rule order, parsed on up to
 * COLLECT_THREADS threads (this one included; a share whose thread does
 * not start runs here); `route` loses the groups that are not literal. */
static int collect(const struct catalog *cat, uint8_t *route, uint32_t n_dfa, struct build *b)
{
    uint32_t nr = catalog_rule_count(cat);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n = cores < 1 ? 1 : cores > (long)COLLECT_THREADS ? COLLECT_THREADS : (uint32_t)cores;
    n = n < nr / COLLECT_RULES ? n : nr / COLLECT_RULES;
    n = n ? n : 1;
    struct collect_job *jobs = calloc(n, sizeof(*jobs));
    pthread_t th[COLLECT_THREADS];
    bool started[COLLECT_THREADS] = {false};
    if (jobs == NULL)
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++) {
        jobs[k] = (struct collect_job){.cat = cat,
                                       .lo = (uint32_t)((uint64_t)nr * k / n),
                                       .hi = (uint32_t)((uint64_t)nr * (k + 1) / n),
                                       .n_dfa = n_dfa,
                                       .route = malloc(n_dfa + 1)};
        jobs[k].rc = jobs[k].route != NULL ? 0 : -ENOMEM;
        if (jobs[k].route != NULL)
            memcpy(jobs[k].route, route, n_dfa);
        if (k > 0 && jobs[k].rc == 0)
            started[k] = pthread_create(&th[k], NULL, collect_run, &jobs[k]) == 0;
    }
    collect_run(&jobs[0]);
    int rc = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (started[k])
            pthread_join(th[k], NULL);
        else if (k > 0)
            collect_run(&jobs[k]);
        rc = rc != 0 ? rc : jobs[k].rc != 0 ? jobs[k].rc : collect_join(&jobs[k], route, b);
        free(jobs[k].route);
        free(jobs[k].b.v);
        free(jobs[k].b.pool.b);
        free(jobs[k].b.pool.m);
    }
    free(jobs);
    return rc;
}

static int cmp_entry(const void *x, const void *y)
{
    const struct entry *a = x, *b = y;
    if (a->khi != b->khi)
        return a->khi < b->khi ? -1 : 1;
    if (a->klo != b->klo)
        return a->klo < b->klo ? -1 : 1;
    return a->rule < b->rule ? -1 : a->rule > b->rule;
}

/* The key of the K bytes at p, rolled in as the kernel rolls data bytes:
 * the last 4 in lo (the latest in the low byte), the K - 4 before in hi. */
static void key_of(const uint8_t *p, uint32_t K, uint32_t fold, uint32_t *lo, uint32_t *hi)
{
    uint32_t l = 0, h = 0;
    for (uint32_t i = 0; i < K; i++) {
        h = h << 8 | l >> 24;
        l = l << 8 | (p[i] | fold);
    }
    *lo = l;
    *hi = K > 4 ? h & (0xffffffffu >> (8 * (8 - K))) : 0;
}

/* Keeps the entries of routed groups; counts the groups. */
static void keep_routed(struct gpu_lit *t, struct build *b)
{
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++)
        if (t->route[b->v[i].group])
            b->v[k++] = b->v[i];
    b->n = k;
    t->n_groups = 0;
    for (uint32_t g = 0; g < t->n_dfa; g++)
        t->n_groups += t->route[g];
    if (b->n == 0) {
        memset(t->route, 0, t->n_dfa);
        t->n_groups = 0;
    }
}

static uint32_t log2_u32(uint32_t v)
{
    uint32_t r = 0;
    while (v >>= 1)
        r++;
    return r;
}

/* Sets each distinct key's filter bits and slot; returns the costliest
 * slot's strings (their lengths plus 2 each: the kernel's loop count). */
static uint32_t place_keys(struct gpu_lit *t, const struct build *b)
{
    uint32_t *w = t->words, wshift = 32 - log2_u32(t->filter_words), worst = 0;
    for (size_t i = 0; i < b->n;) {
        size_t j = i, cost = 0;
        while (j < b->n && b->v[j].klo == b->v[i].klo && b->v[j].khi == b->v[i].khi)
            cost += b->v[j++].len + 2;
        uint32_t a = mix(b->v[i].klo, b->v[i].khi), s = a & t->slot_mask;
        w[a >> wshift] |= filter_bits(a);
        while (w[t->slots + 4 * s + 3] != 0)
            s = (s + 1) & t->slot_mask;
        uint32_t *sl = &w[t->slots + 4 * s];
        sl[0] = b->v[i].klo;
        sl[1] = b->v[i].khi;
        sl[2] = (uint32_t)i;
        sl[3] = (uint32_t)(j - i);
        worst = cost > worst ? (uint32_t)cost : worst;
        i = j;
    }
    return worst;
}

/* The strings' records, bytes and masks, in key order. */
static void place_strings(struct gpu_lit *t, const struct build *b)
{
    uint32_t *w = t->words, off = 0;
    uint8_t *bytes = (uint8_t *)(w + t->bytes), *masks = (uint8_t *)(w + t->masks);
    for (size_t i = 0; i < b->n; i++) {
        const struct entry *e = &b->v[i];
        uint32_t *l = &w[t->lits + 4 * i];
        l[0] = off;
        l[1] = e->len;
        l[2] = e->rule;
        l[3] = e->group;
        memcpy(bytes + off, b->pool.b + e->off, e->len);
        memcpy(masks + off, b->pool.m + e->off, e->len);
        off += e->len;
    }
}

/* The longest probe: the longest run of full slots, plus the empty one
 * that ends it (the table is at most half full). */
static uint32_t longest_probe(const struct gpu_lit *t)
{
    uint32_t run = 0, longest = 0;
    for (uint32_t s = 0; s < 2 * (t->slot_mask + 1); s++) {
        run = t->words[t->slots + 4 * (s & t->slot_mask) + 3] != 0 ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    return longest + 1;
}

/* Key length and fold from the strings, then the image: filter, slots,
 * strings. Sorts b's entries by key. */
static int make_image(struct gpu_lit *t, struct build *b, uint32_t filter_words)
{
    t->min_len = UINT32_MAX;
    t->maxlen = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < b->n; i++) {
        const struct entry *e = &b->v[i];
        t->min_len = e->len < t->min_len ? e->len : t->min_len;
        t->maxlen = e->len > t->maxlen ? e->len : t->maxlen;
        for (uint32_t k = 0; k < e->len; k++)
            t->fold |= b->pool.m[e->off + k];
        total += e->len;
    }
    t->klen = t->min_len < 8 ? t->min_len : 8;
    for (size_t i = 0; i < b->n; i++)
        key_of(b->pool.b + b->v[i].off, t->klen, t->fold, &b->v[i].klo, &b->v[i].khi);
    qsort(b->v, b->n, sizeof(*b->v), cmp_entry);
    uint32_t distinct = 0;
    for (size_t i = 0; i < b->n; i++)
        distinct += i == 0 || b->v[i].klo != b->v[i - 1].klo || b->v[i].khi != b->v[i - 1].khi;
    uint32_t cap = 16;
    while (cap < 2 * distinct)
        cap *= 2;
    uint64_t str_words = (total + 3) / 4;
    uint64_t n_words = filter_words + 4ull * cap + 4ull * b->n + 2 * str_words;
    if (n_words > UINT32_MAX / 8)
        return -ENOMEM;
    t->n_lits = (uint32_t)b->n;
    t->filter_words = filter_words;
    t->slots = filter_words;
    t->slot_mask = cap - 1;
    t->lits = t->slots + 4 * cap;
    t->bytes = t->lits + 4 * t->n_lits;
    t->masks = t->bytes + (uint32_t)str_words;
    t->n_words = (uint32_t)n_words;
    t->words = calloc(n_words, 4);
    if (t->words == NULL)
        return -ENOMEM;
    uint32_t worst = place_keys(t, b);
    place_strings(t, b);
    /* per position: the candidate loop, the key, the probes, the strings */
    t->pos_cost = 2 + t->klen + longest_probe(t) + worst;
    return 0;
}

/* ---- report indexes ---------------------------------------------------- */

/* Rules that share an id report as one, under the index of the first of
 * them (docs/catalog.md, catalog_report_indexes), as their groups' accept
 * entries say: each string's `rule` becomes that index. */
static int map_report_indexes(const struct catalog *cat, struct entry *v, size_t n)
{
    uint32_t nr = catalog_rule_count(cat);
    uint32_t *rep = malloc((nr ? nr : 1) * sizeof(*rep));
    int rc = rep != NULL ? catalog_report_indexes(cat, rep) : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        v[i].rule = rep[v[i].rule];
    free(rep);
    return rc;
}

int gpu_reports_once(const struct catalog *cat)
{
    uint32_t nr = catalog_rule_count(cat), n_dfa = catalog_group_count(cat);
    uint32_t *rep = malloc((nr ? nr : 1) * sizeof(*rep));
    if (rep == NULL || catalog_report_indexes(cat, rep) < 0) {
        free(rep);
        return -ENOMEM;
    }
    int once = 2;
    for (uint32_t r = 0; r < nr && once > 0; r++) {
        if (rep[r] == r)
            continue;
        struct catalog_rule a, b;
        catalog_rule(cat, r, &a);
        catalog_rule(cat, rep[r], &b);
        once = a.group == b.group && a.group < n_dfa ? 1 : 0;
    }
    free(rep);
    return once;
}

/* The literal kernel's strings need every rule under its own index; the
 * counting finish needs no DFA walk to report a (rule, end) twice. */
static int own_reports(const struct catalog *cat, struct gpu_lit *t)
{
    int once = gpu_reports_once(cat);
    t->own_reports = once == 2;
    t->one_group_reports = once >= 1;
    return once < 0 ? once : 0;
}

static void lit_free(struct gpu_lit *t)
{
    if (t == NULL)
        return;
    free(t->route);
    free(t->words);
    free(t);
}

/* Builds the tables of `cat`; an image over `range` bytes (the device's
 * storage-buffer range) is dropped, and its groups keep their DFAs. */
static int lit_build(const struct catalog *cat, uint32_t filter_words, uint64_t range,
                     struct gpu_lit **out)
{
    struct gpu_lit *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    memcpy(t->fp, catalog_fingerprint(cat), CATALOG_FP_LEN);
    t->n_dfa = catalog_group_count(cat);
    t->route = calloc(t->n_dfa + 1, 1);
    struct build b = {0};
    int rc = t->route != NULL ? 0 : -ENOMEM;
    for (uint32_t g = 0; rc == 0 && g < t->n_dfa; g++) {
        struct catalog_group cg;
        catalog_group(cat, g, &cg);
        /* no flag at all (no assertion, not a factor group), or a literal
         * group (no DFA: this kernel is its only scanner) */
        t->route[g] = (cg.flags == 0 || cg.flags == CAT_GF_LITERAL) && cg.n_rules > 0;
        t->literal |= cg.flags == CAT_GF_LITERAL;
    }
    if (rc == 0)
        rc = own_reports(cat, t);
    if (rc == 0)
        rc = collect(cat, t->route, t->n_dfa, &b);
    if (rc == 0)
        keep_routed(t, &b);
    if (rc == 0 && t->n_groups > 0)
        rc = map_report_indexes(cat, b.v, b.n);
    if (rc == 0 && t->n_groups > 0)
        rc = make_image(t, &b, filter_words);
    if (rc == 0 && t->n_groups > 0 && (uint64_t)t->n_words * 4 > range) {
        memset(t->route, 0, t->n_dfa);
        t->n_groups = 0;
        t->literal = false; /* plan_lit refuses the catalog then */
        free(t->words);
        t->words = NULL;
        t->n_words = 0;
    }
    free(b.v);
    free(b.pool.b);
    free(b.pool.m);
    if (rc != 0) {
        lit_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int gpu_lit_get(struct gpu_engine *eng, const struct catalog *cat, uint32_t filter_words,
                struct gpu_lit **out)
{
    const uint8_t *fp = catalog_fingerprint(cat);
    uint32_t victim = 0;
    eng->tick++;
    for (uint32_t i = 0; i < GPU_LIT_CACHE; i++) {
        struct gpu_lit *t = eng->lits[i];
        if (t != NULL && memcmp(t->fp, fp, CATALOG_FP_LEN) == 0 &&
            (t->n_groups == 0 || t->filter_words == filter_words)) {
            t->last_use = eng->tick;
            *out = t;
            return 0;
        }
        if (eng->lits[victim] != NULL && (t == NULL || t->last_use < eng->lits[victim]->last_use))
            victim = i;
    }
    struct gpu_lit *t;
    int rc = lit_build(cat, filter_words, eng->info.max_storage_range, &t);
    if (rc != 0)
        return rc;
    lit_free(eng->lits[victim]);
    eng->lits[victim] = t;
    t->last_use = eng->tick;
    *out = t;
    return 0;
}

void gpu_lit_cache_finish(struct gpu_engine *eng)
{
    for (uint32_t i = 0; i < GPU_LIT_CACHE; i++) {
        lit_free(eng->lits[i]);
        eng->lits[i] = NULL;
    }
}

/* ---- device copy ------------------------------------------------------- */

static void flush_mapped(struct gpu_engine *eng, const struct gbuf *b)
{
    if (b->coherent)
        return;
    VkMappedMemoryRange mr = {
        .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE,
        .memory = b->mem,
        .size = VK_WHOLE_SIZE,
    };
    vkFlushMappedMemoryRanges(eng->dev, 1, &mr);
}

/* One copy from `src` into `dst`, submitted and waited for. */
static int copy_now(struct gpu_engine *eng, const struct gbuf *src, const struct gbuf *dst,
                    VkDeviceSize size, struct vks_error *err)
{
    VkCommandBufferAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = eng->cpool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkResult r = vkAllocateCommandBuffers(eng->dev, &ai, &cb);
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (r == VK_SUCCESS)
        r = vkCreateFence(eng->dev, &fci, NULL, &fence);
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    if (r == VK_SUCCESS)
        r = vkBeginCommandBuffer(cb, &bi);
    if (r == VK_SUCCESS) {
        VkBufferCopy c = {.size = size};
        vkCmdCopyBuffer(cb, src->buf, dst->buf, 1, &c);
        r = vkEndCommandBuffer(cb);
    }
    VkSubmitInfo si = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
        .commandBufferCount = 1,
        .pCommandBuffers = &cb,
    };
    bool submitted = false;
    if (r == VK_SUCCESS) {
        r = vkQueueSubmit(eng->queue, 1, &si, fence);
        submitted = r == VK_SUCCESS;
    }
    if (r == VK_SUCCESS)
        r = vkWaitForFences(eng->dev, 1, &fence, VK_TRUE, eng->timeout_ns);
    int rc = r == VK_SUCCESS ? 0 : gpu_vk_error(r, "uploading literal tables", err);
    if (r != VK_SUCCESS && submitted) {
        /* the copy may still read the staging buffer the caller frees */
        eng->broken = true;
        vkQueueWaitIdle(eng->queue);
    }
    if (fence != VK_NULL_HANDLE)
        vkDestroyFence(eng->dev, fence, NULL);
    if (cb != VK_NULL_HANDLE)
        vkFreeCommandBuffers(eng->dev, eng->cpool, 1, &cb);
    return rc;
}

int gpu_lit_upload(struct gpu_engine *eng, struct resident_catalog *rc, const struct gpu_lit *lit,
                   struct vks_error *err)
{
    const VkBufferUsageFlags use =
        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VkDeviceSize size = (VkDeviceSize)lit->n_words * 4;
    int r = gbuf_create(eng, &rc->lit, size, use, GBUF_DEVICE, err);
    if (r < 0)
        return r;
    /* staged_upload: the discrete devices' path also where memory maps */
    if (rc->lit.map != NULL && !eng->opt.staged_upload) {
        memcpy(rc->lit.map, lit->words, size);
        flush_mapped(eng, &rc->lit);
        return 0;
    }
    struct gbuf st = {0};
    r = gbuf_create(eng, &st, size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, GBUF_STAGING, err);
    if (r == 0) {
        memcpy(st.map, lit->words, size);
        flush_mapped(eng, &st);
        r = copy_now(eng, &st, &rc->lit, size, err);
    }
    gbuf_destroy(eng, &st);
    return r;
}

void gpu_lit_push_tables(struct batch_ctx *bc, uint32_t c)
{
    const struct gpu_lit *t = bc->lit[c];
    bc->lit_pc[c] = (struct lit_push){
        .slots = t->slots,
        .slot_mask = t->slot_mask,
        .lits = t->lits,
        .bytes = t->bytes,
        .masks = t->masks,
        .klen = t->klen,
        .fold = t->fold,
        .maxlen = t->maxlen,
        .hi_mask = t->klen > 4 ? 0xffffffffu >> (8 * (8 - t->klen)) : 0,
        .wshift = 32 - log2_u32(t->filter_words),
    };
}

void gpu_lit_push(const struct batch_ctx *bc, const struct scan_range *sr, uint32_t head,
                  struct lit_push *pc)
{
    *pc = bc->lit_pc[sr->cat];
    pc->items = sr->items;
    pc->n_items = sr->n_items;
    pc->head = head;
    pc->bufs = 0;
    pc->max_cost = sr->max_cost;
    pc->hit_cap = (uint32_t)(bc->eng->hits.size / 16);
    pc->count = sr->counted;
}
