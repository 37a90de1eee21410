/* y = x · Wᵀ + bias with integer dot products: W in groups of 32 weights along K (8 bits: GGML's
 * Q8_0, 4 bits: Q4_1, as native/qlinear.c), x quantized per row in groups of 32 to int8 with one
 * float scale each (GGML's Q8_1): ``--quantization int8a8 | int4a8``, llama.cpp's arithmetic.
 *
 * Per row m and group g: s = max|x| / 127, q_x = round-to-nearest-even(x · 127 / max|x|)
 * (0 when the group is all zero), X = Σ q_x. Per column n: I = Σ_k q_x,k · u_k with u the
 * stored unsigned weight (4 bits: q_w in [0, 15]; 8 bits: q_w + 128), exact in int32; then
 *   8 bits: y += (s · d) · (I − 128 X)
 *   4 bits: y += (s · d) · I,  y += (s · m) · X
 * each a fused multiply-add, groups in order, then + bias. Integer sums are exact and the float
 * steps are the same operations on every variant (AVX-512 VNNI, AVX2, baseline with fmaf), so
 * a row's output is the same bits on every variant, alone or in any batch.
 *
 * Weight layout, per panel of 32 columns and group: u in blocks of 64 bytes, each 16 columns ×
 * 4 consecutive k (byte (c, r) at c·4 + r): what one vpdpbusd takes. 8 bits: 8 k-quads × 2
 * halves of 16 columns, [NP, NG, 8, 2, 64] bytes. 4 bits: nibbles, k-quads j and j + 4 in one
 * byte (low, high), [NP, NG, 4, 2, 64]. Scales and offsets as native/qlinear.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qlinear_call.h"
#include "taskpool.h"
#include "vecmath.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#define X86 1
#endif

#define P 32
#define GS 32
#define PANELS_PER_TASK 4

typedef struct {
    const int8_t *xq;       /* [M, NG * 32] */
    const float *xs;        /* [M, NG] */
    const int32_t *xsum;    /* [M, NG] */
    const uint8_t *w;       /* [NP, NG, group bytes] */
    const uint16_t *d, *m;  /* [NP, NG, P] halves; m NULL for 8 bits */
    const float *bias;
    float *y;
    long M, N, ys, NG;
    int bits;
} Args;

INL long group_bytes(int bits) { return bits == 8 ? 1024 : 512; }

/* Row m's group g of x: the quantized bytes (zero past K), scale and Σ q. */
static void quantize_rows(const float *x, long xs, long M, long K, long NG, int8_t *xq, float *sc, int32_t *sum) {
    for (long m = 0; m < M; m++)
        for (long g = 0; g < NG; g++) {
            const float *src = x + m * xs + g * GS;
            long n = K - g * GS < GS ? K - g * GS : GS;
            float amax = 0.f;
            for (long i = 0; i < n; i++)
                amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
            int8_t *dst = xq + (m * NG + g) * GS;
            int32_t s = 0;
            float inv = amax > 0.f ? 127.f / amax : 0.f;
            for (long i = 0; i < GS; i++) {
                int v = i < n ? (int)rintf(src[i] * inv) : 0;
                v = v > 127 ? 127 : v < -127 ? -127 : v;
                dst[i] = (int8_t)v;
                s += v;
            }
            sc[m * NG + g] = amax / 127.f;
            sum[m * NG + g] = s;
        }
}

/* One column's group: the exact integer sum I. */
INL int32_t col_isum(const Args *a, const uint8_t *blk, const int8_t *xq, int c) {
    int32_t s = 0;
    int half = c / 16, cc = c % 16;
    for (int t = 0; t < GS; t++) {
        int quad = t / 4, r = t % 4, u;
        if (a->bits == 8) {
            u = blk[(quad * 2 + half) * 64 + cc * 4 + r];
        } else {
            uint8_t b = blk[((quad % 4) * 2 + half) * 64 + cc * 4 + r];
            u = quad < 4 ? b & 15 : b >> 4;
        }
        s += u * xq[t];
    }
    return s;
}

/* The float steps of one group, the same on every variant. */
INL float group_step(int bits, float y, int32_t isum, int32_t xsum, float s, float d, float mo) {
    if (bits == 8)
        return fmaf((float)(isum - 128 * xsum), s * d, y);
    y = fmaf((float)isum, s * d, y);
    return fmaf(s * mo, (float)xsum, y);
}

