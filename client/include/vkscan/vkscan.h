/*
 * libvkscan: the client library of the vkscand GPU scanning service.
 *
 * A `struct vks_client` is one connection to vkscand's Unix socket. Calls are
 * synchronous: each sends one request and waits for its reply. A client is
 * used by one thread at a time; open one client per thread for parallelism.
 *
 * Errors: every call returns 0 or a negative code, either -VKS_E_* (see
 * errors.h; the daemon's verdict, or -VKS_E_PROTOCOL / -VKS_E_CLOSED from the
 * library) or a negative errno (-ECONNREFUSED, -ENOENT, -ETIMEDOUT, -ENOMEM,
 * -EINVAL...). When `err` is not NULL it receives the same code and a message
 * that says what happened and what to do.
 *
 * Reconnects: hello, ping, stats, catalog.has, catalog.load and scan are
 * idempotent; when the connection breaks during one of them the library
 * reconnects (with the same options, repeating hello) and retries up to
 * `retries` times, sleeping `backoff_ms`, then twice that, and so on.
 * catalog.drop is never retried.
 *
 * Ownership: inputs are borrowed for the duration of the call (descriptors
 * too: the caller closes them). Outputs are owned by the caller and released
 * with the matching *_destroy / *_finish function.
 *
 * ABI: libvkscan.so.0 exports the vks_* symbols of this header under the
 * version node VKSCAN_0. The option structs (vks_client_options,
 * vks_load_options, vks_scan_options) begin with `size_t struct_size`: the
 * caller's sizeof, which the *_init functions set. The library reads only the
 * first struct_size bytes and takes the defaults for the fields after them,
 * so a program built against an older, smaller layout keeps working with a
 * newer library. A struct_size of 0 (a struct written with a designated
 * initializer and no *_init call) means the 0.2 layout: the fields above the
 * "added after 0.2" line. New fields are only ever added at the end, taken
 * from the `reserved` room, which must be zero. Output structs that the
 * library allocates in arrays (struct vks_hit) grow under a new version
 * node instead: the calls that return them have a VKSCAN_0.3 default and
 * keep their VKSCAN_0 versions, which return the old layout.
 *
 * The wire protocol is specified in docs/protocol.md.
 */
#ifndef VKSCAN_VKSCAN_H
#define VKSCAN_VKSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VKS_PROTOCOL_VERSION 1u
#define VKS_FP_LEN           32u /* BLAKE2b-256 fingerprints */
#define VKS_MAX_DEVICES      16u

/* The same record vkscan's internal modules use (common/error.h). */
#if !defined(VKS_COMMON_ERROR_H) && !defined(VKS_ERROR_STRUCT_DEFINED)
#define VKS_ERROR_STRUCT_DEFINED
struct vks_error {
    int code;
    char msg[256];
};
#endif

/* A short English name of any code these functions return. Never NULL. */
const char *vks_strerror(int code);

/* The library's version, such as "0.1.0". */
const char *vks_version(void);

/* ---- connection ------------------------------------------------------- */

struct vks_client;

