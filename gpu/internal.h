/*
 * gpu/ internals shared by its .c files: the engine struct, buffers, the
 * pipeline LRU, the upload thread pool. Nothing outside gpu/ includes this.
 */
#ifndef VKS_GPU_INTERNAL_H
#define VKS_GPU_INTERNAL_H

#include <pthread.h>
#include <vulkan/vulkan.h>

#include "gpu.h"

/* Queue-state words (shaders/scan.comp mirrors them). Per-range claim heads
 * follow QS_HEADS. */
enum {
    QS_HIT_HEAD = 0,
    QS_DONE = 1,
    QS_ACTIVE = 2,
    QS_ERROR = 3,
    QS_HEADS = 8,
};
#define QS_ERR_CUT 1u

/* Push constants, in the order of scan.comp's Push block. */
struct scan_push {
    uint32_t items, n_items, head, bufs, carry_base, max_cost, hit_cap, layer;
    uint32_t n_classes, acc_row, first_accept, maxlen, classmap, trans, accidx, accepts;
    uint32_t trans_words, start_bos, start_word, start_nl, start_other, packed, spec;
    uint32_t mask_or; /* CAT_ACCEPT_ALWAYS for the factor pass's ranges */
    uint32_t count;   /* 1: counted on the device where the buffer's table word allows */
};

/* Push constants of shaders/scan_nfa.comp (bit-NFA ranges); no larger
 * than struct scan_push, whose size the pipeline layout declares. */
struct nfa_push {
    uint32_t items, n_items, head, bufs, carry_base, max_cost, hit_cap, layer;
    uint32_t n_words, maxlen, classmap, reach, shift, n_exc, exc, n_acc, acc, ranges, cap, spec;
    uint32_t x_narrow, x_span, count;
};
_Static_assert(sizeof(struct nfa_push) <= sizeof(struct scan_push), "push constant range");

/* Push constants of shaders/scan.comp built FUSED: several bounded DFA
 * groups of one catalog over the same items, their parameters in a table
 * of GPU_FUSE_WORDS uvec4 per group at meta index gtab (gpu/plan.c). */
struct fuse_push {
    uint32_t items, n_items, head, bufs, max_cost, hit_cap, maxlen, gtab, count;
};
_Static_assert(sizeof(struct fuse_push) <= sizeof(struct scan_push), "push constant range");
#define GPU_FUSE_WORDS 4u

/* Push constants of shaders/scan_lit.comp (gpu/lit.h). */
struct lit_push {
    uint32_t items, n_items, head, bufs, max_cost, hit_cap, slots, slot_mask;
    uint32_t lits, bytes, masks, klen, fold, maxlen, hi_mask, wshift, count;
};
_Static_assert(sizeof(struct lit_push) <= sizeof(struct scan_push), "push constant range");

#define NO_CARRY            0xffffffffu
#define NO_BUDGET           0xffffffffu
#define LAVAPIPE_LOOP_LIMIT 65535u
#define MAX_UPLOAD_CHUNKS   64u

/* One VkBuffer with its own memory. `map` is set for host-visible memory. */
struct gbuf {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    VkDeviceSize alloc; /* bytes of the memory allocation */
    void *map;
    bool device; /* counted against the device-memory budget */
    bool coherent;
};

enum gbuf_kind {
    GBUF_DEVICE,   /* device-local, written by copies or (direct) mapped */
    GBUF_STAGING,  /* host-visible, write-combined is fine */
    GBUF_READBACK, /* host-visible, cached when the device has it */
};

/* A catalog's device copy. Slots are stable while batches are in flight
 * (they hold slot indexes): a freed slot is only marked unused. */
struct resident_catalog {
    uint8_t fp[CATALOG_FP_LEN];
    struct gbuf buf;
    uint64_t last_use;
    uint32_t words;
    bool used;
    /* The submit that copies its contents succeeded (or they were written
     * through a mapping): later submissions see them, in queue order. */
    bool uploaded;
    uint32_t pins;   /* batches in flight that scan it: never evicted meanwhile */
    bool forget;     /* gpu_engine_forget while pinned: freed when the last pin goes */
    struct gbuf lit; /* the literal kernel's tables (gpu/lit.h), when it has some */
};

#define GPU_REFUSED_MAX 16u /* pipelines the driver refused, remembered */

