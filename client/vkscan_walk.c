/*
 * Directory walks of `vkscan scan`; see vkscan_walk.h for the ignore-file
 * subset this reads.
 */
#include "vkscan_walk.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- globs ------------------------------------------------------------- */

/* `[...]` at p (after the '['): whether c is in the class; *end is after ']'.
 * Returns -1 when the class is not closed (then '[' is a literal). */
static int class_match(const char *p, char c, const char **end)
{
    bool neg = *p == '!' || *p == '^', in = false;
    if (neg)
        p++;
    const char *q = p;
    do {
        char lo = *q == '\\' && q[1] != '\0' ? *++q : *q;
        if (lo == '\0')
            return -1;
        char hi = lo;
        if (q[1] == '-' && q[2] != ']' && q[2] != '\0') {
            q += 2;
            hi = *q == '\\' && q[1] != '\0' ? *++q : *q;
        }
        in |= c >= lo && c <= hi;
        q++;
    } while (*q != ']');
    *end = q + 1;
    return c != '/' && in != neg;
}

bool walk_glob_match(const char *p, const char *s)
{
    for (;;) {
        switch (*p) {
        case '\0':
            return *s == '\0';
        case '*':
            if (p[1] == '*' && p[2] == '/') {
                /* "**" + "/": no directory, or any run of them */
                if (walk_glob_match(p + 3, s))
                    return true;
                for (; *s != '\0'; s++) {
                    if (*s == '/' && walk_glob_match(p + 3, s + 1))
                        return true;
                }
                return false;
            }
            if (p[1] == '*') {
                for (;; s++) {
                    if (walk_glob_match(p + 2, s))
                        return true;
                    if (*s == '\0')
                        return false;
                }
            }
            for (;; s++) {
                if (walk_glob_match(p + 1, s))
                    return true;
                if (*s == '\0' || *s == '/')
                    return false;
            }
        case '?':
            if (*s == '\0' || *s == '/')
                return false;
            p++, s++;
            break;
        case '[': {
            const char *end;
            int m = *s != '\0' ? class_match(p + 1, *s, &end) : 0;
            if (m == 0)
                return false;
            if (m > 0) {
                p = end, s++;
                break;
            }
        } /* an unclosed '[' is a literal */
            /* fall through */
        default:
            if (*p == '\\' && p[1] != '\0')
                p++;
            if (*p != *s)
                return false;
            p++, s++;
        }
    }
}

/* ---- patterns -------------------------------------------------------------- */

struct pattern {
    char *glob;
    bool neg, dir_only, anchored;
};

/* The patterns of one ignore file (or of --glob) and where they apply. */
struct pattern_set {
    struct pattern *v;
    size_t n, cap;
    size_t base; /* its directory's length in the relative path, with the '/' */
};

static void set_finish(struct pattern_set *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        free(ps->v[i].glob);
    free(ps->v);
    memset(ps, 0, sizeof(*ps));
}

/* Adds one gitignore line (len bytes, no newline). */
static int set_add(struct pattern_set *ps, const char *line, size_t len)
{
    if (len > 0 && line[len - 1] == '\r')
        len--;
    while (len > 0 && line[len - 1] == ' ' && !(len > 1 && line[len - 2] == '\\'))
        len--;
    if (len == 0 || line[0] == '#')
        return 0;
    struct pattern p = {0};
    if (line[0] == '!') {
        p.neg = true;
        line++, len--;
    } else if (line[0] == '\\' && len > 1 && (line[1] == '#' || line[1] == '!')) {
        line++, len--;
    }
    if (len > 0 && line[len - 1] == '/') {
        p.dir_only = true;
        len--;
    }
    const char *slash = memchr(line, '/', len);
    if (slash != NULL) {
        p.anchored = true;
        if (line[0] == '/')
            line++, len--;
    }
    if (len == 0)
        return 0;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 8;
        struct pattern *v = realloc(ps->v, cap * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        ps->v = v;
        ps->cap = cap;
    }
    p.glob = strndup(line, len);
    if (p.glob == NULL)
        return -ENOMEM;
    ps->v[ps->n++] = p;
    return 0;
}

