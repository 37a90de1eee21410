/* KeySet methods for the router index's lookups (warmpath/router/index.py): the leading run
 * of a block-hash chain in a set, in one call, with no Python object made or hashed per key
 * (a chain's keys are probed by their 16 bytes, keyset.c); and single-key removal, so a
 * KeySet can mirror a held set that loses blocks.
 *
 *   run(hashes, start=0)          first i >= start with hashes[i] not in the set
 *   closed_run(hashes)            the leading run by binary search (a prefix-closed set only)
 *   certify(held, hashes, start)  held.run(hashes, start), those keys added to this set
 *   discard(key), discard_all(keys)  remove one key, or a batch's
 *   (absorb(keys), which skips what is not a key, is keyset.c's, beside update)
 *
 * ``hashes``: a tuple or list; an item that is not 16-byte bytes is in no set (a run ends). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "keyset.h"

#define AHEAD 8     /* keys hashed, and their slots prefetched, ahead of the probe */

static inline const unsigned char *key_of(PyObject *k) {
    return PyBytes_Check(k) && PyBytes_GET_SIZE(k) == 16 ? (const unsigned char *)PyBytes_AS_STRING(k) : NULL;
}

static int has(const KeySet *s, PyObject *k) {
    const unsigned char *key = key_of(k);
    int found = 0;
    if (key != NULL)
        warmpath_keyset_slot(s, key, &found);
    return found;
}

static inline void prefetch_slot(const KeySet *s, uint64_t h) {
#if defined(__GNUC__)
    size_t i = (size_t)h & ((size_t)s->cap - 1);
    __builtin_prefetch(s->used + i);
    __builtin_prefetch(s->keys + 16 * i);
#else
    (void)s, (void)h;
#endif
}

/* The first index >= start of items[0:n] not in s; hs (room for n - start, or NULL): the
 * hash of each key passed. A probe's cache misses overlap the next AHEAD keys' ones. */
static Py_ssize_t run_of(const KeySet *s, PyObject **items, Py_ssize_t n, Py_ssize_t start, uint64_t *hs) {
    uint64_t ring[AHEAD];
    Py_ssize_t ahead = start;                /* items[start:ahead]: hashed, prefetched */
    for (Py_ssize_t i = start; i < n; i++) {
        for (const unsigned char *k; ahead < n && ahead < i + AHEAD && (k = key_of(items[ahead])) != NULL; ahead++) {
            ring[ahead % AHEAD] = warmpath_keyset_hash(k);
            prefetch_slot(s, ring[ahead % AHEAD]);
        }
        if (ahead <= i)                      /* items[i] is not a 16-byte key: in no set */
            return i;
        int found;
        uint64_t h = ring[i % AHEAD];
        warmpath_keyset_find(s, (const unsigned char *)PyBytes_AS_STRING(items[i]), h, &found);
        if (!found)
            return i;
        if (hs != NULL)
            hs[i - start] = h;
    }
    return n;
}

static PyObject *chain_items(PyObject *hashes) {
    if (!PyTuple_Check(hashes) && !PyList_Check(hashes)) {
        PyErr_SetString(PyExc_TypeError, "hashes must be a tuple or a list of 16-byte keys");
        return NULL;
    }
    Py_INCREF(hashes);
    return hashes;
}

PyObject *warmpath_keyset_run(KeySet *s, PyObject *args) {
    PyObject *hashes, *seq;
    Py_ssize_t start = 0;
    if (!PyArg_ParseTuple(args, "O|n:run", &hashes, &start) || (seq = chain_items(hashes)) == NULL)
        return NULL;
    if (start < 0) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "start must be >= 0, got %zd", start);
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t end = start >= n ? start : run_of(s, PySequence_Fast_ITEMS(seq), n, start, NULL);
    Py_DECREF(seq);
    return PyLong_FromSsize_t(end);
}

PyObject *warmpath_keyset_closed_run(KeySet *s, PyObject *hashes) {
    PyObject *seq = chain_items(hashes);
    if (seq == NULL)
        return NULL;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t lo = 0, hi = PySequence_Fast_GET_SIZE(seq);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (has(s, items[mid]))
            lo = mid + 1;
        else
            hi = mid;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(lo);
}

PyObject *warmpath_keyset_certify(KeySet *s, PyObject *args) {
    PyObject *held, *hashes, *seq;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!On:certify", &warmpath_KeySetType, &held, &hashes, &start)
            || (seq = chain_items(hashes)) == NULL)
        return NULL;
    if (start < 0) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "start must be >= 0, got %zd", start);
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), end = start;
    uint64_t *hs = start < n ? PyMem_Malloc(sizeof(uint64_t) * (size_t)(n - start)) : NULL;
    if (start < n && hs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (start < n)
        end = run_of((KeySet *)held, items, n, start, hs);
    if (end > start && warmpath_keyset_reserve(s, end - start) < 0) {
        end = -1;
        goto done;
    }
    for (Py_ssize_t i = start; i < end; i++) {    /* 16-byte keys (run_of says so), room reserved */
        if (i + AHEAD < end)
            prefetch_slot(s, hs[i + AHEAD - start]);
        warmpath_keyset_add_h(s, (const unsigned char *)PyBytes_AS_STRING(items[i]), hs[i - start]);
    }
done:
    PyMem_Free(hs);
    Py_DECREF(seq);
    return end < 0 || PyErr_Occurred() ? NULL : PyLong_FromSsize_t(end);
}

/* Linear probing without tombstones: after emptying slot i, each key further along the probe
 * chain whose first slot is not cyclically in (i, j] moves back into the hole. */
static void discard_raw(KeySet *s, const unsigned char *key) {
    int found;
    size_t mask = (size_t)s->cap - 1;
    size_t i = (size_t)warmpath_keyset_slot(s, key, &found), j = i;
    if (!found)
        return;
    for (;;) {
        j = (j + 1) & mask;
        if (!s->used[j])
            break;
        size_t home = warmpath_keyset_home(s, s->keys + 16 * j);
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            memcpy(s->keys + 16 * i, s->keys + 16 * j, 16);
            i = j;
        }
    }
    s->used[i] = 0;
    s->n--;
}

PyObject *warmpath_keyset_discard(KeySet *s, PyObject *k) {
    const unsigned char *key = key_of(k);
    if (key != NULL)
        discard_raw(s, key);
    Py_RETURN_NONE;
}

PyObject *warmpath_keyset_discard_all(KeySet *s, PyObject *keys) {
    PyObject *seq = PySequence_Fast(keys, "KeySet.discard_all() takes an iterable of keys");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *key = key_of(items[i]);
        if (key != NULL)
            discard_raw(s, key);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}
