/* warmpath.models._paged: decode attention over the paged KV cache, read in place.
 *
 * For one layer and B decode tokens (float32 throughout, raw pointers from tensor.data_ptr()):
 *   1. k[b], v[b] ([KVH, D] each) are written into the caches at slots[b] (slot = block*bs + offset);
 *   2. out[b] ([H, D]) = softmax(q[b]·Kᵀ·scale)·V over the sequence's first ctx[b] tokens, read
 *      through its block table where they lie (caches [NB, bs, KVH, D], contiguous).
 * One pass per (sequence, KV head) with an online softmax: one KV block at a time, the G = H/KVH
 * query heads of the KV head together (each K/V row read once), a running max, sum and float32
 * accumulator per query head. A (sequence, KV head) pair is one task of the pool (taskpool.c);
 * its arithmetic depends only on its own inputs, never on the batch or the thread that runs it,
 * so a sequence alone and in a batch gets bit-identical output. The D loops run on GCC vector
 * extensions (16 lanes, fixed reduction order), cloned for AVX-512 / AVX2 / baseline. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "taskpool.h"

#define VL 16
typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4), may_alias));   /* unaligned */
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
#define INL static inline __attribute__((always_inline))

INL vf ld(const float *p) { return *(const vfu *)p; }
INL void st(float *p, vf x) { *(vfu *)p = x; }
INL vf splat(float x) { return (vf){0} + x; }

INL float hsum(vf a) {          /* 16 lanes → 1 in a fixed tree order */
    vf8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    vf4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    return (c[0] + c[2]) + (c[1] + c[3]);
}

INL float dot(const float *a, const float *b, long d) {
    vf acc = {0};
    long i = 0;
    for (; i + VL <= d; i += VL)
        acc += ld(a + i) * ld(b + i);
    float s = hsum(acc);
    for (; i < d; i++)
        s += a[i] * b[i];
    return s;
}

INL void axpy(float *y, float a, const float *x, long d) {     /* y += a * x */
    long i = 0;
    vf va = splat(a);
    for (; i + VL <= d; i += VL)
        st(y + i, ld(y + i) + va * ld(x + i));
    for (; i < d; i++)
        y[i] += a * x[i];
}

INL void scal(float *y, float a, long d) {
    long i = 0;
    for (; i + VL <= d; i += VL)
        st(y + i, ld(y + i) * a);
    for (; i < d; i++)
        y[i] *= a;
}

/* e^x lane-wise for x <= 0 (Cephes expf: x = n·ln2 + r, |r| <= ln2/2, a degree-7 polynomial,
 * ~1 ulp); below -87 the result is ~1e-38 rather than 0, which no softmax weight notices. */
INL vf vexp(vf x) {
    vi low = x < -87.0f;                                  /* lanes: -1 where true */
    x = (vf)(((vi)x & ~low) | ((vi)splat(-87.0f) & low));
    vf n = x * 1.44269504088896341f + 12582912.0f;       /* round to nearest via 1.5·2^23 */
    n -= 12582912.0f;
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)e;
}

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
} Args;

INL long table_at(const Args *a, long b, long i) {
    return a->tab64 ? ((const int64_t *)a->tables)[b * a->tab_sb + i]
                    : ((const int32_t *)a->tables)[b * a->tab_sb + i];
}

/* Scratch of one participant: acc [G][D], scores [G][bsp], max [G], sum [G]. */
static size_t scratch_bytes(const Args *a) {
    long g = a->H / a->KVH;
    return sizeof(float) * (size_t)(g * a->D + g * a->bsp + 2 * g) + 64;
}

#define RV 8      /* D up to RV * VL = 128 (a multiple of VL): accumulators in registers */

/* Scores of one K row for the G query heads: s[g * bsp] = (q_g · k) * scale. */
INL void scores(const float *restrict q, const float *restrict k, float *restrict s, long G,
                long bsp, float scale, const long D) {
    if (D % VL == 0 && D <= RV * VL) {
        vf kr[RV];
        for (long c = 0; c < D / VL; c++)
            kr[c] = ld(k + c * VL);
        for (long g = 0; g < G; g++) {
            vf acc = {0};
            for (long c = 0; c < D / VL; c++)
                acc += ld(q + g * D + c * VL) * kr[c];
            s[g * bsp] = hsum(acc) * scale;
        }
        return;
    }
    for (long g = 0; g < G; g++)
        s[g * bsp] = dot(q + g * D, k, D) * scale;
}

