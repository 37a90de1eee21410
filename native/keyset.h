/* The KeySet of keyset.c, shared with keyruns.c (warmpath.kv._blockhash). */
#ifndef WARMPATH_KEYSET_H
#define WARMPATH_KEYSET_H
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    unsigned char *keys;     /* cap * 16 */
    unsigned char *used;     /* cap */
    Py_ssize_t cap, n;       /* cap: a power of two; n <= cap / 2 */
} KeySet;

extern PyTypeObject warmpath_KeySetType;

uint64_t warmpath_keyset_hash(const unsigned char *key);                      /* seeded XXH3-64 */
size_t warmpath_keyset_home(const KeySet *s, const unsigned char *key);       /* a key's first slot */
/* The key's slot, or the empty slot where it would go (*found 0); h: its warmpath_keyset_hash. */
Py_ssize_t warmpath_keyset_find(const KeySet *s, const unsigned char *key, uint64_t h, int *found);
Py_ssize_t warmpath_keyset_slot(const KeySet *s, const unsigned char *key, int *found);
int warmpath_keyset_add(KeySet *s, const unsigned char *key);
int warmpath_keyset_add_h(KeySet *s, const unsigned char *key, uint64_t h);
int warmpath_keyset_reserve(KeySet *s, Py_ssize_t more);                       /* room for more keys */

PyObject *warmpath_keyset_discard(KeySet *s, PyObject *k);
PyObject *warmpath_keyset_discard_all(KeySet *s, PyObject *keys);
PyObject *warmpath_keyset_run(KeySet *s, PyObject *args);
PyObject *warmpath_keyset_closed_run(KeySet *s, PyObject *hashes);
PyObject *warmpath_keyset_certify(KeySet *s, PyObject *args);

#endif
