/* y = x · Wᵀ + bias with W held in groups of 32 weights along K, x and y float32: the
 * weight-only linears of warmpath.models.qlinear_op (``--quantization int8w | int4w``).
 *
 * Formats (one scale, and for 4 bits one offset, per group and output column, IEEE half):
 *   8 bits: w = q · d,      q int8 in [-127, 127]   (GGML's Q8_0)
 *   4 bits: w = q · d + m,  q in [0, 15]            (GGML's Q4_1)
 * q · d is exact in float32 (≤ 8 × 11 significant bits), so a weight widens to the same float
 * on every variant below, and to the same float as gguf's own dequantizer: a model converted
 * from such a GGUF file computes with its reference weights bit for bit.
 *
 * Layout: panels of P = 32 output columns. Weights [ceil(N/P), K, P] (8 bits) or
 * [ceil(N/P), K, P/2] bytes (4 bits: byte j of a row holds column j in its low nibble and
 * column j + 16 in its high one); scales and offsets [ceil(N/P), ceil(K/32), P] halves.
 *
 * Batch invariance: output (m, n) is one float lane summed over k in order, x[m, k] · w one
 * fused multiply-add each (the baseline: a product and a sum), then + bias[n]. Row tiles share
 * only the widened weights, so a row computes the same wherever it sits and whatever the
 * batch. Variant (AVX-512, AVX2 + FMA + F16C, baseline) chosen once at import.
 *
 * Work: tasks of PANELS_PER_TASK panels (all rows each) on native/taskpool.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "qlinear_call.h"
#include "taskpool.h"
#include "vecmath.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#define X86 1
#endif

typedef struct {
    const float *x;         /* [M, K], row stride xs floats */
    const uint8_t *w;       /* panels, see above */
    const uint16_t *d, *m;  /* [NP, NG, P] halves; m NULL for 8 bits */
    const float *bias;      /* [N] or NULL */
    float *y;               /* [M, N], row stride ys floats */
    long M, K, N, xs, ys, NG;
    int bits;
} Args;

#define P 32                /* output columns per panel */
#define GS 32               /* weights per group along K */
#define PANELS_PER_TASK 4

INL void store(const Args *a, long m, long n, float dot) {
    if (n >= a->N)          /* the last panel's padding columns */
        return;
    a->y[m * a->ys + n] = a->bias ? dot + a->bias[n] : dot;
}

INL long row_bytes(int bits) { return bits == 8 ? P : P / 2; }

/* The baseline: one column at a time, k in order (built with -ffp-contract=off: a product and
 * a sum, two roundings, on every target). */
static void tile_base1(const Args *a, long p, long m0, int mt) {
    const uint8_t *wp = a->w + p * a->K * row_bytes(a->bits);
    const uint16_t *dp = a->d + p * a->NG * P, *mp = a->m ? a->m + p * a->NG * P : NULL;
    for (int i = 0; i < mt; i++) {
        const float *x = a->x + (m0 + i) * a->xs;
        for (int c = 0; c < P; c++) {
            float s = 0.f;
            for (long k = 0; k < a->K; k++) {
                long g = k / GS;
                float w;
                if (a->bits == 8) {
                    w = (float)(int8_t)wp[k * P + c] * h2f(dp[g * P + c]);
                } else {
                    uint8_t b = wp[k * (P / 2) + c % (P / 2)];
                    w = (float)(c < P / 2 ? b & 15 : b >> 4) * h2f(dp[g * P + c]) + h2f(mp[g * P + c]);
                }
                s += x[k] * w;
            }
            store(a, m0 + i, p * P + c, s);
        }
    }
}

static void tile_base(const Args *a, long p0, int np, long m0, int mt) {
    for (int q = 0; q < np; q++)
        tile_base1(a, p0 + q, m0, mt);
}

#ifdef X86
/* One tile: mt rows × np panels, NV vectors of L lanes across each panel's columns. Per group
 * each panel's scales (and offsets) are widened once; per k each panel's row is widened once
 * (WIDEN) and each row's x[m, k] broadcast into its multiply-adds. A lone row takes several
 * panels at once so that enough independent sums are in flight (one panel's two or four would
 * wait on each multiply-add's latency); every output is still one sum over k in order. mt and
 * np are constants at every call site below, so the loops unroll and the accumulators stay in
 * registers. */
