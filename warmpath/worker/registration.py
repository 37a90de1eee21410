"""A worker's side of discovery: register with the router, then heartbeat its load.

:func:`keep_registered` is the loop any worker kind runs (warmpath's engine here, a vLLM
server in ``warmpath/vllm/``); it imports no torch. With several routers (``--router
URL,URL``, active-active) the worker registers with, heartbeats to and reports its health
and drain to each of them on its own: a router that dies or restarts costs the others
nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Awaitable, Callable

import httpx

from warmpath.protocol.internal import Heartbeat, Registration

if TYPE_CHECKING:   # no torch at import: the vLLM worker runs this module too
    from warmpath.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RegistrationConfig:
    router_url: str
    worker_id: str
    role: str
    advertise_url: str              # how the router reaches this worker
    heartbeat_s: float = 10.0
    cluster_token: str | None = dataclasses.field(default=None, repr=False)   # sent as a Bearer token

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {self.cluster_token}"} if self.cluster_token else None

    @property
    def router_urls(self) -> tuple[str, ...]:
        """Every router this worker reports to (``--router`` takes several, comma-separated)."""
        return tuple(u.strip().rstrip("/") for u in self.router_url.split(",") if u.strip())

    def __post_init__(self) -> None:
        urls = self.router_urls
        if not urls or any(not u.startswith("http") for u in urls):
            raise ValueError(f"--router must be an http URL (or several, comma-separated), got {self.router_url!r}")


def load_report(engine: "LLMEngine", worker_id: str, healthy: bool = True) -> Heartbeat:
    """The heartbeat (read from the engine thread's state; approximate)."""
    s = engine.scheduler
    queued = sum(q.num_tokens - q.num_computed_tokens for q in list(s.waiting))
    admitted = [*s.running, *s.loading]   # a loading sequence runs once its prefix lands
    queued += sum(q.num_tokens - q.num_computed_tokens for q in admitted if q.in_prefill)
    rep = {"queued_prefill_tokens": queued, "running": len(admitted),
           "kv_usage": min(1.0, max(0.0, float(engine.pool.usage)))}
    if engine.tiers is not None:
        c = engine.tiers.cost
        rep.update(prefill_tok_s=c.prefill_tok_s.value, l2_bytes_s=c.transfer["L2"].bytes_s,
                   l3_bytes_s=c.transfer["L3"].bytes_s)
    return Heartbeat(worker_id=worker_id, healthy=healthy, **rep)


async def report_unhealthy(cfg: RegistrationConfig, detail: str) -> bool:
    """Tell every router at once that this worker can serve nothing (they drop us); ``False``
    when one could not be told (it drops us after ``drop_after_s`` anyway)."""
    rs = await _tell(cfg, Heartbeat(worker_id=cfg.worker_id, healthy=False, detail=detail[:1024]),
                     "the engine failure")
    return all(r is not None and r.status_code in (200, 404) for r in rs)


async def report_drain(cfg: RegistrationConfig, left: bool) -> int | None:
    """Tell every router this worker drains (``left=False``: route nothing new here, let the
    requests under way finish) or has drained (``left=True``: drop it, reason ``drained``).
    Returns how many requests the routers still have for this worker together (those here,
    and prefills elsewhere whose decode will come here); ``None`` when none could say (a
    router that cannot be reached has no requests under way here: its streams ended with it)."""
    hb = Heartbeat(worker_id=cfg.worker_id, healthy=not left, draining=True, detail="drained" if left else None)
    counts = []
    for r in await _tell(cfg, hb, "the drain"):
        try:
            n = r.json().get("in_flight") if r is not None and r.status_code == 200 else None
        except ValueError:
            n = None
        if isinstance(n, int):
            counts.append(n)
    return sum(counts) if counts else None


async def _tell(cfg: RegistrationConfig, hb: Heartbeat, what: str) -> list[httpx.Response | None]:
    """Post one heartbeat to every router now; per router, ``None`` when it could not be reached."""
    async with httpx.AsyncClient(timeout=2, headers=cfg.headers) as http:
        async def one(url: str) -> httpx.Response | None:
            try:
                return await http.post(url + "/internal/heartbeat", json=hb.model_dump())
            except httpx.HTTPError as e:
                log.warning("could not report %s to the router %s: %s", what, url, e)
                return None
        return list(await asyncio.gather(*(one(u) for u in cfg.router_urls)))


def _adopt_role(body: dict, r: httpx.Response, on_role: Callable[[str], None]) -> None:
    """The role in a heartbeat's answer, when the router moved this worker."""
    try:
        role = r.json().get("role")
    except ValueError:
        return
    if isinstance(role, str) and role != body["role"]:
        log.info("the router moved this worker: %s -> %s", body["role"], role)
        body["role"] = role
        on_role(role)


async def register_and_heartbeat(cfg: RegistrationConfig, engine: "LLMEngine",
                                 alive: Callable[[], bool] = lambda: True, defaults: dict | None = None,
                                 draining: Callable[[], bool] = lambda: False) -> None:
    """Runs until cancelled: (re)registers whenever the router does not know us; stops
    heartbeating once ``alive()`` turns false (the failure is reported separately).
    ``defaults``: this worker's sampling defaults (``GenerationDefaults.to_json()``);
    ``draining()``: see :func:`keep_registered`."""
    ev = engine.tiers.events if engine.tiers is not None else None
    body = Registration(
        worker_id=cfg.worker_id, role=cfg.role, url=cfg.advertise_url,
        namespace=dataclasses.asdict(engine.namespace), pid=os.getpid(),
        kv_bytes_per_token=engine.loaded.config.kv_bytes_per_token(engine.runner.kv_dtype.itemsize),
        max_model_len=engine.max_model_len, events_endpoint=ev.endpoint if ev else None,
        replay_endpoint=ev.replay_endpoint if ev else None, generation_defaults=defaults,
        max_num_seqs=engine.scheduler.cfg.max_num_seqs,
        prefill_chunk_tokens=(engine.scheduler.cfg.max_num_batched_tokens
                              if engine.scheduler.cfg.enable_chunked_prefill else None),   # None: whole prompts
        kv_capacity_tokens=engine.pool.num_blocks * engine.namespace.block_size,
        overlaps_loads=engine.tiers is not None and engine.tiers.overlaps_loads).model_dump()

    async def report() -> Heartbeat:
        return load_report(engine, cfg.worker_id)

    def on_role(role: str) -> None:   # the router moved us (elastic roles): hand KV on as the role needs
        if engine.tiers is not None:
            from warmpath.engine.tier_rules import write_mode_for

            engine.tiers.rules.write_mode = write_mode_for(role, engine.tiers.rules.write_mode)

    await keep_registered(cfg, body, report, alive, draining, on_role)


async def keep_registered(cfg: RegistrationConfig, body: dict, report: Callable[[], Awaitable[Heartbeat]],
                          alive: Callable[[], bool] = lambda: True,
                          draining: Callable[[], bool] = lambda: False,
                          on_role: Callable[[str], None] = lambda role: None) -> None:
    """Runs until cancelled: for each router, posts ``body`` (a :class:`Registration`'s JSON)
    whenever that router does not know this worker, then ``await report()`` every
    ``heartbeat_s``; stops once ``alive()`` turns false. While ``draining()``
    (``worker/drain.py``) the heartbeats say so and a router that forgot this worker is not
    told of it again. A heartbeat's answer names the role the router gives this worker now
    (elastic roles): a new one is passed to ``on_role`` and registered from then on (a
    restarted router keeps it)."""
    async with httpx.AsyncClient(timeout=5, headers=cfg.headers) as http:
        await asyncio.gather(*(_follow(http, url, body, report, alive, draining, on_role, cfg.heartbeat_s)
                               for url in cfg.router_urls))


async def _follow(http: httpx.AsyncClient, url: str, body: dict, report, alive, draining, on_role,
                  heartbeat_s: float) -> None:
    """:func:`keep_registered` with one router."""
    registered = False
    while alive():
        try:
            if not registered and not draining():
                r = await http.post(url + "/internal/register", json=body)
                registered = r.status_code == 200
                if not registered:
                    log.warning("router %s refused registration: %s", url, r.text[:200])
            if registered:
                hb = (await report()).model_copy(update={"draining": draining(), "role": body["role"]})
                r = await http.post(url + "/internal/heartbeat", json=hb.model_dump())
                registered = r.status_code == 200
                if registered:
                    _adopt_role(body, r, on_role)
        except httpx.HTTPError as e:
            log.info("router %s not reachable yet (%s)", url, e)
            registered = False
        except Exception:  # noqa: BLE001 - the heartbeat must outlive any one bad pass
            log.exception("heartbeat pass to %s failed; retrying", url)
            registered = False
        await asyncio.sleep(heartbeat_s if registered else 0.5)
