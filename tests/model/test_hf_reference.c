/*
 * test_hf_reference.c - every architecture we claim, against Hugging Face
 * transformers.
 *
 * tests/fixtures/hf/<case>/ holds a small random-weight model saved by
 * transformers (scripts/make_hf_references.py, docs/hf-references.md) and
 * reference.json with its float64 logits at every prompt position and 32
 * greedy tokens.  We load the directory, run each prompt in one batch and
 * compare every position's logits (1e-4 absolute: we compute in f32 on the
 * stored weights) and argmax, then generate greedily one token per step and
 * compare tokens and per-step logits — so prefill, decode and the paged KV
 * cache are all checked.
 *
 * tests/fixtures/gguf/<case>/ holds a GGUF file and the same kind of
 * reference.json taken from llama.cpp (scripts/llama-ref): for families and
 * layouts transformers cannot give us on the machines we have, llama.cpp is
 * the implementation nobody here wrote; the fixture states its tolerance.
 * qwen35 and qwen35moe (scripts/llama-ref/qwen35.py) are Qwen3.5's hybrid
 * of Gated DeltaNet and gated attention layers, dense and with experts;
 * their 80-token prompt runs the delta rule's chunkwise prefill over more
 * than one chunk, and the greedy steps its token-by-token form.
 *
 * The tolerance is 1e-4, or four times what transformers' own float32 run
 * strays from its float64 reference when that is more (reference.json's
 * crosscheck): a recurrent model (qwen3_next) amplifies rounding through
 * its state, and transformers itself strays 1e-4 in prefill and 1.3e-3
 * over a cached decode there; we cannot be held closer than that.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/model.h"
#include "quant/quant.h"

#define HF_DIR PETREL_SOURCE_DIR "/tests/fixtures/hf/"
#define GGUF_DIR PETREL_SOURCE_DIR "/tests/fixtures/gguf/"
#define TOL 1e-4

static int32_t *ids_of(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static double row_diff(const float *got, json_t *want, int vocab) {
    assert_int_equal(json_array_size(want), vocab);
    double d = 0;
    for (int v = 0; v < vocab; v++) {
        double x = fabs(got[v] - json_number_value(json_array_get(want, (size_t)v)));
        if (!(x <= d)) d = x; /* NaN propagates as a failure */
    }
    return d;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The reference row's top logit minus its runner-up. */
static double ref_margin(json_t *want, int vocab) {
    double a = -1e30, b = -1e30;
    for (int v = 0; v < vocab; v++) {
        double x = json_number_value(json_array_get(want, (size_t)v));
        if (x > a) b = a, a = x;
        else if (x > b) b = x;
    }
    return a - b;
}

/* Petrel's argmax of got must be the reference's (want_arg) wherever the
 * logits' tolerance decides it: a reference top-2 margin above 2 * tol.
 * Closer than that, either token is within tolerance (llama.cpp's fp16
 * GELU table alone moves Gemma 4's logits by 1e-2): false, counted. */
static bool same_argmax(const float *got, json_t *want, int vocab, int want_arg, double tol,
                        const char *what) {
    int a = argmax(got, vocab);
    if (a == want_arg) return true;
    double margin = ref_margin(want, vocab);
    if (margin > 2 * tol)
        fail_msg("%s: argmax %d, the reference gives %d (its margin %.3g)", what, a, want_arg,
                 margin);
    return false;
}

typedef struct tols {
    double prompt, greedy;
} tols;

/* TOL, or four times the largest of the crosscheck's float32 deviations
 * named in keys. */
static double tol_of(json_t *r, const char *const *keys, int n) {
    double t = TOL;
    json_t *cc = json_object_get(r, "crosscheck");
    for (int i = 0; i < n; i++) {
        json_t *v = json_object_get(cc, keys[i]);
        if (json_is_number(v) && 4 * json_number_value(v) > t) t = 4 * json_number_value(v);
    }
    return t;
}

/* A fixture whose reference is llama.cpp (tests/fixtures/gguf, made by
 * scripts/llama-ref) states its tolerance: f32 against f32, the two
 * engines differ only in the order they sum. */
static tols tols_of(json_t *r) {
    json_t *t = json_object_get(r, "tolerance");
    if (t)
        return (tols){json_number_value(json_object_get(t, "prompt")),
                      json_number_value(json_object_get(t, "greedy"))};
    static const char *const prompt[] = {"float32_prompt_logits_max_abs_diff"};
    static const char *const greedy[] = {"float32_greedy_logits_max_abs_diff",
                                         "float32_kv_cache_greedy_logits_max_abs_diff"};
    return (tols){tol_of(r, prompt, 1), tol_of(r, greedy, 2)};
}

/* Runs one prompt and its greedy continuation; returns the largest prompt
 * and decode differences in *worst (for the log). */
static void run_prompt(pt_model *m, pt_kv_cache *kv, json_t *p, const char *name, tols tol,
                       tols *worst) {
    int n, vocab = m->cfg.vocab_size;
    int32_t *tok = ids_of(json_object_get(p, "tokens"), &n);
    int n_greedy;
    int32_t *greedy = ids_of(json_object_get(p, "greedy"), &n_greedy);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    bool *want = malloc((size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)n * vocab);
    for (int i = 0; i < n; i++) pos[i] = i, want[i] = true;
    pt_kv_seq s = {0};
    pt_kv_seq *seqs[1] = {&s};
    pt_batch b = {n, tok, pos, seq, want, 1, seqs};
    pt_err err;
    if (pt_model_run(m, kv, &b, logits, &err)) fail_msg("%s: %s", name, err.msg);
    json_t *rows = json_object_get(p, "logits");
    int ties = 0; /* argmaxes closer than the tolerance can decide */
    char what[96];
    for (int i = 0; i < n; i++) {
        json_t *want_row = json_array_get(rows, (size_t)i);
        double d = row_diff(logits + (size_t)i * vocab, want_row, vocab);
        if (d > tol.prompt)
            fail_msg("%s, %d-token prompt, position %d: max |logit diff| %.3g", name, n, i, d);
        if (worst && d > worst->prompt) worst->prompt = d;
        int want_arg = (int)json_integer_value(json_array_get(json_object_get(p, "argmax"), (size_t)i));
        snprintf(what, sizeof what, "%s, %d-token prompt, position %d", name, n, i);
        ties += !same_argmax(logits + (size_t)i * vocab, want_row, vocab, want_arg, tol.prompt, what);
    }
    /* greedy decode, one row per step, reusing the cache; each step feeds
     * the reference's token, so its logits stay comparable even past a
     * near-tie */
    json_t *glog = json_object_get(p, "greedy_logits");
    const float *last = logits + (size_t)(n - 1) * vocab;
    for (int step = 0; step < n_greedy; step++) {
        snprintf(what, sizeof what, "%s, %d-token prompt, greedy token %d", name, n, step);
        ties += !same_argmax(last, json_array_get(glog, (size_t)step), vocab, greedy[step],
                             step ? tol.greedy : tol.prompt, what);
        if (step == n_greedy - 1) break;
        int32_t p1 = n + step, s0 = 0, next = greedy[step];
        bool w = true;
        pt_batch d = {1, &next, &p1, &s0, &w, 1, seqs};
        if (pt_model_run(m, kv, &d, logits, &err)) fail_msg("%s: %s", name, err.msg);
        double diff = row_diff(logits, json_array_get(glog, (size_t)step + 1), vocab);
        if (diff > tol.greedy)
            fail_msg("%s: decode step %d: max |logit diff| %.3g", name, step + 1, diff);
        if (worst && diff > worst->greedy) worst->greedy = diff;
        last = logits;
    }
    if (ties)
        print_message("%s, %d-token prompt: %d argmaxes within tolerance of a tie, either taken\n",
                      name, n, ties);
    pt_kv_seq_release(kv, &s);
    free(tok), free(greedy), free(pos), free(seq), free(want), free(logits);
}

/* path: the model (a directory, or a GGUF file); ref: its reference.json;
 * force: tolerances that replace the reference's (NULL: its own) */
