/*
 * proto: limits, names, the per-message arena, byte buffers and the source
 * fingerprint's canonical form. Framing is in reader.c, decoding in decode.c,
 * encoding in encode.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "proto.h"

void proto_limits_default(struct proto_limits *lim)
{
    lim->max_frame = PROTO_DEFAULT_MAX_FRAME;
    lim->max_depth = PROTO_DEFAULT_MAX_DEPTH;
    lim->max_str = PROTO_DEFAULT_MAX_STR;
    lim->max_array = PROTO_DEFAULT_MAX_ARRAY;
    lim->max_buffers = PROTO_DEFAULT_MAX_BUFFERS;
    lim->max_rules = PROTO_DEFAULT_MAX_RULES;
    lim->max_fds = PROTO_DEFAULT_MAX_FDS;
    lim->max_hits = PROTO_DEFAULT_MAX_HITS;
}

static uint32_t pick(uint32_t v, uint32_t def, uint32_t ceiling)
{
    if (v == 0)
        return def;
    return v > ceiling ? ceiling : v;
}

void proto_limits_normalize(struct proto_limits *lim)
{
    lim->max_frame = pick(lim->max_frame, PROTO_DEFAULT_MAX_FRAME, PROTO_MAX_FRAME_CEILING);
    lim->max_depth = pick(lim->max_depth, PROTO_DEFAULT_MAX_DEPTH, PROTO_MAX_DEPTH_CEILING);
    lim->max_str = pick(lim->max_str, PROTO_DEFAULT_MAX_STR, UINT32_MAX);
    lim->max_array = pick(lim->max_array, PROTO_DEFAULT_MAX_ARRAY, UINT32_MAX);
    lim->max_buffers = pick(lim->max_buffers, PROTO_DEFAULT_MAX_BUFFERS, UINT32_MAX);
    lim->max_rules = pick(lim->max_rules, PROTO_DEFAULT_MAX_RULES, UINT32_MAX);
    lim->max_fds = pick(lim->max_fds, PROTO_DEFAULT_MAX_FDS, PROTO_MAX_FDS_CEILING);
    lim->max_hits = pick(lim->max_hits, PROTO_DEFAULT_MAX_HITS, UINT32_MAX);
}

static const char *const op_names[PROTO_OP_COUNT] = {
    [PROTO_OP_HELLO] = "hello",
    [PROTO_OP_PING] = "ping",
    [PROTO_OP_CATALOG_LOAD] = "catalog.load",
    [PROTO_OP_CATALOG_HAS] = "catalog.has",
    [PROTO_OP_CATALOG_DROP] = "catalog.drop",
    [PROTO_OP_SCAN] = "scan",
    [PROTO_OP_STATS] = "stats",
    [PROTO_OP_STREAM_OPEN] = "stream.open",
    [PROTO_OP_STREAM_WRITE] = "stream.write",
    [PROTO_OP_STREAM_CLOSE] = "stream.close",
    [PROTO_OP_STREAM_WRITES] = "stream.writes",
};

const char *proto_op_name(enum proto_op op)
{
    if ((unsigned)op >= PROTO_OP_COUNT)
        return NULL;
    return op_names[op];
}

const char *proto_strerror(int code)
{
    switch (-code) {
    case 0:
        return "success";
    case VKS_E_FRAME_TOO_LARGE:
        return "frame too large";
    case VKS_E_BAD_FRAME:
        return "malformed frame";
    case VKS_E_BAD_TYPE:
        return "wrong msgpack type";
    case VKS_E_MISSING_FIELD:
        return "missing field";
    case VKS_E_BAD_VALUE:
        return "bad field value";
    case VKS_E_DEPTH:
        return "nesting too deep";
    case VKS_E_LIMIT:
        return "length over limit";
    case VKS_E_UNKNOWN_OP:
        return "unknown operation";
    case VKS_E_VERSION:
        return "protocol version mismatch";
    case VKS_E_UNKNOWN_CATALOG:
        return "unknown catalog";
    case VKS_E_BAD_FD:
        return "bad file descriptor";
    case VKS_E_TOO_MANY_BUFFERS:
        return "too many buffers";
    case VKS_E_TOO_MANY_RULES:
        return "too many rules";
    case VKS_E_TOO_MANY_FDS:
        return "too many file descriptors";
    case VKS_E_RULES:
        return "rule set rejected";
    case VKS_E_BUSY:
        return "busy";
    case VKS_E_TIMEOUT:
        return "timed out";
    case VKS_E_DEVICE:
        return "device error";
    case VKS_E_SHUTDOWN:
        return "shutting down";
    case VKS_E_INTERNAL:
        return "internal error";
    case VKS_E_PROTOCOL:
        return "protocol violation by the peer";
    case VKS_E_CLOSED:
        return "connection closed";
    case VKS_E_DENIED:
        return "connection not allowed";
    default:
        break;
    }
    if (code < 0 && -code < VKS_E_BASE)
        return strerror(-code);
    return "unknown error";
}

/* ---- arena -------------------------------------------------------------- */