static void tile_base(const Args *a, long p0, int np, long m0, int mt) {
    for (int q = 0; q < np; q++) {
        long p = p0 + q;
        for (int i = 0; i < mt; i++) {
            long m = m0 + i;
            for (int c = 0; c < P; c++) {
                float y = 0.f;
                for (long g = 0; g < a->NG; g++) {
                    const uint8_t *blk = a->w + (p * a->NG + g) * group_bytes(a->bits);
                    int32_t is = col_isum(a, blk, a->xq + (m * a->NG + g) * GS, c);
                    long o = (p * a->NG + g) * P + c;
                    y = group_step(a->bits, y, is, a->xsum[m * a->NG + g], a->xs[m * a->NG + g],
                                   h2f(a->d[o]), a->m ? h2f(a->m[o]) : 0.f);
                }
                if (p * P + c < a->N)
                    a->y[m * a->ys + p * P + c] = a->bias ? y + a->bias[p * P + c] : y;
            }
        }
    }
}

INL int32_t ld32(const int8_t *p) {    /* 4 bytes of x as one int32 (any alignment) */
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#ifdef X86
#define AVNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")))

/* mt rows × np panels; per group one int32 accumulator per (row, panel, half of 16 columns),
 * folded into the float sums at the group's end. BITS, MT and NP constants at the call site. */
AVNNI INL void vnni_t(const Args *a, long p0, long m0, const int mt, const int np, const int bits) {
    __m512 fy[6][8];
    for (int i = 0; i < mt; i++)
        for (int j = 0; j < 2 * np; j++)
            fy[i][j] = _mm512_setzero_ps();
    const __m512i lo4 = _mm512_set1_epi8(15);
    for (long g = 0; g < a->NG; g++) {
        __m512i ia[6][8];
        for (int i = 0; i < mt; i++)
            for (int j = 0; j < 2 * np; j++)
                ia[i][j] = _mm512_setzero_si512();
        const int8_t *xg[6];
        for (int i = 0; i < mt; i++)
            xg[i] = a->xq + ((m0 + i) * a->NG + g) * GS;
        for (int q = 0; q < np; q++) {
            const uint8_t *blk = a->w + ((p0 + q) * a->NG + g) * group_bytes(bits);
            if (bits == 8) {
                for (int quad = 0; quad < 8; quad++)
                    for (int h = 0; h < 2; h++) {
                        __m512i u = _mm512_loadu_si512(blk + (quad * 2 + h) * 64);
                        for (int i = 0; i < mt; i++)
                            ia[i][2 * q + h] = _mm512_dpbusd_epi32(ia[i][2 * q + h], u,
                                                                    _mm512_set1_epi32(ld32(xg[i] + quad * 4)));
                    }
            } else {
                for (int pair = 0; pair < 4; pair++)
                    for (int h = 0; h < 2; h++) {
                        __m512i b = _mm512_loadu_si512(blk + (pair * 2 + h) * 64);
                        __m512i ulo = _mm512_and_si512(b, lo4);
                        __m512i uhi = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4);
                        for (int i = 0; i < mt; i++) {
                            __m512i v = _mm512_dpbusd_epi32(ia[i][2 * q + h], ulo,
                                                            _mm512_set1_epi32(ld32(xg[i] + pair * 4)));
                            ia[i][2 * q + h] = _mm512_dpbusd_epi32(v, uhi,
                                                                   _mm512_set1_epi32(ld32(xg[i] + (pair + 4) * 4)));
                        }
                    }
            }
        }
        for (int q = 0; q < np; q++)
            for (int h = 0; h < 2; h++) {
                long o = ((p0 + q) * a->NG + g) * P + h * 16;
                __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a->d + o)));
                __m512 mo = bits == 4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a->m + o)))
                                      : _mm512_setzero_ps();
                for (int i = 0; i < mt; i++) {
                    long r = (m0 + i) * a->NG + g;
                    __m512 s = _mm512_set1_ps(a->xs[r]);
                    __m512i isum = ia[i][2 * q + h];
                    if (bits == 8) {
                        isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(128 * a->xsum[r]));
                        fy[i][2 * q + h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, d), fy[i][2 * q + h]);
                    } else {
                        __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s, d), fy[i][2 * q + h]);
                        fy[i][2 * q + h] = _mm512_fmadd_ps(_mm512_mul_ps(s, mo), _mm512_set1_ps((float)a->xsum[r]), t);
                    }
                }
            }
    }
    for (int i = 0; i < mt; i++)
        for (int q = 0; q < np; q++) {
            float out[P];
            _mm512_storeu_ps(out, fy[i][2 * q]);
            _mm512_storeu_ps(out + 16, fy[i][2 * q + 1]);
            for (int c = 0; c < P; c++) {
                long n = (p0 + q) * P + c;
                if (n < a->N)
                    a->y[(m0 + i) * a->ys + n] = a->bias ? out[c] + a->bias[n] : out[c];
            }
        }
}