struct vks_client_options {
    size_t struct_size;          /* sizeof(struct vks_client_options); see ABI above */
    uint32_t connect_timeout_ms; /* per connection attempt; default 5000 */
    uint32_t io_timeout_ms;      /* wait for one reply, added to a scan's own timeout;
                                    default 30000 */
    uint32_t retries;            /* reconnect attempts of an idempotent call; default 3 */
    uint32_t backoff_ms;         /* first pause before a retry, doubled each time;
                                    default 50, capped at 2000 */
    uint32_t max_frame;          /* largest reply frame accepted; default 64 MiB */
    const char *client_name;     /* shown in the daemon's logs; default "libvkscan" */
    /* ---- added after 0.2 ---- */
    /*
     * Inline scan buffers of at least this many bytes are copied by the
     * library into a memfd and passed by descriptor, so the daemon reads
     * them from the memfd instead of through the socket. A client keeps up
     * to 4 such memfds (256 MiB in all; sealed with F_SEAL_SHRINK) and
     * writes the next scans' large buffers into them, which spares the
     * allocation of fresh pages; beyond that, a fresh memfd sealed with
     * F_SEAL_SHRINK|GROW|WRITE|SEAL is made and closed after the reply.
     * 0: the default, 1 MiB (VKS_MEMFD_THRESHOLD_DEFAULT); UINT64_MAX: never.
     * A scan keeps a buffer inline when the daemon's max_fds descriptors are
     * already used by the request. Smaller inline buffers of one request
     * (vks_client_scan, vks_stream_write_many) that add up to the threshold
     * are copied together into one kept memfd and sent as ranges of it (one
     * copy instead of the socket's two: the daemon's loop thread does not
     * read their bytes).
     */
    uint64_t memfd_threshold;
    /* SO_SNDBUF and SO_RCVBUF asked of the socket (the kernel caps them at
     * net.core.wmem_max / rmem_max). 0: the default, 4 MiB. */
    uint32_t socket_buffer;
    uint32_t reserved32;  /* must be 0 */
    uint64_t reserved[6]; /* room to grow: must be 0 */
};

#define VKS_MEMFD_THRESHOLD_DEFAULT (1u << 20)
#define VKS_SOCKET_BUFFER_DEFAULT   (4u << 20)

/* Fills `opt` with the defaults above, struct_size included. */
void vks_client_options_init(struct vks_client_options *opt);

/*
 * Connects to the vkscand socket at `socket_path` and exchanges hello, so a
 * protocol mismatch (-VKS_E_VERSION) or a daemon that is not there
 * (-ENOENT, -ECONNREFUSED) is reported here. `opt` may be NULL (defaults);
 * it is copied. On success *out is the new client; close it with
 * vks_client_close.
 */
int vks_client_connect(const char *socket_path, const struct vks_client_options *opt,
                       struct vks_client **out, struct vks_error *err);

/* Closes the connection and frees the client; NULL is allowed. */
void vks_client_close(struct vks_client *c);

struct vks_device {
    uint32_t index;
    char name[128];
    char type[16]; /* "discrete", "integrated", "cpu", "virtual", "other" */
    uint64_t memory;
    bool active;
};

struct vks_server_info {
    uint32_t protocol;  /* the version chosen for this connection */
    char server[64];    /* "vkscand 0.1.0" */
    uint32_t max_frame; /* the daemon's limits (docs/protocol.md) */
    uint32_t max_buffers;
    uint32_t max_rules;
    uint32_t max_fds;
    uint32_t max_hits;
    uint32_t n_devices; /* at most VKS_MAX_DEVICES are listed */
    struct vks_device devices[VKS_MAX_DEVICES];
};

/* Sends hello again and fills `info` with the daemon's answer. */
int vks_client_hello(struct vks_client *c, struct vks_server_info *info, struct vks_error *err);

/*
 * Copies into `info` the hello reply of the client's current connection (the
 * one vks_client_connect received, or the latest after a reconnect or
 * vks_client_hello): no round trip. Returns 0, or -EINVAL when `c` or `info`
 * is NULL.
 */
int vks_client_info(const struct vks_client *c, struct vks_server_info *info);

/* A round trip that does no work. */
int vks_client_ping(struct vks_client *c, struct vks_error *err);

/* ---- catalogs --------------------------------------------------------- */

enum vks_rule_kind {
    VKS_RULE_LITERAL = 0,
    VKS_RULE_HEX = 1,
    VKS_RULE_REGEX = 2,
};

struct vks_rule {
    const char *id; /* NUL-terminated, 1..255 bytes */
    enum vks_rule_kind kind;
    const char *pattern;
    size_t pattern_len; /* 0: strlen(pattern) */
    const char *flags;  /* letters such as "iH", or NULL */
};

