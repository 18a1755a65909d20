/*
 * prompt.c - which chat template the server renders, compiled once.
 *
 * The source, first found: --chat-template FILE; the GGUF key
 * tokenizer.chat_template; tokenizer_config.json's chat_template (a string,
 * or a list of named templates of which "default" is used); otherwise the
 * ChatML fallback of chat_template.h.  Rendering is chat_template.c's work;
 * a compiled template is immutable, so it is shared by every request.
 */
#include <stdio.h>
#include <stdlib.h>

#include "io/gguf.h"
#include "server/harmony.h"
#include "server/reasoning.h"
#include "server/server_int.h"
#include "server/tools.h"
#include "tokenizer/chat_template.h"

struct pt_chat_tmpl {
    pt_jinja *jinja;
    const char *source; /* where it came from, for logs and /v1/models */
    char *bos, *eos;    /* token texts the template may use, or NULL */
    int tool_family;    /* the call markup it writes (tools.h) */
    bool thinks;        /* it writes <think> tags (reasoning.h) */
    bool harmony;       /* it writes OpenAI's harmony format (harmony.h) */
};

/* The model's own template source (malloc'd), or NULL. */
static char *model_template(const pt_model_file *mf, const char **source) {
    if (mf->gguf) {
        pt_gguf_str s;
        if (!pt_gguf_get_str(mf->gguf, "tokenizer.chat_template", &s)) return NULL;
        *source = "gguf";
        char *t = pt_xmalloc((size_t)s.len + 1);
        memcpy(t, s.s, s.len);
        t[s.len] = 0;
        return t;
    }
    json_t *t =
        mf->tokenizer_config ? json_object_get(mf->tokenizer_config, "chat_template") : NULL;
    if (json_is_array(t)) { /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
        size_t i;
        json_t *entry, *pick = NULL;
        json_array_foreach(t, i, entry) {
            const char *name = json_string_value(json_object_get(entry, "name"));
            if (name && strcmp(name, "default") == 0) pick = json_object_get(entry, "template");
        }
        t = pick;
    }
    if (!json_is_string(t)) return NULL;
    *source = "tokenizer_config.json";
    return pt_xstrdup(json_string_value(t));
}

static char *token_text(const pt_tokenizer *tok, int32_t id) {
    if (id < 0) return NULL;
    size_t n;
    const char *b = pt_token_bytes(tok, id, &n);
    char *s = pt_xmalloc(n + 1);
    memcpy(s, b, n);
    s[n] = 0;
    return s;
}

int pt_chat_tmpl_open(pt_chat_tmpl **out, pt_engine *e, const char *override_path, pt_err *err) {
    *out = NULL;
    pt_chat_tmpl *t = pt_xcalloc(1, sizeof *t);
    char *src = NULL;
    size_t len = 0;
    if (override_path) {
        if (pt_read_file(override_path, 1u << 20, &src, &len, err)) {
            free(t);
            return pt_failp(err, "--chat-template");
        }
        t->source = "file";
    } else if (e->model->file) {
        src = model_template(e->model->file, &t->source);
    }
    if (!src) {
        src = pt_xstrdup(pt_chat_template_chatml);
        t->source = "builtin ChatML (the model has no chat template)";
    }
    int rc = pt_jinja_compile(&t->jinja, src, strlen(src), err);
    t->tool_family = pt_tool_family_of(src);
    t->thinks = pt_reason_template_thinks(src);
    t->harmony = pt_harmony_template(src);
    free(src);
    if (rc) {
        free(t);
        return pt_failp(err, "chat template (%s)",
                        override_path ? override_path : "from the model");
    }
    t->bos = token_text(e->tok, pt_tokenizer_bos(e->tok));
    t->eos = token_text(e->tok, pt_tokenizer_eos(e->tok));
    *out = t;
    return 0;
}

void pt_chat_tmpl_free(pt_chat_tmpl *t) {
    if (!t) return;
    pt_jinja_free(t->jinja);
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *pt_chat_tmpl_source(const pt_chat_tmpl *t) {
    return t ? t->source : "none";
}

int pt_chat_tmpl_tool_family(const pt_chat_tmpl *t) {
    return t ? t->tool_family : PT_TOOLS_HERMES;
}

bool pt_chat_tmpl_thinks(const pt_chat_tmpl *t) {
    return t && t->thinks && !t->harmony;
}

bool pt_chat_tmpl_harmony(const pt_chat_tmpl *t) {
    return t && t->harmony;
}

int pt_chat_tmpl_render(const pt_chat_tmpl *t, const json_t *messages, const json_t *tools,
                        const json_t *extra, char **out, size_t *out_len, pt_err *err) {
    int rc = pt_chat_render_compiled(t->jinja, messages, tools, true, t->bos, t->eos, extra, out,
                                     out_len, err);
    return rc == 0 ? 0 : -1;
}
