"""The flags of ``serve`` / ``worker`` (warmpath/cli_args.py): renamed flags keep their former
names as aliases (but ``--policy``, which named two things), and ``serve_namespace`` parses
``warmpath serve`` without the whole CLI."""

import pytest

from warmpath.cli_args import engine_config, serve_namespace, tier_config


def test_policy_on_a_worker_is_an_error_that_names_schedule_order(capsys):
    with pytest.raises(SystemExit) as e:
        serve_namespace(["--policy", "prefill-first", "--no-l3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--policy is not a worker flag: the step order is --schedule-order" in err
    assert "the routing policy is --route-policy" in err


def test_renamed_flags_keep_their_former_names():
    new = serve_namespace(["--schedule-order", "prefill-first", "--kv-write-mode", "none", "--kv-load-mode", "never", "--no-l3"])
    old = serve_namespace(["--schedule-order", "prefill-first", "--kv-write-policy", "none", "--load-policy", "never", "--no-l3"])
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


def test_command_is_the_first_word_after_the_global_options():
    from warmpath.cli import _command

    assert _command(["--log-level", "warning", "worker", "--worker-id", "bench"]) == "worker"
    assert _command(["bench", "--rate", "1"]) == "bench"
    assert _command(["--log-level=debug", "router"]) == "router"
    assert _command(["--help"]) is None


def test_a_worker_start_imports_no_benchmark_or_simulator_module():
    """``warmpath worker`` builds only the core subcommands' parsers; ``warmpath --help``
    still lists every subcommand."""
    import subprocess
    import sys

    code = ("import sys; from warmpath.cli import build_parser; p = build_parser('worker'); "
            "a = p.parse_args(['worker', '--router', 'http://127.0.0.1:1']); "
            "print(a.cmd, sorted(m for m in ('warmpath.sim.repro', 'warmpath.bench.cli', 'warmpath.plan.cli') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "worker []"
    from warmpath.cli import build_parser

    names = build_parser()._subparsers._group_actions[0].choices
    assert {"worker", "router", "serve", "bench", "sim", "repro", "map", "plan", "deploy", "manifests"} <= set(names)


def test_goodput_flags_parse_and_a_bad_slack_share_is_named(capsys):
    from warmpath.cli import main

    a = serve_namespace(["--goodput-local", "off", "--goodput-slack-share", "0.8"])
    assert (a.goodput_local, a.goodput_slack_share) == ("off", 0.8)
    assert serve_namespace([]).goodput_slack_share == 0.5           # the router's default, the same here
    with pytest.raises(SystemExit) as e:
        main(["router", "--route-policy", "goodput", "--goodput-slack-share", "2", "--port", "0"])
    assert e.value.code == 2
    assert "--goodput-slack-share: must be in (0, 1], got 2" in capsys.readouterr().err
    assert serve_namespace(["--goodput-hold-share", "0"]).goodput_hold_share == 0.0
    with pytest.raises(SystemExit):
        main(["router", "--route-policy", "goodput", "--goodput-hold-share", "-1", "--port", "0"])
    assert "--goodput-hold-share: must be in [0, 1], got -1" in capsys.readouterr().err
