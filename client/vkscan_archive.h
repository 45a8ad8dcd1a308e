/*
 * Archives and compressed files for `vkscan scan -z` (vkscan_archive.c),
 * read through libarchive. Not installed; main thread only.
 *
 * Recognised by their first bytes, not their names: gzip, xz, zstd, bzip2
 * and lz4 streams, tar (ustar, pax, GNU) and zip archives. A compressed
 * file that holds no tar is one member, named after the file without its
 * compression suffix (`notes.txt.gz` holds `notes.txt`; without a known
 * suffix, `data`). Each regular member
 * is decompressed into a memfd and handed to the caller as its own buffer,
 * named `ARCHIVE!MEMBER`. One level of nesting: a member that is itself an
 * archive or a compressed file is opened as one (`a.zip!b.tar.gz!c`); its
 * own archive members are passed on as bytes.
 */
#ifndef VKS_CLIENT_VKSCAN_ARCHIVE_H
#define VKS_CLIENT_VKSCAN_ARCHIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct unpack_limits {
    /* The most bytes one member may have once decompressed (the daemon's
     * max-scan-bytes): a larger member is an error, the others go on. */
    uint64_t member_max;
    /* The most bytes one archive may decompress to, its nested archives
     * included (--max-archive-bytes): past it the rest of the archive is
     * skipped with an error, so a decompression bomb stops early. */
    uint64_t total_max;
};

struct unpack_visitor {
    void *ctx;
    /* A regular member decompressed into `fd` (a memfd at offset 0, `size`
     * bytes; the callee's, also on failure). `name` is ARCHIVE!MEMBER,
     * borrowed until the call returns; its first `archive_len` bytes name
     * the archive given to unpack_members. */
    void (*member)(void *ctx, const char *name, size_t archive_len, int fd, uint64_t size);
    /* A problem at `name` (the archive, or ARCHIVE!MEMBER): each one is an
     * error (exit status 2). `name` is borrowed until the call returns. */
    void (*problem)(void *ctx, const char *name, const char *msg);
};

/* Whether the bytes at the start of `fd` (borrowed; read with pread) are a
 * format unpack_members reads. */
bool unpack_sniff(int fd);

/* Reads the archive or compressed file on `fd` (borrowed; from offset 0)
 * named `path`, calling `v` for each member in archive order and for each
 * problem. A corrupt archive is a problem; the members before the damage
 * have been handed over already. */
void unpack_members(int fd, const char *path, const struct unpack_limits *lim,
                    const struct unpack_visitor *v);

#endif