static void check_model_tol(const char *name, const char *path, const char *ref,
                            const char *kernels, int threads, const tols *force) {
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(threads, kernels, &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, path, &o, &err)) fail_msg("%s: %s", name, err.msg);
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    json_error_t je;
    json_t *r = json_load_file(ref, 0, &je);
    if (!r) fail_msg("%s: %s", ref, je.text);
    json_t *p;
    size_t i;
    tols worst = {0, 0};
    json_array_foreach(json_object_get(r, "prompts"), i, p)
        run_prompt(m, &kv, p, name, force ? *force : tols_of(r), &worst);
    print_message("%s (%s, %s): max |logit diff| prompt %.3g, decode %.3g\n", name,
                  strstr(ref, "/gguf/") ? "llama.cpp" : "transformers", kernels, worst.prompt,
                  worst.greedy);
    assert_int_equal(pt_kv_free_pages(&kv), kv.cfg.n_pages);
    json_decref(r);
    pt_kv_cache_free(&kv);
    pt_model_free(m);
    be->ops->destroy(be);
}

static void check_model(const char *name, const char *path, const char *ref, const char *kernels,
                        int threads) {
    check_model_tol(name, path, ref, kernels, threads, NULL);
}

static void check_case(const char *name, const char *kernels, int threads) {
    char dir[512], ref[600];
    snprintf(dir, sizeof dir, HF_DIR "%s", name);
    snprintf(ref, sizeof ref, "%s/reference.json", dir);
    check_model(name, dir, ref, kernels, threads);
}

/* tests/fixtures/gguf/<case>/: model.gguf and llama.cpp's reference.json */
static void check_gguf_case(const char *name, const char *kernels, int threads) {
    char path[512], ref[600];
    snprintf(path, sizeof path, GGUF_DIR "%s/model.gguf", name);
    snprintf(ref, sizeof ref, GGUF_DIR "%s/reference.json", name);
    check_model(name, path, ref, kernels, threads);
}

/* tests/fixtures/gguf/<case>/model.gguf, converted from tests/fixtures/hf/<case>
 * by scripts/llama-ref/hf_to_gguf.py (f32 from bf16/f16: the same model),
 * against transformers' reference for the directory: the GGUF conventions
 * (names, norms stored 1 + w, the query scale folded in, stacked experts)
 * must give the model transformers ran, at the directory's tolerance. */
static void check_gguf_hf_case(const char *name, const char *kernels, int threads) {
    char path[512], ref[600];
    snprintf(path, sizeof path, GGUF_DIR "%s/model.gguf", name);
    snprintf(ref, sizeof ref, HF_DIR "%s/reference.json", name);
    check_model(name, path, ref, kernels, threads);
}

