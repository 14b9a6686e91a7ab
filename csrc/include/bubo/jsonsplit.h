/* Where a large JSON text may be cut, so that a JSON parser never reads much of it in one call.
 *
 * Python's json parser holds the GIL from the start of a text to its end: 4 MB of small values
 * is 60 ms during which no other thread of the server runs. bubo_json_split finds, without the
 * GIL, the text's large arrays and objects (LARGE characters or more, nested in each other) and
 * cuts each into runs of whole members, about RUN characters each, which the caller parses one
 * call at a time and joins (bubo/api/jsonin.py).
 *
 * The scan knows strings (with their escapes) and brackets, nothing else: tokens, commas and
 * colons between runs are left to the caller's parser and its checks of the text between the
 * pieces. Positions are in characters (code points) of the UTF-8 text, as Python counts them. */
#ifndef BUBO_JSONSPLIT_H
#define BUBO_JSONSPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BUBO_JSON_OPEN = 0,  /* a large array or object: a = its '[' or '{', b = its ']' or '}' */
    BUBO_JSON_RUN = 1,   /* whole members of the innermost open one: a = just past its '[', '{' or a
                          * ',' of its own; b = one of its own ',' or its closing bracket */
    BUBO_JSON_CLOSE = 2, /* the end of the innermost open one: a = b = its closing bracket */
} bubo_json_piece_kind;

typedef struct {
    int64_t kind; /* bubo_json_piece_kind */
    int64_t a, b;
} bubo_json_piece;

typedef enum {
    BUBO_JSON_SPLIT_OK = 0,
    BUBO_JSON_UNTERMINATED_STRING = 1, /* where: the string's opening quote */
    BUBO_JSON_UNMATCHED = 2,           /* where: a ']' or '}' that closes nothing open, or the other kind */
    BUBO_JSON_UNCLOSED = 3,            /* where: the '[' or '{' still open at the text's end */
    BUBO_JSON_TOO_DEEP = 4,            /* where: the '[' or '{' nested max_depth + 1 deep */
} bubo_json_split_why;

/* The pieces of text (len bytes of UTF-8) in order, in *pieces (malloc'd, the caller frees it;
 * NULL and *n = 0 when nothing is large). A text whose brackets or strings do not close, or
 * that nests deeper than max_depth, sets *why and *where (a character position) and returns
 * BUBO_OK with no pieces. BUBO_ERR_INVALID for large, run or max_depth < 1; BUBO_ERR_NOMEM. */
bubo_status bubo_json_split(const char *text, size_t len, int64_t large, int64_t run, int max_depth,
                            bubo_json_piece **pieces, size_t *n, int *why, int64_t *where, bubo_err *err);

#ifdef __cplusplus
}
#endif
#endif