struct vks_load_options {
    size_t struct_size;  /* sizeof(struct vks_load_options); see ABI above */
    uint32_t max_states; /* per-group DFA state budget; 0: the daemon's default */
    bool always_send;    /* skip catalog.has and send the rules */
    /* ---- added after 0.2 ---- */
    /* The daemon sends the rule ids without their fingerprints (protocol
     * `ids_only`): a 43 k-rule catalog's reply is 0.4 MB instead of 1.9;
     * vks_catalog_rule_fingerprint then returns NULL. */
    bool ids_only;
    uint8_t reserved8[2]; /* must be 0 */
    uint64_t reserved[4]; /* room to grow: must be 0 */
};

/* Fills `opt` with the defaults (all zero), struct_size included. */
void vks_load_options_init(struct vks_load_options *opt);

/* A loaded catalog as the daemon reported it. Opaque; read it with the
 * vks_catalog_* accessors. */
struct vks_catalog;

/*
 * Loads a rule set: first asks catalog.has with the set's source fingerprint
 * and sends the rules (catalog.load) only when the daemon does not hold the
 * set yet. Rules the compiler rejects do not fail the call: they are listed
 * by vks_catalog_reject. `opt` may be NULL. On success *out is owned by the
 * caller (vks_catalog_destroy).
 */
int vks_client_catalog_load(struct vks_client *c, const struct vks_rule *rules, size_t n,
                            const struct vks_load_options *opt, struct vks_catalog **out,
                            struct vks_error *err);

/* Like vks_client_catalog_load for a pattern file's text (`ID:/regex/flags`
 * lines, docs/rules.md), `len` bytes. */
int vks_client_catalog_load_text(struct vks_client *c, const char *text, size_t len,
                                 const struct vks_load_options *opt, struct vks_catalog **out,
                                 struct vks_error *err);

/* Whether this tenant holds the catalog with fingerprint `fp`. */
int vks_client_catalog_has(struct vks_client *c, const uint8_t fp[VKS_FP_LEN], bool *known,
                           struct vks_error *err);

/* Releases this tenant's hold on a catalog; *dropped (may be NULL) says
 * whether it held one. Not retried on a lost connection. */
int vks_client_catalog_drop(struct vks_client *c, const uint8_t fp[VKS_FP_LEN], bool *dropped,
                            struct vks_error *err);

/* The source fingerprints catalog.has is asked with (docs/protocol.md). */
int vks_source_fingerprint(const struct vks_rule *rules, size_t n,
                           const struct vks_load_options *opt, uint8_t out[VKS_FP_LEN],
                           struct vks_error *err);
int vks_source_fingerprint_text(const char *text, size_t len, const struct vks_load_options *opt,
                                uint8_t out[VKS_FP_LEN], struct vks_error *err);

void vks_catalog_destroy(struct vks_catalog *cat);

/* Borrowed, VKS_FP_LEN bytes, valid until vks_catalog_destroy. */
const uint8_t *vks_catalog_fingerprint(const struct vks_catalog *cat);
const uint8_t *vks_catalog_source(const struct vks_catalog *cat);

/* True when this load sent the rules; false when catalog.has found them. */
bool vks_catalog_rules_sent(const struct vks_catalog *cat);

/* True when the daemon compiled nothing (memory or disk cache). */
bool vks_catalog_cached(const struct vks_catalog *cat);

/* Accepted rules, in catalog order: a hit's `rule` indexes this list. */
size_t vks_catalog_rule_count(const struct vks_catalog *cat);
const char *vks_catalog_rule_id(const struct vks_catalog *cat, size_t i);
const uint8_t *vks_catalog_rule_fingerprint(const struct vks_catalog *cat, size_t i);

struct vks_reject {
    uint32_t index; /* position in the input (rules array, or rule order in the file) */
    uint32_t line;  /* pattern file line, 0 for a rules array */
    uint32_t pos;   /* byte offset of the problem in the pattern */
    const char *id;
    const char *message; /* borrowed from the catalog */
};

size_t vks_catalog_reject_count(const struct vks_catalog *cat);
/* Returns 0, or -EINVAL when `i` is out of range. */
int vks_catalog_reject(const struct vks_catalog *cat, size_t i, struct vks_reject *out);

