/*
 * sd_notify and sd_listen_fds, the small parts vkscand needs (notify.h).
 */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_FDS_START 3

int notify_send(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (path == NULL || path[0] == '\0')
        return 1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
        return -EINVAL;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    int rc = n < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int notify_listen_fd(struct vks_error *err)
{
    const char *pid_s = getenv("LISTEN_PID");
    const char *fds_s = getenv("LISTEN_FDS");
    if (pid_s == NULL || fds_s == NULL)
        return -ENOENT;
    char *end;
    long pid = strtol(pid_s, &end, 10);
    if (*end != '\0' || pid != (long)getpid())
        return -ENOENT;
    long n = strtol(fds_s, &end, 10);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (*end != '\0' || n < 1)
        return -ENOENT;
    int fd = LISTEN_FDS_START;
    int type = 0, listening = 0;
    socklen_t l1 = sizeof(type), l2 = sizeof(listening);
    struct sockaddr_un sa;
    socklen_t salen = sizeof(sa);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l1) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l2) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) != 0 || sa.sun_family != AF_UNIX ||
        type != SOCK_STREAM || !listening)
        return vks_error_set(err, -EINVAL,
                             "socket activation passed fd %d, which is not a "
                             "listening Unix stream socket: check ListenStream= in "
                             "vkscand.socket",
                             fd);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return vks_error_set(err, -errno, "cannot set flags on the activated socket: %s",
                             strerror(errno));
    return fd;
}
