/*
 * cmd_chat.c - `petrel chat`: an interactive conversation in the terminal.
 *
 * Each line typed is a user message; the whole conversation (an optional
 * system message, then the turns so far) goes through the model's chat
 * template - the one `petrel serve` uses (server/prompt.c) - and the
 * answer streams to stdout as it is generated, then joins the history.
 * Every turn re-renders the conversation, and the prefix cache reuses the
 * KV pages of what was already computed, so a turn costs its new tokens.
 *
 * Commands: /reset forgets the turns (keeps the system message), /system
 * TEXT sets the system message and starts over, /exit (or end of input)
 * leaves, /help lists them.
 *
 * Ctrl-C interrupts the answer, not the program: SIGINT only raises a
 * flag, which the token callback answers by stopping the generation; the
 * partial answer stays in the history.  At the prompt, Ctrl-C abandons the
 * line.  The handler is installed without SA_RESTART so that it also
 * breaks a read waiting at the prompt.
 *
 * For tests only: PETREL_CHAT_HOLD=1 makes the first token of each answer
 * wait for a SIGINT, so that a test through a pseudo-terminal can
 * interrupt an answer deterministically however fast the model is.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "server/server_int.h" /* the chat template: pt_chat_tmpl_* */

static struct {
    int n;
    float temp, top_p, min_p, rep;
    int top_k;
    uint64_t seed;
    const char *system, *chat_template;
} g;

static const cli_opt chat_opts[] = {
    {"n-predict", 'n', CLI_INT, &g.n, "N", "tokens per answer at most (default: until the context is full)"},
    {"temp", 0, CLI_FLOAT, &g.temp, "T", "temperature; 0 = greedy (default 0.8)"},
    {"top-k", 0, CLI_INT, &g.top_k, "K", "keep the K most likely tokens; 0 = off (default 40)"},
    {"top-p", 0, CLI_FLOAT, &g.top_p, "P", "nucleus sampling; 1 = off (default 0.95)"},
    {"min-p", 0, CLI_FLOAT, &g.min_p, "P", "drop tokens below P x the top one's probability (default 0.05)"},
    {"repeat-penalty", 0, CLI_FLOAT, &g.rep, "R", "repetition penalty; 1 = off (default 1)"},
    {"seed", 's', CLI_U64, &g.seed, "S", "sampling seed (default: from the clock)"},
    {"system", 0, CLI_STR, &g.system, "TEXT", "the system message (also /system TEXT)"},
    {"chat-template", 0, CLI_STR, &g.chat_template, "FILE", "Jinja chat template to use instead of the model's"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct chat {
    pt_engine *e;
    pt_chat_tmpl *tmpl;
    json_t *messages; /* the conversation, system message first if any */
    bool hold;        /* PETREL_CHAT_HOLD: see the header */
    bool tty;
} chat;

/* PETREL_CHAT_HOLD: waits for SIGINT.  It is blocked while the flag is
 * checked, so one that arrives in between is not lost. */
static void hold_for_sigint(void) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    fputs("(holding for Ctrl-C)", stderr); /* the test's cue */
    while (!g_interrupted) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

/* ---- one answer ----------------------------------------------------------------- */

typedef struct answer {
    chat *c;
    char *text;
    size_t len, cap;
    int n_tokens;
} answer;

static int on_token(void *user, const pt_sample_result *r, const char *text, size_t len) {
    answer *a = user;
    (void)r;
    if (a->n_tokens++ == 0 && a->c->hold) hold_for_sigint();
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (a->len + len + 1 > a->cap) {
            a->cap = PT_MAX(2 * a->cap, a->len + len + 256);
            a->text = pt_xrealloc(a->text, a->cap);
        }
        memcpy(a->text + a->len, text, len);
        a->len += len;
    }
    return g_interrupted != 0;
}

static void add_message(chat *c, const char *role, const char *text, size_t len) {
    json_t *content = json_stringn(text, len);
    if (!content) content = json_string(""); /* not UTF-8: cannot happen for our own text */
    json_array_append_new(c->messages, json_pack("{s:s, s:o}", "role", role, "content", content));
}

/* The rendered conversation's token ids, BOS added where the template did
 * not write one (as the server does). */
static int prompt_ids(chat *c, int32_t **ids, size_t *n, pt_err *err) {
    char *text;
    size_t len;
    if (pt_chat_tmpl_render(c->tmpl, c->messages, NULL, NULL, &text, &len, err)) return -1;
    const pt_tokenizer *tok = c->e->tok;
    int rc = pt_tokenize(tok, text, len, false, true, ids, n, err);
    free(text);
    if (rc) return -1;
    int32_t bos = pt_tokenizer_bos(tok);
    if (pt_tokenizer_adds_bos(tok) && bos >= 0 && (*n == 0 || (*ids)[0] != bos)) {
        *ids = pt_xrealloc(*ids, sizeof(int32_t) * (*n + 1));
        memmove(*ids + 1, *ids, sizeof(int32_t) * *n);
        (*ids)[0] = bos;
        (*n)++;
    }
    return 0;
}

/* Answers the user's line; the answer (whole or interrupted) joins the
 * history.  A failure leaves the history as it was. */
static void turn(chat *c, const char *line) {
    size_t before = json_array_size(c->messages);
    add_message(c, "user", line, strlen(line));
    pt_err err = {{0}};
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_ids(c, &ids, &n, &err)) {
        fprintf(stderr, "petrel chat: %s\n", err.msg);
        json_array_remove(c->messages, before);
        return;
    }
    if ((int)n >= c->e->n_ctx - 1) {
        fprintf(stderr,
                "petrel chat: the conversation is %zu tokens, the context holds %d: /reset to "
                "start over, or a larger --ctx\n",
                n, c->e->n_ctx);
        free(ids);
        json_array_remove(c->messages, before);
        return;
    }
    pt_gen_params p = {.max_tokens = g.n > 0 ? g.n : c->e->n_ctx - (int)n};
    p.sampling = pt_sampling_default();
    p.sampling.temperature = g.temp;
    p.sampling.top_k = g.top_k;
    p.sampling.top_p = g.top_p;
    p.sampling.min_p = g.min_p;
    p.sampling.repetition_penalty = g.rep;
    p.sampling.seed = g.seed++;
    answer a = {.c = c};
    pt_gen_stats st;
    g_interrupted = 0;
    int rc = pt_generate(c->e, ids, (int)n, &p, on_token, &a, &st, &err);
    free(ids);
    bool interrupted = g_interrupted;
    g_interrupted = 0;
    if (rc) {
        fprintf(stderr, "\npetrel chat: %s\n", err.msg);
        json_array_remove(c->messages, before);
    } else {
        add_message(c, "assistant", a.text ? a.text : "", a.len);
        printf("%s\n", interrupted ? " [interrupted]" : "");
        fprintf(stderr, "[%d prompt tokens (%d cached), %d generated%s]\n", st.n_prompt,
                st.n_cached, st.n_generated, st.finish == PT_FINISH_LENGTH ? ", length limit" : "");
    }
    free(a.text);
}

