/*
 * The bit-NFA scan kernel: walks one catalog bit-NFA group (rules/bitnfa.h,
 * docs/engine.md) over work items and appends every match to the hit ring.
 * rules/refscan.c (refscan_nfa_range) is the CPU walk this must equal.
 *
 * Work items, claiming, the hit ring, the loop budget and chained rounds
 * are scan.comp's. The state vector (one bit per position) lives in the
 * invocation's private arrays; a chained (unbounded) group hands it to the
 * next round in carry[carry_base + buffer * n_words ...].
 */
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 2) const uint STEP_BUDGET = 0xffffffffu;
/* Words of the largest state vector this pipeline walks (>= n_words). */
layout(constant_id = 3) const uint MAX_WORDS = 4u;

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

/* gpu/internal.h mirrors this block (struct nfa_push). */
layout(push_constant) uniform Push {
    uint items;
    uint n_items;
    uint head;
    uint bufs;
    uint carry_base; /* NONE for bounded ranges */
    uint max_cost;
    uint hit_cap;
    uint layer; /* engine group index (DFA groups first), hit word 2 */
    uint n_words;
    uint maxlen;
    uint classmap; /* word offsets into cat[] */
    uint reach;
    uint shift;
    uint n_exc;
    uint exc;
    uint n_acc;
    uint acc;
    uint ranges;
    uint cap; /* confirmations: bytes an item walks past hi; NONE: to the end */
    /* Speculative ranges (ungated unbounded groups, gpu/plan.c): qs word of
     * item 0's state vectors at lo and at hi (2 * n_words words an item);
     * the item starts maxlen - 1 bytes early with an empty state. NONE. */
    uint spec;
    /* exceptions x_narrow.. span at most x_span + 1 words and are sorted by
     * their first source word (rules/catalog.h) */
    uint x_narrow;
    uint x_span;
    uint count; /* 1: buffers with a count table count here (count.glsl) */
} pc;

shared uint s_cls[256];

uint g_iters;
uint st[MAX_WORDS];
uint nx[MAX_WORDS];

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

/* The (previous, next) condition bit at offset i: previous kind P_BOS (0),
 * P_WORD (1), P_NL (2), P_OTHER (3); next kind CAT_K_*. */
uint pk_at(uint off, uint i, uint len)
{
    uint p = i == 0u ? 0u : kind_of(byte_at(off + i - 1u)) + 1u;
    uint k = K_EOD;
    if (i < len) {
        k = kind_of(byte_at(off + i));
        if (k == K_NL && i + 1u == len)
            k = K_NL_LAST;
    }
    return 1u << (p * 5u + k);
}

uint range_mask(uint w, uint lo, uint hi)
{
    uint m = 0xffffffffu;
    if (w == (lo >> 5u))
        m &= 0xffffffffu << (lo & 31u);
    if (w == (hi >> 5u))
        m &= 0xffffffffu >> (31u - (hi & 31u));
    return m;
}

bool any_in(uint first, uint n)
{
    for (uint r = 0u; r < n; r++) {
        uint lo = cat[pc.ranges + 2u * (first + r)];
        uint hi = cat[pc.ranges + 2u * (first + r) + 1u];
        for (uint w = lo >> 5u; w <= (hi >> 5u); w++) {
            if ((st[w] & range_mask(w, lo, hi)) != 0u)
                return true;
        }
    }
    return false;
}

void set_in(uint first, uint n)
{
    for (uint r = 0u; r < n; r++) {
        uint lo = cat[pc.ranges + 2u * (first + r)];
        uint hi = cat[pc.ranges + 2u * (first + r) + 1u];
        for (uint w = lo >> 5u; w <= (hi >> 5u); w++)
            nx[w] |= range_mask(w, lo, hi);
    }
}

/* Live words: st is zero outside [g_slo, g_shi] (empty when g_slo >
 * g_shi), nx outside [g_nlo, g_nhi]. A step touches only those words, and
 * skips the exceptions and accepts whose source span the state cannot meet
 * (range lists are ascending: rules/catalog.c checks it). */
uint g_slo, g_shi, g_nlo, g_nhi;

bool span_meets(uint first, uint n)
{
    if (n == 0u || g_slo > g_shi)
        return false;
    uint a = cat[pc.ranges + 2u * first] >> 5u;
    uint b = cat[pc.ranges + 2u * (first + n - 1u) + 1u] >> 5u;
    return a <= g_shi && b >= g_slo;
}

#include "count.glsl"

/* Reports each rule with an accept entry that holds at end offset `end`
 * once (entries are sorted by rule), or counts it (count.glsl). */
void report(uint buf, uint end, uint pk)
{
    uint last = NONE;
    for (uint k = 0u; k < pc.n_acc; k++) {
        uint e = pc.acc + 4u * k;
        uint rule = cat[e];
        if (rule == last || (cat[e + 1u] & pk) == 0u || !span_meets(cat[e + 3u], cat[e + 2u]) ||
            !any_in(cat[e + 3u], cat[e + 2u]))
            continue;
        last = rule;
        if (g_cbase != NONE) {
            count_hit(rule, end);
            continue;
        }
        uint slot = atomicAdd(qs[QS_HIT_HEAD], 1u);
        if (slot < pc.hit_cap)
            hits[slot] = uvec4(buf, rule, pc.layer, end);
    }
}

/* Consumes byte c: shift, exceptions, reach. Start edges fire only with
 * `starts` (forward confirmation allows starts in one interval only). */
