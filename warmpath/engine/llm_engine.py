"""The engine of one worker: scheduler + block manager + model runner, stepped; what each
request is told after a step is ``request_output.py``'s."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import torch

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.tiered_kv import TierConfig, TieredKV
from warmpath.engine.model_runner import ModelRunner
from warmpath.engine.request_output import OutputAssembler, RequestOutput
from warmpath.engine.scheduler import Scheduler, SchedulerConfig
from warmpath.engine.sequence import SamplingParams, Sequence
from warmpath.engine.step_trace import StepTraceWriter
from warmpath.engine.tier_rules import credit_l3_writes
from warmpath.kv.block_pool import BlockPool
from warmpath.kv.hashing import KVNamespace
from warmpath.kv.sizing import l1_blocks
from warmpath.models.loader import LoadedModel, load_model


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings (model, memory, batching).

    ``device``/``dtype`` ``"auto"``: CUDA + bfloat16 when available, else CPU + float32.
    ``kv_cache_gib`` ``None``: one context window of blocks (``kv/sizing.py``);
    ``num_blocks`` overrides both when set. ``quantization``: none (the float32
    reference) | int8 | fp16w | int8w | int4w | auto (fp16w on CPU); see ``models/quant.py``.
    """

    model: str = "smollm2"
    device: str = "auto"
    dtype: str = "auto"
    quantization: str = "none"
    block_size: int = 16
    kv_cache_gib: float | None = None
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    max_model_len: int | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_threads: int | None = None
    seed: int = 0
    tiers: TierConfig | None = None      # L2/L3 and KV events; None = L1 only
    worker_id: str = "worker"
    step_trace: str | None = None        # append one JSON line per step with work to this file
    attention: str = "paged"             # paged | gather (engine/model_runner.py)
    compile: str = "off"                 # off | on: the compiled decode step (models/compiled_step.py)
    decode_threads: int | None = None    # small decode-only steps' threads (model_runner.py)
    kv_dtype: str = "auto"               # auto (the model's dtype) | float32 | bfloat16 | float16

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {self.num_blocks}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto/float32/bfloat16/float16, got {self.dtype!r}")
        if self.kv_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"kv_dtype must be auto/float32/bfloat16/float16, got {self.kv_dtype!r}")

    def resolve_device(self) -> tuple[torch.device, torch.dtype]:
        dev = self.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        dt = self.dtype
        if dt == "auto":
            dt = "bfloat16" if dev.startswith("cuda") else "float32"
        return torch.device(dev), getattr(torch, dt)