/* Reads the ignore file `path` into ps; a file that is not there adds nothing. */
static void set_read(struct pattern_set *ps, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        if (n > 0 && line[n - 1] == '\n')
            n--;
        if (set_add(ps, line, (size_t)n) != 0)
            break;
    }
    free(line);
    fclose(f);
}

/* The verdict of `ps` on the entry at `rel` (relative to the walk root):
 * 1 ignored, -1 re-included (negation), 0 no pattern matched. */
static int set_verdict(const struct pattern_set *ps, const char *rel, bool is_dir)
{
    const char *here = rel + ps->base, *name = strrchr(rel, '/');
    name = name != NULL ? name + 1 : rel;
    int v = 0;
    for (size_t i = 0; i < ps->n; i++) {
        const struct pattern *p = &ps->v[i];
        if (p->dir_only && !is_dir)
            continue;
        if (walk_glob_match(p->glob, p->anchored ? here : name))
            v = p->neg ? -1 : 1;
    }
    return v;
}

/* ---- (dev, ino) sets ------------------------------------------------------- */

struct id_set {
    struct file_id {
        dev_t dev;
        ino_t ino;
    } * v;
    size_t n, cap; /* cap: a power of two; 0 (dev, ino) marks a free slot */
};

/* Inserts; returns true when it was there already (or memory ran out, so
 * nothing is scanned twice). */
static bool id_insert(struct id_set *s, dev_t dev, ino_t ino)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        struct file_id *v = calloc(cap, sizeof(*v));
        if (v == NULL)
            return true;
        for (size_t i = 0; i < s->cap; i++) {
            if (s->v[i].dev == 0 && s->v[i].ino == 0)
                continue;
            size_t h = ((size_t)s->v[i].ino * 0x9e3779b97f4a7c15ull ^ (size_t)s->v[i].dev);
            while (v[h & (cap - 1)].ino != 0 || v[h & (cap - 1)].dev != 0)
                h++;
            v[h & (cap - 1)] = s->v[i];
        }
        free(s->v);
        s->v = v;
        s->cap = cap;
    }
    size_t h = ((size_t)ino * 0x9e3779b97f4a7c15ull ^ (size_t)dev);
    for (;; h++) {
        struct file_id *e = &s->v[h & (s->cap - 1)];
        if (e->dev == dev && e->ino == ino)
            return true;
        if (e->dev == 0 && e->ino == 0) {
            *e = (struct file_id){dev, ino};
            s->n++;
            return false;
        }
    }
}

/* ---- the walk ---------------------------------------------------------------- */

struct walk {
    struct walk_opts o;
    struct pattern_set globs; /* --glob, base 0 */
    bool has_includes;
    struct pattern_set *stack; /* ignore files of the directories entered */
    size_t depth, stack_cap;
    struct id_set files, dirs;
    const struct walk_visitor *v;
    size_t root_len; /* of the root's path, with its '/' */
    bool stopped;
};

int walk_create(const struct walk_opts *o, struct walk **out)
{
    struct walk *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return -ENOMEM;
    w->o = *o;
    for (size_t i = 0; i < o->n_globs; i++) {
        const char *g = o->globs[i];
        /* --glob lines read as gitignore lines with the sense inverted:
         * "GLOB" includes, "!GLOB" excludes. */
        bool exclude = g[0] == '!';
        if (!exclude)
            w->has_includes = true;
        char *line = NULL;
        if (asprintf(&line, "%s%s", exclude ? "" : "!", exclude ? g + 1 : g) < 0 ||
            set_add(&w->globs, line, strlen(line)) != 0) {
            free(line);
            walk_destroy(w);
            return -ENOMEM;
        }
        free(line);
    }
    *out = w;
    return 0;
}

void walk_destroy(struct walk *w)
{
    if (w == NULL)
        return;
    set_finish(&w->globs);
    for (size_t i = 0; i < w->depth; i++)
        set_finish(&w->stack[i]);
    free(w->stack);
    free(w->files.v);
    free(w->dirs.v);
    free(w);
}

void walk_stop(struct walk *w)
{
    w->stopped = true;
}

bool walk_seen_file(struct walk *w, dev_t dev, ino_t ino)
{
    return id_insert(&w->files, dev, ino);
}

