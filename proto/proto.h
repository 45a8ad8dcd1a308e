/*
 * proto: the vkscan wire format, shared by vkscand and libvkscan.
 *
 * docs/protocol.md is the specification; this header is its C face. A frame is
 * a 4-byte big-endian length followed by exactly that many bytes holding one
 * msgpack map. Requests carry `id` (u32) and `op`; replies echo both and carry
 * `result` or `error {code, message}`.
 *
 * Both directions exist in both roles: the daemon decodes requests and encodes
 * replies, the client encodes requests and decodes replies, so each message
 * has one C struct used for both.
 *
 * Decoding is bounded (struct proto_limits) and zero-copy where it matters:
 * inline scan buffers, patterns and pattern-file text point into the frame,
 * which the decoded message owns. Everything a decoded message points to is
 * freed by its destroy function, so per-request memory ends with the reply.
 *
 * Errors: functions return 0 (or a documented positive value) or a negative
 * code, -VKS_E_* (proto/errors.h) for protocol violations and -errno for
 * system failures, and fill the `struct vks_error` passed last. Which errors
 * end the connection: every error of proto_reader_* does (the byte stream
 * cannot be resynchronised); no error of proto_*_decode does (the frame was
 * delimited, so the next frame can be read after the error reply).
 *
 * Threads: no global state; an object is used by one thread at a time.
 */
#ifndef VKS_PROTO_PROTO_H
#define VKS_PROTO_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "errors.h" /* proto/errors.h: the VKS_E_* codes */

/* Protocol versions this code speaks: hello picks the highest in common. */
#define PROTO_VERSION     1u
#define PROTO_VERSION_MIN 1u

#define PROTO_HEADER_LEN 4u  /* big-endian u32 body length */
#define PROTO_FP_LEN     32u /* catalog, rule and source fingerprints (BLAKE2b-256) */

/* Defaults of struct proto_limits (docs/protocol.md, "Limits"). */
#define PROTO_DEFAULT_MAX_FRAME   (64u << 20)
#define PROTO_DEFAULT_MAX_DEPTH   16u
#define PROTO_DEFAULT_MAX_STR     (64u << 10)
#define PROTO_DEFAULT_MAX_ARRAY   65536u
#define PROTO_DEFAULT_MAX_BUFFERS 4096u
#define PROTO_DEFAULT_MAX_RULES   1000000u
#define PROTO_DEFAULT_MAX_FDS     64u
#define PROTO_DEFAULT_MAX_HITS    (1u << 20)
#define PROTO_MAX_FRAME_CEILING   0xfffffff0u /* largest max_frame accepted */
#define PROTO_MAX_DEPTH_CEILING   64u
#define PROTO_MAX_FDS_CEILING     253u /* SCM_MAX_FD */

/*
 * Bounds for decoding. Zero in any field means its default. `max_str` bounds
 * every str/bin except the fields bounded by the frame alone (inline buffer
 * `data` and catalog `text`); `max_array` bounds every array and map except
 * the ones with their own limit (rules, buffers, hits). A frame carries at
 * most `max_fds` descriptors.
 */
struct proto_limits {
    uint32_t max_frame;
    uint32_t max_depth;
    uint32_t max_str;
    uint32_t max_array;
    uint32_t max_buffers;
    uint32_t max_rules;
    uint32_t max_fds;
    uint32_t max_hits;
};

/* Fills `lim` with the defaults. */
void proto_limits_default(struct proto_limits *lim);

/* Replaces zero fields of `lim` with defaults and clamps to the ceilings. */
void proto_limits_normalize(struct proto_limits *lim);

