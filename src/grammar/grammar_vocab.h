/*
 * grammar_vocab.h - the vocabulary trie's layout (vocab.c), read by the
 * matcher's mask walk.
 */
#ifndef PETREL_GRAMMAR_VOCAB_H
#define PETREL_GRAMMAR_VOCAB_H

#include "grammar/grammar_int.h"

#define PT_GVOCAB_MAX_LEN 1024

struct pt_gvocab {
    int n_vocab, n_words;
    size_t *off;       /* [n_vocab] token bytes in blob */
    uint32_t *len;     /* [n_vocab] 0: never allowed */
    char *blob;
    int32_t *dup_next; /* [n_vocab] next id with the same bytes, -1 */
    uint8_t *tbyte;    /* trie, preorder: byte of node i */
    int32_t *ttok;     /* first token ending at node i, -1 */
    int32_t *tend;     /* one past node i's subtree */
    int n_nodes;
};

#endif
