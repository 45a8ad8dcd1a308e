/*
 * The scan megakernel: walks one catalog group's DFA over work items of a
 * batch and appends every match to the hit ring. docs/gpu.md describes the
 * design; rules/refscan.c is the CPU walk this must equal, byte for byte.
 *
 * One dispatch covers one (catalog, group, round) range of work items.
 * Persistent workers claim items with an atomic head (qs[pc.head]) until the
 * range is empty or their loop budget is spent. An item is one segment of a
 * buffer: uvec4(buffer, lo, hi, chain). Bounded groups start maxlen-1 bytes
 * before lo + 1 and report ends in (lo, hi]; chained (unbounded) ranges start
 * at lo from the state the previous round left in carry[]. Speculative
 * ranges (pc.spec != NONE, unbounded groups on long buffers) start maxlen-1
 * bytes before lo + 1 from a start state, as bounded ones do, and record
 * the state they had at lo and at hi in qs[spec + 2 * item]: the host
 * checks that each guess at lo equals where the segment before ended and
 * re-walks the rare segments whose guess was wrong (gpu/batch.c). Ranges
 * the host marks counted (pc.count) count the matches of buffers in modes
 * count and first per rule instead of appending them (count_report).
 *
 * Built twice by glslc: HIT_SUBGROUP=0 (one atomic per hit) and
 * HIT_SUBGROUP=1 (one atomic per subgroup and accepting step); and each of
 * those again with FUSED=1: one dispatch steps NG bounded DFA groups of one
 * catalog together over the same items, each byte read once for all of
 * them (docs/gpu.md, "Fused DFA groups"). The groups' parameters are then
 * a table in meta[] (gpu/plan.c fuse_table), not push constants.
 */
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#if HIT_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_vote : require
#endif

layout(local_size_x_id = 0) in;
/* Transition words of the group kept in shared memory (its first rows). */
layout(constant_id = 1) const uint SMEM_WORDS = 1024u;
/* Loop iterations one invocation may run. lavapipe cuts every loop of an
 * invocation short once their iterations add up to 65535, so there a worker
 * stops claiming before it could cross the budget; elsewhere it is ~0u. */
layout(constant_id = 2) const uint STEP_BUDGET = 0xffffffffu;

/* Queue-state words; gpu/batch.c mirrors them (QS_*). */
const uint QS_HIT_HEAD = 0u;
const uint QS_DONE = 1u;
const uint QS_ACTIVE = 2u;
const uint QS_ERROR = 3u;
const uint QS_ERR_CUT = 1u;

const uint K_WORD = 0u;
const uint K_NL = 1u;
const uint K_OTHER = 2u;
const uint K_EOD = 3u;
const uint K_NL_LAST = 4u;
const uint NONE = 0xffffffffu;

