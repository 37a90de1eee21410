/* A tiny persistent pthread pool (see taskpool.h).
 *
 * A call publishes its job under the lock with a new generation number and wakes the
 * workers; every participant (the caller included) claims task indices from one atomic
 * counter until none is left. The caller then closes the job (a worker waking later skips
 * it) and waits until every worker that joined has left, so the job's memory is never read
 * after pool_run returns. After fork() the child starts with no workers (pthread_atfork). */
#include <pthread.h>
#include <stdlib.h>

#include "taskpool.h"

typedef struct {
    pool_task_fn fn;
    void *ctx;
    long ntasks;
    size_t scratch_bytes;
    long next;                  /* the next unclaimed task (atomic) */
} Job;

static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;   /* one pool_run at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static Job job;
static unsigned long gen;       /* bumped for each job */
static int closed = 1;          /* the current job takes no new participant */
static int nwant;               /* workers 0 .. nwant-1 may join the current job */
static int busy;                /* workers inside the current job */
static int nworkers;            /* threads started */
static int atfork_set;

static void drain(Job *j, void *scratch) {
    long i;
    while ((i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->ntasks)
        j->fn(j->ctx, i, scratch);
}

static void *worker(void *arg) {
    int id = (int)(long)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&mu);
    seen = gen;
    for (;;) {
        while (gen == seen)
            pthread_cond_wait(&work_cv, &mu);
        seen = gen;
        if (closed || id >= nwant)
            continue;
        busy++;
        pthread_mutex_unlock(&mu);
        void *scratch = malloc(job.scratch_bytes);
        if (scratch != NULL)          /* no memory: leave the tasks to the others */
            drain(&job, scratch);
        free(scratch);
        pthread_mutex_lock(&mu);
        if (--busy == 0)
            pthread_cond_signal(&done_cv);
    }
    return NULL;
}

static void after_fork_child(void) {
    /* the child has only the forking thread: no workers, fresh locks */
    pthread_mutex_init(&call_mu, NULL);
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&work_cv, NULL);
    pthread_cond_init(&done_cv, NULL);
    nworkers = busy = nwant = 0;
    closed = 1;
}

/* Starts workers up to want (fewer if the system refuses); called with mu held. */
static void grow(int want) {
    while (nworkers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, (void *)(long)nworkers);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        nworkers++;
    }
}

int pool_run(pool_task_fn fn, void *ctx, long ntasks, int nthreads, size_t scratch_bytes) {
    void *scratch = malloc(scratch_bytes);
    if (scratch == NULL)
        return -1;
    if (nthreads > POOL_MAX)
        nthreads = POOL_MAX;
    if (nthreads > ntasks)
        nthreads = (int)ntasks;
    if (nthreads <= 1) {              /* no lock, no wake-up: the common small call */
        Job j = {fn, ctx, ntasks, scratch_bytes, 0};
        drain(&j, scratch);
        free(scratch);
        return 0;
    }
    pthread_mutex_lock(&call_mu);
    pthread_mutex_lock(&mu);
    if (!atfork_set) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_set = 1;
    }
    grow(nthreads - 1);
    job = (Job){fn, ctx, ntasks, scratch_bytes, 0};
    closed = 0;
    nwant = nthreads - 1;
    gen++;
    pthread_cond_broadcast(&work_cv);
    pthread_mutex_unlock(&mu);
    drain(&job, scratch);
    pthread_mutex_lock(&mu);
    closed = 1;
    while (busy > 0)
        pthread_cond_wait(&done_cv, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&call_mu);
    free(scratch);
    return 0;
}