/* quantize_rows on AVX-512 (the VNNI variant's machines): the same products, the same
 * round-to-nearest-even (vcvtps2dq under the default rounding mode, as rintf) and exact max and
 * sum, so the same bytes; ~15x faster than the scalar loop, which cost ~3 ms of a batch-16 step. */
AVNNI static void quantize_rows_avx512(const float *x, long xs, long M, long K, long NG, int8_t *xq,
                                       float *sc, int32_t *sum) {
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    for (long m = 0; m < M; m++)
        for (long g = 0; g < NG; g++) {
            const float *src = x + m * xs + g * GS;
            long n = K - g * GS < GS ? K - g * GS : GS;
            __mmask16 k0 = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
            __mmask16 k1 = n >= 32 ? 0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
            __m512 a = _mm512_maskz_loadu_ps(k0, src), b = _mm512_maskz_loadu_ps(k1, src + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
            __m512i qa = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), hi), lo);
            __m512i qb = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, inv)), hi), lo);
            int8_t *dst = xq + (m * NG + g) * GS;
            _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128((__m128i *)(dst + 16), _mm512_cvtepi32_epi8(qb));
            sc[m * NG + g] = amax / 127.f;
            sum[m * NG + g] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        }
}

#define VNNI_CASES(BITS)                                                          \
    switch (mt * 8 + np) {                                                        \
    case 8 + 4: vnni_t(a, p0, m0, 1, 4, BITS); break;                             \
    case 8 + 3: vnni_t(a, p0, m0, 1, 3, BITS); break;                             \
    case 8 + 2: vnni_t(a, p0, m0, 1, 2, BITS); break;                             \
    case 8 + 1: vnni_t(a, p0, m0, 1, 1, BITS); break;                             \
    case 16 + 2: vnni_t(a, p0, m0, 2, 2, BITS); break;                            \
    case 16 + 1: vnni_t(a, p0, m0, 2, 1, BITS); break;                            \
    case 24 + 1: vnni_t(a, p0, m0, 3, 1, BITS); break;                            \
    case 32 + 1: vnni_t(a, p0, m0, 4, 1, BITS); break;                            \
    case 40 + 1: vnni_t(a, p0, m0, 5, 1, BITS); break;                            \
    default: vnni_t(a, p0, m0, 6, 1, BITS); break;                                \
    }
AVNNI static void tile_vnni8(const Args *a, long p0, int np, long m0, int mt) { VNNI_CASES(8) }
AVNNI static void tile_vnni4(const Args *a, long p0, int np, long m0, int mt) { VNNI_CASES(4) }
/* AVX2 (no VNNI): u8 × s8 pairs by vpmaddubsw, then pairs of pairs by vpmaddwd: one row, one
 * panel, four vectors of 8 columns. 4 bits: u ≤ 15, so a pair never saturates int16. 8 bits:
 * u − 128 = q (a sign flip of the top bit), |q| · sign(x, q) ≤ 127 · 127 per product, and the
 * sum is Σ q · x = I − 128 X: the same integer the VNNI path folds. */
#define A2 __attribute__((target("avx2,fma,f16c")))
A2 INL __m256i dot4_avx2(__m256i acc, __m256i u, __m256i x) {
    __m256i pairs = _mm256_maddubs_epi16(u, x);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

A2 INL void avx2_t(const Args *a, long p, long m, const int bits) {
    __m256 fy[4];
    for (int j = 0; j < 4; j++)
        fy[j] = _mm256_setzero_ps();
    const __m256i lo4 = _mm256_set1_epi8(15), top = _mm256_set1_epi8((char)0x80);
    for (long g = 0; g < a->NG; g++) {
        __m256i ia[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        const int8_t *xg = a->xq + (m * a->NG + g) * GS;
        const uint8_t *blk = a->w + (p * a->NG + g) * group_bytes(bits);
        for (int unit = 0; unit < (bits == 8 ? 8 : 4); unit++)
            for (int h = 0; h < 2; h++)
                for (int v = 0; v < 2; v++) {           /* columns h·16 + v·8 .. + 7 */
                    __m256i b = _mm256_loadu_si256((const __m256i *)(blk + (unit * 2 + h) * 64 + v * 32));
                    int j = h * 2 + v;
                    if (bits == 8) {
                        __m256i q = _mm256_xor_si256(b, top);
                        __m256i x = _mm256_set1_epi32(ld32(xg + unit * 4));
                        ia[j] = dot4_avx2(ia[j], _mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
                    } else {
                        __m256i ulo = _mm256_and_si256(b, lo4);
                        __m256i uhi = _mm256_and_si256(_mm256_srli_epi16(b, 4), lo4);
                        ia[j] = dot4_avx2(ia[j], ulo, _mm256_set1_epi32(ld32(xg + unit * 4)));
                        ia[j] = dot4_avx2(ia[j], uhi, _mm256_set1_epi32(ld32(xg + (unit + 4) * 4)));
                    }
                }
        long r = m * a->NG + g;
        __m256 s = _mm256_set1_ps(a->xs[r]);
        for (int j = 0; j < 4; j++) {
            long o = (p * a->NG + g) * P + j * 8;
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a->d + o)));
            if (bits == 8) {
                fy[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[j]), _mm256_mul_ps(s, d), fy[j]);
            } else {
                __m256 mo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a->m + o)));
                __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[j]), _mm256_mul_ps(s, d), fy[j]);
                fy[j] = _mm256_fmadd_ps(_mm256_mul_ps(s, mo), _mm256_set1_ps((float)a->xsum[r]), t);
            }
        }
    }
    float out[P];
    for (int j = 0; j < 4; j++)
        _mm256_storeu_ps(out + j * 8, fy[j]);
    for (int c = 0; c < P; c++) {
        long n = p * P + c;
        if (n < a->N)
            a->y[m * a->ys + n] = a->bias ? out[c] + a->bias[n] : out[c];
    }
}