#define CASE(n)                                                                                    \
    static void test_##n(void **state) {                                                           \
        (void)state;                                                                               \
        check_case(#n, "auto", 2);                                                                 \
        check_case(#n, "portable", 1);                                                             \
    }
#define GGUF_CASE(n)                                                                               \
    static void test_gguf_##n(void **state) {                                                      \
        (void)state;                                                                               \
        check_gguf_case(#n, "auto", 2);                                                            \
        check_gguf_case(#n, "portable", 1);                                                        \
    }
/* A converted Hugging Face fixture: llama.cpp's reference and transformers'. */
#define GGUF_HF_CASE(n)                                                                            \
    GGUF_CASE(n)                                                                                   \
    static void test_gguf_hf_##n(void **state) {                                                   \
        (void)state;                                                                               \
        check_gguf_hf_case(#n, "auto", 2);                                                         \
        check_gguf_hf_case(#n, "portable", 1);                                                     \
    }
CASE(llama2)
CASE(llama3)
CASE(mistral)
CASE(qwen2)
CASE(qwen3)
CASE(llama_sharded)
CASE(qwen3_moe)
CASE(gemma2)
CASE(gemma3_text)
CASE(gpt_oss)
CASE(qwen3_next)
/* session 7: transformers references for the families that had only
 * llama.cpp ones (docs/hf-references.md) */
CASE(gemma4_text)
CASE(gemma4_text_moe)
CASE(qwen3_5)
CASE(qwen3_5_moe)
CASE(deepseek_v3)
GGUF_CASE(stories260k)
GGUF_CASE(deepseek2)
GGUF_CASE(deepseek2_yarn)
GGUF_CASE(deepseek2_legacy)
/* MiniCPM3 (scripts/llama-ref/minicpm3.py): latent attention from the fused
 * attn_kv_b (llama.cpp runs it as plain multi-head attention, Petrel
 * absorbed), MiniCPM's embedding, residual and output scalings and
 * LongRoPE's short factors. */
GGUF_CASE(minicpm3)
GGUF_HF_CASE(gemma2)
GGUF_HF_CASE(gemma3_text)
GGUF_HF_CASE(gpt_oss)
/* gpt-oss with ggml's MXFP4 experts (and no YaRN, which llama.cpp rounds
 * differently): against llama.cpp on the exact values the blocks decode to,
 * within 5e-3, so with the quantized matmuls on int16 activations
 * (PETREL_CPU_INT8=0, read when the backend is made).  The default int8
 * path for MXFP4 is bounded per matmul in tests/quant/test_kernels.c and
 * on a whole model in test_gptoss_mxfp4.c. */
static void test_gguf_gpt_oss_mxfp4(void **state) {
    (void)state;
    setenv("PETREL_CPU_INT8", "0", 1);
    check_gguf_case("gpt_oss_mxfp4", "auto", 2);
    unsetenv("PETREL_CPU_INT8");
    check_gguf_case("gpt_oss_mxfp4", "portable", 1);
}
GGUF_CASE(qwen35)
GGUF_CASE(qwen35moe)

/* tests/fixtures/hf/qwen3_5_text is the qwen35 GGUF's model in
 * transformers' layout (scripts/llama-ref/qwen35.py converts it: value
 * heads regrouped, A_log, w of 1 + w), so llama.cpp's reference for the
 * GGUF holds for it: the Hugging Face path's names, head order, l2norm and
 * the conversions at load, against the same logits. */
static void test_qwen3_5_text(void **state) {
    (void)state;
    check_model("qwen3_5_text", HF_DIR "qwen3_5_text", GGUF_DIR "qwen35/reference.json", "auto", 2);
    check_model("qwen3_5_text", HF_DIR "qwen3_5_text", GGUF_DIR "qwen35/reference.json", "portable", 1);
}
/* Gemma 4 (scripts/llama-ref/gemma4.py): dense with per-layer inputs, and MoE */
GGUF_CASE(gemma4)
GGUF_CASE(gemma4_moe)

/* ---- dummy_gguf.py's files ------------------------------------------------------ *
 * scripts/llama-ref/dummy_gguf.py writes random-weight GGUF files of real
 * models' shapes for the speed comparisons with llama.cpp; here it writes
 * tests/fixtures/gguf/dummy_<family>/config.json's tiny model (seed 0) as
 * Q8_0 blocks, and as the f32 values those blocks decode to (--decoded).
 * The f32 file must give llama.cpp's logits on it (reference.json,
 * recorded by scripts/llama-ref/dummy_fixtures.sh, at its tolerance): the
 * names, shapes, metadata and block layout the tool writes are the model
 * llama.cpp runs.  The Q8_0 file must load and stay within 0.5 of them at
 * every position (measured: at most 0.10, the int8 activations of the
 * quantized matmul; the logits have standard deviation 1.0, so a tensor
 * read wrongly misses by whole units), with the reference's argmax where
 * its margin exceeds 1.0.  Needs /usr/bin/python3 with numpy and the
 * anchors' gguf-py (scripts/llama-ref/make.sh gguf-py): skipped without. */

static bool dummy_tools(void) {
    static int ok = -1;
    if (ok < 0)
        ok = system("cd " PETREL_SOURCE_DIR " && scripts/llama-ref/make.sh gguf-py >/dev/null "
                    "2>&1 && /usr/bin/python3 -c 'import sys; sys.path.insert(0, \"build-llama/"
                    "llama.cpp/gguf-py\"); import numpy, gguf' 2>/dev/null") == 0;
    return ok;
}

static void dummy_write(const char *family, const char *flags, const char *out) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 " PETREL_SOURCE_DIR "/scripts/llama-ref/dummy_gguf.py "
             GGUF_DIR "dummy_%s/config.json --type Q8_0 %s %s >/dev/null",
             family, flags, out);
    if (system(cmd) != 0) fail_msg("%s: failed", cmd);
}

static void check_dummy_case(const char *family) {
    if (!dummy_tools()) {
        print_message("dummy_%s: skipped (no /usr/bin/python3 with numpy, or no anchors' "
                      "gguf-py)\n",
                      family);
        skip();
    }
    char name[64], f32[512], q8[512], ref[512];
    snprintf(name, sizeof name, "dummy_%s", family);
    snprintf(f32, sizeof f32, PETREL_BINARY_DIR "/dummy_%s-%d-f32.gguf", family, (int)getpid());
    snprintf(q8, sizeof q8, PETREL_BINARY_DIR "/dummy_%s-%d-q8_0.gguf", family, (int)getpid());
    snprintf(ref, sizeof ref, GGUF_DIR "dummy_%s/reference.json", family);
    dummy_write(family, "--decoded", f32);
    dummy_write(family, "", q8);
    check_model(name, f32, ref, "auto", 2);
    check_model(name, f32, ref, "portable", 1);
    tols quant = {0.5, 0.5};
    strcat(name, " q8_0");
    check_model_tol(name, q8, ref, "auto", 2, &quant);
    remove(f32);
    remove(q8);
}

/* Every preset's file (src/model/registry.c's shapes, read from there by
 * the tool) holds the matrices `petrel bench -m dummy:PRESET` makes: with
 * every matrix in one format, the tool's byte count is Petrel's, to the
 * byte (a missing, extra or misshapen tensor would show). */
static void test_dummy_preset_bytes(void **state) {
    (void)state;
    if (!dummy_tools()) skip();
    char names[512];
    pt_config_preset_names(names, sizeof names);
    int n = 0;
    for (char *name = strtok(names, ", "); name; name = strtok(NULL, ", ")) {
        json_error_t je;
        json_t *j = json_loads(pt_config_preset(name), 0, &je);
        assert_non_null(j);
        pt_model_config cfg;
        pt_err err = {{0}};
        memset(&cfg, 0, sizeof cfg);
        if (pt_config_from_json(j, &cfg, &err)) fail_msg("%s: %s", name, err.msg);
        json_decref(j);
        static const char *const types[] = {"q4_0", "q8_0"};
        for (int t = 0; t < 2; t++) {
            size_t want;
            if (pt_model_dummy_bytes(&cfg, types[t], &want, &err)) fail_msg("%s", err.msg);
            char cmd[512];
            snprintf(cmd, sizeof cmd,
                     "/usr/bin/python3 " PETREL_SOURCE_DIR "/scripts/llama-ref/dummy_gguf.py %s "
                     "--bytes --type %s", name, types[t]);
            FILE *f = popen(cmd, "r");
            assert_non_null(f);
            unsigned long long got = 0;
            char line[256] = "";
            while (fgets(line + strlen(line), (int)(sizeof line - strlen(line)), f)) {}
            int ok = sscanf(line, "%llu", &got);
            assert_int_equal(pclose(f), 0);
            assert_int_equal(ok, 1);
            if (got != want)
                fail_msg("%s in %s: dummy_gguf.py counts %llu matrix bytes, Petrel's dummy %zu",
                         name, types[t], got, want);
        }
        n++;
    }
    print_message("%d presets: dummy_gguf.py's matrix bytes are Petrel's dummy bytes\n", n);
}

#define DUMMY_CASE(n)                                                                              \
    static void test_dummy_##n(void **state) {                                                     \
        (void)state;                                                                               \
        check_dummy_case(#n);                                                                      \
    }
DUMMY_CASE(llama)
DUMMY_CASE(qwen3_moe)
DUMMY_CASE(gemma2)
DUMMY_CASE(gemma3_text)
DUMMY_CASE(gpt_oss)
DUMMY_CASE(deepseek_v2)
DUMMY_CASE(qwen3_5_text)
DUMMY_CASE(minicpm3)

/* ---- a GGUF qwen3moe file written from the Hugging Face fixture ---------------- *
 * No GGUF Qwen3-MoE fixture exists here, so the test writes one the way
 * llama.cpp's converter lays it out: GGUF names, experts stacked into 3-D
 * ffn_*_exps tensors (ne = cols, rows, experts), q/k unpermuted (NEOX
 * rope), f32 or with Q8_0 experts; the same reference logits must come out. */

typedef struct gtensor {
    char name[64];
    int ndim;
    uint64_t ne[3];
    uint32_t type; /* ggml: 0 f32, 8 q8_0 */
    void *data;
    size_t nbytes;
} gtensor;

static void put(FILE *f, const void *p, size_t n) {
    assert_int_equal(fwrite(p, 1, n, f), n);
}
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }
static void put_str(FILE *f, const char *s) {
    put_u64(f, strlen(s));
    put(f, s, strlen(s));
}
static void kv_u32(FILE *f, const char *k, uint32_t v) {
    put_str(f, k), put_u32(f, 4), put_u32(f, v);
}
static void kv_f32(FILE *f, const char *k, float v) {
    put_str(f, k), put_u32(f, 6), put(f, &v, 4);
}

/* HF tensor name -> f32 rows (all of them), in a new buffer. */
static float *hf_f32(pt_model_file *mf, const char *name, int64_t *n) {
    const pt_tensor_info *t = pt_model_file_tensor(mf, name);
    if (!t) fail_msg("fixture lacks %s", name);
    *n = 1;
    for (int d = 0; d < t->ndim; d++) *n *= t->shape[d];
    float *x = malloc(sizeof(float) * (size_t)*n);
    for (int64_t i = 0; i < *n; i++) x[i] = pt_quant_load(t->data, i, t->dtype);
    return x;
}

static gtensor *add(gtensor *ts, int *n, const char *name, int ndim, uint64_t c, uint64_t r,
                    uint64_t e, float *f32, bool q8) {
    gtensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim, t->ne[0] = c, t->ne[1] = r, t->ne[2] = e;
    size_t count = (size_t)(c * (ndim > 1 ? r : 1) * (ndim > 2 ? e : 1));
    t->type = q8 ? 8 : 0;
    if (!q8) {
        t->data = f32, t->nbytes = count * 4;
        return t;
    }
    t->nbytes = count / 32 * 34;
    t->data = malloc(t->nbytes);
    pt_gguf_quantize(PT_Q8_0, f32, t->data, (int64_t)count);
    free(f32);
    return t;
}

