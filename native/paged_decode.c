/* warmpath.models._paged: decode attention over the paged KV cache, read in place.
 *
 * For one layer and B decode tokens (float32 compute, raw pointers from tensor.data_ptr(); the
 * caches float32 or float16, read as float32 and written rounded to nearest even):
 *   1. k[b], v[b] ([KVH, D] each) are written into the caches at slots[b] (block*bs + offset; -1: not written);
 *   2. out[b] ([H, D]) = softmax(q[b]·Kᵀ·scale)·V over the sequence's first ctx[b] tokens, read
 *      through its block table where they lie (caches [NB, bs, KVH, D], contiguous).
 * One pass per (sequence, chunk of SPLIT_TOKENS) with an online softmax: one KV block at a time
 * (its rows read whole, KV head after KV head), the G = H/KVH query heads of a KV head together
 * (each K/V row read once), a running max, sum and float32 accumulator per query head; chunks
 * merged by log-sum-exp. Each is one task of the pool (taskpool.c); a head's arithmetic
 * depends only on its own inputs, never on the batch or the thread that runs it, so a sequence
 * alone and in a batch gets bit-identical output. D loops: vecmath.h, compiled for AVX-512,
 * AVX2 + FMA and the baseline, one chosen at import. A float16 cache's rows are widened in
 * registers by F16C where the CPU has it (half_unit), else into the task's scratch one block
 * and KV head at a time. */
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
    char *kc, *vc;                      /* caches: float32, or float16 when half */
    float *out;
    int half;                           /* cache element: 0 float32, 1 float16 (IEEE half) */
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

/* Scratch of one participant: acc [H][D], scores [G][bsp], max [H], sum [H], and a block's K
 * and V rows of one KV head widened to float32 [bs][D] each (float16 caches). */
static size_t scratch_bytes(const Args *a) {
    return sizeof(float) * (size_t)(a->H * a->D + a->H / a->KVH * a->bsp + 2 * a->H + 2 * a->bs * a->D) + 64;
}

/* n rows of D halves (row stride ``row`` halves) → n contiguous float rows of D: portable
 * (vecmath.h's exact bit formulation), or F16C's vcvtph2ps where the CPU has it (the same
 * values: both exact). Chosen once, at import. */
typedef void (*widen_fn)(float *dst, const uint16_t *src, long n, long D, long row);

static void widen_portable(float *dst, const uint16_t *src, long n, long D, long row) {
    for (long j = 0; j < n; j++) {
        long i = 0;
        for (; i + VL <= D; i += VL)
            st(dst + j * D + i, ldh(src + j * row + i));
        for (; i < D; i++)
            dst[j * D + i] = h2f(src[j * row + i]);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx,f16c"))) static void widen_f16c(float *dst, const uint16_t *src, long n,
                                                           long D, long row) {
    for (long j = 0; j < n; j++) {
        long i = 0;
        for (; i + 8 <= D; i += 8)
            _mm256_storeu_ps(dst + j * D + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j * row + i))));
        for (; i < D; i++)
            dst[j * D + i] = h2f(src[j * row + i]);
    }
}

static widen_fn pick_widen(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx") ? widen_f16c : widen_portable;
}
#else
static widen_fn pick_widen(void) { return widen_portable; }
#endif

static widen_fn widen = widen_portable;

/* The next block's K and V rows, fetched while this block is computed (the hardware
 * prefetchers follow consecutive blocks, not a jump). */
INL long esz(const Args *a) { return a->half ? 2 : 4; }     /* a cache element's bytes */

INL void prefetch_block(const Args *a, long base, long elems) {
    for (long i = 0; i < elems * esz(a); i += 64) {
        __builtin_prefetch(a->kc + base * esz(a) + i);
        __builtin_prefetch(a->vc + base * esz(a) + i);
    }
}

/* One query head's online-softmax step over a block's n scores sg (padded to VL): a new
 * maximum rescales what came before; the scores become e^(s - max), their sum joins *l. */