#define MEM_CHUNK 4096u

struct mem_chunk {
    struct mem_chunk *next;
    size_t used;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

struct proto_mem {
    struct mem_chunk *head;
};

struct proto_mem *proto_mem_create(void)
{
    return calloc(1, sizeof(struct proto_mem));
}

void proto_mem_destroy(struct proto_mem *m)
{
    if (m == NULL)
        return;
    struct mem_chunk *c = m->head;
    while (c != NULL) {
        struct mem_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(m);
}

void *proto_mem_alloc(struct proto_mem *m, size_t n, size_t size)
{
    if (size != 0 && n > (SIZE_MAX / 2) / size)
        return NULL;
    size_t bytes = (n * size + 15u) & ~(size_t)15u;
    if (bytes == 0)
        bytes = 16;
    struct mem_chunk *c = m->head;
    if (c == NULL || c->cap - c->used < bytes) {
        size_t cap = bytes > MEM_CHUNK ? bytes : MEM_CHUNK;
        c = malloc(sizeof(*c) + cap);
        if (c == NULL)
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = m->head;
        m->head = c;
    }
    void *p = c->data + c->used;
    c->used += bytes;
    memset(p, 0, bytes);
    return p;
}

char *proto_mem_strndup(struct proto_mem *m, const char *s, size_t len)
{
    char *d = proto_mem_alloc(m, len + 1, 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

/* ---- frames and buffers --------------------------------------------------- */

void proto_frame_finish(struct proto_frame *f)
{
    for (size_t i = 0; i < f->n_fds; i++) {
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    }
    free(f->fds);
    free(f->data);
    memset(f, 0, sizeof(*f));
}

void proto_buf_init(struct proto_buf *b)
{
    memset(b, 0, sizeof(*b));
}

void proto_buf_finish(struct proto_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void proto_buf_reset(struct proto_buf *b)
{
    b->len = 0;
}

int proto_buf_reserve(struct proto_buf *b, size_t extra)
{
    if (extra > SIZE_MAX / 2 - b->len)
        return -ENOMEM;
    size_t need = b->len + extra;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (p == NULL)
        return -ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

/* ---- source fingerprint ----------------------------------------------------- */

static void put_u32(proto_sink_fn sink, void *ctx, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    sink(ctx, b, sizeof(b));
}

static void put_bytes(proto_sink_fn sink, void *ctx, const void *p, uint32_t len)
{
    put_u32(sink, ctx, len);
    if (len > 0)
        sink(ctx, p, len);
}

/* The layout is docs/protocol.md's "Source fingerprint"; changing it changes
 * every source fingerprint, so it is versioned by the tag. */
void proto_source_canon(const struct proto_catalog_load *load, proto_sink_fn sink, void *ctx)
{
    static const char tag[] = "vkscan-source-1";
    sink(ctx, tag, sizeof(tag)); /* with its NUL */
    put_u32(sink, ctx, load->max_states);
    if (load->has_text) {
        sink(ctx, "T", 1);
        put_bytes(sink, ctx, load->text, load->text_len);
        return;
    }
    sink(ctx, "R", 1);
    put_u32(sink, ctx, load->n_rules);
    for (uint32_t i = 0; i < load->n_rules; i++) {
        const struct proto_rule *r = &load->rules[i];
        const char *flags = r->flags != NULL ? r->flags : "";
        uint8_t kind = (uint8_t)r->kind;
        put_bytes(sink, ctx, r->id, (uint32_t)strlen(r->id));
        sink(ctx, &kind, 1);
        put_bytes(sink, ctx, flags, (uint32_t)strlen(flags));
        put_bytes(sink, ctx, r->pattern, r->pattern_len);
    }
}

size_t proto_utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t min;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    uint32_t cp = c & (0x7fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

bool proto_utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = proto_utf8_seq(s + i, n - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}
