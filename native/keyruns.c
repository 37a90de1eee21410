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
 * ``hashes``: a tuple or list (an item that is not 16-byte bytes is in no set: a run ends), or
 * a bytes-like object of whole 16-byte keys back to back (kv/keychain.py's KeyChain.buf: no
 * Python object per key at all). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "keyset.h"

#define AHEAD 8     /* keys hashed, and their slots prefetched, ahead of the probe */

static inline const unsigned char *key_of(PyObject *k) {
    return PyBytes_Check(k) && PyBytes_GET_SIZE(k) == 16 ? (const unsigned char *)PyBytes_AS_STRING(k) : NULL;
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

/* A chain's keys: the items of a tuple or list, or a buffer of keys back to back. */
typedef struct {
    PyObject *seq;           /* the tuple or list (a new reference), or NULL: view */
    Py_buffer view;
    Py_ssize_t n;
} Chain;

static int chain_open(PyObject *hashes, Chain *c) {
    c->seq = NULL;
    if (PyTuple_Check(hashes) || PyList_Check(hashes)) {
        c->seq = Py_NewRef(hashes);
        c->n = PySequence_Fast_GET_SIZE(hashes);
        return 0;
    }
    if (!PyObject_CheckBuffer(hashes)) {
        PyErr_SetString(PyExc_TypeError, "hashes must be a tuple or a list of 16-byte keys, or a buffer of them");
        return -1;
    }
    if (PyObject_GetBuffer(hashes, &c->view, PyBUF_SIMPLE) < 0)
        return -1;
    if (c->view.len % 16 != 0) {
        PyErr_Format(PyExc_ValueError, "a buffer of keys must hold whole 16-byte keys, got %zd bytes", c->view.len);
        PyBuffer_Release(&c->view);
        return -1;
    }
    c->n = c->view.len / 16;
    return 0;
}

static void chain_close(Chain *c) {
    if (c->seq != NULL)
        Py_DECREF(c->seq);
    else
        PyBuffer_Release(&c->view);
}

/* Key i of the chain, or NULL when it is no 16-byte key (in no set). */
static inline const unsigned char *chain_key(const Chain *c, Py_ssize_t i) {
    return c->seq != NULL ? key_of(PySequence_Fast_ITEMS(c->seq)[i]) : (const unsigned char *)c->view.buf + 16 * i;
}

/* The first index >= start of the chain's keys not in s; hs (room for n - start, or NULL):
 * the hash of each key passed. A probe's cache misses overlap the next AHEAD keys' ones. */
static Py_ssize_t run_of(const KeySet *s, const Chain *c, Py_ssize_t start, uint64_t *hs) {
    uint64_t ring[AHEAD];
    Py_ssize_t n = c->n, ahead = start;      /* keys [start, ahead): hashed, prefetched */
    for (Py_ssize_t i = start; i < n; i++) {
        for (const unsigned char *k; ahead < n && ahead < i + AHEAD && (k = chain_key(c, ahead)) != NULL; ahead++) {
            ring[ahead % AHEAD] = warmpath_keyset_hash(k);
            prefetch_slot(s, ring[ahead % AHEAD]);
        }
        if (ahead <= i)                      /* key i is not a 16-byte key: in no set */
            return i;
        int found;
        uint64_t h = ring[i % AHEAD];
        warmpath_keyset_find(s, chain_key(c, i), h, &found);
        if (!found)
            return i;
        if (hs != NULL)
            hs[i - start] = h;
    }
    return n;
}

PyObject *warmpath_keyset_run(KeySet *s, PyObject *args) {
    PyObject *hashes;
    Py_ssize_t start = 0;
    Chain c;
    if (!PyArg_ParseTuple(args, "O|n:run", &hashes, &start))
        return NULL;
    if (start < 0)
        return PyErr_Format(PyExc_ValueError, "start must be >= 0, got %zd", start);
    if (chain_open(hashes, &c) < 0)
        return NULL;
    Py_ssize_t end = start >= c.n ? start : run_of(s, &c, start, NULL);
    chain_close(&c);
    return PyLong_FromSsize_t(end);
}

PyObject *warmpath_keyset_closed_run(KeySet *s, PyObject *hashes) {
    Chain c;
    if (chain_open(hashes, &c) < 0)
        return NULL;
    Py_ssize_t lo = 0, hi = c.n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        const unsigned char *key = chain_key(&c, mid);
        int found = 0;
        if (key != NULL)
            warmpath_keyset_slot(s, key, &found);
        if (found)
            lo = mid + 1;
        else
            hi = mid;
    }
    chain_close(&c);
    return PyLong_FromSsize_t(lo);
}

PyObject *warmpath_keyset_certify(KeySet *s, PyObject *args) {
    PyObject *held, *hashes;
    Py_ssize_t start;
    Chain c;
    if (!PyArg_ParseTuple(args, "O!On:certify", &warmpath_KeySetType, &held, &hashes, &start))
        return NULL;
    if (start < 0)
        return PyErr_Format(PyExc_ValueError, "start must be >= 0, got %zd", start);
    if (chain_open(hashes, &c) < 0)
        return NULL;
    Py_ssize_t n = c.n, end = start;
    uint64_t *hs = start < n ? PyMem_Malloc(sizeof(uint64_t) * (size_t)(n - start)) : NULL;
    if (start < n && hs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (start < n)
        end = run_of((KeySet *)held, &c, start, hs);
    if (end > start && warmpath_keyset_reserve(s, end - start) < 0) {
        end = -1;
        goto done;
    }
    for (Py_ssize_t i = start; i < end; i++) {    /* 16-byte keys (run_of says so), room reserved */
        if (i + AHEAD < end)
            prefetch_slot(s, hs[i + AHEAD - start]);
        warmpath_keyset_add_h(s, chain_key(&c, i), hs[i - start]);
    }
done:
    PyMem_Free(hs);
    chain_close(&c);
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
