#include "workloads.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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
