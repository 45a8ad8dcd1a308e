/*
 * proto internals shared by its .c files: the per-message arena and the
 * msgpack cursor the decoders are built on. Not used outside proto/.
 */
#ifndef VKS_PROTO_INTERNAL_H
#define VKS_PROTO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/*
 * A bump allocator for everything one decoded message points to. Chunks are
 * chained; the whole arena is freed at once by proto_mem_destroy, which is
 * what makes "per-request allocation freed after the reply" a single call.
 */
struct proto_mem;

struct proto_mem *proto_mem_create(void);
void proto_mem_destroy(struct proto_mem *m);
/* Zeroed, 16-byte aligned; NULL on overflow or out of memory. */
void *proto_mem_alloc(struct proto_mem *m, size_t n, size_t size);
/* A NUL-terminated copy of s[0..len). */
char *proto_mem_strndup(struct proto_mem *m, const char *s, size_t len);

/*
 * The msgpack cursor: reads one value at a time from a complete frame body,
 * checks every length against the bytes that remain and the limits, and
 * tracks nesting. Every failure fills `err` with a message that names the
 * field (`what`) and returns the negative code.
 */
struct mp {
    const uint8_t *p;
    const uint8_t *end;
    uint32_t depth;
    const struct proto_limits *lim;
    struct vks_error *err;
};

enum mp_type {
    MP_NIL,
    MP_BOOL,
    MP_UINT,
    MP_INT, /* negative */
    MP_FLOAT,
    MP_STR,
    MP_BIN,
    MP_ARRAY,
    MP_MAP,
    MP_EXT,
    MP_INVALID, /* 0xc1, never used by msgpack */
    MP_EOF,
};

const char *mp_type_name(enum mp_type t);
/* The type of the next value without consuming it. */
enum mp_type mp_peek(const struct mp *m);

int mp_read_uint(struct mp *m, uint64_t max, uint64_t *v, const char *what);
int mp_read_u32(struct mp *m, uint32_t *v, const char *what);
int mp_read_bool(struct mp *m, bool *v, const char *what);
/* Numbers of either kind, for stats values. */
int mp_read_number(struct mp *m, bool *is_float, uint64_t *u, double *f, const char *what);
/* str (or, with `allow_bin`, bin) of at most `limit` bytes; points into the frame. */
int mp_read_raw(struct mp *m, bool allow_bin, bool allow_str, uint32_t limit, const uint8_t **s,
                uint32_t *len, const char *what);
/* A str without NUL bytes, copied NUL-terminated into `mem`. */
int mp_read_cstr(struct mp *m, struct proto_mem *mem, uint32_t limit, const char **s,
                 const char *what);
/* A bin (or str) of exactly PROTO_FP_LEN bytes. */
int mp_read_fp(struct mp *m, uint8_t fp[PROTO_FP_LEN], const char *what);
/* Container headers: enter one nesting level; call mp_leave after the
 * elements. `limit` bounds the element count (pairs for maps). */
int mp_read_array(struct mp *m, uint32_t limit, uint32_t *n, const char *what);
/* Like mp_read_array with a specific code for an over-limit count
 * (VKS_E_TOO_MANY_BUFFERS, VKS_E_TOO_MANY_RULES). */
int mp_read_array_code(struct mp *m, uint32_t limit, int limit_code, uint32_t *n, const char *what);
int mp_read_map(struct mp *m, uint32_t limit, uint32_t *n, const char *what);
void mp_leave(struct mp *m);
/* Skips one value of any type, checking depth and limits. */
int mp_skip(struct mp *m, const char *what);

/* The sticky-error msgpack-c write target used by the encoders. */
int proto_buf_reserve(struct proto_buf *b, size_t extra);

#endif
