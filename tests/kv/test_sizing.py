"""The default KV tier sizes (kv/sizing.py), with numbers worked by hand for SmolLM2-135M:
30 layers x 2 (K, V) x 3 KV heads x 64 dims x 4 bytes (float32) = 46,080 bytes per token,
x 16 tokens = 737,280 bytes per block; an 8,192-token context window."""

import argparse

import pytest

from warmpath.kv.sizing import GIB, auto_blocks, blocks_in, l1_blocks, store_bytes

BLOCK = 2 * 30 * 3 * 64 * 4 * 16      # 737,280 bytes
MIB = 1 << 20


def test_l1_holds_one_context_window():
    assert BLOCK == 737_280
    assert auto_blocks(8192, 16, 64) == 512                  # 8,192 / 16
    assert auto_blocks(8192, 16, 64) * BLOCK == 360 * MIB    # 377,487,360 bytes
    assert auto_blocks(1000, 16, 1) == 63                    # 62.5 blocks, rounded up


def test_l1_gives_every_sequence_a_block():
    assert auto_blocks(256, 16, 64) == 64       # 64 sequences x 16 tokens > 256
    assert auto_blocks(256, 16, 8) == 16        # 256 / 16 when that is more


def test_explicit_gib_overrides_the_rule():
    assert blocks_in(1.0, BLOCK) == 1456        # 1,073,741,824 // 737,280 (1456.4)
    assert blocks_in(1e-6, BLOCK) == 1          # never zero
    assert l1_blocks(0.5, BLOCK, 8192, 16, 64) == 728
    assert l1_blocks(None, BLOCK, 8192, 16, 64) == 512


def test_store_holds_every_workers_l1():
    assert store_bytes(3, 512, BLOCK) == 1080 * MIB          # cpd-1d: three workers
    assert store_bytes(1, 512, BLOCK) / GIB == pytest.approx(0.3515625)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        auto_blocks(0, 16, 64)
    with pytest.raises(ValueError):
        auto_blocks(8192, 16, 0)


def _serve_args(*argv: str) -> argparse.Namespace:
    from warmpath.cli import _engine_args

    p = argparse.ArgumentParser()
    _engine_args(p)
    return p.parse_args(list(argv))


def test_cli_defaults_follow_the_model():
    from warmpath.cli import _store_gib, engine_config, tier_config

    a = _serve_args()
    assert (a.kv_cache_gib, a.l2_gib, a.l3_gib) == ("auto", "auto", "auto")
    assert _store_gib(a, 3) * GIB == 1080 * MIB               # SmolLM2 float32, cpd-1d
    assert _store_gib(_serve_args("--dtype", "bfloat16"), 3) * GIB == 540 * MIB
    assert _store_gib(_serve_args("--max-model-len", "2048"), 1) * GIB == 2048 // 16 * BLOCK
    assert engine_config(a).kv_cache_gib is None
    b = _serve_args("--no-l3")
    b.host = "127.0.0.1"
    assert tier_config(b).l2_gib is None


def test_cli_flags_override():
    from warmpath.cli import _store_gib

    a = _serve_args("--kv-cache-gib", "0.5", "--l2-gib", "0", "--l3-gib", "1.5")
    assert (a.kv_cache_gib, a.l2_gib, _store_gib(a, 3)) == (0.5, 0.0, 1.5)
    assert _store_gib(_serve_args("--no-l3"), 3) == 0.0
    assert _store_gib(_serve_args("--kv-store", "10.0.0.1:50051"), 3) == 0.0
    assert _store_gib(_serve_args("--kv-cache-gib", "0.5"), 2) * GIB == 2 * 728 * BLOCK
    with pytest.raises(SystemExit):
        _serve_args("--l2-gib", "-1")
