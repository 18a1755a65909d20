/*
 * pool.c - the model pool: several models behind one endpoint, routed by
 * the request's "model", loaded on demand and evicted least recently used
 * to stay within --pool-memory.
 *
 * Everything here runs on the event loop, except the load itself, which
 * runs on a thread of its own (one load at a time) so that /health and
 * the models already loaded keep answering.
 *
 * A slot's life: UNLOADED -> LOADING (its loader thread) -> LOADED ->
 * (EVICTING ->) UNLOADED.  Invariants:
 *   - a slot has waiting requests (wait_head) only while it is not LOADED;
 *     they are handed to pt_handle_on, in arrival order, when it loads;
 *   - a slot is unloaded only with n_active == 0: requests in flight always
 *     finish on the engine they started on.  A busy slot chosen to make
 *     room becomes EVICTING: new requests for it wait like those for an
 *     unloaded model, and it goes when its last request is freed;
 *   - the footprint counted against --pool-memory is the weights' size on
 *     disk plus the KV pool the slot had at its last load (the weights'
 *     size alone before its first load); after a load the actual figure is
 *     known, and more idle slots are evicted if the pool is over;
 *   - with a single model nothing of this is visible: it loads at start-up
 *     and is never evicted (there is nothing to make room for).
 */
#include <dirent.h>
#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "server/server_int.h"

struct pt_pending {
    pt_pending *next;
    pt_server *s;
    pt_slot *m;
    pt_conn *c;
    int kind;
    double t_arrival;
    struct event *timer; /* --pool-wait */
    size_t len;
    char body[];
};

struct pt_loader {
    pt_server *s;
    pt_slot *m;
    pthread_t thread;
    struct event *done; /* made active by the thread when the load returned */
    double t0;
    int rc;
    pt_engine *e;
    pt_err err;
};

/* ---- slots -------------------------------------------------------------------------- */

/* Bytes of a file, or of the regular files of a directory (a Hugging Face
 * or MLX model); 0 for what cannot be read (dummy:PRESET). */
static size_t path_bytes(const char *path) {
    struct stat st;
    if (stat(path, &st)) return 0;
    if (!S_ISDIR(st.st_mode)) return (size_t)st.st_size;
    DIR *d = opendir(path);
    if (!d) return 0;
    size_t n = 0;
    char p[4096];
    for (struct dirent *e; (e = readdir(d));) {
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode)) n += (size_t)st.st_size;
    }
    closedir(d);
    return n;
}

void pt_models_init(pt_server *s) {
    s->n_slots = s->o.n_models;
    s->slots = pt_xcalloc((size_t)s->n_slots, sizeof *s->slots);
    for (int i = 0; i < s->n_slots; i++) {
        pt_slot *m = &s->slots[i];
        snprintf(m->id, sizeof m->id, "%s", s->o.models[i].id);
        m->path = s->o.models[i].path;
        m->file_bytes = path_bytes(m->path);
        pt_metrics_init(&m->metrics);
    }
}

const char *pt_slot_state(const pt_slot *m) {
    static const char *const names[] = {"unloaded", "loading", "loaded", "evicting"};
    return names[m->state];
}

pt_slot *pt_models_find(pt_server *s, const char *id) {
    for (int i = 0; i < s->n_slots; i++)
        if (strcmp(s->slots[i].id, id) == 0) return &s->slots[i];
    return NULL;
}

void pt_models_names(const pt_server *s, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < s->n_slots && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s'%s'", i ? ", " : "", s->slots[i].id);
}

int pt_models_n_waiting(const pt_slot *m) {
    int n = 0;
    for (const pt_pending *p = m->wait_head; p; p = p->next)
        n++;
    return n;
}

static size_t slot_bytes(const pt_slot *m) {
    return m->file_bytes + m->kv_bytes;
}

