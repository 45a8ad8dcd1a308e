/*
 * libFuzzer target for the catalog reader: catalog_from_bytes on the bytes
 * of a disk-cache file (<state-dir>/catalogs/<fp>.cat holds a packed catalog
 * as is), which vkscand reads back at start and must never trust. A catalog
 * the reader accepts must then be safe to use: every rule and group view is
 * read and a small buffer is scanned with the CPU reference scanner in every
 * report mode. Seeds: tests/fuzz/seeds-catalog/ (compiled catalogs of
 * literal, regex, hex and bit-NFA rules). Inputs are also taken with their
 * check word recomputed, so mutations reach the structure checks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "refscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every view of an accepted catalog and scans with it. */
static void use(struct catalog *cat);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct catalog *cat = NULL;
    struct vks_error err;
    if (catalog_from_bytes(data, size, &cat, &err) == 0)
        use(cat);
    /* The check word rejects nearly every mutation at once; to reach the
     * structure checks behind it, also take the bytes with the check word
     * filled in (catalog_adopt), as a file that went bad before it was
     * hashed would look. */
    if (size >= 4 && size % 4 == 0) {
        uint32_t *words = malloc(size);
        if (words == NULL)
            return 0;
        memcpy(words, data, size);
        if (catalog_adopt(words, size / 4, &cat, &err) == 0)
            use(cat);
    }
    return 0;
}

static void use(struct catalog *cat)
{
    for (uint32_t i = 0; i < catalog_rule_count(cat); i++) {
        struct catalog_rule r;
        catalog_rule(cat, i, &r);
    }
    for (uint32_t i = 0; i < catalog_group_count(cat); i++) {
        struct catalog_group g;
        catalog_group(cat, i, &g);
    }
    for (uint32_t i = 0; i < catalog_nfa_count(cat); i++) {
        struct catalog_nfa g;
        catalog_nfa(cat, i, &g);
    }
    static const uint8_t hay[] = "xx needle ab123c \xde\xad\x01\xef HeLLo foo=bar 0123456789 zebra";
    for (int mode = 0; mode < 3; mode++) {
        struct scan_hits hits = {0};
        refscan_buffer(cat, hay, sizeof(hay) - 1, (enum scan_mode)mode, &hits);
        scan_hits_finish(&hits);
    }
    catalog_destroy(cat);
}
