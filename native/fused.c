/* The elementwise work of a decoder layer in the int8-activation modes (``--quantization
 * int8a8 | int4a8``), one call where torch runs five to seven operators (warmpath.models._fused,
 * used by models/fused_op.py):
 *
 *   add_rmsnorm: x += h (optional: the residual of the layer before, in place), then
 *                out = w * (x * 1 / sqrt(mean(x^2) + eps)) per row;
 *   silu_mul:    out = silu(g) * u for each row [g | u] of the fused gate|up projection,
 *                silu(g) = g / (1 + e^-g).
 *
 * The sum of squares runs in VL lanes and is folded in vecmath.h's fixed tree order, e^x is
 * vecmath.h's polynomial: not torch's bits (its reductions and exp differ in the last places;
 * these modes compute llama.cpp's arithmetic, not torch's), but the same bits on every path —
 * a row's result does not depend on its batch, the thread that ran it or the CPU variant
 * (AVX-512, AVX2, baseline: the same operations in the same order, contraction off).
 * Rows are split among torch's OpenMP team (taskpool.c) when there are many. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "taskpool.h"
#include "vecmath.h"

typedef struct {
    float *x, *out;
    const float *h, *w;
    long x_row, h_row, out_row, m, d, rows_per_task;
    float eps;
} norm_args;

typedef struct {
    const float *gu;
    float *out;
    long gu_row, out_row, m, inter, rows_per_task;
} silu_args;

/* silu(g) = g / (1 + e^-g) per lane; e^-g clamped at e^88 (silu is -0 there already). */
INL vf silu(vf g) {
    vf e = -g;
    vi high = e > 88.0f;
    e = (vf)(((vi)e & ~high) | ((vi)splat(88.0f) & high));
    return g / (1.0f + vexp(e));
}

#define KERNELS(sfx, attr)                                                                    \
    attr static void norm_rows_##sfx(void *ctx, long task, void *scratch) {                  \
        (void)scratch;                                                                        \
        const norm_args *a = ctx;                                                             \
        long end = (task + 1) * a->rows_per_task < a->m ? (task + 1) * a->rows_per_task : a->m; \
        for (long r = task * a->rows_per_task; r < end; r++) {                                \
            float *x = a->x + r * a->x_row, *o = a->out + r * a->out_row;                     \
            long d = a->d, i = 0;                                                             \
            if (a->h) {                                                                       \
                const float *h = a->h + r * a->h_row;                                         \
                for (; i + VL <= d; i += VL) st(x + i, ld(x + i) + ld(h + i));                \
                for (; i < d; i++) x[i] += h[i];                                              \
            }                                                                                 \
            vf acc = {0};                                                                     \
            for (i = 0; i + VL <= d; i += VL) { vf v = ld(x + i); acc += v * v; }             \
            float ss = hsum(acc);                                                             \
            for (; i < d; i++) ss += x[i] * x[i];                                             \
            float inv = 1.0f / sqrtf(ss / (float)d + a->eps);                                 \
            vf vinv = splat(inv);                                                             \
            for (i = 0; i + VL <= d; i += VL) st(o + i, ld(a->w + i) * (ld(x + i) * vinv));  \
            for (; i < d; i++) o[i] = a->w[i] * (x[i] * inv);                                 \
        }                                                                                     \
    }                                                                                         \
    attr static void silu_rows_##sfx(void *ctx, long task, void *scratch) {                  \
        (void)scratch;                                                                        \
        const silu_args *a = ctx;                                                             \
        long end = (task + 1) * a->rows_per_task < a->m ? (task + 1) * a->rows_per_task : a->m; \
        for (long r = task * a->rows_per_task; r < end; r++) {                                \
            const float *g = a->gu + r * a->gu_row, *u = g + a->inter;                        \
            float *o = a->out + r * a->out_row;                                               \
            long n = a->inter, i = 0;                                                         \
            for (; i + VL <= n; i += VL) st(o + i, silu(ld(g + i)) * ld(u + i));              \
            for (; i < n; i++) o[i] = silu(splat(g[i]))[0] * u[i];    /* the same lane math */ \
        }                                                                                     \
    }

