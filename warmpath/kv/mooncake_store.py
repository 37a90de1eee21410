"""L3: KV blocks in Mooncake Store, with zero-copy batched transfers and a circuit breaker.

Blocks move through one registered staging buffer (``batch_put_from`` /
``batch_get_into``), each behind the header of ``kv/block_codec.py``; a get checks every
block against the one the request wants (a mismatch is a miss, a broken block is removed).
Every call runs on one background thread and the caller waits at most ``op_timeout_s``: a
dead master costs a bounded wait, then L3 is marked down (every call is a miss) until a
probe after ``retry_after_s`` works.

NOTE: no torch here; payloads are numpy views the caller fills or reads.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from warmpath.kv.block_codec import (BROKEN, BlockIdentity, BlockVerifyError, encode_block, header_size,
                                     verify_block)
from warmpath.kv.mooncake_config import L3Stats, MooncakeConfig
from warmpath.kv.mooncake_link import StoreLink

log = logging.getLogger(__name__)
NOT_FOUND = -704
EXISTS = -706      # another worker stored the block first: it is in L3 all the same
NO_SPACE = -200    # store full until the master evicts: not stored, a future miss, not an error


@dataclass
class MooncakeL3(StoreLink):
    """Block store on Mooncake. ``block_bytes`` is the payload size of one block, ``shape``
    its layout ``(layers, 2, block_size, kv_heads, head_dim)``; ``tag_key`` keys the
    headers (``block_codec.derive_key``). ``verify=False`` skips the load checks: only
    for measuring what they cost (``benchmarks/engine/kv_tiers.py``)."""

    cfg: MooncakeConfig
    block_bytes: int
    dtype: str
    shape: tuple[int, ...]
    stats: L3Stats = field(default_factory=L3Stats)
    tag_key: bytes = field(default=b"", repr=False)
    verify: bool = True

    def __post_init__(self) -> None:
        self.header = header_size(self.shape[2])
        self.slot = self.header + self.block_bytes
        self.half = max(1, self.cfg.staging_blocks // 2)   # a get's chunk: two in flight
        self.staging = np.zeros(max(self.cfg.staging_blocks, 2 * self.half) * self.slot, dtype=np.uint8)
        self._exec = cf.ThreadPoolExecutor(1, thread_name_prefix="mooncake")
        self._lock = threading.Lock()   # one transfer at a time through the staging buffer
        self._notes = threading.Lock()  # not_found: a get beside the steps appends, the engine drains
        self._store = None
        self._down_until = 0.0
        self.not_found: list[bytes] = []   # hashes a get found missing (drained by the caller)
        self.rejected: list[tuple[bytes, str]] = []   # (hash, reason) a get refused (drained too)
        self.connect()

    def key(self, block_hash: bytes) -> str:
        return "wp/" + block_hash.hex()

    def _payload(self, i: int) -> np.ndarray:
        off = i * self.slot + self.header
        return self.staging[off:off + self.block_bytes]

    # -- operations --------------------------------------------------------
    def count_prefix(self, hashes: list[bytes]) -> int:
        """How many leading blocks of ``hashes`` exist in the store."""
        if not hashes:
            return 0
        if not self.available and not self.probe():
            self.stats.fallbacks += 1
            return 0
        try:
            res = self._call(self._store.batch_is_exist, [self.key(h) for h in hashes])
        except Exception:  # noqa: BLE001 - timeout or RPC failure
            self._mark_down()
            self.stats.fallbacks += 1
            return 0
        n = next((i for i, r in enumerate(res) if r != 1), len(res))
        if n < len(res) and res[n] < 0:
            self._mark_down()
        return n

    def get(self, want: list[BlockIdentity], sink: Callable[[int, np.ndarray], None]) -> int:
        """Read blocks in order; ``sink(i, payload)`` gets each one verified as ``want[i]``.

        Stops at the first missing, refused (noted in :attr:`rejected`) or failed block;
        returns how many leading blocks were delivered. Chunks of :attr:`half` blocks take
        turns in the two staging halves: the next is fetched while one is checked and delivered.
        """
        done, hashes = 0, [w.block_hash for w in want]
        chunks = [hashes[s:s + self.half] for s in range(0, len(hashes), self.half)]
        t0 = time.perf_counter()
        with self._lock:
            nxt = self._fetch(chunks[0], 0) if chunks and self.available else None
            for k, chunk in enumerate(chunks):
                res = self._wait(nxt)
                if res is None:
                    break
                nxt = self._fetch(chunks[k + 1], (k + 1) % 2) if k + 1 < len(chunks) else None
                ok = self._deliver(chunk, res, (k % 2) * self.half, want, done, sink)
                done += ok
                if ok < len(chunk):
                    break
            self._wait(nxt)   # NOTE: a fetch still in flight writes into staging: let it land first
        self.stats.read_seconds += time.perf_counter() - t0
        self.stats.hits += done
        self.stats.misses += len(hashes) - done
        return done

    def take_not_found(self) -> list[bytes]:
        """Hashes gets found missing since the last call (drained)."""
        with self._notes:
            gone, self.not_found = self.not_found, []
        return gone

    def _fetch(self, chunk: list[bytes], side: int) -> cf.Future | None:
        """Start reading ``chunk`` into staging half ``side`` (``None``: L3 is down)."""
        if not self.available:
            return None
        base = self.staging.ctypes.data + side * self.half * self.slot
        return self._exec.submit(self._store.batch_get_into, [self.key(h) for h in chunk],
                                 [base + i * self.slot for i in range(len(chunk))], [self.slot] * len(chunk))

    def _wait(self, fut: cf.Future | None) -> list[int] | None:
        """The result of a :meth:`_fetch` (``None``: none, or it failed: L3 marked down)."""
        if fut is None:
            return None
        try:
            return fut.result(timeout=self.cfg.op_timeout_s)
        except Exception:  # noqa: BLE001 - timeout or RPC failure
            self._mark_down()
            return None

    def _deliver(self, chunk: list[bytes], res: list[int], first: int, want: list[BlockIdentity],
                 done: int, sink: Callable[[int, np.ndarray], None]) -> int:
        """Check and hand over the leading blocks of a fetched chunk (staged from slot
        ``first``; ``want[done]`` is its first block); returns how many were delivered."""
        for i, (h, r) in enumerate(zip(chunk, res)):
            if r < 0:
                if r == NOT_FOUND:
                    with self._notes:
                        self.not_found.append(h)
                else:
                    self._mark_down()
                return i
            if not self._verified(first + i, r, want[done + i]):
                return i
            sink(done + i, self._payload(first + i))
            self.stats.bytes_read += r
        return len(chunk)

    def _verified(self, i: int, size: int, want: BlockIdentity) -> bool:
        """Whether staged block ``i`` (``size`` bytes) is ``want``; a broken one is removed."""
        if not self.verify:
            return True
        try:
            verify_block(memoryview(self.staging[i * self.slot:i * self.slot + size]), want,
                         self.dtype, self.shape, self.tag_key)
            return True
        except BlockVerifyError as e:
            log.warning("L3 block %s refused: %s", want.block_hash.hex()[:12], e)
            self.stats.corrupt += 1
            self.rejected.append((want.block_hash, e.reason))
            if e.reason in BROKEN:   # NOTE: forced, the get just took a lease on it
                try:
                    self._call(self._store.remove, self.key(want.block_hash), True)
                except Exception:  # noqa: BLE001 - the next reader refuses it again
                    self.stats.errors += 1
            return False

    def exists(self, hashes: list[bytes]) -> list[bool] | None:
        """Whether each block is in the store (``None``: the store could not be asked)."""
        if not hashes or not self.available:
            return None
        try:
            res = self._call(self._store.batch_is_exist, [self.key(h) for h in hashes])
        except Exception:  # noqa: BLE001 - timeout or RPC failure
            self._mark_down()
            return None
        if any(r < 0 for r in res):
            return None
        return [r == 1 for r in res]

    def put(self, blocks: list[BlockIdentity], source: Callable[[int, np.ndarray], None],
            wait: bool = True) -> tuple[list[bytes], list[bytes]] | None:
        """Write blocks; ``source(i, payload)`` fills the payload of ``blocks[i]``.

        Returns ``(written, present)``: the hashes this call stored (result 0) and those the
        store already held (``EXISTS``). Both are in L3 afterwards; ``NO_SPACE``, errors and
        blocks after a failed call are in neither. ``wait=False``: ``None`` at once if another
        transfer (a get on another thread) holds the staging buffer.
        """
        if not self._lock.acquire(blocking=wait):
            self.stats.busy_skips += 1
            return None
        try:
            return self._put(blocks, source)
        finally:
            self._lock.release()

    def _put(self, blocks: list[BlockIdentity], source: Callable[[int, np.ndarray], None]
             ) -> tuple[list[bytes], list[bytes]]:
        written: list[bytes] = []
        present: list[bytes] = []
        step = self.cfg.staging_blocks
        hashes = [b.block_hash for b in blocks]
        t0 = time.perf_counter()
        for start in range(0, len(hashes), step):
            if not self.available:
                break
            chunk = hashes[start:start + step]
            for i in range(len(chunk)):
                payload = self._payload(i)
                source(start + i, payload)
                encode_block(memoryview(self.staging[i * self.slot:]), blocks[start + i], self.dtype,
                             self.shape, memoryview(payload), self.tag_key)
            ptrs = [self.staging.ctypes.data + i * self.slot for i in range(len(chunk))]
            try:
                res = self._call(self._store.batch_put_from, [self.key(h) for h in chunk], ptrs,
                                 [self.slot] * len(chunk))
            except Exception:  # noqa: BLE001
                self._mark_down()
                break
            self._count_put(chunk, res, written, present)
        self.stats.write_seconds += time.perf_counter() - t0
        return written, present

    def _count_put(self, chunk: list[bytes], res: list[int], written: list, present: list) -> None:
        ok = [h for h, r in zip(chunk, res) if r == 0]
        written.extend(ok)
        present.extend(h for h, r in zip(chunk, res) if r == EXISTS)
        self.stats.rejected_full += sum(1 for r in res if r == NO_SPACE)
        if any(r < 0 and r not in (EXISTS, NO_SPACE) for r in res):
            self.stats.errors += 1
        self.stats.blocks_written += len(ok)
        self.stats.bytes_written += len(ok) * self.slot
