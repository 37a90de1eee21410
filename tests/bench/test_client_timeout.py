"""The bench client's own timeout (issue 53): by default each request's deadline fits its own
lengths (a fixed 30 s cut multi-turn-chat's long answers at a CPU's 133 ms TPOT), and the
summary counts the failures that were the client's timeout apart from the server's errors."""

import asyncio
import json

import httpx
import pytest

import warmpath.bench.cli as bench_cli
from tests.bench.test_runner import FakeTarget
from warmpath.bench.cli import SIM_TIMEOUT_S, check_shared_flags, print_summary
from warmpath.bench.metrics import Record, client_timed_out, client_timeout_error, summarize
from warmpath.bench.runner import DEADLINE, Answer, Deadline, OpenAITarget, timeout_text
from warmpath.bench.workload import multi_turn_chat
from warmpath.cli import build_parser, main

TPOT = 0.133   # the 2-replica CPU serve of the issue


def test_the_default_deadline_per_request():
    assert (DEADLINE.base_s, DEADLINE.per_output_s, DEADLINE.per_prompt_s) == (30.0, 0.5, 0.01)
    assert DEADLINE(0, 1) == 30.5
    assert DEADLINE(100, 1024) == 30.0 + 512.0 + 1.0
    assert timeout_text(None) == "per request: 30 s + 0.5 s per answer token asked + 0.01 s per prompt token"
    assert timeout_text(12.5) == "12.5 s"


def test_the_default_fits_multi_turn_chat_where_30_s_cut_its_long_answers():
    """Every turn of 17 sessions (answers sent back as history, all max_tokens long): at 133 ms
    per token and 500 prompt tokens/s, 13 of 46 answers end past 30 s; none past its deadline."""
    turns = []
    for s in multi_turn_chat(17, 0):
        history = 0
        for t in s.turns:
            history += len(t.new_tokens)
            turns.append((history, t.max_tokens))
            history += t.max_tokens
    e2e = [TPOT * m + 0.002 * p for p, m in turns]
    assert (len(turns), max(m for _, m in turns)) == (46, 713)
    assert sum(x > 30.0 for x in e2e) == 13
    assert sum(x > DEADLINE(p, m) for x, (p, m) in zip(e2e, turns)) == 0


def slow_target(delay_s: float, **kw) -> OpenAITarget:
    """A target whose server answers (one token, then the end) after ``delay_s``."""
    async def handler(req: httpx.Request) -> httpx.Response:
        await asyncio.sleep(delay_s)
        body = 'data: {"choices": [{"index": 0, "text": "x"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())

    t = OpenAITarget("http://bench.test", model="m", **kw)
    t.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return t


def complete(t: OpenAITarget, max_tokens: int) -> Answer:
    async def go():
        try:
            return await t.complete([1, 2, 3, 4], max_tokens, "s0")
        finally:
            await t.http.aclose()
    return asyncio.run(go())


def test_without_timeout_each_request_gets_its_own_deadline():
    small = Deadline(base_s=0.1, per_output_s=0.1, per_prompt_s=0.0)
    late = complete(slow_target(0.4, deadline=small), max_tokens=1)          # 0.2 s allowed
    assert (late.ok, late.error) == (False, "TimeoutError: no answer within 0.2 s of its send "
                                            "(the client's own --timeout)")
    assert client_timed_out(late.error)
    on_time = complete(slow_target(0.4, deadline=small), max_tokens=8)       # 0.9 s allowed
    assert (on_time.ok, on_time.text) == (True, "x")
    fixed = complete(slow_target(0.4, timeout_s=0.25, deadline=small), max_tokens=8)   # --timeout wins
    assert fixed.error == "TimeoutError: no answer within 0.25 s of its send (the client's own --timeout)"


def rec(ok: bool, error: str | None = None, cls: str = "cold", turn: int = 1) -> Record:
    return Record("s", turn, cls, ok, 0.1 if ok else None, 1.0 if ok else None, 5, 10, 0, [], error)


