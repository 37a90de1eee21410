"""How often a client that sends the model's answer back as text (re-tokenized, as
``warmpath bench`` and chat clients do) loses the KV of that answer on the next turn.

Runs the real engine in this process on the first turns of the cluster benchmark's coding-agent
sessions (other seeds than its runs), greedy, the benchmark's answer length, and checks whether
``encode(decode(answer))`` gives back the generated ids through the first KV block the answer
starts (the block the next turn would reuse). The share that does not is the simulator's
``retokenize_miss`` for this workload (``benchmarks/sim_accuracy/sim_validation.py`` reads it).

    python -m benchmarks.sim_accuracy.answer_retokenize [--sessions 96] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import workload as real  # the cluster benchmark's workload

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import load_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=96, help="coding-agent sessions (their first turns)")
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/answer_retokenize.json"))
    a = p.parse_args()
    lm = load_model()
    tok = lm.tokenizer
    eng = LLMEngine(EngineConfig(num_blocks=4096, scheduler=SchedulerConfig(max_num_seqs=32,
                                                                           max_num_batched_tokens=2048)), loaded=lm)
    prompts = [s.prefix + s.turns[0].new_tokens for s in real.agent(a.sessions, a.seed) if s.sid.startswith("agent")]
    t0 = time.perf_counter()
    answers = eng.generate(prompts, SamplingParams(max_tokens=real.AGENT["answer"], temperature=0, ignore_eos=True))
    rows = []
    for prompt, ids in zip(prompts, answers):
        k = 16 - len(prompt) % 16            # answer tokens inside the block the answer starts
        back = tok.encode(tok.decode(ids), add_special=False)
        rows.append({"prompt_tokens": len(prompt), "answer_tokens": len(ids), "back_tokens": len(back),
                     "same_ids": back == ids, "first_block_same": back[:k] == ids[:k]})
    miss = sum(not r["first_block_same"] for r in rows)
    out = {"command": " ".join(["python", *sys.argv]), "answers": len(rows), "wall_s": time.perf_counter() - t0,
           "ids_differ": sum(not r["same_ids"] for r in rows), "first_block_differs": miss,
           "miss_share": miss / len(rows), "rows": rows}
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
