#include "workloads.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t workload_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

char *workload_word(uint64_t *s, uint32_t min, uint32_t max, size_t *len)
{
    *len = min + workload_next(s) % (max - min + 1);
    char *w = malloc(*len + 1);
    if (w == NULL)
        return NULL;
    for (size_t i = 0; i < *len; i++)
        w[i] = (char)('a' + workload_next(s) % 26);
    w[*len] = '\0';
    return w;
}

uint64_t workload_regex_seed(uint32_t n)
{
    return 0x7654321ull + n;
}

int workload_regex(uint64_t *s, uint32_t i, char pat[96], char inst[64])
{
    size_t pl, sl, ml;
    char *pre = workload_word(s, 3, 5, &pl), *suf = workload_word(s, 3, 4, &sl);
    char *mid = workload_word(s, 2, 5, &ml);
    int rc = pre && suf && mid ? 0 : -1;
    switch (rc == 0 ? i % 5 : 5) {
    case 0:
        snprintf(pat, 96, "%s[0-9]{2,4}%s", pre, suf);
        snprintf(inst, 64, "%s%.*s%s", pre, (int)(2 + ml % 3), "1234", suf);
        break;
    case 1:
        snprintf(pat, 96, "%s[a-z]{0,6}%s", pre, suf);
        snprintf(inst, 64, "%s%s%s", pre, mid, suf);
        break;
    case 2:
        snprintf(pat, 96, "%s(%s|zq%s|%sx)%s", pre, mid, mid, mid, suf);
        snprintf(inst, 64, "%szq%s%s", pre, mid, suf);
        break;
    case 3:
        snprintf(pat, 96, "%s\\s[a-z]{2,5}%s", pre, suf);
        snprintf(inst, 64, "%s %s%s", pre, mid, suf);
        break;
    case 4:
        snprintf(pat, 96, "(?i)%s[0-9a-f]{4}%s", pre, suf);
        snprintf(inst, 64, "%sBEEF%s", pre, suf);
        break;
    default:
        break;
    }
    free(pre);
    free(suf);
    free(mid);
    return rc;
}

uint64_t workload_binary_seed(uint32_t n)
{
    return 0xb1a5eedull + n;
}

size_t workload_binary(uint64_t *s, uint8_t bytes[WORKLOAD_BINARY_MAX],
                       char pat[4 * WORKLOAD_BINARY_MAX + 1])
{
    size_t len = 8 + workload_next(s) % (WORKLOAD_BINARY_MAX - 8 + 1);
    for (size_t i = 0; i < len; i++) {
        bytes[i] = (uint8_t)(workload_next(s) >> 24);
        snprintf(pat + 4 * i, 5, "\\x%02x", bytes[i]);
    }
    return len;
}

/* Common English words, most frequent first (roughly). */
static const char *const common_words[] = {
    "the",   "of",    "and",    "to",    "a",     "in",    "that",   "it",     "is",    "was",
    "i",     "for",   "on",     "you",   "he",    "be",    "with",   "as",     "by",    "at",
    "have",  "are",   "this",   "not",   "but",   "had",   "his",    "they",   "from",  "she",
    "which", "or",    "we",     "an",    "there", "her",   "were",   "one",    "do",    "been",
    "all",   "their", "has",    "would", "will",  "what",  "if",     "can",    "when",  "so",
    "no",    "said",  "who",    "more",  "about", "up",    "them",   "some",   "could", "him",
    "into",  "its",   "then",   "two",   "out",   "time",  "my",     "like",   "did",   "only",
    "me",    "your",  "now",    "other", "may",   "over",  "very",   "upon",   "than",  "any",
    "see",   "man",   "little", "must",  "made",  "after", "should", "before", "our",   "how",
    "know",  "think", "well",   "come",  "here",  "down",  "might",  "never",  "much",  "way",
    "such",  "long",  "good",   "first", "again", "back",  "just",   "where",  "these", "those",
    "old",   "room",  "door",   "house", "face",  "hand",  "night",  "eyes",   "left",  "own",
};

#define N_COMMON (sizeof(common_words) / sizeof(common_words[0]))

/* A word index biased towards the frequent words: the smaller of two draws. */
static size_t common_index(uint64_t *s)
{
    size_t a = workload_next(s) % N_COMMON, b = workload_next(s) % N_COMMON;
    return a < b ? a : b;
}

static uint64_t str_hash(const char *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return h;
}

/* Adds `p` to the open-addressing set `ht` (cap a power of two, > the
 * number of strings); false when it was there already. */
static bool set_add(char **ht, size_t cap, char *p)
{
    for (size_t j = str_hash(p) & (cap - 1);; j = (j + 1) & (cap - 1)) {
        if (ht[j] == NULL) {
            ht[j] = p;
            return true;
        }
        if (strcmp(ht[j], p) == 0)
            return false;
    }
}

