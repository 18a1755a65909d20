/*
 * fuzz-layer: tokenizer
 * fuzz_jinja.c - libFuzzer target for the chat-template interpreter.
 *
 * The input is a template; after a NUL byte, optionally, the JSON context
 * (else a fixed conversation with tools).  Compiling and rendering must
 * never crash, hang or exceed the limits, whatever the bytes: templates
 * come from model files we do not control.  Seeds: fuzz/corpus/jinja/
 * (the chat templates of real models, and small feature templates).
 */
#include <stdlib.h>

#include "tokenizer/chat_template.h"

static const char DEFAULT_CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"arguments\": {\"x\": 1.5}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"more\"}, {\"type\": \"image\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t src_len = nul ? (size_t)(nul - data) : size;
    json_error_t je;
    json_t *ctx = NULL;
    if (nul) ctx = json_loadb((const char *)nul + 1, size - src_len - 1, 0, &je);
    if (!ctx) ctx = json_loads(DEFAULT_CONTEXT, 0, &je);
    pt_err err;
    pt_jinja *t;
    if (pt_jinja_compile(&t, src, src_len, &err) == 0) {
        /* tight limits keep each run fast; they are what is being tested */
        pt_jinja_opts opts = {.max_output = 1 << 20, .max_memory = 64 << 20, .max_steps = 200000, .now = 1};
        char *out = NULL;
        size_t n;
        if (pt_jinja_render(t, ctx, &opts, &out, &n, &err) == 0 && n > opts.max_output) abort();
        free(out);
        pt_jinja_free(t);
    }
    json_decref(ctx);
    return 0;
}
