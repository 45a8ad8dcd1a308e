/*
 * One batch: plan (launch policy, segments, work items), check limits, make
 * catalogs resident, upload, dispatch, read back, finish hits. docs/gpu.md
 * walks through it; the kernel is shaders/scan.comp.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lit.h"

/* The kernel indexes the catalog with these offsets (scan.comp gets them as
 * push constants from here); the layout must not move under it. */
_Static_assert(CAT_GROUP_WORDS == 16, "catalog group entry changed size");
_Static_assert(CAT_G_TRANS == 9 && CAT_G_ACCEPTS == 11, "catalog group layout changed");

#define ALIGN16(x) (((x) + 15u) & ~(uint64_t)15u)
#define MIB        (1u << 20)
#define PIECE      (64u << 10) /* least bytes an upload thread fills of a chunk */

static const VkBufferUsageFlags USE_STORAGE_DST =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

/* ---- validation and planning ------------------------------------------ */

static int validate(const struct gpu_engine *eng, const struct gpu_batch *b, struct vks_error *err)
{
    if (eng->broken)
        return vks_error_set(err, -ENODEV,
                             "the engine's last batch timed out or lost the device: destroy "
                             "and re-create the engine");
    if (b->n_buffers > 0 && b->buffers == NULL)
        return vks_error_set(err, -EINVAL, "batch has %u buffers but no buffer array",
                             b->n_buffers);
    if (b->n_catalogs == 0 || b->n_catalogs > GPU_MAX_BATCH_CATALOGS || b->catalogs == NULL)
        return vks_error_set(err, -EINVAL,
                             "batch names %u catalogs: a batch needs 1 to %u; split it",
                             b->n_catalogs, GPU_MAX_BATCH_CATALOGS);
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        if (b->catalogs[c] == NULL)
            return vks_error_set(err, -EINVAL, "batch catalog %u is NULL", c);
    }
    if (b->n_buffers >= (1u << 28))
        return vks_error_set(err, -E2BIG, "batch has %u buffers, over the limit of %u: split it",
                             b->n_buffers, 1u << 28);
    for (uint32_t i = 0; i < b->n_buffers; i++) {
        const struct gpu_buffer *gb = &b->buffers[i];
        if (gb->catalog >= b->n_catalogs)
            return vks_error_set(err, -EINVAL, "buffer %u names catalog %u of %u", i, gb->catalog,
                                 b->n_catalogs);
        if ((unsigned)gb->mode > SCAN_COUNT)
            return vks_error_set(err, -EINVAL, "buffer %u has unknown report mode %d", i,
                                 (int)gb->mode);
        if (gb->len > 0 && gb->data == NULL && gb->read == NULL)
            return vks_error_set(err, -EINVAL, "buffer %u has %zu bytes but no data", i, gb->len);
        if (gb->len > 0 && gb->data == NULL && eng->opt.factor_pass < 0 &&
            gpu_factor_group(b->catalogs[gb->catalog]) != UINT32_MAX)
            return vks_error_set(err, -EINVAL,
                                 "buffer %u is read by callback, but its catalog's factor ends "
                                 "are found on the host (factor_pass -1), which needs its bytes: "
                                 "give them, or let the device find them",
                                 i);
    }
    return 0;
}

/* ---- limits, residency ------------------------------------------------- */

static int find_resident(const struct gpu_engine *eng, const struct catalog *cat)
{
    const uint8_t *fp = catalog_fingerprint(cat);
    for (uint32_t i = 0; i < GPU_MAX_RESIDENT_CATALOGS; i++) {
        if (eng->cats[i].used && memcmp(eng->cats[i].fp, fp, CATALOG_FP_LEN) == 0)
            return (int)i;
    }
    return -1;
}

static bool slot_in_batch(const struct batch_ctx *bc, int slot)
{
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        if (bc->cat_slot[c] == slot)
            return true;
    }
    return false;
}

static void evict(struct gpu_engine *eng, uint32_t slot)
{
    gbuf_destroy(eng, &eng->cats[slot].buf);
    gbuf_destroy(eng, &eng->cats[slot].lit);
    memset(&eng->cats[slot], 0, sizeof(eng->cats[slot]));
    eng->n_cats--;
}

bool gpu_engine_forget(struct gpu_engine *eng, const uint8_t fp[CATALOG_FP_LEN])
{
    for (uint32_t i = 0; i < GPU_MAX_RESIDENT_CATALOGS; i++) {
        struct resident_catalog *rc = &eng->cats[i];
        if (!rc->used || memcmp(rc->fp, fp, CATALOG_FP_LEN) != 0)
            continue;
        /* A batch in flight scans it: freed at its collect. After a timeout
         * the device may still read it: gpu_engine_destroy frees it. */
        if (rc->pins > 0 || eng->broken)
            rc->forget = true;
        else
            evict(eng, i);
        return true;
    }
    return false;
}

/* Evicts the least recently used catalog that neither this batch nor one
 * in flight uses. */
static bool evict_one(struct batch_ctx *bc)
{
    struct gpu_engine *eng = bc->eng;
    int victim = -1;
    for (uint32_t i = 0; i < GPU_MAX_RESIDENT_CATALOGS; i++) {
        const struct resident_catalog *rc = &eng->cats[i];
        if (!rc->used || rc->pins > 0 || slot_in_batch(bc, (int)i))
            continue;
        if (victim < 0 || rc->last_use < eng->cats[victim].last_use)
            victim = (int)i;
    }
    if (victim < 0)
        return false;
    evict(eng, (uint32_t)victim);
    bc->tel->catalog_evictions++;
    return true;
}

/* Device bytes a device-local buffer grows by to hold `size`. */
/* Queue-state words: the fixed ones, a claim head per range, the
 * speculative ranges' (state at lo, state at hi) per item, then the
 * buffers' count tables (gpu/plan.c plan_counts). */
static uint64_t qs_words(const struct batch_ctx *bc)
{
    return QS_HEADS + bc->n_ranges + bc->n_spec + bc->n_count;
}

static uint64_t need_size(const struct gbuf *b, uint64_t size)
{
    return (uint64_t)gbuf_grow_size(b->size, size) - b->size;
}

/* Hits a pass copies back in its own command buffer, at least (copy_hits). */
#define HIT_COPY_MIN 4096u

/* Initial size of a frame's hit ring. */
static uint64_t hit_ring_bytes(const struct gpu_engine *eng)
{
    return (uint64_t)(eng->opt.hit_capacity ? eng->opt.hit_capacity : 65536) * 16;
}

/* Device bytes the batch cannot free: all but the catalogs it may evict. */
static uint64_t held_bytes(const struct batch_ctx *bc)
{
    const struct gpu_engine *eng = bc->eng;
    uint64_t evictable = 0;
    for (uint32_t i = 0; i < GPU_MAX_RESIDENT_CATALOGS; i++) {
        const struct resident_catalog *rc = &eng->cats[i];
        if (rc->used && rc->pins == 0 && !slot_in_batch(bc, (int)i))
            evictable += rc->buf.alloc;
    }
    return eng->device_bytes - evictable;
}

/* Frees the buffers of the frames not in flight (the one being filled has
 * its buffers in the engine's fields, not in its frame): a batch that
 * needs their room gets it, and they are made again at their next use. */
static void trim_idle_frames(struct gpu_engine *eng)
{
    for (uint32_t i = 0; i < eng->n_frames; i++) {
        struct gpu_frame *fr = &eng->frames[i];
        if (fr->busy || fr == eng->begun) /* begun: its upload threads fill it */
            continue;
        struct gbuf *bufs[] = {&fr->hay,     &fr->staging, &fr->meta,  &fr->qs,
                               &fr->qs_host, &fr->hits,    &fr->carry, &fr->hits_host};
        for (size_t k = 0; k < sizeof(bufs) / sizeof(bufs[0]); k++)
            gbuf_destroy(eng, bufs[k]);
    }
}

/* Device bytes this frame's buffers must grow by for batch bc (catalogs
 * not counted). */
static uint64_t grow_needed(const struct batch_ctx *bc, uint64_t meta_bytes)
{
    const struct gpu_engine *eng = bc->eng;
    return need_size(&eng->hay, bc->hay_bytes) + need_size(&eng->meta, meta_bytes) +
           need_size(&eng->carry, (uint64_t)bc->n_carry * 4) +
           need_size(&eng->qs, qs_words(bc) * 4) + need_size(&eng->hits, hit_ring_bytes(eng));
}

/* The current frame's hit ring and its readback copy, when a hit-dense
 * batch grew them past the initial ring: freed, so that their bytes count
 * against the budget no longer (the next batch reserves what it needs;
 * an overflow re-runs grow it again). A scan split into slices under a
 * small budget (daemon/engine_gpu.c) otherwise found the first slice's
 * ring held, and every later slice over the budget. */
static void trim_ring(struct gpu_engine *eng)
{
    if (eng->hits.buf != VK_NULL_HANDLE && eng->hits.size > hit_ring_bytes(eng))
        gbuf_destroy(eng, &eng->hits);
    if (eng->hits_host.buf != VK_NULL_HANDLE && eng->hits_host.size > hit_ring_bytes(eng))
        gbuf_destroy(eng, &eng->hits_host);
}

/* Checks the device limits and the memory budget before any device work,
 * evicting unused catalogs when that makes the batch fit. */
