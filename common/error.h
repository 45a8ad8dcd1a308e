/*
 * vkscan: the error record every module fills for failures a user must read.
 *
 * Fixed size on purpose, so that reporting works when memory is exhausted.
 * Functions return 0 or a negative errno-style code; when they take a
 * `struct vks_error *` (always last) they also fill it with the same code and
 * a message that says what happened and what to do. A NULL pointer is allowed
 * and means "the caller does not want the text".
 */
#ifndef VKS_COMMON_ERROR_H
#define VKS_COMMON_ERROR_H

#include <stdarg.h>
#include <stdio.h>

/* The installed client header defines the same struct under the same guard,
 * so the two can be included in either order. */
#ifndef VKS_ERROR_STRUCT_DEFINED
#define VKS_ERROR_STRUCT_DEFINED
struct vks_error {
    int code;
    char msg[256];
};
#endif

#if defined(__GNUC__)
#define VKS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define VKS_PRINTF(a, b)
#endif

/* Fills `err` (when not NULL) and returns `code`, so callers can write
 * `return vks_error_set(err, -EINVAL, "...", ...);`. */
static inline VKS_PRINTF(3, 4) int vks_error_set(struct vks_error *err, int code, const char *fmt,
                                                 ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

static inline void vks_error_clear(struct vks_error *err)
{
    if (err != NULL) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

#endif