#define TILE(name, attr, V, NV, WIDEN, LOADH, BCAST, FMA, ZERO, STORE, RB)                  \
    attr INL void name##_t(const Args *a, long p0, long m0, const int mt, const int np) {  \
        const uint8_t *wp = a->w + p0 * a->K * RB;                                          \
        const uint16_t *dp = a->d + p0 * a->NG * P, *mp = a->m ? a->m + p0 * a->NG * P : NULL; \
        V acc[6][4 * NV];                                                                   \
        for (int i = 0; i < mt; i++)                                                        \
            for (int j = 0; j < np * NV; j++)                                               \
                acc[i][j] = ZERO();                                                         \
        for (long g = 0; g < a->NG; g++) {                                                  \
            V dv[4][NV], mv[4][NV];                                                         \
            for (int q = 0; q < np; q++)                                                    \
                for (int j = 0; j < NV; j++) {                                              \
                    long o = (q * a->NG + g) * P + j * (P / NV);                            \
                    dv[q][j] = LOADH(dp + o);                                               \
                    mv[q][j] = mp ? LOADH(mp + o) : ZERO();                                 \
                }                                                                           \
            long kend = (g + 1) * GS < a->K ? (g + 1) * GS : a->K;                          \
            for (long k = g * GS; k < kend; k++) {                                          \
                V xv[6];                                                                    \
                for (int i = 0; i < mt; i++)                                                \
                    xv[i] = BCAST(a->x + (m0 + i) * a->xs + k);                             \
                for (int q = 0; q < np; q++) {                                              \
                    V wv[NV];                                                               \
                    WIDEN(wv, wp + (q * a->K + k) * RB, dv[q], mv[q]);                      \
                    for (int i = 0; i < mt; i++)                                            \
                        for (int j = 0; j < NV; j++)                                        \
                            acc[i][q * NV + j] = FMA(xv[i], wv[j], acc[i][q * NV + j]);    \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        float out[P];                                                                       \
        for (int i = 0; i < mt; i++)                                                        \
            for (int q = 0; q < np; q++) {                                                  \
                for (int j = 0; j < NV; j++)                                                \
                    STORE(out + j * (P / NV), acc[i][q * NV + j]);                          \
                for (int c = 0; c < P; c++)                                                 \
                    store(a, m0 + i, (p0 + q) * P + c, out[c]);                             \
            }                                                                               \
    }                                                                                       \
    attr static void name(const Args *a, long p0, int np, long m0, int mt) {                \
        switch (mt * 8 + np) {                                                              \
        case 8 + 4: name##_t(a, p0, m0, 1, 4); break;                                       \
        case 8 + 3: name##_t(a, p0, m0, 1, 3); break;                                       \
        case 8 + 2: name##_t(a, p0, m0, 1, 2); break;                                       \
        case 8 + 1: name##_t(a, p0, m0, 1, 1); break;                                       \
        case 16 + 2: name##_t(a, p0, m0, 2, 2); break;                                      \
        case 16 + 1: name##_t(a, p0, m0, 2, 1); break;                                      \
        case 24 + 1: name##_t(a, p0, m0, 3, 1); break;                                      \
        case 32 + 1: name##_t(a, p0, m0, 4, 1); break;                                      \
        case 40 + 1: name##_t(a, p0, m0, 5, 1); break;                                      \
        default: name##_t(a, p0, m0, 6, 1); break;                                          \
        }                                                                                   \
    }

/* Many rows: a panel's weights are widened once into the task's scratch ([K][P] floats, the
 * same floats WIDEN gives a tile) and every row tile reads them from there. The sums are the
 * same operations in the same order, so a row's bits do not depend on which path ran it. */
#define WTILE(name, attr, V, NV, WIDEN, LOADH, LOADF, BCAST, FMA, ZERO, STORE, RB)           \
    attr static void name##_widen(const Args *a, long p, float *wf) {                       \
        const uint8_t *wp = a->w + p * a->K * RB;                                           \
        const uint16_t *dp = a->d + p * a->NG * P, *mp = a->m ? a->m + p * a->NG * P : NULL; \
        for (long g = 0; g < a->NG; g++) {                                                  \
            V dv[NV], mv[NV];                                                               \
            for (int j = 0; j < NV; j++) {                                                  \
                dv[j] = LOADH(dp + g * P + j * (P / NV));                                   \
                mv[j] = mp ? LOADH(mp + g * P + j * (P / NV)) : ZERO();                     \
            }                                                                               \
            long kend = (g + 1) * GS < a->K ? (g + 1) * GS : a->K;                          \
            for (long k = g * GS; k < kend; k++) {                                          \
                V wv[NV];                                                                   \
                WIDEN(wv, wp + k * RB, dv, mv);                                             \
                for (int j = 0; j < NV; j++)                                                \
                    STORE(wf + k * P + j * (P / NV), wv[j]);                                \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    attr INL void name##_ft(const Args *a, const float *wf, long p, long m0, const int mt) { \
        V acc[6][NV];                                                                       \
        for (int i = 0; i < mt; i++)                                                        \
            for (int j = 0; j < NV; j++)                                                    \
                acc[i][j] = ZERO();                                                         \
        for (long k = 0; k < a->K; k++) {                                                   \
            V wv[NV];                                                                       \
            for (int j = 0; j < NV; j++)                                                    \
                wv[j] = LOADF(wf + k * P + j * (P / NV));                                   \
            for (int i = 0; i < mt; i++) {                                                  \
                V xv = BCAST(a->x + (m0 + i) * a->xs + k);                                  \
                for (int j = 0; j < NV; j++)                                                \
                    acc[i][j] = FMA(xv, wv[j], acc[i][j]);                                  \
            }                                                                               \
        }                                                                                   \
        float out[P];                                                                       \
        for (int i = 0; i < mt; i++) {                                                      \
            for (int j = 0; j < NV; j++)                                                    \
                STORE(out + j * (P / NV), acc[i][j]);                                       \
            for (int c = 0; c < P; c++)                                                     \
                store(a, m0 + i, p * P + c, out[c]);                                        \
        }                                                                                   \
    }                                                                                       \
    attr static void name##_f(const Args *a, const float *wf, long p, long m0, int mt) {    \
        switch (mt) {                                                                       \
        case 1: name##_ft(a, wf, p, m0, 1); break;                                          \
        case 2: name##_ft(a, wf, p, m0, 2); break;                                          \
        case 3: name##_ft(a, wf, p, m0, 3); break;                                          \
        case 4: name##_ft(a, wf, p, m0, 4); break;                                          \
        case 5: name##_ft(a, wf, p, m0, 5); break;                                          \
        default: name##_ft(a, wf, p, m0, 6); break;                                         \
        }                                                                                   \
    }

/* AVX-512: two vectors of 16 columns. */
#define A512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
A512 INL __m512 b512(const float *p) { return _mm512_set1_ps(*p); }
A512 INL __m512 h512(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
A512 INL void w8_512(__m512 *wv, const uint8_t *r, const __m512 *dv, const __m512 *mv) {
    (void)mv;
    for (int j = 0; j < 2; j++)
        wv[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(r + 16 * j)))), dv[j]);
}
A512 INL void w4_512(__m512 *wv, const uint8_t *r, const __m512 *dv, const __m512 *mv) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)r));
    wv[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15))), dv[0], mv[0]);
    wv[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), dv[1], mv[1]);
}
TILE(t8_avx512, A512, __m512, 2, w8_512, h512, b512, _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_storeu_ps, P)
TILE(t4_avx512, A512, __m512, 2, w4_512, h512, b512, _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_storeu_ps, P / 2)
WTILE(t8_avx512, A512, __m512, 2, w8_512, h512, _mm512_loadu_ps, b512, _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_storeu_ps, P)
WTILE(t4_avx512, A512, __m512, 2, w4_512, h512, _mm512_loadu_ps, b512, _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_storeu_ps, P / 2)