void step(uint c, uint pk, bool starts)
{
    for (uint w = g_nlo; w <= g_nhi; w++)
        nx[w] = 0u;
    bool any = g_slo <= g_shi;
    uint lo = NONE;
    uint hi = 0u;
    if (any) {
        uint end = min(g_shi + 1u, pc.n_words - 1u);
        for (uint w = g_slo; w <= end; w++) {
            uint carry_bit = w > 0u ? st[w - 1u] >> 31u : 0u;
            nx[w] = ((st[w] << 1u) | carry_bit) & cat[pc.shift + w];
        }
        lo = g_slo;
        hi = end;
    }
    /* start edges, wide exceptions, then the narrow ones near the live
     * words only: from the first whose sources can reach g_slo (a binary
     * search) to the first that starts past g_shi */
    uint x = 0u;
    uint xend = pc.x_narrow;
    for (uint part = 0u; part < 2u; part++) {
        for (; x < xend; x++) {
            uint e = pc.exc + 4u * x;
            uint nsrc = cat[e + 1u];
            if (nsrc != 0u && !any)
                break; /* entries without sources (start edges) come first */
            uint first = cat[e + 3u];
            if (part == 1u && (cat[pc.ranges + 2u * first] >> 5u) > g_shi)
                break;
            if ((cat[e] & pk) == 0u || (nsrc == 0u && !starts))
                continue;
            if (nsrc != 0u && (!span_meets(first, nsrc) || !any_in(first, nsrc)))
                continue;
            uint ntgt = cat[e + 2u];
            set_in(first + nsrc, ntgt);
            lo = min(lo, cat[pc.ranges + 2u * (first + nsrc)] >> 5u);
            hi = max(hi, cat[pc.ranges + 2u * (first + nsrc + ntgt - 1u) + 1u] >> 5u);
        }
        if (!any || pc.x_narrow >= pc.n_exc)
            break;
        uint from = g_slo > pc.x_span ? g_slo - pc.x_span : 0u;
        uint a = pc.x_narrow;
        uint z = pc.n_exc;
        while (a < z) {
            uint m = a + (z - a) / 2u;
            if ((cat[pc.ranges + 2u * cat[pc.exc + 4u * m + 3u]] >> 5u) < from)
                a = m + 1u;
            else
                z = m;
        }
        x = a;
        xend = pc.n_exc;
    }
    /* st's live words lie inside [lo, hi]: all of them are rewritten */
    uint row = pc.reach + s_cls[c] * pc.n_words;
    g_slo = 1u;
    g_shi = 0u;
    g_nlo = 1u;
    g_nhi = 0u;
    if (lo == NONE)
        return;
    g_nlo = lo;
    g_nhi = hi;
    for (uint w = lo; w <= hi; w++) {
        uint v = nx[w] & cat[row + w];
        st[w] = v;
        if (v != 0u) {
            if (g_slo > g_shi)
                g_slo = w;
            g_shi = w;
        }
    }
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
    /* An unbounded group's item that is not chained is a forward
     * confirmation (CAT_GF_CONFIRM, gpu/plan.c): starts only in [lo, hi),
     * then on until the state dies, the buffer ends or the walk reaches
     * its cap, hi + pc.cap: an item alive there is left to the host, which
     * learns of it from a hit with rule NONE and end = the item's index
     * (gpu/batch.c confirm_finish). */
    bool confirm = !chained && pc.maxlen == NONE;
    uint begin = chained || confirm ? lo : (lo + 1u > pc.maxlen ? lo + 1u - pc.maxlen : 0u);
    uint stop = hi;
    if (confirm)
        stop = pc.cap == NONE || len - hi <= pc.cap ? len : hi + pc.cap;
    uint cbase = pc.carry_base + it.w * pc.n_words;
    g_slo = 1u;
    g_shi = 0u;
    g_nlo = 1u;
    g_nhi = 0u;
    for (uint w = 0u; w < pc.n_words; w++) {
        st[w] = chained && begin > 0u ? carry[cbase + w] : 0u;
        nx[w] = 0u;
        if (st[w] != 0u) {
            if (g_slo > g_shi)
                g_slo = w;
            g_shi = w;
        }
    }
    bool spec = pc.spec != NONE;
    uint sbase = spec ? pc.spec + 2u * idx * pc.n_words : 0u;
    uint i = begin;
    while (i < stop) {
        if (confirm && i >= hi && g_slo > g_shi)
            break;
        if (spec && i == lo) {
            for (uint w = 0u; w < pc.n_words; w++)
                qs[sbase + w] = st[w];
        }
        uint pk = pk_at(off, i, len);
        if (g_slo <= g_shi && i > lo)
            report(buf, i, pk);
        step(byte_at(off + i), pk, !confirm || i < hi);
        i++;
    }
    if (i != stop && !(confirm && i >= hi && g_slo > g_shi))
        atomicOr(qs[QS_ERROR], QS_ERR_CUT);
    if (g_slo <= g_shi && stop > lo)
        report(buf, stop, pk_at(off, stop, len));
    count_out();
    if (confirm && g_slo <= g_shi && stop < len) {
        uint slot = atomicAdd(qs[QS_HIT_HEAD], 1u);
        if (slot < pc.hit_cap)
            hits[slot] = uvec4(buf, NONE, pc.layer, idx);
    }
    if (chained && hi < len) {
        for (uint w = 0u; w < pc.n_words; w++)
            carry[cbase + w] = st[w];
    }
    if (spec) {
        for (uint w = 0u; w < pc.n_words; w++)
            qs[sbase + pc.n_words + w] = st[w];
    }
}

void main()
{
    uint wg = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationIndex;
    g_iters = 0u;
    for (uint k = lid; k < 256u; k += wg) {
        s_cls[k] = cat[pc.classmap + k];
        g_iters++;
    }
    barrier();
    /* max_cost bounds every loop iteration of an item (gpu/plan.c,
     * nfa_byte_cost), as in scan.comp. */
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
