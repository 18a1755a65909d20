/*
 * structured.h - grammar-constrained output for a request: the compiled
 * grammar of a response_format / --json-schema / --grammar / --regex, and
 * the logits processor that masks each step with it.
 */
#ifndef PETREL_STRUCTURED_H
#define PETREL_STRUCTURED_H

#include "grammar/grammar.h"
#include "sample/logits_proc.h"
#include "tokenizer/tokenizer.h"

typedef struct pt_structured pt_structured;

/* From OpenAI's response_format.  NULL or {"type":"text"}: *out = NULL,
 * returns 0.  An invalid or unsupported one: -1 with a message naming the
 * feature (the caller answers 400); *param names the offending field. */
int pt_structured_from_response_format(pt_structured **out, const json_t *rf,
                                       const pt_tokenizer *tok, const char **param, pt_err *err);
/* From a compiled grammar (taken over). */
pt_structured *pt_structured_new(pt_grammar *g, const pt_tokenizer *tok);
void pt_structured_free(pt_structured *s);

/* pt_sched_job.add_procs: appends the grammar processor to the sampler
 * (arg is the pt_structured, which must outlive the request). */
void pt_structured_add_procs(void *arg, pt_sampler *s);

/* The processor alone (the matcher it creates is its own). */
pt_logits_proc pt_grammar_proc_new(const pt_structured *s);

#endif
