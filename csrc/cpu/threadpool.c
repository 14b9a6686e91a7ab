/* The persistent thread pool (bubo/threadpool.h).
 *
 * Every wait in the pool is "until this counter moves past the value I saw": workers wait for
 * the run generation, the caller for the done generation, barrier arrivals for the barrier
 * generation. One helper does all three, spin-then-park: poll the counter for a while (a decode
 * step issues runs microseconds apart, and a futex round trip would cost more than the work),
 * then sleep on a condition variable.
 *
 * No wakeup is lost without taking the mutex on the fast path: a waiter announces itself
 * (parked++) and then re-reads the counter; a waker bumps the counter and then reads parked.
 * Both pairs are sequentially consistent, so at least one side sees the other: either the
 * waiter sees the new value and never sleeps, or the waker sees parked > 0 and broadcasts under
 * the mutex, which the waiter holds from its announcement until it is inside pthread_cond_wait. */
#define _POSIX_C_SOURCE 200809L /* pthread_sigmask, clock_gettime under -std=c11 */
#include "bubo/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* Poll with pause for SPIN_NS (the waits inside a burst of runs are a few microseconds), then
 * poll with sched_yield, which hands the core over when threads outnumber cores, until YIELD_NS,
 * then sleep. The clock is read once per CLOCK_EVERY polls. */
#define SPIN_NS 20000
#define YIELD_NS 200000
#define CLOCK_EVERY 64

/* A counter that moves forward, the sleepers waiting for it to move, and their condvar. */
typedef struct {
    _Atomic uint32_t gen;
    _Atomic int parked;
    pthread_cond_t cond;
} pool_event;

struct bubo_pool {
    int n_threads;             /* the capacity: the caller and n_threads - 1 workers */
    _Atomic int n_active;      /* threads a run uses (bubo_pool_set_active), written between runs */
    pthread_t *workers; /* [n_threads - 1] */
    pthread_mutex_t run_lock;  /* serializes bubo_pool_run callers */
    pthread_mutex_t park_lock; /* guards every sleep; see the comment at the top */

    /* the current run, written by the caller before it bumps `start` */
    bubo_pool_fn fn;
    void *ctx;
    int stop;

    pool_event start;          /* bumped once per run (and to stop) */
    pool_event done;           /* bumped by the last worker to finish a run */
    _Atomic int n_running;     /* workers still inside the current run */
    pool_event barrier;        /* bumped by the last thread to arrive at a barrier */
    _Atomic int barrier_count; /* threads arrived at the current barrier */
};

typedef struct {
    bubo_pool *pool;
    int ith;
} worker_arg;

static void event_init(pool_event *e) {
    atomic_init(&e->gen, 0);
    atomic_init(&e->parked, 0);
    pthread_cond_init(&e->cond, NULL);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Return once e->gen differs from seen. */
static void event_wait(bubo_pool *pool, pool_event *e, uint32_t seen) {
    const int64_t start = now_ns();
    for (int64_t elapsed = 0; elapsed < YIELD_NS; elapsed = now_ns() - start) {
        for (int i = 0; i < CLOCK_EVERY; i++) {
            if (atomic_load_explicit(&e->gen, memory_order_acquire) != seen) return;
            if (elapsed < SPIN_NS)
                cpu_relax();
            else
                sched_yield();
        }
    }
    pthread_mutex_lock(&pool->park_lock);
    atomic_fetch_add(&e->parked, 1);
    while (atomic_load(&e->gen) == seen) pthread_cond_wait(&e->cond, &pool->park_lock);
    atomic_fetch_sub(&e->parked, 1);
    pthread_mutex_unlock(&pool->park_lock);
}

/* Move e->gen on and wake whoever sleeps on it. */
static void event_signal(bubo_pool *pool, pool_event *e) {
    atomic_fetch_add(&e->gen, 1);
    if (atomic_load(&e->parked) > 0) {
        pthread_mutex_lock(&pool->park_lock);
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&pool->park_lock);
    }
}

static void *worker_main(void *varg) {
    worker_arg *arg = varg;
    bubo_pool *pool = arg->pool;
    const int ith = arg->ith;
    free(arg);
#if defined(__linux__)
    prctl(PR_SET_NAME, "bubo-pool", 0, 0, 0); /* top -H and /proc/PID/task/TID/comm tell the engine's threads */
#endif
    uint32_t seen = 0;
    for (;;) {
        event_wait(pool, &pool->start, seen);
        seen++; /* runs never overlap: the caller waits for every worker before the next bump */
        if (pool->stop) break;
        const int nth = atomic_load_explicit(&pool->n_active, memory_order_relaxed); /* set before the bump */
        if (ith < nth) pool->fn(pool->ctx, ith, nth);
        /* every worker reports every run, active or not: none falls behind the run count */
        if (atomic_fetch_sub(&pool->n_running, 1) == 1) event_signal(pool, &pool->done);
    }
    return NULL;
}