struct pipe_key {
    uint32_t writer; /* GPU_HITS_SCALAR or GPU_HITS_SUBGROUP */
    uint32_t wg;
    uint32_t smem_words;
    uint32_t step_budget;
    uint32_t nfa_words; /* 0: the DFA kernel; else the bit-NFA kernel's MAX_WORDS */
    uint32_t lit;       /* 1: the literal kernel (smem_words: its filter words) */
    uint32_t fuse;      /* 2-4: the DFA kernel stepping that many groups (FUSED); else 0 */
};

struct pipe_entry {
    struct pipe_key key;
    VkPipeline pipe;
    uint64_t last_use;
};

struct plan_key {
    uint64_t catalogs; /* hash of the batch's fingerprints */
    uint32_t n_buffers;
    uint32_t size_log2;
    uint32_t max_len_log2;
    uint32_t pad; /* zero: keys are compared with memcmp */
};

struct launch_plan {
    uint32_t wg;
    uint32_t seg_bytes;
    uint32_t lit_seg_bytes; /* the literal kernel's segments (plan_lit) */
    uint32_t chain_bytes;
    uint32_t max_workgroups;
    uint32_t step_budget;
    uint32_t smem_cap; /* most shared transition words a pipeline may hold */
};

struct plan_entry {
    struct plan_key key;
    struct launch_plan plan;
    uint64_t last_use;
    bool used;
};
#define PLAN_CACHE 16u

struct upload_pool;
struct upload_job;
struct gpu_lit;

/* Catalogs whose literal tables the engine keeps (gpu/lit.c): at least a
 * batch's catalogs, so planning one never evicts its own. */
#define GPU_LIT_CACHE (2u * GPU_MAX_BATCH_CATALOGS)

/* One dispatch: a range of work items of one (catalog, group, round). */
struct scan_range {
    uint32_t cat;   /* index into the batch's catalogs */
    uint32_t group; /* engine group: DFA groups, then bit-NFA groups */
    bool nfa;       /* bit-NFA group group - catalog_group_count */
    bool lit;       /* the literal kernel: every routed group of catalog cat */
    bool confirm;   /* a bounded group's forward confirmation (the kernel's confirm mode) */
    bool overlap;   /* its items may report a (rule, end) twice: forward confirmations */
    bool factor;    /* the factor pass: a factor group's every entry reported */
    bool counted;   /* hits of counted buffers go to their counters, not the ring */
    /* fused DFA ranges: groups stepped together (group is the first, the
     * others are in the table at gtab); 0 for every other range */
    uint32_t fuse;
    uint32_t gtab;
    uint32_t round;
    uint32_t items; /* meta index (uvec4) of the first item */
    uint32_t n_items;
    uint32_t carry_base; /* NO_CARRY for bounded groups */
    /* Speculative ranges (unbounded DFA groups in segments, docs/gpu.md):
     * the qs word of item 0's (state at lo, state at hi); else NO_CARRY. */
    uint32_t spec_base;
    uint32_t look;     /* speculative ranges: lookback bytes before an item's lo */
    uint32_t max_cost; /* loop iterations of the costliest item */
    uint32_t cap;      /* confirmation ranges: bytes an item walks past hi (NO_CARRY: all) */
    uint32_t smem_words;
    uint32_t workgroups;
    VkPipeline pipe;
};

/* Host-side scratch reused between batches (grown, never shrunk). */
struct batch_scratch {
    uint32_t *meta;  /* uvec4 words: buffer table then items */
    size_t meta_cap; /* in uvec4 */
    uint64_t *offs;  /* haystack byte offset of each buffer, plus the end */
    size_t offs_cap;
    struct scan_range *ranges;
    size_t ranges_cap;
    uint32_t *counts; /* per-buffer hit counts while sorting */
    size_t counts_cap;
    uint64_t *pairs; /* (rule << 32 | end) sorted by buffer */
    size_t pairs_cap;
    struct scan_hits one; /* one buffer's hits through scan_hits_finalize */
    /* Repaired speculative segments (batch.c spec_repair): the device's
     * hits of (buf, layer) with ends in (lo, upto) are dropped, and the
     * host's walk's hits there go in instead. (confirm_finish keeps the
     * start intervals [lo, upto) of live confirmation items in the same
     * shape.) */
    struct spec_fix {
        uint32_t buf, layer;
        uint64_t lo, upto;
    } * fixes;
    size_t fixes_cap;
    struct gpu_hit *fix_hits; /* sorted by buffer */
    size_t fix_hits_cap;
    /* Of repaired segments of ranges that counted on the device: the
     * guessed walk's matches in (lo, upto), which the device counted and
     * the host takes out of the counts again (hits.c merge_counts); sorted
     * by buffer */
    struct gpu_hit *unhits;
    size_t unhits_cap;
    /* a bit per engine group (layer) with a fix, fix_words words: the
     * finish looks a raw hit up in the fixes only where its layer has one */
    uint64_t *fix_layers;
    size_t fix_layers_cap, fix_words;
    /* hits.c's pool path: bins of (buffer, end range), their keys */
    uint32_t *bin_base, *bin_cnt, *bin_kept, *task_bin;
    size_t bin_base_cap, bin_cnt_cap, bin_kept_cap, task_bin_cap;
    uint64_t *bin_start, *keys;
    size_t bin_start_cap, keys_cap;
    uint32_t *bin_buf, *key_cnt, *once_tab; /* per bin, per key, per (task, rule) x 2 */
    size_t bin_buf_cap, key_cnt_cap, once_tab_cap;
    uint64_t *bin_out; /* per bin: where its hits go in the result */
    size_t bin_out_cap;
    uint8_t *single; /* per (catalog, rule): RULE_F_SINGLEMATCH */
    uint32_t *ctab;  /* counting finish: per (thread, buffer, rule) a count and a first end */
    size_t ctab_cap;
    uint64_t *cbase; /* counting finish: per buffer its first table entry, [n]: entries */
    size_t cbase_cap;
    size_t single_cap;
};