class LLMEngine:
    """Synchronous engine: ``add_request`` then call ``step`` until idle."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.cfg = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        device, dtype = config.resolve_device()
        self.loaded = loaded or load_model(config.model, device, dtype, seed=config.seed,
                                             quantization=config.quantization)
        self.tokenizer = self.loaded.tokenizer
        mcfg = self.loaded.config
        self.max_model_len = min(config.max_model_len or mcfg.max_position_embeddings,
                                 mcfg.max_position_embeddings)
        kv_dtype = (next(self.loaded.model.parameters()).dtype if config.kv_dtype == "auto"
                    else getattr(torch, config.kv_dtype))
        kv_itemsize = kv_dtype.itemsize
        nblocks = config.num_blocks or l1_blocks(
            config.kv_cache_gib, mcfg.kv_bytes_per_token(kv_itemsize) * config.block_size,
            self.max_model_len, config.block_size, config.scheduler.max_num_seqs)
        self.runner = ModelRunner(self.loaded, nblocks, config.block_size, config.attention,
                                  config.compile, config.scheduler.max_num_seqs, config.decode_threads,
                                  kv_dtype)
        self.pool = BlockPool(nblocks, enable_caching=config.enable_prefix_caching)
        self.block_manager = BlockManager(self.pool, config.block_size)
        sched_cfg = config.scheduler
        if sched_cfg.max_model_len != self.max_model_len:
            sched_cfg = replace(sched_cfg, max_model_len=self.max_model_len)
        self.tiers = TieredKV(config.tiers, self.runner.kv_caches, self.pool, config.block_size,
                              config.worker_id) if config.tiers else None
        self.scheduler = Scheduler(sched_cfg, self.block_manager,
                                   external=self.tiers.rules if self.tiers else None)
        self.namespace = KVNamespace(
            model_id=self.loaded.model_id, revision=self.loaded.revision,
            dtype=str(self.runner.kv_dtype).removeprefix("torch."), block_size=config.block_size,
            tokenizer=self.tokenizer.identity if self.tokenizer else "")
        self.eos_ids = tuple(mcfg.eos_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self.outputs = OutputAssembler(self.tokenizer, self.eos_ids)
        self._ids = itertools.count()
        self._initial: dict[str, RequestOutput] = {}
        self.num_steps, self.busy_seconds = 0, 0.0
        self._trace = StepTraceWriter(config.step_trace) if config.step_trace else None

    # -- requests ----------------------------------------------------------
    def check_prompt(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise ``ValueError`` if a request cannot fit the context window or the KV pool."""
        if num_prompt_tokens == 0:
            raise ValueError("prompt is empty")
        if num_prompt_tokens >= self.max_model_len:
            raise ValueError(f"prompt has {num_prompt_tokens} tokens; the context window is "
                             f"{self.max_model_len} tokens")
        if num_prompt_tokens + max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens={max_tokens} plus the prompt's {num_prompt_tokens} tokens "
                             f"exceeds the context window of {self.max_model_len} tokens")
        need = self.block_manager.blocks_for(num_prompt_tokens + max_tokens)
        if need > self.pool.num_blocks:
            raise ValueError(f"request needs {need} KV blocks, the pool has {self.pool.num_blocks}")

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, cache_salt: str | None = None,
                    arrival_time: float | None = None,
                    output_prefix: list[int] | None = None) -> str:
        """Queue a request; returns its id. Raises ``ValueError`` on bad input.

        ``output_prefix``: tokens already generated elsewhere (the first token a prefill
        worker sampled, handed off to this decode worker). They count as output; the
        request continues after them, and :meth:`take_initial_output` reports them.
        """
        vocab = self.loaded.config.vocab_size
        prefix = list(output_prefix or [])
        if any(not 0 <= t < vocab for t in prompt_token_ids + prefix):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        self.check_prompt(len(prompt_token_ids), params.max_tokens)
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._seqs:
            raise ValueError(f"duplicate request id {rid!r}")
        seq = Sequence(rid, list(prompt_token_ids), params, self.namespace.with_salt(cache_salt),
                       arrival_time=arrival_time or time.monotonic())
        try:
            self._seqs[rid] = seq
            self.outputs.open(rid, params.stop)
            if prefix:
                seq.output_token_ids.extend(prefix)
                seq.first_token_time = seq.first_scheduled_time = seq.arrival_time
                self._initial[rid] = self._prefix_output(seq)
                if self._initial[rid].finished:
                    return rid
            self.scheduler.add(seq)
        except BaseException:   # leave no trace of a request that was not added
            self._seqs.pop(rid, None)
            self.outputs.close(rid)
            self._initial.pop(rid, None)
            raise
        return rid

    def _prefix_output(self, seq: Sequence) -> RequestOutput:
        out = self.outputs.prefix(seq, self.scheduler.stop_reason(seq, seq.output_token_ids[-1], self.eos_ids))
        if out.finished:
            seq.finish_reason = out.finish_reason
            self._seqs.pop(seq.request_id, None)
        return out

    def early_prefix_output(self, request_id: str, num_prompt_tokens: int, params: SamplingParams,
                            prefix: list[int] | None) -> RequestOutput | None:
        """The output :meth:`add_request` will produce for ``prefix`` when it surely does not
        end the request, computed without touching engine state (safe from another thread);
        ``None`` otherwise (``OutputAssembler.early_prefix``)."""
        return self.outputs.early_prefix(request_id, num_prompt_tokens, params, prefix)

    def take_initial_output(self, request_id: str) -> RequestOutput | None:
        """The output for an ``output_prefix`` given to :meth:`add_request` (once)."""
        return self._initial.pop(request_id, None)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks; ``False`` if unknown or already done."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        self._forget(request_id)
        return True

    def fail(self, request_id: str, error: str) -> RequestOutput | None:
        """Fail one request (an error its own data caused inside a step): free its blocks
        and sampler state, leave every other request as it was. ``None`` if unknown."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        self.scheduler.finish(seq, "error")
        self._forget(request_id)
        return self.outputs.failed(seq, error)

    def _forget(self, request_id: str) -> None:
        """A request ended: drop it, its text and its sampler state."""
        self._seqs.pop(request_id, None)
        self.outputs.close(request_id)
        self.runner.sampler.release(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def close(self) -> None:
        """Release the lower tiers (event sockets, store client)."""
        if self.tiers is not None:
            self.tiers.close()
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    def request_ids(self) -> list[str]:
        """Ids of the requests not finished yet."""
        return list(self._seqs)

    # -- start-up ------------------------------------------------------------
    def warm_up(self) -> dict[str, float]:
        """Do once, before this engine serves, what its first request would otherwise wait for,
        and leave no trace; returns the seconds each part took (``total`` included).

        The first request is the first to touch the weights the load left memory-mapped (the
        embedding table and the norms, ``models/loader.py``: read from disk at first use, at
        a cold disk's speed), the first to run each kernel (oneDNN / MKL set-up, the OpenMP team,
        the C attention's task pool), the sampler's both paths, the tokenizer and chat
        template, the KV pages it writes (committed lazily) and, with L3, the first transfer
        through Mooncake. Here: the chat template and the tokenizer both ways; two requests in
        one batch, one greedy and one sampled (seeded; top-k, top-p, min-p and a repetition
        penalty), of a prompt and answer that fill no KV block, so nothing is sealed, cached,
        written below L1 or announced in KV events, run with the lower tiers and the step trace
        set aside; then one block through L3 and back under a key of this worker's. The
        counters the requests moved (steps, busy time, prefix-cache lookups, the free queue's
        order) are put back as they were."""
        t0 = time.perf_counter()
        took: dict[str, float] = {}
        if self.tokenizer is not None:
            try:
                text = self.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
            except Exception:  # noqa: BLE001 - no template (/v1/completions only): plain text
                text = "Hi"
            self.tokenizer.decode(self.tokenizer.encode(text, add_special=False))
            took["tokenizer"] = time.perf_counter() - t0
        bs, new = self.cfg.block_size, 2
        n = min(8, bs - new, self.max_model_len - new)
        if n >= 1 and not self._seqs:
            t = time.perf_counter()
            self._warm_requests(list(range(1, n + 1)), new)
            took["model"] = time.perf_counter() - t
        if self.tiers is not None and self.tiers.l3 is not None:
            t = time.perf_counter()
            if self._warm_l3():
                took["l3"] = time.perf_counter() - t
        took["total"] = time.perf_counter() - t0
        return took

    def _warm_requests(self, prompt: list[int], new: int) -> None:
        """The two warm-up requests (``prompt`` + ``new`` tokens: less than a block) to the end."""
        sch, pool = self.scheduler, self.pool
        saved = (self.tiers, sch.external, self._trace, self.num_steps, self.busy_seconds, sch.prefix_query_tokens,
                 sch.prefix_hit_tokens, sch.num_preemptions, replace(pool.stats), list(pool._free))
        self.tiers, sch.external, self._trace = None, None, None
        try:
            self.add_request(prompt, SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True),
                             request_id="warm-up-greedy")
            self.add_request(prompt, SamplingParams(max_tokens=new, temperature=0.8, top_k=40, top_p=0.9, min_p=0.05,
                                                    repetition_penalty=1.1, seed=0, ignore_eos=True),
                             request_id="warm-up-sampled")
            while self.has_work():
                self.step()
        finally:
            for rid in list(self._seqs):   # a failed warm-up leaves nothing running
                self.abort(rid)
            (self.tiers, sch.external, self._trace, self.num_steps, self.busy_seconds, sch.prefix_query_tokens,
             sch.prefix_hit_tokens, sch.num_preemptions, pool.stats, order) = saved
            pool._free.clear()
            pool._free.update((i, None) for i in order)

    def _warm_l3(self) -> bool:
        """One block written to L3 and read back through the registered staging buffer (the
        path every load and write-through takes), under a key of this worker's that no prompt
        has (``wp/warm-up/<worker id>``: the previous start's copy is removed first, so one
        block per worker id stays; Mooncake refuses to remove a block read moments ago);
        ``False`` when L3 is down or the transfer failed (left to the first real use)."""
        l3 = self.tiers.l3
        if not l3.available:
            return False
        key = f"wp/warm-up/{self.cfg.worker_id}"
        try:
            with l3._lock:
                ptr = l3.staging.ctypes.data
                l3._call(l3._store.remove, key)
                l3._call(l3._store.batch_put_from, [key], [ptr], [l3.slot])
                got = l3._call(l3._store.batch_get_into, [key], [ptr], [l3.slot])
            return bool(got) and got[0] > 0
        except Exception as e:  # noqa: BLE001 - a warm-up, not a health check
            import logging

            logging.getLogger(__name__).warning("L3 warm-up failed: %s", e)
            return False

    # -- stepping ----------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns outputs of requests that advanced."""
        start = time.perf_counter()
        out = self.scheduler.schedule()
        if out.is_empty:
            if self.tiers is not None:   # only overlapped loads to wait for: no busy loop
                self.tiers.rules.wait_loads(0.005)
            return []
        t0 = time.perf_counter()
        if self.tiers is not None:
            self.tiers.apply_loads()
        items = [(s.num_tokens, s.seq.num_computed_tokens) for s in out.scheduled] if self._trace else None
        t1 = time.perf_counter()
        tiers_s = t1 - t0
        result = self.runner.execute(out)
        exec_s = time.perf_counter() - t1
        self.num_steps += 1
        sealed = [(s.seq, s.seq.num_sealed_blocks) for s in out.scheduled]
        finished = {q.request_id for q in self.scheduler.update(out, result.sampled, self.eos_ids)}
        if self.tiers is not None:
            self.tiers.cost.observe_prefill(out.num_tokens, time.perf_counter() - t0)
            t_put = time.perf_counter()
            credit_l3_writes(sealed, self.tiers.after_step())
            tiers_s += time.perf_counter() - t_put
        outputs = []
        for rid in result.sampled_ids:
            seq = self._seqs.get(rid)
            if seq is None:
                continue
            try:
                if rid in result.failed:
                    raise RuntimeError(result.failed[rid])
                outputs.append(self._output(seq, rid in finished))
            except Exception as e:  # noqa: BLE001 - this request's fault: fail it alone
                failed = self.fail(rid, str(e) if rid in result.failed else f"{type(e).__name__}: {e}")
                if failed is not None:
                    outputs.append(failed)
        end = time.perf_counter()
        self.busy_seconds += end - start
        if self._trace is not None:
            self._trace.write(end - start, exec_s, tiers_s, items)
        return outputs

    def idle(self) -> None:
        """Nothing to schedule: the lower tiers may do their background checks."""
        if self.tiers is not None:
            self.tiers.idle()

    def _output(self, seq: Sequence, done: bool) -> RequestOutput:
        """The output of a sequence that just got a token (forgets it when done)."""
        text, stopped = self.outputs.token_text(seq, done)
        if stopped and not done:
            self.scheduler.finish(seq, "stop")
            done = True
        first = len(seq.output_token_ids) == 1
        out = self.outputs.token(seq, text, done, self._l3_prompt_blocks(seq) if first else None)
        if done:
            self._forget(seq.request_id)
        return out

    def _l3_prompt_blocks(self, seq: Sequence) -> int:
        if self.tiers is None or self.tiers.l3 is None:
            return 0
        n = seq.num_prompt_tokens // self.cfg.block_size
        return self.tiers.rules.count_in_l3(seq.full_block_hashes()[:n])

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[list[int]]:
        """Offline helper: run prompts to completion, return output token ids in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        res: dict[str, list[int]] = {r: [] for r in rids}
        while self.has_work():
            for o in self.step():
                res[o.request_id].extend(o.new_token_ids)
        return [res[r] for r in rids]
