/*
 * front.c - the front worker: renders chat templates and tokenizes prompts
 * off the event loop, so a long prompt never stalls other connections'
 * streams, then submits the job to the scheduler (pt_front_work in
 * completion.c does the work; this file owns the thread and its queue).
 *
 * One thread: tokenization is cheap next to a forward, and the tokenizer's
 * matcher state is then used by one thread only.  Requests are taken in
 * arrival order, so submission order (and FIFO admission) is kept.
 */
#include <stdlib.h>

#include "server/server_int.h"

typedef struct item {
    struct item *next;
    pt_req *q;
} item;

struct pt_front {
    pt_server *s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail; /* under mu */
    bool quit;         /* under mu */
};

static void *front_main(void *arg) {
    pt_front *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        while (!f->head && !f->quit) pthread_cond_wait(&f->cv, &f->mu);
        item *it = f->head;
        if (it) {
            f->head = it->next;
            if (!f->head) f->tail = NULL;
        }
        bool quit = f->quit;
        pthread_mutex_unlock(&f->mu);
        if (!it) break; /* quit, and the queue is empty */
        pt_front_work(f->s, it->q, quit);
        free(it);
    }
    return NULL;
}

int pt_front_start(pt_server *s, pt_err *err) {
    pt_front *f = pt_xcalloc(1, sizeof *f);
    f->s = s;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (pthread_create(&f->thread, NULL, front_main, f)) {
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
        free(f);
        return pt_fail(err, "cannot start the prompt worker thread");
    }
    s->front = f;
    return 0;
}

void pt_front_push(pt_server *s, pt_req *q) {
    pt_front *f = s->front;
    item *it = pt_xmalloc(sizeof *it);
    it->next = NULL;
    it->q = q;
    pthread_mutex_lock(&f->mu);
    if (f->tail)
        f->tail->next = it;
    else
        f->head = it;
    f->tail = it;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

void pt_front_stop(pt_server *s) {
    pt_front *f = s->front;
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->quit = true;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->thread, NULL); /* what was queued is answered "shutting down" */
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    s->front = NULL;
}
