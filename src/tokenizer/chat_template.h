/*
 * chat_template.h - an OpenAI-style conversation to the prompt text a model
 * was trained on, through the model's Jinja chat template (jinja.h).
 *
 * The template sees the variables Hugging Face's apply_chat_template()
 * passes: messages, tools (only when given), add_generation_prompt,
 * bos_token and eos_token (only when the model has them), and then any
 * extra keys (e.g. enable_thinking), which override the others.
 *
 * Models without a template get pt_chat_template_chatml, the ChatML format
 * (<|im_start|>role\ncontent<|im_end|>).
 */
#ifndef PETREL_CHAT_TEMPLATE_H
#define PETREL_CHAT_TEMPLATE_H

#include "tokenizer/jinja.h"

extern const char pt_chat_template_chatml[];

/* The render context described above; a new reference (json_decref it).
 * messages must be an array; tools, bos_token, eos_token and extra may be
 * NULL; extra must be an object when given. */
json_t *pt_chat_context(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                        const char *bos_token, const char *eos_token, const json_t *extra);

/* Renders a conversation with an already compiled template.  Returns 0,
 * -1 (err says why) or PT_JINJA_RAISED (the template rejected the
 * conversation; err holds its message, meant for the client, e.g.
 * "Conversation roles must alternate user/assistant/user/assistant/...").
 * *out is malloc'd and NUL-terminated; out_len (may be NULL) gets its
 * length, which matters only if a message contained U+0000. */
int pt_chat_render_compiled(const pt_jinja *tpl, const json_t *messages, const json_t *tools,
                            bool add_generation_prompt, const char *bos_token, const char *eos_token,
                            const json_t *extra, char **out, size_t *out_len, pt_err *err);

/* The same from template source (NULL: the ChatML fallback), compiled for
 * this one call. */
int pt_chat_render(const char *template_src, const json_t *messages, const json_t *tools,
                   bool add_generation_prompt, const char *bos_token, const char *eos_token,
                   const json_t *extra, char **out, size_t *out_len, pt_err *err);

#endif
