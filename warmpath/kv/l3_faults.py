"""Faults in the L3 store for chaos runs and tests (``/internal/fault``, fault injection only).

* :func:`corrupt_blocks`: read stored blocks, flip one bit of each one's payload, write it
  back in place (``upsert``): the next load must refuse it (``checksum``) and recompute.
* :func:`fill_store`: put ``limit_bytes`` of junk objects (not ``wp/`` keys), past the
  store's watermark: the master has to evict (blocks too) to make room.

Both run on the L3 client's own thread under its staging lock, like any transfer.
NOTE: no torch here.
"""

from __future__ import annotations

import random
import secrets
import time

from warmpath.kv.mooncake_store import MooncakeL3, NO_SPACE


def corrupt_blocks(l3: MooncakeL3, hashes: list[bytes], seed: int | None = None) -> list[bytes]:
    """Flip one random payload bit of each stored block of ``hashes``; returns the hashes
    actually corrupted (those the store held, and took back)."""
    rng = random.Random(seed)

    def run() -> list[bytes]:
        done = []
        for h in hashes:
            data = bytearray(l3._store.get(l3.key(h)) or b"")
            if len(data) <= l3.header:
                continue
            pos = rng.randrange(l3.header, len(data))
            data[pos] ^= 1 << rng.randrange(8)
            if l3._store.upsert(l3.key(h), bytes(data)) == 0:
                done.append(h)
        return done

    with l3._lock:
        return l3._call(run, timeout=max(10.0, l3.cfg.op_timeout_s * len(hashes)))


def fill_store(l3: MooncakeL3, limit_bytes: int, object_bytes: int = 4 << 20) -> dict[str, int]:
    """Put junk of ``object_bytes`` each until ``limit_bytes`` went in (or the store said
    "no space" 50 times); returns ``{"put": n, "bytes": b, "no_space": k}``."""
    junk = secrets.token_bytes(object_bytes)
    prefix = "chaos-junk/" + secrets.token_hex(4) + "/"

    def run() -> dict[str, int]:
        n = refused = 0
        while n * object_bytes < limit_bytes and refused < 50:
            rc = l3._store.put(prefix + str(n + refused), junk)
            if rc == 0:
                n += 1
            elif rc == NO_SPACE:   # the master evicts in the background: give it a moment
                refused += 1
                time.sleep(0.1)
            else:
                raise ConnectionError(f"store put failed ({rc})")
        return {"put": n, "bytes": n * object_bytes, "no_space": refused}

    with l3._lock:
        return l3._call(run, timeout=60.0)
