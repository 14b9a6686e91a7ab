/* A persistent thread pool: n threads counting the caller, started once, reused by every op.
 *
 * bubo_pool_run(pool, fn, ctx) runs fn(ctx, ith, nth) on every thread (ith 0 is the caller) and
 * returns when all have returned. Between runs the workers spin briefly, then sleep on a
 * condition variable, so a burst of small runs (a decode step) costs no syscalls while an idle
 * pool costs no CPU. A run allocates nothing.
 *
 * Inside fn, bubo_pool_barrier(pool) waits until all nth threads of the run reach it: one run
 * can hold several dependent phases (quantize the activations, then multiply).
 *
 * bubo_pool_set_active(pool, n) makes the next runs use n of the threads (llama.cpp's -t for a
 * decode step against -tb for a prompt): fn sees nth = n; the other workers still wake for each
 * run, do nothing and report done, so that every worker keeps counting the same runs. */
#ifndef BUBO_THREADPOOL_H
#define BUBO_THREADPOOL_H

#include "bubo/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bubo_pool bubo_pool;

/* One share of a run: thread ith of nth. */
typedef void (*bubo_pool_fn)(void *ctx, int ith, int nth);

#define BUBO_POOL_MAX_THREADS 512

/* Start n_threads - 1 workers (1 <= n_threads <= BUBO_POOL_MAX_THREADS); all of them active. */
bubo_status bubo_pool_create(int n_threads, bubo_pool **out, bubo_err *err);
/* Stop and join the workers. NULL is fine. */
void bubo_pool_free(bubo_pool *pool);
/* The threads the runs use now (the nth fn sees), counting the caller. */
int bubo_pool_n_threads(const bubo_pool *pool);
/* The threads the pool has: the most bubo_pool_set_active may ask for. */
int bubo_pool_capacity(const bubo_pool *pool);
/* Use n threads (clamped to 1..capacity) from the next run on. Not from inside fn. */
void bubo_pool_set_active(bubo_pool *pool, int n);

/* Run fn on all threads and wait for them. Calls from several threads are serialized. fn must
 * not call bubo_pool_run on the same pool. */
void bubo_pool_run(bubo_pool *pool, bubo_pool_fn fn, void *ctx);
/* Only from inside fn, reached by all threads of the run the same number of times. */
void bubo_pool_barrier(bubo_pool *pool);

#ifdef __cplusplus
}
#endif
#endif
