/* warmpath.kv._blockhash.KeySet: a set of 16-byte block keys stored inline, for the router
 * index's certified sets and its mirrors of the held sets (warmpath/router/index.py); part of
 * the module native/blockhash.c defines. xxhash.h: see blockhash.c. Runs of a chain
 * (run, closed_run, certify) and discard(_all): keyruns.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"
#include "keyset.h"

/* Open addressing, linear probing, load <= 1/2. A key's slot comes from XXH3-64 of its 16
 * bytes under a per-process random seed: the keys are xxh3 outputs a client can grind, so
 * their own bits are never used as the slot (no crafted probe chains). One cache line per
 * probe instead of a Python set's entry, key object and its bytes. */

static uint64_t keyset_seed;

uint64_t warmpath_keyset_hash(const unsigned char *key) {
    return XXH3_64bits_withSeed(key, 16, keyset_seed);
}

size_t warmpath_keyset_home(const KeySet *s, const unsigned char *key) {
    return (size_t)warmpath_keyset_hash(key) & ((size_t)s->cap - 1);
}

static int keyset_alloc(KeySet *s, Py_ssize_t cap) {
    unsigned char *keys = PyMem_Malloc((size_t)cap * 16), *used = PyMem_Calloc((size_t)cap, 1);
    if (keys == NULL || used == NULL) {
        PyMem_Free(keys);
        PyMem_Free(used);
        PyErr_NoMemory();
        return -1;
    }
    s->keys = keys, s->used = used, s->cap = cap, s->n = 0;
    return 0;
}

Py_ssize_t warmpath_keyset_find(const KeySet *s, const unsigned char *key, uint64_t h, int *found) {
    size_t mask = (size_t)s->cap - 1, i = (size_t)h & mask;
    while (s->used[i]) {
        if (memcmp(s->keys + 16 * i, key, 16) == 0) {
            *found = 1;
            return (Py_ssize_t)i;
        }
        i = (i + 1) & mask;
    }
    *found = 0;
    return (Py_ssize_t)i;
}

Py_ssize_t warmpath_keyset_slot(const KeySet *s, const unsigned char *key, int *found) {
    return warmpath_keyset_find(s, key, warmpath_keyset_hash(key), found);
}

static void keyset_put(KeySet *s, const unsigned char *key, uint64_t h) {   /* room: reserved */
    int found;
    Py_ssize_t i = warmpath_keyset_find(s, key, h, &found);
    if (!found) {
        memcpy(s->keys + 16 * i, key, 16);
        s->used[i] = 1;
        s->n++;
    }
}

int warmpath_keyset_reserve(KeySet *s, Py_ssize_t more) {      /* one rehash at most */
    Py_ssize_t cap = s->cap;
    while (2 * (s->n + more) > cap)
        cap *= 2;
    if (cap == s->cap)
        return 0;
    KeySet old = *s;
    if (keyset_alloc(s, cap) < 0) {
        *s = old;
        return -1;
    }
    for (Py_ssize_t i = 0; i < old.cap; i++)
        if (old.used[i])
            keyset_put(s, old.keys + 16 * i, warmpath_keyset_hash(old.keys + 16 * i));
    PyMem_Free(old.keys);
    PyMem_Free(old.used);
    return 0;
}

int warmpath_keyset_add_h(KeySet *s, const unsigned char *key, uint64_t h) {
    if (warmpath_keyset_reserve(s, 1) < 0)
        return -1;
    keyset_put(s, key, h);
    return 0;
}

int warmpath_keyset_add(KeySet *s, const unsigned char *key) {
    return warmpath_keyset_add_h(s, key, warmpath_keyset_hash(key));
}

static const unsigned char *key_bytes(PyObject *k) {
    if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) != 16) {
        PyErr_SetString(PyExc_TypeError, "KeySet holds 16-byte bytes keys");
        return NULL;
    }
    return (const unsigned char *)PyBytes_AS_STRING(k);
}

static PyObject *keyset_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if ((kw != NULL && PyDict_GET_SIZE(kw) > 0) || !PyArg_ParseTuple(args, ":KeySet")) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "KeySet() takes no arguments");
        return NULL;
    }
    KeySet *s = (KeySet *)type->tp_alloc(type, 0);
    if (s != NULL && keyset_alloc(s, 16) < 0)
        Py_CLEAR(s);
    return (PyObject *)s;
}

static void keyset_dealloc(KeySet *s) {
    PyMem_Free(s->keys);
    PyMem_Free(s->used);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Py_ssize_t keyset_len(KeySet *s) { return s->n; }

static int keyset_contains(KeySet *s, PyObject *k) {
    if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) != 16)
        return 0;
    int found;
    warmpath_keyset_slot(s, (const unsigned char *)PyBytes_AS_STRING(k), &found);
    return found;
}