/* What the loaded (and loading, and evicting) slots hold, but skip. */
static size_t pool_used(const pt_server *s, const pt_slot *skip) {
    size_t n = 0;
    for (int i = 0; i < s->n_slots; i++)
        if (&s->slots[i] != skip && s->slots[i].state != SLOT_UNLOADED) n += slot_bytes(&s->slots[i]);
    return n;
}

static void unload(pt_server *s, pt_slot *m, const char *why) {
    pt_server_log(s, "model %s: unloaded (%s), %.1f MiB freed", m->id, why,
                  (double)slot_bytes(m) / (1 << 20));
    pt_slot_stop(m);
    m->state = SLOT_UNLOADED;
}

/* ---- waiting requests ------------------------------------------------------------------ */

static void pending_free(pt_pending *p) {
    pt_slot *m = p->m;
    pt_pending **pp = &m->wait_head;
    while (*pp != p)
        pp = &(*pp)->next;
    *pp = p->next;
    if (m->wait_tail == p) {
        m->wait_tail = NULL;
        for (pt_pending *x = m->wait_head; x; x = x->next)
            m->wait_tail = x;
    }
    p->s->n_pending--;
    event_free(p->timer);
    free(p);
}

static void pending_gone(void *arg) {
    pending_free(arg); /* the connection goes right after */
}

static void pending_timeout(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    pt_pending *p = arg;
    pt_http_error(p->c, 503, NULL, "model_loading", "model",
                  "the model '%s' did not load within %d s (--pool-wait); retry later", p->m->id,
                  p->s->o.pool_wait);
    pending_free(p);
}

/* Every request waiting for m gets this error. */
static void fail_waiting(pt_slot *m, int status, const char *code, const char *msg) {
    while (m->wait_head) {
        pt_pending *p = m->wait_head;
        pt_http_error(p->c, status, NULL, code, "model", "%s", msg);
        pending_free(p);
    }
}

/* m is loaded: its waiting requests go on, oldest first. */
static void run_waiting(pt_server *s, pt_slot *m) {
    while (m->wait_head && m->state == SLOT_LOADED) {
        pt_pending *p = m->wait_head;
        m->wait_head = p->next;
        if (!m->wait_head) m->wait_tail = NULL;
        p->next = NULL;
        s->n_pending--;
        event_free(p->timer);
        pt_conn_on_gone(p->c, NULL, NULL);
        m->last_used = pt_now();
        pt_handle_on(p->c, m, p->body, p->len, p->kind);
        free(p);
    }
}

static void schedule(pt_server *s);

static int wait_for(pt_conn *c, pt_slot *m, const char *body, size_t len, int kind) {
    pt_server *s = pt_conn_server(c);
    if (s->n_pending >= s->o.max_queue) {
        pt_http_error(c, 503, NULL, "server_busy", NULL,
                      "%d requests are already waiting for models to load; retry later",
                      s->n_pending);
        return -1;
    }
    pt_pending *p = pt_xcalloc(1, sizeof *p + len + 1);
    p->s = s, p->m = m, p->c = c, p->kind = kind, p->len = len;
    p->t_arrival = pt_now();
    memcpy(p->body, body, len);
    p->timer = evtimer_new(s->base, pending_timeout, p);
    struct timeval tv = {s->o.pool_wait, 0};
    evtimer_add(p->timer, &tv);
    if (m->wait_tail)
        m->wait_tail->next = p;
    else
        m->wait_head = p;
    m->wait_tail = p;
    s->n_pending++;
    pt_conn_on_gone(c, pending_gone, p);
    return 0;
}

/* ---- routing -------------------------------------------------------------------------- */

/* The request's "model", or NULL (not JSON, or no such string: the first
 * model serves it, and the parser reports what is wrong). */
static pt_slot *model_of(pt_server *s, const char *body, size_t len, bool *unknown, char *name,
                         size_t cap) {
    *unknown = false;
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *v = json_object_get(root, "model");
    pt_slot *m = &s->slots[0];
    if (json_is_string(v)) {
        snprintf(name, cap, "%s", json_string_value(v));
        m = pt_models_find(s, json_string_value(v));
        *unknown = m == NULL;
    }
    json_decref(root);
    return m;
}

