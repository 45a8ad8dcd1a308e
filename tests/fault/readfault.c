/*
 * readfault: preloaded into vkscand by tests/test_daemon.c, it fails reads
 * of chosen files so the daemon's read-error paths run on a real descriptor.
 * A pread() of a file whose name (the /proc/self/fd link: a memfd's name)
 * contains "readfault-eio" fails with EIO; one containing "readfault-short"
 * returns 0, as a read past the end of a file truncated under the scan
 * does; one containing "readfault-big" fails with EIO when it asks for more
 * than 4 KiB (a stream write's head and tail are read, its middle is not:
 * tests/test_stream.c); one containing "readfault-slow" goes through after
 * a second (a stream write's begin that is still running on a thread when
 * the write before it fails). Every other read goes through.
 */
#undef _FILE_OFFSET_BITS /* pread and pread64 are two symbols to take over */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* 0: pass through; 1: EIO; 2: end of file. */
static int fault_of(int fd, size_t len)
{
    char link[64], name[512];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, name, sizeof(name) - 1);
    if (n <= 0)
        return 0;
    name[n] = '\0';
    if (strstr(name, "readfault-eio") != NULL)
        return 1;
    if (strstr(name, "readfault-big") != NULL)
        return len > 4096 ? 1 : 0;
    if (strstr(name, "readfault-slow") != NULL)
        sleep(1);
    return strstr(name, "readfault-short") != NULL ? 2 : 0;
}

typedef ssize_t (*pread_fn)(int, void *, size_t, off64_t);

static ssize_t faulty(const char *sym, int fd, void *buf, size_t len, off64_t off)
{
    int f = fault_of(fd, len);
    if (f == 1) {
        errno = EIO;
        return -1;
    }
    if (f == 2)
        return 0;
    void *p = dlsym(RTLD_NEXT, sym);
    pread_fn real;
    memcpy(&real, &p, sizeof(real)); /* ISO C has no object-to-function cast */
    return real(fd, buf, len, off);
}

ssize_t pread(int fd, void *buf, size_t len, off_t off)
{
    return faulty("pread", fd, buf, len, off);
}

ssize_t pread64(int fd, void *buf, size_t len, off64_t off)
{
    return faulty("pread64", fd, buf, len, off);
}
