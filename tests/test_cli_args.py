"""The flags of ``serve`` / ``worker`` (warmpath/cli_args.py): renamed flags keep their former
names as aliases, and ``serve_namespace`` parses ``warmpath serve`` without the whole CLI."""

from warmpath.cli_args import engine_config, serve_namespace, tier_config


def test_renamed_flags_keep_their_former_names():
    new = serve_namespace(["--schedule-order", "prefill-first", "--kv-write-mode", "none", "--kv-load-mode", "never", "--no-l3"])
    old = serve_namespace(["--policy", "prefill-first", "--kv-write-policy", "none", "--load-policy", "never", "--no-l3"])
    for a in (new, old):
        assert (a.schedule_order, a.kv_write_mode, a.kv_load_mode) == ("prefill-first", "none", "never")
        tiers = tier_config(a)
        assert (tiers.write_mode, tiers.load_mode) == ("none", "never")
        assert engine_config(a, tiers).scheduler.order == "prefill-first"


def test_defaults_are_as_before():
    a = serve_namespace(["--no-l3"])
    assert (a.topology, a.schedule_order, a.kv_write_mode, a.kv_load_mode, a.log_level) == (
        "single", "decode-first", None, "auto", "INFO")
    assert tier_config(a).write_mode == "write-back"          # a replica (the single worker)
