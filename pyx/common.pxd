# Mirrors csrc/include/bubo/common.h
cdef extern from "bubo/common.h" nogil:
    ctypedef enum bubo_status:
        BUBO_OK
        BUBO_ERR_IO
        BUBO_ERR_FORMAT
        BUBO_ERR_UNSUPPORTED
        BUBO_ERR_NOMEM
        BUBO_ERR_INVALID

    ctypedef struct bubo_err:
        char msg[512]
