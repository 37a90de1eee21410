/* A tiny persistent pthread pool for warmpath.models._paged (native/taskpool.c).
 *
 * Why not OpenMP: torch bundles its own libgomp; a second OpenMP runtime in the same process
 * would keep its own spinning threads and fight torch's for the cores. These threads sleep
 * on a condition variable between calls. */
#ifndef WARMPATH_TASKPOOL_H
#define WARMPATH_TASKPOOL_H

/* One call's work: run(ctx, i) for every task i in [0, ntasks), each exactly once, in any
 * order and on any thread (so a task's result must not depend on which thread runs it). */
typedef void (*pool_task_fn)(void *ctx, long i, void *scratch);

/* Runs the tasks on the calling thread and up to nthreads - 1 pool threads (created on first
 * need, at most POOL_MAX); returns when every task has finished. Each participant gets its
 * own scratch buffer of scratch_bytes (malloc'd per call). One call at a time (serialised by
 * a lock). Returns 0, or -1 when memory or threads could not be had (then nothing ran). */
int pool_run(pool_task_fn fn, void *ctx, long ntasks, int nthreads, size_t scratch_bytes);

#define POOL_MAX 64

#endif
