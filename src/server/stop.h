/*
 * stop.h - matching the `stop` strings of a request against generated text.
 *
 * Tokens do not respect stop strings: "END" may arrive as "E" + "ND", or
 * inside a token as "x.\nEND".  The caller therefore keeps the text it has
 * not yet released in a buffer, appends each token's text, and asks
 * pt_stop_scan how much of it is final:
 *
 *   - if a stop string occurs, the text before it is final and generation
 *     ends (the stop string itself is never shown); of several, the one
 *     complete first wins, as it would in a stream;
 *   - otherwise the longest tail that could still grow into a stop string is
 *     held back and everything before it is released.
 *
 * Released text never contains a stop string nor a prefix of one at its end,
 * so a match can only start in the unreleased buffer and scanning it alone
 * is enough.  A held-back tail starts where a stop string starts, so it never
 * splits a UTF-8 character when the stop strings are valid UTF-8.
 */
#ifndef PETREL_STOP_H
#define PETREL_STOP_H

#include "base/base.h"

#define PT_STOP_MAX 16      /* stop strings per request */
#define PT_STOP_MAX_LEN 512 /* bytes per stop string */

typedef struct pt_stop {
    char *str[PT_STOP_MAX];
    size_t len[PT_STOP_MAX];
    int n;
} pt_stop;

/* Adds a stop string (copied).  Empty strings are ignored: they would match
 * before any text.  Returns -1 if there are too many or one is too long. */
int pt_stop_add(pt_stop *st, const char *s, size_t len, pt_err *err);
void pt_stop_free(pt_stop *st);

/* Scans text[0..len): the text not released yet.  Returns how many leading
 * bytes may be released now; *matched tells whether a stop string begins
 * right after them. */
size_t pt_stop_scan(const pt_stop *st, const char *text, size_t len, bool *matched);

#endif