KERNELS(base, )
KERNELS(avx2, __attribute__((target("avx2"))))
KERNELS(avx512, __attribute__((target("avx512f,avx2"))))

static pool_task_fn norm_rows = norm_rows_base, silu_rows = silu_rows_base;
static const char *variant_name = "baseline";

/* Rows per task: whole rows, about 64K elements a task, so a decode step's few rows run on the
 * calling thread alone (no team woken) and a prefill's thousands spread over the team. */
static long rows_per_task(long m, long d) {
    long r = 65536 / (d > 0 ? d : 1);
    return r < 1 ? 1 : (r > m ? (m > 0 ? m : 1) : r);
}

/* Runs fn over the rows in tasks of ``per`` rows: on the calling thread when one task holds
 * them all, else on torch's team. Returns None, or raises MemoryError. */
static PyObject *run_rows(pool_task_fn fn, void *args, long m, long per, int threads) {
    long tasks = m ? (m + per - 1) / per : 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tasks == 1 ? (fn(args, 0, NULL), 0) : pool_run(fn, args, tasks, threads, 0);
    Py_END_ALLOW_THREADS
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_add_rmsnorm(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long x, h, w, out;
    Py_ssize_t x_row, h_row, out_row, m, d;
    float eps;
    int threads;
    if (!PyArg_ParseTuple(args, "KnKnKKnnnfi", &x, &x_row, &h, &h_row, &w, &out, &out_row, &m, &d, &eps,
                          &threads))
        return NULL;
    if (m < 0 || d <= 0) {
        PyErr_SetString(PyExc_ValueError, "add_rmsnorm: m must be >= 0 and d > 0");
        return NULL;
    }
    norm_args a = {(float *)(uintptr_t)x, (float *)(uintptr_t)out, (const float *)(uintptr_t)h,
                   (const float *)(uintptr_t)w, x_row, h_row, out_row, m, d, rows_per_task(m, d), eps};
    return run_rows(norm_rows, &a, m, a.rows_per_task, threads);
}

static PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long gu, out;
    Py_ssize_t gu_row, out_row, m, inter;
    int threads;
    if (!PyArg_ParseTuple(args, "KnKnnni", &gu, &gu_row, &out, &out_row, &m, &inter, &threads))
        return NULL;
    if (m < 0 || inter <= 0) {
        PyErr_SetString(PyExc_ValueError, "silu_mul: m must be >= 0 and inter > 0");
        return NULL;
    }
    silu_args a = {(const float *)(uintptr_t)gu, (float *)(uintptr_t)out, gu_row, out_row, m, inter,
                   rows_per_task(m, 2 * inter)};
    return run_rows(silu_rows, &a, m, a.rows_per_task, threads);
}

static PyObject *py_variant(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyUnicode_FromString(variant_name);
}

static PyMethodDef methods[] = {
    {"add_rmsnorm", py_add_rmsnorm, METH_VARARGS,
     "add_rmsnorm(x, x_row, h, h_row, w, out, out_row, m, d, eps, threads): x += h (h = 0: none), "
     "out = w * x / sqrt(mean(x^2) + eps) per row; float32 pointers, row strides in elements."},
    {"silu_mul", py_silu_mul, METH_VARARGS,
     "silu_mul(gu, gu_row, out, out_row, m, inter, threads): out = silu(g) * u per row [g | u]."},
    {"variant", py_variant, METH_NOARGS, "avx512 | avx2 | baseline: the code this CPU runs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fused(void) {
    const char *force = getenv("WARMPATH_QLINEAR_VARIANT");    /* the tests force each variant */
    int want512 = !force || !strcmp(force, "avx512vnni") || !strcmp(force, "avx512");
    int want2 = !force || want512 || !strcmp(force, "avx2");
    if (want512 && __builtin_cpu_supports("avx512f")) {
        norm_rows = norm_rows_avx512, silu_rows = silu_rows_avx512, variant_name = "avx512";
    } else if (want2 && __builtin_cpu_supports("avx2")) {
        norm_rows = norm_rows_avx2, silu_rows = silu_rows_avx2, variant_name = "avx2";
    }
    return PyModule_Create(&module);
}
