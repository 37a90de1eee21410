/* Rotary position embedding of a step's queries and keys in one call (warmpath.models.rope_op):
 * the same arithmetic as ``RotaryEmbedding.apply`` (llama.py), bit for bit — per pair (a, b) =
 * (x[i], x[i + D/2]) with c = cos[t, i], s = sin[t, i]: a·c − b·s and b·c + a·s, each product
 * and each sum rounded to float32 (built with -ffp-contract=off: no fused multiply-add), so
 * answers do not change. Replaces ~16 small torch operators a layer (chunk, four products, a
 * sum, a difference and a concatenation, for queries and for keys) by one call.
 *
 * qkv [T, row] float32 rows (queries at column 0, keys at H·D), cos and sin [T, D/2] float32,
 * q_out [T, H, D] and k_out [T, KVH, D] contiguous float32. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static void rotate(const float *x, const float *c, const float *s, float *o, long half) {
    for (long i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
        o[i] = ac - bs;
        o[i + half] = bc + as;
    }
}

static PyObject *rope_qk(PyObject *self __attribute__((unused)), PyObject *args) {
    unsigned long long qkv, cs, sn, qo, ko;
    long row, T, H, KVH, D;
    if (!PyArg_ParseTuple(args, "KnnnnnKKKK", &qkv, &row, &T, &H, &KVH, &D, &cs, &sn, &qo, &ko))
        return NULL;
    if (T < 0 || H < 1 || KVH < 1 || D < 2 || D % 2 || row < (H + KVH) * D) {
        PyErr_SetString(PyExc_ValueError, "bad shapes: need T >= 0, H, KVH >= 1, D even >= 2, row >= (H + KVH) * D");
        return NULL;
    }
    const float *x = (const float *)qkv, *c = (const float *)cs, *s = (const float *)sn;
    float *q = (float *)qo, *k = (float *)ko;
    long half = D / 2;
    Py_BEGIN_ALLOW_THREADS
    for (long t = 0; t < T; t++) {
        const float *xt = x + t * row, *ct = c + t * half, *st = s + t * half;
        for (long h = 0; h < H; h++)
            rotate(xt + h * D, ct, st, q + (t * H + h) * D, half);
        for (long h = 0; h < KVH; h++)
            rotate(xt + (H + h) * D, ct, st, k + (t * KVH + h) * D, half);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rope_qk", rope_qk, METH_VARARGS,
     "rope_qk(qkv, row_stride, T, H, KVH, D, cos, sin, q_out, k_out): pointers as ints, the row "
     "stride in floats; writes q_out [T, H, D] and k_out [T, KVH, D]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "warmpath.models._rope",
                                    "Rotary embedding of queries and keys in C (see native/rope.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__rope(void) { return PyModule_Create(&module); }
