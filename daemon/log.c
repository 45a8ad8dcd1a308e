/*
 * Journal-friendly stderr logging (see log.h).
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int max_level = LOG_LVL_INFO;

void log_set_level(enum log_level level)
{
    max_level = (int)level;
}

int log_level_parse(const char *s, enum log_level *out)
{
    static const struct {
        const char *name;
        enum log_level level;
    } names[] = {
        {"err", LOG_LVL_ERR},       {"error", LOG_LVL_ERR}, {"warning", LOG_LVL_WARNING},
        {"notice", LOG_LVL_NOTICE}, {"info", LOG_LVL_INFO}, {"debug", LOG_LVL_DEBUG},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    }
    return -EINVAL;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if ((int)level > max_level)
        return;
    /* journald parses "<N>" prefixes; on a terminal or in a file they are
     * noise, so they are written only when stderr is the journal's stream
     * (systemd sets JOURNAL_STREAM for it). */
    static atomic_int journal = -1;
    if (atomic_load(&journal) < 0)
        atomic_store(&journal, getenv("JOURNAL_STREAM") != NULL);
    char line[1024];
    int n = journal ? snprintf(line, sizeof(line), "<%d>", (int)level) : 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nothing sensible to do when stderr is gone */
}
