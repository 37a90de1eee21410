/* The task pool of the kernels in warmpath.models._paged and _qlinear (native/taskpool.c).
 *
 * It runs on OpenMP, linked as libgomp.so.1: in a process that imported torch first, the
 * loader binds that soname to torch's bundled copy, so the kernels' threads are torch's own
 * team. (A pthread pool of its own, the former design, woke threads that fought torch's
 * spinning OpenMP workers for the cores: a batch-16 fp16w decode step took 66.1 ms with it,
 * 53.5 ms on torch's team, medians of 3; docs/benchmarks/engine.md.) */
#ifndef WARMPATH_TASKPOOL_H
#define WARMPATH_TASKPOOL_H

/* One call's work: run(ctx, i) for every task i in [0, ntasks), each exactly once, in any
 * order and on any thread (so a task's result must not depend on which thread runs it). */
typedef void (*pool_task_fn)(void *ctx, long i, void *scratch);

/* Runs the tasks on the calling thread and up to nthreads - 1 more threads of an OpenMP
 * parallel region (at most POOL_MAX in all); returns when every task has finished. Each
 * participant gets its own scratch buffer of scratch_bytes (malloc'd per call). Returns 0, or
 * -1 when the caller's scratch could not be had (then nothing ran). */
int pool_run(pool_task_fn fn, void *ctx, long ntasks, int nthreads, size_t scratch_bytes);

#define POOL_MAX 64

#endif
