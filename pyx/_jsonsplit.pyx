# cython: language_level=3
"""Where a large JSON text may be cut (csrc/include/bubo/jsonsplit.h), found without the GIL."""
from libc.stdint cimport int64_t
from libc.stdlib cimport free

from common cimport *
from jsonsplit cimport *

include "status.pxi"

OPEN, RUN, CLOSE = 0, 1, 2
UNTERMINATED_STRING, UNMATCHED, UNCLOSED, TOO_DEEP = 1, 2, 3, 4


def split(const unsigned char[::1] text, int64_t large, int64_t run, int max_depth):
    """(pieces, why, where): pieces a list of (kind, a, b), in character positions; why 0, or
    the reason the text's brackets or strings do not close (where: a character position)."""
    cdef bubo_json_piece *pieces = NULL
    cdef size_t n = 0, i
    cdef int why = 0
    cdef int64_t where = -1
    cdef bubo_err err
    cdef bubo_status status
    cdef const char *data = NULL
    cdef size_t length = text.shape[0]
    if length:
        data = <const char *>&text[0]
    with nogil:
        status = bubo_json_split(data, length, large, run, max_depth, &pieces, &n, &why, &where, &err)
    check_status(status, &err, None)
    try:
        out = [(pieces[i].kind, pieces[i].a, pieces[i].b) for i in range(n)]
    finally:
        free(pieces)
    return out, why, where
