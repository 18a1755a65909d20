/*
 * test_maskbench_sample.c - MaskBench's method on a sample of its files
 * (tests/fixtures/maskbench/, schemas this engine compiles), with the
 * bundled stories260K tokenizer: every valid instance's tokens are in the
 * mask before each of them; every invalid instance is refused at some
 * token or at the end; and at every position of every instance the mask
 * equals a brute-force check of each token of the vocabulary (accept, then
 * roll back).
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "grammar/grammar.h"
#include "io/model_file.h"
#include "tokenizer/tokenizer.h"

static void check_mask(pt_gmatcher *m, const uint32_t *mask, int n_vocab, const char *file) {
    for (int t = 0; t < n_vocab; t++) {
        bool bit = (mask[t >> 5] >> (t & 31)) & 1;
        bool acc = pt_gmatcher_accept(m, t);
        if (acc) pt_gmatcher_rollback(m, 1);
        if (bit != acc) fail_msg("%s: token %d: mask %d, accept %d", file, t, bit, acc);
    }
}

static void test_sample(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_model_file *mf;
    pt_tokenizer *tok;
    if (pt_model_file_open(&mf, PETREL_SOURCE_DIR "/models/stories260K.gguf", &err) ||
        pt_tokenizer_load(&tok, mf, &err))
        fail_msg("%s", err.msg);
    pt_gvocab *v = pt_gvocab_from_tokenizer(tok);
    int n_vocab = pt_gvocab_n_vocab(v);
    uint32_t *mask = calloc((size_t)(n_vocab + 31) / 32, 4);
    DIR *d = opendir(PETREL_SOURCE_DIR "/tests/fixtures/maskbench");
    assert_non_null(d);
    int files = 0, valid = 0, invalid = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strstr(e->d_name, ".json")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/fixtures/maskbench/%s", PETREL_SOURCE_DIR, e->d_name);
        json_error_t je;
        json_t *doc = json_load_file(path, 0, &je);
        assert_non_null(doc);
        pt_grammar *g;
        if (pt_grammar_from_schema(&g, json_object_get(doc, "schema"), &err))
            fail_msg("%s: %s", e->d_name, err.msg);
        pt_gmatcher *m = pt_gmatcher_new(g, v);
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(doc, "tests"), i, t) {
            bool is_valid = json_is_true(json_object_get(t, "valid"));
            char *text = json_dumps(json_object_get(t, "data"), JSON_ENCODE_ANY | JSON_COMPACT);
            int32_t *ids;
            size_t n;
            assert_int_equal(pt_tokenize(tok, text, strlen(text), false, false, &ids, &n, &err), 0);
            pt_gmatcher_reset(m);
            bool ok = true;
            for (size_t k = 0; k < n && ok; k++) {
                pt_gmatcher_mask(m, mask);
                if (k < 40) check_mask(m, mask, n_vocab, e->d_name); /* brute force is O(vocab) */
                bool in = (mask[ids[k] >> 5] >> (ids[k] & 31)) & 1;
                ok = pt_gmatcher_accept(m, ids[k]);
                assert_int_equal(in, ok);
            }
            ok = ok && pt_gmatcher_is_accepting(m);
            if (ok != is_valid) fail_msg("%s test %zu (%s): judged %s: %s", e->d_name, i,
                                         is_valid ? "valid" : "invalid", ok ? "valid" : "invalid", text);
            valid += is_valid;
            invalid += !is_valid;
            free(ids);
            free(text);
        }
        pt_gmatcher_free(m);
        pt_grammar_free(g);
        json_decref(doc);
        files++;
    }
    closedir(d);
    assert_true(files >= 15 && valid >= 15 && invalid >= 15);
    free(mask);
    pt_gvocab_free(v);
    pt_tokenizer_free(tok);
    pt_model_file_close(mf);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sample)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
