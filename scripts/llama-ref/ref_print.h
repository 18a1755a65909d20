/*
 * ref_print.h - what llama_ref_logits.c and petrel_logits.c share: token
 * lists in, JSON rows of logits out, the argmax and its margin.  Both
 * print the same JSON (record.py and crosscheck.py read either), so the
 * printing lives once, here.  The including file defines REF_TOOL, its
 * name in error messages.
 */
#ifndef PETREL_REF_PRINT_H
#define PETREL_REF_PRINT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline void die(const char *msg) {
    fprintf(stderr, "%s: %s\n", REF_TOOL, msg);
    exit(1);
}

/* "1,2,3" into ids (at most cap); the count. */
static inline int parse_ids(const char *s, int32_t *ids, int cap) {
    int n = 0;
    for (char *end; *s; s = *end == ',' ? end + 1 : end) {
        long v = strtol(s, &end, 10);
        if (end == s || n == cap) die("bad token list");
        ids[n++] = (int32_t)v;
    }
    return n;
}

static inline void print_row(const float *x, int n) {
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ",%.9g" : "%.9g", x[i]);
    putchar(']');
}

static inline int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Top logit minus the runner-up: how safe the argmax is against rounding. */
static inline double margin(const float *x, int n) {
    int b = argmax(x, n);
    float second = -1e30f;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return (double)x[b] - second;
}

static inline void print_ids(const char *key, const int32_t *ids, int n) {
    printf("\"%s\":[", key);
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    putchar(']');
}

#endif