static int check_limits(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    const struct gpu_batch *b = bc->batch;
    uint64_t range = eng->info.max_storage_range;
    uint64_t meta_bytes = (uint64_t)bc->n_meta * 16;
    uint64_t cat_bytes = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        size_t words;
        catalog_words(b->catalogs[c], &words);
        bc->cat_slot[c] = find_resident(eng, b->catalogs[c]);
        bc->alias[c] = -1;
        for (uint32_t d = 0; d < c && bc->alias[c] < 0; d++) {
            if (memcmp(catalog_fingerprint(b->catalogs[d]), catalog_fingerprint(b->catalogs[c]),
                       CATALOG_FP_LEN) == 0)
                bc->alias[c] = (int)d;
        }
        bc->cat_new[c] = bc->cat_slot[c] == -1 && bc->alias[c] < 0;
        if (bc->cat_new[c])
            cat_bytes += (uint64_t)gbuf_grow_size(0, words * 4);
        if (bc->cat_new[c] && bc->lit[c] != NULL && bc->lit[c]->n_groups > 0)
            cat_bytes += (uint64_t)gbuf_grow_size(0, (uint64_t)bc->lit[c]->n_words * 4);
        if (words * 4 > range)
            return vks_error_set(err, -E2BIG,
                                 "catalog %u is %zu bytes, over the device's storage buffer "
                                 "range of %llu: split the rule set",
                                 c, words * 4, (unsigned long long)range);
    }
    bc->new_cat_bytes = cat_bytes;
    if (bc->hay_bytes > range || meta_bytes > range)
        return vks_error_set(err, -E2BIG,
                             "batch needs a %llu-byte haystack and %llu bytes of work items, "
                             "over the device's storage buffer range of %llu: split the batch",
                             (unsigned long long)bc->hay_bytes, (unsigned long long)meta_bytes,
                             (unsigned long long)range);
    if (qs_words(bc) * 4 > range || (uint64_t)bc->n_carry * 4 > range)
        return vks_error_set(err, -E2BIG,
                             "batch needs %llu bytes of queue state (speculative segments' "
                             "states) and %llu of carried states, over the device's storage "
                             "buffer range of %llu: split the batch",
                             (unsigned long long)(qs_words(bc) * 4),
                             (unsigned long long)bc->n_carry * 4, (unsigned long long)range);
    uint64_t grow_bytes = grow_needed(bc, meta_bytes) + cat_bytes;
    uint64_t held = held_bytes(bc);
    if (held + grow_bytes > eng->budget) {
        trim_idle_frames(eng);
        trim_ring(eng);
        grow_bytes = grow_needed(bc, meta_bytes) + cat_bytes;
        held = held_bytes(bc);
    }
    if (held + grow_bytes > eng->budget)
        return vks_error_set(err, -E2BIG,
                             "batch of %u buffers needs %llu bytes of device memory (haystack "
                             "%llu, work items %llu, catalogs and engine buffers the rest) but "
                             "only %llu are available under the budget: split the batch or "
                             "raise the memory budget",
                             b->n_buffers, (unsigned long long)(held + grow_bytes),
                             (unsigned long long)bc->hay_bytes, (unsigned long long)meta_bytes,
                             (unsigned long long)eng->budget);
    while (eng->device_bytes + grow_bytes > eng->budget && evict_one(bc))
        ;
    uint32_t n_new = 0;
    for (uint32_t c = 0; c < b->n_catalogs; c++)
        n_new += bc->cat_new[c];
    while (eng->n_cats + n_new > GPU_MAX_RESIDENT_CATALOGS && evict_one(bc))
        ;
    return 0;
}

static int free_slot(const struct gpu_engine *eng)
{
    for (uint32_t i = 0; i < GPU_MAX_RESIDENT_CATALOGS; i++) {
        if (!eng->cats[i].used)
            return (int)i;
    }
    return -1;
}

/* Pins every distinct catalog slot of the batch until it is collected. */
static void pin_cats(struct batch_ctx *bc)
{
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        if (bc->alias[c] < 0 && bc->cat_slot[c] >= 0)
            bc->eng->cats[bc->cat_slot[c]].pins++;
    }
    bc->pinned = true;
}

static int make_resident(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    const struct gpu_batch *b = bc->batch;
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        if (bc->alias[c] >= 0 || !bc->cat_new[c]) {
            if (bc->alias[c] >= 0)
                continue;
            bc->tel->catalog_cache_hits++;
            eng->cats[bc->cat_slot[c]].last_use = ++eng->tick;
            continue;
        }
        int slot = free_slot(eng);
        if (slot < 0)
            return vks_error_set(err, -E2BIG,
                                 "%u catalogs are resident and in use by batches in flight: "
                                 "wait for them, or use fewer catalogs at once",
                                 GPU_MAX_RESIDENT_CATALOGS);
        size_t words;
        catalog_words(b->catalogs[c], &words);
        struct resident_catalog *rc = &eng->cats[slot];
        memset(rc, 0, sizeof(*rc));
        int r = gbuf_create(eng, &rc->buf, words * 4, USE_STORAGE_DST, GBUF_DEVICE, err);
        if (r < 0)
            return r;
        memcpy(rc->fp, catalog_fingerprint(b->catalogs[c]), CATALOG_FP_LEN);
        rc->words = (uint32_t)words;
        rc->last_use = ++eng->tick;
        rc->used = true;
        eng->n_cats++;
        bc->cat_slot[c] = slot;
        bc->tel->catalog_uploads++;
        /* the literal kernel's tables: once per resident catalog */
        if (bc->lit[c] != NULL && bc->lit[c]->n_groups > 0 && eng->opt.lit_kernel >= 0) {
            r = gpu_lit_upload(eng, rc, bc->lit[c], err);
            if (r < 0)
                return r;
            bc->tel->catalog_bytes_uploaded += (uint64_t)bc->lit[c]->n_words * 4;
        }
    }
    for (uint32_t c = 0; c < b->n_catalogs; c++) {
        if (bc->alias[c] >= 0)
            bc->cat_slot[c] = bc->cat_slot[bc->alias[c]];
    }
    pin_cats(bc);
    return 0;
}

/* Releases the batch's catalogs: unpins them, frees those a forget waited
 * for, and drops the ones it created whose upload was never submitted (a
 * failed batch), so that the next batch uploads them again instead of
 * scanning an empty buffer. A catalog whose copy was submitted is valid for
 * every later submission, which runs after it in queue order. */
static void release_cats(struct batch_ctx *bc)
{
    struct gpu_engine *eng = bc->eng;
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        int slot = bc->cat_slot[c];
        if (bc->alias[c] >= 0 || slot < 0)
            continue;
        struct resident_catalog *rc = &eng->cats[slot];
        if (bc->pinned && rc->pins > 0)
            rc->pins--;
        bool unfinished = bc->cat_new[c] && !rc->uploaded;
        if (rc->used && rc->pins == 0 && (unfinished || rc->forget) && !eng->broken)
            evict(eng, (uint32_t)slot);
    }
    bc->pinned = false;
}

/* The batch's new catalogs are on the queue (or written through a mapping). */
static void mark_uploaded(struct batch_ctx *bc)
{
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        if (bc->cat_new[c] && bc->alias[c] < 0)
            bc->eng->cats[bc->cat_slot[c]].uploaded = true;
    }
}

static int reserve_buffers_of(struct batch_ctx *bc, struct vks_error *err);

/* Makes or grows the frame's buffers for batch bc; telemetry
 * buffers_made_ns and buffers_made_bytes say what that cost (on the H200
 * the first 64 MiB batch after a start made 153 MB in 28 ms, PERFORMANCE.md
 * session 26). */
static int reserve_buffers(struct batch_ctx *bc, struct vks_error *err)
{
    uint64_t t0 = gpu_now_ns(), made = bc->eng->made_bytes;
    int rc = reserve_buffers_of(bc, err);
    if (bc->eng->made_bytes != made) {
        bc->tel->buffers_made_ns += gpu_now_ns() - t0;
        bc->tel->buffers_made_bytes += bc->eng->made_bytes - made;
    }
    return rc;
}

/*
 * The haystack size a frame's buffers grow to for a batch of `bytes`: the
 * caller's largest batch (gpu_options.batch_bytes_hint) once a batch is a
 * quarter of it, else 0. A stream of 256 MiB writes forms batches of one
 * to four of them in no order, and each frame grew its buffers at each
 * new largest batch: 0.2-0.7 s each (the NVIDIA driver pins host-visible
 * memory page by page), a second-long stall in a 16 GiB stream's later
 * runs (docs/PERFORMANCE.md "Session 33").
 */
static uint64_t big_batch(const struct gpu_engine *eng, uint64_t bytes)
{
    /* A CPU device (lavapipe) makes memory without pinning it: growing is
     * cheap there, and holding the largest batch would only take the host's
     * RAM. Staged uploads (tests) stand for a discrete device. */
    if (eng->info.type == GPU_DEVICE_CPU && !eng->opt.staged_upload)
        return 0;
    uint64_t hint = eng->opt.batch_bytes_hint;
    if (hint > eng->info.max_storage_range) /* a haystack is bound whole */
        hint = eng->info.max_storage_range;
    return hint != 0 && bytes >= hint / 4 && bytes < hint ? hint : 0;
}

/* Staging at least this large grows with room to spare (stage_size). */
#define STAGE_ROOMY_MIN (16ull << 20)

/*
 * The size a frame's staging grows to when it must grow for `stage` bytes:
 * the most any batch has needed so far and a quarter more. Host-visible
 * memory is slow to make (pinned and mapped page by page), and each frame
 * has its own: grown to the exact size, every frame stepped through every
 * larger batch the scheduler formed (64 MiB scans at 64 clients make
 * batches of 4 to 8 of them), and made buffers for seconds after a start
 * (docs/gpu.md "Batch buffers"). Staging is host memory, outside the
 * device budget.
 */
static uint64_t stage_size(struct gpu_engine *eng, uint64_t stage)
{
    if (stage > eng->stage_high)
        eng->stage_high = stage;
    uint64_t big = big_batch(eng, stage), want = eng->stage_high + eng->stage_high / 4;
    if (big != 0) /* an eighth more for the work items and catalogs */
        return big + big / 8 > want ? big + big / 8 : want;
    return stage < STAGE_ROOMY_MIN ? stage : want;
}

