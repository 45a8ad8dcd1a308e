/*
 * Directory walks of `vkscan scan` (vkscan_walk.c): which files a walk
 * visits, as ripgrep chooses them. Not installed; main thread only.
 *
 * Supported in .gitignore and .ignore files (docs/cli.md says the same):
 * blank lines and `#` comments, `\#` and `\!` escapes, trailing spaces
 * trimmed; `*` (not `/`), `?`, `[a-z]` / `[!a-z]` classes, a double star
 * (any number of directories: at the start before a slash, between two
 * slashes, or at the end after one); `!` negation (the
 * last matching line wins); a trailing `/` matches directories only; a
 * leading or inner `/` anchors the pattern to the ignore file's directory,
 * otherwise it matches the name at any depth. Ignore files are read in every
 * directory the walk enters (not above the roots given, and not
 * .git/info/exclude or the global excludes file); a file inside an ignored
 * directory cannot be re-included (the directory is not entered).
 */
#ifndef VKS_CLIENT_VKSCAN_WALK_H
#define VKS_CLIENT_VKSCAN_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct walk_opts {
    bool no_ignore; /* --no-ignore: ignore files are not read */
    bool hidden;    /* --hidden: names starting with '.' are walked */
    bool follow;    /* -L: links to directories are followed */
    /* --glob / --exclude, in order: "GLOB" includes, "!GLOB" excludes;
     * borrowed for the walk's life. */
    const char *const *globs;
    size_t n_globs;
};

struct walk_visitor {
    void *ctx;
    /* A file the walk chose (a regular file, or a link to one). `path` is
     * borrowed until the call returns. */
    void (*file)(void *ctx, const char *path);
    /* A problem at `path`: `error` (exit status 2) or only a warning. */
    void (*problem)(void *ctx, const char *path, const char *msg, bool error);
};

struct walk;

/* Returns 0 or -ENOMEM. `o` is copied (its globs are borrowed). */
int walk_create(const struct walk_opts *o, struct walk **out);
void walk_destroy(struct walk *w);

/* Walks the directory `root` (named by the user: never filtered itself),
 * in name order, calling `v` for what it finds. */
void walk_dir(struct walk *w, const char *root, const struct walk_visitor *v);

/* Ends the walk in progress: walk_dir returns without visiting more. From
 * a visitor's callback. */
void walk_stop(struct walk *w);

/* Marks the file (dev, ino) as scanned; returns true when it already was,
 * so a file that two links reach is scanned once. */
bool walk_seen_file(struct walk *w, dev_t dev, ino_t ino);

/* Whether `name` (a path relative to the ignore file's directory, '/'
 * separated) matches the gitignore-style `glob`. Exposed for tests. */
bool walk_glob_match(const char *glob, const char *name);

#endif
