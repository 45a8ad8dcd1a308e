/*
 * The two systemd conventions vkscand speaks without libsystemd: readiness
 * notification (one datagram to $NOTIFY_SOCKET, sd_notify(3)) and socket
 * activation ($LISTEN_FDS / $LISTEN_PID, sd_listen_fds(3)).
 */
#ifndef VKS_DAEMON_NOTIFY_H
#define VKS_DAEMON_NOTIFY_H

#include "error.h"

/*
 * Sends `state` (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET. Returns 0
 * when sent, 1 when the variable is unset (not started by a service manager),
 * or a negative errno when the socket cannot be reached. The socket may be a
 * path or an abstract name ("@name"). Blocking-free: one sendto on a
 * datagram socket.
 */
int notify_send(const char *state);

/*
 * Returns the first socket passed by socket activation (fd 3) when
 * $LISTEN_PID is our pid and $LISTEN_FDS is at least 1, after checking it is
 * a listening Unix stream socket and making it non-blocking and close-on-exec;
 * returns -ENOENT when we were not socket-activated, or -EINVAL with `err`
 * filled when the passed descriptor is not usable. Unsets the variables so
 * children do not inherit them.
 */
int notify_listen_fd(struct vks_error *err);

#endif