enum proto_op {
    PROTO_OP_NONE = 0, /* not decoded (error replies about undecodable frames) */
    PROTO_OP_HELLO,
    PROTO_OP_PING,
    PROTO_OP_CATALOG_LOAD,
    PROTO_OP_CATALOG_HAS,
    PROTO_OP_CATALOG_DROP,
    PROTO_OP_SCAN,
    PROTO_OP_STATS,
    PROTO_OP_STREAM_OPEN,   /* "stream.open" (issue 13) */
    PROTO_OP_STREAM_WRITE,  /* "stream.write" */
    PROTO_OP_STREAM_CLOSE,  /* "stream.close" */
    PROTO_OP_STREAM_WRITES, /* "stream.writes": writes to many streams in one request */
    PROTO_OP_COUNT
};

/* "hello", "catalog.load", ...; NULL for PROTO_OP_NONE or out of range. */
const char *proto_op_name(enum proto_op op);

/* Same numbers as enum rule_kind in rules/rules.h. */
enum proto_rule_kind {
    PROTO_KIND_LITERAL = 0, /* "literal" */
    PROTO_KIND_HEX = 1,     /* "hex" */
    PROTO_KIND_REGEX = 2,   /* "regex" */
};

/* Same numbers as enum scan_mode in rules/refscan.h. */
enum proto_report {
    PROTO_REPORT_ALL = 0,   /* "all" */
    PROTO_REPORT_FIRST = 1, /* "first" */
    PROTO_REPORT_COUNT = 2, /* "count" */
};

/* ---- frames ----------------------------------------------------------- */

/*
 * One received frame: the msgpack body (without the length prefix) and the
 * descriptors that arrived with it. `fd_error` is 0, -VKS_E_TOO_MANY_FDS
 * when descriptors were dropped (more than max_fds, or more than the control
 * buffer holds), or -VKS_E_BUSY when the kernel could not install them
 * (this process is out of descriptors); decoding such a frame fails with
 * that code.
 */
struct proto_frame {
    uint8_t *data; /* owned, `len` bytes */
    size_t len;
    int *fds; /* owned; entries set to -1 once someone takes them */
    size_t n_fds;
    int fd_error;
};

/* Frees the body and closes every descriptor still >= 0. Idempotent. */
void proto_frame_finish(struct proto_frame *f);

/*
 * The frame accumulator: takes a byte stream in chunks of any size (feed) or
 * straight from a socket (recv) and yields whole frames. The body buffer
 * grows with the bytes that really arrived, so a length prefix alone does not
 * allocate max_frame bytes.
 */
struct proto_reader;

/* Creates a reader with the limits `lim` (copied; NULL means defaults).
 * Returns 0 or -ENOMEM. */
int proto_reader_create(const struct proto_limits *lim, struct proto_reader **out);

/* Frees the reader and any partial frame; NULL is allowed. */
void proto_reader_destroy(struct proto_reader *r);

/*
 * Consumes bytes from `data[0..n)`, never past the end of the current frame,
 * and stores how many in *used. Returns 1 when a frame is complete (take it
 * with proto_reader_take before feeding more), 0 when more bytes are needed,
 * or a fatal error: -VKS_E_FRAME_TOO_LARGE (length above max_frame),
 * -VKS_E_BAD_FRAME (length 0), -ENOMEM. After an error the reader refuses
 * further input: reply with the error and close the connection.
 */
int proto_reader_feed(struct proto_reader *r, const void *data, size_t n, size_t *used,
                      struct vks_error *err);

/* Return values of proto_reader_recv besides errors. */
enum {
    PROTO_RECV_MORE = 0,  /* bytes arrived, the frame is not complete yet */
    PROTO_RECV_FRAME = 1, /* a frame is complete: proto_reader_take it */
    PROTO_RECV_EOF = 2,   /* the peer closed the connection between frames */
};

