# Mirrors csrc/include/bubo/jsonsplit.h
from libc.stdint cimport int64_t

from common cimport bubo_status, bubo_err

cdef extern from "bubo/jsonsplit.h" nogil:
    ctypedef struct bubo_json_piece:
        int64_t kind
        int64_t a
        int64_t b

    bubo_status bubo_json_split(const char *text, size_t len, int64_t large, int64_t run, int max_depth,
                                bubo_json_piece **pieces, size_t *n, int *why, int64_t *where, bubo_err *err)
