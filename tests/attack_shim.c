/*
 * Preloaded into vkscand by tests/test_attack.c (LD_PRELOAD): fdatasync
 * fails with EIO, as on a disk that is full or failing, so the test can
 * check that the disk cache still closes every file it wrote.
 */
#include <errno.h>

int fdatasync(int fd);

int fdatasync(int fd)
{
    (void)fd;
    errno = EIO;
    return -1;
}
