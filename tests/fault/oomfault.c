/* oomfault: fails the armed allocation inside a test's window (oomfault.h). */
#include <errno.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stddef.h>

#include "oomfault.h"

/* The real functions, named by the linker's --wrap. */
void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
char *__real_strdup(const char *s);

static atomic_bool window;
static atomic_long counted;
static atomic_long armed;
static atomic_bool fired;
static atomic_int paused;

void oomfault_open(long nth)
{
    atomic_store(&counted, 0);
    atomic_store(&fired, false);
    atomic_store(&armed, nth);
    atomic_store(&window, true);
}

long oomfault_close(void)
{
    atomic_store(&window, false);
    atomic_store(&armed, 0);
    return atomic_load(&counted);
}

void oomfault_pause(void)
{
    atomic_fetch_add(&paused, 1);
}

void oomfault_resume(void)
{
    atomic_fetch_sub(&paused, 1);
}

bool oomfault_fired(void)
{
    return atomic_load(&fired);
}

/* Counts one allocation; true when it is the armed one. */
static bool fail_now(void)
{
    if (!atomic_load(&window) || atomic_load(&paused) > 0)
        return false;
    long n = atomic_fetch_add(&counted, 1) + 1;
    if (n != atomic_load(&armed))
        return false;
    atomic_store(&fired, true);
    if (getenv("OOMFAULT_TRACE") != NULL) {
        void *frames[16];
        fprintf(stderr, "oomfault: failing allocation %ld from\n", n);
        backtrace_symbols_fd(frames, backtrace(frames, 16), 2);
    }
    errno = ENOMEM;
    return true;
}

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
char *__wrap_strdup(const char *s);

void *__wrap_malloc(size_t size)
{
    return fail_now() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return fail_now() ? NULL : __real_calloc(n, size);
}

/* realloc(p, 0) frees (or not) rather than allocates: not counted. */
void *__wrap_realloc(void *p, size_t size)
{
    return size != 0 && fail_now() ? NULL : __real_realloc(p, size);
}

char *__wrap_strdup(const char *s)
{
    return fail_now() ? NULL : __real_strdup(s);
}