/* One batch from its submit to its collect (one attempt of it, when the
 * driver cut a loop and it is re-planned). */
struct batch_ctx {
    /* gpu_options.profile: the kind of each timed dispatch of the pass */
    uint8_t prof_kind[GPU_PROF_RANGES];
    uint32_t n_prof;
    bool cut; /* the driver cut a scan loop short: re-plan smaller and re-run */
    struct gpu_engine *eng;
    const struct gpu_batch *batch;
    struct gpu_telemetry *tel;
    struct launch_plan plan;
    int cat_slot[GPU_MAX_BATCH_CATALOGS]; /* index into eng->cats, -1 until resident */
    bool cat_new[GPU_MAX_BATCH_CATALOGS];
    int alias[GPU_MAX_BATCH_CATALOGS];      /* earlier batch catalog with the same fingerprint */
    uint32_t seg[GPU_MAX_BATCH_CATALOGS];   /* segment bytes per catalog */
    uint32_t chain[GPU_MAX_BATCH_CATALOGS]; /* chained walk bytes per round */
    uint32_t acc_iters[GPU_MAX_BATCH_CATALOGS]; /* accept-loop iterations per byte, worst */
    /* The literal tables of each catalog (owned by the engine's cache,
     * valid until the submit returns), whether this batch routes its
     * literal groups to the literal kernel, and then the tables' push
     * constants (what a re-run at collect reads). */
    struct gpu_lit *lit[GPU_MAX_BATCH_CATALOGS];
    bool lit_route[GPU_MAX_BATCH_CATALOGS];
    struct lit_push lit_pc[GPU_MAX_BATCH_CATALOGS];
    uint64_t hay_bytes;
    size_t n_meta; /* uvec4 */
    size_t n_ranges;
    uint32_t rounds;
    uint32_t n_carry; /* words */
    uint32_t n_spec;  /* qs words after the heads for speculative ranges' states */
    /* Counting on the device (docs/gpu.md): qs words after the spec words,
     * a (count, ~first end) pair per (counted buffer, rule); the buffer
     * table's third word is each buffer's first, NO_CARRY where its hits
     * go to the ring. 0: nothing counted on the device. */
    uint32_t n_count;
    size_t n_fixes, n_fix_hits, n_unhits;
    bool has_confirm; /* a range has capped confirmation items (markers to look for) */
    /* The pass's ranges cannot report a (rule, end) of a buffer twice:
     * literal and bounded DFA ranges only (items own disjoint ends), of
     * catalogs whose rules report under their own indexes (gpu_lit) */
    bool hits_unique;
    /* The factor pass (docs/gpu.md): while factor_phase, the plan holds only
     * the factor groups of the catalogs in gates_of; after it, `gates` holds
     * every buffer's factor ends (sorted by group, end) for those catalogs,
     * the haystack is on the device (hay_resident) and the plan uses them
     * instead of walking the factor groups on the host. */
    bool factor_phase;
    bool hay_resident;
    bool gates_of[GPU_MAX_BATCH_CATALOGS];
    struct refscan_gate *gates;
    uint64_t items_total;
    uint64_t workers;
    uint64_t new_cat_bytes;
    uint64_t t_read; /* when the last pass's fence signalled */
    /* Discrete devices: hits the pass's own command buffer copies to
     * hits_host after its dispatches (reserve_buffers' guess); a pass with
     * at most that many needs no second submit for them (copy_hits) */
    uint64_t hits_copied;
    bool pinned;       /* holds a pin on each distinct cat_slot */
    bool submitted;    /* the pass is on the queue: gpu_batch_collect waits for it */
    bool chunks_out;   /* haystack chunk copies were submitted without a fence */
    uint64_t t_submit; /* when the first pass was submitted */
    /* The upload started by the batch's begin (batch.c upload_start), joined
     * at its end (upload_finish); NULL before and after. Owned. */
    struct upload_job *up;
    uint64_t t_upload; /* when it started */
    bool begun;        /* planned and its upload started: record and submit are left */
};

