/*
 * grammar_int.h - the rule representation shared by the grammar front ends
 * (schema, regex, GBNF), the builder they use, and the matcher.
 *
 * A compiled grammar is one array of elements, `code`.  Each alternative of
 * a rule is a run of elements ended by GE_END; a rule lists the offsets of
 * its alternatives.  An element is (arg << 2) | kind:
 *     GE_END    end of an alternative
 *     GE_BYTES  one byte from byte set `arg` (256-bit sets in `sets`)
 *     GE_RULE   rule `arg`
 * Every position in `code` is a point in some alternative; the matcher's
 * stack frames are such positions.
 */
#ifndef PETREL_GRAMMAR_INT_H
#define PETREL_GRAMMAR_INT_H

#include "grammar/grammar.h"

enum { GE_END = 0, GE_BYTES = 1, GE_RULE = 2 };
#define GE_KIND(e) ((e) & 3)
#define GE_ARG(e) ((e) >> 2)
#define GE_MAKE(kind, arg) (((int32_t)(arg) << 2) | (kind))

typedef struct { uint32_t w[8]; } pt_byteset;

static inline bool bs_has(const pt_byteset *s, unsigned b) { return (s->w[b >> 5] >> (b & 31)) & 1; }
static inline void bs_add(pt_byteset *s, unsigned b) { s->w[b >> 5] |= 1u << (b & 31); }
static inline void bs_range(pt_byteset *s, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) bs_add(s, b);
}

struct pt_grammar {
    pt_byteset *sets;
    int n_sets;
    int32_t *code;
    int n_code;
    int32_t *alt_start; /* [n_alts] offsets into code */
    int32_t *rule_alt;  /* [n_rules + 1] offsets into alt_start */
    int n_rules;
    int root;
    /* Counted repeats (gb_repeat_counted), NULL when there are none.  For a
     * code position p where a repeat resumes after one of its characters:
     * cnt_hi[p] >= 0 characters at most are left (cnt_lo[p] at least), and
     * cnt_loop[p] is the same point in the unbounded repeat x*, whose
     * classification the counted one is derived from (matcher.c). */
    int32_t *cnt_lo, *cnt_hi, *cnt_loop;
};

/* --- builder ----------------------------------------------------------- */

/* A sequence of elements being built (one alternative). */
typedef struct gseq {
    int32_t *e;
    int n, cap;
} gseq;

typedef struct gbuild {
    gseq **alts;   /* per rule: its alternatives */
    int *n_alts, *cap_alts;
    int n_rules, cap_rules;
    pt_byteset *sets;
    int n_sets, cap_sets;
    int byte_set[256]; /* set index of each single byte, -1 if none yet */
    int depth;         /* recursion guard for front ends */
    struct gcount { int rule, x, star; long lo, hi; } *counts; /* gb_repeat_counted */
    int n_counts, cap_counts;
} gbuild;

void gb_init(gbuild *b);
void gb_free(gbuild *b);
int gb_rule(gbuild *b);                 /* a new rule with no alternatives */
void gb_alt(gbuild *b, int rule, gseq *s); /* moves s (resets it) */
int gb_set(gbuild *b, const pt_byteset *s);

void seq_push(gseq *s, int32_t e);
void seq_cat(gseq *s, const gseq *t);
void seq_free(gseq *s);
static inline void seq_ref(gseq *s, int rule) { seq_push(s, GE_MAKE(GE_RULE, rule)); }
void seq_byte(gbuild *b, gseq *s, unsigned byte);
void seq_lit(gbuild *b, gseq *s, const char *lit, size_t len);
void seq_bytes(gbuild *b, gseq *s, const pt_byteset *set);

/* Rules built from others. */
int gb_rule_of(gbuild *b, gseq *s);        /* R ::= s (moves s) */
int gb_lit_rule(gbuild *b, const char *lit); /* R ::= "lit" */
int gb_star(gbuild *b, int x);             /* R ::= x R | empty */
int gb_opt(gbuild *b, int x);              /* R ::= x | empty */
/* x repeated between lo and hi times (hi < 0: unbounded); -1 with err set
 * if the expansion would be too large. */
int gb_repeat(gbuild *b, int x, long lo, long hi, pt_err *err);
/* The same for x one character of a JSON string's contents (each
 * alternative a flat byte sequence encoding one character, none starting
 * with '"'), the repeat followed by the closing quote: marked so that the
 * matcher derives the masks of every count from the classification of
 * star ::= x star | empty (which must be gb_star(b, x)) instead of walking
 * the vocabulary once per count. */
int gb_repeat_counted(gbuild *b, int x, long lo, long hi, int star, pt_err *err);

/* Checks (undefined rules, left recursion, nothing derivable), prunes
 * alternatives that derive nothing, and flattens into a grammar. */
int gb_finish(gbuild *b, int root, pt_grammar **out, pt_err *err);

/* Regular expression -> rule; json_string: match the regex against the
 * decoded contents of a JSON string, i.e. emit characters JSON-escaped.
 * anchored: the regex must match the whole text (else ^/$ decide). */
int pt_regex_rule(gbuild *b, const char *re, bool json_string, bool force_anchored, int *rule,
                  pt_err *err);
/* The same with the text's length in characters within min_len..max_len
 * (max_len < 0: unbounded): an error unless the bounds are implied by the
 * regex or it is one repeated character class, whose count takes them. */
int pt_regex_rule_len(gbuild *b, const char *re, bool json_string, bool force_anchored, long min_len,
                      long max_len, int *rule, pt_err *err);
/* One UTF-8 encoded character in [lo, hi] appended as alternatives of rule. */
void gb_utf8_range(gbuild *b, int rule, uint32_t lo, uint32_t hi);

#define GB_MAX_REPEAT 4096

#endif
