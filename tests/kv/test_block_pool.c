/*
 * test_block_pool.c - the block pool's states and transitions, and the
 * sequence operations built on it: fork (shared pages, copy on write) and
 * rollback (truncate frees exactly the pages past the position).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kv/kvcache.h"

/* Eviction order: empty blocks first, then cached ones least recently
 * freed first; a hit on a cached free block revives it with its content. */
static void test_eviction_order(void **state) {
    (void)state;
    pt_err err;
    pt_block_pool p;
    assert_int_equal(pt_block_pool_init(&p, 4, &err), 0);
    int32_t b[4];
    for (int i = 0; i < 4; i++) assert_int_equal(b[i] = pt_block_alloc(&p), i);
    assert_int_equal(pt_block_alloc(&p), -1);
    assert_int_equal(p.n_free, 0);

    pt_block_set_hash(&p, b[0], 100);
    pt_block_set_hash(&p, b[1], 101);
    pt_block_unref(&p, b[1]); /* cached, freed first */
    pt_block_unref(&p, b[0]); /* cached, freed second */
    pt_block_unref(&p, b[2]); /* empty: evicted before any cached one */
    assert_int_equal(p.n_free, 3);
    assert_int_equal(p.n_cached, 2);
    assert_int_equal(pt_block_lookup(&p, 100), b[0]);
    assert_int_equal(pt_block_lookup(&p, 101), b[1]);

    assert_int_equal(pt_block_alloc(&p), b[2]);
    /* a hit takes b[0] out of the queue: the next eviction is b[1] */
    pt_block_ref(&p, b[0]);
    assert_int_equal(pt_block_refs(&p, b[0]), 1);
    assert_int_equal(p.n_free, 1);
    assert_int_equal(p.n_cached, 1);
    assert_int_equal(pt_block_alloc(&p), b[1]);
    assert_int_equal(pt_block_lookup(&p, 101), -1); /* its content is gone */
    assert_int_equal(p.n_cached, 0);
    assert_int_equal(pt_block_lookup(&p, 100), b[0]); /* held, still findable */
    assert_int_equal(pt_block_alloc(&p), -1);
    pt_block_pool_free(&p);
}

/* The hash map keeps every registered hash findable through many
 * insertions and evictions (backward-shift deletion must not lose any). */
static void test_hash_map_churn(void **state) {
    (void)state;
    pt_err err;
    enum { N = 64 };
    pt_block_pool p;
    assert_int_equal(pt_block_pool_init(&p, N, &err), 0);
    uint64_t want[N] = {0};
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 2000; round++) {
        int32_t id = pt_block_alloc(&p);
        if (id < 0) { /* full: free a pseudo-random held block */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int32_t victim = (int32_t)(x % N);
            while (pt_block_refs(&p, victim) == 0) victim = (victim + 1) % N;
            pt_block_unref(&p, victim);
            continue;
        }
        want[id] = 0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* collide on purpose: many hashes share their low bits */
        uint64_t h = ((x % 16) << 40) | (uint64_t)(round + 1);
        pt_block_set_hash(&p, id, h);
        want[id] = h;
        for (int i = 0; i < N; i++)
            if (want[i] && p.hash[i] == want[i]) assert_int_equal(pt_block_lookup(&p, want[i]), i);
    }
    pt_block_pool_free(&p);
}

static void test_chained_hash(void **state) {
    (void)state;
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    uint64_t ha = pt_block_hash(0, a, 4, 7), hb = pt_block_hash(0, b, 4, 7);
    assert_true(ha != hb);
    assert_true(ha == pt_block_hash(0, a, 4, 7));
    assert_true(pt_block_hash(ha, a, 4, 7) != pt_block_hash(hb, a, 4, 7)); /* parent counts */
    assert_true(pt_block_hash(0, a, 4, 7) != pt_block_hash(0, a, 4, 8));   /* salt counts */
}

/* ---- sequences over the pool -------------------------------------------- */

typedef struct {
    pt_backend *be;
    pt_kv_cache kv;
} fixture;

static void fixture_init(fixture *f, int n_pages) {
    pt_err err;
    f->be = pt_backend_cpu_new(1, "portable", &err);
    assert_non_null(f->be);
    pt_kv_config c = {.n_layers = 2, .n_kv_heads = 1, .head_dim = 4, .page_size = 4,
                      .n_pages = n_pages, .dtype = PT_F32};
    assert_int_equal(pt_kv_cache_init(&f->kv, f->be, &c, &err), 0);
}

static void fixture_free(fixture *f) {
    pt_kv_cache_free(&f->kv);
    f->be->ops->destroy(f->be);
}

/* Fills position pos of layer l's K with value v (f32, 4 per position). */
static void put(fixture *f, const pt_kv_seq *s, int l, int pos, float v) {
    float *k = f->kv.k[l];
    int32_t page = s->pages[pos / 4];
    for (int d = 0; d < 4; d++) k[((size_t)page * 4 + pos % 4) * 4 + d] = v;
}

static float get(fixture *f, const pt_kv_seq *s, int l, int pos) {
    const float *k = f->kv.k[l];
    return k[((size_t)s->pages[pos / 4] * 4 + pos % 4) * 4];
}

