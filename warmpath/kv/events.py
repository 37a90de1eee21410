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

Snapshot: a DEALER that sends ``SNAPSHOT`` (-2) instead gets one ``[seq, payload]`` frame
whose events are ``BlockStored`` per medium for every block the publisher's events say is
held now (the fold of every batch it ever published, :class:`HeldBlocks`), ``seq`` the first
batch *not* folded in, then the end marker. A subscriber that starts (a router
that starts or restarts) applies it and then the batches after ``seq``: its view of the
worker is complete at once, however long ago the replay buffer wrapped.

With a cluster token both publisher sockets require ZeroMQ's PLAIN mechanism (user
``warmpath``, password the token), checked by a ZAP handler in the publisher's own context:
a peer without the token completes no handshake and receives nothing. (PLAIN is
authentication, not encryption: the token and the events cross the network in clear.)

NOTE: no torch here.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass

import msgpack
import zmq

END = (-1).to_bytes(8, "big", signed=True)
SNAPSHOT = -2      # a replay request for the held blocks instead of the buffered batches
PLAIN_USER = "warmpath"
MEDIA = ("L1", "L2", "L3")


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


def request_replay(ctx, endpoint: str, start: int, timeout_ms: int, configure=None):
    """Ask a replay ROUTER at ``endpoint`` for its batches from ``start`` on; yields each
    reply's frames until the end marker (``END`` second to last: warmpath's ``[b"", END,
    b""]``, vLLM's ``[b"", b"", END, b""]``) or ``timeout_ms`` of silence. ``configure``:
    called on the DEALER socket before it connects (credentials)."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    if configure is not None:
        configure(d)
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
    try:
        while d.poll(timeout_ms):
            frames = d.recv_multipart()
            if len(frames) >= 3 and frames[-2] == END:
                return
            yield frames
    finally:
        d.close()


class HeldBlocks:
    """What a worker's events say it holds now, per medium: the fold of every batch, applied
    as the router's index applies them (``AllBlocksCleared`` clears L1 and L2, not L3)."""

    def __init__(self) -> None:
        self.media: dict[str, set[bytes]] = {}

    def apply(self, events: list) -> None:
        for e in events:
            if isinstance(e, BlockStored):
                self.media.setdefault(e.medium, set()).update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                self.media.get(e.medium, set()).difference_update(e.block_hashes)
            elif isinstance(e, AllBlocksCleared):
                for m in [m for m in self.media if m != "L3"]:
                    del self.media[m]

    def events(self) -> list:
        """The held blocks as one ``BlockStored`` per medium (sorted: the same set, the same bytes)."""
        return [BlockStored(sorted(hs), None, [], 0, m) for m, hs in sorted(self.media.items()) if hs]

    def copy(self) -> HeldBlocks:
        out = HeldBlocks()
        out.media = {m: set(hs) for m, hs in self.media.items()}
        return out

    def __len__(self) -> int:
        return sum(len(hs) for hs in self.media.values())