char **workload_phrases(uint32_t n)
{
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap *= 2;
    char **out = calloc(n ? n : 1, sizeof(*out)), **ht = calloc(cap, sizeof(*ht));
    uint64_t s = 0x9b4a5e5ull + n;
    uint32_t m = 0;
    for (uint64_t tries = 0; out != NULL && ht != NULL && m < n && tries < (uint64_t)n * 1000;
         tries++) {
        char buf[64];
        size_t words = 2 + (workload_next(&s) % 10 < 3), len = 0;
        for (size_t w = 0; w < words; w++)
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%s", w ? " " : "",
                                    common_words[common_index(&s)]);
        char *p = malloc(len + 1);
        if (p == NULL)
            break;
        memcpy(p, buf, len + 1);
        if (set_add(ht, cap, p))
            out[m++] = p;
        else
            free(p);
    }
    free(ht);
    if (out != NULL && m < n) {
        workload_phrases_free(out, m);
        out = NULL;
    }
    return out;
}

void workload_phrases_free(char **phrases, uint32_t n)
{
    for (uint32_t i = 0; phrases != NULL && i < n; i++)
        free(phrases[i]);
    free(phrases);
}

int workload_read_file(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -errno;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 65536 + 1 > cap) {
            char *nb = realloc(buf, cap = (n + 65536 + 1) * 2);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return -ENOMEM;
            }
            buf = nb;
        }
        got = fread(buf + n, 1, 65536, f);
        n += got;
    } while (got > 0);
    int rc = ferror(f) ? -EIO : 0;
    fclose(f);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

/* ---- regex-N-secrets ---------------------------------------------------- */

/* splitmix64 (the secrets set predates workload_next and keeps its stream) */
static uint64_t mix_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint32_t mix_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(mix_next(s) % n);
}

static bool mix_pct(uint64_t *s, uint32_t pct)
{
    return mix_below(s, 100) < pct;
}

struct pat_buf {
    char *s;
    size_t n;
};

__attribute__((format(printf, 2, 3))) static void put(struct pat_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->n, WORKLOAD_SECRET_MAX - b->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->n += (size_t)k < WORKLOAD_SECRET_MAX - b->n ? (size_t)k : WORKLOAD_SECRET_MAX - 1 - b->n;
}

static void put_word(struct pat_buf *b, uint64_t *s, uint32_t lo, uint32_t hi)
{
    uint32_t len = lo + mix_below(s, hi - lo + 1);
    for (uint32_t k = 0; k < len; k++)
        put(b, "%c", 'a' + (int)mix_below(s, 26));
}

/* One piece after the prefix of a secret-scanning-like regex. */
static void put_piece(struct pat_buf *b, uint64_t *s)
{
    uint32_t m = 8 + mix_below(s, 13);
    switch (mix_below(s, 9)) {
    case 0:
        put(b, "[a-z0-9]{%u}", 8 + mix_below(s, 33));
        break;
    case 1:
        put(b, "[A-Za-z0-9_-]{%u,%u}", m, m + mix_below(s, 21));
        break;
    case 2:
        put(b, "\\d{%u}", 2 + mix_below(s, 7));
        break;
    case 3:
        put(b, "[a-f0-9]{%u}", mix_pct(s, 50) ? 32 : 40);
        break;
    case 4:
        put(b, "(?:");
        for (uint32_t k = 0, n = 2 + mix_below(s, 3); k < n; k++) {
            put(b, k ? "|" : "");
            put_word(b, s, 3, 6);
        }
        put(b, ")");
        break;
    case 5:
        put(b, "\\s{0,3}[=:]\\s{0,3}");
        break;
    case 6:
        put(b, "[^\\s\"']{4,%u}", 8 + mix_below(s, 17));
        break;
    case 7:
        put(b, "[-_.]");
        break;
    default:
        put(b, "[[:alnum:]]{%u,}", 4 + mix_below(s, 8));
    }
}

uint64_t workload_secrets_seed(void)
{
    return 0x5eed0002u;
}

size_t workload_secret(uint64_t *s, char pat[WORKLOAD_SECRET_MAX], uint32_t *flags)
{
    struct pat_buf b = {pat, 0};
    pat[0] = '\0';
    *flags = 0;
    if (mix_pct(s, 10))
        put(&b, "(?i)");
    else if (mix_pct(s, 10))
        *flags = 1; /* RULE_F_CASELESS */
    if (mix_pct(s, 20))
        put(&b, "\\b");
    put_word(&b, s, 3, 8);
    if (mix_pct(s, 40))
        put(&b, "%c", "_-"[mix_below(s, 2)]);
    for (uint32_t k = 0, np = 1 + mix_below(s, 3); k < np; k++)
        put_piece(&b, s);
    if (mix_pct(s, 20))
        put(&b, "\\b");
    return b.n;
}