static void write_qwen3moe_gguf(const char *path, bool q8_experts) {
    pt_model_file *mf;
    pt_err err;
    if (pt_model_file_open(&mf, HF_DIR "qwen3_moe", &err)) fail_msg("%s", err.msg);
    const int H = 64, L = 3, E = 6, F = 32, V = 320, Q = 4 * 64, KV = 2 * 64;
    gtensor ts[64];
    int n = 0;
    int64_t cnt;
    add(ts, &n, "token_embd.weight", 2, H, V, 0, hf_f32(mf, "model.embed_tokens.weight", &cnt), false);
    add(ts, &n, "output_norm.weight", 1, H, 0, 0, hf_f32(mf, "model.norm.weight", &cnt), false);
    add(ts, &n, "output.weight", 2, H, V, 0, hf_f32(mf, "lm_head.weight", &cnt), false);
    for (int l = 0; l < L; l++) {
        static const struct {
            const char *g, *h;
            int rows, cols; /* 0 cols: a vector */
        } plain[] = {
            {"attn_norm", "input_layernorm", 64, 0}, {"attn_q", "self_attn.q_proj", 256, 64},
            {"attn_k", "self_attn.k_proj", 128, 64}, {"attn_v", "self_attn.v_proj", 128, 64},
            {"attn_output", "self_attn.o_proj", 64, 256}, {"attn_q_norm", "self_attn.q_norm", 64, 0},
            {"attn_k_norm", "self_attn.k_norm", 64, 0}, {"ffn_norm", "post_attention_layernorm", 64, 0},
            {"ffn_gate_inp", "mlp.gate", 6, 64},
        };
        char g[96], h[128];
        for (size_t i = 0; i < PT_ARRAY_LEN(plain); i++) {
            snprintf(g, sizeof g, "blk.%d.%s.weight", l, plain[i].g);
            snprintf(h, sizeof h, "model.layers.%d.%s.weight", l, plain[i].h);
            float *x = hf_f32(mf, h, &cnt);
            if (plain[i].cols) add(ts, &n, g, 2, plain[i].cols, plain[i].rows, 0, x, false);
            else add(ts, &n, g, 1, plain[i].rows, 0, 0, x, false);
        }
        static const char *const proj[3][2] = {{"ffn_gate_exps", "gate_proj"}, {"ffn_up_exps", "up_proj"},
                                               {"ffn_down_exps", "down_proj"}};
        for (int p = 0; p < 3; p++) {
            int rows = p == 2 ? H : F, cols = p == 2 ? F : H;
            float *stack = malloc(sizeof(float) * (size_t)(E * rows * cols));
            for (int e = 0; e < E; e++) {
                snprintf(h, sizeof h, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[p][1]);
                float *x = hf_f32(mf, h, &cnt);
                memcpy(stack + (size_t)e * rows * cols, x, sizeof(float) * (size_t)(rows * cols));
                free(x);
            }
            snprintf(g, sizeof g, "blk.%d.%s.weight", l, proj[p][0]);
            add(ts, &n, g, 3, cols, rows, E, stack, q8_experts);
        }
    }
    (void)Q, (void)KV;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    put(f, "GGUF", 4);
    put_u32(f, 3);
    put_u64(f, (uint64_t)n);
    put_u64(f, 14);
    put_str(f, "general.architecture"), put_u32(f, 8), put_str(f, "qwen3moe");
    kv_u32(f, "qwen3moe.embedding_length", H);
    kv_u32(f, "qwen3moe.block_count", L);
    kv_u32(f, "qwen3moe.attention.head_count", 4);
    kv_u32(f, "qwen3moe.attention.head_count_kv", 2);
    kv_u32(f, "qwen3moe.attention.key_length", 64);
    kv_u32(f, "qwen3moe.attention.value_length", 64);
    kv_u32(f, "qwen3moe.feed_forward_length", 96);
    kv_u32(f, "qwen3moe.context_length", 4096);
    kv_f32(f, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_f32(f, "qwen3moe.rope.freq_base", 1e6f);
    kv_u32(f, "qwen3moe.expert_count", E);
    kv_u32(f, "qwen3moe.expert_used_count", 2);
    kv_u32(f, "qwen3moe.expert_feed_forward_length", F);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        put_str(f, ts[i].name);
        put_u32(f, (uint32_t)ts[i].ndim);
        for (int d = 0; d < ts[i].ndim; d++) put_u64(f, ts[i].ne[d]);
        put_u32(f, ts[i].type);
        put_u64(f, off);
        off += (ts[i].nbytes + 31) / 32 * 32;
    }
    static const uint8_t zero[32];
    long pos = ftell(f);
    put(f, zero, (size_t)((32 - pos % 32) % 32));
    for (int i = 0; i < n; i++) {
        put(f, ts[i].data, ts[i].nbytes);
        put(f, zero, (32 - ts[i].nbytes % 32) % 32);
        free(ts[i].data);
    }
    fclose(f);
    pt_model_file_close(mf);
}

/* The GGUF in f32 matches the reference like the safetensors; with Q8_0
 * experts (the quantized expert matmul, int8 activations) every logit stays
 * within 0.5 (docs/hf-references.md: ~0.03 of the largest logit, 17.4) and
 * the argmax where the reference margin exceeds twice that.  Experts read
 * at a wrong offset miss by whole units. */
static void test_qwen3moe_gguf(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "/tmp/petrel_qwen3moe_%d.gguf", (int)getpid());
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(2, "auto", &err);
    assert_non_null(be);
    json_error_t je;
    json_t *r = json_load_file(HF_DIR "qwen3_moe/reference.json", 0, &je);
    assert_non_null(r);
    double worst = 0;
    for (int q8 = 0; q8 < 2; q8++) {
        write_qwen3moe_gguf(path, q8);
        pt_model_opts o = {.backend = be};
        pt_model *m;
        if (pt_model_load(&m, path, &o, &err)) fail_msg("gguf: %s", err.msg);
        assert_int_equal(m->layers[1].w_down.n_experts, 6);
        assert_int_equal(m->layers[1].w_down.dtype, q8 ? PT_Q8_0 : PT_F32);
        assert_true(m->cfg.expert_renorm);
        pt_kv_cache kv;
        assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
        json_t *p;
        size_t i;
        json_array_foreach(json_object_get(r, "prompts"), i, p) {
            if (!q8) {
                run_prompt(m, &kv, p, "qwen3moe gguf", tols_of(r), NULL);
                continue;
            }
            int n, vocab = m->cfg.vocab_size;
            int32_t *tok = ids_of(json_object_get(p, "tokens"), &n);
            int32_t pos[64], seq[64] = {0};
            bool want[64];
            for (int t = 0; t < n; t++) pos[t] = t, want[t] = true;
            pt_kv_seq sq = {0};
            pt_kv_seq *seqs[1] = {&sq};
            pt_batch b = {n, tok, pos, seq, want, 1, seqs};
            float *lg = malloc(sizeof(float) * (size_t)n * vocab);
            if (pt_model_run(m, &kv, &b, lg, &err)) fail_msg("%s", err.msg);
            for (int t = 0; t < n; t++) {
                json_t *row = json_array_get(json_object_get(p, "logits"), (size_t)t);
                double d = row_diff(lg + (size_t)t * vocab, row, vocab);
                double margin = json_number_value(json_array_get(json_object_get(p, "margins"), (size_t)t));
                int want_arg = (int)json_integer_value(json_array_get(json_object_get(p, "argmax"), (size_t)t));
                worst = d > worst ? d : worst;
                if (d > 0.5) fail_msg("q8_0 experts, position %d: max |logit diff| %.3g", t, d);
                if (margin > 1.0) assert_int_equal(argmax(lg + (size_t)t * vocab, vocab), want_arg);
            }
            pt_kv_seq_release(&kv, &sq);
            free(lg), free(tok);
        }
        pt_kv_cache_free(&kv);
        pt_model_free(m);
    }
    print_message("qwen3moe gguf, q8_0 experts: max |logit diff| %.3g\n", worst);
    json_decref(r);
    remove(path);
    be->ops->destroy(be);
}

/* ---- Qwen3.5 GGUF metadata the loader refuses ------------------------------- *
 * A file with qwen35's keys and only a token embedding: each damage below
 * must be refused at the config, with a message naming it; undamaged, the
 * config passes and the load stops at the first missing weight (after
 * the embedding). */
enum { Q35_OK, Q35_SECTIONS, Q35_NO_GROUPS, Q35_INNER, Q35_MOE_NO_EXPERTS, Q35_LAYER_LIST,
       Q35_NEXTN };

static void kv_arr_i32(FILE *f, const char *k, const int32_t *v, int n) {
    put_str(f, k), put_u32(f, 9), put_u32(f, 5), put_u64(f, (uint64_t)n);
    put(f, v, sizeof(int32_t) * (size_t)n);
}