def test_summary_counts_the_clients_timeouts_apart():
    rs = [rec(True), rec(False, client_timeout_error(30.0)), rec(False, client_timeout_error(30.0), "warm", 2),
          rec(False, "HTTP 500: b'boom'"), rec(False, "TimeoutError: no answer within 30 s"),   # the simulator's
          rec(False, "ConnectError: refused")]
    s = summarize(rs, 10.0, None)
    assert (s["all"]["completed"], s["all"]["failed"], s["all"]["timed_out"]) == (1, 5, 3)
    assert (s["cold"]["failed"], s["cold"]["timed_out"]) == (4, 2)
    assert (s["warm"]["failed"], s["warm"]["timed_out"]) == (1, 1)
    assert not client_timed_out(None) and not client_timed_out("HTTP 504: b'timeout'")


def test_the_printed_summary_says_plainly_which_failures_were_the_clients_timeout(capsys):
    classes = summarize([rec(True)] * 12 + [rec(False, client_timeout_error(40.0))] * 5, 40.0, None)
    summary = {"rates": {"0.2": classes}, "runs": {"0.2": {}}, "client_timeout": timeout_text(None)}
    print_summary(summary)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rate 0.2: completed 12 failed 5 (5 at the client's timeout) TTFT")
    assert lines[1] == ("5 requests failed at this client's own timeout (per request: 30 s + 0.5 s per answer "
                        "token asked + 0.01 s per prompt token), not with an error from the server: give "
                        "--timeout more seconds to let such answers finish")
    print_summary({"rates": {"0.2": summarize([rec(False, "HTTP 500: b''")], 1.0, None)}, "runs": {}})
    out = capsys.readouterr().out
    assert "failed 1 TTFT" in out and "client" not in out
    print_summary({"rates": {"1.0": summarize([rec(False, "TimeoutError: no answer within 30 s")], 1.0, None)},
                   "runs": {}, "timeout_s": 30.0})                        # a simulator's summary
    assert "1 request failed at this client's own timeout (30 s)" in capsys.readouterr().out


def test_flag_defaults_bench_fits_the_workload_the_simulator_keeps_30_s():
    p = build_parser()
    assert p.parse_args(["bench", "--url", "http://x", "--workload", "multi-turn-chat"]).timeout is None
    assert p.parse_args(["bench", "--url", "http://x", "--workload", "multi-turn-chat", "--timeout", "90"]).timeout == 90
    assert p.parse_args(["sim", "--workload", "multi-turn-chat"]).timeout == SIM_TIMEOUT_S == 30.0
    a = p.parse_args(["bench", "--url", "http://x", "--workload", "multi-turn-chat", "--timeout", "0"])
    with pytest.raises(ValueError, match="--timeout must be > 0, got 0"):
        check_shared_flags(a)
    check_shared_flags(p.parse_args(["bench", "--url", "http://x", "--workload", "multi-turn-chat"]))


def test_bench_end_to_end_records_the_timeout_and_counts_its_failures(tmp_path, monkeypatch, capsys):
    made = []

    class TimingOut(FakeTarget):
        async def complete(self, prompt, max_tokens, session_id):
            a = await super().complete(prompt, max_tokens, session_id)
            return Answer(False, error=client_timeout_error(12.0)) if session_id == "chat-1" else a

    def make(url, model, timeout_s, decode, api_key=None):
        made.append((TimingOut(delay=0.01), timeout_s))
        return made[-1][0]

    monkeypatch.setattr(bench_cli, "OpenAITarget", make)
    out = tmp_path / "out"
    assert main(["bench", "--url", "http://127.0.0.1:9", "--workload", "multi-turn-chat", "--concurrency", "2",
                 "--duration", "0.2", "--scale", "0.05", "--no-retokenize", "--quiet", "--out", str(out)]) == 0
    assert made[0][1] is None                               # no --timeout: each request's own
    s = json.loads((out / "summary.json").read_text())
    assert (s["timeout_s"], s["client_timeout"]) == (None, timeout_text(None))
    (rate,) = s["rates"]
    a = s["rates"][rate]["all"]
    assert a["failed"] == a["timed_out"] == 1              # chat-1's first turn; its session ends there
    printed = capsys.readouterr().out
    assert "1 request failed at this client's own timeout (per request: 30 s" in printed
    assert "timed_out" in (out / "results.csv").read_text().splitlines()[0]
