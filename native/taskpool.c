/* The kernels' task pool on OpenMP (see taskpool.h).
 *
 * Each participant of one parallel region (the caller is thread 0) claims task indices from
 * one atomic counter until none is left, with a scratch buffer of its own. The extensions
 * link libgomp.so.1 by its soname, so in a process that imported torch first (the op modules
 * do) the region runs on torch's own OpenMP runtime and thread team: no second set of threads
 * spins or sleeps beside torch's and fights it for the cores. */
#include <omp.h>
#include <stdlib.h>

#include "taskpool.h"

static void drain(pool_task_fn fn, void *ctx, long ntasks, long *next, void *scratch) {
    long i;
    while ((i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < ntasks)
        fn(ctx, i, scratch);
}

int pool_run(pool_task_fn fn, void *ctx, long ntasks, int nthreads, size_t scratch_bytes) {
    void *scratch = malloc(scratch_bytes ? scratch_bytes : 1);
    if (scratch == NULL)
        return -1;
    if (nthreads > POOL_MAX)
        nthreads = POOL_MAX;
    if (nthreads > ntasks)
        nthreads = (int)ntasks;
    long next = 0;
    if (nthreads <= 1) {              /* no parallel region: the common small call */
        drain(fn, ctx, ntasks, &next, scratch);
        free(scratch);
        return 0;
    }
#pragma omp parallel num_threads(nthreads)
    {
        if (omp_get_thread_num() == 0) {
            drain(fn, ctx, ntasks, &next, scratch);
        } else {
            void *mine = malloc(scratch_bytes ? scratch_bytes : 1);
            if (mine != NULL)         /* no memory: leave the tasks to the others */
                drain(fn, ctx, ntasks, &next, mine);
            free(mine);
        }
    }
    free(scratch);
    return 0;
}