static int reserve_buffers_of(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    const VkBufferUsageFlags src = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
    /* a large batch's haystack grows to the largest batch at once, where
     * the budget has room for it (check_limits counted the exact size) */
    uint64_t hay = bc->hay_bytes, big = big_batch(eng, hay);
    if (eng->hay.size < hay && big != 0 &&
        eng->device_bytes + big - eng->hay.alloc + grow_needed(bc, bc->n_meta * 16) <= eng->budget)
        hay = big;
    int rc = gbuf_reserve(eng, &eng->hay, hay, USE_STORAGE_DST, GBUF_DEVICE, err);
    if (rc < 0 && hay != bc->hay_bytes)
        rc = gbuf_reserve(eng, &eng->hay, bc->hay_bytes, USE_STORAGE_DST, GBUF_DEVICE, err);
    if (rc == 0)
        rc = gbuf_reserve(eng, &eng->meta, bc->n_meta * 16, USE_STORAGE_DST, GBUF_DEVICE, err);
    if (rc == 0)
        rc = gbuf_reserve(eng, &eng->carry, (uint64_t)bc->n_carry * 4, USE_STORAGE_DST, GBUF_DEVICE,
                          err);
    if (rc == 0)
        rc = gbuf_reserve(eng, &eng->qs, qs_words(bc) * 4, USE_STORAGE_DST | src, GBUF_DEVICE, err);
    if (rc == 0)
        rc = gbuf_reserve(eng, &eng->qs_host, qs_words(bc) * 4, VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                          GBUF_READBACK, err);
    /* a frame's first batch (or trimmed), or a ring smaller than the hit
     * rate batches have had asks for this one */
    uint64_t ring = hit_ring_bytes(eng), expect = ((bc->hay_bytes * eng->hit_rate_seen) >> 16) * 16;
    expect = expect + expect / 4 < eng->info.max_storage_range ? expect + expect / 4 : 0;
    ring = expect > ring ? expect : ring;
    const VkBufferUsageFlags ring_use =
        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
    const enum gbuf_kind ring_kind = eng->direct ? GBUF_READBACK : GBUF_DEVICE;
    if (rc == 0 && eng->hits.buf == VK_NULL_HANDLE)
        rc = gbuf_reserve(eng, &eng->hits, ring, ring_use, ring_kind, err);
    if (rc == 0 && eng->hits.size < expect) { /* a guess: where it does not fit, re-runs grow it */
        struct vks_error ignored;
        (void)gbuf_reserve(eng, &eng->hits, ring, ring_use, ring_kind, &ignored);
    }
    bc->hits_copied = 0;
    if (rc == 0 && eng->hits.map == NULL) {
        /* the hits the last pass's rate predicts, a quarter more and
         * HIT_COPY_MIN: copied in the pass's own command buffer. A second
         * submit for them would queue behind the batches submitted since
         * (one queue), and the engine thread that waits for it submits no
         * more meanwhile: with batches in flight, the device idled. */
        uint64_t guess = (bc->hay_bytes * eng->hit_rate_last) >> 16;
        guess += guess / 4 + HIT_COPY_MIN;
        if (guess > eng->hits.size / 16)
            guess = eng->hits.size / 16;
        rc = gbuf_reserve(eng, &eng->hits_host, guess * 16, VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                          GBUF_READBACK, err);
        bc->hits_copied = rc == 0 ? guess : 0;
    }
    bool direct = eng->direct && eng->hay.map != NULL && eng->meta.map != NULL;
    uint64_t stage = bc->hay_bytes + bc->n_meta * 16 + bc->new_cat_bytes;
    if (rc == 0 && !direct && bc->hay_resident && eng->staging.buf != VK_NULL_HANDLE &&
        eng->staging.size < stage) {
        /* after the factor pass: the host may still read buffers from the
         * haystack's copy here (buffer_bytes), so a grown staging keeps it */
        struct gbuf grown;
        rc = gbuf_create(eng, &grown, gbuf_grow_size(eng->staging.size, stage_size(eng, stage)),
                         src, GBUF_STAGING, err);
        if (rc == 0) {
            memcpy(grown.map, eng->staging.map, bc->hay_bytes);
            gbuf_destroy(eng, &eng->staging);
            eng->staging = grown;
        }
    }
    if (rc == 0 && !direct && (eng->staging.buf == VK_NULL_HANDLE || eng->staging.size < stage)) {
        rc = gbuf_reserve(eng, &eng->staging, stage_size(eng, stage), src, GBUF_STAGING, err);
        if (rc < 0 && stage_size(eng, stage) > stage) /* no room to spare: the exact size */
            rc = gbuf_reserve(eng, &eng->staging, stage, src, GBUF_STAGING, err);
    }
    return rc;
}

/* ---- upload ------------------------------------------------------------ */

struct fill_job {
    uint8_t *dst; /* haystack byte 0 */
    const struct gpu_batch *batch;
    const uint64_t *offs;
    uint64_t lo, hi; /* haystack bytes to fill */
    uint32_t pieces;
};

/* Bytes [off, off + len) of one buffer into dst: a copy from memory, or
 * the caller's read (gpu_read_fn) straight from the file; what a read
 * could not give is zeroed. */
static void fill_bytes(const struct gpu_buffer *gb, uint8_t *dst, uint64_t off, uint64_t len)
{
    if (gb->data != NULL || gb->read == NULL)
        memcpy(dst, gb->data + off, len);
    else if (gb->read(gb->read_ctx, dst, off, (size_t)len) != 0)
        memset(dst, 0, len);
}

/* Copies haystack bytes [lo, hi) of the batch into dst, zeroing padding. */
static void fill_range(const struct fill_job *j, uint64_t lo, uint64_t hi)
{
    uint32_t a = 0, z = j->batch->n_buffers;
    while (a < z) { /* first buffer whose padded end is past lo */
        uint32_t m = a + (z - a) / 2;
        if (j->offs[m + 1] <= lo)
            a = m + 1;
        else
            z = m;
    }
    for (uint32_t i = a; i < j->batch->n_buffers && j->offs[i] < hi; i++) {
        const struct gpu_buffer *gb = &j->batch->buffers[i];
        uint64_t s = j->offs[i] > lo ? j->offs[i] : lo;
        uint64_t e = j->offs[i + 1] < hi ? j->offs[i + 1] : hi;
        uint64_t data_end = j->offs[i] + gb->len;
        if (s < data_end) {
            uint64_t ce = e < data_end ? e : data_end;
            fill_bytes(gb, j->dst + s, s - j->offs[i], ce - s);
            s = ce;
        }
        if (s < e)
            memset(j->dst + s, 0, e - s);
    }
}

static void fill_piece(void *ctx, uint32_t i)
{
    const struct fill_job *j = ctx;
    uint64_t span = j->hi - j->lo;
    uint64_t lo = j->lo + span * i / j->pieces;
    uint64_t hi = j->lo + span * (i + 1) / j->pieces;
    fill_range(j, lo, hi);
}

static VkResult queue_submit(struct gpu_engine *eng, VkCommandBuffer cb, VkFence fence)
{
    VkSubmitInfo si = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
        .commandBufferCount = 1,
        .pCommandBuffers = &cb,
    };
    return vkQueueSubmit(eng->queue, 1, &si, fence);
}

/* Submits cb on the engine's thread; under eng->qlock while a begun
 * batch's upload threads may submit its haystack chunks. */
static int submit(struct gpu_engine *eng, VkCommandBuffer cb, VkFence fence,
                  struct gpu_telemetry *tel, struct vks_error *err)
{
    pthread_mutex_t *lock = eng->qlock;
    if (lock != NULL)
        pthread_mutex_lock(lock);
    VkResult r = queue_submit(eng, cb, fence);
    if (lock != NULL)
        pthread_mutex_unlock(lock);
    tel->submits++;
    if (r != VK_SUCCESS) {
        if (r == VK_ERROR_DEVICE_LOST)
            eng->broken = true;
        return gpu_vk_error(r, "vkQueueSubmit", err);
    }
    return 0;
}

/*
 * A batch's haystack upload. On discrete devices (chunk > 0) each chunk's
 * copy is submitted by whichever upload thread fills its last piece, while
 * the others go on filling chunk k+1; no thread waits for a chunk to
 * finish. Elsewhere (chunk 0) the tasks are pieces of the mapped haystack.
 * Everything a task touches is in the job, captured at its start: while it
 * runs in the background (gpu_batch_begin .. gpu_batch_end) the engine's
 * fields hold the frame of the batch being collected, not this one's.
 */
struct upload_job {
    struct fill_job fill;
    struct gpu_engine *eng; /* only its queue: constant */
    VkCommandBuffer upcmd[MAX_UPLOAD_CHUNKS];
    uint64_t chunk;
    uint32_t pieces; /* per chunk */
    uint32_t tasks;
    bool bg;         /* started with upload_pool_start: upload_pool_wait joins it */
    bool concurrent; /* and the pool's own threads run it meanwhile (eng->qlock) */
    atomic_uint left[MAX_UPLOAD_CHUNKS];
    pthread_mutex_t queue; /* vkQueueSubmit needs the queue externally synchronized */
    /* under `queue`: */
    VkResult vr; /* the first failed chunk submit */
    uint32_t submits;
    bool chunks_out; /* a chunk's copy is on the queue */
};

static void upload_task(void *ctx, uint32_t i)
{
    struct upload_job *j = ctx;
    if (j->chunk == 0) {
        fill_piece(&j->fill, i);
        return;
    }
    uint32_t k = i / j->pieces, p = i % j->pieces;
    uint64_t lo = k * j->chunk;
    uint64_t hi = lo + j->chunk < j->fill.hi ? lo + j->chunk : j->fill.hi;
    fill_range(&j->fill, lo + (hi - lo) * p / j->pieces, lo + (hi - lo) * (p + 1) / j->pieces);
    if (atomic_fetch_sub(&j->left[k], 1) != 1)
        return;
    pthread_mutex_lock(&j->queue);
    if (j->vr == VK_SUCCESS) {
        j->vr = queue_submit(j->eng, j->upcmd[k], VK_NULL_HANDLE);
        j->submits++;
        j->chunks_out |= j->vr == VK_SUCCESS;
    }
    pthread_mutex_unlock(&j->queue);
}