/*
 * One batch on the device: the buffers, command buffers, fence and host
 * scratch a batch owns from its submit to its collect. The engine has
 * opt.inflight frames. While gpu/ works on a frame, gpu_frame_swap moves
 * its resources into the engine's fields of the same names (hay, staging,
 * ..., scratch), which the batch code and plan.c use; outside a call those
 * engine fields are empty.
 */
struct gpu_frame {
    struct gbuf hay, staging, meta, qs, qs_host, hits, hits_host, carry;
    VkCommandBuffer cmd;
    VkCommandBuffer upcmd[MAX_UPLOAD_CHUNKS];
    VkFence fence;
    VkQueryPool qpool;
    VkDescriptorSet sets[GPU_MAX_BATCH_CATALOGS];
    struct batch_scratch scratch;

    bool busy;    /* submitted, not yet collected */
    uint64_t seq; /* submission order: collected oldest first */
    struct batch_ctx bc;
    struct gpu_result *res;
    uint64_t t_submit; /* when its gpu_batch_submit call began */
    uint64_t host_ns;  /* time spent in the submit call */
};

struct gpu_engine {
    VkInstance inst;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    struct gpu_device_info info;
    VkPhysicalDeviceMemoryProperties mem;
    uint32_t ts_valid_bits;
    float ts_period;

    uint64_t budget;
    uint64_t device_bytes; /* live device-local allocations */
    /* Work items are planned 2^-cut_shift of the loop budget the cost model
     * allows: raised each time the driver still cut a loop (lavapipe). */
    uint32_t cut_shift;
    uint32_t n_allocs;
    uint64_t alloc_bytes;
    uint64_t made_bytes; /* every allocation's size, summed since the engine opened */
    uint64_t stage_high; /* the most staging a batch has needed (stage_size) */
    bool direct;         /* device-local memory is host-visible on a CPU/integrated device */
    bool broken;         /* a batch timed out or the device was lost */
    uint64_t timeout_ns;
    enum gpu_hit_writer writer;
    struct gpu_options opt;
    char *cache_path;

    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipelineCache pcache;
    VkShaderModule modules[3]; /* indexed by enum gpu_hit_writer */
    /* the fused DFA kernel: [NG - 2][enum gpu_hit_writer] */
    VkShaderModule fused_modules[GPU_FUSE_MAX - 1][3];
    VkShaderModule nfa_module; /* shaders/scan_nfa.comp */
    VkShaderModule lit_module; /* shaders/scan_lit.comp */
    struct gpu_lit *lits[GPU_LIT_CACHE];
    struct pipe_entry pipes[GPU_PIPELINE_LRU];
    uint32_t n_pipes;
    /* Pipelines the driver refused to build (not for want of memory), with
     * its VkResult: asked for again, they fail at once (-ENOTSUP) instead
     * of compiling again; the oldest is forgotten past GPU_REFUSED_MAX. */
    struct pipe_key refused[GPU_REFUSED_MAX];
    VkResult refused_r[GPU_REFUSED_MAX];
    uint32_t n_refused;
    VkDescriptorPool dpool;
    VkDescriptorSet sets[GPU_MAX_BATCH_CATALOGS];

    VkCommandPool cpool;
    VkCommandBuffer cmd;
    VkCommandBuffer upcmd[MAX_UPLOAD_CHUNKS];
    VkFence fence;
    VkQueryPool qpool;

    /* hits: the ring, device-local on discrete devices, whose used prefix
     * is copied to hits_host after the pass; mapped directly elsewhere. */
    struct gbuf hay, staging, meta, qs, qs_host, hits, hits_host, carry;

    struct resident_catalog cats[GPU_MAX_RESIDENT_CATALOGS];
    uint32_t n_cats;
    uint64_t tick;

