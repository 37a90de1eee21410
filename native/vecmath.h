/* VL-lane float vectors (GCC vector extensions) for native/paged_decode.c: loads and stores at
 * any alignment, a horizontal sum in a fixed tree order, dot / axpy / scale over D with a
 * scalar tail, e^x, IEEE half <-> float, and the kernel's two inner loops (a K row's scores for G query heads, a
 * block's weighted V rows), with D's vectors in registers when D is a constant <= 128.
 * Everything is inlined into the kernel, whose variants (AVX-512, AVX2 with FMA, baseline)
 * compile the same operations in the same order. */
#ifndef WARMPATH_VECMATH_H
#define WARMPATH_VECMATH_H

#include <stdint.h>

/* 8 lanes: one AVX2 register. At 16 GCC's AVX2 clone spilled the lanes through the stack
 * (measured: decode attention 5.8x slower on an AVX2-only EPYC); AVX-512 runs the 8 too. */
#ifndef VL
#define VL 8
#endif
typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4), may_alias));   /* unaligned */
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

#define INL static inline __attribute__((always_inline))

typedef uint16_t vhu __attribute__((vector_size(VL * 2), aligned(2), may_alias));   /* VL halves */

INL vf ld(const float *p) { return *(const vfu *)p; }

/* IEEE half → float, exactly (normals and subnormals; the KV cache holds no inf or NaN):
 * the half's exponent and mantissa moved to float's places, scaled by 2^112 to rebias. */
INL vf ldh(const uint16_t *p) {
    vi x = __builtin_convertvector(*(const vhu *)p, vi);
    vf mag = (vf)((x & 0x7fff) << 13) * 0x1p112f;
    return (vf)((vi)mag | ((x & 0x8000) << 16));
}

INL float h2f(uint16_t h) {
    union { uint32_t u; float f; } m = {(uint32_t)(h & 0x7fff) << 13};
    union { float f; uint32_t u; } r = {m.f * 0x1p112f};
    r.u |= (uint32_t)(h & 0x8000) << 16;
    return r.f;
}

/* float → IEEE half, rounded to nearest even (overflow to inf, NaN kept a NaN), as torch's
 * ``.half()``: F. Giesen's branchy formulation (public domain, "float_to_half_fast3_rtne"). */
static inline uint16_t f2h(float f) {
    union { float f; uint32_t u; } x = {f}, magic = {.u = (127 - 15 + 23 - 10 + 1) << 23};
    uint32_t sign = x.u & 0x80000000u;
    x.u ^= sign;
    uint16_t o;
    if (x.u >= (127u + 16) << 23)                       /* ≥ 65536: inf, or NaN */
        o = x.u > 255u << 23 ? 0x7e00 : 0x7c00;
    else if (x.u < 113u << 23) {                        /* a half subnormal or zero */
        x.f += magic.f;
        o = (uint16_t)(x.u - magic.u);
    } else {
        uint32_t odd = (x.u >> 13) & 1;
        x.u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(x.u >> 13);
    }
    return o | (uint16_t)(sign >> 16);
}
INL void st(float *p, vf x) { *(vfu *)p = x; }
INL vf splat(float x) { return (vf){0} + x; }

INL float hsum(vf a) {          /* VL lanes → 1 in a fixed tree order */
#if VL == 16
    vf8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    vf8 b = a;
#endif
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

#define RV (128 / VL)      /* D up to RV * VL = 128 (a multiple of VL): accumulators in registers */

/* The kernel's two inner loops with D's vectors in registers (D a multiple of VL, at most
 * RV * VL), over rows of element type T that LOAD widens VL at a time to floats: a K row's
 * scores for the G query heads, s[g * bsp] = (q_g · k) * scale, and acc += Σ_j p[j] · v_j over
 * a block's n rows (row stride ``row``). Defined once here for float rows (_f32); the kernel
 * defines them again for float16 rows widened by F16C, under its own target attribute. */
#define ROW_LOOPS(sfx, attr, T, LOAD)                                                          \
    attr INL void scores_##sfx(const float *restrict q, const T *restrict k, float *restrict s, \
                               long G, long bsp, float scale, const long D) {                  \
        vf kr[RV];                                                                           \
        for (long c = 0; c < D / VL; c++)                                                    \
            kr[c] = LOAD(k + c * VL);                                                        \
        for (long g = 0; g < G; g++) {                                                       \
            vf acc = {0};                                                                    \
            for (long c = 0; c < D / VL; c++)                                                \
                acc += ld(q + g * D + c * VL) * kr[c];                                       \
            s[g * bsp] = hsum(acc) * scale;                                                  \
        }                                                                                    \
    }                                                                                        \
    attr INL void accumulate_##sfx(float *restrict acc, const float *restrict p,              \
                                   const T *restrict v, long n, long row, const long D) {     \
        vf r[RV];                                                                            \
        for (long c = 0; c < D / VL; c++)                                                    \
            r[c] = ld(acc + c * VL);                                                         \
        for (long j = 0; j < n; j++) {                                                       \
            vf pj = splat(p[j]);                                                             \
            for (long c = 0; c < D / VL; c++)                                                \
                r[c] += pj * LOAD(v + j * row + c * VL);                                     \
        }                                                                                    \
        for (long c = 0; c < D / VL; c++)                                                    \
            st(acc + c * VL, r[c]);                                                          \
    }
ROW_LOOPS(f32, , float, ld)

/* Scores of one K row for the G query heads (any D). */
INL void scores(const float *restrict q, const float *restrict k, float *restrict s, long G,
                long bsp, float scale, const long D) {
    if (D % VL == 0 && D <= RV * VL) {
        scores_f32(q, k, s, G, bsp, scale, D);
        return;
    }
    for (long g = 0; g < G; g++)
        s[g * bsp] = dot(q + g * D, k, D) * scale;
}

/* acc += Σ_j p[j] · v_j over the n rows of a block (any D). */
INL void accumulate(float *restrict acc, const float *restrict p, const float *restrict v, long n,
                    long row, const long D) {
    if (D % VL == 0 && D <= RV * VL) {
        accumulate_f32(acc, p, v, n, row, D);
        return;
    }
    for (long j = 0; j < n; j++)
        axpy(acc, p[j], v + j * row, D);
}

#endif
