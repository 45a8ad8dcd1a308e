/*
 * Counting on the device (docs/gpu.md), shared by scan.comp, scan_nfa.comp
 * and scan_lit.comp: where the range counts (pc.count) and the item's buffer
 * has a count table (the buffer table's third word, the qs word of its
 * first pair; NONE: the ring), each match of a rule adds one to
 * qs[base + 2 rule] and keeps the least end as its complement in
 * qs[base + 2 rule + 1] (zero-filled, so atomicMax keeps the least end).
 * The host counts only ranges that cannot repeat a (rule, end). Matches of
 * one rule in a row wait in registers: a rule that matches at every byte
 * costs one atomic pair per item, not one per byte. The including shader
 * declares qs[], pc.count and NONE.
 */
uint g_cbase; /* the item's count table; NONE: matches go to the ring */
uint g_crule; /* the rule whose matches wait in g_cn */
uint g_cn;
uint g_cfirst;

void count_out()
{
    if (g_cn != 0u) {
        uint w = g_cbase + 2u * g_crule;
        atomicAdd(qs[w], g_cn);
        atomicMax(qs[w + 1u], ~g_cfirst);
        g_cn = 0u;
    }
}

void count_begin(uint tab)
{
    g_cbase = pc.count != 0u ? tab : NONE;
    g_cn = 0u;
}

void count_hit(uint rule, uint end)
{
    if (g_cn == 0u || rule != g_crule) {
        count_out();
        g_crule = rule;
        g_cfirst = end;
    }
    g_cn++;
    g_cfirst = min(g_cfirst, end);
}