/* ---- the loop --------------------------------------------------------------------- */

static void reset(chat *c) {
    json_array_clear(c->messages);
    if (g.system && *g.system) add_message(c, "system", g.system, strlen(g.system));
}

static const char k_help[] =
    "/reset          forget the conversation (the system message stays)\n"
    "/system TEXT    set the system message and start over (/system alone: none)\n"
    "/exit           leave (also Ctrl-D); Ctrl-C stops an answer\n";

/* Handles a /command; false if line is not one. */
static bool command(chat *c, const char *line, bool *quit) {
    if (line[0] != '/') return false;
    if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0 || strcmp(line, "/bye") == 0) {
        *quit = true;
    } else if (strcmp(line, "/reset") == 0 || strcmp(line, "/clear") == 0) {
        reset(c);
        printf("(conversation cleared)\n");
    } else if (strncmp(line, "/system", 7) == 0 && (line[7] == 0 || line[7] == ' ')) {
        static char sys[4096];
        snprintf(sys, sizeof sys, "%.4000s", line[7] ? line + 8 : "");
        g.system = sys;
        reset(c);
        printf(*sys ? "(system message set; conversation cleared)\n"
                    : "(no system message; conversation cleared)\n");
    } else if (strcmp(line, "/help") == 0 || strcmp(line, "/?") == 0) {
        fputs(k_help, stdout);
    } else {
        printf("unknown command %s\n%s", line, k_help);
    }
    return true;
}

/* Typed input not yet returned as a line.  stdin is read with read(2), not
 * stdio, so that read_line knows whether a line is already here before it
 * waits. */
static struct {
    char buf[1 << 16];
    size_t len;
    bool dropping; /* inside a line longer than buf: skip to its newline */
} g_in;