/* ---- scans ------------------------------------------------------------ */

enum vks_report {
    VKS_REPORT_ALL = 0,   /* every (rule, end offset) */
    VKS_REPORT_FIRST = 1, /* the first match per (buffer, rule) */
    VKS_REPORT_COUNT = 2, /* one hit per (buffer, rule): first end and count */
};

enum vks_buffer_kind {
    VKS_BUFFER_INLINE = 0, /* `data`, `len`: copied through the socket */
    VKS_BUFFER_FD = 1,     /* `fd` (a memfd or a file open for reading), passed with
                              SCM_RIGHTS: `offset`, and `length` bytes (0: to the end) */
};

struct vks_buffer {
    enum vks_buffer_kind kind;
    const void *data;
    size_t len;
    int fd;
    uint64_t offset;
    uint64_t length;
};

struct vks_scan_options {
    size_t struct_size; /* sizeof(struct vks_scan_options); see ABI above */
    enum vks_report mode;
    uint32_t max_hits;   /* 0: the daemon's limit */
    uint32_t timeout_ms; /* 0: the daemon's scan-timeout-ms (60000 by default) */
    bool rule_ids;       /* fill vks_hit.rule_id */
    /* ---- added after 0.2 ---- */
    bool no_cache;        /* bypass the daemon's result cache: every descriptor
                             buffer is read and scanned (`cache: false`) */
    bool starts;          /* added after 0.2: a start on every hit, not only on the
                             hits of rules with flag L (`starts: true`) */
    uint8_t reserved8[6]; /* must be 0 */
    uint64_t reserved[3]; /* room to grow: must be 0 */
};

/* Fills `opt` with the defaults (all hits, no timeout), struct_size included. */
void vks_scan_options_init(struct vks_scan_options *opt);

/* No start: the hit's rule has no flag L and the scan did not ask for
 * `starts`, or the daemon predates starts. */
#define VKS_NO_START UINT64_MAX

/*
 * One match. `start` was added after 0.2 (version node VKSCAN_0.3): programs
 * built against an older header call the VKSCAN_0 versions of
 * vks_client_scan, vks_stream_write, vks_stream_write_fd and
 * vks_stream_close, which hand back hits of the old layout (the fields
 * before `start`).
 */
struct vks_hit {
    uint32_t buffer;
    uint32_t rule; /* index into the catalog's rules */
    uint64_t end;  /* end offset, relative to the buffer (or its fd range) */
    uint32_t count;
    const char *rule_id; /* when rule_ids was asked, else NULL */
    /* Leftmost start offset of the match, as `end` counts (the bytes
     * [start, end) match the rule), or VKS_NO_START. */
    uint64_t start;
};

struct vks_buffer_result {
    int code;            /* 0, or -VKS_E_* for this buffer (others still scanned) */
    const char *message; /* NULL when code is 0 */
    uint64_t bytes;
    uint32_t hits;
    bool truncated; /* max_hits cut the report short */
    bool cached;    /* added after 0.2 (in the padding): the hits came from the
                       daemon's result cache, the file was not read */
};

struct vks_stat {
    const char *key;
    bool is_float;
    uint64_t u; /* also set for floats (truncated) */
    double f;   /* also set for integers */
};

struct vks_scan_result {
    struct vks_hit *hits;
    size_t n_hits;
    struct vks_buffer_result *buffers;
    size_t n_buffers;
    struct vks_stat *telemetry;
    size_t n_telemetry;
    void *priv;
};

/*
 * Scans `n` buffers against the catalog with fingerprint `catalog` (from
 * vks_catalog_fingerprint). Inline and fd buffers may be mixed. Inline
 * buffers of memfd_threshold bytes or more travel as sealed memfds (see
 * vks_client_options); offsets and results are the same either way. `opt` may be
 * NULL (all hits, no timeout). On success `res` is filled; release it with
 * vks_scan_result_finish. A buffer that could not be read fails only its own
 * entry in res->buffers.
 */