static PyObject *keyset_add(KeySet *s, PyObject *k) {
    const unsigned char *key = key_bytes(k);
    if (key == NULL || warmpath_keyset_add(s, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Add a sequence's keys with at most one rehash; skip_other: pass over anything that is not a
 * 16-byte key (absorb) instead of raising (update). */
static PyObject *add_all(KeySet *s, PyObject *iterable, int skip_other) {
    PyObject *seq = PySequence_Fast(iterable, "KeySet.update() / absorb() take an iterable of keys");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (warmpath_keyset_reserve(s, n) < 0)   /* at most one rehash for the whole batch */
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = items[i];
        if (skip_other && !(PyBytes_Check(k) && PyBytes_GET_SIZE(k) == 16))
            continue;
        const unsigned char *key = key_bytes(k);
        if (key == NULL || warmpath_keyset_add(s, key) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *keyset_update(KeySet *s, PyObject *keys) { return add_all(s, keys, 0); }

static PyObject *keyset_absorb(KeySet *s, PyObject *keys) { return add_all(s, keys, 1); }

static PyObject *keyset_clear(KeySet *s, PyObject *unused) {
    KeySet old = *s;
    if (keyset_alloc(s, 16) < 0) {
        *s = old;
        return NULL;
    }
    PyMem_Free(old.keys);
    PyMem_Free(old.used);
    Py_RETURN_NONE;
}

static PyObject *keyset_iter(KeySet *s) {          /* a list's iterator over a copy: no mutation hazard */
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < s->cap; i++) {
        if (!s->used[i])
            continue;
        PyObject *k = PyBytes_FromStringAndSize((const char *)s->keys + 16 * i, 16);
        if (k == NULL || PyList_Append(out, k) < 0)
            Py_CLEAR(out);
        Py_XDECREF(k);
    }
    if (out == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(out);
    Py_DECREF(out);
    return it;
}

static PySequenceMethods keyset_as_sequence = {
    .sq_length = (lenfunc)keyset_len,
    .sq_contains = (objobjproc)keyset_contains,
};

static PyMethodDef keyset_methods[] = {
    {"add", (PyCFunction)keyset_add, METH_O, "add(key): one 16-byte key"},
    {"update", (PyCFunction)keyset_update, METH_O, "update(keys): a sequence (or iterable) of 16-byte keys"},
    {"clear", (PyCFunction)keyset_clear, METH_NOARGS, "clear(): drop every key"},
    {"discard", (PyCFunction)warmpath_keyset_discard, METH_O, "discard(key): remove it if present (anything else: no-op)"},
    {"discard_all", (PyCFunction)warmpath_keyset_discard_all, METH_O, "discard_all(keys): discard each of an iterable"},
    {"absorb", (PyCFunction)keyset_absorb, METH_O,
     "absorb(keys): add the 16-byte bytes of a sequence, skip anything else (a key no block chain has)"},
    {"run", (PyCFunction)warmpath_keyset_run, METH_VARARGS,
     "run(hashes, start=0) -> the first index >= start whose key is not in the set (len(hashes) if none)"},
    {"closed_run", (PyCFunction)warmpath_keyset_closed_run, METH_O,
     "closed_run(hashes) -> the leading run in the set, by binary search: exact only for a prefix-closed set"},
    {"certify", (PyCFunction)warmpath_keyset_certify, METH_VARARGS,
     "certify(held, hashes, start) -> held.run(hashes, start), adding hashes[start:that] to this set"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject warmpath_KeySetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "warmpath.kv._blockhash.KeySet",
    .tp_doc = "A set of 16-byte block keys stored inline (add, update, in, len, iter, clear).",
    .tp_basicsize = sizeof(KeySet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = keyset_new,
    .tp_dealloc = (destructor)keyset_dealloc,
    .tp_as_sequence = &keyset_as_sequence,
    .tp_iter = (getiterfunc)keyset_iter,
    .tp_methods = keyset_methods,
};

int warmpath_add_keyset(PyObject *m) {
    PyObject *os = PyImport_ImportModule("os"), *raw = os ? PyObject_CallMethod(os, "urandom", "i", 8) : NULL;
    Py_XDECREF(os);
    if (raw == NULL)
        return -1;
    memcpy(&keyset_seed, PyBytes_AS_STRING(raw), 8);
    Py_DECREF(raw);
    if (PyType_Ready(&warmpath_KeySetType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "KeySet", (PyObject *)&warmpath_KeySetType);
}
