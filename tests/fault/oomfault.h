/*
 * oomfault: a failing allocator for out-of-memory tests. A test program
 * links liboomfault (oomfault_dep), whose link arguments
 * (-Wl,--wrap=malloc,...) send every call of malloc, calloc, realloc and
 * strdup made by the objects linked into that program (rules/, proto/,
 * client/client.c compiled in, the test itself) through the wrappers here.
 * Shared libraries keep their own allocator, and another process (vkscand)
 * is never touched.
 *
 * Allocations are counted only inside a window that the test opens with
 * oomfault_open() and closes with oomfault_close(); outside a window, and
 * inside one until the armed call, every call goes straight to the real
 * allocator (the sanitizer's under ASan, so leaks are still found).
 * With OOMFAULT_TRACE set in the environment, each failed allocation prints
 * its call stack on stderr (to find a failure that was swallowed).
 */
#ifndef VKS_TESTS_OOMFAULT_H
#define VKS_TESTS_OOMFAULT_H

#include <stdbool.h>

/* Opens a window: the `nth` allocation from now fails once (returns NULL
 * with errno ENOMEM); 0 fails none and only counts. Thread-safe (atomics),
 * but a deterministic count needs the code under test on one thread. */
void oomfault_open(long nth);

/* Closes the window; returns the allocations it counted (those past the
 * armed one included). */
long oomfault_close(void);

/* Pause and resume the count inside a window (they nest): for the test's
 * own checks, since Check, linked statically, allocates in every assertion. */
void oomfault_pause(void);
void oomfault_resume(void);

/* Whether the armed allocation of the last window failed. */
bool oomfault_fired(void);

#endif