static void write_qwen35_meta(const char *path, int damage) {
    const char *arch = damage == Q35_MOE_NO_EXPERTS ? "qwen35moe" : "qwen35";
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    char k[96];
#define KEY(s) (snprintf(k, sizeof k, "%s." s, arch), k)
    static const int32_t ok_sect[4] = {2, 1, 1, 0}, bad_sect[4] = {1, 1, 1, 1};
    static const int32_t layers[4] = {1, 1, 0, 1};
    put(f, "GGUF", 4);
    put_u32(f, 3);
    put_u64(f, 1);
    put_u64(f, 17 - (damage == Q35_NO_GROUPS) + (damage == Q35_LAYER_LIST) +
                   (damage == Q35_NEXTN)); /* key-value pairs */
    put_str(f, "general.architecture"), put_u32(f, 8), put_str(f, arch);
    kv_u32(f, KEY("embedding_length"), 32);
    kv_u32(f, KEY("block_count"), damage == Q35_NEXTN ? 5 : 4);
    if (damage == Q35_NEXTN) kv_u32(f, KEY("nextn_predict_layers"), 1);
    kv_u32(f, KEY("attention.head_count"), 2);
    kv_u32(f, KEY("attention.head_count_kv"), 1);
    kv_u32(f, KEY("attention.key_length"), 16);
    kv_u32(f, KEY("feed_forward_length"), 64);
    kv_f32(f, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    kv_u32(f, KEY("rope.dimension_count"), 8);
    kv_arr_i32(f, KEY("rope.dimension_sections"), damage == Q35_SECTIONS ? bad_sect : ok_sect, 4);
    kv_u32(f, KEY("ssm.conv_kernel"), 4);
    kv_u32(f, KEY("ssm.inner_size"), damage == Q35_INNER ? 30 : 32);
    kv_u32(f, KEY("ssm.state_size"), 8);
    kv_u32(f, KEY("ssm.time_step_rank"), 4);
    if (damage != Q35_NO_GROUPS) kv_u32(f, KEY("ssm.group_count"), 2);
    kv_u32(f, KEY("full_attention_interval"), 2);
    kv_f32(f, KEY("rope.freq_base"), 1e4f);
    if (damage == Q35_LAYER_LIST) kv_arr_i32(f, KEY("attention.recurrent_layers"), layers, 4);
#undef KEY
    static float embd[64 * 32];
    put_str(f, "token_embd.weight"), put_u32(f, 2), put_u64(f, 32), put_u64(f, 64);
    put_u32(f, 0), put_u64(f, 0);
    static const uint8_t zero[32];
    put(f, zero, (size_t)((32 - ftell(f) % 32) % 32));
    put(f, embd, sizeof embd);
    fclose(f);
}

static void test_qwen35_config_refused(void **state) {
    (void)state;
    static const struct {
        int damage;
        const char *want;
    } cases[] = {
        {Q35_OK, "missing tensor output_norm.weight"},
        {Q35_SECTIONS, "[1, 1, 1, 1] put rotary pair 3 on the extra section's position"},
        {Q35_NO_GROUPS, "qwen35 needs ssm.conv_kernel, ssm.inner_size"},
        {Q35_INNER, "Gated DeltaNet shapes do not fit (conv 4, inner 30, state 8"},
        {Q35_MOE_NO_EXPERTS, "qwen35moe needs expert_count"},
        {Q35_LAYER_LIST, "attention.recurrent_layers (an explicit layer list) is not supported"},
    };
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    char path[128];
    snprintf(path, sizeof path, "/tmp/petrel_qwen35_meta_%d.gguf", (int)getpid());
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        write_qwen35_meta(path, cases[i].damage);
        pt_model_opts o = {.backend = be};
        pt_model *m = NULL;
        assert_int_equal(pt_model_load(&m, path, &o, &err), -1);
        assert_null(m);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %d: '%s' does not say '%s'", cases[i].damage, err.msg, cases[i].want);
    }
    /* a multi-token-prediction block after the trunk is not a layer */
    write_qwen35_meta(path, Q35_NEXTN);
    pt_model_file *mf;
    pt_model_config c;
    if (pt_model_file_open(&mf, path, &err) || pt_config_from_file(mf, &c, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(c.n_layers, 4);
    for (int l = 0; l < 4; l++) assert_int_equal(pt_config_layer_recurrent(&c, l), l % 2 == 0);
    pt_model_file_close(mf);
    unlink(path);
    be->ops->destroy(be);
}

/* ---- MiniCPM3 GGUF rope settings the loader refuses ------------------------- *
 * minicpm3 keys, a token embedding and LongRoPE's two factor tensors: the
 * config takes the short factors; a file whose original context is below
 * its trained one (llama.cpp would switch factors with the context), other
 * rope scaling and a lone factor tensor are refused with the reason. */
enum { MC3_OK, MC3_ORIG_SHORT, MC3_YARN, MC3_NO_LONG };

static void write_minicpm3_meta(const char *path, int damage) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    put(f, "GGUF", 4);
    put_u32(f, 3);
    put_u64(f, damage == MC3_NO_LONG ? 2 : 3); /* tensors */
    put_u64(f, 10 + (damage == MC3_ORIG_SHORT || damage == MC3_YARN)); /* key-value pairs */
    put_str(f, "general.architecture"), put_u32(f, 8), put_str(f, "minicpm3");
    kv_u32(f, "minicpm3.embedding_length", 32);
    kv_u32(f, "minicpm3.block_count", 2);
    kv_u32(f, "minicpm3.attention.head_count", 2);
    kv_u32(f, "minicpm3.attention.head_count_kv", 2);
    kv_u32(f, "minicpm3.attention.key_length", 12);
    kv_u32(f, "minicpm3.feed_forward_length", 64);
    kv_u32(f, "minicpm3.rope.dimension_count", 4);
    kv_u32(f, "minicpm3.attention.kv_lora_rank", 16);
    kv_u32(f, "minicpm3.context_length", 4096);
    if (damage == MC3_ORIG_SHORT) kv_u32(f, "minicpm3.rope.scaling.original_context_length", 1024);
    if (damage == MC3_YARN)
        put_str(f, "minicpm3.rope.scaling.type"), put_u32(f, 8), put_str(f, "yarn");
    static float embd[32 * 32];
    static const float shrt[2] = {1.5f, 3.0f}, lng[2] = {9.0f, 12.0f};
    put_str(f, "token_embd.weight"), put_u32(f, 2), put_u64(f, 32), put_u64(f, 32);
    put_u32(f, 0), put_u64(f, 0);
    put_str(f, "rope_factors_short.weight"), put_u32(f, 1), put_u64(f, 2);
    put_u32(f, 0), put_u64(f, sizeof embd);
    if (damage != MC3_NO_LONG) {
        put_str(f, "rope_factors_long.weight"), put_u32(f, 1), put_u64(f, 2);
        put_u32(f, 0), put_u64(f, sizeof embd + 32);
    }
    static const uint8_t zero[32];
    put(f, zero, (size_t)((32 - ftell(f) % 32) % 32));
    put(f, embd, sizeof embd);
    put(f, shrt, sizeof shrt), put(f, zero, 32 - sizeof shrt);
    put(f, lng, sizeof lng), put(f, zero, 32 - sizeof lng);
    fclose(f);
}

static void test_minicpm3_rope_refused(void **state) {
    (void)state;
    static const struct {
        int damage;
        const char *want;
    } cases[] = {
        {MC3_ORIG_SHORT, "original context of 1024 below the trained 4096"},
        {MC3_YARN, "minicpm3 with rope scaling 'yarn' is not supported"},
        {MC3_NO_LONG, "expected f32 rope_factors_short and rope_factors_long of 2"},
    };
    pt_err err = {{0}};
    char path[128];
    snprintf(path, sizeof path, "/tmp/petrel_minicpm3_meta_%d.gguf", (int)getpid());
    pt_model_file *mf;
    pt_model_config c;
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        write_minicpm3_meta(path, cases[i].damage);
        if (pt_model_file_open(&mf, path, &err)) fail_msg("%s", err.msg);
        assert_int_equal(pt_config_from_file(mf, &c, &err), -1);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %d: '%s' does not say '%s'", cases[i].damage, err.msg, cases[i].want);
        pt_model_file_close(mf);
    }
    write_minicpm3_meta(path, MC3_OK);
    if (pt_model_file_open(&mf, path, &err) || pt_config_from_file(mf, &c, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(c.rope_scaling, PT_ROPE_SCALING_LONGROPE);
    assert_int_equal(c.rope_n_ext, 2);
    assert_float_equal(c.rope_ext[0], 1.5, 0);
    assert_float_equal(c.rope_ext[1], 3.0, 0);
    assert_int_equal(c.v_head_dim, 16); /* hidden / heads */
    pt_model_file_close(mf);
    unlink(path);
}

/* A backend without an op a model's plan needs (CUDA has no expert matmul
 * or windowed attention yet) refuses the model at load, naming the op. */
static int removed_kind = -1;
static bool has_all_but_removed(pt_backend *be, int kind) {
    (void)be;
    return kind != removed_kind;
}

static void test_missing_op_refused(void **state) {
    (void)state;
    static const struct {
        const char *model;
        int kind; /* the op the backend pretends to lack */
        const char *want;
    } cases[] = {
        {"hf/qwen3_moe", PT_OP_MATMUL_ID, "lacks op 'matmul_id' (a mixture-of-experts FFN, layer 0)"},
        {"hf/qwen3_moe", PT_OP_MOE_ROUTE, "lacks op 'moe_route'"},
        {"hf/gemma2", PT_OP_ATTENTION_EXT, "lacks op 'attention_ext' (sliding-window attention, layer 0)"},
        {"hf/gemma3_text", PT_OP_GEGLU, "lacks op 'geglu'"},
        {"hf/gemma2", PT_OP_SOFTCAP, "lacks op 'softcap' (soft-capped logits)"},
        {"gguf/qwen35/model.gguf", PT_OP_GATED_DELTA, "lacks op 'gated_delta' (a Gated DeltaNet layer, layer 0)"},
        {"gguf/qwen35moe/model.gguf", PT_OP_SIGMOID_MUL, "lacks op 'sigmoid_mul' (gated attention output)"},
        {"gguf/deepseek2/model.gguf", PT_OP_COPY_COLS,
         "lacks op 'copy_cols' (multi-head latent attention, layer 0)"},
        {"gguf/deepseek2/model.gguf", PT_OP_MOE_ROUTE_GROUPED,
         "lacks op 'moe_route_grouped' (DeepSeek expert routing, layer 1)"},
        {"gguf/gemma4/model.gguf", PT_OP_GATHER_COLS, "lacks op 'gather_cols' (per-layer inputs)"},
        {"gguf/gemma4/model.gguf", PT_OP_ATTENTION_EXT, "lacks op 'attention_ext' (sliding-window attention, layer 0)"},
        {"gguf/gemma4_moe/model.gguf", PT_OP_MATMUL_ID, "lacks op 'matmul_id' (a mixture-of-experts FFN, layer 0)"},
    };
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    const pt_backend_ops *real = be->ops;
    pt_backend_ops ops = *real;
    ops.has_op = has_all_but_removed;
    be->ops = &ops;
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        removed_kind = cases[i].kind;
        char dir[512];
        snprintf(dir, sizeof dir, PETREL_SOURCE_DIR "/tests/fixtures/%s", cases[i].model);
        pt_model_opts o = {.backend = be};
        pt_model *m = NULL;
        assert_int_equal(pt_model_load(&m, dir, &o, &err), -1);
        assert_null(m);
        if (!strstr(err.msg, cases[i].want)) fail_msg("'%s' does not say '%s'", err.msg, cases[i].want);
    }
    be->ops = real;
    /* Gemma 4 on a backend other than the CPU: loaded, no longer refused by
     * name (CUDA has every op it calls; test_cuda_model runs it there). */
    const char *cpu_name = be->name;
    be->name = "cuda";
    pt_model_opts o4 = {.backend = be};
    pt_model *m4 = NULL;
    if (pt_model_load(&m4, GGUF_DIR "gemma4/model.gguf", &o4, &err)) fail_msg("%s", err.msg);
    pt_model_free(m4);
    be->name = cpu_name;
    /* Sliding-window layers with a quantized KV cache: refused, not run. */
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, HF_DIR "gemma2", &o, &err)) fail_msg("%s", err.msg);
    pt_kv_cache kv;
    pt_kvq_spec q = {.kind = PT_KVQ_AFFINE, .k_bits = 8, .v_bits = 8};
    assert_int_equal(pt_model_kv_init(m, &kv, 64, PT_F32, &q, &err), -1);
    assert_non_null(strstr(err.msg, "quantized KV cache with sliding-window layers"));
    pt_model_free(m);
    /* Latent attention likewise (its cache row is both K and V). */
    if (pt_model_load(&m, GGUF_DIR "deepseek2/model.gguf", &o, &err)) fail_msg("%s", err.msg);
    assert_int_equal(pt_model_kv_init(m, &kv, 64, PT_F32, &q, &err), -1);
    assert_non_null(strstr(err.msg, "quantized KV cache with multi-head latent attention"));
    pt_model_free(m);
    be->ops->destroy(be);
}