static void test_fork_copy_on_write(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 8);
    pt_err err;
    pt_kv_seq a = {0}, b = {0};
    assert_int_equal(pt_kv_seq_own(&f.kv, &a, 0, 6, &err), 0); /* 2 pages */
    for (int p = 0; p < 6; p++)
        for (int l = 0; l < 2; l++) put(&f, &a, l, p, (float)(10 * l + p));
    a.n_tokens = 6;
    pt_kv_seq_fork(&f.kv, &b, &a);
    assert_int_equal(pt_kv_free_pages(&f.kv), 6); /* shared, nothing copied */
    assert_int_equal(b.n_tokens, 6);
    assert_int_equal(b.pages[0], a.pages[0]);
    assert_int_equal(pt_block_refs(&f.kv.pool, a.pages[1]), 2);

    /* b writes position 6: only the shared partial page is copied */
    assert_int_equal(pt_kv_seq_pages_needed(&f.kv, &b, 6, 7), 1);
    assert_int_equal(pt_kv_seq_own(&f.kv, &b, 6, 7, &err), 0);
    assert_int_equal(pt_kv_free_pages(&f.kv), 5);
    assert_int_equal(b.pages[0], a.pages[0]);
    assert_int_not_equal(b.pages[1], a.pages[1]);
    for (int l = 0; l < 2; l++) put(&f, &b, l, 5, -1.0f), put(&f, &b, l, 6, -2.0f);
    for (int l = 0; l < 2; l++) {
        assert_true(get(&f, &a, l, 5) == (float)(10 * l + 5)); /* a unchanged */
        assert_true(get(&f, &b, l, 4) == (float)(10 * l + 4)); /* copied content */
        assert_true(get(&f, &b, l, 0) == (float)(10 * l));     /* still shared */
    }
    /* writing past a full page needs a new page, not a copy */
    assert_int_equal(pt_kv_seq_pages_needed(&f.kv, &a, 8, 9), 1);
    pt_kv_seq_release(&f.kv, &a);
    assert_int_equal(pt_block_refs(&f.kv.pool, b.pages[0]), 1);
    pt_kv_seq_release(&f.kv, &b);
    assert_int_equal(pt_kv_free_pages(&f.kv), 8);
    fixture_free(&f);
}

static void test_rollback(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f, 8);
    pt_err err;
    pt_kv_seq a = {0};
    assert_int_equal(pt_kv_seq_own(&f.kv, &a, 0, 17, &err), 0); /* 5 pages */
    a.n_tokens = 17;
    int32_t kept[3] = {a.pages[0], a.pages[1], a.pages[2]};
    pt_block_set_hash(&f.kv.pool, a.pages[0], 42);
    pt_kv_seq_truncate(&f.kv, &a, 9); /* keeps ceil(9/4) = 3 pages */
    assert_int_equal(a.n_pages, 3);
    assert_int_equal(a.n_tokens, 9);
    assert_int_equal(pt_kv_free_pages(&f.kv), 5);
    for (int i = 0; i < 3; i++) assert_int_equal(a.pages[i], kept[i]);
    pt_kv_seq_truncate(&f.kv, &a, 8); /* exactly 2 pages */
    assert_int_equal(a.n_pages, 2);
    assert_int_equal(pt_kv_free_pages(&f.kv), 6);
    /* a freed hashed page stays findable until reused */
    pt_kv_seq_release(&f.kv, &a);
    assert_int_equal(pt_block_lookup(&f.kv.pool, 42), kept[0]);
    assert_int_equal(pt_kv_free_pages(&f.kv), 8);
    /* full pool: own fails cleanly and changes nothing */
    pt_kv_seq big = {0};
    assert_int_not_equal(pt_kv_seq_own(&f.kv, &big, 0, 40, &err), 0);
    assert_int_equal(big.n_pages, 0);
    assert_int_equal(pt_kv_free_pages(&f.kv), 8);
    pt_kv_seq_release(&f.kv, &big);
    fixture_free(&f);
}

/* A page saved to host memory and loaded into another page (of another
 * cache of the same format) reads back identically, every layer. */
static void test_page_save_load(void **state) {
    (void)state;
    fixture a, b;
    fixture_init(&a, 4);
    fixture_init(&b, 4);
    pt_err err;
    pt_kv_seq s = {0};
    assert_int_equal(pt_kv_seq_own(&a.kv, &s, 0, 8, &err), 0);
    for (int p = 0; p < 8; p++)
        for (int l = 0; l < 2; l++) put(&a, &s, l, p, (float)(100 * l + p));
    float *v = a.kv.v[1];
    v[(size_t)s.pages[1] * 16 + 3] = 42.0f; /* V too */
    size_t n = pt_kv_page_bytes(&a.kv);
    assert_int_equal(n, 2 * 2 * 4 * 4 * sizeof(float)); /* layers x K,V x positions x dims */
    void *host = malloc(n);
    pt_kv_page_save(&a.kv, s.pages[1], host);
    pt_kv_page_load(&b.kv, 3, host);
    pt_kv_seq t = {.pages = (int32_t[]){0, 3}, .n_pages = 2};
    for (int p = 4; p < 8; p++)
        for (int l = 0; l < 2; l++) assert_true(get(&b, &t, l, p) == (float)(100 * l + p));
    assert_true(((float *)b.kv.v[1])[3 * 16 + 3] == 42.0f);
    free(host);
    pt_kv_seq_release(&a.kv, &s);
    fixture_free(&a);
    fixture_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_hash_map_churn),
        cmocka_unit_test(test_chained_hash),
        cmocka_unit_test(test_fork_copy_on_write),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test(test_page_save_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
