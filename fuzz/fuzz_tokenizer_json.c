/*
 * fuzz-layer: tokenizer
 * fuzz_tokenizer_json.c - libFuzzer target: arbitrary bytes as a
 * tokenizer.json.  Loading must either fail with an error or give a
 * tokenizer that encodes a fixed text (special tokens parsed and not) and
 * decodes the ids again, one-shot and streaming, without a crash, leak or
 * undefined behaviour.  Seeds: fuzz/corpus/tokenizer_json/.
 */
#include <stdlib.h>

#include "tokenizer/tokenizer.h"

static const char k_text[] =
    "Hello world! It's 2024: <|im_start|>user\n<s> caf\xc3\xa9 e\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd "
    "\xf0\x9f\x98\x80\xe2\x80\x8d\xf0\x9f\x91\x8d  \t\n\n 12345 <0x41> \xe2\x96\x81x \xff";

static void round_trip(const pt_tokenizer *t, bool parse_special) {
    int32_t *ids;
    size_t n;
    pt_err err;
    if (pt_tokenize(t, k_text, sizeof k_text - 1, true, parse_special, &ids, &n, &err)) return;
    free(pt_detokenize(t, ids, n, parse_special));
    pt_detok d;
    pt_detok_init(&d, t);
    d.at_start = true;
    for (size_t i = 0; i < n; i++) {
        char buf[4096];
        size_t len;
        if (pt_token_bytes(t, ids[i], &len) && len + 64 <= sizeof buf)
            pt_detok_push(&d, ids[i], buf, sizeof buf);
    }
    char tail[8];
    pt_detok_flush(&d, tail, sizeof tail);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_log_level = PT_LOG_ERROR;
    pt_tokenizer *t;
    pt_err err;
    if (pt_tokenizer_load_json_mem(&t, (const char *)data, size, NULL, &err)) return 0;
    round_trip(t, false);
    round_trip(t, true);
    pt_tokenizer_n_vocab(t);
    pt_tokenizer_is_eog(t, pt_tokenizer_eos(t));
    pt_token_lookup(t, "<s>");
    pt_tokenizer_free(t);
    return 0;
}
