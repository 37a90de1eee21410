"""Cross-process KV reuse through Mooncake: two real worker processes, real HTTP."""

import httpx

from tests.conftest import metric, serve_processes, server

M = "SmolLM2-135M-Instruct"


def test_fresh_worker_loads_prompt_from_l3(mooncake, smollm):
    tok = smollm.tokenizer
    prompt = tok.encode("The warm path keeps context cached across the cluster. " * 200)[:1500]
    assert len(prompt) == 1500
    body = {"model": M, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    store = f"{mooncake.master},{mooncake.metadata}"
    # both started at once (their start-ups overlap); b gets its first request only after a's
    with serve_processes(server("--kv-store", store, "--kv-write-mode", "write-through",
                                "--max-num-batched-tokens", "512"),
                         server("--kv-store", store, "--max-num-batched-tokens", "512",
                                "--kv-l3-overlap", "on")) as (a, b):
        ra = httpx.post(a + "/v1/completions", json=body, timeout=300).json()
        assert ra["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(a, "warmpath_kv_tier_written_bytes_total", tier="L3") > 0
        # b loads beside its steps (the flag's path through a real worker process)
        rb = httpx.post(b + "/v1/completions", json=body, timeout=300).json()
        loaded = metric(b, "warmpath_kv_tier_loaded_tokens_total", tier="L3")
        assert loaded >= 0.9 * 1500
        assert loaded == 1488  # (1500 - 1) // 16 full blocks; the last token is computed
        assert rb["usage"]["prompt_tokens_details"]["cached_tokens"] == 1488
        own = rb["usage"]["warmpath"]["worker"]
        assert 0 < own.pop("l3_load_s") < 60             # the seconds b's L3 load took
        assert own == {"loaded_tokens": {"L1": 0, "L2": 0, "L3": 1488}, "recomputed_tokens": 12}   # b's own measurement
        assert metric(b, "warmpath_kv_load_decisions_total", choice="load") == 1
        assert metric(b, "warmpath_kv_tier_hit_blocks_total", tier="L3") == 93
    assert rb["choices"][0]["text"] == ra["choices"][0]["text"]
    assert len(ra["choices"][0]["text"]) > 0
