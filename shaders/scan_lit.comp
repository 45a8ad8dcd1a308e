/*
 * The literal kernel: every string of a catalog's literal groups in one
 * pass (gpu/lit.h; docs/gpu.md, "The literal kernel"). gpu/lit.c builds
 * the tables and holds the same key, hash and filter bits: change both.
 *
 * Work items are those of scan.comp: uvec4(buffer, lo, hi, 0), ends
 * reported in (lo, hi], the walk starting maxlen - 1 bytes before lo + 1.
 * Each invocation rolls the last K bytes (K = klen, 4..8) into a key, looks
 * the key's filter word up in shared memory, and only where its 4 bits are
 * all set probes the slot table and compares the slot's strings byte by
 * byte. A hit is uvec4(buffer, rule, group, end), as the DFA kernel's.
 */
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
/* Filter words (a power of two), all in shared memory. */
layout(constant_id = 1) const uint FILTER_WORDS = 4096u;
/* Loop iterations one invocation may run (lavapipe; see scan.comp). */
layout(constant_id = 2) const uint STEP_BUDGET = 0xffffffffu;

const uint QS_HIT_HEAD = 0u;
const uint NONE = 0xffffffffu;
const uint QS_DONE = 1u;
const uint QS_ACTIVE = 2u;
const uint QS_ERROR = 3u;
const uint QS_ERR_CUT = 1u;

const uint MIX_A = 0x85ebca77u;
const uint MIX_B = 0x9e3779b1u;
const uint MIX_C = 0x7feb352du;
const uint FILTER_MUL = 0x846ca68bu;

