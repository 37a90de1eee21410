"""KV cache events over ZeroMQ, shaped like vLLM's ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` so other indexers can read them. Schema: ``docs/kv_events.md``.

Wire format (PUB socket), one multipart message per batch:
``[topic, seq (8 bytes big-endian), msgpack([ts, [event, ...], worker_id])]`` where an
event is ``["BlockStored", [hash, ...], parent_hash|None, [token, ...], block_size,
lora_id|None, medium]``, ``["BlockRemoved", [hash, ...], medium]`` or
``["AllBlocksCleared"]``. Hashes are the 16-byte block hashes of ``kv/hashing.py``;
``medium`` is ``"L1"``, ``"L2"`` or ``"L3"``.

Replay: a DEALER sends ``seq`` (8 bytes) to the ROUTER endpoint and gets every buffered
batch from that seq on as ``[seq, payload]`` frames, then ``[-1 (8 bytes), b""]``.

NOTE: no torch here.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

import msgpack
import zmq

END = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    medium: str
    lora_id: int | None = None

    def encode(self) -> list:
        return ["BlockStored", self.block_hashes, self.parent_block_hash, self.token_ids,
                self.block_size, self.lora_id, self.medium]


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[bytes]
    medium: str

    def encode(self) -> list:
        return ["BlockRemoved", self.block_hashes, self.medium]


@dataclass(frozen=True)
class AllBlocksCleared:
    def encode(self) -> list:
        return ["AllBlocksCleared"]


def decode_event(e: list):
    """Inverse of ``encode`` for one event."""
    tag = e[0]
    if tag == "BlockStored":
        return BlockStored(e[1], e[2], e[3], e[4], e[6], e[5])
    if tag == "BlockRemoved":
        return BlockRemoved(e[1], e[2])
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event {tag!r}")


class KVEventPublisher:
    """PUB + replay ROUTER on ``host`` (ports 0 = pick free ones).

    ``publish`` is called from one thread (the engine's); replay is served on its own.
    """

    def __init__(self, worker_id: str, host: str = "127.0.0.1", port: int = 0, replay_port: int = 0,
                 buffer_batches: int = 10000, topic: bytes = b"kv-events") -> None:
        self.worker_id, self.topic = worker_id, topic
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self._bind(self.pub, host, port)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_port = self._bind(self.router, host, replay_port)
        self.endpoint = f"tcp://{host}:{self.port}"
        self.replay_endpoint = f"tcp://{host}:{self.replay_port}"
        self._buf: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_batches)
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True, name="kv-events-replay")
        self._thread.start()

    @staticmethod
    def _bind(sock, host: str, port: int) -> int:
        if port:
            sock.bind(f"tcp://{host}:{port}")
            return port
        return sock.bind_to_random_port(f"tcp://{host}")

    def publish(self, events: list) -> int | None:
        """Send one batch; returns its sequence number (``None`` for an empty batch)."""
        if not events:
            return None
        payload = msgpack.packb([time.time(), [e.encode() for e in events], self.worker_id],
                                use_bin_type=True)
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buf.append((seq, payload))
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big", signed=True), payload])
        return seq

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            ident, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big", signed=True)
            with self._lock:
                batches = [b for b in self._buf if b[0] >= first]
            for seq, payload in batches:
                self.router.send_multipart([ident, b"", seq.to_bytes(8, "big", signed=True), payload])
            self.router.send_multipart([ident, b"", END, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.pub.close()
        self.router.close()


class KVEventSubscriber:
    """Reads a publisher's batches in order, asking for a replay when it sees a gap."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: bytes = b"kv-events") -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.next_seq = 0
        self.replays = 0

    def replay(self, start: int, timeout_ms: int = 2000) -> list[tuple[int, list, str]]:
        """Fetch buffered batches from ``start`` on."""
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(self.replay_endpoint)
        d.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        out = []
        try:
            while d.poll(timeout_ms):
                _, seq_b, payload = d.recv_multipart()
                if seq_b == END:
                    break
                ts, events, worker = msgpack.unpackb(payload, raw=False)
                out.append((int.from_bytes(seq_b, "big", signed=True),
                            [decode_event(e) for e in events], worker))
        finally:
            d.close()
        self.replays += 1
        return out

    def poll(self, timeout_ms: int = 100) -> list[tuple[int, list, str]]:
        """Batches received since the last call, in sequence order, gaps filled by replay."""
        out = []
        while self.sub.poll(timeout_ms if not out else 0):
            _, seq_b, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq < self.next_seq:
                continue
            if seq > self.next_seq:
                for item in self.replay(self.next_seq):
                    if self.next_seq <= item[0] < seq:
                        out.append(item)
                        self.next_seq = item[0] + 1
            ts, events, worker = msgpack.unpackb(payload, raw=False)
            out.append((seq, [decode_event(e) for e in events], worker))
            self.next_seq = seq + 1
        return out

    def close(self) -> None:
        self.sub.close()
