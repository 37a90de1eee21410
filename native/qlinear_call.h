/* The call both grouped-linear extensions take (native/qlinear.c, native/qlinear_a8.c):
 * matmul(bits, x, x_row_stride, w, d, m, bias, y, y_row_stride, M, K, N, nthreads), pointers
 * as ints (m, bias 0: none), strides in floats. Included by each; Python.h comes first. */
#ifndef WARMPATH_QLINEAR_CALL_H
#define WARMPATH_QLINEAR_CALL_H

#include <stdint.h>

typedef struct {
    int bits, nthreads;
    const float *x;
    const uint8_t *w;
    const uint16_t *d, *m;  /* m NULL for 8 bits */
    const float *bias;      /* NULL: none */
    float *y;
    long xs, ys, M, K, N;
} QCall;

/* Multiply-adds under which one thread runs the call (a parallel region costs more). */
#ifndef PARALLEL_MIN_MACS
#define PARALLEL_MIN_MACS (1L << 18)
#endif

/* Parses and checks the arguments (threads: 1 for a small call); 0, or -1 with a Python error. */
static int qcall_parse(PyObject *args, QCall *c) {
    unsigned long long x, w, d, m, bias, y;
    if (!PyArg_ParseTuple(args, "iKnKKKKKnnnni", &c->bits, &x, &c->xs, &w, &d, &m, &bias, &y, &c->ys,
                          &c->M, &c->K, &c->N, &c->nthreads))
        return -1;
    if ((c->bits != 8 && c->bits != 4) || (c->bits == 4 && m == 0)) {
        PyErr_SetString(PyExc_ValueError, "bits must be 8, or 4 with offsets");
        return -1;
    }
    if (c->M < 0 || c->K < 1 || c->N < 1 || c->xs < c->K || c->ys < c->N) {
        PyErr_SetString(PyExc_ValueError, "bad shapes: need M >= 0, K, N >= 1, row strides >= K and N");
        return -1;
    }
    c->x = (const float *)x, c->w = (const uint8_t *)w, c->d = (const uint16_t *)d;
    c->m = c->bits == 4 ? (const uint16_t *)m : NULL;
    c->bias = (const float *)bias, c->y = (float *)y;
    if ((double)c->M * c->K * c->N < PARALLEL_MIN_MACS || c->nthreads < 1)
        c->nthreads = 1;
    return 0;
}

#endif