/*
 * One recvmsg() on the non-blocking or blocking stream socket `sock`, asking
 * for at most the bytes that complete the current frame (with read-ahead:
 * also the bytes after it; none while read-ahead bytes wait, which are
 * parsed instead), so descriptors (SCM_RIGHTS, received close-on-exec) are
 * always attached to the frame whose bytes they came with. Returns PROTO_RECV_*, or -ECONNRESET
 * (peer closed mid-frame), -EAGAIN (a non-blocking socket had nothing to read), another -errno from
 * recvmsg, or a fatal error of proto_reader_feed (also returned here as soon as a bad length prefix
 * arrives). PROTO_RECV_MORE never means that the socket is drained, only -EAGAIN does: a
 * non-blocking reader calls it again after PROTO_RECV_MORE and stops at -EAGAIN, or (the daemon,
 * whose poll is level-triggered) after a whole frame, to be called again when the socket is
 * readable; a blocking client polls for input after -EAGAIN.
 */
int proto_reader_recv(struct proto_reader *r, int sock, struct vks_error *err);

/*
 * Lets proto_reader_recv read up to `bytes` past the current frame (0 or a
 * second call: no change). Those bytes are parsed before the socket is read
 * again, so a caller that waits for the socket to be readable must first
 * call proto_reader_recv while proto_reader_buffered says bytes wait; and
 * the reader must live as long as the connection. Descriptors go to the
 * last frame whose first byte a read brought (the protocol sends them with
 * it). Returns 0 or -ENOMEM.
 */
int proto_reader_read_ahead(struct proto_reader *r, size_t bytes);

/* True while read-ahead bytes wait to be parsed. */
bool proto_reader_buffered(const struct proto_reader *r);

/* Moves the complete frame into `out` (which the caller then owns) and makes
 * the reader ready for the next one. Returns -EAGAIN when no frame is
 * complete. */
int proto_reader_take(struct proto_reader *r, struct proto_frame *out);

/* True when no partial frame is buffered (a close now loses nothing). */
bool proto_reader_idle(const struct proto_reader *r);

/* The body length the frame being received announced, once its length
 * prefix is complete and until the frame is taken; 0 otherwise. The daemon
 * reserves this much of its frame budget before it reads the body. */
uint32_t proto_reader_frame_len(const struct proto_reader *r);

/* UTF-8: the length of the valid sequence at s[0..n) (n >= 1), or 0 when
 * s[0] does not start one (overlong forms, surrogates and values above
 * U+10FFFF are invalid); and whether all of s[0..n) is valid. Replies make
 * every str valid with these (invalid bytes become U+FFFD). */
size_t proto_utf8_seq(const uint8_t *s, size_t n);
bool proto_utf8_valid(const uint8_t *s, size_t n);

/* A growable byte buffer that encoders append whole frames to. */
struct proto_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
};

void proto_buf_init(struct proto_buf *b);
void proto_buf_finish(struct proto_buf *b);
/* Empties the buffer and keeps its memory. */
void proto_buf_reset(struct proto_buf *b);

/*
 * Writes `len` bytes to the stream socket `sock`, with the descriptors
 * `fds[0..n_fds)` (SCM_RIGHTS) attached to the first byte, as docs/protocol.md
 * requires. Waits with poll() while the socket is full, at most `timeout_ms`
 * in all (negative: no limit). Returns 0, -ETIMEDOUT, -EPIPE or another
 * -errno. The descriptors stay owned by the caller.
 */
int proto_send(int sock, const void *data, size_t len, const int *fds, size_t n_fds, int timeout_ms,
               struct vks_error *err);

/*
 * The non-blocking step of proto_send: writes what the socket takes of
 * data[*off..len), advancing *off (the descriptors go with byte 0, so
 * start with *off = 0). Returns 0 once all is sent, -EAGAIN when the
 * socket is full (poll for POLLOUT and call again), or another -errno.
 * A client that has requests in flight reads replies while it waits
 * (client.c), so that neither side blocks on a full socket.
 */
int proto_send_some(int sock, const void *data, size_t len, size_t *off, const int *fds,
                    size_t n_fds, struct vks_error *err);

/* ---- requests --------------------------------------------------------- */

/* Strings in decoded messages are NUL-terminated unless a length is given
 * next to them; ids and flags never contain NUL (the decoder checks). */