/* acc += Σ_j p[j] · v_j over the n rows of a block (row stride ``row``). */
INL void accumulate(float *restrict acc, const float *restrict p, const float *restrict v, long n,
                    long row, const long D) {
    if (D % VL == 0 && D <= RV * VL) {
        vf r[RV];
        for (long c = 0; c < D / VL; c++)
            r[c] = ld(acc + c * VL);
        for (long j = 0; j < n; j++) {
            vf pj = splat(p[j]);
            for (long c = 0; c < D / VL; c++)
                r[c] += pj * ld(v + j * row + c * VL);
        }
        for (long c = 0; c < D / VL; c++)
            st(acc + c * VL, r[c]);
        return;
    }
    for (long j = 0; j < n; j++)
        axpy(acc, p[j], v + j * row, D);
}

/* Task (b, kvh): the G query heads of KV head kvh of sequence b over its ctx[b] tokens. */
INL void attend_d(const Args *a, long task, float *scratch, const long D) {
    long b = task / a->KVH, kvh = task % a->KVH, bs = a->bs, G = a->H / a->KVH, bsp = a->bsp;
    long n_ctx = a->ctx[b], row = a->KVH * D;
    float scale = a->scale;
    const float *q = (const float *)(a->q + b * a->q_sb) + kvh * G * D;
    float *acc = scratch, *s = acc + G * D, *m = s + G * bsp, *l = m + G;
    memset(acc, 0, sizeof(float) * (size_t)(G * D + G * bsp));   /* acc and the scores */
    for (long g = 0; g < G; g++)
        m[g] = -INFINITY, l[g] = 0.0f;
    for (long blk = 0; blk * bs < n_ctx; blk++) {
        long n = n_ctx - blk * bs < bs ? n_ctx - blk * bs : bs;
        long base = table_at(a, b, blk) * bs * row + kvh * D;
        const float *kb = a->kc + base, *vb = a->vc + base;
        for (long j = 0; j < n; j++)
            scores(q, kb + j * row, s + j, G, bsp, scale, D);
        for (long g = 0; g < G; g++) {
            float *sg = s + g * bsp, mx = m[g];
            for (long j = 0; j < n; j++)
                mx = sg[j] > mx ? sg[j] : mx;
            if (mx > m[g]) {            /* a new maximum: rescale what came before */
                float alpha = m[g] == -INFINITY ? 0.0f : expf(m[g] - mx);
                scal(acc + g * D, alpha, D);
                l[g] *= alpha;
                m[g] = mx;
            }
            float sum = 0.0f;
            for (long j = 0; j < n; j += VL) {
                st(sg + j, vexp(ld(sg + j) - mx));
                for (long i = j; i < j + VL && i < n; i++)
                    sum += sg[i];
            }
            l[g] += sum;
            accumulate(acc + g * D, sg, vb, n, row, D);
        }
    }
    float *o = a->out + (b * a->H + kvh * G) * D;
    for (long g = 0; g < G; g++)
        for (long i = 0; i < D; i++)
            o[g * D + i] = acc[g * D + i] / l[g];
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
        memcpy(a->kc + a->slots[b] * a->KVH * a->D, a->k + b * a->k_sb, bytes);
        memcpy(a->vc + a->slots[b] * a->KVH * a->D, a->v + b * a->v_sb, bytes);
    }
}

/* Every index in range (before anything is written): slots, ctx and the blocks it uses. */
static int check(const Args *a) {
    for (long b = 0; b < a->B; b++) {
        if (a->slots && (a->slots[b] < 0 || a->slots[b] >= a->NB * a->bs)) {
            PyErr_Format(PyExc_ValueError, "slot %lld of row %ld is outside the cache's %ld slots",
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
    long work = 0;
    for (long b = 0; b < a.B; b++)
        work += a.ctx[b] * a.KVH;
    if (work < PARALLEL_MIN_WORK || nthreads < 1)
        nthreads = 1;
    if (nthreads > a.B * a.KVH)
        nthreads = a.B * a.KVH > 0 ? (int)(a.B * a.KVH) : 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (a.slots)
        write_rows(&a);
    rc = pool_run(attend, &a, a.B * a.KVH, nthreads, scratch_bytes(&a));
    Py_END_ALLOW_THREADS
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
