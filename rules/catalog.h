/*
 * The packed catalog: the compiled form of a rule set that every engine
 * (CPU reference scanner, GPU megakernel) consumes, that the daemon caches on
 * disk and keeps resident on the device. docs/catalog.md documents the layout
 * field by field; the constants below are the single source of truth for it.
 *
 * A catalog is one flat array of little-endian u32 words: a header, a group
 * table, per-group class maps, transition tables, accept indexes, a flat
 * accept list, a rule table and a string area. All offsets are absolute word
 * offsets from the start of the catalog, so a device can bind the whole
 * catalog as one storage buffer and index it directly.
 */
#ifndef VKS_RULES_CATALOG_H
#define VKS_RULES_CATALOG_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define CATALOG_MAGIC   0x43534b56u /* "VKSC" read as a little-endian u32 */
#define CATALOG_VERSION 4u
#define CATALOG_FP_LEN  32u /* BLAKE2b-256 */

/* Header words. */
enum {
    CAT_H_MAGIC = 0,
    CAT_H_VERSION,
    CAT_H_COMPILER, /* compiler version that produced it */
    CAT_H_WORDS,    /* total size in u32 words, header included */
    CAT_H_NGROUPS,
    CAT_H_NRULES,
    CAT_H_GROUPS,  /* word offset of the group table */
    CAT_H_RULES,   /* word offset of the rule table */
    CAT_H_STRINGS, /* word offset of the string area */
    CAT_H_STRBYTES,
    CAT_H_NACCEPTS,  /* total accept entries, all groups */
    CAT_H_MAXSTATES, /* largest n_states of any group */
    CAT_H_CHECK,     /* first 4 bytes of the fingerprint (integrity check) */
    CAT_H_NNFAS,     /* bit-NFA groups (version 2) */
    CAT_H_NFAS,      /* word offset of the bit-NFA group table */
    CAT_H_MAXBITS,   /* largest n_bits of any bit-NFA group, 0 when none */
    CAT_HEADER_WORDS
};

/* Group table entry words (CAT_GROUP_WORDS per group). */
enum {
    CAT_G_NSTATES = 0,
    CAT_G_NCLASSES,
    CAT_G_FIRST_ACCEPT, /* states >= this have accept entries */
    CAT_G_START_BOS,    /* start state at the beginning of a buffer */
    CAT_G_START_WORD,   /* start mid-buffer after a word byte [A-Za-z0-9_] */
    CAT_G_START_NL,     /* start mid-buffer after '\n' */
    CAT_G_START_OTHER,  /* start mid-buffer after any other byte */
    CAT_G_MAXLEN,       /* longest match in bytes, or CATALOG_UNBOUNDED */
    CAT_G_CLASSMAP,     /* word offset: 256 words, byte -> class */
    CAT_G_TRANS,        /* word offset: n_states * n_classes words */
    CAT_G_ACCIDX,       /* word offset: n_states - first_accept + 1 words */
    CAT_G_ACCEPTS,      /* word offset of this group's accept entries */
    CAT_G_NRULES,       /* rules compiled into this group */
    CAT_G_FLAGS,        /* CAT_GF_* */
    CAT_G_RESERVED0,
    CAT_G_RESERVED1,
    CAT_GROUP_WORDS
};

#define CATALOG_UNBOUNDED 0xffffffffu

/*
 * Bit-NFA group table entry words (CAT_NFA_WORDS per group; bitnfa.h and
 * docs/engine.md give the model). Rules of bit-NFA group j have CAT_R_GROUP
 * n_groups + j: engine groups are numbered DFA groups first.
 */
enum {
    CAT_N_NBITS = 0, /* positions, 1 .. CAT_NFA_MAX_BITS */
    CAT_N_NWORDS,    /* (n_bits + 31) / 32: u32 words of one state vector */
    CAT_N_NCLASSES,
    CAT_N_MAXLEN,   /* longest match in bytes, or CATALOG_UNBOUNDED */
    CAT_N_NRULES,   /* rules compiled into this group */
    CAT_N_FLAGS,    /* CAT_GF_* */
    CAT_N_CLASSMAP, /* word offset: 256 words, byte -> class */
    CAT_N_REACH,    /* word offset: n_classes * n_words: positions a class may enter */
    CAT_N_SHIFT,    /* word offset: n_words: positions entered from the one before */
    CAT_N_NEXC,
    CAT_N_EXC, /* word offset: n_exc * CAT_X_WORDS exception entries */
    CAT_N_NACC,
    CAT_N_ACC, /* word offset: n_acc * CAT_X_WORDS accept entries, sorted by rule */
    CAT_N_NRANGES,
    CAT_N_RANGES,   /* word offset: n_ranges * 2 words, inclusive [lo, hi] positions */
    CAT_N_LOOKBACK, /* CAT_GF_CONFIRM: most bytes from a match's start to its factor's end */
    /* Gated groups (version 4): word offset of 9 words, or 0. Words 0-7: a
     * 256-bit set (bit c & 31 of word c >> 5) of every byte value from a
     * match's start to SKIP bytes before its factor's end; word 8: SKIP, at
     * most the group's shortest factor. A match holding a factor that ends
     * at e starts inside the run of these bytes that ends at e - SKIP. */
    CAT_N_SPAN,
    CAT_NFA_WORDS
};