int vks_client_scan(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN],
                    const struct vks_buffer *buffers, size_t n, const struct vks_scan_options *opt,
                    struct vks_scan_result *res, struct vks_error *err);

void vks_scan_result_finish(struct vks_scan_result *res);

/* ---- streams ------------------------------------------------------------ */

/*
 * A stream scans data that arrives in pieces (docs/protocol.md, "Streams"):
 * each write returns the matches it completes, a match may straddle writes,
 * and end offsets count from the stream's first byte. Matches that only the
 * end of data decides (`$`, `\b` after the last byte) come from
 * vks_stream_close. Writes of one stream are ordered; a stream belongs to the
 * connection that opened it and is not carried over a reconnect (a lost
 * connection fails the call with -VKS_E_CLOSED or the errno, and the stream
 * is gone). The stream borrows `c`, which must outlive it.
 */
struct vks_stream;

struct vks_stream_options {
    size_t struct_size; /* sizeof(struct vks_stream_options); see ABI above */
    /* VKS_REPORT_ALL (default): every match a write completes, one hit
     * each. VKS_REPORT_COUNT (added after 0.4): one hit per rule and write,
     * `end` the first end the write completed and `count` how many; a
     * daemon before it ignores the field and answers every match with
     * count 1, so summing `count` is right with either. A stream cannot
     * report FIRST (-VKS_E_BAD_VALUE): take a rule's first reported hit. */
    enum vks_report mode;
    uint32_t reserved32;  /* must be 0 */
    uint64_t reserved[3]; /* room to grow: must be 0 */
};

/* Fills `opt` with the defaults, struct_size included. */
void vks_stream_options_init(struct vks_stream_options *opt);

/*
 * Opens a stream over the catalog `catalog` (loaded by this tenant). `opt`
 * may be NULL. Errors: -VKS_E_UNKNOWN_CATALOG, -VKS_E_BUSY (the tenant has
 * stream-max-per-tenant streams open), -VKS_E_LIMIT (the catalog's stream
 * state is over stream-max-state-bytes).
 */
int vks_stream_open(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN],
                    const struct vks_stream_options *opt, struct vks_stream **out,
                    struct vks_error *err);

/* Opens `n` streams over `catalog` in one request (added after 0.3,
 * VKSCAN_0.4), into out[0..n): all or none; -VKS_E_BUSY when the tenant
 * would pass stream-max-per-tenant. */
int vks_stream_open_many(struct vks_client *c, const uint8_t catalog[VKS_FP_LEN], size_t n,
                         struct vks_stream **out, struct vks_error *err);

/* Bytes of state the daemon holds for the stream (like hs_stream_size). */
uint64_t vks_stream_state_bytes(const struct vks_stream *s);

/* Bytes written so far. */
uint64_t vks_stream_offset(const struct vks_stream *s);

/*
 * Writes `len` bytes (borrowed) and fills `res` with the matches this write
 * decides: one buffer status (index 0), hits with `buffer` 0 and `end`
 * counted from the stream's start. Free `res` with vks_scan_result_finish.
 * -VKS_E_TIMEOUT: the daemon closed the stream after
 * stream-idle-timeout-ms without requests. A write that fails without the
 * daemon's own refusal (its reply timed out, could not be read or decoded,
 * the connection was lost) may have been applied, so the stream's matches
 * and offset are no longer known: every later write then fails with
 * -VKS_E_CLOSED, "stream N is unusable", and the stream should be closed
 * and a new one opened. The same holds once the client's connection was
 * dropped for any reason, as streams live on one connection.
 */
int vks_stream_write(struct vks_stream *s, const void *data, size_t len,
                     struct vks_scan_result *res, struct vks_error *err);

/* The same for `length` bytes of descriptor `fd` from `offset` (0: to the
 * end of the file); the descriptor is borrowed. */
int vks_stream_write_fd(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                        struct vks_scan_result *res, struct vks_error *err);