    struct plan_entry plans[PLAN_CACHE];
    struct upload_pool *pool;
    struct batch_scratch scratch;

    struct gpu_frame frames[GPU_MAX_INFLIGHT];
    uint32_t n_frames;
    /* Catalogs whose speculative ranges lost the counting bet lately
     * (gpu_spec_counted_wrong): their next SPEC_LOST_SKIP (plan.c) batches
     * keep those ranges on the ring instead of paying a re-run each time. */
    struct spec_lost {
        uint8_t fp[CATALOG_FP_LEN];
        uint32_t skip; /* batches left; 0: a free entry */
    } spec_lost[8];
    uint32_t spec_lost_next; /* the entry a new loss takes when none is free */
    /* The most raw hits per haystack byte a batch with more hits than the
     * initial ring has had (16.16 fixed point): a frame sizes its ring from
     * it before a batch runs, so that each frame does not re-run its first
     * hit-dense batch to grow it. */
    uint64_t hit_rate_seen;
    uint64_t hit_rate_last; /* the last collected pass's hits per 64 KiB: hits_copied's guess */
    uint32_t n_busy;        /* frames submitted and not collected */
    uint64_t seq;           /* next submission's sequence number */
    VkDescriptorPool fpool; /* descriptor sets of frames 1.. (frame 0 has eng->sets) */
    /* Device occupancy as the host sees it: passes submitted and not yet
     * waited for. */
    uint32_t on_device;
    uint64_t busy_since; /* when on_device went from 0 to 1 */
    uint64_t idle_since; /* when it last went to 0; 0 before the first pass */
    struct gpu_engine_stats stats;
    /* The frame of the batch gpu_batch_begin started and gpu_batch_end has
     * not submitted yet (not busy, not swapped in); NULL when none. */
    struct gpu_frame *begun;
    /* While that batch's upload runs on the pool's threads (whose tasks
     * submit haystack chunks), the lock every vkQueueSubmit on the engine's
     * thread takes too: the queue is externally synchronized. NULL
     * otherwise: the engine's thread is then the queue's only user. */
    pthread_mutex_t *qlock;
};

/* Swaps frame `fr`'s resources with the engine's fields of the same names
 * (its own inverse): in before working on a frame, out after. */
void gpu_frame_swap(struct gpu_engine *eng, struct gpu_frame *fr);

/* plan.c: lays out the haystack, writes the work items and ranges into the
 * engine's scratch, picks the launch plan (through the plan cache) and each
 * range's pipeline. Both return 0 or a negative errno with `err` filled. */
int gpu_plan_batch(struct batch_ctx *bc, struct vks_error *err);
/* Sets bc->gates_of for the catalogs whose factor ends the device finds
 * (gpu_options.factor_pass); whether there is any. */
bool gpu_plan_factor_choice(struct batch_ctx *bc);
/* Index of cat's factor group (CAT_GF_FACTOR), or UINT32_MAX. */
uint32_t gpu_factor_group(const struct catalog *cat);
int gpu_pick_pipelines(struct batch_ctx *bc, struct vks_error *err);

/* plan.c: the push constants of bit-NFA range `sr` (batch.c records it). */
void gpu_nfa_push(const struct batch_ctx *bc, const struct scan_range *sr, uint32_t head,
                  struct nfa_push *pc);

/* hits.c: the collected pass's raw hits (and the host's fix hits) into
 * res, per buffer in (end, rule) order with its report mode; sets the
 * readback and finalize telemetry. */
/* The factor pass's raw hits (buffer, group, layer, end) into bc->gates:
 * per buffer sorted by (group, end), each once; on the upload threads
 * when there are many. Returns 0 or -ENOMEM. */
int gpu_gather_gates(struct batch_ctx *bc, const uint32_t *raw, uint64_t n);
int gpu_finish_hits(struct batch_ctx *bc, const uint32_t *raw, uint64_t n, struct gpu_result *res,
                    struct vks_error *err);

/* repair.c: the host's work on a collected pass before its hits are
 * grouped (`qs` the queue state, `raw` its n raw hits): speculative
 * segments walked again where their guessed start state was wrong, and
 * confirmations the device left unfinished. Fills the scratch's fixes and
 * fix hits, sorted. Returns 0 or a negative code with `err` set. */
int gpu_host_finish(struct batch_ctx *bc, const uint32_t *qs, const uint32_t *raw, uint64_t n,
                    struct vks_error *err);