/* Exception entry: when cond has the (prev, next) bit of the offset and
 * the state has a position in one of the n_src source ranges (or n_src is
 * 0: always), the n_tgt target ranges after them join the next state. */
enum { CAT_X_COND = 0, CAT_X_NSRC, CAT_X_NTGT, CAT_X_FIRST, CAT_X_WORDS };
/* Accept entry: rule (catalog index) reported when cond has the offset's
 * (prev, next) bit and the state has a position in one of its ranges. */
enum { CAT_A_RULE = 0, CAT_A_COND, CAT_A_NSRC, CAT_A_FIRST };

/* The most positions of one bit-NFA group (2048 words of state). The
 * compiler packs several rules up to 4096 (BITNFA_GROUP_BITS); a larger
 * group holds one rule. */
#define CAT_NFA_MAX_BITS 65536u
/* Conditions: bit p * 5 + k for previous kind p (P_BOS, P_WORD, P_NL,
 * P_OTHER as in nfa.h) and next kind k (CAT_K_*). */
#define CAT_PK(p, k) (1u << ((p)*5u + (k)))
#define CAT_COND_ALL 0xfffffu

/* Group flags. */
#define CAT_GF_ASSERTS (1u << 0) /* some rule uses ^ $ \b \B: start context matters */
/* DFA group of literal factors (version 3, docs/engine.md): its accept
 * entries name a bit-NFA group (< NNFAS) in the rule field and have mask 0,
 * so a walker that does not know the flag never reports them. A factor end
 * e tells that group's walker to look at end offsets [e, e + its MAXLEN]. */
#define CAT_GF_FACTOR (1u << 1)
/* Bit-NFA group that only needs walking around its factors' ends: MAXLEN
 * is bounded and some CAT_GF_FACTOR group names it. Walking it in full, as
 * before version 3, gives the same matches. */
#define CAT_GF_GATED (1u << 2)
/* Gated bit-NFA group with an unbounded MAXLEN (docs/engine.md, "Forward
 * confirmation"): a factor ending at e gives starts in [e - LOOKBACK, e)
 * (from 0 when LOOKBACK is CATALOG_UNBOUNDED), walked forward until the
 * state dies. Set only together with CAT_GF_GATED. Walking the group in
 * full gives the same matches. */
#define CAT_GF_CONFIRM (1u << 3)
/* DFA group of plain strings without their DFA (compiler version 6,
 * docs/catalog.md, "Literal groups"): NSTATES 1, NCLASSES 1, no accepting
 * state, so a walker that does not know the flag finds nothing in it. Its
 * rules are plain strings of 4 to 1024 bytes (caseless letters allowed, no
 * assertion) read from their sources: refscan, the CPU engine and streams
 * scan them with rules/cpulit.c, the GPU with its literal kernel. */
#define CAT_GF_LITERAL (1u << 4)
/* A literal group's rules are 4 to this many bytes (the GPU literal
 * kernel's GPU_LIT_MIN_KEY and GPU_LIT_MAX_LEN). */
#define CAT_LITERAL_MIN_LEN 4u
#define CAT_LITERAL_MAX_LEN 1024u

/* Rule table entry words (CAT_RULE_WORDS per rule). */
enum {
    CAT_R_ID = 0, /* byte offset into the string area */
    CAT_R_IDLEN,
    CAT_R_SRC, /* canonical pattern source, byte offset */
    CAT_R_SRCLEN,
    CAT_R_KIND,  /* enum rule_kind */
    CAT_R_FLAGS, /* RULE_F_* */
    CAT_R_GROUP,
    CAT_R_MAXLEN, /* this rule's longest match, or CATALOG_UNBOUNDED */
    CAT_R_FP,     /* 8 words: BLAKE2b-256 of the rule */
    CAT_RULE_WORDS = CAT_R_FP + 8
};

/*
 * Lookahead kinds. A DFA state's accept entry says for which kind of *next*
 * byte the match that ends here is real (this is how \b, \B and $ are
 * decided). The scanner checks accepts before consuming byte i, classifying
 * buf[i]; at the end of the buffer it checks with CAT_K_EOD.
 */