/* Two sequences in one forward (rows of both prompts interleaved, as the
 * scheduler mixes them): each row's logits are the reference's for its own
 * prompt, so the latent attention keeps sequences apart. */
static void test_deepseek_mixed_batch(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(2, "auto", &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, GGUF_DIR "deepseek2/model.gguf", &o, &err)) fail_msg("%s", err.msg);
    json_error_t je;
    json_t *r = json_load_file(GGUF_DIR "deepseek2/reference.json", 0, &je);
    if (!r) fail_msg("%s", je.text);
    json_t *pa = json_array_get(json_object_get(r, "prompts"), 0);
    json_t *pb = json_array_get(json_object_get(r, "prompts"), 1);
    int na, nb, vocab = m->cfg.vocab_size;
    int32_t *ta = ids_of(json_object_get(pa, "tokens"), &na), *tb = ids_of(json_object_get(pb, "tokens"), &nb);
    int n = na + nb;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *pos = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n);
    bool *want = malloc((size_t)n);
    for (int i = 0, ia = 0, ib = 0; i < n; i++) { /* alternate while both last */
        bool from_a = ia < na && (ib >= nb || i % 2 == 0);
        tok[i] = from_a ? ta[ia] : tb[ib];
        pos[i] = from_a ? ia++ : ib++;
        seq[i] = from_a ? 0 : 1;
        want[i] = true;
    }
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    pt_kv_seq sa = {0}, sb = {0};
    pt_kv_seq *seqs[2] = {&sa, &sb};
    pt_batch b = {n, tok, pos, seq, want, 2, seqs};
    float *logits = malloc(sizeof(float) * (size_t)n * vocab);
    if (pt_model_run(m, &kv, &b, logits, &err)) fail_msg("%s", err.msg);
    double worst = 0, tol = tols_of(r).prompt;
    for (int i = 0; i < n; i++) {
        json_t *rows = json_object_get(seq[i] ? pb : pa, "logits");
        double d = row_diff(logits + (size_t)i * vocab, json_array_get(rows, (size_t)pos[i]), vocab);
        if (d > tol) fail_msg("mixed batch row %d (sequence %d, position %d): max |logit diff| %.3g", i,
                              seq[i], pos[i], d);
        worst = d > worst ? d : worst;
    }
    print_message("deepseek2 mixed batch of %d + %d rows: max |logit diff| %.3g\n", na, nb, worst);
    pt_kv_seq_release(&kv, &sa), pt_kv_seq_release(&kv, &sb);
    pt_kv_cache_free(&kv);
    free(ta), free(tb), free(tok), free(pos), free(seq), free(want), free(logits);
    json_decref(r);
    pt_model_free(m);
    be->ops->destroy(be);
}

/* The deepseek2_legacy weights as a Hugging Face checkpoint (deepseek_v3,
 * kv_b_proj fused, experts one tensor each: scripts/llama-ref/
 * deepseek2_hf.py) give llama.cpp's logits for the GGUF. */
