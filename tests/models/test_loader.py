"""Loading SmolLM2 copies no weight twice and leaves the weights it takes as they are in the
memory-mapped file (shared by every process that maps it); measured in a fresh process."""

import json
import subprocess
import sys

MIB = 1 << 20

SCRIPT = r"""
import json
import sys

def status():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out

def in_file(ptr):
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("model.safetensors"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                return True
    return False

import torch
from warmpath.models.loader import load_model
before = status()
lm = load_model("smollm2", quantization=sys.argv[1])
after = status()
named = dict(lm.model.named_parameters())
print(json.dumps({
    "anon": after["RssAnon"] - before["RssAnon"], "peak": after["VmHWM"] - before["VmHWM"],
    "file": after["RssFile"] - before["RssFile"],
    "params": sum(p.numel() * p.element_size() for p in named.values()),
    "linear": sum(p.numel() * p.element_size() for n, p in named.items() if n.endswith("weight_t")),
    "mapped": sorted(n for n, p in named.items() if in_file(p.data_ptr())),
    "contiguous": all(p.is_contiguous() for p in named.values()),
    "tokenizer": lm.tokenizer is not None,
}))
"""


def load(quantization: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, quantization], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_weights_are_copied_once_and_the_rest_stays_mapped():
    r = load("none")
    assert r["params"] == 538_060_032          # 134,515,008 float32 parameters
    # every fused / transposed Linear weight is built once: what the load adds to anonymous
    # memory is those weights (405 MiB) plus the tokenizer and torch's first use (~85 MiB
    # here), not a second copy of anything (the loader that copied added ~370 MiB more)
    assert r["linear"] == 424_673_280
    assert r["anon"] < r["linear"] + 128 * MIB, r
    # the peak: those weights plus the file's pages read while building them (the loader
    # that copied peaked ~640 MiB higher)
    assert r["peak"] < r["params"] + r["linear"] + 128 * MIB, r
    # the embedding and the norms are views of the file (61 RMSNorm weights + the table)
    assert "embed_tokens.weight" in r["mapped"] and "norm.weight" in r["mapped"]
    assert len(r["mapped"]) == 1 + 1 + 2 * 30
    assert r["contiguous"] and r["tokenizer"]
    assert r["file"] < 64 * MIB, r               # the table is not read until the first sample


def test_quantizing_leaves_the_table_mapped_but_not_resident():
    r = load("fp16w")        # builds an fp16 LM head from the whole table, then maps it afresh
    assert "embed_tokens.weight" in r["mapped"] and r["contiguous"]
    assert r["file"] < 64 * MIB, r


def test_loading_the_default_model_does_not_import_dynamo():
    """A worker's start (and every restart) must not pay torch._dynamo's import (3-4 s on
    2 cores): building the model for the checkpoint draws no random weights."""
    import subprocess
    import sys

    code = ("import sys; from warmpath.models.loader import load_model; lm = load_model('smollm2'); "
            "print(lm.model_id, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["SmolLM2-135M-Instruct", "False"]