/* Records each chunk's copy from staging into the haystack. */
static int record_chunks(struct gpu_engine *eng, uint64_t total, uint64_t chunk, uint32_t n,
                         struct vks_error *err)
{
    for (uint32_t k = 0; k < n; k++) {
        uint64_t lo = k * chunk;
        uint64_t hi = lo + chunk < total ? lo + chunk : total;
        VkCommandBufferBeginInfo bi = {
            .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
        };
        VkBufferCopy region = {.srcOffset = lo, .dstOffset = lo, .size = hi - lo};
        VkResult r = vkBeginCommandBuffer(eng->upcmd[k], &bi);
        if (r == VK_SUCCESS) {
            vkCmdCopyBuffer(eng->upcmd[k], eng->staging.buf, eng->hay.buf, 1, &region);
            r = vkEndCommandBuffer(eng->upcmd[k]);
        }
        if (r != VK_SUCCESS)
            return gpu_vk_error(r, "recording a haystack upload", err);
    }
    return 0;
}

/* Splits the haystack upload of bc into the tasks of job j: pieces of the
 * mapped haystack, or (discrete devices) at most MAX_UPLOAD_CHUNKS chunks
 * through staging, their copies recorded here. */
static int plan_upload(struct batch_ctx *bc, struct upload_job *j, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    uint64_t total = bc->hay_bytes;
    uint32_t threads = upload_pool_threads(eng->pool);
    bool direct = eng->direct && eng->hay.map != NULL;
    j->eng = eng;
    j->fill = (struct fill_job){.dst = direct ? eng->hay.map : eng->staging.map,
                                .batch = bc->batch,
                                .offs = eng->scratch.offs,
                                .lo = 0,
                                .hi = total};
    if (direct) {
        uint64_t pieces = total / MIB;
        j->fill.pieces = pieces < 1 ? 1 : (pieces > threads ? threads : (uint32_t)pieces);
        j->tasks = j->fill.pieces;
        return 0;
    }
    uint64_t least = eng->opt.upload_chunk ? ALIGN16(eng->opt.upload_chunk) : 16 * MIB;
    uint64_t chunk = ALIGN16((total + MAX_UPLOAD_CHUNKS - 1) / MAX_UPLOAD_CHUNKS);
    if (chunk < least)
        chunk = least;
    uint32_t n = (uint32_t)((total + chunk - 1) / chunk);
    int rc = record_chunks(eng, total, chunk, n, err);
    if (rc < 0)
        return rc;
    memcpy(j->upcmd, eng->upcmd, n * sizeof(eng->upcmd[0]));
    j->chunk = chunk;
    j->pieces = chunk / PIECE < threads ? (uint32_t)(chunk / PIECE) : threads;
    if (j->pieces == 0)
        j->pieces = 1;
    for (uint32_t k = 0; k < n; k++)
        atomic_init(&j->left[k], j->pieces);
    j->tasks = n * j->pieces;
    return 0;
}

/* Writes the work items and new catalogs: straight into mapped device
 * memory, or into staging behind the haystack (copied by record()). */
static void upload_small(struct batch_ctx *bc)
{
    struct gpu_engine *eng = bc->eng;
    bool direct = eng->staging.map == NULL || (eng->direct && eng->meta.map != NULL);
    uint8_t *meta_dst = direct ? eng->meta.map : (uint8_t *)eng->staging.map + bc->hay_bytes;
    memcpy(meta_dst, eng->scratch.meta, bc->n_meta * 16);
    uint64_t off = bc->hay_bytes + bc->n_meta * 16;
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        if (!bc->cat_new[c])
            continue;
        size_t words;
        const uint32_t *w = catalog_words(bc->batch->catalogs[c], &words);
        struct gbuf *cb = &eng->cats[bc->cat_slot[c]].buf;
        if (cb->map != NULL) {
            memcpy(cb->map, w, words * 4);
        } else {
            memcpy((uint8_t *)eng->staging.map + off, w, words * 4);
            off += ALIGN16(words * 4);
        }
        bc->tel->catalog_bytes_uploaded += words * 4;
    }
    bc->tel->meta_bytes_uploaded += bc->n_meta * 16;
    bc->tel->haystack_bytes_uploaded = bc->hay_bytes;
}

/* ---- record, run, read back ------------------------------------------- */

static void update_sets(struct batch_ctx *bc)
{
    struct gpu_engine *eng = bc->eng;
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        const struct gbuf *cat = &eng->cats[bc->cat_slot[c]].buf;
        /* binding 6: the literal tables, or any valid buffer when none */
        const struct gbuf *lit = &eng->cats[bc->cat_slot[c]].lit;
        VkDescriptorBufferInfo bi[7] = {
            {eng->hay.buf, 0, VK_WHOLE_SIZE},
            {cat->buf, 0, VK_WHOLE_SIZE},
            {eng->meta.buf, 0, VK_WHOLE_SIZE},
            {eng->qs.buf, 0, VK_WHOLE_SIZE},
            {eng->hits.buf, 0, VK_WHOLE_SIZE},
            {eng->carry.buf, 0, VK_WHOLE_SIZE},
            {lit->buf != VK_NULL_HANDLE ? lit->buf : cat->buf, 0, VK_WHOLE_SIZE},
        };
        VkWriteDescriptorSet w[7];
        for (uint32_t i = 0; i < 7; i++) {
            w[i] = (VkWriteDescriptorSet){
                .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                .dstSet = eng->sets[c],
                .dstBinding = i,
                .descriptorCount = 1,
                .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                .pBufferInfo = &bi[i],
            };
        }
        vkUpdateDescriptorSets(eng->dev, 7, w, 0, NULL);
    }
}

static void barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags src_access,
                    VkPipelineStageFlags dst, VkAccessFlags dst_access)
{
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = src_access,
        .dstAccessMask = dst_access,
    };
    vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static void record_copies(struct batch_ctx *bc, VkCommandBuffer cb)
{
    struct gpu_engine *eng = bc->eng;
    if (eng->staging.map == NULL || (eng->direct && eng->meta.map != NULL))
        return;
    VkBufferCopy meta = {.srcOffset = bc->hay_bytes, .size = bc->n_meta * 16};
    vkCmdCopyBuffer(cb, eng->staging.buf, eng->meta.buf, 1, &meta);
    uint64_t off = bc->hay_bytes + bc->n_meta * 16;
    for (uint32_t c = 0; c < bc->batch->n_catalogs; c++) {
        const struct gbuf *dst = &eng->cats[bc->cat_slot[c]].buf;
        if (!bc->cat_new[c] || dst->map != NULL)
            continue;
        size_t words;
        catalog_words(bc->batch->catalogs[c], &words);
        VkBufferCopy r = {.srcOffset = off, .size = words * 4};
        vkCmdCopyBuffer(cb, eng->staging.buf, dst->buf, 1, &r);
        off += ALIGN16(words * 4);
    }
}

static uint8_t prof_kind(const struct batch_ctx *bc, const struct scan_range *sr)
{
    if (sr->lit)
        return GPU_PROF_LIT;
    if (sr->factor)
        return GPU_PROF_FACTOR;
    if (!sr->nfa)
        return GPU_PROF_DFA;
    const struct catalog *cat = bc->batch->catalogs[sr->cat];
    struct catalog_nfa g;
    catalog_nfa(cat, sr->group - catalog_group_count(cat), &g);
    return (g.flags & CAT_GF_GATED) || sr->confirm ? GPU_PROF_GATED : GPU_PROF_NFA;
}

/* Binds range sr's pipeline and catalog, pushes its constants, dispatches. */
static void dispatch(struct batch_ctx *bc, VkCommandBuffer cb, const struct scan_range *sr,
                     const void *push, uint32_t size)
{
    struct gpu_engine *eng = bc->eng;
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, sr->pipe);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, eng->layout, 0, 1,
                            &eng->sets[sr->cat], 0, NULL);
    vkCmdPushConstants(cb, eng->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, size, push);
    vkCmdDispatch(cb, sr->workgroups, 1, 1);
    bc->tel->kernel_launches++;
}

static void push_range(struct batch_ctx *bc, VkCommandBuffer cb, uint32_t r)
{
    struct gpu_engine *eng = bc->eng;
    const struct scan_range *sr = &eng->scratch.ranges[r];
    if (sr->nfa || sr->lit) {
        struct nfa_push np;
        struct lit_push lp;
        if (sr->lit)
            gpu_lit_push(bc, sr, QS_HEADS + r, &lp);
        else
            gpu_nfa_push(bc, sr, QS_HEADS + r, &np);
        dispatch(bc, cb, sr, sr->lit ? (void *)&lp : (void *)&np,
                 sr->lit ? sizeof(lp) : sizeof(np));
        return;
    }
    if (sr->fuse) {
        struct fuse_push fp = {
            .items = sr->items,
            .n_items = sr->n_items,
            .head = QS_HEADS + r,
            .bufs = 0,
            .max_cost = sr->max_cost,
            .hit_cap = (uint32_t)(eng->hits.size / 16),
            .maxlen = sr->look,
            .gtab = sr->gtab,
            .count = sr->counted,
        };
        dispatch(bc, cb, sr, &fp, sizeof(fp));
        return;
    }
    struct catalog_group g;
    catalog_group(bc->batch->catalogs[sr->cat], sr->group, &g);
    size_t words;
    const uint32_t *base = catalog_words(bc->batch->catalogs[sr->cat], &words);
    struct scan_push pc = {
        .items = sr->items,
        .n_items = sr->n_items,
        .head = QS_HEADS + r,
        .bufs = 0,
        .carry_base = sr->carry_base,
        .max_cost = sr->max_cost,
        .hit_cap = (uint32_t)(eng->hits.size / 16),
        .layer = sr->group,
        .n_classes = g.n_classes,
        .acc_row = g.first_accept * g.n_classes,
        .first_accept = g.first_accept,
        .maxlen = sr->spec_base == NO_CARRY ? g.maxlen : sr->look + 1,
        .classmap = (uint32_t)(g.classmap - base),
        .trans = (uint32_t)(g.trans - base),
        .accidx = (uint32_t)(g.accept_index - base),
        .accepts = (uint32_t)(g.accepts - base),
        .trans_words = g.n_states * g.n_classes,
        .start_bos = g.start[0],
        .start_word = g.start[1],
        .start_nl = g.start[2],
        .start_other = g.start[3],
        .packed = g.n_states <= 65536,
        .spec = sr->spec_base == NO_CARRY ? NO_CARRY
                                          : QS_HEADS + (uint32_t)bc->n_ranges + sr->spec_base,
        .mask_or = sr->factor ? CAT_ACCEPT_ALWAYS : 0,
        .count = sr->counted,
    };
    dispatch(bc, cb, sr, &pc, sizeof(pc));
}