struct proto_hello {
    uint32_t version;     /* highest version the client speaks */
    uint32_t min_version; /* lowest; 0 on encode means `version` */
    const char *client;   /* optional free-form name for logs, NULL if absent */
    bool read_ahead;      /* each sendmsg with descriptors carries one frame's bytes only:
                           * the daemon may read past a frame (docs/protocol.md) */
};

struct proto_rule {
    const char *id; /* 1..255 bytes (the compiler checks the length) */
    enum proto_rule_kind kind;
    const char *pattern; /* `pattern_len` bytes, not NUL-terminated */
    uint32_t pattern_len;
    const char *flags; /* letters such as "iH"; "" when absent */
};

/* catalog.load: exactly one of `rules` (n_rules > 0 or an empty array) or
 * `text` (a pattern file, `text_len` bytes) is set; `has_text` says which. */
struct proto_catalog_load {
    struct proto_rule *rules;
    uint32_t n_rules;
    bool has_text;
    const char *text;
    uint32_t text_len;
    uint32_t max_states; /* per-group DFA state budget; 0: the daemon's default */
    bool ids_only;       /* the result's rules without fingerprints */
};

/* catalog.has and catalog.drop: a catalog fingerprint, or (has only) the
 * source fingerprint of a rule set (proto_source_canon). */
struct proto_catalog_ref {
    bool by_source; /* has: `fp` is a source fingerprint */
    uint8_t fp[PROTO_FP_LEN];
    bool ids_only; /* has: the result's rules without fingerprints */
};

/* One scan input: inline bytes, or a range of a descriptor passed with the
 * frame. `length` is meaningful only when `has_length`; otherwise the range
 * runs to the end of the file. */
struct proto_buffer {
    bool is_fd;
    const uint8_t *data; /* inline: `len` bytes inside the frame */
    uint64_t len;
    uint32_t fd_index; /* fd: index into the frame's descriptors */
    int fd;            /* decoded: frame.fds[fd_index], borrowed from the request */
    uint64_t offset;
    uint64_t length;
    bool has_length;
};

struct proto_scan {
    uint8_t catalog[PROTO_FP_LEN];
    struct proto_buffer *buffers;
    uint32_t n_buffers;
    enum proto_report mode;
    uint32_t max_hits;   /* 0: the daemon's limit */
    uint32_t timeout_ms; /* queue deadline; 0: the daemon's scan-timeout-ms */
    bool rule_ids;       /* ask for the rule id string in every hit */
    bool no_cache;       /* `cache: false`: bypass the daemon's result cache */
    bool starts;         /* `starts: true`: a start on the hits of every rule, not only L ones */
};

/* stream.open (`catalog`), stream.write (`stream`, `buffer`: one buffer map
 * as in scan), stream.close (`stream`). */
struct proto_stream {
    uint8_t catalog[PROTO_FP_LEN];
    uint32_t stream;
    struct proto_buffer buffer;
    uint32_t count;         /* stream.open: streams to open at once (0 or absent: one) */
    enum proto_report mode; /* stream.open: ALL (default) or COUNT; FIRST is refused */
    uint32_t *streams;      /* stream.close: ids to close at once, instead of `stream` */
    uint32_t n_streams;
};

/* stream.writes: `streams[i]` takes `buffers[i]`, in order (`streams` and
 * `buffers` of the same length, at most max_buffers). */
struct proto_stream_writes {
    uint32_t *streams;
    uint32_t n_streams;
    struct proto_buffer *buffers;
    uint32_t n_buffers;
};

struct proto_request {
    uint32_t id;
    enum proto_op op;
    union {
        struct proto_hello hello;
        struct proto_catalog_load load;
        struct proto_catalog_ref ref; /* has, drop */
        struct proto_scan scan;
        struct proto_stream stream;        /* stream.open, stream.write, stream.close */
        struct proto_stream_writes writes; /* stream.writes */
    } u;
    /* Decoder-owned storage; zero in requests built for encoding. */
    struct proto_frame frame;
    void *mem;
};

