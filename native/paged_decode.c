/* warmpath.models._paged: decode attention over the paged KV cache, read in place.
 *
 * For one layer and B decode tokens (float32 throughout, raw pointers from tensor.data_ptr()):
 *   1. k[b], v[b] ([KVH, D] each) are written into the caches at slots[b] (block*bs + offset; -1: not written);
 *   2. out[b] ([H, D]) = softmax(q[b]·Kᵀ·scale)·V over the sequence's first ctx[b] tokens, read
 *      through its block table where they lie (caches [NB, bs, KVH, D], contiguous).
 * One pass per (sequence, chunk of SPLIT_TOKENS) with an online softmax: one KV block at a time
 * (its rows read whole, KV head after KV head), the G = H/KVH query heads of a KV head together
 * (each K/V row read once), a running max, sum and float32 accumulator per query head; chunks
 * merged by log-sum-exp. Each is one task of the pool (taskpool.c); a head's arithmetic
 * depends only on its own inputs, never on the batch or the thread that runs it, so a sequence
 * alone and in a batch gets bit-identical output. D loops: vecmath.h, cloned for AVX-512 /
 * AVX2 / baseline. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "taskpool.h"
#include "vecmath.h"

/* A sequence's tokens are cut into chunks of SPLIT_TOKENS (whole blocks), one task each, merged
 * after by log-sum-exp: the cut depends on ctx alone, so a batch of one long sequence still
 * spreads over the threads and stays bit-identical to the same sequence in any batch. */
#ifndef SPLIT_TOKENS
#define SPLIT_TOKENS 512
#endif

typedef struct {
    int32_t b, c, nc;                   /* sequence, chunk c of nc */
} Task;

typedef struct {
    const char *q, *k, *v;              /* [B, ...] rows, row strides in bytes below */
    long q_sb, k_sb, v_sb;
    float *kc, *vc, *out;
    const int64_t *slots, *ctx;
    const void *tables;
    int tab64;
    long tab_sb;                        /* row stride of tables, in elements */
    long B, H, KVH, D, bs, W, NB;
    float scale;
    long bsp;                           /* bs rounded up to VL: the scores' row */
    long chunk;                         /* blocks per chunk */
    Task *tasks;
    float *part;                        /* per task of a cut sequence: max [H], sum [H], acc [H][D] */
} Args;

INL long table_at(const Args *a, long b, long i) {
    return a->tab64 ? ((const int64_t *)a->tables)[b * a->tab_sb + i]
                    : ((const int32_t *)a->tables)[b * a->tab_sb + i];
}

/* Scratch of one participant: acc [H][D], scores [G][bsp], max [H], sum [H]. */
static size_t scratch_bytes(const Args *a) {
    return sizeof(float) * (size_t)(a->H * a->D + a->H / a->KVH * a->bsp + 2 * a->H) + 64;
}

/* The next block's K and V rows, fetched while this block is computed (the hardware
 * prefetchers follow consecutive blocks, not a jump). */
INL void prefetch_block(const Args *a, long base, long floats) {
    for (long i = 0; i < floats; i += 16) {
        __builtin_prefetch(a->kc + base + i);
        __builtin_prefetch(a->vc + base + i);
    }
}

/* A task: every query head of sequence b over chunk c of its ctx[b] tokens, block by block
 * (a block's rows read whole: every KV head, each with its G query heads); the output (a chunk
 * alone), else the chunk's max, sum and accumulator per head into a->part. */
