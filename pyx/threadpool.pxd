# Mirrors csrc/include/bubo/threadpool.h
from common cimport bubo_status, bubo_err

cdef extern from "bubo/threadpool.h" nogil:
    ctypedef struct bubo_pool:
        pass
    ctypedef void (*bubo_pool_fn)(void *ctx, int ith, int nth) noexcept nogil

    int BUBO_POOL_MAX_THREADS

    bubo_status bubo_pool_create(int n_threads, bubo_pool **out, bubo_err *err)
    void bubo_pool_free(bubo_pool *pool)
    int bubo_pool_n_threads(const bubo_pool *pool)
    int bubo_pool_capacity(const bubo_pool *pool)
    void bubo_pool_set_active(bubo_pool *pool, int n)
    void bubo_pool_run(bubo_pool *pool, bubo_pool_fn fn, void *ctx)
    void bubo_pool_barrier(bubo_pool *pool)
