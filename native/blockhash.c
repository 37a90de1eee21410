/* warmpath.kv._blockhash: the block hash chain of kv/hashing.py in C (same bytes, bit for bit).
 *
 * Block i's key is XXH3-128 (canonical, big-endian bytes, as xxhash.xxh3_128_digest gives
 * them) of namespace digest (16 B) | parent key (16 B) | the block's token ids (little-endian
 * u32). Python ran one struct.pack and one xxh3 call per block (~0.17 us each); this runs the
 * whole chain in one call with the GIL released while it hashes.
 *
 *   chain(head, parent, packed, block_size[, as_tuple]) -> list (or tuple) of every full
 *       block's key
 *   chain_keys(head, parent, packed, block_size[, prefix]) -> bytes: prefix, then the same
 *       keys back to back (16 B each; no Python object per key: kv/keychain.py)
 *   split(keys) -> tuple of the 16-byte keys of a chain_keys buffer
 *   pack(list_or_tuple) -> bytes                             ids as little-endian u32
 *   common_blocks(a, b, block_size) -> int                   leading full blocks a, b share
 *   KeySet()                                                 a set of 16-byte keys (keyset.c; chain runs: keyruns.c)
 *
 * xxhash.h is xxHash 0.8.4 (BSD-2-Clause, LICENSE.xxhash), the version the xxhash package
 * 4.1.0 bundles; inlined here so the build needs nothing but a C compiler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

int warmpath_add_keyset(PyObject *m);   /* keyset.c */

#if PY_BIG_ENDIAN
#error "warmpath's block keys read token ids as little-endian u32: build on a little-endian machine"
#endif

static int block_bytes(Py_ssize_t block_size, Py_ssize_t *step) {
    if (block_size <= 0 || block_size > (1 << 24)) {
        PyErr_Format(PyExc_ValueError, "block_size must be in [1, 2**24], got %zd", block_size);
        return -1;
    }
    *step = 4 * block_size;
    return 0;
}

/* A list or tuple of n 16-byte bytes objects, one per key of keys. */
static PyObject *key_objects(const unsigned char *keys, Py_ssize_t n, int as_tuple) {
    PyObject *out = as_tuple ? PyTuple_New(n) : PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)keys + 16 * i, 16);
        if (k == NULL)
            Py_CLEAR(out);
        else if (as_tuple)
            PyTuple_SET_ITEM(out, i, k);
        else
            PyList_SET_ITEM(out, i, k);
    }
    return out;
}

/* The keys of packed's first n blocks (step bytes each) into out (room for 16 * n bytes, made
 * by the caller), the GIL released while it hashes. */
static int hash_into(Py_buffer *head, Py_buffer *parent, Py_buffer *packed, Py_ssize_t step,
                     unsigned char *out, Py_ssize_t n) {
    unsigned char *record = PyMem_Malloc(32 + step);
    if (record == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(record, head->buf, 16);
    memcpy(record + 16, parent->buf, 16);
    Py_BEGIN_ALLOW_THREADS
    const unsigned char *src = packed->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(record + 32, src + i * step, (size_t)step);
        XXH128_canonicalFromHash((XXH128_canonical_t *)(out + 16 * i), XXH3_128bits(record, 32 + (size_t)step));
        memcpy(record + 16, out + 16 * i, 16);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(record);
    return 0;
}

static int check_keys(Py_buffer *head, Py_buffer *parent) {
    if (head->len == 16 && parent->len == 16)
        return 0;
    PyErr_SetString(PyExc_ValueError, "head and parent must be 16 bytes");
    return -1;
}

static PyObject *chain(PyObject *self, PyObject *args) {
    Py_buffer head, parent, packed;
    Py_ssize_t block_size, step;
    int as_tuple = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*n|p", &head, &parent, &packed, &block_size, &as_tuple))
        return NULL;
    PyObject *out = NULL;
    unsigned char *keys = NULL;
    if (check_keys(&head, &parent) < 0 || block_bytes(block_size, &step) < 0)
        goto done;
    Py_ssize_t n = packed.len / step;
    keys = PyMem_Malloc(16 * (n ? n : 1));
    if (keys == NULL)
        PyErr_NoMemory();
    else if (hash_into(&head, &parent, &packed, step, keys, n) == 0)
        out = key_objects(keys, n, as_tuple);
done:
    PyMem_Free(keys);
    PyBuffer_Release(&head);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&packed);
    return out;
}