/* AVX2: four vectors of 8 columns. */
#define A256 __attribute__((target("avx2,fma,f16c")))
A256 INL __m256 b256(const float *p) { return _mm256_set1_ps(*p); }
A256 INL __m256 h256(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
A256 INL void w8_256(__m256 *wv, const uint8_t *r, const __m256 *dv, const __m256 *mv) {
    (void)mv;
    for (int j = 0; j < 4; j++)
        wv[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(r + 8 * j)))), dv[j]);
}
A256 INL void w4_256(__m256 *wv, const uint8_t *r, const __m256 *dv, const __m256 *mv) {
    for (int h = 0; h < 2; h++) {         /* bytes 0-7: columns 0-7 and 16-23; 8-15: 8-15 and 24-31 */
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r + 8 * h)));
        wv[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), dv[h], mv[h]);
        wv[h + 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), dv[h + 2], mv[h + 2]);
    }
}
TILE(t8_avx2, A256, __m256, 4, w8_256, h256, b256, _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_storeu_ps, P)
TILE(t4_avx2, A256, __m256, 4, w4_256, h256, b256, _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_storeu_ps, P / 2)
WTILE(t8_avx2, A256, __m256, 4, w8_256, h256, _mm256_loadu_ps, b256, _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_storeu_ps, P)
WTILE(t4_avx2, A256, __m256, 4, w4_256, h256, _mm256_loadu_ps, b256, _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_storeu_ps, P / 2)
#endif