/* Records the pass: (uploads of items and catalogs,) queue reset, the
 * dispatches round by round, and the queue-state readback. */
static int record(struct batch_ctx *bc, bool copies, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    VkCommandBuffer cb = eng->cmd;
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    VkResult r = vkBeginCommandBuffer(cb, &bi);
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "vkBeginCommandBuffer", err);
    if (copies)
        record_copies(bc, cb);
    vkCmdFillBuffer(cb, eng->qs.buf, 0, (QS_HEADS + bc->n_ranges) * 4, 0);
    if (bc->n_count > 0)
        vkCmdFillBuffer(cb, eng->qs.buf, (QS_HEADS + bc->n_ranges + bc->n_spec) * 4,
                        (VkDeviceSize)bc->n_count * 4, 0);
    barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
            VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
            VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    bool prof = eng->opt.profile && eng->qpool != VK_NULL_HANDLE;
    bc->n_prof = 0;
    if (eng->qpool != VK_NULL_HANDLE) {
        vkCmdResetQueryPool(cb, eng->qpool, 0, prof ? 2 + GPU_PROF_RANGES : 2);
        /* at TRANSFER, not TOP_OF_PIPE: written once every earlier copy on
         * the queue is done (the upload's chunks included), so the kernel
         * time does not count the tail of the upload (session 12) */
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, eng->qpool, 0);
    }
    for (uint32_t round = 0; round < bc->rounds; round++) {
        if (round > 0)
            barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                    VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        int last_kind = -1;
        for (uint32_t k = 0; k < bc->n_ranges; k++) {
            if (eng->scratch.ranges[k].round != round)
                continue;
            int kind = eng->opt.serialize == 2 ? prof_kind(bc, &eng->scratch.ranges[k]) : 0;
            if (!prof && eng->opt.serialize != 0 && last_kind >= 0 &&
                (eng->opt.serialize == 1 || kind != last_kind))
                barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                        VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
            last_kind = kind;
            push_range(bc, cb, k);
            if (prof && bc->n_prof < GPU_PROF_RANGES) { /* this dispatch alone, then its end */
                barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                        VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
                vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, eng->qpool,
                                    2 + bc->n_prof);
                bc->prof_kind[bc->n_prof++] = prof_kind(bc, &eng->scratch.ranges[k]);
            }
        }
    }
    if (eng->qpool != VK_NULL_HANDLE)
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, eng->qpool, 1);
    barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
            VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
            VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT);
    VkBufferCopy qc = {.size = qs_words(bc) * 4};
    vkCmdCopyBuffer(cb, eng->qs.buf, eng->qs_host.buf, 1, &qc);
    if (bc->hits_copied > 0) {
        VkBufferCopy hc = {.size = bc->hits_copied * 16};
        vkCmdCopyBuffer(cb, eng->hits.buf, eng->hits_host.buf, 1, &hc);
    }
    barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
            VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    r = vkEndCommandBuffer(cb);
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "vkEndCommandBuffer", err);
    return 0;
}

static void invalidate(struct gpu_engine *eng, const struct gbuf *b)
{
    if (b->coherent)
        return;
    VkMappedMemoryRange mr = {
        .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE,
        .memory = b->mem,
        .size = VK_WHOLE_SIZE,
    };
    vkInvalidateMappedMemoryRanges(eng->dev, 1, &mr);
}

static void flush(struct gpu_engine *eng, const struct gbuf *b)
{
    if (b->coherent || b->map == NULL)
        return;
    VkMappedMemoryRange mr = {
        .sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE,
        .memory = b->mem,
        .size = VK_WHOLE_SIZE,
    };
    vkFlushMappedMemoryRanges(eng->dev, 1, &mr);
}

/* A pass went onto the device: occupancy and idle-time accounting. */
static void device_enter(struct gpu_engine *eng, uint64_t t, struct gpu_telemetry *tel)
{
    if (eng->on_device++ == 0) {
        eng->busy_since = t;
        if (eng->idle_since != 0) {
            tel->device_idle_ns += t - eng->idle_since;
            eng->stats.idle_ns += t - eng->idle_since;
        }
    }
    if (eng->on_device > eng->stats.max_inflight)
        eng->stats.max_inflight = eng->on_device;
    if (tel->inflight == 0)
        tel->inflight = eng->on_device;
}

static void device_leave(struct gpu_engine *eng, uint64_t t)
{
    if (eng->on_device == 0)
        return;
    if (--eng->on_device == 0) {
        eng->stats.busy_ns += t - eng->busy_since;
        eng->idle_since = t;
    }
}

/* Submits the recorded pass without waiting for it. */
static int submit_pass(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    vkResetFences(eng->dev, 1, &eng->fence);
    uint64_t t = gpu_now_ns();
    int rc = submit(eng, eng->cmd, eng->fence, bc->tel, err);
    if (rc < 0)
        return rc;
    bc->t_submit = t;
    bc->submitted = true;
    device_enter(eng, t, bc->tel);
    return 0;
}

/* Waits for the submitted pass within the timeout. */
/* gpu_options.profile: each timed dispatch's time since the one before it
 * (or the pass's start) into its kind's sum. */
static void read_profile(struct batch_ctx *bc, uint64_t start)
{
    struct gpu_engine *eng = bc->eng;
    uint64_t ts[GPU_PROF_RANGES];
    if (vkGetQueryPoolResults(eng->dev, eng->qpool, 2, bc->n_prof, sizeof(ts), ts, 8,
                              VK_QUERY_RESULT_64_BIT) != VK_SUCCESS)
        return;
    uint64_t mask = eng->ts_valid_bits < 64 ? (1ull << eng->ts_valid_bits) - 1 : ~0ull;
    uint64_t prev = start;
    for (uint32_t j = 0; j < bc->n_prof; j++) {
        uint64_t v = ts[j] & mask;
        if (v >= prev)
            bc->tel->prof_ns[bc->prof_kind[j]] += (uint64_t)((double)(v - prev) * eng->ts_period);
        bc->tel->prof_dispatches[bc->prof_kind[j]]++;
        prev = v;
    }
}

static int wait_pass(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    bc->submitted = false;
    if (eng->broken) {
        device_leave(eng, gpu_now_ns());
        return vks_error_set(err, -ENODEV,
                             "a batch submitted before this one timed out or lost the device: "
                             "destroy and re-create the engine");
    }
    VkResult r = vkWaitForFences(eng->dev, 1, &eng->fence, VK_TRUE, eng->timeout_ns);
    uint64_t t = gpu_now_ns();
    device_leave(eng, t);
    bc->tel->sync_points++;
    bc->tel->device_ns += t - bc->t_submit;
    if (r != VK_SUCCESS) {
        eng->broken = true;
        return gpu_vk_error(r, "waiting for the scan batch", err);
    }
    uint64_t ts[2];
    bool have_ts = eng->qpool != VK_NULL_HANDLE &&
                   vkGetQueryPoolResults(eng->dev, eng->qpool, 0, 2, sizeof(ts), ts, 8,
                                         VK_QUERY_RESULT_64_BIT) == VK_SUCCESS;
    if (have_ts && eng->ts_valid_bits < 64) {
        uint64_t mask = (1ull << eng->ts_valid_bits) - 1;
        ts[0] &= mask;
        ts[1] &= mask;
    }
    bc->tel->kernel_ns += have_ts && ts[1] >= ts[0]
                              ? (uint64_t)((double)(ts[1] - ts[0]) * eng->ts_period)
                              : t - bc->t_submit;
    if (have_ts && bc->n_prof > 0)
        read_profile(bc, ts[0]);
    return 0;
}

/* Submits the recorded pass and waits for it (re-runs after a full ring). */
static int run_pass(struct batch_ctx *bc, struct vks_error *err)
{
    int rc = submit_pass(bc, err);
    return rc < 0 ? rc : wait_pass(bc, err);
}

/* Makes the hit ring hold `hits` and re-runs the pass: no hit is lost. */
static int grow_ring(struct batch_ctx *bc, uint64_t hits, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    uint64_t bytes = hits * 16;
    if (bytes > eng->info.max_storage_range)
        return vks_error_set(err, -E2BIG,
                             "batch produced %llu hits, %llu bytes, over the device's storage "
                             "buffer range of %llu: split the batch",
                             (unsigned long long)hits, (unsigned long long)bytes,
                             (unsigned long long)eng->info.max_storage_range);
    return gbuf_reserve(eng, &eng->hits, bytes,
                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                        eng->direct ? GBUF_READBACK : GBUF_DEVICE, err);
}