static void test_deepseek_hf_checkpoint(void **state) {
    (void)state;
    check_model("deepseek_v3 checkpoint", GGUF_DIR "deepseek2_legacy/hf",
                GGUF_DIR "deepseek2_legacy/reference.json", "auto", 2);
}

/* The 80-token prompt of fixture name through a model whose forward takes
 * 16 rows at a time: five forward chunks, each caching its rows and
 * attending over the earlier chunks' latents, then 32 greedy steps,
 * against llama.cpp. */
static void check_chunked(const char *name) {
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(2, "auto", &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be, .max_batch = 16};
    pt_model *m;
    char path[512], ref[512], what[96];
    snprintf(path, sizeof path, GGUF_DIR "%s/model.gguf", name);
    snprintf(ref, sizeof ref, GGUF_DIR "%s/reference.json", name);
    snprintf(what, sizeof what, "%s, 16-row chunks", name);
    if (pt_model_load(&m, path, &o, &err)) fail_msg("%s", err.msg);
    json_error_t je;
    json_t *r = json_load_file(ref, 0, &je);
    if (!r) fail_msg("%s", je.text);
    json_t *p = json_array_get(json_object_get(r, "prompts"), 2);
    assert_int_equal(json_array_size(json_object_get(p, "tokens")), 80);
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    run_prompt(m, &kv, p, what, tols_of(r), NULL);
    pt_kv_cache_free(&kv);
    json_decref(r);
    pt_model_free(m);
    be->ops->destroy(be);
}

static void test_deepseek_chunked(void **state) {
    (void)state;
    check_chunked("deepseek2");
}

/* The minicpm3 fixture's weights as a Hugging Face checkpoint (minicpm3,
 * kv_b_proj fused, LongRoPE's factors in config.json's rope_scaling, the
 * scalings from scale_emb, scale_depth, dim_model_base: scripts/llama-ref/
 * minicpm3_hf.py) give llama.cpp's logits for the GGUF. */
static void test_minicpm3_hf_checkpoint(void **state) {
    (void)state;
    check_model("minicpm3 checkpoint", GGUF_DIR "minicpm3/hf", GGUF_DIR "minicpm3/reference.json",
                "auto", 2);
}

static void test_minicpm3_chunked(void **state) {
    (void)state;
    check_chunked("minicpm3");
}

/* What the minicpm3 fixture's file says, as Petrel reads it: the MLA
 * shapes (the value head hidden / heads: the file has no value_length),
 * llama.cpp's fixed scalings (12, 1.4 / sqrt(3 layers), 256 / 64), the
 * short LongRoPE factors (the file's context is the original one) and a
 * cache of 480 bytes a token (3 layers of 32 latent + 8 rope floats). */
static void test_minicpm3_gguf_config(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, GGUF_DIR "minicpm3/model.gguf", &o, &err)) fail_msg("%s", err.msg);
    const pt_model_config *c = &m->cfg;
    assert_string_equal(c->arch, "minicpm3");
    assert_int_equal(c->head_dim, 20);
    assert_int_equal(c->n_rot, 8);
    assert_int_equal(c->v_head_dim, 16);
    assert_int_equal(c->q_lora_rank, 24);
    assert_int_equal(c->kv_lora_rank, 32);
    assert_int_equal(c->n_kv_heads, 1);
    assert_true(c->kv_b_fused);
    assert_int_equal(c->rope_style, PT_ROPE_NEOX);
    assert_float_equal(c->embed_scale, 12, 1e-6);
    assert_float_equal(c->residual_scale, 1.4 / sqrt(3), 1e-6);
    assert_float_equal(c->output_scale, 4, 1e-6);
    assert_int_equal(c->rope_scaling, PT_ROPE_SCALING_LONGROPE);
    assert_int_equal(c->rope_n_ext, 4);
    for (int i = 0; i < 4; i++) assert_true(c->rope_ext[i] >= 1 && c->rope_ext[i] <= 4);
    for (int l = 0; l < c->n_layers; l++) {
        assert_int_equal(m->plan[l].mixer, PT_MIX_MLA);
        assert_int_equal(m->plan[l].ffn, PT_FFN_DENSE);
        assert_float_equal(m->plan[l].residual_scale, c->residual_scale, 0);
    }
    pt_kv_cache kv; /* one latent + rope-key row per token and layer */
    assert_int_equal(pt_model_kv_init(m, &kv, 64, PT_F32, NULL, &err), 0);
    assert_int_equal(pt_kv_bytes_per_token(&kv.cfg), 3 * (32 + 8) * 4);
    assert_int_equal(kv.v_bytes, 0);
    pt_kv_cache_free(&kv);
    pt_model_free(m);
    be->ops->destroy(be);
}

/* Loads the dummy f32 model of config.json text json (seed 7) and checks
 * that a 20-token prefill and the same tokens one at a time give the same
 * logits (the cache rows written by one path are what the other reads);
 * returns the model for the caller's own checks, *be its backend. */
static pt_model *prefill_vs_decode(const char *name, const char *json, pt_backend **be) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/petrel_dummy_%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    char spec[80];
    snprintf(spec, sizeof spec, "dummy:%s", path);
    pt_err err = {{0}};
    *be = pt_backend_cpu_new(2, "auto", &err);
    assert_non_null(*be);
    pt_model_opts o = {.backend = *be, .dummy_dtype = "f32", .dummy_seed = 7};
    pt_model *m;
    if (pt_model_load(&m, spec, &o, &err)) fail_msg("%s", err.msg);
    remove(path);
    enum { N = 20 };
    int vocab = m->cfg.vocab_size;
    int32_t tok[N], pos[N], seq[N] = {0};
    bool want[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 37 + 5) % vocab, pos[i] = i, want[i] = true;
    float *all = malloc(sizeof(float) * N * vocab), *one = malloc(sizeof(float) * vocab);
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(m, &kv, 64, PT_F32, NULL, &err), 0);
    pt_kv_seq a = {0}, b = {0};
    pt_kv_seq *sa[1] = {&a}, *sb[1] = {&b};
    pt_batch pb = {N, tok, pos, seq, want, 1, sa};
    if (pt_model_run(m, &kv, &pb, all, &err)) fail_msg("%s", err.msg);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        pt_batch d = {1, &tok[i], &pos[i], seq, want, 1, sb};
        if (pt_model_run(m, &kv, &d, one, &err)) fail_msg("%s", err.msg);
        for (int v = 0; v < vocab; v++) {
            double x = fabs(one[v] - all[(size_t)i * vocab + v]);
            if (!(x <= 1e-4)) fail_msg("%s, position %d logit %d: prefill %g, one by one %g", name,
                                       i, v, all[(size_t)i * vocab + v], one[v]);
            worst = x > worst ? x : worst;
        }
    }
    print_message("%s: prefill vs one by one, max |diff| %.3g\n", name, worst);
    pt_kv_seq_release(&kv, &a), pt_kv_seq_release(&kv, &b);
    pt_kv_cache_free(&kv);
    free(all), free(one);
    return m;
}

/* DeepSeek-V2-Lite's kind (q projected directly, softmax routing without
 * groups or bias, two shared experts, YaRN) with dummy f32 weights from a
 * config.json: no reference runs it, but prefill and decode must agree. */
static void test_deepseek_lite_dummy(void **state) {
    (void)state;
    pt_backend *be;
    pt_model *m = prefill_vs_decode(
        "deepseek-v2-lite-like dummy",
        "{\"model_type\":\"deepseek_v2\",\"hidden_size\":64,\"num_hidden_layers\":3,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":4,\"intermediate_size\":96,"
        "\"q_lora_rank\":null,\"kv_lora_rank\":32,\"qk_nope_head_dim\":16,"
        "\"qk_rope_head_dim\":8,\"v_head_dim\":16,\"moe_intermediate_size\":16,"
        "\"n_routed_experts\":8,\"n_shared_experts\":2,\"num_experts_per_tok\":2,"
        "\"first_k_dense_replace\":1,\"n_group\":1,\"topk_group\":1,\"topk_method\":"
        "\"greedy\",\"scoring_func\":\"softmax\",\"norm_topk_prob\":false,"
        "\"routed_scaling_factor\":1.0,\"vocab_size\":128,\"rms_norm_eps\":1e-6,"
        "\"rope_theta\":10000.0,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,"
        "\"original_max_position_embeddings\":4096,\"beta_fast\":32,\"beta_slow\":1,"
        "\"mscale\":0.707,\"mscale_all_dim\":0.707}}",
        &be);
    assert_int_equal(m->cfg.q_lora_rank, 0);
    assert_int_equal(m->cfg.shared_ffn_dim, 32);
    pt_model_free(m);
    be->ops->destroy(be);
}

