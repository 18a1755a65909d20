/*
 * grammar.h - constrained decoding: grammars over bytes, and the token
 * masks they imply for a vocabulary.
 *
 * A grammar is a set of context-free rules whose terminals are byte sets
 * (one byte each).  It comes from a JSON Schema, a regular expression or a
 * GBNF-style text; all three compile to the same rules.  A matcher runs
 * the rules as a pushdown automaton (a set of stacks, as llama.cpp's GBNF
 * does, with shared stack tails) and answers, before each token, which
 * tokens of the vocabulary may come next (a bitset, one bit per id).
 *
 * Masks come from a byte trie of the vocabulary.  For each stack top the
 * matcher splits the vocabulary once into tokens accepted whatever lies
 * below the top few frames (context-independent, XGrammar's idea), tokens
 * rejected whatever lies below, and the few that depend on it; only the
 * last are checked against the whole state at mask time (matcher.c).
 *
 * Invariants: a grammar is immutable after compilation; a matcher belongs
 * to one thread; a vocabulary may be shared by matchers of many threads
 * (its classification cache has a lock).  Every rule
 * of a compiled grammar derives some finite string, so a live state can
 * always be completed; left recursion is refused at compile time.
 */
#ifndef PETREL_GRAMMAR_H
#define PETREL_GRAMMAR_H

#include <jansson.h>

#include "base/base.h"

typedef struct pt_grammar pt_grammar;
typedef struct pt_gvocab pt_gvocab;
typedef struct pt_gmatcher pt_gmatcher;
struct pt_tokenizer;

/* GBNF text (rules `name ::= ...`, "literals", [classes], (groups),
 * * + ? {m,n}, # comments); the start rule is `root`. */
int pt_grammar_from_gbnf(pt_grammar **out, const char *text, size_t len, pt_err *err);
/* A regular expression matched against the whole output (anchored). */
int pt_grammar_from_regex(pt_grammar **out, const char *re, pt_err *err);
/* JSON Schema (draft 4 to 2020-12 keywords that can be enforced exactly);
 * any keyword that cannot be enforced is an error naming it. */
int pt_grammar_from_schema(pt_grammar **out, const json_t *schema, pt_err *err);
/* The same with at most ws_max whitespace characters between two JSON
 * tokens (pt_grammar_from_schema: 20).  1 keeps a small model from
 * spending its tokens on whitespace. */
int pt_grammar_from_schema_ws(pt_grammar **out, const json_t *schema, int ws_max, pt_err *err);
/* Several values of schema written in markup, as Hermes writes tool calls:
 * one value (its opening markup is the prompt's), then optionally `close`
 * followed by any number of `open` value `close`. */
int pt_grammar_from_schema_calls(pt_grammar **out, const json_t *schema, int ws_max, const char *open,
                                 const char *close, pt_err *err);
int pt_grammar_from_schema_text(pt_grammar **out, const char *text, size_t len, pt_err *err);
void pt_grammar_free(pt_grammar *g);
/* Counts for tests and logs. */
int pt_grammar_n_rules(const pt_grammar *g);

/* The vocabulary as byte strings.  Ids with no bytes (special tokens) are
 * never allowed by a grammar. */
pt_gvocab *pt_gvocab_from_tokenizer(const struct pt_tokenizer *tok);
pt_gvocab *pt_gvocab_from_bytes(int n_vocab, const char *const *bytes, const size_t *lens);
void pt_gvocab_free(pt_gvocab *v);
int pt_gvocab_n_vocab(const pt_gvocab *v);
/* The longest token whose bytes start s[0..len) (the lowest id of equal
 * ones), its length in *n; -1 if none. */
int32_t pt_gvocab_longest_prefix(const pt_gvocab *v, const char *s, size_t len, size_t *n);

/* A matcher owns its state and caches; g and v must outlive it. */
pt_gmatcher *pt_gmatcher_new(const pt_grammar *g, const pt_gvocab *v);
void pt_gmatcher_free(pt_gmatcher *m);
/* Back to the start state (caches are kept). */
void pt_gmatcher_reset(pt_gmatcher *m);
/* Advances by a token; false (and no change) if the grammar rejects it. */
bool pt_gmatcher_accept(pt_gmatcher *m, int32_t id);
/* Advances by raw bytes as one step (rollback counts it as one token). */
bool pt_gmatcher_accept_bytes(pt_gmatcher *m, const char *s, size_t len);
/* Forgets the last n accepted steps (all of them if n is larger). */
void pt_gmatcher_rollback(pt_gmatcher *m, int n);
int pt_gmatcher_n_steps(const pt_gmatcher *m);
/* The output so far is a complete sentence of the grammar. */
bool pt_gmatcher_is_accepting(const pt_gmatcher *m);
/* Nothing but the end may follow (accepting and no byte can extend it). */
bool pt_gmatcher_is_finished(pt_gmatcher *m);
/* Jump-forward: the bytes every continuation of the output starts with,
 * up to the first point where the grammar allows a choice or the end; at
 * most cap of them go to out.  Returns how many (0: the next byte is not
 * forced).  The matcher does not move: accept the bytes (or the tokens
 * that spell them) to take them. */
size_t pt_gmatcher_forced_bytes(pt_gmatcher *m, char *out, size_t cap);
/* Sets bit id of mask (n_vocab bits, (n_vocab+31)/32 words) for each
 * token the grammar allows next; clears the others. */
void pt_gmatcher_mask(pt_gmatcher *m, uint32_t *mask);

#endif