/* Reads a line into buf (cap bytes) without its newline.  0: a line; 1:
 * interrupted (Ctrl-C at the prompt; the half-typed line is dropped); -1:
 * end of input.
 *
 * SIGINT stays blocked here except inside ppoll, which unblocks it
 * atomically for the wait: a Ctrl-C that lands before the wait (a fast
 * typist, a slow machine) is seen by the flag check instead of being lost
 * while read() blocks on an input queue the terminal has just flushed. */
static int read_line(char *buf, size_t cap) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    int r;
    for (;;) {
        char *nl = memchr(g_in.buf, '\n', g_in.len);
        if (nl || (g_in.len && g_in.len == sizeof g_in.buf)) {
            size_t n = nl ? (size_t)(nl - g_in.buf) : g_in.len;
            size_t used = nl ? n + 1 : n;
            bool drop = g_in.dropping;
            g_in.dropping = !nl;
            if (!drop && nl) {
                if (n && g_in.buf[n - 1] == '\r') n--;
                n = PT_MIN(n, cap - 1);
                memcpy(buf, g_in.buf, n);
                buf[n] = 0;
            }
            memmove(g_in.buf, g_in.buf + used, g_in.len - used);
            g_in.len -= used;
            if (!drop && nl) { r = 0; break; }
            if (!drop) fprintf(stderr, "petrel chat: a line longer than %zu bytes is dropped\n", sizeof g_in.buf);
            continue;
        }
        if (g_interrupted) {
            g_interrupted = 0;
            g_in.len = 0;
            g_in.dropping = false;
            r = 1;
            break;
        }
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        if (ppoll(&pfd, 1, NULL, &old) < 0) {
            if (errno == EINTR) continue;
            r = -1;
            break;
        }
        ssize_t k = read(STDIN_FILENO, g_in.buf + g_in.len, sizeof g_in.buf - g_in.len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { /* end of input: a last line without its newline still counts */
            r = -1;
            if (k == 0 && g_in.len && !g_in.dropping) {
                size_t n = PT_MIN(g_in.len, cap - 1);
                memcpy(buf, g_in.buf, n);
                buf[n] = 0;
                g_in.len = 0;
                r = 0;
            }
            break;
        }
        g_in.len += (size_t)k;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}

static void loop(chat *c) {
    static char line[1 << 16];
    for (bool quit = false; !quit;) {
        if (c->tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        int r = read_line(line, sizeof line);
        if (r < 0) break;
        if (r > 0) {
            printf("\n");
            continue;
        }
        if (!line[0] || command(c, line, &quit)) continue;
        turn(c, line);
    }
    if (c->tty) printf("\n");
}

int cmd_chat(int argc, char **argv) {
    cli_model_defaults();
    memset(&g, 0, sizeof g);
    g.temp = 0.8f, g.top_k = 40, g.top_p = 0.95f, g.min_p = 0.05f, g.rep = 1;
    g.seed = UINT64_MAX;
    const cli_opt *tables[] = {chat_opts, cli_model_opts, NULL};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(argc, argv,
                       "petrel chat [options]\n\n"
                       "An interactive chat with the model, through its chat template. Type a\n"
                       "message and Enter; the answer streams back. Ctrl-C stops an answer;\n"
                       "/reset, /system TEXT, /exit (or Ctrl-D), /help.",
                       tables, pos, 0, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    if (g.seed == UINT64_MAX) g.seed = (uint64_t)time(NULL);
    chat c = {.hold = getenv("PETREL_CHAT_HOLD") && strcmp(getenv("PETREL_CHAT_HOLD"), "1") == 0,
              .tty = isatty(STDIN_FILENO)};
    cli_margs.max_seqs = 1; /* one conversation */
    if (cli_open_engine(&c.e)) return 1;
    pt_err err = {{0}};
    if (!c.e->tok) {
        fprintf(stderr, "petrel chat: this model has no tokenizer (dummy weights)\n");
        pt_engine_close(c.e);
        return 1;
    }
    if (pt_chat_tmpl_open(&c.tmpl, c.e, g.chat_template, &err)) {
        fprintf(stderr, "petrel chat: %s\n", err.msg);
        pt_engine_close(c.e);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: see the header */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    c.messages = json_array();
    reset(&c);
    if (c.tty)
        fprintf(stderr, "petrel chat: %s, chat template: %s; /help for commands, Ctrl-D to leave\n",
                cli_margs.model, pt_chat_tmpl_source(c.tmpl));
    loop(&c);
    json_decref(c.messages);
    pt_chat_tmpl_free(c.tmpl);
    pt_engine_close(c.e);
    return 0;
}
