"""Leading runs of a block-hash chain in a set of keys: what the router index's lookups ask.

A request's chain is its block keys from the first block on (``kv/hashing.py``); a tier holds
some set of keys. The planner's prefix hit is the *leading run*: the blocks before the
first one the set lacks.

* :func:`run` — the first index from ``start`` on whose key is not in ``keys``;
* :func:`closed_run` — the same from 0, by binary search: exact only for a *prefix-closed*
  set (one that, holding a chain's block i, holds blocks 0..i-1 of it: the index's
  certified sets, ``routing/index.py``), O(log n) probes;
* :func:`certify` — :func:`run` from ``start``, adding the keys it passed to ``cert``.

``hashes``: a tuple or list of 16-byte keys, or a :class:`~warmpath.kv.keychain.KeyChain`
(the C calls read its buffer; the Python path its :meth:`~warmpath.kv.keychain.KeyChain.keys`).

With the C extension (``hashing.NATIVE``) and C :class:`~warmpath.kv.hashing.KeySet`
arguments each is one call with no Python object made or hashed per key
(``native/keyruns.c``). A Python ``set`` or ``dict`` (the index without the extension, or any
other caller) takes the Python path below: same answers (``tests/kv/test_keyruns.py``
checks both against a plain loop).

NOTE: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice, takewhile

from warmpath.kv.hashing import _blockhash
from warmpath.kv.keychain import KeyChain

BlockHash = bytes
_C = _blockhash.KeySet if _blockhash is not None else None


def run(keys, hashes: Sequence[BlockHash], start: int = 0) -> int:
    """First index ``>= start`` whose hash is not in ``keys`` (``len(hashes)`` if none;
    ``start`` itself when ``start >= len(hashes)``). ``hashes``: a tuple or list."""
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if type(keys) is _C:
        return keys.run(_seq(hashes), start)
    return _run_py(keys, hashes, start)


def closed_run(cert, hashes: Sequence[BlockHash]) -> int:
    """Length of the leading run of ``hashes`` in the prefix-closed ``cert`` (binary search)."""
    if type(cert) is _C:
        return cert.closed_run(_seq(hashes))
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) // 2
        if hashes[mid] in cert:
            lo = mid + 1
        else:
            hi = mid
    return lo


def certify(cert, held, hashes: Sequence[BlockHash], start: int) -> int:
    """``n = run(held, hashes, start)``, with ``hashes[start:n]`` added to ``cert``; returns ``n``."""
    if type(cert) is _C and type(held) is _C:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        return cert.certify(held, _seq(hashes), start)
    n = run(held, hashes, start)
    if n > start:
        cert.update(hashes[start:n])
    return n


def _seq(hashes: Sequence[BlockHash]):
    """What the C calls take: a tuple or list as it is, a :class:`KeyChain`'s buffer (no
    Python object per key), any other sequence as a tuple."""
    t = type(hashes)
    return hashes if t is tuple or t is list else hashes.buf if t is KeyChain else tuple(hashes)


_RUN_CHUNK = 256   # blocks a set checks in one C call (issuperset) before a chunk with a gap is scanned


def _run_py(held, hashes: Sequence[BlockHash], start: int) -> int:
    """:func:`run` for a Python set or dict (any container with ``in``), at C-level speed
    where Python allows: a set is checked a chunk at a time by ``issuperset`` (no Python call
    per block); the chunk with the first gap, and a dict, by ``takewhile``."""
    if type(hashes) is KeyChain:
        hashes = hashes.keys()
    n = len(hashes)
    if start >= n or hashes[start] not in held:
        return start
    if isinstance(held, set):
        while start < n and held.issuperset(islice(hashes, start, start + _RUN_CHUNK)):
            start += _RUN_CHUNK
        if start >= n:
            return n
    return start + len(list(takewhile(held.__contains__, islice(hashes, start, None))))
