"""Schema-driven fuzzing of a running server: schemathesis generates requests from the
server's own ``/openapi.json`` (valid ones and invalid ones), sends them one at a time and
checks every answer (no 5xx; status, content type, body and headers as the schema says; an
invalid request refused with a 4xx; a stream ends with ``[DONE]`` and carries no error event). Used by tests/launch/test_fuzz.py
(a short seeded run) and benchmarks/reliability/fuzz.py (the full run).

Half the schema-valid requests are first made to pass what a schema cannot say (the
served model's name, its vocabulary, the fields only supported at their default, integers
written as ``7.0``, which the strict models refuse): :func:`deepen`. Those get past
validation into the tokenizer, the scheduler and the sampler; the other half tests the
validation.

Generated requests may ask for many tokens; on a CPU that would make a run take hours, so
``max_tokens`` / ``max_completion_tokens`` between ``max_new`` (:data:`MAX_NEW`) and the
context window are lowered to it before sending (values beyond the window are sent as they
are: their 400 is part of what is tested), and the servers run with a small
``--max-model-len`` and ``--default-max-tokens``.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_headers_conformance, response_schema_conformance,
                                               status_code_conformance)

from tests.bad_requests import greedy_stream

MAX_NEW = 4
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
UNSUPPORTED = ("model", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "echo", "suffix")
TOKEN_FIELDS = ("prompt", "prompt_token_ids", "stop_token_ids", "first_token")


@dataclass
class FuzzResult:
    """What one server answered to the generated requests."""

    server: str
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    operations: dict = field(default_factory=dict)        # "POST /v1/completions" -> Counter of statuses
    failures: list = field(default_factory=list)          # one dict per failed check, with a curl reproducer
    not_generated: list = field(default_factory=list)     # (operation, mode) schemathesis could not generate
    valid_refused: Counter = field(default_factory=Counter)   # schema-valid requests answered 4xx, by param
    seconds: float = 0.0

    def summary(self) -> dict:
        """JSON-ready numbers (failures in full)."""
        return {"server": self.server, "sent": self.sent, "seconds": round(self.seconds, 1),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "server_errors": sum(v for k, v in self.statuses.items() if k >= 500),
                "operations": {op: {str(k): v for k, v in sorted(c.items())} for op, c in self.operations.items()},
                "valid_refused": dict(self.valid_refused.most_common()), "not_generated": self.not_generated,
                "failures": self.failures}


def cheap(body, max_model_len: int, max_new: int = MAX_NEW) -> None:
    """Lower a generated ``max_tokens`` within the context window to ``max_new`` (in place;
    also in the ``request`` of the workers' internal messages)."""
    for d in (body, body.get("request") if isinstance(body, dict) else None):
        if isinstance(d, dict):
            for k in ("max_tokens", "max_completion_tokens"):
                v = d.get(k)
                if type(v) is int and max_new < v <= max_model_len:
                    d[k] = max_new


def _ints(x, vocab: int | None = None):
    """``x`` with integral floats as ints (token ids, with ``vocab``, taken modulo it)."""
    if isinstance(x, list):
        return [_ints(v, vocab) for v in x]
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
        x = int(x)
    return x % vocab if vocab and type(x) is int and x >= 0 else x


def deepen(body, vocab: int) -> None:
    """Make a schema-valid body (in place; also its ``request``) pass the checks its schema
    cannot state, so that it reaches the engine."""
    if not isinstance(body, dict):
        return
    for d in (body, body.get("request")):
        if not isinstance(d, dict):
            continue
        for k in UNSUPPORTED:
            d.pop(k, None)
        for k, v in d.items():
            d[k] = _ints(v, vocab if k in TOKEN_FIELDS else None) if k != "messages" else v
        for m in d.get("messages") or ():
            if isinstance(m, dict) and m.get("content") is None:
                m["content"] = ""


def stream_problems(r) -> list[str]:
    """What is wrong with a 200 SSE answer: an error event, or no final ``[DONE]``."""
    if r.status_code != 200 or not r.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        return []
    data = [ln[5:].strip() for ln in r.content.decode("utf-8", "replace").splitlines() if ln.startswith("data:")]
    out = [f"error event: {d[:300]}" for d in data if d.startswith('{"error"')]
    ended = (data and data[-1] == "[DONE]") or r.stream_cut_short   # cut short: read up to its event limit
    return out + ([] if ended else ["the stream does not end with [DONE]"])


def _param(r) -> str:
    """The field a 4xx answer blames (``status:param``)."""
    try:
        err = r.json().get("error") or {}
    except ValueError:
        err = {}
    return f"{r.status_code}:{err.get('param')}"


class Fuzzer:
    """Runs schemathesis against ``base`` (its ``/openapi.json``), one operation and mode at a
    time, until ``cases`` requests went out or ``deadline`` (``time.monotonic()``) passed."""

    def __init__(self, base: str, server: str, headers: dict | None = None, max_model_len: int = 256,
                 paths: str = ".*", expect: int | None = None, vocab: int = 49152, max_new: int = MAX_NEW) -> None:
        self.base, self.headers, self.max_model_len, self.expect = base, headers or {}, max_model_len, expect
        self.vocab, self.max_new = vocab, max_new
        schema = schemathesis.openapi.from_url(base + "/openapi.json", headers=self.headers, timeout=30)
        self.ops = sorted((r.ok() for r in schema.include(path_regex=paths).get_all_operations()),
                          key=lambda op: (op.body is not None and len(op.body) > 0, op.label))
        self.result = FuzzResult(server)

    def run(self, cases: int, base_seed: int = 0, deadline: float = math.inf) -> FuzzResult:
        """Send at least ``cases`` generated requests (fewer only past ``deadline``)."""
        t0 = time.monotonic()
        slots = [(op, mode) for op in self.ops for mode in MODES]
        for i, (op, mode) in enumerate(slots):
            want = math.ceil((cases - self.result.sent) / (len(slots) - i))
            if want > 0 and time.monotonic() < deadline:
                self._one(op, mode, want, base_seed + i, deadline)
        self.result.seconds += time.monotonic() - t0
        return self.result

    def _one(self, op, mode: GenerationMode, n: int, s: int, deadline: float) -> None:
        @seed(s)
        @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(op.as_strategy(generation_mode=mode))
        def send(case) -> None:
            if time.monotonic() < deadline:
                self._send(case, mode)

        try:
            send()
        except Exception as e:   # noqa: BLE001 - e.g. nothing negative to generate for a GET without inputs
            self.result.not_generated.append([op.label, mode.value, f"{type(e).__name__}: {str(e)[:200]}"])

    def _send(self, case, mode: GenerationMode) -> None:
        res, label = self.result, case.operation.label
        if mode == GenerationMode.POSITIVE and res.sent % 2:
            deepen(case.body, self.vocab)
        cheap(case.body, self.max_model_len, self.max_new)
        try:
            r = case.call(base_url=self.base, headers=self.headers, timeout=180)
        except Exception as e:   # noqa: BLE001 - a dropped connection is a finding, not a crash of ours
            res.sent += 1
            res.statuses[0] += 1
            res.failures.append(self._failure(case, mode, None, [f"no answer: {type(e).__name__}: {e}"]))
            return
        res.sent += 1
        res.statuses[r.status_code] += 1
        res.operations.setdefault(label, Counter())[r.status_code] += 1
        if mode == GenerationMode.POSITIVE and 400 <= r.status_code < 500:
            res.valid_refused[_param(r)] += 1
        problems = stream_problems(r)
        if self.expect is not None and r.status_code != self.expect:
            problems.append(f"status {r.status_code}, want {self.expect}")
        checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
        try:
            case.validate_response(r, checks=checks, headers=self.headers)
        except BaseExceptionGroup as g:
            problems += [f"{getattr(f, 'title', type(f).__name__)}: {getattr(f, 'message', f)}"[:500]
                         for f in g.exceptions]
        if problems:
            res.failures.append(self._failure(case, mode, r.status_code, problems, r.text[:300]))

    def _failure(self, case, mode, status, problems, answer: str = "") -> dict:
        curl = case.as_curl_command(headers=self.headers, base_url=self.base)
        return {"operation": case.operation.label, "mode": mode.value, "status": status, "problems": problems,
                "answer": answer, "reproduce": re.sub(r"Bearer [^'\"]+", "Bearer $TOKEN", curl)}


class Canary:
    """A greedy streamed chat request sent again and again on its own thread while the
    ``with`` block runs; every answer must be :attr:`reference`, the text it gives alone."""

    def __init__(self, base: str, max_tokens: int = 24) -> None:
        self.base, self.max_tokens = base, max_tokens
        self.reference = greedy_stream(base, max_tokens)
        self.runs, self.wrong = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                text = greedy_stream(self.base, self.max_tokens)
            except Exception as e:   # noqa: BLE001 - a lost or broken canary is what we look for
                self.wrong.append(f"{type(e).__name__}: {e}"[:300])
                continue
            self.runs += 1
            if text != self.reference:
                self.wrong.append(text)

    def __enter__(self) -> "Canary":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


LOG_ALARMS = ("unhandled error", "Traceback", "exited with code", "restarted worker", "engine thread stopped")


def log_alarms(text: str) -> list[str]:
    """Lines of the servers' output that tell of a bug, a crash or a restart."""
    return [ln[:300] for ln in text.splitlines() if any(a in ln for a in LOG_ALARMS)]
