/*
 * llama_ref_logits.c - llama.cpp's logits for given token ids, as a
 * reference for a GGUF file.
 *
 * For model families whose reference we take from llama.cpp (the anchor
 * build in ../shared/anchors: a peer nobody here wrote), this feeds each
 * prompt's token ids - no tokenizer involved - in one batch, records the
 * logits at every position, then decodes greedily one token at a time
 * through llama.cpp's KV cache and records the logits each greedy token
 * was chosen from.  The JSON it
 * prints has the shape of tests/fixtures/hf/<case>/reference.json's
 * "prompts", so test_hf_reference-style tests read both.
 *
 * The KV cache is f32 and flash attention off, so with f32 weights the
 * only rounding is llama.cpp's f32 arithmetic.  Built and run by
 * scripts/llama-ref/make.sh; not part of Petrel's build.
 *
 *   llama-ref-logits MODEL.gguf N_GREEDY IDS [IDS...]   (IDS: 1,2,3)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

#define REF_TOOL "llama-ref-logits"
#include "ref_print.h"

static void run_prompt(struct llama_context *ctx, int vocab, const llama_token *ids, int n, int n_greedy) {
    llama_memory_clear(llama_get_memory(ctx), true);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i], b.pos[i] = i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) die("prompt decode failed");
    int *am = malloc(sizeof(int) * (size_t)(n + n_greedy));
    double min_margin = 1e30;
    printf("{\"tokens\":[");
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("],\"logits\":[");
    for (int i = 0; i < n; i++) {
        const float *l = llama_get_logits_ith(ctx, i);
        if (i) putchar(',');
        print_row(l, vocab);
        am[i] = argmax(l, vocab);
        if (margin(l, vocab) < min_margin) min_margin = margin(l, vocab);
    }
    printf("],\"argmax\":[");
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", am[i]);
    printf("],\"min_margin\":%.7g,\"greedy_logits\":[", min_margin);
    llama_batch_free(b);

    /* greedy, as reference.json has it: greedy_logits[s] are the logits
     * greedy[s] is the argmax of - the prompt's last row for s = 0, then
     * the row after feeding greedy[s - 1] alone, through the cache */
    const float *l = llama_get_logits_ith(ctx, n - 1);
    double gmin = 1e30;
    for (int s = 0; s < n_greedy; s++) {
        if (s) {
            struct llama_batch one = llama_batch_init(1, 0, 1);
            one.token[0] = am[n + s - 1], one.pos[0] = n + s - 1, one.n_seq_id[0] = 1;
            one.seq_id[0][0] = 0, one.logits[0] = 1, one.n_tokens = 1;
            if (llama_decode(ctx, one)) die("decode failed");
            llama_batch_free(one);
            l = llama_get_logits_ith(ctx, 0);
            putchar(',');
        }
        print_row(l, vocab);
        am[n + s] = argmax(l, vocab);
        if (margin(l, vocab) < gmin) gmin = margin(l, vocab);
    }
    printf("],\"greedy\":[");
    for (int s = 0; s < n_greedy; s++) printf(s ? ",%d" : "%d", am[n + s]);
    printf("],\"greedy_min_margin\":%.7g}", gmin);
    free(am);
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: llama-ref-logits MODEL.gguf N_GREEDY IDS [IDS...]");
    int n_greedy = atoi(argv[2]);
    /* the anchor build loads its CPU backend (one library per CPU variant)
     * from its own folder, which make.sh names */
    const char *dir = getenv("LLAMA_CPP_DIR");
    if (dir) ggml_backend_load_all_from_path(dir);
    else ggml_backend_load_all();
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("cannot load the model");
    int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    enum { CAP = 4096 };
    static llama_token ids[CAP];
    int longest = 0;
    for (int a = 3; a < argc; a++) {
        int n = parse_ids(argv[a], ids, CAP);
        if (n > longest) longest = n;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(longest + n_greedy + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(longest + 16);
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot make a context");

    printf("{\"reference\":\"llama.cpp\",\"vocab\":%d,\"n_greedy\":%d,\"prompts\":[", vocab, n_greedy);
    for (int a = 3; a < argc; a++) {
        int n = parse_ids(argv[a], ids, CAP);
        if (a > 3) putchar(',');
        run_prompt(ctx, vocab, ids, n, n_greedy);
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