pt_slot *pt_models_route(pt_conn *c, const char *body, size_t len, int kind) {
    pt_server *s = pt_conn_server(c);
    if (s->n_slots == 1) { /* as with no pool: the parser checks "model" */
        s->slots[0].last_used = pt_now();
        return &s->slots[0];
    }
    bool unknown;
    char name[256] = "";
    pt_slot *m = model_of(s, body, len, &unknown, name, sizeof name);
    if (unknown) {
        char names[1024];
        pt_models_names(s, names, sizeof names);
        pt_http_error(c, 404, NULL, "model_not_found", "model",
                      "The model '%.200s' does not exist; this server serves %s", name, names);
        return NULL;
    }
    if (m->state == SLOT_LOADED) {
        m->last_used = pt_now();
        return m;
    }
    if (wait_for(c, m, body, len, kind) == 0) schedule(s);
    return NULL;
}

/* ---- loading and eviction ----------------------------------------------------------------- */

static void *load_main(void *arg) {
    pt_loader *l = arg;
    l->rc = l->s->load(l->s->load_arg, l->m->path, &l->e, &l->err);
    event_active(l->done, EV_READ, 0); /* thread-safe: evthread_use_pthreads() */
    return NULL;
}

/* Room for want: idle slots go at once, least recently used first; if
 * only busy ones are left, the least recently used becomes EVICTING and
 * the load waits for it.  True when want may load now.  A model larger
 * than the whole pool loads once every other has gone. */
static bool make_room(pt_server *s, pt_slot *want) {
    if (!s->o.pool_memory) return true;
    while (pool_used(s, want) + slot_bytes(want) > s->o.pool_memory) {
        pt_slot *idle = NULL, *busy = NULL;
        bool evicting = false;
        for (int i = 0; i < s->n_slots; i++) {
            pt_slot *m = &s->slots[i];
            evicting |= m->state == SLOT_EVICTING;
            if (m == want || m->state != SLOT_LOADED) continue;
            pt_slot **best = m->n_active ? &busy : &idle;
            if (!*best || m->last_used < (*best)->last_used) *best = m;
        }
        if (idle) {
            unload(s, idle, "least recently used, to make room");
        } else if (evicting) {
            return false; /* its requests are finishing */
        } else if (busy) {
            busy->state = SLOT_EVICTING;
            pt_server_log(s, "model %s: evicting once its %d request(s) finish, for %s", busy->id,
                          busy->n_active, want->id);
            return false;
        } else {
            return true; /* nothing else is loaded */
        }
    }
    return true;
}

/* Loads the model whose oldest waiting request came first, if no load is
 * under way and there is room (or room is being made). */
static void schedule(pt_server *s) {
    if (s->state != SRV_RUNNING || s->loader) return;
    pt_slot *want = NULL;
    for (int i = 0; i < s->n_slots; i++) {
        pt_slot *m = &s->slots[i];
        if (m->state == SLOT_UNLOADED && m->wait_head &&
            (!want || m->wait_head->t_arrival < want->wait_head->t_arrival))
            want = m;
    }
    if (!want || !make_room(s, want)) return;
    pt_err err = {{0}};
    if (pt_models_load(s, want, &err)) {
        fail_waiting(want, 500, "model_load_failed", err.msg);
        return;
    }
}

