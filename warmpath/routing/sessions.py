"""Conversation sessions: which decode worker holds a conversation's KV, with idle expiry."""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash


def session_id(user: str | None, header: str | None, messages: list[dict] | None) -> str | None:
    """The ``X-Session-Id`` header, else the request's ``user``, else a hash of the first
    user message (``None`` when there is nothing to go on)."""
    if header:
        return header
    if user:
        return f"user:{user}"
    for m in messages or []:
        if m.get("role") == "user":
            return "msg:" + xxhash.xxh3_64_hexdigest(str(m.get("content", "")).encode())
    return None


@dataclass
class SessionState:
    decode_worker: str | None = None
    turns: int = 0
    context_tokens: int = 0
    last_seen: float = 0.0

    def turn_ended(self, decode_worker: str | None, prompt_tokens: int, completion_tokens: int) -> None:
        """The turn's KV now lives on ``decode_worker``: the next turn goes there (PPD)
        and only its tokens beyond this prompt + answer are new."""
        self.decode_worker = decode_worker
        self.context_tokens = prompt_tokens + completion_tokens


@dataclass
class SessionTable:
    """Sessions by id, least recently seen first; at most ``max_sessions`` (the least
    recently seen one is forgotten to make room: its next turn starts a new session)."""

    idle_s: float = 3600.0
    max_sessions: int = 100_000
    sessions: dict[str, SessionState] = field(default_factory=dict)
    evicted: int = 0

    def touch(self, sid: str, now: float) -> SessionState:
        s = self.sessions.pop(sid, None)     # re-inserted last: dict order is LRU order
        if s is None or now - s.last_seen > self.idle_s:
            s = SessionState()
            while len(self.sessions) >= self.max_sessions:
                del self.sessions[next(iter(self.sessions))]
                self.evicted += 1
        self.sessions[sid] = s
        s.last_seen = now
        return s

    def adopt(self, sid: str, decode_worker: str | None, context_tokens: int, turns: int, now: float) -> SessionState:
        """A turn of ``sid`` that another router of the fleet saw end (``routing/peers.py``):
        its next turn, whichever router gets it, goes where that turn's KV is (PPD)."""
        s = self.touch(sid, now)
        s.decode_worker, s.context_tokens, s.turns = decode_worker, context_tokens, max(s.turns, turns)
        return s

    def expire(self, now: float) -> int:
        old = [k for k, s in self.sessions.items() if now - s.last_seen > self.idle_s]
        for k in old:
            del self.sessions[k]
        return len(old)

    def forget_worker(self, worker: str) -> None:
        for s in self.sessions.values():
            if s.decode_worker == worker:
                s.decode_worker = None
