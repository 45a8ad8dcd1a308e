/*
 * Class runs for the CPU engine (cpurun.h).
 */
#include "cpurun.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct run {
    uint8_t in[256]; /* 1 for a byte of the class */
    uint32_t n, id;
};

struct cpurun {
    struct run *v;
    size_t n;
};

int cpurun_create(const struct cpurun_entry *v, size_t n, struct cpurun **out)
{
    if (n == 0)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (v[i].n == 0 || (v[i].set[0] | v[i].set[1] | v[i].set[2] | v[i].set[3]) == 0)
            return -EINVAL;
    struct cpurun *m = calloc(1, sizeof(*m));
    if (m == NULL || (m->v = calloc(n, sizeof(*m->v))) == NULL) {
        free(m);
        return -ENOMEM;
    }
    m->n = n;
    for (size_t i = 0; i < n; i++) {
        for (unsigned c = 0; c < 256; c++)
            m->v[i].in[c] = (uint8_t)((v[i].set[c / 64] >> (c % 64)) & 1);
        m->v[i].n = v[i].n;
        m->v[i].id = v[i].id;
    }
    *out = m;
    return 0;
}

void cpurun_destroy(struct cpurun *m)
{
    if (m == NULL)
        return;
    free(m->v);
    free(m);
}

/* One entry over buf[begin, end): the samples are the offsets of one
 * residue modulo n, begin + n - 1 first, so that every n bytes in a row
 * hold one. */
static int scan_one(const struct run *r, const uint8_t *buf, size_t begin, size_t end, cpulit_fn fn,
                    void *ctx)
{
    const size_t n = r->n;
    size_t work = 0; /* bytes widened over */
    for (size_t q = begin + n - 1; q < end; q += n) {
        if (!r->in[buf[q]])
            continue;
        size_t a = q, b = q + 1;
        while (a > begin && r->in[buf[a - 1]])
            a--;
        while (b < end && r->in[buf[b]])
            b++;
        work += b - a;
        if (q - begin >= CPURUN_DENSE_MIN && 2 * work > q - begin)
            return fn(ctx, r->id, CPURUN_GAVE_UP);
        if (b - a < n)
            continue; /* b < q + n: the next sample is past the run */
        int rc = 0;
        size_t e = a + n;
        for (; e < b && rc == 0; e += n)
            rc = fn(ctx, r->id, e);
        if (rc == 0)
            rc = fn(ctx, r->id, b);
        if (rc != 0)
            return rc;
        /* the first sample past b (b is not in the class, or the end) */
        q += (b - q) / n * n;
    }
    return 0;
}

int cpurun_scan(const struct cpurun *m, const uint8_t *buf, size_t len, size_t begin, uint64_t hi,
                cpulit_fn fn, void *ctx)
{
    size_t end = hi < len ? (size_t)hi : len;
    for (size_t i = 0; i < m->n; i++) {
        if (begin >= end || end - begin < m->v[i].n)
            continue;
        int rc = scan_one(&m->v[i], buf, begin, end, fn, ctx);
        if (rc != 0 && rc != CPURUN_SKIP)
            return rc;
    }
    return 0;
}
