"""A worker adopts the role its router's heartbeat answer names (elastic roles): registered
with it from then on, and its L3 writes as the role needs (``tier_rules.write_mode_for``)."""

import httpx

from warmpath.engine.tier_rules import write_mode_for
from warmpath.worker.registration import _adopt_role


def test_a_new_role_in_the_heartbeat_answer_is_adopted_once():
    body, seen = {"role": "prefill"}, []
    _adopt_role(body, httpx.Response(200, json={"ok": True, "role": "replica"}), seen.append)
    assert body["role"] == "replica" and seen == ["replica"]
    _adopt_role(body, httpx.Response(200, json={"ok": True, "role": "replica"}), seen.append)   # no change
    _adopt_role(body, httpx.Response(200, json={"ok": True}), seen.append)                      # an older router
    _adopt_role(body, httpx.Response(200, text="not json"), seen.append)
    assert body["role"] == "replica" and seen == ["replica"]


def test_write_mode_per_role():
    assert [write_mode_for(r) for r in ("pre-prefill", "prefill", "decode", "replica")] == [
        "write-through", "write-through", "write-through", "write-back"]
    assert write_mode_for("decode", "write-back") == "write-through"      # a replica lent to decode hands KV on
    assert write_mode_for("replica", "write-through") == "write-through"  # never off write-through
    assert write_mode_for("prefill", "none") == "none"                    # no L3: stays without