INL void attend_d(const Args *a, long task, float *scratch, const long D) {
    Task t = a->tasks[task];
    long b = t.b, bs = a->bs, H = a->H, KVH = a->KVH, G = H / KVH, bsp = a->bsp;
    long n_ctx = a->ctx[b], row = KVH * D, blk0 = t.c * a->chunk;
    if (n_ctx > (blk0 + a->chunk) * bs)
        n_ctx = (blk0 + a->chunk) * bs;
    float scale = a->scale;
    const float *q = (const float *)(a->q + b * a->q_sb);
    float *acc = scratch, *s = acc + H * D, *m = s + G * bsp, *l = m + H;
    memset(acc, 0, sizeof(float) * (size_t)(H * D + G * bsp));   /* acc and the scores */
    for (long h = 0; h < H; h++)
        m[h] = -INFINITY, l[h] = 0.0f;
    for (long blk = blk0; blk * bs < n_ctx; blk++) {
        long n = n_ctx - blk * bs < bs ? n_ctx - blk * bs : bs;
        long id = table_at(a, b, blk), base = id * bs * row;
        if ((blk + 1) * bs < n_ctx && table_at(a, b, blk + 1) != id + 1)
            prefetch_block(a, table_at(a, b, blk + 1) * bs * row, bs * row);   /* a jump */
        for (long kvh = 0; kvh < KVH; kvh++) {
            const float *kb = a->kc + base + kvh * D, *vb = a->vc + base + kvh * D;
            const float *qh = q + kvh * G * D;
            float *ah = acc + kvh * G * D, *mh = m + kvh * G, *lh = l + kvh * G;
            for (long j = 0; j < n; j++)
                scores(qh, kb + j * row, s + j, G, bsp, scale, D);
            for (long g = 0; g < G; g++) {
                float *sg = s + g * bsp, mx = mh[g];
                for (long j = 0; j < n; j++)
                    mx = sg[j] > mx ? sg[j] : mx;
                if (mx > mh[g]) {       /* a new maximum: rescale what came before */
                    float alpha = mh[g] == -INFINITY ? 0.0f : expf(mh[g] - mx);
                    scal(ah + g * D, alpha, D);
                    lh[g] *= alpha;
                    mh[g] = mx;
                }
                float sum = 0.0f;
                for (long j = 0; j < n; j += VL) {
                    st(sg + j, vexp(ld(sg + j) - mx));
                    for (long i = j; i < j + VL && i < n; i++)
                        sum += sg[i];
                }
                lh[g] += sum;
                accumulate(ah + g * D, sg, vb, n, row, D);
            }
        }
    }
    if (t.nc > 1) {
        float *p = a->part + task * (2 * H + H * D);
        memcpy(p, m, sizeof(float) * 2 * H);                  /* m and l lie back to back */
        memcpy(p + 2 * H, acc, sizeof(float) * H * D);
        return;
    }
    float *o = a->out + b * H * D;
    for (long h = 0; h < H; h++)
        for (long i = 0; i < D; i++)
            o[h * D + i] = acc[h * D + i] / l[h];
}

/* The chunks of each cut sequence, in chunk order, per head: o = Σ_c e^(m_c - M) acc_c / L. */
static void merge(const Args *a, long ntasks) {
    long H = a->H, D = a->D, len = 2 * H + H * D;
    for (long i = 0; i < ntasks; i++) {
        Task t = a->tasks[i];
        if (t.nc == 1 || t.c != 0)
            continue;
        const float *p = a->part + i * len;
        for (long h = 0; h < H; h++) {
            float mx = -INFINITY, sum = 0.0f, *o = a->out + (t.b * H + h) * D;
            for (long c = 0; c < t.nc; c++)
                mx = p[c * len + h] > mx ? p[c * len + h] : mx;
            memset(o, 0, sizeof(float) * D);
            for (long c = 0; c < t.nc; c++) {
                float w = expf(p[c * len + h] - mx);
                sum += w * p[c * len + H + h];
                for (long d = 0; d < D; d++)
                    o[d] += w * p[c * len + 2 * H + h * D + d];
            }
            for (long d = 0; d < D; d++)
                o[d] /= sum;
        }
    }
}

/* The pool's task: D = 64 and 128 compiled with D constant (loops unrolled, registers). */
CLONES static void attend(void *args, long task, void *scratch) {
    const Args *a = args;
    if (a->D == 64)
        attend_d(a, task, scratch, 64);
    else if (a->D == 128)
        attend_d(a, task, scratch, 128);
    else
        attend_d(a, task, scratch, a->D);
}

static void write_rows(const Args *a) {
    size_t bytes = sizeof(float) * (size_t)(a->KVH * a->D);
    for (long b = 0; b < a->B; b++) {
        if (a->slots[b] == -1)          /* a padding row: nothing to keep */
            continue;
        memcpy(a->kc + a->slots[b] * a->KVH * a->D, a->k + b * a->k_sb, bytes);
        memcpy(a->vc + a->slots[b] * a->KVH * a->D, a->v + b * a->v_sb, bytes);
    }
}

