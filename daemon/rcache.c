/*
 * The result cache (rcache.h): a chained hash table of entries on one LRU
 * list, under one mutex. An entry's hits are varints: for each hit the end
 * offset's distance from the previous hit's end, the rule and the count.
 */
#include "rcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct entry *chain;       /* the bucket's next */
    struct entry *prev, *next; /* LRU: most recently used at the head */
    struct rcache_key key;
    uint64_t hash;
    size_t n_hits;
    size_t len; /* packed bytes */
    uint8_t packed[];
};

struct rcache {
    pthread_mutex_t mu;
    struct entry **buckets;
    size_t mask;
    struct entry *head, *tail;
    struct rcache_stats st; /* bytes: entries plus the bucket array */
};

/* ---- varints ---------------------------------------------------------- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static uint64_t get_varint(const uint8_t **p)
{
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
}

/* ---- the table -------------------------------------------------------- */

static uint64_t key_hash(const struct rcache_key *k)
{
    const uint8_t *p = (const uint8_t *)k;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof(*k); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static size_t entry_size(const struct entry *e)
{
    return sizeof(*e) + e->len;
}

static void lru_unlink(struct rcache *c, struct entry *e)
{
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(struct rcache *c, struct entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head != NULL)
        c->head->prev = e;
    c->head = e;
    if (c->tail == NULL)
        c->tail = e;
}

/* The link that points at the entry with key `k` (or the bucket's end). */
static struct entry **find(struct rcache *c, const struct rcache_key *k, uint64_t h)
{
    struct entry **pp = &c->buckets[h & c->mask];
    while (*pp != NULL && ((*pp)->hash != h || memcmp(&(*pp)->key, k, sizeof(*k)) != 0))
        pp = &(*pp)->chain;
    return pp;
}

static void remove_entry(struct rcache *c, struct entry *e)
{
    struct entry **pp = find(c, &e->key, e->hash);
    *pp = e->chain;
    lru_unlink(c, e);
    c->st.bytes -= entry_size(e);
    c->st.entries--;
    free(e);
}

int rcache_create(uint64_t max_bytes, struct rcache **out)
{
    *out = NULL;
    if (max_bytes == 0)
        return 0;
    struct rcache *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    /* a bucket per 512 bytes of entries (an entry is ~200 bytes and up) */
    size_t n = 16;
    while (n < max_bytes / 512 && n < (1u << 24))
        n *= 2;
    c->buckets = calloc(n, sizeof(*c->buckets));
    if (c->buckets == NULL) {
        free(c);
        return -ENOMEM;
    }
    c->mask = n - 1;
    c->st.limit = max_bytes;
    c->st.bytes = n * sizeof(*c->buckets);
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

void rcache_destroy(struct rcache *c)
{
    if (c == NULL)
        return;
    for (struct entry *e = c->head, *next; e != NULL; e = next) {
        next = e->next;
        free(e);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int unpack(const struct entry *e, uint32_t buffer, struct engine_hit **hits, size_t *n)
{
    struct engine_hit *v = malloc((e->n_hits ? e->n_hits : 1) * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    const uint8_t *p = e->packed;
    uint64_t end = 0;
    for (size_t i = 0; i < e->n_hits; i++) {
        end += get_varint(&p);
        uint32_t rule = (uint32_t)get_varint(&p);
        uint32_t count = (uint32_t)get_varint(&p);
        v[i] = (struct engine_hit){.buffer = buffer, .rule = rule, .count = count, .end = end};
    }
    *hits = v;
    *n = e->n_hits;
    return 0;
}

int rcache_get(struct rcache *c, const struct rcache_key *k, uint32_t buffer,
               struct engine_hit **hits, size_t *n)
{
    uint64_t h = key_hash(k);
    pthread_mutex_lock(&c->mu);
    struct entry *e = *find(c, k, h);
    int rc = -ENOENT;
    if (e != NULL) {
        lru_unlink(c, e);
        lru_push_front(c, e);
        rc = unpack(e, buffer, hits, n);
    }
    if (rc == 0)
        c->st.hits++;
    else
        c->st.misses++;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Packs hits into a new entry, or NULL (too large, or no memory). */
static struct entry *pack(const struct rcache_key *k, const struct engine_hit *hits, size_t n,
                          uint64_t max_len)
{
    /* at most 10 + 5 + 5 bytes a hit; a bound first, then the real size */
    if (n > max_len)
        return NULL;
    size_t bound = n * 20;
    struct entry *e = malloc(sizeof(*e) + (bound ? bound : 1));
    if (e == NULL)
        return NULL;
    size_t len = 0;
    uint64_t end = 0;
    for (size_t i = 0; i < n; i++) {
        len += put_varint(e->packed + len, hits[i].end - end);
        len += put_varint(e->packed + len, hits[i].rule);
        len += put_varint(e->packed + len, hits[i].count);
        end = hits[i].end;
    }
    if (sizeof(*e) + len > max_len) {
        free(e);
        return NULL;
    }
    struct entry *small = realloc(e, sizeof(*e) + (len ? len : 1));
    e = small != NULL ? small : e;
    memset(e, 0, sizeof(*e));
    e->key = *k;
    e->n_hits = n;
    e->len = len;
    return e;
}

void rcache_put(struct rcache *c, const struct rcache_key *k, const struct engine_hit *hits,
                size_t n)
{
    for (size_t i = 1; i < n; i++) {
        if (hits[i].end < hits[i - 1].end)
            return; /* not in end order: not ours to pack */
    }
    struct entry *e = pack(k, hits, n, c->st.limit / 8);
    if (e == NULL)
        return;
    e->hash = key_hash(k);
    pthread_mutex_lock(&c->mu);
    struct entry *old = *find(c, k, e->hash);
    if (old != NULL)
        remove_entry(c, old);
    while (c->tail != NULL && c->st.bytes + entry_size(e) > c->st.limit) {
        remove_entry(c, c->tail);
        c->st.evictions++;
    }
    if (c->st.bytes + entry_size(e) > c->st.limit) {
        pthread_mutex_unlock(&c->mu); /* the bucket array alone fills it */
        free(e);
        return;
    }
    struct entry **pp = &c->buckets[e->hash & c->mask];
    e->chain = *pp;
    *pp = e;
    lru_push_front(c, e);
    c->st.bytes += entry_size(e);
    c->st.entries++;
    c->st.inserts++;
    pthread_mutex_unlock(&c->mu);
}

void rcache_get_stats(struct rcache *c, struct rcache_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