layout(std430, set = 0, binding = 0) readonly buffer Hay { uvec4 hay[]; };
layout(std430, set = 0, binding = 2) readonly buffer Meta { uvec4 meta[]; };
layout(std430, set = 0, binding = 3) buffer Queue { uint qs[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Hits { uvec4 hits[]; };
layout(std430, set = 0, binding = 6) readonly buffer Lit { uint lit[]; };

layout(push_constant) uniform Push {
    uint items;     /* meta index of the range's first item */
    uint n_items;
    uint head;      /* qs word the workers claim from */
    uint bufs;      /* meta index of the buffer table */
    uint max_cost;  /* loop iterations of the costliest item */
    uint hit_cap;
    uint slots;     /* word offsets into lit[] */
    uint slot_mask;
    uint lits;
    uint bytes;
    uint masks;
    uint klen;      /* key bytes, 4..8 */
    uint fold;      /* 0x20 when some string is caseless, else 0 */
    uint maxlen;    /* longest string */
    uint hi_mask;   /* the key bytes of the word before the last 4 */
    uint wshift;    /* 32 - log2(FILTER_WORDS) */
    uint count;     /* 1: buffers with a count table count here (count.glsl) */
} pc;

shared uint s_f[FILTER_WORDS];

uint g_iters;
uint g_lo; /* the last 4 bytes rolled in, the latest lowest */
uint g_hi; /* the 4 before them */

uint byte_at(uint p)
{
    return (hay[p >> 4u][(p >> 2u) & 3u] >> ((p & 3u) * 8u)) & 0xffu;
}

uint lit_byte(uint base, uint i)
{
    return (lit[base + (i >> 2u)] >> ((i & 3u) * 8u)) & 0xffu;
}

uint mix(uint lo, uint hi)
{
    uint a = (lo ^ (hi * MIX_A)) * MIX_B;
    a ^= a >> 16u;
    a *= MIX_C;
    a ^= a >> 15u;
    return a;
}

bool filter_pass(uint a)
{
    uint b = a * FILTER_MUL;
    uint m = (1u << (b >> 27u)) | (1u << ((b >> 22u) & 31u)) | (1u << ((b >> 17u) & 31u)) |
             (1u << ((b >> 12u) & 31u));
    return (s_f[a >> pc.wshift] & m) == m;
}

/* Rolls byte c in (folded already); whether the key now ending there
 * passes the filter. */
bool roll(uint c)
{
    g_hi = (g_hi << 8u) | (g_lo >> 24u);
    g_lo = (g_lo << 8u) | c;
    return filter_pass(mix(g_lo, g_hi & pc.hi_mask));
}

#include "count.glsl"

void emit(uint buf, uint rule, uint group, uint end)
{
    if (g_cbase != NONE) {
        count_hit(rule, end);
        return;
    }
    uint slot = atomicAdd(qs[QS_HIT_HEAD], 1u);
    if (slot < pc.hit_cap)
        hits[slot] = uvec4(buf, rule, group, end);
}

/* The strings that may start at s (its key passed the filter): probe the
 * slots, compare the strings of the key's slot, report those that end in
 * (lo, hi]. */
void confirm(uint s, uint off, uint buf, uint lo, uint hi)
{
    uint klo = 0u, khi = 0u;
    for (uint k = 0u; k < pc.klen; k++) {
        khi = (khi << 8u) | (klo >> 24u);
        klo = (klo << 8u) | (byte_at(off + s + k) | pc.fold);
    }
    khi &= pc.hi_mask;
    uint slot = mix(klo, khi) & pc.slot_mask;
    for (;;) {
        uint base = pc.slots + 4u * slot;
        uint n = lit[base + 3u];
        if (n == 0u)
            return;
        if (lit[base] == klo && lit[base + 1u] == khi) {
            uint first = lit[base + 2u];
            for (uint i = first; i < first + n; i++) {
                uint rec = pc.lits + 4u * i;
                uint boff = lit[rec];
                uint len = lit[rec + 1u];
                uint end = s + len;
                if (end <= lo || end > hi)
                    continue;
                /* without folding the key holds the first klen bytes */
                uint k = pc.fold != 0u ? 0u : pc.klen;
                while (k < len && (byte_at(off + s + k) | lit_byte(pc.masks, boff + k)) ==
                                      lit_byte(pc.bytes, boff + k))
                    k++;
                if (k == len)
                    emit(buf, lit[rec + 2u], lit[rec + 3u], end);
            }
            return;
        }
        slot = (slot + 1u) & pc.slot_mask;
    }
}

/* Rolls the 4 (folded) bytes of w in: bit t set when the key ending at
 * byte t passes the filter. */
uint roll4(uint w)
{
    /* unrolled by hand: lavapipe counts every loop iteration */
    uint m = roll(w & 0xffu) ? 1u : 0u;
    m |= roll((w >> 8u) & 0xffu) ? 2u : 0u;
    m |= roll((w >> 16u) & 0xffu) ? 4u : 0u;
    m |= roll(w >> 24u) ? 8u : 0u;
    return m;
}

void scan_item(uvec4 it)
{
    uint buf = it.x;
    uint lo = it.y;
    uint hi = it.z;
    uvec4 b = meta[pc.bufs + buf];
    uint off = b.x;
    count_begin(b.z);
    uint begin = lo + 1u > pc.maxlen ? lo + 1u - pc.maxlen : 0u;
    /* the first position whose key holds klen bytes of this walk */
    uint valid = begin + pc.klen - 1u;
    g_lo = 0u;
    g_hi = 0u;

    uint f4 = pc.fold * 0x01010101u;
    uint i = begin;
    while (i < hi && (i & 15u) != 0u) {
        if (roll(byte_at(off + i) | pc.fold) && i >= valid)
            confirm(i + 1u - pc.klen, off, buf, lo, hi);
        i++;
    }
    while (i + 16u <= hi) {
        uvec4 v = hay[(off + i) >> 4u] | uvec4(f4);
        uint cand = roll4(v.x) | (roll4(v.y) << 4u) | (roll4(v.z) << 8u) | (roll4(v.w) << 12u);
        if (i < valid) /* keys that do not hold klen bytes of this walk yet */
            cand &= valid - i >= 16u ? 0u : 0xffffu << (valid - i);
        while (cand != 0u) {
            uint t = uint(findLSB(cand));
            cand &= cand - 1u;
            confirm(i + t + 1u - pc.klen, off, buf, lo, hi);
        }
        i += 16u;
    }
    while (i < hi) {
        if (roll(byte_at(off + i) | pc.fold) && i >= valid)
            confirm(i + 1u - pc.klen, off, buf, lo, hi);
        i++;
    }
    if (i != hi)
        atomicOr(qs[QS_ERROR], QS_ERR_CUT);
    count_out();
}

void main()
{
    uint wg = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationIndex;
    g_iters = 0u;
    for (uint k = lid; k < FILTER_WORDS; k += wg) {
        s_f[k] = lit[k];
        g_iters++;
    }
    barrier();

    uint done = 0u;
    for (;;) {
        if (STEP_BUDGET != 0xffffffffu && g_iters + pc.max_cost + 1u > STEP_BUDGET)
            break;
        g_iters += pc.max_cost + 1u;
        uint idx = atomicAdd(qs[pc.head], 1u);
        if (idx >= pc.n_items)
            break;
        scan_item(meta[pc.items + idx]);
        done++;
    }
    if (done != 0u) {
        atomicAdd(qs[QS_DONE], done);
        atomicAdd(qs[QS_ACTIVE], 1u);
    }
}