typedef void (*tile_fn)(const Args *, long, int, long, int);
typedef void (*widen_fn)(const Args *, long, float *);
typedef void (*ftile_fn)(const Args *, const float *, long, long, int);
static tile_fn tile8 = tile_base, tile4 = tile_base;
static widen_fn widen8, widen4;     /* NULL on the baseline: its tiles widen as they go */
static ftile_fn ftile;
static int tile_rows = 6;           /* rows per tile; a lone row takes up to max_panels panels */
static int max_panels = 4;
static const char *variant = "baseline";

static void pick(void) {
#ifdef X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("f16c")) {
        variant = "avx512", tile8 = t8_avx512, tile4 = t4_avx512, tile_rows = 6;
        widen8 = t8_avx512_widen, widen4 = t4_avx512_widen, ftile = t8_avx512_f;
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        variant = "avx2", tile8 = t8_avx2, tile4 = t4_avx2, tile_rows = 2;   /* 8 accumulators of 16 registers */
        widen8 = t8_avx2_widen, widen4 = t4_avx2_widen, ftile = t8_avx2_f;
        max_panels = 2;
        return;
    }
#endif
}

/* More rows than one tile takes (and a scratch to widen into): panel by panel, widened once. */
INL int widened(const Args *a) { return a->M > tile_rows && widen8 != NULL; }

/* Task t: PANELS_PER_TASK panels, every row. Widened: each panel once into the scratch, then
 * tiles of tile_rows rows. Else tiles of tile_rows rows × one panel, and a last tile of one row
 * (two rows) over up to max_panels (max_panels / 2) panels at once. */
static void run_task(void *ctx, long t, void *scratch) {
    const Args *a = ctx;
    long np = (a->N + P - 1) / P, p1 = (t + 1) * PANELS_PER_TASK < np ? (t + 1) * PANELS_PER_TASK : np;
    if (widened(a)) {
        for (long p = t * PANELS_PER_TASK; p < p1; p++) {
            (a->bits == 8 ? widen8 : widen4)(a, p, scratch);
            for (long m = 0; m < a->M; m += tile_rows)
                ftile(a, scratch, p, m, a->M - m < tile_rows ? (int)(a->M - m) : tile_rows);
        }
        return;
    }
    tile_fn tile = a->bits == 8 ? tile8 : tile4;
    for (long m = 0; m < a->M; m += tile_rows) {
        int mt = a->M - m < tile_rows ? (int)(a->M - m) : tile_rows;
        int step = mt == 1 ? max_panels : mt == 2 && max_panels >= 4 ? 2 : 1;
        for (long p = t * PANELS_PER_TASK; p < p1; p += step)
            tile(a, p, p1 - p < step ? (int)(p1 - p) : step, m, mt);
    }
}

static PyObject *matmul(PyObject *self __attribute__((unused)), PyObject *args) {
    QCall c;
    if (qcall_parse(args, &c) < 0)
        return NULL;
    Args a = {.x = c.x, .w = c.w, .d = c.d, .m = c.m, .bias = c.bias, .y = c.y, .M = c.M, .K = c.K,
              .N = c.N, .xs = c.xs, .ys = c.ys, .NG = (c.K + GS - 1) / GS, .bits = c.bits};
    long ntasks = ((a.N + P - 1) / P + PANELS_PER_TASK - 1) / PANELS_PER_TASK;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    if (a.M > 0)
        rc = pool_run(run_task, &a, ntasks, c.nthreads, widened(&a) ? sizeof(float) * (size_t)(a.K * P) : 0);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_NoMemory();
    return PyLong_FromLong(c.nthreads);
}

static PyObject *get_variant(PyObject *self __attribute__((unused)), PyObject *noargs __attribute__((unused))) {
    return PyUnicode_FromString(variant);
}

static PyMethodDef methods[] = {
    {"matmul", matmul, METH_VARARGS,
     "matmul(bits, x, x_row_stride, w, d, m, bias, y, y_row_stride, M, K, N, nthreads) -> threads "
     "used. Pointers as ints (m, bias 0: none), strides in floats; x [M, K] float32; w, d, m in "
     "native/qlinear.c's layout; y [M, N] float32 written."},
    {"variant", get_variant, METH_NOARGS, "the instruction set chosen at import"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "warmpath.models._qlinear",
                                    "Weight-only grouped int8 / int4 linears in C (see native/qlinear.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__qlinear(void) {
    pick();
    return PyModule_Create(&module);
}