/* After gpu_host_finish: the batch catalog of a repaired segment that
 * counted on the device whose guessed walk matched where the true walk did
 * not, at the least end the device's table holds for that rule, else -1.
 * Taking that match out of the count leaves the rule's first end unknown,
 * so the pass runs again with the speculative ranges on the ring (batch.c
 * read_passes). The guessed walk starts later than the true one, so its
 * matches are the true walk's too, and this is not expected. */
int gpu_unhits_unsure(const struct batch_ctx *bc, const uint32_t *qs);

/* plan.c: catalog `cat`'s speculative ranges lost the counting bet; its
 * next batches keep them on the ring (gpu_engine.spec_lost). */
void gpu_spec_lost(struct gpu_engine *eng, const struct catalog *cat);

/* Grows `*p` (elements of `elem` bytes, capacity `*cap`) to hold `need`,
 * doubling; returns 0 or -ENOMEM, leaving `*p` intact on failure. */
int gpu_grow_array(void **p, size_t *cap, size_t need, size_t elem);

/* Frees the batch scratch (engine destroy). */
void gpu_batch_scratch_finish(struct batch_scratch *s);

/* Turns a failed VkResult into our error: -ENOMEM for out-of-memory results,
 * -ENODEV for VK_ERROR_DEVICE_LOST, -ETIMEDOUT for VK_TIMEOUT, else -EIO. */
int gpu_vk_error(VkResult r, const char *what, struct vks_error *err);

/* Allocates `size` bytes (at least 16) of `kind` memory into `b`; returns 0
 * or a negative errno with `err` filled. `b` must be zeroed or destroyed. */
int gbuf_create(struct gpu_engine *eng, struct gbuf *b, VkDeviceSize size, VkBufferUsageFlags usage,
                enum gbuf_kind kind, struct vks_error *err);
void gbuf_destroy(struct gpu_engine *eng, struct gbuf *b);

/* Makes `b` at least `size` bytes, reallocating (contents lost) when it is
 * smaller; the new size is gbuf_grow_size's. */
int gbuf_reserve(struct gpu_engine *eng, struct gbuf *b, VkDeviceSize size,
                 VkBufferUsageFlags usage, enum gbuf_kind kind, struct vks_error *err);

/* Size gbuf_reserve would allocate for `size` given the current `have`. */
VkDeviceSize gbuf_grow_size(VkDeviceSize have, VkDeviceSize size);

/* Finds or compiles the pipeline of `key` (LRU of GPU_PIPELINE_LRU);
 * `*hit` says whether it was cached. A pipeline the driver cannot build
 * (VK_ERROR_UNKNOWN for a bit-NFA kernel of MAX_WORDS 2048 on an H100; out
 * of memory) is -ENOTSUP: the batch's scans go to the CPU engine and the
 * device stays usable. Refusals other than for memory are remembered, so
 * the same pipeline is not compiled again until the engine is re-created. */
int gpu_pipeline_get(struct gpu_engine *eng, const struct pipe_key *key, VkPipeline *out, bool *hit,
                     struct vks_error *err);
int gpu_pipeline_init(struct gpu_engine *eng, struct vks_error *err);
void gpu_pipeline_finish(struct gpu_engine *eng);

/* Thread pool that runs `fn(ctx, i)` for i in [0, n) and returns when all
 * are done; the calling thread takes part. Called by the engine's thread
 * only (one run at a time). */
typedef void (*pool_fn)(void *ctx, uint32_t i);
int upload_pool_create(uint32_t threads, struct upload_pool **out);
void upload_pool_run(struct upload_pool *p, pool_fn fn, void *ctx, uint32_t n);
/* The same job in the background: upload_pool_start hands its tasks to the
 * pool's threads and returns at once (whether the pool has threads of its
 * own to run them: false means nothing runs before the wait);
 * upload_pool_help runs one task of it on the caller's thread (false: none
 * was left to hand out); upload_pool_wait runs the rest on the caller's
 * thread and returns when all are done (at once when none was started).
 * One background job at a time; upload_pool_run may run meanwhile, and the
 * threads take its tasks first. `ctx` is borrowed until the wait returns. */
bool upload_pool_start(struct upload_pool *p, pool_fn fn, void *ctx, uint32_t n);
bool upload_pool_help(struct upload_pool *p);
void upload_pool_wait(struct upload_pool *p);
uint32_t upload_pool_threads(const struct upload_pool *p);
void upload_pool_destroy(struct upload_pool *p);

uint64_t gpu_now_ns(void);

#endif