/* Every index in range (before anything is written): slots, ctx and the blocks it uses. */
static int check(const Args *a) {
    for (long b = 0; b < a->B; b++) {
        if (a->slots && (a->slots[b] < -1 || a->slots[b] >= a->NB * a->bs)) {
            PyErr_Format(PyExc_ValueError, "slot %lld of row %ld is outside the cache's %ld slots (-1: none)",
                         (long long)a->slots[b], b, a->NB * a->bs);
            return -1;
        }
        if (a->ctx[b] < 1 || a->ctx[b] > a->W * a->bs) {
            PyErr_Format(PyExc_ValueError, "ctx %lld of row %ld is not in [1, %ld] (table width %ld x block size %ld)",
                         (long long)a->ctx[b], b, a->W * a->bs, a->W, a->bs);
            return -1;
        }
        for (long i = 0; i * a->bs < a->ctx[b]; i++) {
            long blk = table_at(a, b, i);
            if (blk < 0 || blk >= a->NB) {
                PyErr_Format(PyExc_ValueError, "block %ld at tables[%ld, %ld] is outside the cache's %ld blocks",
                             blk, b, i, a->NB);
                return -1;
            }
        }
    }
    return 0;
}

/* Token-heads above which a call is split over threads (else one thread: waking a pool
 * thread costs more than it saves). Measured on the development machine (2 cores). */
#ifndef PARALLEL_MIN_WORK
#define PARALLEL_MIN_WORK 4096
#endif

static PyObject *decode(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, kc, vc, out, slots, tables, ctx;
    Args a;
    int nthreads;
    double scale;
    if (!PyArg_ParseTuple(args, "KnKnKnKKKKKinKnnnnnnndi", &q, &a.q_sb, &k, &a.k_sb, &v, &a.v_sb,
                          &kc, &vc, &out, &slots, &tables, &a.tab64, &a.tab_sb, &ctx, &a.B, &a.H,
                          &a.KVH, &a.D, &a.bs, &a.NB, &a.W, &scale, &nthreads))
        return NULL;
    if (a.B < 0 || a.KVH < 1 || a.H % a.KVH != 0 || a.D < 1 || a.bs < 1 || a.NB < 1 || a.W < 1) {
        PyErr_SetString(PyExc_ValueError, "bad shapes: need B >= 0, H a multiple of KVH >= 1, D, bs, NB, W >= 1");
        return NULL;
    }
    a.q = (const char *)q, a.k = (const char *)k, a.v = (const char *)v;
    a.kc = (float *)kc, a.vc = (float *)vc, a.out = (float *)out;
    a.slots = (const int64_t *)slots, a.ctx = (const int64_t *)ctx, a.tables = (const void *)tables;
    a.scale = (float)scale;
    a.bsp = (a.bs + VL - 1) / VL * VL;
    if (check(&a) < 0)
        return NULL;
    long work = 0, ntasks = 0, cut = 0;
    a.chunk = SPLIT_TOKENS / a.bs > 0 ? SPLIT_TOKENS / a.bs : 1;
    for (long b = 0; b < a.B; b++) {
        long nc = ((a.ctx[b] + a.bs - 1) / a.bs + a.chunk - 1) / a.chunk;
        work += a.ctx[b] * a.KVH;
        ntasks += nc;
        cut += nc > 1 ? nc : 0;
    }
    if (work < PARALLEL_MIN_WORK || nthreads < 1)
        nthreads = 1;
    if (nthreads > ntasks)
        nthreads = ntasks > 0 ? (int)ntasks : 1;
    a.tasks = malloc(sizeof(Task) * (size_t)(ntasks + 1));
    a.part = cut ? malloc(sizeof(float) * (size_t)(ntasks * (2 * a.H + a.H * a.D))) : NULL;
    if (a.tasks == NULL || (cut && a.part == NULL)) {
        free(a.tasks), free(a.part);
        return PyErr_NoMemory();
    }
    for (long b = 0, i = 0; b < a.B; b++) {
        int32_t nc = (int32_t)(((a.ctx[b] + a.bs - 1) / a.bs + a.chunk - 1) / a.chunk);
        for (int32_t c = 0; c < nc; c++)
            a.tasks[i++] = (Task){(int32_t)b, c, nc};
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (a.slots)
        write_rows(&a);
    rc = pool_run(attend, &a, ntasks, nthreads, scratch_bytes(&a));
    if (rc == 0 && cut)
        merge(&a, ntasks);
    Py_END_ALLOW_THREADS
    free(a.tasks), free(a.part);
    if (rc < 0)
        return PyErr_NoMemory();
    return PyLong_FromLong(nthreads);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(q, q_row_stride, k, k_row_stride, v, v_row_stride, k_cache, v_cache, out, slots, tables, "
     "tables_int64, tables_row_stride, ctx, B, H, KVH, D, block_size, num_blocks, W, scale, nthreads) "
     "-> threads used. Pointers as ints, row strides of q/k/v in bytes; slots 0: write nothing."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "warmpath.models._paged",
                                    "Decode attention over the paged KV cache in C (see native/paged_decode.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__paged(void) { return PyModule_Create(&module); }
