/*
 * fuzz-layer: grammar
 * fuzz_grammar.c - libFuzzer target for the grammar front ends and matcher.
 *
 * The first byte picks the front end (JSON Schema, regex, GBNF), the rest
 * is its text: schemas and regexes come from requests, so compiling must
 * never crash, hang or blow up, whatever the bytes.  A grammar that
 * compiles is then driven over a small vocabulary: masks and accepts must
 * agree.  Seeds: fuzz/corpus/grammar/.
 */
#include <stdlib.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    pt_grammar *g = NULL;
    pt_err err;
    int rc;
    switch (data[0] % 3) {
    case 0: rc = pt_grammar_from_schema_text(&g, text, size - 1, &err); break;
    case 1: rc = pt_grammar_from_regex(&g, text, &err); break;
    default: rc = pt_grammar_from_gbnf(&g, text, size - 1, &err); break;
    }
    if (rc == 0) {
        static const char *const toks[] = {"{", "}", "\"", "a", "1", " ", ",", ":", "[", "]", "\"a\"", "true", "\xc3\xa9"};
        size_t lens[13];
        for (int i = 0; i < 13; i++) lens[i] = strlen(toks[i]);
        pt_gvocab *v = pt_gvocab_from_bytes(13, toks, lens);
        pt_gmatcher *m = pt_gmatcher_new(g, v);
        uint32_t mask[1];
        for (int step = 0; step < 16; step++) {
            pt_gmatcher_mask(m, mask);
            int pick = -1;
            for (int t = 0; t < 13; t++)
                if ((mask[0] >> t) & 1) pick = t;
            if (pick < 0) break;
            if (!pt_gmatcher_accept(m, pick)) abort(); /* the mask allowed it */
        }
        pt_gmatcher_free(m);
        pt_gvocab_free(v);
        pt_grammar_free(g);
    }
    free(text);
    return 0;
}