layout(std430, set = 0, binding = 0) readonly buffer Hay { uvec4 hay[]; };
layout(std430, set = 0, binding = 1) readonly buffer Cat { uint cat[]; };
layout(std430, set = 0, binding = 2) readonly buffer Meta { uvec4 meta[]; };
layout(std430, set = 0, binding = 3) buffer Queue { uint qs[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Hits { uvec4 hits[]; };
layout(std430, set = 0, binding = 5) buffer Carry { uint carry[]; };

#if FUSED
/* NG (glslc -DNG=2, 3 or 4): the groups stepped together. The steps of
 * the groups are written out, not looped over, so that each group's
 * parameters stay in registers (and lavapipe, which counts loop
 * iterations, counts no loop per byte). */
#if NG < 2 || NG > 4
#error "NG must be 2, 3 or 4"
#endif

layout(push_constant) uniform Push {
    uint items;    /* meta index of the range's first item */
    uint n_items;
    uint head;     /* qs word the workers claim from */
    uint bufs;     /* meta index of the buffer table: uvec4(offset, len, 0, 0) */
    uint max_cost; /* loop iterations of the costliest item */
    uint hit_cap;
    uint maxlen;   /* the longest maxlen of the groups: every walk's lookback */
    uint gtab;     /* meta index of the group table: 4 uvec4 per group */
    uint count;    /* 1: buffers with a count table word count here (below) */
} pc;

/* Group g's table entries (gpu/plan.c fuse_table mirrors them). */
const uint G_SHAPE = 0u;  /* (n_classes, acc_row, first_accept, layer) */
const uint G_WORDS = 1u;  /* (classmap, trans, accidx, accepts) */
const uint G_SMEM = 2u;   /* (trans_words, first s_tr word, s_tr words, 0) */
const uint G_STARTS = 3u; /* (bos, word, nl, other) start states */

shared uint s_cls[256u * NG];
shared uint s_tr[SMEM_WORDS];

/* Per group, in registers: the loops over groups are unrolled. */
uint f_ncls[NG];  /* n_classes */
uint f_accrow[NG];
uint f_hot[NG];   /* u16 entries of the group present in s_tr */
uint f_soff[NG];  /* its first s_tr word */
uint f_trans[NG];
uint f_row[NG];   /* each group's state * n_classes during a walk */

uvec4 group_word(uint g, uint k)
{
    return meta[pc.gtab + 4u * g + k];
}
#else
layout(push_constant) uniform Push {
    uint items;       /* meta index of the range's first item */
    uint n_items;
    uint head;        /* qs word the workers claim from */
    uint bufs;        /* meta index of the buffer table: uvec4(offset, len, 0, 0) */
    uint carry_base;  /* NONE for bounded ranges */
    uint max_cost;    /* loop iterations of the costliest item */
    uint hit_cap;
    uint layer;       /* group index, reported in hit word 2 */
    uint n_classes;
    uint acc_row;     /* first_accept * n_classes */
    uint first_accept;
    uint maxlen;
    uint classmap;    /* word offsets into cat[] */
    uint trans;
    uint accidx;
    uint accepts;
    uint trans_words;
    uint start_bos;
    uint start_word;
    uint start_nl;
    uint start_other;
    uint packed;      /* 1: s_tr holds two u16 transitions per word */
    uint spec;        /* qs word of item 0's (state at lo, state at hi); NONE */
    uint mask_or;     /* 31: every accept entry counts (the factor pass), else 0 */
    uint count;       /* 1: buffers with a count table word count here (below) */
} pc;

shared uint s_cls[256];
shared uint s_tr[SMEM_WORDS];
#endif

uint g_iters; /* loop iterations run so far by this invocation */
uint g_hot;   /* transition words present in s_tr */

uint byte_at(uint p)
{
    return (hay[p >> 4u][(p >> 2u) & 3u] >> ((p & 3u) * 8u)) & 0xffu;
}

uint kind_of(uint c)
{
    bool word = (c >= 0x61u && c <= 0x7au) || (c >= 0x41u && c <= 0x5au) ||
                (c >= 0x30u && c <= 0x39u) || c == 0x5fu;
    return word ? K_WORD : (c == 10u ? K_NL : K_OTHER);
}

/* Where the accept entries of the state at `row` are: cat[acc + e] for e
 * in [e0, e1), each ORed with `mask_or`, reported under `layer`. A fused
 * walk's rows carry their group in bits 28 and up (f_step). */
struct accept_span {
    uint e0, e1, acc, mask_or, layer;
};

accept_span accepts_of(uint row)
{
#if FUSED
    uint g = row >> 28u;
    uvec4 sh = group_word(g, G_SHAPE);
    uvec4 w = group_word(g, G_WORDS);
    uint a = (row & 0x0fffffffu) / sh.x - sh.z;
    return accept_span(cat[w.z + a], cat[w.z + a + 1u], w.w, 0u, sh.w);
#else
    uint a = row / pc.n_classes - pc.first_accept;
    return accept_span(cat[pc.accidx + a], cat[pc.accidx + a + 1u], pc.accepts, pc.mask_or,
                       pc.layer);
#endif
}

#include "count.glsl"

/* The accept entries of state row/n_classes that admit kind k, counted. */
void count_report(uint row, uint end, uint k)
{
    accept_span sp = accepts_of(row);
    uint bit = 1u << k;
    for (uint e = sp.e0; e < sp.e1; e++) {
        uint ent = cat[sp.acc + e] | sp.mask_or;
        if ((ent & bit) != 0u)
            count_hit(ent >> 5u, end);
    }
}

#if HIT_SUBGROUP
/* Accepting steps wait in a small per-invocation queue and are written in
 * batches: the invocations of a subgroup flush together, with one atomic
 * on the hit head for all their hits, when one of them has more than
 * PEND - 16 queued (checked before each 16 bytes, so a block never
 * overflows the queue) and at the end of each item. Writing each
 * accepting step at once cost a subgroup-wide atomic round trip per step
 * in which any lane accepted: hit-dense sets ran several times slower
 * than sparse ones (docs/gpu.md). */
const uint PEND = 24u;
uint g_np;          /* queued steps */
uint g_prow[PEND];  /* their states (row = state * n_classes) */
uint g_pend[PEND];  /* their end offsets */
uint g_pkind[3];    /* their lookahead kinds, 3 bits each, 8 a word */

uint pend_kind(uint p)
{
    return (g_pkind[p >> 3u] >> (3u * (p & 7u))) & 7u;
}

/* Writes the queued steps of the active invocations of the subgroup as
 * matches of buffer `buf` and empties the queues. */
void flush(uint buf)
{
    uint n = 0u;
    /* a loop the driver cut short (lavapipe's budget) would lose hits
     * silently: each loop checks that it ran to its end (QS_ERR_CUT, the
     * host re-plans smaller and re-runs) */
    bool cut = false;
    uint p = 0u;
    for (; p < g_np; p++) {
        accept_span sp = accepts_of(g_prow[p]);
        uint bit = 1u << pend_kind(p);
        uint e = sp.e0;
        for (; e < sp.e1; e++)
            n += ((cat[sp.acc + e] | sp.mask_or) & bit) != 0u ? 1u : 0u;
        cut = cut || e != sp.e1;
    }
    cut = cut || p != g_np;
    uint total = subgroupAdd(n);
    uint before = subgroupExclusiveAdd(n);
    uint base = 0u;
    if (total != 0u && subgroupElect())
        base = atomicAdd(qs[QS_HIT_HEAD], total);
    uint slot = subgroupBroadcastFirst(base) + before;
    for (p = 0u; p < g_np; p++) {
        accept_span sp = accepts_of(g_prow[p]);
        uint bit = 1u << pend_kind(p);
        uint e = sp.e0;
        for (; e < sp.e1; e++) {
            uint ent = cat[sp.acc + e] | sp.mask_or;
            if ((ent & bit) == 0u)
                continue;
            if (slot < pc.hit_cap)
                hits[slot] = uvec4(buf, ent >> 5u, sp.layer, g_pend[p]);
            slot++;
        }
        cut = cut || e != sp.e1;
    }
    if (cut || p != g_np)
        atomicOr(qs[QS_ERROR], QS_ERR_CUT);
    g_np = 0u;
    g_pkind[0] = 0u;
    g_pkind[1] = 0u;
    g_pkind[2] = 0u;
}

/* Queues the accept entries of state row/n_classes whose lookahead mask
 * admits kind k, as matches of buffer `buf` ending at `end`. */
void report(uint row, uint buf, uint end, uint k)
{
    if (g_cbase != NONE) {
        count_report(row, end, k);
        return;
    }
    g_prow[g_np] = row;
    g_pend[g_np] = end;
    g_pkind[g_np >> 3u] |= k << (3u * (g_np & 7u));
    g_np++;
}

/* Room for `room` more steps in every lane's queue. */
void pend_room(uint buf, uint room)
{
    if (subgroupAny(g_np > PEND - room))
        flush(buf);
}

/* Room for 16 more steps in every lane's queue. */
void pend_check(uint buf)
{
    pend_room(buf, 16u);
}
#else
/* Reports the accept entries of state row/n_classes whose lookahead mask
 * admits kind k, as matches of buffer `buf` ending at `end`. */
void report(uint row, uint buf, uint end, uint k)
{
    if (g_cbase != NONE) {
        count_report(row, end, k);
        return;
    }
    accept_span sp = accepts_of(row);
    uint bit = 1u << k;
    for (uint e = sp.e0; e < sp.e1; e++) {
        uint ent = cat[sp.acc + e] | sp.mask_or;
        if ((ent & bit) == 0u)
            continue;
        uint slot = atomicAdd(qs[QS_HIT_HEAD], 1u);
        if (slot < pc.hit_cap)
            hits[slot] = uvec4(buf, ent >> 5u, sp.layer, end);
    }
}

void flush(uint buf)
{
}

void pend_room(uint buf, uint room)
{
}

void pend_check(uint buf)
{
}
#endif

#if !FUSED
/* One DFA step over byte c at position i: accepts of the current state are
 * checked first, with c as lookahead, then c is consumed. */
uint step(uint row, uint c, uint i, uint lo, uint len, uint buf)
{
    if (row >= pc.acc_row && i > lo) {
        uint k = kind_of(c);
        if (k == K_NL && i + 1u == len)
            k = K_NL_LAST;
        report(row, buf, i, k);
    }
    uint idx = row + s_cls[c];
    uint next;
    if (idx < g_hot) {
        next = pc.packed != 0u ? (s_tr[idx >> 1u] >> ((idx & 1u) * 16u)) & 0xffffu : s_tr[idx];
    } else {
        next = cat[pc.trans + idx];
    }
    return next * pc.n_classes;
}

uint step4(uint row, uint w, uint i, uint lo, uint len, uint buf)
{
    row = step(row, w & 0xffu, i, lo, len, buf);
    row = step(row, (w >> 8u) & 0xffu, i + 1u, lo, len, buf);
    row = step(row, (w >> 16u) & 0xffu, i + 2u, lo, len, buf);
    return step(row, w >> 24u, i + 3u, lo, len, buf);
}

/* Walks bytes [from, to) of the buffer at `off` from `row`; reports ends
 * in (lo, to) (the end at `to` is the caller's). */
uint walk(uint row, uint from, uint to, uint off, uint lo, uint len, uint buf)
{
    uint i = from;
    while (i < to && (i & 15u) != 0u) {
        row = step(row, byte_at(off + i), i, lo, len, buf);
        i++;
    }
    while (i + 16u <= to) {
        pend_check(buf);
        uvec4 v = hay[(off + i) >> 4u];
        row = step4(row, v.x, i, lo, len, buf);
        row = step4(row, v.y, i + 4u, lo, len, buf);
        row = step4(row, v.z, i + 8u, lo, len, buf);
        row = step4(row, v.w, i + 12u, lo, len, buf);
        i += 16u;
    }
    pend_check(buf);
    while (i < to) {
        row = step(row, byte_at(off + i), i, lo, len, buf);
        i++;
    }
    if (i != to)
        atomicOr(qs[QS_ERROR], QS_ERR_CUT);
    return row;
}

void scan_item(uvec4 it, uint idx)
{
    uint buf = it.x;
    uint lo = it.y;
    uint hi = it.z;
    uvec4 b = meta[pc.bufs + buf];
    uint off = b.x;
    uint len = b.y;
    count_begin(b.z);
    bool chained = pc.carry_base != NONE;
    uint begin = chained ? lo : (lo + 1u > pc.maxlen ? lo + 1u - pc.maxlen : 0u);

    uint state;
    if (begin == 0u) {
        state = pc.start_bos;
    } else if (chained) {
        state = carry[pc.carry_base + it.w];
    } else {
        uint k = kind_of(byte_at(off + begin - 1u));
        state = k == K_WORD ? pc.start_word : (k == K_NL ? pc.start_nl : pc.start_other);
    }
    uint row = state * pc.n_classes;

    /* the lookback [begin, lo) reports nothing (step reports ends > lo) */
    row = walk(row, begin, lo, off, lo, len, buf);
    if (pc.spec != NONE)
        qs[pc.spec + 2u * idx] = row / pc.n_classes;
    row = walk(row, lo, hi, off, lo, len, buf);

    if (row >= pc.acc_row && hi > lo) {
        uint k = K_EOD;
        if (hi < len) {
            k = kind_of(byte_at(off + hi));
            if (k == K_NL && hi + 1u == len)
                k = K_NL_LAST;
        }
        report(row, buf, hi, k);
    }
    count_out();
    flush(buf);
    if (chained && hi < len)
        carry[pc.carry_base + it.w] = row / pc.n_classes;
    if (pc.spec != NONE)
        qs[pc.spec + 2u * idx + 1u] = row / pc.n_classes;
}

void main()
{
    uint wg = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationIndex;
    g_iters = 0u;
#if HIT_SUBGROUP
    g_np = 0u;
    g_pkind[0] = 0u;
    g_pkind[1] = 0u;
    g_pkind[2] = 0u;
#endif
    for (uint k = lid; k < 256u; k += wg) {
        s_cls[k] = cat[pc.classmap + k];
        g_iters++;
    }
    /* The first rows of the transition table: with states numbered from
     * the start state outwards, they are the states a scan spends most of
     * its time in. Two u16 entries per word when states fit in 16 bits. */
    if (pc.packed != 0u) {
        g_hot = min(2u * SMEM_WORDS, pc.trans_words);
        uint words = (g_hot + 1u) / 2u;
        for (uint k = lid; k < words; k += wg) {
            uint lo16 = cat[pc.trans + 2u * k];
            uint hi16 = 2u * k + 1u < g_hot ? cat[pc.trans + 2u * k + 1u] : 0u;
            s_tr[k] = lo16 | (hi16 << 16u);
            g_iters++;
        }
    } else {
        g_hot = min(SMEM_WORDS, pc.trans_words);
        for (uint k = lid; k < g_hot; k += wg) {
            s_tr[k] = cat[pc.trans + k];
            g_iters++;
        }
    }
    barrier();

    /* The host bounds the iterations of every item (walk, unaligned ends,
     * accept loops) by max_cost; counting that worst case per claim keeps
     * the subgroup's total, which is what lavapipe limits, in budget. */
    uint done = 0u;
    for (;;) {
        if (STEP_BUDGET != 0xffffffffu && g_iters + pc.max_cost + 1u > STEP_BUDGET)
            break;
        g_iters += pc.max_cost + 1u;
        uint idx = atomicAdd(qs[pc.head], 1u);
        if (idx >= pc.n_items)
            break;
        scan_item(meta[pc.items + idx], idx);
        done++;
    }
    if (done != 0u) {
        atomicAdd(qs[QS_DONE], done);
        atomicAdd(qs[QS_ACTIVE], 1u);
    }
}
#else /* FUSED */

/* One step of group g (a constant: every call is written out) over byte c
 * at position i, as step() above; the row handed to report() carries g in
 * bits 28 and up (rows are below 2^24: u16 states, at most 256 classes). */
uint f_step(uint g, uint row, uint c, uint i, uint lo, uint len, uint buf)
{
    if (row >= f_accrow[g] && i > lo) {
        uint k = kind_of(c);
        if (k == K_NL && i + 1u == len)
            k = K_NL_LAST;
        report(row | (g << 28u), buf, i, k);
    }
    uint idx = row + s_cls[256u * g + c];
    uint next;
    if (idx < f_hot[g]) {
        next = (s_tr[f_soff[g] + (idx >> 1u)] >> ((idx & 1u) * 16u)) & 0xffffu;
    } else {
        next = cat[f_trans[g] + idx];
    }
    return next * f_ncls[g];
}

/* Every group one step over byte c at i. */
void f_byte(uint c, uint i, uint lo, uint len, uint buf)
{
    f_row[0] = f_step(0u, f_row[0], c, i, lo, len, buf);
    f_row[1] = f_step(1u, f_row[1], c, i, lo, len, buf);
#if NG > 2
    f_row[2] = f_step(2u, f_row[2], c, i, lo, len, buf);
#endif
#if NG > 3
    f_row[3] = f_step(3u, f_row[3], c, i, lo, len, buf);
#endif
}

void f_byte4(uint w, uint i, uint lo, uint len, uint buf)
{
    f_byte(w & 0xffu, i, lo, len, buf);
    f_byte((w >> 8u) & 0xffu, i + 1u, lo, len, buf);
    f_byte((w >> 16u) & 0xffu, i + 2u, lo, len, buf);
    f_byte(w >> 24u, i + 3u, lo, len, buf);
}

/* Walks bytes [from, to) with every group; reports ends in (lo, to). Four
 * bytes an iteration (buffers start 16-byte aligned): a byte queues up to
 * NG steps, so the queue is checked before each 4 bytes, and the loop body
 * stays small (every step of every group is written out in it once; a
 * 16-byte body made the shader several times larger, and lavapipe, which
 * compiles it at the first dispatch, took tens of seconds). gpu/plan.c
 * counts an iteration per 4 bytes (fused_cost). */
void f_walk(uint from, uint to, uint off, uint lo, uint len, uint buf)
{
    uint i = from;
    while (i < to && (i & 3u) != 0u) {
        pend_room(buf, NG);
        f_byte(byte_at(off + i), i, lo, len, buf);
        i++;
    }
    while (i + 4u <= to) {
        pend_room(buf, 4u * NG);
        uint p = off + i;
        f_byte4(hay[p >> 4u][(p >> 2u) & 3u], i, lo, len, buf);
        i += 4u;
    }
    while (i < to) {
        pend_room(buf, NG);
        f_byte(byte_at(off + i), i, lo, len, buf);
        i++;
    }
    if (i != to)
        atomicOr(qs[QS_ERROR], QS_ERR_CUT);
}

/* Group g's registers, and its start row for start kind `sk` (0 start of
 * data, 1 after a word byte, 2 after \n, 3 after another byte). */
void f_load(uint g)
{
    uvec4 sh = group_word(g, G_SHAPE);
    uvec4 sm = group_word(g, G_SMEM);
    f_ncls[g] = sh.x;
    f_accrow[g] = sh.y;
    f_hot[g] = min(2u * sm.z, sm.x);
    f_soff[g] = sm.y;
    f_trans[g] = group_word(g, G_WORDS).y;
}

void f_start(uint g, uint sk)
{
    f_row[g] = group_word(g, G_STARTS)[sk] * f_ncls[g];
}

void f_end(uint g, uint buf, uint hi, uint k)
{
    if (f_row[g] >= f_accrow[g])
        report(f_row[g] | (g << 28u), buf, hi, k);
}

/* A bounded item (lo, hi]: every group starts pc.maxlen - 1 bytes before
 * lo + 1, the lookback of the longest of them. A group with a shorter
 * maxlen starts earlier than it needs to, which changes nothing: no match
 * of it that ends after lo starts before its own lookback. */
void f_item(uvec4 it)
{
    uint buf = it.x;
    uint lo = it.y;
    uint hi = it.z;
    uvec4 b = meta[pc.bufs + buf];
    uint off = b.x;
    uint len = b.y;
    count_begin(b.z);
    uint begin = lo + 1u > pc.maxlen ? lo + 1u - pc.maxlen : 0u;
    uint sk = 0u;
    if (begin != 0u) {
        uint k = kind_of(byte_at(off + begin - 1u));
        sk = k == K_WORD ? 1u : (k == K_NL ? 2u : 3u);
    }
    f_start(0u, sk);
    f_start(1u, sk);
#if NG > 2
    f_start(2u, sk);
#endif
#if NG > 3
    f_start(3u, sk);
#endif
    /* one walk: the lookback [begin, lo] reports nothing (ends > lo only) */
    f_walk(begin, hi, off, lo, len, buf);
    if (hi > lo) {
        uint k = K_EOD;
        if (hi < len) {
            k = kind_of(byte_at(off + hi));
            if (k == K_NL && hi + 1u == len)
                k = K_NL_LAST;
        }
        pend_room(buf, NG);
        f_end(0u, buf, hi, k);
        f_end(1u, buf, hi, k);
#if NG > 2
        f_end(2u, buf, hi, k);
#endif
#if NG > 3
        f_end(3u, buf, hi, k);
#endif
    }
    count_out();
    flush(buf);
}

void main()
{
    uint wg = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationIndex;
    g_iters = 0u;
#if HIT_SUBGROUP
    g_np = 0u;
    g_pkind[0] = 0u;
    g_pkind[1] = 0u;
    g_pkind[2] = 0u;
#endif
    /* each group's class map, and the first rows of its transitions in
     * its own slice of s_tr (gpu/plan.c sizes the slices) */
    for (uint g = 0u; g < NG; g++) {
        uvec4 w = group_word(g, G_WORDS);
        uvec4 sm = group_word(g, G_SMEM);
        for (uint k = lid; k < 256u; k += wg) {
            s_cls[256u * g + k] = cat[w.x + k];
            g_iters++;
        }
        uint hot = min(2u * sm.z, sm.x);
        uint words = (hot + 1u) / 2u;
        for (uint k = lid; k < words; k += wg) {
            uint lo16 = cat[w.y + 2u * k];
            uint hi16 = 2u * k + 1u < hot ? cat[w.y + 2u * k + 1u] : 0u;
            s_tr[sm.y + k] = lo16 | (hi16 << 16u);
            g_iters++;
        }
        g_iters++;
    }
    f_load(0u);
    f_load(1u);
#if NG > 2
    f_load(2u);
#endif
#if NG > 3
    f_load(3u);
#endif
    barrier();

    uint done = 0u;
    for (;;) {
        if (STEP_BUDGET != 0xffffffffu && g_iters + pc.max_cost + 1u > STEP_BUDGET)
            break;
        g_iters += pc.max_cost + 1u;
        uint idx = atomicAdd(qs[pc.head], 1u);
        if (idx >= pc.n_items)
            break;
        f_item(meta[pc.items + idx]);
        done++;
    }
    if (done != 0u) {
        atomicAdd(qs[QS_DONE], done);
        atomicAdd(qs[QS_ACTIVE], 1u);
    }
}
#endif /* FUSED */
