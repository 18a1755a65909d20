/*
 * jinja_parity.c - renders what render.mjs rendered with @huggingface/jinja
 * and compares byte for byte.
 *
 * usage: jinja_parity EXPECTED.json
 *
 * Chat cases go through pt_chat_render() with the template source, the
 * conversation and the model's bos/eos tokens; feature cases (small
 * templates for one language feature each) through pt_jinja_*.  A case
 * passes when both renders give the same bytes, or both fail: with the
 * same message when the template raised it (raise_exception), with any
 * message otherwise.  The first mismatch is shown with its byte offset.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/chat_template.h"

typedef struct tally {
    int passed, failed;
    bool shown;
} tally;

static void show_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static void show_around(const char *label, const char *s, size_t n, size_t at) {
    size_t from = at > 40 ? at - 40 : 0, to = PT_MIN(n, at + 40);
    printf("    %s [%zu..%zu) of %zu: \"", label, from, to, n);
    show_escaped(s + from, to - from);
    printf("\"\n");
}

/* Compares one render with the reference; prints details of a mismatch. */
static void check(tally *t, const char *name, const json_t *ref, int rc, const char *out, size_t len, const pt_err *err) {
    bool ok = json_is_true(json_object_get(ref, "ok"));
    const char *why = NULL;
    char buf[700];
    size_t at = 0;
    const char *want = NULL;
    size_t want_len = 0;
    if (ok) {
        want = json_string_value(json_object_get(ref, "output"));
        want_len = json_string_length(json_object_get(ref, "output"));
        if (rc != 0) {
            snprintf(buf, sizeof buf, "reference rendered, ours failed: %s", err->msg);
            why = buf;
        } else if (len != want_len || memcmp(out, want, len) != 0) {
            while (at < len && at < want_len && out[at] == want[at]) at++;
            snprintf(buf, sizeof buf, "output differs at byte %zu", at);
            why = buf;
        }
    } else {
        bool raised = json_is_true(json_object_get(ref, "raised"));
        const char *msg = json_string_value(json_object_get(ref, "error"));
        if (rc == 0) {
            snprintf(buf, sizeof buf, "reference failed (%s), ours rendered", msg);
            why = buf;
        } else if (raised && (rc != PT_JINJA_RAISED || strcmp(err->msg, msg) != 0)) {
            snprintf(buf, sizeof buf, "reference raised \"%s\", ours: %s", msg, err->msg);
            why = buf;
        } else if (!raised && rc == PT_JINJA_RAISED) {
            snprintf(buf, sizeof buf, "reference failed (%s), ours raised \"%s\"", msg, err->msg);
            why = buf;
        }
    }
    if (!why) {
        t->passed++;
        return;
    }
    t->failed++;
    printf("MISMATCH %s: %s\n", name, why);
    if (!t->shown && ok && rc == 0) {
        show_around("reference", want, want_len, at);
        show_around("ours     ", out, len, at);
    }
    t->shown = true;
}

static const json_t *find_template(const json_t *templates, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(templates, i, t) {
        if (!strcmp(json_string_value(json_object_get(t, "name")), name)) return t;
    }
    return NULL;
}

static void run_chats(tally *t, const json_t *doc) {
    const json_t *templates = json_object_get(doc, "templates");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "chats"), i, c) {
        const json_t *tpl = find_template(templates, json_string_value(json_object_get(c, "template")));
        const json_t *conv = json_object_get(c, "conversation");
        char *out = NULL;
        size_t len = 0;
        pt_err err = {{0}};
        int rc = pt_chat_render(json_string_value(json_object_get(tpl, "source")), json_object_get(conv, "messages"),
                                json_object_get(conv, "tools"),
                                json_is_true(json_object_get(conv, "add_generation_prompt")),
                                json_string_value(json_object_get(tpl, "bos_token")),
                                json_string_value(json_object_get(tpl, "eos_token")), json_object_get(conv, "extra"),
                                &out, &len, &err);
        check(t, json_string_value(json_object_get(c, "name")), c, rc, out, len, &err);
        free(out);
    }
}

static void run_features(tally *t, const json_t *doc) {
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(doc, "features"), i, f) {
        const json_t *src = json_object_get(f, "template");
        char *out = NULL;
        size_t len = 0;
        pt_err err = {{0}};
        pt_jinja *tpl;
        int rc = pt_jinja_compile(&tpl, json_string_value(src), json_string_length(src), &err);
        if (rc == 0) {
            rc = pt_jinja_render(tpl, json_object_get(f, "context"), NULL, &out, &len, &err);
            pt_jinja_free(tpl);
        }
        char name[200];
        snprintf(name, sizeof name, "feature/%s", json_string_value(json_object_get(f, "name")));
        check(t, name, f, rc, out, len, &err);
        free(out);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s EXPECTED.json\n", argv[0]);
        return 2;
    }
    json_error_t je;
    json_t *doc = json_load_file(argv[1], JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!doc) {
        fprintf(stderr, "%s:%d: %s\n", argv[1], je.line, je.text);
        return 2;
    }
    tally chats = {0}, features = {0};
    run_chats(&chats, doc);
    run_features(&features, doc);
    printf("chat templates: %d of %d byte-identical (%zu templates)\n", chats.passed, chats.passed + chats.failed,
           json_array_size(json_object_get(doc, "templates")));
    printf("language features: %d of %d identical\n", features.passed, features.passed + features.failed);
    printf("%d passed, %d failed\n", chats.passed + features.passed, chats.failed + features.failed);
    json_decref(doc);
    return chats.failed + features.failed ? 1 : 0;
}