/*
 * Pipelined writes (added after 0.3, version node VKSCAN_0.4). vks_stream_write_send sends a write
 * and returns without waiting for its reply: the bytes are copied into the
 * request (or, from memfd_threshold bytes, into a sealed memfd), so `data`
 * may be reused at once; a descriptor may be closed once _fd_send returns.
 * vks_stream_write_recv waits for the reply of the stream's oldest write in
 * flight and fills `res` as vks_stream_write does; replies come back in the
 * order the stream's writes were sent. Many writes in flight on many
 * streams of one client are what lets vkscand batch them: on a GPU, the
 * writes of many streams run in one launch (docs/protocol.md, "Streams").
 * The client takes the replies that arrived each time it sends, and while
 * the socket is full, so it never blocks on a daemon that waits for it to
 * read; the daemon stops reading past tenant-max-requests requests in
 * flight, so a send then waits, at most io_timeout_ms.
 *
 * A write the daemon refused (its error reply) was not applied, and later
 * writes of the stream were: the stream goes on past the gap. Any other
 * failure makes the stream unusable, as above. While a stream has writes in
 * flight, vks_stream_write, vks_stream_write_fd and vks_stream_close fail
 * with -EBUSY (close then leaves the stream open): take the replies first.
 * vks_stream_write_recv with none in flight fails with -EINVAL.
 */
int vks_stream_write_send(struct vks_stream *s, const void *data, size_t len,
                          struct vks_error *err);
int vks_stream_write_fd_send(struct vks_stream *s, int fd, uint64_t offset, uint64_t length,
                             struct vks_error *err);
int vks_stream_write_recv(struct vks_stream *s, struct vks_scan_result *res, struct vks_error *err);
/* Writes sent and not yet received. */
uint32_t vks_stream_inflight(const struct vks_stream *s);

/*
 * Writes to many streams in one request (added after 0.3, VKSCAN_0.4):
 * `buffers[i]` (inline or a descriptor range, as in vks_client_scan) to
 * `streams[i]`, all streams of one client, in order where a stream comes
 * more than once; the daemon runs the writes of different streams in
 * parallel. One request instead of n is what lets one connection feed the
 * daemon at its scanning rate with small writes (a flow reassembler's
 * shape). `res` holds one buffer result per write (index i: the bytes it
 * applied, or its own error code and message) and the hits of all, `buffer`
 * naming the write, offsets counted from each stream's start. A write that
 * fails with bytes applied leaves its stream unusable, as a failed
 * vks_stream_write does; one refused whole leaves it intact. -EBUSY when a
 * stream has pipelined writes in flight.
 */
int vks_stream_write_many(struct vks_stream *const *streams, const struct vks_buffer *buffers,
                          size_t n, struct vks_scan_result *res, struct vks_error *err);

/*
 * Ends the stream and frees `s` (also on failure, except -EBUSY above;
 * NULL allowed). `res` (may be NULL) receives the matches only the end of
 * data decides.
 */
int vks_stream_close(struct vks_stream *s, struct vks_scan_result *res, struct vks_error *err);

/*
 * Closes `n` streams of one client in one request (added after 0.3,
 * VKSCAN_0.4) and frees them (also on failure, except -EBUSY, a stream
 * with pipelined writes in flight, and -EINVAL, streams of two clients:
 * then nothing is closed). `res` (may be NULL)
 * holds one buffer result per stream (index i: streams[i]'s own error, or
 * 0) and the matches only the end of data decides, each with `buffer` i.
 */
int vks_stream_close_many(struct vks_stream *const *streams, size_t n, struct vks_scan_result *res,
                          struct vks_error *err);

/* ---- statistics ------------------------------------------------------- */

struct vks_stats {
    struct vks_stat *stats;
    size_t n_stats;
    void *priv;
};

/* The daemon's counters (docs/protocol.md lists the keys). */
int vks_client_stats(struct vks_client *c, struct vks_stats *out, struct vks_error *err);

void vks_stats_finish(struct vks_stats *s);

/* The entry named `key`, or NULL. */
const struct vks_stat *vks_stat_find(const struct vks_stat *stats, size_t n, const char *key);

#ifdef __cplusplus
}
#endif

#endif