/* What a failed decode could still read, for the error reply. */
struct proto_head {
    uint32_t id; /* 0 when the frame has no readable `id` */
    enum proto_op op;
};

/*
 * Decodes one request frame. Takes ownership of `frame` (body and fds), also
 * on failure (then freed and closed). On success *out owns everything it
 * points to, including the descriptors of fd buffers; free it with
 * proto_request_destroy after the reply (which closes the descriptors in
 * req->frame.fds: dup() one to keep it longer). Only scan may carry
 * descriptors (-VKS_E_BAD_FD otherwise), and every fd_index must name one of
 * them. Returns 0 or -VKS_E_* / -ENOMEM; `head` (may be NULL) gets the id and
 * op for the error reply either way. Decode errors never desynchronise the
 * stream.
 */
int proto_request_decode(struct proto_frame *frame, const struct proto_limits *lim,
                         struct proto_request **out, struct proto_head *head,
                         struct vks_error *err);

/* Frees a decoded request; NULL is allowed. */
void proto_request_destroy(struct proto_request *req);

/*
 * Appends one request frame (prefix included) to `out`. The request is
 * borrowed. Fd buffers are encoded by `fd_index`; the caller sends the
 * descriptors with proto_send. Returns 0, -ENOMEM, -EINVAL (an unencodable
 * field: unknown op or kind, a NULL string) or -E2BIG (frame over 4 GiB); on
 * failure `out` is unchanged.
 */
int proto_request_encode(struct proto_buf *out, const struct proto_request *req,
                         struct vks_error *err);

/*
 * The source fingerprint of a catalog.load (docs/protocol.md, "Source
 * fingerprint") is BLAKE2b-256 of the bytes this function passes to `sink`,
 * in order. proto has no hash of its own; the daemon and the client feed
 * crypto_generichash_update. The request is borrowed.
 */
typedef void (*proto_sink_fn)(void *ctx, const void *data, size_t len);
void proto_source_canon(const struct proto_catalog_load *load, proto_sink_fn sink, void *ctx);

/* ---- replies ---------------------------------------------------------- */

struct proto_device {
    uint32_t index;
    const char *name;
    const char *type; /* "discrete", "integrated", "cpu", "virtual", "other" */
    uint64_t memory;  /* bytes of device-local memory */
    bool active;      /* the daemon scans on it */
};

struct proto_hello_reply {
    uint32_t version;     /* the version chosen for this connection */
    uint32_t min_version; /* lowest the server speaks */
    const char *server;   /* "vkscand 0.1.0" */
    struct proto_limits limits;
    struct proto_device *devices;
    uint32_t n_devices;
};

struct proto_rule_info {
    const char *id;
    uint8_t fp[PROTO_FP_LEN];
};

struct proto_reject {
    uint32_t index; /* into the request's rules, or the rule's order in the file */
    uint32_t line;  /* pattern file line, 0 for rules sent as a list */
    uint32_t pos;   /* byte offset in the pattern */
    const char *id;
    const char *message;
};

/* The result of catalog.load, and of catalog.has when `known`. */
struct proto_catalog_result {
    bool known; /* has: whether the tenant holds it; load: always true */
    uint8_t fingerprint[PROTO_FP_LEN];
    uint8_t source[PROTO_FP_LEN];
    bool cached;                   /* no compile ran: memory or disk cache had it */
    uint64_t compile_ns;           /* 0 when cached */
    struct proto_rule_info *rules; /* accepted rules, catalog order = hit rule index */
    uint32_t n_rules;
    bool ids_only; /* rules[].fp are not sent (zero): the request asked `ids_only` */
    /* Encoding only: when set, `rules` is not read and these bytes (from
     * proto_pack_rules, n_rules of them) are sent as the rules array. */
    const uint8_t *rules_packed;
    size_t rules_packed_len;
    struct proto_reject *rejects;
    uint32_t n_rejects;
};

