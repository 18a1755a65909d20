/*
 * chat_template.c - conversation + template -> prompt text.  The work is
 * jinja_*.c's; this file only builds the context the way Hugging Face does
 * and holds the ChatML fallback.
 */
#include <stdlib.h>

#include "tokenizer/chat_template.h"

/* ChatML, for models that ship no template.  Content that is a list of
 * parts (OpenAI's multi-part messages) contributes its text parts. */
const char pt_chat_template_chatml[] =
    /* with tools: a system turn lists them and says how to call (Hermes) */
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' and messages[0].content is string %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return {\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>} within <tool_call></tool_call>.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- elif message.content is iterable %}"
    "{%- for part in message.content %}{%- if part.type == 'text' %}{{- part.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    "{{- '<tool_call>\\n{\\\"name\\\": ' + call.function.name | tojson + ', \\\"arguments\\\": ' + call.function.arguments | tojson + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

json_t *pt_chat_context(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                        const char *bos_token, const char *eos_token, const json_t *extra) {
    json_t *ctx = json_object();
    json_object_set(ctx, "messages", (json_t *)messages);
    if (tools && !json_is_null(tools)) json_object_set(ctx, "tools", (json_t *)tools);
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (bos_token) json_object_set_new(ctx, "bos_token", json_string(bos_token));
    if (eos_token) json_object_set_new(ctx, "eos_token", json_string(eos_token));
    if (extra) json_object_update(ctx, (json_t *)extra);
    return ctx;
}

int pt_chat_render_compiled(const pt_jinja *tpl, const json_t *messages, const json_t *tools,
                            bool add_generation_prompt, const char *bos_token, const char *eos_token,
                            const json_t *extra, char **out, size_t *out_len, pt_err *err) {
    *out = NULL;
    if (!json_is_array(messages)) return pt_fail(err, "chat template: messages must be a JSON array");
    if (extra && !json_is_object(extra)) return pt_fail(err, "chat template: extra context must be a JSON object");
    json_t *ctx = pt_chat_context(messages, tools, add_generation_prompt, bos_token, eos_token, extra);
    int rc = pt_jinja_render(tpl, ctx, NULL, out, out_len, err);
    json_decref(ctx);
    return rc;
}

int pt_chat_render(const char *template_src, const json_t *messages, const json_t *tools,
                   bool add_generation_prompt, const char *bos_token, const char *eos_token,
                   const json_t *extra, char **out, size_t *out_len, pt_err *err) {
    *out = NULL;
    if (!template_src) template_src = pt_chat_template_chatml;
    pt_jinja *tpl;
    if (pt_jinja_compile(&tpl, template_src, strlen(template_src), err)) return pt_failp(err, "chat template");
    int rc = pt_chat_render_compiled(tpl, messages, tools, add_generation_prompt, bos_token, eos_token, extra,
                                     out, out_len, err);
    pt_jinja_free(tpl);
    return rc;
}
