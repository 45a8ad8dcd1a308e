/*
 * proto: the error codes of the wire protocol (docs/protocol.md), owned by
 * proto/ so that the wire format depends on nothing else.
 *
 * client/include/vkscan/errors.h installs the same enum for libvkscan's
 * users: the numbers and names must stay identical (tests/test_proto.c
 * compares the two files), and both use the include guard VKSCAN_ERRORS_H so
 * that a file including both (the client library) sees one definition.
 *
 * On the wire an error reply carries the positive number. In C every function
 * returns 0 or a negative code: either -VKS_E_* (a protocol or service error)
 * or a negative errno value (a local system error such as -ECONNREFUSED). The
 * two ranges do not overlap: errno values are below VKS_E_BASE.
 */
#ifndef VKSCAN_ERRORS_H
#define VKSCAN_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

#define VKS_E_BASE 1000

enum vks_errc {
    /* Framing: the stream cannot be resynchronised after these two. */
    VKS_E_FRAME_TOO_LARGE = 1001, /* length prefix above the frame limit */
    VKS_E_BAD_FRAME = 1002,       /* frame body is not exactly one msgpack value */
    /* Message structure (the frame was delimited: the connection continues). */
    VKS_E_BAD_TYPE = 1003,      /* a field (or the frame) has the wrong msgpack type */
    VKS_E_MISSING_FIELD = 1004, /* a required field is absent */
    VKS_E_BAD_VALUE = 1005,     /* a field has the right type but a value out of range */
    VKS_E_DEPTH = 1006,         /* msgpack nesting deeper than the limit */
    VKS_E_LIMIT = 1007,         /* a string, array or map longer than its limit */
    VKS_E_UNKNOWN_OP = 1008,    /* `op` names no operation of this protocol version */
    VKS_E_VERSION = 1009,       /* no protocol version in common */
    /* Request content. */
    VKS_E_UNKNOWN_CATALOG = 1010,  /* fingerprint not loaded by this tenant */
    VKS_E_BAD_FD = 1011,           /* fd index out of range, fd unusable, range outside it */
    VKS_E_TOO_MANY_BUFFERS = 1012, /* more buffers in one scan than the limit */
    VKS_E_TOO_MANY_RULES = 1013,   /* more rules in one catalog.load than the limit */
    VKS_E_TOO_MANY_FDS = 1014,     /* more descriptors with one frame than the limit */
    VKS_E_RULES = 1015,            /* the rule set as a whole could not be compiled */
    /* Service state. */
    VKS_E_BUSY = 1016,     /* tenant over its queue or memory quota: retry later */
    VKS_E_TIMEOUT = 1017,  /* the request's timeout passed before it finished */
    VKS_E_DEVICE = 1018,   /* the GPU (or its memory budget) failed the request */
    VKS_E_SHUTDOWN = 1019, /* the daemon is draining and takes no new work */
    VKS_E_INTERNAL = 1020, /* a bug or resource failure inside the daemon */
    /* Client side only (never on the wire). */
    VKS_E_PROTOCOL = 1021, /* the peer sent a reply that breaks the protocol */
    VKS_E_CLOSED = 1022,   /* connection lost and the retries ran out */
    /* Service state, added after the client-side codes. */
    VKS_E_DENIED = 1023, /* the daemon's allow-uids / allow-gids do not admit this peer */
    VKS_E_MAX_CODE = 1023
};

#ifdef __cplusplus
}
#endif

#endif