struct proto_hit {
    uint32_t buffer;
    uint32_t rule; /* catalog rule index */
    uint64_t end;  /* end offset relative to the buffer (or its fd range) start */
    uint32_t count;
    const char *rule_id; /* when the scan asked for rule ids, else NULL */
    bool has_start;      /* a rule with flag L, or the scan asked for `starts` */
    uint64_t start;      /* leftmost start offset, as `end` counts; with has_start */
};

struct proto_buffer_status {
    int code;            /* 0, or -VKS_E_* for this buffer alone */
    const char *message; /* NULL when code is 0 */
    uint64_t bytes;      /* bytes scanned */
    uint32_t hits;       /* hits reported for this buffer */
    bool truncated;      /* max_hits stopped the report early */
    bool cached;         /* the hits came from the daemon's result cache */
};

/* A named counter, for telemetry and stats. */
struct proto_stat {
    const char *key;
    bool is_float;
    uint64_t u;
    double f;
};

struct proto_scan_reply {
    struct proto_hit *hits;
    uint32_t n_hits;
    struct proto_buffer_status *buffers;
    uint32_t n_buffers;
    struct proto_stat *telemetry;
    uint32_t n_telemetry;
};

/* stream.open's result; stream.write and stream.close answer with a scan
 * result (one buffer status, the offsets counted from the stream's start). */
struct proto_stream_reply {
    uint32_t stream;      /* id, unique on this connection (the first, with `count`) */
    uint64_t state_bytes; /* bytes of state the daemon holds for it (for each) */
    uint32_t *streams;    /* with `count`: every id opened, in order */
    uint32_t n_streams;
};

struct proto_stats_reply {
    struct proto_stat *stats;
    uint32_t n_stats;
};

struct proto_reply {
    uint32_t id;
    enum proto_op op; /* PROTO_OP_NONE only in error replies */
    /* 0, or -VKS_E_* with `error.msg`: then no result is encoded or decoded. */
    struct vks_error error;
    union {
        struct proto_hello_reply hello;
        struct proto_catalog_result catalog; /* load, has */
        bool dropped;                        /* drop */
        struct proto_scan_reply scan;        /* scan, stream.write, stream.close */
        struct proto_stats_reply stats;
        struct proto_stream_reply stream; /* stream.open */
    } u;                                  /* ping: empty */
    void *mem;                            /* decoder-owned storage */
    struct proto_frame frame;
};

/*
 * Appends one reply frame to `out`. Borrowed input. Returns 0, -ENOMEM,
 * -EINVAL (an error code outside VKS_E_*, NULL strings where text is
 * required) or -E2BIG; on failure `out` is unchanged.
 */
int proto_reply_encode(struct proto_buf *out, const struct proto_reply *rep, struct vks_error *err);

/* Appends `rules` as the msgpack array of a catalog result (not a frame),
 * `[id, fingerprint]` each or, with `ids_only`, the ids: a server that
 * answers many catalog.has for one catalog packs its rules once and sends
 * them as proto_catalog_result.rules_packed. */
int proto_pack_rules(struct proto_buf *out, const struct proto_rule_info *rules, uint32_t n,
                     bool ids_only, struct vks_error *err);

/* Appends an error reply: shorthand for proto_reply_encode. `code` is
 * negative (-VKS_E_*). */
int proto_error_encode(struct proto_buf *out, uint32_t id, enum proto_op op, int code,
                       const char *msg, struct vks_error *err);

/*
 * Decodes one reply frame (client side). Takes ownership of `frame`, also on
 * failure. Returns 0 or -VKS_E_* / -ENOMEM. An error *reply* decodes
 * successfully: check (*out)->error.code.
 */
int proto_reply_decode(struct proto_frame *frame, const struct proto_limits *lim,
                       struct proto_reply **out, struct vks_error *err);

void proto_reply_destroy(struct proto_reply *rep);

/* A short English name of a VKS_E_* or errno code, such as "unknown catalog"
 * for -VKS_E_UNKNOWN_CATALOG. Never NULL. */
const char *proto_strerror(int code);

#endif