/* Discrete devices: copies the used prefix of the device-local ring to
 * host memory (one more submit and wait, only when there are hits). */
static int copy_hits(struct batch_ctx *bc, uint64_t n, const uint32_t **out, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    bc->tel->bytes_read_back += eng->hits.map != NULL ? n * 16 : bc->hits_copied * 16;
    if (eng->hits.map != NULL || n == 0) {
        invalidate(eng, &eng->hits);
        *out = eng->hits.map;
        return 0;
    }
    if (n <= bc->hits_copied) { /* the pass copied them (reserve_buffers) */
        invalidate(eng, &eng->hits_host);
        *out = eng->hits_host.map;
        return 0;
    }
    bc->tel->hit_copy_submits++;
    bc->tel->bytes_read_back += n * 16;
    int rc = gbuf_reserve(eng, &eng->hits_host, n * 16, VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                          GBUF_READBACK, err);
    if (rc < 0)
        return rc;
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    VkResult r = vkBeginCommandBuffer(eng->cmd, &bi);
    if (r == VK_SUCCESS) {
        VkBufferCopy c = {.size = n * 16};
        vkCmdCopyBuffer(eng->cmd, eng->hits.buf, eng->hits_host.buf, 1, &c);
        barrier(eng->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        r = vkEndCommandBuffer(eng->cmd);
    }
    if (r != VK_SUCCESS)
        return gpu_vk_error(r, "recording the hit readback", err);
    vkResetFences(eng->dev, 1, &eng->fence);
    rc = submit(eng, eng->cmd, eng->fence, bc->tel, err);
    if (rc < 0)
        return rc;
    r = vkWaitForFences(eng->dev, 1, &eng->fence, VK_TRUE, eng->timeout_ns);
    bc->tel->sync_points++;
    if (r != VK_SUCCESS) {
        eng->broken = true;
        return gpu_vk_error(r, "waiting for the hit readback", err);
    }
    invalidate(eng, &eng->hits_host);
    *out = eng->hits_host.map;
    return 0;
}

/* Checks the pass that was waited for (status `rc`), re-running it until
 * the ring held every hit; tel->hits_raw is then its hit count. */
static int read_queue(struct batch_ctx *bc, int rc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    struct gpu_telemetry *tel = bc->tel;
    const uint32_t *qs = eng->qs_host.map;
    bc->t_read = gpu_now_ns();
    while (rc == 0) {
        invalidate(eng, &eng->qs_host);
        tel->bytes_read_back += qs_words(bc) * 4;
        bc->cut = (qs[QS_ERROR] & QS_ERR_CUT) != 0;
        if (bc->cut)
            return vks_error_set(err, -EIO,
                                 "the driver cut a scan loop short (device %s): lower "
                                 "segment_bytes or chain_bytes so items fit its loop budget",
                                 eng->info.name);
        tel->items_processed = qs[QS_DONE];
        tel->items_remaining = bc->items_total - qs[QS_DONE];
        tel->occupancy = bc->workers ? (double)qs[QS_ACTIVE] / (double)bc->workers : 0;
        if (qs[QS_DONE] != bc->items_total)
            return vks_error_set(err, -EIO,
                                 "%llu of %llu work items were left unprocessed: this is a "
                                 "bug in the launch policy, please report it",
                                 (unsigned long long)tel->items_remaining,
                                 (unsigned long long)bc->items_total);
        tel->hits_raw = qs[QS_HIT_HEAD];
        if (bc->hay_bytes > 0) {
            uint64_t rate = ((uint64_t)qs[QS_HIT_HEAD] << 16) / bc->hay_bytes;
            /* only a batch with more hits than the initial ring holds sizes
             * the rings of later ones: a few hits in a few bytes (the
             * start's self-test: 6 in 40) made the first 64 MiB batch of
             * each frame a 200 MiB ring (PERFORMANCE.md session 26) */
            if (qs[QS_HIT_HEAD] > hit_ring_bytes(eng) / 16 && rate > eng->hit_rate_seen)
                eng->hit_rate_seen = rate;
            eng->hit_rate_last = rate;
        }
        if (qs[QS_HIT_HEAD] <= eng->hits.size / 16)
            break;
        tel->hit_reruns++;
        bc->hits_copied = 0; /* the re-run's hits: copy_hits, once it knows how many */
        rc = grow_ring(bc, qs[QS_HIT_HEAD], err);
        if (rc == 0) {
            update_sets(bc);
            rc = record(bc, false, err);
        }
        if (rc == 0)
            rc = run_pass(bc, err);
        bc->t_read = gpu_now_ns();
    }
    tel->hit_capacity = eng->hits.size / 16;
    return rc;
}

/* A speculative range counted on the device, and the host's repair of a
 * wrong guess found a match of the guessed walk it cannot take out of the
 * counts (gpu_unhits_unsure). The pass runs again with the speculative
 * ranges on the ring, as a full ring re-runs it (the counts are filled
 * again with the heads); the host then repairs it as usual. */
static int uncount_spec(struct batch_ctx *bc, struct vks_error *err)
{
    struct scan_range *r = bc->eng->scratch.ranges;
    for (size_t k = 0; k < bc->n_ranges; k++)
        if (r[k].spec_base != NO_CARRY)
            r[k].counted = false;
    bc->tel->spec_count_reruns++;
    bc->hits_copied = 0; /* the re-run's hits: copy_hits, once it knows how many */
    update_sets(bc);
    int rc = record(bc, false, err);
    if (rc == 0)
        rc = run_pass(bc, err);
    return read_queue(bc, rc, err);
}

/* Reads the pass that was waited for (status `rc`) and its hits. A wrong
 * guess of a speculative range that counted on the device is repaired
 * like any other: the host adds its walk's matches and takes the guessed
 * walk's out of the counts (merge_counts). */
static int read_passes(struct batch_ctx *bc, int rc, struct gpu_result *res, struct vks_error *err)
{
    rc = read_queue(bc, rc, err);
    struct gpu_telemetry *tel = bc->tel;
    const uint32_t *raw = NULL;
    if (rc == 0)
        rc = copy_hits(bc, tel->hits_raw, &raw, err);
    if (rc == 0)
        rc = gpu_host_finish(bc, bc->eng->qs_host.map, raw, tel->hits_raw, err);
    int unsure = rc == 0 && bc->n_unhits > 0 ? gpu_unhits_unsure(bc, bc->eng->qs_host.map) : -1;
    if (unsure >= 0) {
        gpu_spec_lost(bc->eng, bc->batch->catalogs[unsure]);
        rc = uncount_spec(bc, err);
        if (rc == 0)
            rc = copy_hits(bc, tel->hits_raw, &raw, err);
        if (rc == 0)
            rc = gpu_host_finish(bc, bc->eng->qs_host.map, raw, tel->hits_raw, err);
    }
    if (rc < 0)
        return rc;
    return gpu_finish_hits(bc, raw, tel->hits_raw, res, err);
}

/* Writes the items and new catalogs and starts the haystack's upload
 * (unless the factor pass left it on the device): in the background when
 * `bg` (upload_finish joins it), else to its end. */
static int upload_start(struct batch_ctx *bc, bool bg, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    uint64_t t = gpu_now_ns();
    bc->t_upload = t;
    upload_small(bc);
    int rc = 0;
    if (!bc->hay_resident && bc->hay_bytes > 0) {
        struct upload_job *j = calloc(1, sizeof(*j));
        if (j == NULL)
            return vks_error_set(err, -ENOMEM, "out of memory starting the upload");
        rc = plan_upload(bc, j, err);
        if (rc < 0) {
            free(j);
            return rc;
        }
        pthread_mutex_init(&j->queue, NULL);
        bc->up = j;
        j->bg = bg;
        if (!bg)
            upload_pool_run(eng->pool, upload_task, j, j->tasks);
        else if (upload_pool_start(eng->pool, upload_task, j, j->tasks)) {
            j->concurrent = true;
            eng->qlock = &j->queue;
        }
    }
    bc->tel->upload_ns += gpu_now_ns() - t;
    return rc;
}

/* Joins the background upload of the begun batch (upload_finish frees it
 * later): after this, the engine's thread is the queue's only user. */
static void join_upload(struct gpu_engine *eng)
{
    struct upload_job *j = eng->begun != NULL ? eng->begun->bc.up : NULL;
    if (j == NULL || !j->bg)
        return;
    upload_pool_wait(eng->pool);
    j->bg = j->concurrent = false;
    eng->qlock = NULL;
}

/* Waits for the batch's upload (taking part in what is left of it) and
 * flushes what it wrote. Returns the first failed chunk submit's status. */
static int upload_finish(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    uint64_t t = gpu_now_ns();
    struct upload_job *j = bc->up;
    int rc = 0;
    if (j != NULL) {
        if (j->bg) {
            upload_pool_wait(eng->pool);
            eng->qlock = NULL;
        }
        bc->tel->submits += j->submits;
        bc->chunks_out |= j->chunks_out;
        if (j->vr == VK_ERROR_DEVICE_LOST)
            eng->broken = true;
        if (j->vr != VK_SUCCESS)
            rc = gpu_vk_error(j->vr, "vkQueueSubmit", err);
        pthread_mutex_destroy(&j->queue);
        free(j);
        bc->up = NULL;
    }
    flush(eng, &eng->staging);
    flush(eng, &eng->hay);
    flush(eng, &eng->meta);
    bc->tel->upload_ns += gpu_now_ns() - t;
    return rc;
}

/* Once the upload is done: records the pass and submits it. */
static int record_submit(struct batch_ctx *bc, struct vks_error *err)
{
    int rc = upload_finish(bc, err);
    if (rc == 0 && bc->eng->broken) /* a batch collected during the upload */
        rc = vks_error_set(err, -ENODEV,
                           "a batch submitted before this one timed out or lost the device: "
                           "destroy and re-create the engine");
    if (rc == 0) {
        update_sets(bc);
        rc = record(bc, true, err);
    }
    if (rc == 0)
        rc = submit_pass(bc, err);
    if (rc == 0)
        mark_uploaded(bc);
    return rc;
}

/* Uploads the items, new catalogs and the haystack, records the pass and
 * submits it. */
static int upload_submit(struct batch_ctx *bc, struct vks_error *err)
{
    int rc = upload_start(bc, false, err);
    return rc < 0 ? rc : record_submit(bc, err);
}

/* ---- the factor pass ---------------------------------------------------- */

static void free_gates(struct batch_ctx *bc)
{
    for (uint32_t i = 0; bc->gates != NULL && i < bc->batch->n_buffers; i++)
        refscan_gate_finish(&bc->gates[i]);
    free(bc->gates);
    bc->gates = NULL;
}

/*
 * The factor pass (docs/gpu.md): the factor groups of the catalogs in
 * bc->gates_of walked on the device over their buffers, every entry
 * reported; the ends read back into bc->gates. The haystack it uploads
 * stays for the pass after it (bc->hay_resident); the catalogs it made
 * resident are uploaded and unpinned again.
 */
static int factor_pass(struct batch_ctx *bc, struct vks_error *err)
{
    struct gpu_telemetry *tel = bc->tel;
    uint64_t t0 = gpu_now_ns();
    uint32_t lit_groups = tel->lit_groups;
    bc->factor_phase = true;
    int rc = gpu_plan_batch(bc, err);
    bc->factor_phase = false;
    tel->lit_groups = lit_groups;
    if (rc == 0)
        rc = check_limits(bc, err);
    if (rc == 0)
        rc = gpu_pick_pipelines(bc, err);
    if (rc == 0)
        rc = make_resident(bc, err);
    if (rc == 0)
        rc = reserve_buffers(bc, err);
    if (rc < 0)
        return rc;
    uint64_t t1 = gpu_now_ns();
    tel->factor_plan_ns = t1 - t0;
    rc = upload_submit(bc, err);
    if (rc < 0)
        return rc;
    uint64_t t2 = gpu_now_ns();
    tel->factor_upload_ns = t2 - t1;
    bc->hay_resident = true;
    rc = wait_pass(bc, err);
    bc->chunks_out = false; /* the fence came after them in queue order */
    rc = read_queue(bc, rc, err);
    uint64_t t3 = gpu_now_ns();
    tel->factor_wait_ns = t3 - t2;
    const uint32_t *raw = NULL;
    uint64_t n = tel->hits_raw;
    if (rc == 0)
        rc = copy_hits(bc, n, &raw, err);
    uint64_t t4 = gpu_now_ns();
    tel->factor_read_ns = t4 - t3;
    if (rc == 0 && gpu_gather_gates(bc, raw, n) < 0)
        rc = vks_error_set(err, -ENOMEM, "out of memory sorting %llu factor ends",
                           (unsigned long long)n);
    release_cats(bc); /* the main pass pins them again */
    /* the main pass's counts are the batch's (it may have no items) */
    tel->hits_raw = 0;
    tel->hit_reruns = 0;
    tel->items_processed = tel->items_remaining = 0;
    tel->occupancy = 0;
    tel->factor_ns = gpu_now_ns() - t0;
    tel->factor_sort_ns = gpu_now_ns() - t4;
    return rc;
}

/* Everything up to the start of the main pass's upload: the factor pass,
 * plan, limits, residency; the upload in the background when `bg`.
 * dispatch_end does the rest. A batch with no work is not begun. */
static int dispatch_begin(struct batch_ctx *bc, bool bg, struct vks_error *err)
{
    struct gpu_engine *eng = bc->eng;
    struct gpu_telemetry *tel = bc->tel;
    int rc = gpu_plan_factor_choice(bc) ? factor_pass(bc, err) : 0;
    if (rc < 0) {
        free_gates(bc);
        return rc;
    }
    uint64_t t0 = gpu_now_ns();
    rc = gpu_plan_batch(bc, err);
    free_gates(bc);
    if (rc == 0)
        rc = check_limits(bc, err);
    uint64_t t1 = gpu_now_ns();
    if (rc == 0)
        rc = gpu_pick_pipelines(bc, err);
    tel->plan_pick_ns = gpu_now_ns() - t1;
    tel->plan_ns = gpu_now_ns() - t0;
    tel->items_total = bc->items_total;
    tel->rounds = bc->rounds;
    tel->workgroup_size = bc->plan.wg;
    tel->segment_bytes = bc->plan.seg_bytes;
    tel->hit_writer = eng->writer;
    if (rc < 0 || bc->items_total == 0)
        return rc;
    uint32_t cache_hits = tel->catalog_cache_hits;
    rc = make_resident(bc, err);
    if (bc->hay_resident) /* the factor pass counted this batch's catalogs */
        tel->catalog_cache_hits = cache_hits;
    if (rc == 0)
        rc = reserve_buffers(bc, err);
    if (rc == 0)
        rc = upload_start(bc, bg, err);
    bc->begun = rc == 0;
    return rc;
}

/* The rest of a begun batch: its upload joined, its pass recorded and
 * submitted. */
static int dispatch_end(struct batch_ctx *bc, struct vks_error *err)
{
    if (!bc->begun)
        return 0;
    bc->begun = false;
    return record_submit(bc, err);
}

/* Undoes a batch whose first pass was not submitted. Haystack chunks it
 * did submit still read its staging and command buffers: the frame is
 * reused only once the queue has run them. */
static void dispatch_abort(struct batch_ctx *bc)
{
    struct gpu_engine *eng = bc->eng;
    if (bc->up != NULL) { /* started, never joined */
        struct vks_error ignored;
        (void)upload_finish(bc, &ignored);
    }
    bc->begun = false;
    if (bc->chunks_out && !bc->submitted && !eng->broken &&
        vkQueueWaitIdle(eng->queue) != VK_SUCCESS)
        eng->broken = true;
    bc->chunks_out = false;
    release_cats(bc);
}

/* Waits for the batch's pass, reads it back, releases its catalogs. */
static int dispatch_finish(struct batch_ctx *bc, struct gpu_result *res, struct vks_error *err)
{
    int rc = 0;
    if (bc->submitted) {
        rc = wait_pass(bc, err);
        rc = read_passes(bc, rc, res, err);
    }
    release_cats(bc);
    return rc;
}

/* How far a batch is re-planned after cut loops: items of 1/256 the
 * modelled budget at the least. The shift stays with the engine, so on a
 * loaded lavapipe host (where a subgroup's claims can pass the model) a
 * long-lived engine keeps room for a few more re-plans. */
#define CUT_SHIFT_MAX 8u

/* Starts one attempt of `batch` on frame `fr` (swapped in): submits it,
 * or when `bg` leaves it begun with its upload in the background. */
static int attempt_submit(struct gpu_engine *eng, struct gpu_frame *fr,
                          const struct gpu_batch *batch, struct gpu_result *res, bool bg,
                          struct vks_error *err)
{
    struct batch_ctx *bc = &fr->bc;
    for (uint32_t cuts = 0;; cuts++) {
        *bc = (struct batch_ctx){.eng = eng, .batch = batch, .tel = &res->tel};
        for (uint32_t c = 0; c < GPU_MAX_BATCH_CATALOGS; c++)
            bc->cat_slot[c] = bc->alias[c] = -1;
        int rc = dispatch_begin(bc, bg, err);
        if (rc == 0 && !bg)
            rc = dispatch_end(bc, err);
        if (rc < 0)
            dispatch_abort(bc);
        /* the factor pass ran here, and the driver cut its loops (lavapipe):
         * plan smaller and start again, as retry_cut does for the main pass */
        if (rc != -EIO || !bc->cut || eng->cut_shift >= CUT_SHIFT_MAX)
            return rc;
        eng->cut_shift++;
        memset(&res->tel, 0, sizeof(res->tel));
        res->tel.cut_reruns = cuts + 1;
        vks_error_clear(err);
    }
}

/* The cost model undercounts some driver's loops (lavapipe, hit-dense
 * catalogs): nothing was reported from the cut pass, so plan smaller items,
 * for this batch and the ones after it, and run it again (synchronously,
 * on its own frame). */
static int retry_cut(struct gpu_engine *eng, struct gpu_frame *fr, int rc, struct vks_error *err)
{
    struct gpu_result *res = fr->res;
    const struct gpu_batch *batch = fr->bc.batch;
    if (rc == -EIO && fr->bc.cut)
        join_upload(eng); /* the re-run uploads and waits on the queue alone */
    for (uint32_t retries = 0; rc == -EIO && fr->bc.cut && eng->cut_shift < CUT_SHIFT_MAX;) {
        struct gpu_telemetry cut = res->tel; /* what the cut pass moved still counts */
        eng->cut_shift++;
        retries++;
        res->n_hits = 0;
        memset(&res->tel, 0, sizeof(res->tel));
        vks_error_clear(err);
        rc = attempt_submit(eng, fr, batch, res, false, err);
        if (rc == 0)
            rc = dispatch_finish(&fr->bc, res, err);
        res->tel.cut_reruns = retries;
        res->tel.catalog_bytes_uploaded += cut.catalog_bytes_uploaded;
        res->tel.haystack_bytes_uploaded += cut.haystack_bytes_uploaded;
        res->tel.meta_bytes_uploaded += cut.meta_bytes_uploaded;
        res->tel.bytes_read_back += cut.bytes_read_back;
        res->tel.device_idle_ns += cut.device_idle_ns;
        res->tel.inflight = cut.inflight;
        res->tel.collect_overlapped = cut.collect_overlapped;
    }
    return rc;
}

/* The engine-wide and whole-batch telemetry, once the batch is done. */
static void finish_tel(struct gpu_engine *eng, struct gpu_result *res, uint64_t host_ns,
                       uint64_t t_submit, int rc)
{
    struct gpu_telemetry *tel = &res->tel;
    tel->bytes_uploaded =
        tel->haystack_bytes_uploaded + tel->catalog_bytes_uploaded + tel->meta_bytes_uploaded;
    tel->bytes_moved = tel->bytes_uploaded + tel->bytes_read_back;
    tel->resident_allocations = eng->n_allocs;
    tel->resident_bytes = eng->alloc_bytes;
    tel->device_bytes = eng->device_bytes;
    tel->resident_catalogs = eng->n_cats;
    tel->total_ns = host_ns;
    tel->wall_ns = gpu_now_ns() - t_submit;
    if (rc < 0)
        res->n_hits = 0;
}

static struct gpu_frame *free_frame(struct gpu_engine *eng)
{
    for (uint32_t i = 0; i < eng->n_frames; i++) {
        if (!eng->frames[i].busy && &eng->frames[i] != eng->begun)
            return &eng->frames[i];
    }
    return NULL;
}

int gpu_batch_begin(struct gpu_engine *eng, const struct gpu_batch *batch, struct gpu_result *res,
                    struct vks_error *err)
{
    uint64_t t0 = gpu_now_ns();
    res->n_hits = 0;
    memset(&res->tel, 0, sizeof(res->tel));
    vks_error_clear(err);
    if (eng->begun != NULL)
        return vks_error_set(err, -EBUSY,
                             "a batch is begun on the engine: end it (gpu_batch_end) before "
                             "starting another");
    int rc = validate(eng, batch, err);
    if (rc < 0)
        return rc;
    struct gpu_frame *fr = free_frame(eng);
    if (fr == NULL)
        return vks_error_set(err, -EBUSY,
                             "%u batches are already in flight on the engine: collect one "
                             "before submitting another",
                             eng->n_frames);
    gpu_frame_swap(eng, fr);
    rc = attempt_submit(eng, fr, batch, res, true, err);
    gpu_frame_swap(eng, fr);
    fr->host_ns = gpu_now_ns() - t0;
    if (rc < 0) {
        finish_tel(eng, res, fr->host_ns, t0, rc);
        return rc;
    }
    fr->res = res;
    fr->t_submit = t0;
    eng->begun = fr;
    return 0;
}

int gpu_batch_end(struct gpu_engine *eng, struct vks_error *err)
{
    struct gpu_frame *fr = eng->begun;
    if (fr == NULL)
        return vks_error_set(err, -ENOENT, "no batch is begun: gpu_batch_begin one first");
    uint64_t t0 = gpu_now_ns();
    vks_error_clear(err);
    gpu_frame_swap(eng, fr);
    int rc = dispatch_end(&fr->bc, err);
    if (rc < 0)
        dispatch_abort(&fr->bc);
    gpu_frame_swap(eng, fr);
    eng->begun = NULL;
    fr->host_ns += gpu_now_ns() - t0;
    if (rc < 0) {
        finish_tel(eng, fr->res, fr->host_ns, fr->t_submit, rc);
        return rc;
    }
    fr->seq = eng->seq++;
    fr->busy = true;
    eng->n_busy++;
    return 0;
}

int gpu_batch_submit(struct gpu_engine *eng, const struct gpu_batch *batch, struct gpu_result *res,
                     struct vks_error *err)
{
    int rc = gpu_batch_begin(eng, batch, res, err);
    return rc < 0 ? rc : gpu_batch_end(eng, err);
}

bool gpu_batch_upload_help(struct gpu_engine *eng)
{
    if (eng->begun == NULL || eng->begun->bc.up == NULL || !eng->begun->bc.up->bg)
        return false;
    return upload_pool_help(eng->pool);
}

static struct gpu_frame *oldest_frame(const struct gpu_engine *eng)
{
    const struct gpu_frame *fr = NULL;
    for (uint32_t i = 0; i < eng->n_frames; i++) {
        if (eng->frames[i].busy && (fr == NULL || eng->frames[i].seq < fr->seq))
            fr = &eng->frames[i];
    }
    return (struct gpu_frame *)fr;
}

bool gpu_batch_oldest_done(const struct gpu_engine *eng)
{
    const struct gpu_frame *fr = oldest_frame(eng);
    if (fr == NULL)
        return false;
    /* no pass submitted (no work), or a broken engine: collected at once */
    if (!fr->bc.submitted || eng->broken)
        return true;
    return vkGetFenceStatus(eng->dev, fr->fence) == VK_SUCCESS;
}

int gpu_batch_collect(struct gpu_engine *eng, struct gpu_result **res, struct vks_error *err)
{
    struct gpu_frame *fr = oldest_frame(eng);
    if (fr == NULL)
        return vks_error_set(err, -ENOENT, "no batch is in flight: submit one before collecting");
    uint64_t t0 = gpu_now_ns();
    vks_error_clear(err);
    const struct upload_job *up = eng->begun != NULL ? eng->begun->bc.up : NULL;
    if (up != NULL && up->concurrent) { /* its upload threads fill while this one is read */
        eng->begun->res->tel.collect_overlapped = 1;
        eng->stats.collects_overlapped++;
    }
    gpu_frame_swap(eng, fr);
    int rc = dispatch_finish(&fr->bc, fr->res, err);
    rc = retry_cut(eng, fr, rc, err);
    gpu_frame_swap(eng, fr);
    fr->busy = false;
    eng->n_busy--;
    eng->stats.batches++;
    finish_tel(eng, fr->res, fr->host_ns + gpu_now_ns() - t0, fr->t_submit, rc);
    *res = fr->res;
    return rc;
}

int gpu_batch_dispatch(struct gpu_engine *eng, const struct gpu_batch *batch,
                       struct gpu_result *res, struct vks_error *err)
{
    if (eng->n_busy > 0 || eng->begun != NULL)
        return vks_error_set(err, -EBUSY,
                             "%u batches submitted with gpu_batch_submit are in flight%s: "
                             "collect them before a gpu_batch_dispatch",
                             eng->n_busy, eng->begun != NULL ? " and one is begun" : "");
    int rc = gpu_batch_submit(eng, batch, res, err);
    if (rc < 0)
        return rc;
    struct gpu_result *out;
    return gpu_batch_collect(eng, &out, err);
}

uint32_t gpu_engine_inflight(const struct gpu_engine *eng)
{
    return eng->n_busy;
}

uint32_t gpu_engine_max_inflight(const struct gpu_engine *eng)
{
    return eng->n_frames;
}

void gpu_engine_stats(const struct gpu_engine *eng, struct gpu_engine_stats *out)
{
    *out = eng->stats;
}

void gpu_result_finish(struct gpu_result *res)
{
    free(res->hits);
    memset(res, 0, sizeof(*res));
}

void gpu_telemetry_add(struct gpu_telemetry *sum, const struct gpu_telemetry *part)
{
    struct gpu_telemetry s = *part; /* the later part's state and choices */
#define ADD(f) s.f += sum->f
#define MAX(f) s.f = sum->f > s.f ? sum->f : s.f
    ADD(bytes_uploaded);
    ADD(haystack_bytes_uploaded);
    ADD(catalog_bytes_uploaded);
    ADD(meta_bytes_uploaded);
    ADD(bytes_read_back);
    ADD(bytes_moved);
    ADD(kernel_launches);
    ADD(submits);
    ADD(sync_points);
    ADD(pipeline_cache_hits);
    ADD(pipeline_compiles);
    ADD(catalog_cache_hits);
    ADD(catalog_uploads);
    ADD(catalog_evictions);
    ADD(rounds);
    ADD(items_total);
    ADD(items_processed);
    ADD(items_remaining);
    ADD(hits_raw);
    ADD(hit_reruns);
    ADD(hit_copy_submits);
    ADD(slices);
    ADD(cut_reruns);
    ADD(spec_items);
    ADD(spec_fixes);
    ADD(spec_fix_bytes);
    ADD(confirm_host);
    ADD(confirm_host_ns);
    ADD(factor_ns);
    ADD(factor_ends);
    ADD(plan_ns);
    ADD(plan_pre_ns);
    ADD(plan_runs_ns);
    ADD(spec_fix_ns);
    ADD(plan_pick_ns);
    ADD(buffers_made_ns);
    ADD(buffers_made_bytes);
    ADD(upload_ns);
    ADD(kernel_ns);
    ADD(device_ns);
    ADD(readback_ns);
    ADD(finalize_ns);
    ADD(hits_counted);
    ADD(hits_device_counted);
    ADD(spec_count_reruns);
    ADD(factor_plan_ns);
    ADD(factor_upload_ns);
    ADD(factor_wait_ns);
    ADD(factor_read_ns);
    ADD(factor_sort_ns);
    ADD(total_ns);
    ADD(wall_ns);
    ADD(device_idle_ns);
    ADD(collect_overlapped);
    for (int k = 0; k < GPU_PROF_KINDS; k++) {
        s.prof_ns[k] += sum->prof_ns[k];
        s.prof_dispatches[k] += sum->prof_dispatches[k];
    }
    MAX(workgroups);
    MAX(hit_capacity);
    MAX(inflight);
#undef ADD
#undef MAX
    *sum = s;
}

void gpu_batch_scratch_finish(struct batch_scratch *s)
{
    free(s->meta);
    free(s->offs);
    free(s->ranges);
    free(s->counts);
    free(s->pairs);
    free(s->fixes);
    free(s->fix_hits);
    free(s->unhits);
    free(s->fix_layers);
    free(s->ctab);
    free(s->cbase);
    free(s->bin_base);
    free(s->bin_cnt);
    free(s->bin_start);
    free(s->bin_kept);
    free(s->task_bin);
    free(s->keys);
    free(s->bin_buf);
    free(s->key_cnt);
    free(s->once_tab);
    free(s->bin_out);
    free(s->single);
    scan_hits_finish(&s->one);
    memset(s, 0, sizeof(*s));
}