class KVEventPublisher:
    """PUB + replay ROUTER bound on ``host`` (ports 0 = pick free ones); the endpoints it
    announces name ``advertise_host`` (default ``host``): bind ``0.0.0.0``, advertise the
    address other hosts reach this one at.

    ``publish`` is called from one thread (the engine's); replay is served on its own.
    """

    def __init__(self, worker_id: str, host: str = "127.0.0.1", port: int = 0, replay_port: int = 0,
                 buffer_batches: int = 10000, topic: bytes = b"kv-events",
                 advertise_host: str | None = None, token: str | None = None) -> None:
        self.worker_id, self.topic = worker_id, topic
        self._auth = None
        if token:   # a context of its own: its ZAP handler judges only these sockets
            from zmq.auth.thread import ThreadAuthenticator

            self.ctx = zmq.Context()
            zap_log = logging.getLogger(__name__ + ".zap")   # pyzmq logs the password at DEBUG
            zap_log.setLevel(max(zap_log.getEffectiveLevel(), logging.INFO))
            self._auth = ThreadAuthenticator(self.ctx, log=zap_log)
            self._auth.start()
            self._auth.configure_plain(domain="*", passwords={PLAIN_USER: token})
        else:
            self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.plain_server = bool(token)
        self.port = self._bind(self.pub, host, port)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.plain_server = bool(token)
        self.replay_port = self._bind(self.router, host, replay_port)
        adv = advertise_host or host
        self.endpoint = f"tcp://{adv}:{self.port}"
        self.replay_endpoint = f"tcp://{adv}:{self.replay_port}"
        self._buf: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_batches)
        self._lock = threading.Lock()
        self._seq = 0
        self.held = HeldBlocks()     # the fold of every batch published (served as a snapshot)
        self._stop = threading.Event()
        self.malformed = 0   # replay requests ignored because they were not one
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
            self.held.apply(events)
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big", signed=True), payload])
        return seq

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:   # not a replay request: ignore it
                self.malformed += 1
                continue
            ident, _, start = frames
            first = int.from_bytes(start, "big", signed=True)
            with self._lock:   # the engine's publish waits on this: copy here, encode outside
                held = (self._seq, self.held.copy()) if first == SNAPSHOT else None
                batches = [] if held else [b for b in self._buf if b[0] >= first]
            if held is not None:
                batches = [(held[0], msgpack.packb([time.time(), [e.encode() for e in held[1].events()],
                                                    self.worker_id], use_bin_type=True))]
            for seq, payload in batches:
                self.router.send_multipart([ident, b"", seq.to_bytes(8, "big", signed=True), payload])
            self.router.send_multipart([ident, b"", END, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.pub.close()
        self.router.close()
        if self._auth is not None:
            self._auth.stop()
            self.ctx.term()


class KVEventSubscriber:
    """Reads a publisher's batches in order, asking for a replay when it sees a gap."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: bytes = b"kv-events",
                 token: str | None = None) -> None:
        self.ctx = zmq.Context.instance()
        self.token = token
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self._credentials(self.sub)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.next_seq = 0
        self.replays = 0
        self.malformed = 0   # batches skipped because they could not be decoded

    def replay(self, start: int, timeout_ms: int = 2000) -> list[tuple[int, list, str]]:
        """Fetch buffered batches from ``start`` on."""
        out = []
        for frames in request_replay(self.ctx, self.replay_endpoint, start, timeout_ms, self._credentials):
            try:
                _, seq_b, payload = frames
                ts, events, worker = msgpack.unpackb(payload, raw=False)
                out.append((int.from_bytes(seq_b, "big", signed=True),
                            [decode_event(e) for e in events], worker))
            except Exception:  # noqa: BLE001 - skip what cannot be decoded
                self.malformed += 1
        self.replays += 1
        return out

    def snapshot(self, timeout_ms: int = 2000) -> list | None:
        """The blocks the publisher holds now (``BlockStored`` per medium); later :meth:`poll`
        calls return only the batches after it. ``None`` when no snapshot came (the publisher
        did not answer in ``timeout_ms``): poll replays from the start of its buffer then."""
        got = self.replay(SNAPSHOT, timeout_ms)
        if len(got) != 1:
            return None
        self.next_seq, events, _ = got[0]
        return events

    def poll(self, timeout_ms: int = 100) -> list[tuple[int, list, str]]:
        """Batches received since the last call, in sequence order, gaps filled by replay."""
        out = []
        while self.sub.poll(timeout_ms if not out else 0):
            frames = self.sub.recv_multipart()
            try:
                _, seq_b, payload = frames
                seq = int.from_bytes(seq_b, "big", signed=True)
                ts, events, worker = msgpack.unpackb(payload, raw=False)
                decoded = [decode_event(e) for e in events]
            except Exception:  # noqa: BLE001 - a malformed batch is skipped, not fatal
                self.malformed += 1
                continue
            if seq < self.next_seq:
                continue
            if seq > self.next_seq:
                for item in self.replay(self.next_seq):
                    if self.next_seq <= item[0] < seq:
                        out.append(item)
                        self.next_seq = item[0] + 1
            out.append((seq, decoded, worker))
            self.next_seq = seq + 1
        return out

    def _credentials(self, sock) -> None:
        if self.token:
            sock.plain_username, sock.plain_password = PLAIN_USER.encode(), self.token.encode()

    def close(self) -> None:
        self.sub.close()