enum {
    CAT_K_WORD = 0,   /* [A-Za-z0-9_] */
    CAT_K_NL = 1,     /* '\n' that is not the last byte */
    CAT_K_OTHER = 2,  /* any other byte */
    CAT_K_EOD = 3,    /* end of buffer */
    CAT_K_NL_LAST = 4 /* '\n' that is the buffer's last byte */
};
#define CAT_ACCEPT_RULE(e) ((e) >> 5)
#define CAT_ACCEPT_MASK(e) ((e)&31u)
#define CAT_ACCEPT_ALWAYS  31u

/* Rule flags, stored in CAT_R_FLAGS and taken by the compiler. */
#define RULE_F_CASELESS    (1u << 0) /* i */
#define RULE_F_DOTALL      (1u << 1) /* s */
#define RULE_F_MULTILINE   (1u << 2) /* m */
#define RULE_F_SINGLEMATCH (1u << 3) /* H: report only the first match per buffer */
#define RULE_F_SOMLEFT     (1u << 4) /* L: leftmost start of each match (som.h) */
#define RULE_F_ALL         0x1fu

/* Classifies a byte for start-state choice and lookahead (CAT_K_WORD,
 * CAT_K_NL or CAT_K_OTHER). */
static inline uint32_t catalog_byte_kind(uint8_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')
        return CAT_K_WORD;
    return c == '\n' ? CAT_K_NL : CAT_K_OTHER;
}

/* A read-only view of one group, pointing into the catalog's words. */
struct catalog_group {
    uint32_t n_states;
    uint32_t n_classes;
    uint32_t first_accept;
    uint32_t start[4]; /* indexed by CAT_G_START_* - CAT_G_START_BOS */
    uint32_t maxlen;
    uint32_t n_rules;
    uint32_t flags;
    const uint32_t *classmap;     /* 256 entries */
    const uint32_t *trans;        /* n_states * n_classes */
    const uint32_t *accept_index; /* n_states - first_accept + 1 */
    const uint32_t *accepts;      /* entries, indexed by accept_index */
};
/* The start state of a walk of `g` that begins at offset `begin` of `buf`:
 * the one for the start of data, or for the kind of the byte before. */
static inline uint32_t catalog_group_start(const struct catalog_group *g, const uint8_t *buf,
                                           size_t begin)
{
    if (begin == 0)
        return g->start[0];
    switch (catalog_byte_kind(buf[begin - 1])) {
    case CAT_K_WORD:
        return g->start[1];
    case CAT_K_NL:
        return g->start[2];
    default:
        return g->start[3];
    }
}

/*
 * A bit-NFA group of at most 128 positions (4 state words, which most
 * gated groups are: BITNFA_GATED_BITS) as 128-bit masks, built when the
 * catalog is opened (catalog.c): a step is a shift, one test per exception
 * and a reach mask, not range walks (rules/nfastep.h). Bit p is position
 * p. Exceptions and accept entries in the catalog's order.
 */
#define CATALOG_SMALL_WORDS 4u
__extension__ typedef unsigned __int128 catalog_mask;
struct catalog_nfa_exc64 {
    catalog_mask src; /* 0: a start edge (no sources) */
    catalog_mask tgt;
    uint32_t cond;
};
struct catalog_nfa_acc64 {
    catalog_mask src;
    uint32_t cond, rule;
};
struct catalog_nfa_small {
    catalog_mask shift;
    catalog_mask acc_any;      /* the union of the accept entries' sources */
    const catalog_mask *reach; /* per class */
    uint32_t n_exc, n_acc;
    const struct catalog_nfa_exc64 *exc;
    const struct catalog_nfa_acc64 *acc;
};

/* A read-only view of one bit-NFA group. */
struct catalog_nfa {
    uint32_t n_bits, n_words, n_classes, maxlen, n_rules, flags;
    uint32_t n_exc, n_acc, n_ranges;
    uint32_t lookback;                     /* CAT_GF_CONFIRM groups */
    const uint32_t *span;                  /* CAT_N_SPAN's set (8 words, then SKIP), or NULL */
    const struct catalog_nfa_small *small; /* n_words <= CATALOG_SMALL_WORDS: masks, else NULL */
    /* Exceptions exc[x_narrow..n_exc) have sources spanning at most x_span
     * + 1 state words and are sorted by their first source word: a step
     * tests only those that can meet its live words (catalog_nfa finds
     * the longest such suffix; the compiler sorts exceptions so). */
    uint32_t x_narrow, x_span;
    const uint32_t *classmap; /* 256 entries */
    const uint32_t *reach;    /* n_classes * n_words */
    const uint32_t *shift;    /* n_words */
    const uint32_t *exc;      /* n_exc * CAT_X_WORDS */
    const uint32_t *acc;      /* n_acc * CAT_X_WORDS */
    const uint32_t *ranges;   /* n_ranges * 2 */
};

