/*
 * vkscand's log: one line per event on stderr. Under journald
 * (JOURNAL_STREAM set) each line is prefixed with the syslog priority in the
 * form journald parses ("<3>...", sd-daemon(3)), so the journal keeps the
 * level without libsystemd; elsewhere (a terminal, a file) lines are plain.
 */
#ifndef VKS_DAEMON_LOG_H
#define VKS_DAEMON_LOG_H

#include "error.h"

enum log_level {
    LOG_LVL_ERR = 3,
    LOG_LVL_WARNING = 4,
    LOG_LVL_NOTICE = 5,
    LOG_LVL_INFO = 6,
    LOG_LVL_DEBUG = 7,
};

/* Sets the most verbose level that is printed (default LOG_LVL_INFO). Any
 * thread; the level is read without a lock, a stale value only misses or adds
 * a line. */
void log_set_level(enum log_level level);

/* Parses "err", "warning", "notice", "info" or "debug"; returns -EINVAL on
 * anything else. */
int log_level_parse(const char *s, enum log_level *out);

/* Writes one line (a trailing newline is added). Any thread: one write(2)
 * per line, so lines from different threads do not interleave. */
void log_msg(enum log_level level, const char *fmt, ...) VKS_PRINTF(2, 3);

#define log_err(...)    log_msg(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...)   log_msg(LOG_LVL_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_LVL_NOTICE, __VA_ARGS__)
#define log_info(...)   log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)  log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
