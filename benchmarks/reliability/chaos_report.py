"""The chaos run's verdict (``benchmarks/reliability/chaos.py``): the cluster after the load, the goals,
and the printed summary."""

from __future__ import annotations

import time

import httpx

from warmpath.bench.prom import sample_value


def after_load(base: str, auth: dict, timeout: float = 120.0) -> dict:
    """Once every worker is idle (or ``timeout``): its KV blocks held and pool invariants
    (scraped twice when the first check fails: it may race a late request), the router's
    dropped workers and retries."""
    workers = httpx.get(base + "/v1/cluster", headers=auth, timeout=10).json()["workers"]
    out = {}
    deadline = time.monotonic() + timeout
    for w in workers:
        while True:
            text = httpx.get(w["url"] + "/metrics", timeout=10).text
            get = lambda n, **kw: sample_value(text, n, **kw)   # noqa: E731
            st = {"running": get("warmpath_num_requests_running"), "waiting": get("warmpath_num_requests_waiting"),
                  "kv_blocks_used": get("warmpath_kv_blocks_used"), "pool_integrity": get("warmpath_kv_pool_integrity"),
                  "verify_failures": sum(v for r in ("checksum", "format", "tag", "key")
                                         for v in [get("warmpath_kv_verify_failures_total", reason=r, tier="L3")] if v)}
            idle = (st["running"], st["waiting"], st["kv_blocks_used"]) == (0, 0, 0) and st["pool_integrity"] == 1
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out[w["worker_id"]] = {"pid": w["pid"], **st}
    router = httpx.get(base + "/metrics", timeout=10).text
    dropped = {r: sample_value(router, "warmpath_router_workers_dropped_total", reason=r) or 0
               for r in ("silent", "unhealthy", "unreachable")}
    return {"workers": out, "router_dropped": dropped,
            "router_retries": sample_value(router, "warmpath_router_retries_total") or 0}


def excused(fail: dict, faults: list[dict]) -> bool:
    """A failure before the first token while no other worker of its role was healthy: in
    ``cpd-1d`` the one decode worker stopped (until it rejoined)."""
    for f in faults:
        if f["kind"] == "stop" and f["target"] == "decode-0" and f.get("fired_s") is not None:
            end = f["fired_s"] + f["stopped_s"] + (f.get("rejoined_after_cont_s") or 0) + 1
            if f["fired_s"] - 1 <= fail["end_s"] and fail["sent_s"] <= end:
                return True
    return False


def goals(res: dict) -> list[str]:
    """Every goal missed, in words (empty: all met)."""
    hb, ld, bad = res["heartbeat_s"], res["load"], []
    if ld["wrong_answers"]:
        bad.append(f"{ld['wrong_answers']} answers differ from the single engine's")
    early = [x for x in ld["failures"] if x["where"] == "before_first" and not excused(x, res["faults"])]
    if early:
        bad.append(f"{len(early)} failures before the first token while another worker of the role was healthy")
    if ld["failed_mid_stream_unclean"]:
        bad.append(f"{ld['failed_mid_stream_unclean']} mid-stream failures without an OpenAI error event")
    for f in res["faults"]:
        name = f"{f['kind']} {f['target']}"
        if "error" in f:
            bad.append(f"{name}: could not run ({f['error']})")
        for key in ("detected_s", "rejoined_after_cont_s"):
            if key in f and (f[key] is None or f[key] > 2 * hb):
                bad.append(f"{name}: {key} {f[key]} > 2 heartbeats ({2 * hb:g} s)")
        refused_later = sum(st.get("verify_failures") or 0 for st in res["after"]["workers"].values())
        if f["kind"] == "corrupt" and not f.get("verify_failures") and not refused_later:
            bad.append(f"{name}: no corrupted block was read back (not exercised)")   # refused whenever read
        for key in ("first_ok_after_s", "rejoined_s", "restarted_s", "l3_written_again_s"):
            if key in f and f[key] is None:
                bad.append(f"{name}: never {key.removesuffix('_s')}")
    for w, st in res["after"]["workers"].items():
        if st["kv_blocks_used"] != 0 or st["pool_integrity"] != 1 or st["running"] or st["waiting"]:
            bad.append(f"{w} after the load: {st}")
    if not res["load_finished"]:
        bad.append("the load did not finish")
    bad += [f"left behind: {p}" for p in res["left_behind"]]
    return bad


def print_summary(res: dict) -> None:
    """A few lines for the terminal."""
    ld = res["load"]
    print(f"\ncpd-1d, {res['duration_s']:.0f} s at {res['rate']} sessions/s (seed {res['seed']}, heartbeat "
          f"{res['heartbeat_s']:g} s, drop after {res['drop_after_s']:g} s)")
    print(f"requests: {ld['sent']} sent, {ld['completed']} completed, {ld['failed_before_first_token']} failed "
          f"before the first token, {ld['failed_mid_stream_clean']} mid-stream with an error event, "
          f"{ld['failed_mid_stream_unclean']} mid-stream without; {ld['wrong_answers']} wrong answers")
    for f in res["faults"]:
        keys = {k: v for k, v in f.items() if k.endswith("_s") or k in ("corrupted", "verify_failures", "fill", "error")}
        print(f"  {f['kind']:8} {f['target']:24} {keys}")
    for w, st in res["after"]["workers"].items():
        print(f"  after: {w}: blocks used {st['kv_blocks_used']:.0f}, pool integrity {st['pool_integrity']:.0f}, "
              f"L3 loads refused {st['verify_failures']:.0f}")
    print(f"  router dropped {res['after']['router_dropped']}, retries {res['after']['router_retries']:.0f}; "
          f"left behind: {len(res['left_behind'])}")
    print("PASS" if not res["goals_missed"] else "FAIL\n  " + "\n  ".join(res["goals_missed"]))