/* On the loop: the load returned. */
static void loaded_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    pt_server *s = arg;
    pt_loader *l = s->loader;
    pt_slot *m = l->m;
    pthread_join(l->thread, NULL);
    event_free(l->done);
    s->loader = NULL;
    bool first = s->state == SRV_LOADING;
    if (l->rc == 0) {
        m->e = l->e;
        m->state = SLOT_LOADED;
        if (pt_slot_start(s, m, &l->err) == 0) {
            m->load_seconds = pt_now() - l->t0;
            pthread_mutex_lock(&m->metrics.mu);
            m->metrics.loads++;
            pthread_mutex_unlock(&m->metrics.mu);
            m->created = (long)time(NULL);
            m->last_used = pt_now();
            if (s->n_slots > 1) /* one model: the start-up lines say it all */
                pt_server_log(s, "model %s: loaded in %.2f s, %.1f MiB (weights %.1f + KV %.1f)",
                          m->id, m->load_seconds, (double)slot_bytes(m) / (1 << 20),
                          (double)m->file_bytes / (1 << 20), (double)m->kv_bytes / (1 << 20));
        } else {
            pt_slot_stop(m);
            m->state = SLOT_UNLOADED;
            l->rc = -1;
        }
    } else {
        m->state = SLOT_UNLOADED;
    }
    if (first) {
        if (l->rc == 0) {
            pt_server_ready(s);
        } else { /* the server ends with the loader's message */
            snprintf(s->load_err.msg, sizeof s->load_err.msg, "%s", l->err.msg);
            s->load_failed = true;
            event_base_loopexit(s->base, NULL);
        }
        free(l);
        return;
    }
    if (l->rc) {
        char msg[sizeof m->id + sizeof l->err.msg + 32];
        snprintf(msg, sizeof msg, "the model '%s' did not load: %s", m->id, l->err.msg);
        pt_server_log(s, "%s", msg);
        fail_waiting(m, 500, "model_load_failed", msg);
    } else if (s->state != SRV_RUNNING) {
        fail_waiting(m, 503, "server_shutting_down", "the server is shutting down");
    } else {
        /* the actual footprint is known now: idle others go if it is over */
        while (s->o.pool_memory && pool_used(s, NULL) > s->o.pool_memory) {
            pt_slot *idle = NULL;
            for (int i = 0; i < s->n_slots; i++) {
                pt_slot *x = &s->slots[i];
                if (x != m && x->state == SLOT_LOADED && !x->n_active &&
                    (!idle || x->last_used < idle->last_used))
                    idle = x;
            }
            if (!idle) break;
            unload(s, idle, "the pool is over --pool-memory");
        }
        run_waiting(s, m);
    }
    free(l);
    schedule(s);
}

int pt_models_load(pt_server *s, pt_slot *m, pt_err *err) {
    pt_loader *l = pt_xcalloc(1, sizeof *l);
    l->s = s, l->m = m;
    l->t0 = pt_now();
    l->done = event_new(s->base, -1, 0, loaded_cb, s);
    if (!l->done) {
        free(l);
        return pt_fail(err, "cannot create the server's events");
    }
    m->state = SLOT_LOADING;
    s->loader = l;
    if (s->n_slots > 1) pt_server_log(s, "model %s: loading %s", m->id, m->path);
    if (pthread_create(&l->thread, NULL, load_main, l)) {
        event_free(l->done);
        free(l);
        s->loader = NULL;
        m->state = SLOT_UNLOADED;
        return pt_fail(err, "cannot start the model's loading thread");
    }
    return 0;
}

void pt_models_release(pt_server *s, pt_slot *m) {
    if (m->n_active || m->state != SLOT_EVICTING) return;
    unload(s, m, "evicted for another model");
    schedule(s); /* a request may be waiting for it, or for the room */
}

void pt_models_drain(pt_server *s) {
    for (int i = 0; i < s->n_slots; i++)
        fail_waiting(&s->slots[i], 503, "server_shutting_down", "the server is shutting down");
}

void pt_models_free(pt_server *s) {
    pt_loader *l = s->loader;
    if (l) { /* a load cannot be cut short */
        pthread_join(l->thread, NULL);
        if (l->e) pt_engine_close(l->e);
        event_free(l->done);
        free(l);
        s->loader = NULL;
    }
    for (int i = 0; i < s->n_slots; i++) {
        pt_slot *m = &s->slots[i];
        while (m->wait_head)
            pending_free(m->wait_head);
        pt_slot_stop(m);
        pt_metrics_free(&m->metrics);
    }
    free(s->slots);
    s->slots = NULL;
    s->n_slots = 0;
}