/* MiniCPM3 with q projected directly (the Hub code's q_lora_rank null,
 * which no file here has), per-head k_b / v_b stacks made directly (dummy
 * weights: no fused kv_b), LongRoPE and the scalings: prefill and decode
 * must agree. */
static void test_minicpm3_dummy(void **state) {
    (void)state;
    pt_backend *be;
    pt_model *m = prefill_vs_decode(
        "minicpm3 dummy, q direct",
        "{\"model_type\":\"minicpm3\",\"hidden_size\":64,\"num_hidden_layers\":3,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":4,\"intermediate_size\":96,"
        "\"q_lora_rank\":null,\"kv_lora_rank\":32,\"qk_nope_head_dim\":16,"
        "\"qk_rope_head_dim\":8,\"vocab_size\":128,\"rms_norm_eps\":1e-5,"
        "\"max_position_embeddings\":1024,\"scale_emb\":12,\"scale_depth\":1.4,"
        "\"dim_model_base\":256,\"rope_scaling\":{\"type\":\"longrope\","
        "\"short_factor\":[1,1.5,2,4],\"long_factor\":[8,8,8,8],"
        "\"original_max_position_embeddings\":1024}}",
        &be);
    assert_int_equal(m->cfg.q_lora_rank, 0);
    assert_false(m->cfg.kv_b_fused);
    assert_int_equal(m->cfg.v_head_dim, 16);
    assert_int_equal(m->layers[0].wk_b.n_experts, 4);
    pt_model_free(m);
    be->ops->destroy(be);
}

/* Multi-head latent attention caches one row per token and layer, the
 * latent and the rope key (kv_lora 32 + 8 rope dims in the fixture), read
 * as both K and V: 3 layers x 40 f32 = 480 bytes a token, where the same
 * attention as MHA would cache 4 heads x (24 key + 12 value dims) a layer,
 * 1728 bytes.  The cache allocates no V buffer. */
static void test_deepseek_kv_bytes(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, GGUF_DIR "deepseek2/model.gguf", &o, &err)) fail_msg("%s", err.msg);
    const pt_model_config *c = &m->cfg;
    assert_int_equal(c->kv_lora_rank, 32);
    assert_int_equal(c->n_rot, 8);
    assert_int_equal(c->head_dim, 24);
    assert_int_equal(c->v_head_dim, 12);
    assert_int_equal(m->plan[0].mixer, PT_MIX_MLA);
    assert_int_equal(m->plan[0].ffn, PT_FFN_DENSE); /* leading dense layer */
    assert_int_equal(m->plan[1].ffn, PT_FFN_MOE);
    assert_int_equal(m->plan[1].n_shared, 1);
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(m, &kv, 64, PT_F32, NULL, &err), 0);
    size_t mla = pt_kv_bytes_per_token(&kv.cfg);
    size_t mha = (size_t)c->n_layers * c->n_heads * (size_t)(c->head_dim + c->v_head_dim) * 4;
    assert_int_equal(mla, (size_t)c->n_layers * (32 + 8) * 4);
    assert_int_equal(mha, 1728);
    assert_int_equal(kv.v_bytes, 0);
    for (int l = 0; l < c->n_layers; l++) assert_ptr_equal(kv.v[l], kv.k[l]);
    print_message("deepseek2 fixture: KV %zu bytes/token (latent + rope key), MHA-equivalent %zu\n",
                  mla, mha);
    pt_kv_cache_free(&kv);
    pt_model_free(m);
    be->ops->destroy(be);
}

/* Each damage to a model directory gives an error naming what is wrong. */
static void test_bad_config(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    assert_int_equal(pt_model_load(&m, "dummy:nonexistent-preset", &o, &err), -1);
    assert_non_null(strstr(err.msg, "nonexistent-preset"));
    pt_model_config c;
    json_t *j = json_loads("{\"model_type\":\"gpt_neox\",\"hidden_size\":8}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "gpt_neox"));
    json_decref(j);
    j = json_loads("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":5,\"num_key_value_heads\":2,\"intermediate_size\":8,"
                   "\"vocab_size\":10}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "multiple"));
    json_decref(j);
    j = json_loads("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":10,"
                   "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "yarn"));
    json_decref(j);
    /* an integer too large for the field is out of range, not missing */
    j = json_loads("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4,\"intermediate_size\":8,"
                   "\"vocab_size\":1099511627776}",
                   0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    if (!strstr(err.msg, "vocab_size 1099511627776 is out of range")) fail_msg("%s", err.msg);
    json_decref(j);
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2),  cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral), cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),   cmocka_unit_test(test_llama_sharded),
        cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3_text), cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_qwen3_next),
        cmocka_unit_test(test_gemma4_text),
        cmocka_unit_test(test_gemma4_text_moe),
        cmocka_unit_test(test_qwen3_5),
        cmocka_unit_test(test_qwen3_5_moe),
        cmocka_unit_test(test_deepseek_v3), cmocka_unit_test(test_qwen3moe_gguf),
        cmocka_unit_test(test_gguf_stories260k), cmocka_unit_test(test_gguf_deepseek2),
        cmocka_unit_test(test_gguf_deepseek2_yarn),
        cmocka_unit_test(test_gguf_deepseek2_legacy),
        cmocka_unit_test(test_deepseek_kv_bytes), cmocka_unit_test(test_deepseek_mixed_batch),
        cmocka_unit_test(test_deepseek_lite_dummy),
        cmocka_unit_test(test_deepseek_chunked),
        cmocka_unit_test(test_deepseek_hf_checkpoint),
        cmocka_unit_test(test_gguf_minicpm3), cmocka_unit_test(test_minicpm3_chunked),
        cmocka_unit_test(test_minicpm3_gguf_config), cmocka_unit_test(test_minicpm3_hf_checkpoint),
        cmocka_unit_test(test_minicpm3_dummy),
        cmocka_unit_test(test_gguf_gemma2), cmocka_unit_test(test_gguf_hf_gemma2),
        cmocka_unit_test(test_gguf_gemma3_text), cmocka_unit_test(test_gguf_hf_gemma3_text),
        cmocka_unit_test(test_gguf_gpt_oss), cmocka_unit_test(test_gguf_hf_gpt_oss),
        cmocka_unit_test(test_gguf_gpt_oss_mxfp4),
        cmocka_unit_test(test_gguf_qwen35),
        cmocka_unit_test(test_gguf_qwen35moe),
        cmocka_unit_test(test_qwen3_5_text),
        cmocka_unit_test(test_gguf_gemma4),
        cmocka_unit_test(test_gguf_gemma4_moe),
        cmocka_unit_test(test_dummy_llama),
        cmocka_unit_test(test_dummy_qwen3_moe),
        cmocka_unit_test(test_dummy_gemma2),
        cmocka_unit_test(test_dummy_gemma3_text),
        cmocka_unit_test(test_dummy_gpt_oss),
        cmocka_unit_test(test_dummy_deepseek_v2),
        cmocka_unit_test(test_dummy_qwen3_5_text),
        cmocka_unit_test(test_dummy_minicpm3),
        cmocka_unit_test(test_dummy_preset_bytes),
        cmocka_unit_test(test_missing_op_refused),
        cmocka_unit_test(test_qwen35_config_refused),
        cmocka_unit_test(test_minicpm3_rope_refused),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
