"""A block-hash chain held as one buffer: the router's form of a prompt's keys.

:func:`~warmpath.kv.hashing.hash_prefix_blocks` gives a list with one 16-byte ``bytes``
object per block; at 128K tokens that is 8,192 objects made (and later freed) per prompt,
the largest part of a cold route decision once the hashing itself is in C. A
:class:`KeyChain` keeps the same keys back to back in one ``bytes`` (``buf``, 16 bytes a
block): the C hasher writes them there (``_blockhash.chain_keys``) and the index's C lookups
read them there (``kv/keyruns.py`` passes ``buf``), so the decide path makes no Python object
per block. A caller that needs the keys as objects (``note_routed``, a handoff, a test) gets
them from :meth:`KeyChain.keys`, made once per chain.

It is a read-only ``Sequence[bytes]``: ``len``, ``chain[i]`` (a 16-byte key), slices (a
``KeyChain``), iteration, and ``==`` against another chain or a tuple / list of the same
keys (so a chain equals ``tuple(hash_prefix_blocks(...))`` of the same tokens).

NOTE: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from warmpath.kv.hashing import _blockhash

KEY = 16   # bytes a block key


class KeyChain(Sequence):
    """The keys of a chain, ``buf``: ``bytes`` of ``16 * len(chain)`` (``ValueError`` for any
    other length)."""

    __slots__ = ("buf", "_keys")

    def __init__(self, buf: bytes = b"") -> None:
        if type(buf) is not bytes:
            buf = bytes(buf)
        if len(buf) % KEY:
            raise ValueError(f"a KeyChain's buffer holds whole {KEY}-byte keys, got {len(buf)} bytes")
        self.buf = buf
        self._keys: tuple[bytes, ...] | None = None

    @classmethod
    def of(cls, keys: Sequence[bytes]) -> KeyChain:
        """A chain of these 16-byte keys (a tuple or list, e.g. ``hash_prefix_blocks``'s)."""
        if any(type(k) is not bytes or len(k) != KEY for k in keys):
            raise ValueError(f"a KeyChain holds {KEY}-byte bytes keys")
        return cls(b"".join(keys))

    def keys(self) -> tuple[bytes, ...]:
        """The keys as a tuple of ``bytes`` (made on the first call, then kept)."""
        out = self._keys
        if out is None:
            buf = self.buf
            out = self._keys = (_blockhash.split(buf) if _blockhash is not None
                                else tuple(buf[i:i + KEY] for i in range(0, len(buf), KEY)))
        return out

    def __len__(self) -> int:
        return len(self.buf) // KEY

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return KeyChain(self.buf[KEY * start:KEY * max(start, stop)])
            return KeyChain(b"".join(self.keys()[i]))
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError("KeyChain index out of range")
        return self.buf[KEY * j:KEY * j + KEY]

    def __iter__(self):
        return iter(self.keys())

    def __eq__(self, other) -> bool:
        if isinstance(other, KeyChain):
            return self.buf == other.buf
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and self.keys() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.keys())          # equal to a tuple of the same keys: the same hash

    def __repr__(self) -> str:
        return f"KeyChain({len(self)} keys)"