A2 static void tile_avx2_8(const Args *a, long p0, int np, long m0, int mt) {
    for (int i = 0; i < mt; i++)
        for (int q = 0; q < np; q++)
            avx2_t(a, p0 + q, m0 + i, 8);
}
A2 static void tile_avx2_4(const Args *a, long p0, int np, long m0, int mt) {
    for (int i = 0; i < mt; i++)
        for (int q = 0; q < np; q++)
            avx2_t(a, p0 + q, m0 + i, 4);
}
#endif


typedef void (*tile_fn)(const Args *, long, int, long, int);
static tile_fn tile8 = tile_base, tile4 = tile_base;
static int tile_rows = 1, max_panels = 1;
typedef void (*quantize_fn)(const float *, long, long, long, long, int8_t *, float *, int32_t *);
static quantize_fn quantize = quantize_rows;
static const char *variant = "baseline";

/* WARMPATH_QLINEAR_VARIANT=baseline keeps the portable code, =avx2 skips VNNI (the tests
 * compare their bits). */
static void pick(void) {
    const char *force = getenv("WARMPATH_QLINEAR_VARIANT");
    if (force && strcmp(force, "baseline") == 0)
        return;
    int skip_vnni = force && strcmp(force, "avx2") == 0;
#ifdef X86
    __builtin_cpu_init();
    if (!skip_vnni && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")) {
        variant = "avx512vnni", tile8 = tile_vnni8, tile4 = tile_vnni4, tile_rows = 6, max_panels = 4;
        quantize = quantize_rows_avx512;
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        variant = "avx2", tile8 = tile_avx2_8, tile4 = tile_avx2_4, tile_rows = 1, max_panels = 1;
        return;
    }
#endif
}

static void run_task(void *ctx, long t, void *scratch) {
    (void)scratch;
    const Args *a = ctx;
    tile_fn tile = a->bits == 8 ? tile8 : tile4;
    long np = (a->N + P - 1) / P, p1 = (t + 1) * PANELS_PER_TASK < np ? (t + 1) * PANELS_PER_TASK : np;
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
    Args a = {.w = c.w, .d = c.d, .m = c.m, .bias = c.bias, .y = c.y, .M = c.M, .N = c.N, .ys = c.ys,
              .NG = (c.K + GS - 1) / GS, .bits = c.bits};
    size_t rows = (size_t)(a.M > 0 ? a.M : 1) * (size_t)a.NG;
    int8_t *xq = malloc(rows * GS);
    float *sc = malloc(rows * sizeof(float));
    int32_t *sum = malloc(rows * sizeof(int32_t));
    if (!xq || !sc || !sum) {
        free(xq), free(sc), free(sum);
        return PyErr_NoMemory();
    }
    a.xq = xq, a.xs = sc, a.xsum = sum;
    long ntasks = ((a.N + P - 1) / P + PANELS_PER_TASK - 1) / PANELS_PER_TASK;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    if (a.M > 0) {
        quantize(c.x, c.xs, a.M, c.K, a.NG, xq, sc, sum);
        rc = pool_run(run_task, &a, ntasks, c.nthreads, 0);
    }
    Py_END_ALLOW_THREADS
    free(xq), free(sc), free(sum);
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
     "used, over native/qlinear_a8.c's layout; x [M, K] float32 (quantized per call), y written."},
    {"variant", get_variant, METH_NOARGS, "the instruction set chosen at import"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "warmpath.models._qlinear_a8",
                                    "Grouped int8 / int4 weights times int8 activations (native/qlinear_a8.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__qlinear_a8(void) {
    pick();
    return PyModule_Create(&module);
}