/* A read-only view of one rule. Strings are not NUL-terminated. */
struct catalog_rule {
    const char *id;
    uint32_t id_len;
    const char *src;
    uint32_t src_len;
    uint32_t kind;
    uint32_t flags;
    uint32_t group;
    uint32_t maxlen;
    const uint8_t *fingerprint; /* CATALOG_FP_LEN bytes */
};

/* Exceptions whose sources span more than this many state words after
 * their first are "wide": the compiler puts them before the narrow ones,
 * which it sorts by first source word (docs/engine.md). */
#define CAT_X_NARROW_SPAN 4u

/* First and last state word of exception x's source ranges (n_src > 0). */
static inline uint32_t catalog_exc_lo(const uint32_t *x, const uint32_t *ranges)
{
    return ranges[2 * (size_t)x[CAT_X_FIRST]] >> 5;
}

static inline uint32_t catalog_exc_hi(const uint32_t *x, const uint32_t *ranges)
{
    return ranges[2 * ((size_t)x[CAT_X_FIRST] + x[CAT_X_NSRC] - 1) + 1] >> 5;
}

struct catalog;

/*
 * Validates `len` bytes as a packed catalog and returns a new catalog that
 * owns a copy. Every offset, count, state index, class index and rule index
 * is checked, so a corrupt or truncated catalog is rejected (-EINVAL, -ENOMEM)
 * with a message naming the first bad field; it is never trusted.
 */
int catalog_from_bytes(const void *bytes, size_t len, struct catalog **out, struct vks_error *err);

/* catalog_from_bytes without the copy: takes ownership of `words`
 * (malloc'd, `len` bytes, as read from a file), also on failure. */
int catalog_from_words(uint32_t *words, size_t len, struct catalog **out, struct vks_error *err);

/* Takes ownership of freshly packed `words` (malloc'd, `n` words), also on
 * failure: fills in the check word, validates and wraps them. Used by the
 * compiler. */
int catalog_adopt(uint32_t *words, size_t n, struct catalog **out, struct vks_error *err);

/* Frees the catalog; NULL is allowed. */
void catalog_destroy(struct catalog *cat);

/* The packed bytes (borrowed, valid until catalog_destroy) and their size. */
const uint32_t *catalog_words(const struct catalog *cat, size_t *n_words);

/* BLAKE2b-256 of the packed bytes with the check word taken as zero
 * (CATALOG_FP_LEN bytes, borrowed). */
const uint8_t *catalog_fingerprint(const struct catalog *cat);

/* Writes the fingerprint as 64 lowercase hex digits plus NUL into `hex`. */
void catalog_fingerprint_hex(const uint8_t fp[CATALOG_FP_LEN], char hex[2 * CATALOG_FP_LEN + 1]);

uint32_t catalog_group_count(const struct catalog *cat);
uint32_t catalog_rule_count(const struct catalog *cat);

/* Fills `out` with a view of group `i` (< catalog_group_count). */
void catalog_group(const struct catalog *cat, uint32_t i, struct catalog_group *out);

/* Fills `out` with a view of rule `i` (< catalog_rule_count). */
void catalog_rule(const struct catalog *cat, uint32_t i, struct catalog_rule *out);

/* The index each rule reports under (docs/catalog.md): rules that share an
 * id report as one, under the smallest catalog index among them (the first
 * in input order), as their accept entries say. Fills report[0 .. rule
 * count). Returns 0 or -ENOMEM. */
int catalog_report_indexes(const struct catalog *cat, uint32_t *report);

/* Number of bit-NFA groups, and a view of group `i` (< catalog_nfa_count). */
uint32_t catalog_nfa_count(const struct catalog *cat);
void catalog_nfa(const struct catalog *cat, uint32_t i, struct catalog_nfa *out);

/* Sum of n_states over all groups. */
uint64_t catalog_total_states(const struct catalog *cat);

/* The OR of every rule's RULE_F_* flags (RULE_F_SOMLEFT: some rule wants
 * starts). */
uint32_t catalog_rule_flags_any(const struct catalog *cat);

/* What one byte of this catalog costs the CPU engine, in DFA-group walks:
 * its DFA groups, each bit-NFA group as CATALOG_NFA_WEIGHT of them, and
 * all of it CATALOG_CONFIRM_WEIGHT times over when a group is forward
 * confirmed (CAT_GF_CONFIRM: the CPU engine walks such catalogs whole,
 * 1-7x slower a byte than one DFA group on text, docs/PERFORMANCE.md
 * session 29). At least 1. vkscand's `cpu-max-work` is in bytes times
 * this. */
uint32_t catalog_cpu_weight(const struct catalog *cat);
#define CATALOG_NFA_WEIGHT     4u
#define CATALOG_CONFIRM_WEIGHT 4u

/* The catalog's start-of-match finders (som.h), made on the first call and
 * freed by catalog_destroy; NULL when out of memory. Thread-safe. */
struct som_set;
struct som_set *catalog_som(const struct catalog *cat);

#endif
