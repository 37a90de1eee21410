"""The launcher restarts the private Mooncake service when its processes die (issue 17:
before, nothing did and L3 stayed down for the rest of the run)."""

from warmpath.launch.launcher import Cluster
from warmpath.launch.topology import resolve


class FakeService:
    def __init__(self, fail: int = 0) -> None:
        self.gone, self.fail, self.calls = [], fail, 0

    def dead(self) -> list[str]:
        return list(self.gone)

    def restart_dead(self) -> list[str]:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise RuntimeError("mooncake_master did not start listening")
        gone, self.gone = self.gone, []
        return gone


def test_a_dead_store_is_restarted_and_a_failed_restart_is_tried_again_a_second_later():
    svc = FakeService(fail=1)
    c = Cluster(resolve("cpd-1d"), "http://127.0.0.1:1", service=svc)
    assert c.restart_dead_store(0.0) == [] and svc.calls == 0        # nothing dead: nothing done
    svc.gone = ["master", "holder"]
    assert c.restart_dead_store(10.0) == [] and svc.calls == 1       # failed: tried again later
    assert c.restart_dead_store(10.5) == [] and svc.calls == 1
    assert c.restart_dead_store(11.0) == ["master", "holder"] and svc.calls == 2
    assert Cluster(resolve("cpd-1d"), "x").restart_dead_store(0.0) == []   # --kv-store: not ours