static void stop_workers(bubo_pool *pool, int n_started) {
    pool->stop = 1;
    event_signal(pool, &pool->start);
    for (int i = 0; i < n_started; i++) pthread_join(pool->workers[i], NULL);
}

bubo_status bubo_pool_create(int n_threads, bubo_pool **out, bubo_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > BUBO_POOL_MAX_THREADS)
        return bubo_set_err(err, BUBO_ERR_INVALID, "thread count %d is outside 1..%d", n_threads, BUBO_POOL_MAX_THREADS);
    bubo_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return bubo_set_err(err, BUBO_ERR_NOMEM, "thread pool: out of memory");
    pool->n_threads = n_threads;
    atomic_init(&pool->n_active, n_threads);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        free(pool);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "thread pool: out of memory");
    }
    pthread_mutex_init(&pool->run_lock, NULL);
    pthread_mutex_init(&pool->park_lock, NULL);
    event_init(&pool->start);
    event_init(&pool->done);
    event_init(&pool->barrier);
    atomic_init(&pool->n_running, 0);
    atomic_init(&pool->barrier_count, 0);

    /* Workers inherit a fully blocked signal mask: signals (Ctrl-C) go to the host's threads,
     * which know what to do with them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0;
    bubo_status status = BUBO_OK;
    for (; started < n_threads - 1; started++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            status = bubo_set_err(err, BUBO_ERR_NOMEM, "thread pool: out of memory");
            break;
        }
        arg->pool = pool;
        arg->ith = started + 1;
        int rc = pthread_create(&pool->workers[started], NULL, worker_main, arg);
        if (rc != 0) {
            free(arg);
            status = bubo_set_err(err, BUBO_ERR_NOMEM, "thread pool: cannot start thread %d of %d (error %d)",
                                  started + 1, n_threads, rc);
            break;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (status != BUBO_OK) {
        stop_workers(pool, started);
        pool->n_threads = 0; /* tells bubo_pool_free the workers are gone */
        bubo_pool_free(pool);
        return status;
    }
    *out = pool;
    return BUBO_OK;
}

void bubo_pool_free(bubo_pool *pool) {
    if (!pool) return;
    if (pool->n_threads > 1) stop_workers(pool, pool->n_threads - 1);
    pthread_cond_destroy(&pool->start.cond);
    pthread_cond_destroy(&pool->done.cond);
    pthread_cond_destroy(&pool->barrier.cond);
    pthread_mutex_destroy(&pool->park_lock);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool->workers);
    free(pool);
}

int bubo_pool_n_threads(const bubo_pool *pool) { return atomic_load(&pool->n_active); }

int bubo_pool_capacity(const bubo_pool *pool) { return pool->n_threads; }

void bubo_pool_set_active(bubo_pool *pool, int n) {
    if (n < 1) n = 1;
    if (n > pool->n_threads) n = pool->n_threads;
    if (atomic_load(&pool->n_active) == n) return;
    pthread_mutex_lock(&pool->run_lock); /* never during a run */
    atomic_store(&pool->n_active, n);
    pthread_mutex_unlock(&pool->run_lock);
}

void bubo_pool_run(bubo_pool *pool, bubo_pool_fn fn, void *ctx) {
    if (atomic_load(&pool->n_active) == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->run_lock);
    const int nth = atomic_load(&pool->n_active);
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->n_running, pool->n_threads - 1);
    const uint32_t done_seen = atomic_load(&pool->done.gen);
    event_signal(pool, &pool->start); /* publishes fn, ctx and n_active: the bump is a release */
    fn(ctx, 0, nth);
    event_wait(pool, &pool->done, done_seen);
    pthread_mutex_unlock(&pool->run_lock);
}

void bubo_pool_barrier(bubo_pool *pool) {
    const int nth = atomic_load(&pool->n_active); /* fixed for the run */
    if (nth == 1) return;
    /* Read before arriving: the generation cannot move until this thread has arrived. */
    const uint32_t seen = atomic_load(&pool->barrier.gen);
    if (atomic_fetch_add(&pool->barrier_count, 1) == nth - 1) {
        /* Reset before releasing: nobody arrives at the next barrier until the bump. */
        atomic_store(&pool->barrier_count, 0);
        event_signal(pool, &pool->barrier);
    } else {
        event_wait(pool, &pool->barrier, seen);
    }
}