static PyObject *chain_keys(PyObject *self, PyObject *args) {
    Py_buffer head, parent, packed, prefix = {NULL};
    Py_ssize_t block_size, step;
    if (!PyArg_ParseTuple(args, "y*y*y*n|y*", &head, &parent, &packed, &block_size, &prefix))
        return NULL;
    PyObject *out = NULL;
    if (check_keys(&head, &parent) < 0 || block_bytes(block_size, &step) < 0)
        goto done;
    if (prefix.len % 16 != 0) {
        PyErr_SetString(PyExc_ValueError, "prefix must be whole 16-byte keys");
        goto done;
    }
    Py_ssize_t n = packed.len / step;
    out = PyBytes_FromStringAndSize(NULL, prefix.len + 16 * n);    /* no other reference yet */
    if (out == NULL)
        goto done;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    if (prefix.len)
        memcpy(dst, prefix.buf, (size_t)prefix.len);
    if (hash_into(&head, &parent, &packed, step, dst + prefix.len, n) < 0)
        Py_CLEAR(out);
done:
    PyBuffer_Release(&head);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&packed);
    if (prefix.obj != NULL)
        PyBuffer_Release(&prefix);
    return out;
}

static PyObject *split(PyObject *self, PyObject *arg) {
    Py_buffer keys;
    if (PyObject_GetBuffer(arg, &keys, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = keys.len % 16 == 0 ? key_objects(keys.buf, keys.len / 16, 1)
                                       : PyErr_Format(PyExc_ValueError, "split() takes whole 16-byte keys, got %zd bytes", keys.len);
    PyBuffer_Release(&keys);
    return out;
}

static PyObject *pack(PyObject *self, PyObject *seq) {
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) {
        PyErr_SetString(PyExc_TypeError, "pack() takes a list or a tuple of ints");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (out == NULL)
        return NULL;
    uint32_t *dst = (uint32_t *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(seq);   /* a list cannot change: no Python code runs below */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        if (!PyLong_Check(v)) {
            Py_DECREF(out);
            PyErr_Format(PyExc_TypeError, "token id %zd is not an int", i);
            return NULL;
        }
        unsigned long x = PyLong_AsUnsignedLong(v);
        if ((x == (unsigned long)-1 && PyErr_Occurred()) || x > 0xFFFFFFFFUL) {
            Py_DECREF(out);
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError, "token id %zd is not in [0, 2**32)", i);
            return NULL;
        }
        dst[i] = (uint32_t)x;
    }
    return out;
}

static PyObject *common_blocks(PyObject *self, PyObject *args) {
    Py_buffer a, b;
    Py_ssize_t block_size, step;
    if (!PyArg_ParseTuple(args, "y*y*n", &a, &b, &block_size))
        return NULL;
    PyObject *out = NULL;
    if (block_bytes(block_size, &step) == 0) {
        Py_ssize_t n = (a.len < b.len ? a.len : b.len) / step, k = 0;
        const char *pa = a.buf, *pb = b.buf;
        if (n > 0 && memcmp(pa, pb, (size_t)(n * step)) == 0)
            k = n;                       /* the usual follow-up: one memcmp */
        else
            while (k < n && memcmp(pa + k * step, pb + k * step, (size_t)step) == 0)
                k++;
        out = PyLong_FromSsize_t(k);
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return out;
}


static PyMethodDef methods[] = {
    {"chain", chain, METH_VARARGS, "chain(head, parent, packed, block_size[, as_tuple]) -> the 16-byte keys"},
    {"chain_keys", chain_keys, METH_VARARGS,
     "chain_keys(head, parent, packed, block_size[, prefix]) -> bytes: prefix + the 16-byte keys back to back"},
    {"split", split, METH_O, "split(keys) -> tuple of the 16-byte keys of a buffer of them"},
    {"pack", pack, METH_O, "pack(ids) -> bytes: a list or tuple of ints as little-endian u32"},
    {"common_blocks", common_blocks, METH_VARARGS, "common_blocks(a, b, block_size) -> leading equal full blocks"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "warmpath.kv._blockhash",
                                    "warmpath's block hash chain in C (see native/blockhash.c).", -1, methods};

PyMODINIT_FUNC PyInit__blockhash(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && warmpath_add_keyset(m) < 0)
        Py_CLEAR(m);
    return m;
}