/* Whether the walk leaves out the entry at `rel` (relative to the root). */
static bool skipped(const struct walk *w, const char *rel, const char *name, bool is_dir)
{
    if (name[0] == '.' && !w->o.hidden)
        return true;
    if (strcmp(name, ".git") == 0 && is_dir && !w->o.no_ignore)
        return true;
    int g = set_verdict(&w->globs, rel, is_dir);
    if (g > 0) /* excluded by "!GLOB" (stored as a plain pattern) */
        return true;
    if (g == 0 && w->has_includes && !is_dir)
        return true;
    int ign = 0;
    for (size_t i = 0; i < w->depth; i++) {
        int v = set_verdict(&w->stack[i], rel, is_dir);
        ign = v != 0 ? v : ign;
    }
    return ign > 0;
}

/* Reads the ignore files of `dir` (its relative path has `base` bytes with
 * the trailing '/') onto the stack. */
static void push_ignores(struct walk *w, const char *dir, size_t base)
{
    if (w->depth == w->stack_cap) {
        size_t cap = w->stack_cap ? w->stack_cap * 2 : 16;
        struct pattern_set *s = realloc(w->stack, cap * sizeof(*s));
        if (s == NULL)
            abort(); /* a few bytes a directory level: no sensible way on */
        w->stack = s;
        w->stack_cap = cap;
    }
    struct pattern_set *ps = &w->stack[w->depth++];
    memset(ps, 0, sizeof(*ps));
    ps->base = base;
    if (w->o.no_ignore)
        return;
    static const char *const files[] = {".gitignore", ".ignore"};
    for (size_t i = 0; i < 2; i++) {
        char *path = NULL;
        if (asprintf(&path, "%s/%s", dir, files[i]) >= 0)
            set_read(ps, path);
        free(path);
    }
}

static int skip_dots(const struct dirent *d)
{
    return strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0;
}

static void walk_entries(struct walk *w, const char *dir);

/* One entry of a directory: `path` as printed, `name` its last part. */
static void walk_entry(struct walk *w, const char *path, const char *name)
{
    const struct walk_visitor *v = w->v;
    const char *rel = path + w->root_len;
    struct stat st;
    if (lstat(path, &st) != 0) {
        v->problem(v->ctx, path, strerror(errno), true);
        return;
    }
    bool link = S_ISLNK(st.st_mode);
    if (link && stat(path, &st) != 0) {
        if (!skipped(w, rel, name, false))
            v->problem(v->ctx, path, "dangling symbolic link (skipped)", false);
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        if ((link && !w->o.follow) || skipped(w, rel, name, true))
            return;
        if (id_insert(&w->dirs, st.st_dev, st.st_ino))
            return; /* reached before (a link loop, or two links) */
        walk_entries(w, path);
    } else if (S_ISREG(st.st_mode) && !skipped(w, rel, name, false)) {
        v->file(v->ctx, path);
    }
}

static void walk_entries(struct walk *w, const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, skip_dots, alphasort);
    if (n < 0) {
        w->v->problem(w->v->ctx, dir, strerror(errno), true);
        return;
    }
    size_t dlen = strlen(dir);
    bool slash = dlen > 0 && dir[dlen - 1] == '/';
    push_ignores(w, dir, dlen + !slash > w->root_len ? dlen + !slash - w->root_len : 0);
    for (int i = 0; i < n; i++) {
        char *child = NULL;
        if (w->stopped)
            ; /* only free what is left */
        else if (asprintf(&child, "%s%s%s", dir, slash ? "" : "/", names[i]->d_name) < 0)
            w->v->problem(w->v->ctx, dir, "out of memory", true);
        else
            walk_entry(w, child, names[i]->d_name);
        free(child);
        free(names[i]);
    }
    free(names);
    set_finish(&w->stack[--w->depth]);
}

void walk_dir(struct walk *w, const char *root, const struct walk_visitor *v)
{
    struct stat st;
    w->v = v;
    w->stopped = false;
    size_t len = strlen(root);
    w->root_len = len + (len > 0 && root[len - 1] != '/');
    if (stat(root, &st) == 0 && id_insert(&w->dirs, st.st_dev, st.st_ino))
        return;
    walk_entries(w, root);
}
