/*
 * tok_merge.c - the merge loop that SentencePiece-style and BPE encoding
 * share.
 *
 * A word starts as a doubly linked list of symbols (characters or bytes).
 * Every adjacent pair that could merge goes into a binary heap keyed by its
 * cost (BPE: the merge's rank; SPM: minus the merged piece's score), ties
 * broken by the leftmost position.  We pop the cheapest candidate, skip it
 * if either side has changed since it was pushed, merge the right symbol
 * into the left one, and push the two new pairs around the result.  This is
 * O(n log n) per word and gives exactly the order of llama.cpp's SPM
 * session and of the heap-based BPE in Hugging Face's tokenizers (both
 * Rust and JS): symbol indices equal original character positions, because
 * a merged symbol keeps the index of its left part.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>

void tok_sym_push(tok_work *w, int32_t off, int32_t len, int32_t id) {
    if (w->n_syms == w->cap_syms) {
        w->cap_syms = w->cap_syms ? w->cap_syms * 2 : 64;
        w->syms = pt_xrealloc(w->syms, w->cap_syms * sizeof *w->syms);
    }
    int32_t i = (int32_t)w->n_syms++;
    w->syms[i] = (tok_sym){off, len, id, i - 1, -1};
    if (i > 0) w->syms[i - 1].next = i;
}

static bool cand_before(const tok_cand *a, const tok_cand *b) {
    return a->cost < b->cost || (a->cost == b->cost && a->left < b->left);
}

static void heap_push(tok_work *w, tok_cand c) {
    if (w->n_heap == w->cap_heap) {
        w->cap_heap = w->cap_heap ? w->cap_heap * 2 : 64;
        w->heap = pt_xrealloc(w->heap, w->cap_heap * sizeof *w->heap);
    }
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
}

static tok_cand heap_pop(tok_work *w) {
    tok_cand top = w->heap[0];
    tok_cand last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&w->heap[child + 1], &w->heap[child])) child++;
        if (!cand_before(&w->heap[child], &last)) break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void try_pair(const pt_tokenizer *t, const char *word, tok_work *w, int32_t left,
                     tok_pair_fn pair) {
    if (left < 0) return;
    int32_t right = w->syms[left].next;
    if (right < 0) return;
    const tok_sym *l = &w->syms[left], *r = &w->syms[right];
    tok_cand c = {0, left, right, l->len + r->len, -1};
    if (pair(t, word, l, r, &c.cost, &c.id)) heap_push(w, c);
}

void tok_merge(const pt_tokenizer *t, const char *word, tok_work *w, tok_pair_fn pair) {
    w->n_heap = 0;
    for (int32_t i = 0; i + 1 < (int32_t)w->n_syms; i++) try_pair(t, word, w, i, pair);
    while (w->n_heap) {
        tok_cand c = heap_pop(w);
        tok_sym *l = &w->syms[c.left], *r = &w->syms[c.right];
        /* Stale: one side was merged into something else since the push. */
        if (!l->len || !r->len || l->next != c.right || l->len + r->len != c.size) continue;
        l->len += r->len;
        l->id = c.id;
        l->next = r->next;
        r->len = 0;
        if (r->next >= 0) w->syms[r->next].prev = c.left;
        try_pair(t, word, w, l->prev, pair);
        try_pair(t, word, w, c.left, pair);
    }
}

void tok_work_free(tok_work *w) {
    free(w->syms);
    free(w->heap);
    free(w->tmp.s);
    memset(w, 0, sizeof *w);
}
