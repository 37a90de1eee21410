"""The private Mooncake service comes back on the same ports after its processes die, and
a client that was connected before uses it again without reconnecting (issue 17)."""

import os
import time

from tests.kv.test_l3_faults import _client, _ident


def test_master_and_holder_killed_then_restarted_on_the_same_ports():
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    from warmpath.kv.mooncake_service import MooncakeService

    with MooncakeService(segment_bytes=16 << 20) as svc:
        l3 = _client(svc)
        master = svc.master
        assert len(l3.put([_ident(1)], lambda i, p: p.fill(1))[0]) == 1
        assert svc.dead() == [] and svc.restart_dead() == []
        svc.holder_proc.kill()
        svc.holder_proc.wait()
        assert svc.restart_dead() == ["holder"]
        svc.kill_master()
        assert sorted(svc.restart_dead()) == ["holder", "master"]   # the old holder goes with it
        assert svc.master == master and svc.dead() == []
        deadline = time.monotonic() + 15
        while not l3.put([_ident(2)], lambda i, p: p.fill(2))[0]:   # the circuit breaker's retry
            assert time.monotonic() < deadline, "the client never used the new master"
            time.sleep(0.5)
        got = []
        assert l3.get([_ident(2)], lambda i, p: got.append(int(p[0]))) == 1 and got == [2]
        l3.close()