INL void softmax_step(float *sg, long n, float *mh, float *lh, float *ah, const long D) {
    float mx = *mh;
    for (long j = 0; j < n; j++)
        mx = sg[j] > mx ? sg[j] : mx;
    if (mx > *mh) {
        float alpha = *mh == -INFINITY ? 0.0f : expf(*mh - mx);
        scal(ah, alpha, D);
        *lh *= alpha;
        *mh = mx;
    }
    float sum = 0.0f;
    for (long j = 0; j < n; j += VL) {
        st(sg + j, vexp(ld(sg + j) - mx));
        for (long i = j; i < j + VL && i < n; i++)
            sum += sg[i];
    }
    *lh += sum;
}

/* A float16 cache on a CPU with F16C: one (block, KV head) unit with the rows widened in
 * registers (vcvtph2ps) instead of through the scratch: the same floats (the conversion is
 * exact) in the same order as scores / accumulate over widened rows, so the same bits. */
typedef void (*half_unit_fn)(const float *qh, const uint16_t *kh, const uint16_t *vh, long n, long row,
                             float *s, long G, long bsp, float scale, float *ah, float *mh, float *lh, long D);
static half_unit_fn half_unit;      /* NULL: widen into the scratch */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && VL == 8
#define AF16 __attribute__((target("avx2,fma,f16c")))
AF16 INL vf ldh_f16c(const uint16_t *p) { return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

ROW_LOOPS(f16c, AF16, uint16_t, ldh_f16c)

AF16 INL void half_unit_d(const float *qh, const uint16_t *kh, const uint16_t *vh, long n, long row,
                          float *s, long G, long bsp, float scale, float *ah, float *mh, float *lh,
                          const long D) {
    for (long j = 0; j < n; j++)
        scores_f16c(qh, kh + j * row, s + j, G, bsp, scale, D);
    for (long g = 0; g < G; g++) {
        softmax_step(s + g * bsp, n, mh + g, lh + g, ah + g * D, D);
        accumulate_f16c(ah + g * D, s + g * bsp, vh, n, row, D);
    }
}

AF16 static void half_unit_f16c(const float *qh, const uint16_t *kh, const uint16_t *vh, long n, long row,
                                float *s, long G, long bsp, float scale, float *ah, float *mh, float *lh, long D) {
    if (D == 64)
        half_unit_d(qh, kh, vh, n, row, s, G, bsp, scale, ah, mh, lh, 64);
    else                                /* D = 128 (the only other size it is picked for) */
        half_unit_d(qh, kh, vh, n, row, s, G, bsp, scale, ah, mh, lh, 128);
}
#endif

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
    float *acc = scratch, *s = acc + H * D, *m = s + G * bsp, *l = m + H, *kw = l + H, *vw = kw + bs * D;
    memset(acc, 0, sizeof(float) * (size_t)(H * D + G * bsp));   /* acc and the scores */
    for (long h = 0; h < H; h++)
        m[h] = -INFINITY, l[h] = 0.0f;
    for (long blk = blk0; blk * bs < n_ctx; blk++) {
        long n = n_ctx - blk * bs < bs ? n_ctx - blk * bs : bs;
        long id = table_at(a, b, blk), base = id * bs * row;
        if ((blk + 1) * bs < n_ctx && table_at(a, b, blk + 1) != id + 1)
            prefetch_block(a, table_at(a, b, blk + 1) * bs * row, bs * row);   /* a jump */
        for (long kvh = 0; kvh < KVH; kvh++) {
            const float *qh = q + kvh * G * D;
            float *ah = acc + kvh * G * D, *mh = m + kvh * G, *lh = l + kvh * G;
            if (a->half && half_unit != NULL && (D == 64 || D == 128)) {
                half_unit(qh, (const uint16_t *)a->kc + base + kvh * D, (const uint16_t *)a->vc + base + kvh * D,
                          n, row, s, G, bsp, scale, ah, mh, lh, D);
                continue;
            }
            const float *kb, *vb;       /* the block's rows of this KV head, rs floats apart */
            long rs = row;
            if (a->half) {              /* float16: widened into the scratch, row after row */
                widen(kw, (const uint16_t *)a->kc + base + kvh * D, n, D, row);
                widen(vw, (const uint16_t *)a->vc + base + kvh * D, n, D, row);
                kb = kw, vb = vw, rs = D;
            } else {
                kb = (const float *)a->kc + base + kvh * D;
                vb = (const float *)a->vc + base + kvh * D;
            }
            for (long j = 0; j < n; j++)
                scores(qh, kb + j * rs, s + j, G, bsp, scale, D);
            for (long g = 0; g < G; g++) {
                softmax_step(s + g * bsp, n, mh + g, lh + g, ah + g * D, D);
                accumulate(ah + g * D, s + g * bsp, vb, n, rs, D);
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

/* The pool's task: D = 64 and 128 compiled with D constant (loops unrolled, registers), once
 * per instruction set: AVX-512 and AVX2 with FMA (a multiply-add is one rounding there, so
 * outputs differ between the variants in the last bits, never between batches), and the
 * baseline. Chosen once, at import, by what the CPU supports. */
#define ATTEND(name, attr)                                              \
    attr static void name(void *args, long task, void *scratch) {       \
        const Args *a = args;                                           \
        if (a->D == 64)                                                 \
            attend_d(a, task, scratch, 64);                             \
        else if (a->D == 128)                                           \
            attend_d(a, task, scratch, 128);                            \
        else                                                            \
            attend_d(a, task, scratch, a->D);                           \
    }
ATTEND(attend_base, )
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
ATTEND(attend_avx2, __attribute__((target("avx2,fma"))))
ATTEND(attend_avx512, __attribute__((target("avx512f,avx2,fma"))))

static pool_task_fn pick_attend(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
        return attend_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return attend_avx2;
    return attend_base;
}
#else
static pool_task_fn pick_attend(void) { return attend_base; }
#endif

static pool_task_fn attend = attend_base;

/* This step's K/V rows into the caches at their slots (float16 caches: rounded to nearest even). */
static void write_rows(const Args *a) {
    long n = a->KVH * a->D;
    for (long b = 0; b < a->B; b++) {
        if (a->slots[b] == -1)          /* a padding row: nothing to keep */
            continue;
        char *kd = a->kc + a->slots[b] * n * esz(a), *vd = a->vc + a->slots[b] * n * esz(a);
        const float *ks = (const float *)(a->k + b * a->k_sb), *vs = (const float *)(a->v + b * a->v_sb);
        if (!a->half) {
            memcpy(kd, ks, sizeof(float) * (size_t)n);
            memcpy(vd, vs, sizeof(float) * (size_t)n);
            continue;
        }
        for (long i = 0; i < n; i++) {
            ((uint16_t *)kd)[i] = f2h(ks[i]);
            ((uint16_t *)vd)[i] = f2h(vs[i]);
        }
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
    a.half = 0;
    if (!PyArg_ParseTuple(args, "KnKnKnKKKKKinKnnnnnnndi|p", &q, &a.q_sb, &k, &a.k_sb, &v, &a.v_sb,
                          &kc, &vc, &out, &slots, &tables, &a.tab64, &a.tab_sb, &ctx, &a.B, &a.H,
                          &a.KVH, &a.D, &a.bs, &a.NB, &a.W, &scale, &nthreads, &a.half))
        return NULL;
    if (a.B < 0 || a.KVH < 1 || a.H % a.KVH != 0 || a.D < 1 || a.bs < 1 || a.NB < 1 || a.W < 1) {
        PyErr_SetString(PyExc_ValueError, "bad shapes: need B >= 0, H a multiple of KVH >= 1, D, bs, NB, W >= 1");
        return NULL;
    }
    a.q = (const char *)q, a.k = (const char *)k, a.v = (const char *)v;
    a.kc = (char *)kc, a.vc = (char *)vc, a.out = (float *)out;
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
     "tables_int64, tables_row_stride, ctx, B, H, KVH, D, block_size, num_blocks, W, scale, nthreads, "
     "half=False) -> threads used. Pointers as ints, row strides of q/k/v in bytes; slots 0: write "
     "nothing; half: the caches hold float16 (q, k, v and out stay float32)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "warmpath.models._paged",
                                    "Decode attention over the paged KV cache in C (see native/paged_decode.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__paged(void) {
    widen = pick_widen();
#ifdef AF16
    if (widen == widen_f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
        && getenv("WARMPATH_PAGED_WIDEN") == NULL)     /* set: the scratch path (the tests compare) */
        half_unit = half_unit_f16c;
#endif
    attend = pick_attend();
    return PyModule_Create(&module);
}
