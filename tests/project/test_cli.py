"""``paged-edu``'s help and errors, as a first-time user meets them: every flag explained with its
default, runnable examples, ``--version``, and errors that name the flag at fault and the model as
the user typed it -- before anything is simulated or written."""

from __future__ import annotations

import argparse
import importlib.metadata
import shlex
import sys

import pytest

from paged_edu.cli import EXAMPLES, _build_parser, main

QUICK = ["--num-requests", "5", "--no-progress", "--managers", "paged", "--block-sizes", "16"]


def _error(argv, capsys) -> str:
    """Run ``argv``; it must exit 2 with one line on stderr (argparse's exit or main's return)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err, captured.err
    return captured.err + captured.out


@pytest.mark.parametrize("flag, leaf", [("--json", "x.json"), ("--save-trace", "trace.jsonl")])
def test_an_output_file_in_a_missing_folder_is_refused_before_simulating(flag, leaf, tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    err = _error(["simulate", *QUICK, flag, str(missing / leaf)], capsys)
    assert f"argument {flag}:" in err and str(missing) in err and "does not exist" in err, err
    assert "| manager" not in err  # refused before the table was simulated
    assert not (tmp_path / "no").exists()  # and nothing created


def test_an_output_file_that_is_a_folder_is_refused(tmp_path, capsys):
    err = _error(["simulate", *QUICK, "--json", str(tmp_path)], capsys)
    assert "argument --json:" in err and "is a folder" in err, err


def test_figures_out_needs_an_existing_parent(tmp_path, capsys):
    err = _error(["figures-sim", "--out", str(tmp_path / "no" / "figs"), "--no-progress"], capsys)
    assert "argument --out:" in err and "does not exist" in err, err
    assert not (tmp_path / "no").exists()


def test_weights_bigger_than_the_gpu_blame_the_model_by_the_name_given(capsys):
    err = _error(["simulate", *QUICK, "--model", "llama-2-70b", "--gpu", "t4"], capsys)
    assert "argument --model:" in err and "--model llama-2-70b" in err and "--gpu t4" in err, err
    assert "--gpu-memory-utilization" not in err and "Seed 70B example" not in err, err


def test_weights_that_fit_the_gpu_but_not_the_share_blame_the_utilization(capsys):
    # Llama-3-8B's 15.0 GB of bf16 weights fit a T4's 16.1 GB, not 90 % of it.
    err = _error(["simulate", *QUICK, "--model", "llama-3-8b", "--gpu", "t4"], capsys)
    assert "argument --gpu-memory-utilization:" in err and "--model llama-3-8b" in err, err
    assert main(["simulate", *QUICK, "--model", "llama-3-8b", "--gpu", "t4", "--gpu-memory-utilization", "0.99"]) == 0


def test_a_kv_pool_bigger_than_the_gpu_names_the_model_by_the_name_given(capsys):
    err = _error(["simulate", *QUICK, "--model", "llama-2-70b", "--kv-slots", str(10**8)], capsys)
    assert "argument --kv-slots:" in err and "--model llama-2-70b" in err and "Seed 70B" not in err, err


@pytest.mark.parametrize("command", ["simulate", "figures-sim"])
@pytest.mark.parametrize("size", ["1000000000", "1000001"])
def test_a_workload_too_big_to_generate_is_refused_naming_the_flag_and_the_bound(command, size, capsys):
    """Issue 23: ``--num-requests 1000000000`` generated requests until a MemoryError."""
    from paged_edu.core.validation import MAX_NUM_REQUESTS

    err = _error([command, "--num-requests", size, "--no-progress"], capsys)
    assert "argument --num-requests:" in err and f"[1, {MAX_NUM_REQUESTS}]" in err and size in err, err


def test_figures_sim_without_plotly_says_which_extra_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly -> ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    monkeypatch.delitem(sys.modules, "paged_edu.viz.sim_figures", raising=False)
    # `from paged_edu.viz import sim_figures` reads the package's attribute before sys.modules: an earlier
    # test that imported the module left it there, and the import would then never run.
    import paged_edu.viz

    monkeypatch.delattr(paged_edu.viz, "sim_figures", raising=False)
    err = _error(["figures-sim", "--out", str(tmp_path / "figs"), "--no-progress"], capsys)
    assert "plotly" in err and 'pip install "paged_edu[figures]"' in err, err


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_flag_has_help_and_shows_its_default():
    parser = _build_parser()
    for name, sub in _subparsers(parser).items():
        text = sub.format_help()
        for action in sub._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.option_strings)
            if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings != ["-h", "--help"]:
                shown = action.default if isinstance(action.default, str) else repr(action.default)
                assert f"(default:{shown})" in "".join(text.split()), (name, action.option_strings)  # wrapping ignored
    assert "(default: 1000)" in _subparsers(parser)["simulate"].format_help()


def test_every_example_in_the_help_parses():
    parser = _build_parser()
    helps = [parser.format_help(), *(sub.format_help() for sub in _subparsers(parser).values())]
    for name, text in EXAMPLES.items():
        lines = [line.strip() for line in text.splitlines() if line.strip().startswith("paged-edu ")]
        assert lines and any(text in h for h in helps), name
        for line in lines:
            if line.endswith("--help"):
                continue
            args = parser.parse_args(shlex.split(line)[1:])
            assert args.command in ("simulate", "figures-sim", "serve", "bench-serve"), line


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"paged-edu {importlib.metadata.version('paged_edu')}"


# The flag a refused setting blames, written out by hand (the oracle), not read from the CLI's table:
# (the field a library error names, extra flags, the flag the one-line error must name).
BLAMED = [
    ("max_num_seqs", [], "--max-num-seqs"),
    ("max_num_batched_tokens", [], "--max-num-batched-tokens"),
    ("num_cpu_blocks", [], "--cpu-blocks"),
    ("preemption_mode", [], "--preemption"),
    ("policy", [], "--policy"),
    ("manager", [], "--managers"),
    ("block_size", [], "--block-sizes"),
    ("gpu_memory_utilization", [], "--gpu-memory-utilization"),
    ("num_kv_slots", ["--kv-slots", "50000"], "--kv-slots"),
    ("num_kv_slots", [], "--gpu-memory-utilization"),  # no --kv-slots: the pool is what the share left
    ("num_blocks", ["--kv-slots", "50000"], "--kv-slots"),
    ("max_seq_len", [], "--workload"),
]


@pytest.mark.parametrize("field, extra, flag", BLAMED, ids=[f"{f} {' '.join(e)}" for f, e, _ in BLAMED])
def test_a_refused_setting_blames_its_flag_by_the_errors_field_not_its_text(field, extra, flag, monkeypatch, capsys):
    """The message names every limit but the field's: only ``.field`` can point at the right flag."""
    from paged_edu.core.validation import FieldValueError
    from paged_edu.sim import compare, simulator

    def refuse(requests, config, cost):
        raise FieldValueError(field, "not max_num_seqs, max_num_batched_tokens nor max_seq_len: look at the field")

    monkeypatch.setattr(simulator, "prepare", refuse)
    monkeypatch.setattr(compare, "prepare", refuse, raising=False)
    err = _error(["simulate", *QUICK, *extra], capsys)
    assert f"argument {flag}:" in err and "look at the field" in err, err
    assert "| manager" not in err  # refused before anything was simulated


def test_a_field_no_flag_sets_is_a_bug_not_a_user_error(monkeypatch):
    from paged_edu.core.validation import FieldValueError
    from paged_edu.sim import compare

    def refuse(requests, config, cost):
        raise FieldValueError("not_a_setting", "a bug: no flag sets this")

    monkeypatch.setattr(compare, "prepare", refuse)
    with pytest.raises(FieldValueError, match="a bug: no flag sets this"):
        main(["simulate", *QUICK])


def test_every_blamed_flag_is_a_flag_of_simulate():
    from paged_edu.cli import FLAG_OF_FIELD

    simulate = _subparsers(_build_parser())["simulate"]
    flags = {s for action in simulate._actions for s in action.option_strings}
    assert set(FLAG_OF_FIELD.values()) <= flags
    assert {flag for _, _, flag in BLAMED} <= flags


def test_every_server_is_built_once_per_simulate_run(monkeypatch, capsys):
    """Three servers (paged B=16, B=32, contiguous-max): three managers and three schedulers, not six."""
    from paged_edu.sim import simulator

    built = {"manager": 0, "scheduler": 0}

    def counting(kind, make):
        def build(*args, **kwargs):
            built[kind] += 1
            return make(*args, **kwargs)

        return build

    monkeypatch.setattr(simulator, "build_manager", counting("manager", simulator.build_manager))
    monkeypatch.setattr(simulator, "Scheduler", counting("scheduler", simulator.Scheduler))
    argv = ["simulate", "--num-requests", "5", "--no-progress", "--managers", "paged,contiguous-max"]
    assert main([*argv, "--block-sizes", "16,32"]) == 0
    assert "| paged B=32" in capsys.readouterr().out
    assert built == {"manager": 3, "scheduler": 3}


def test_figures_sim_blames_the_flag_of_a_refused_setting_before_simulating(tmp_path, capsys):
    """The scheduler refuses swap without swap space (its field: num_cpu_blocks); nothing is written."""
    pytest.importorskip("plotly")
    out = tmp_path / "figs"
    err = _error(
        ["figures-sim", "--out", str(out), "--num-requests", "5", "--no-progress", "--preemption", "swap"], capsys
    )
    assert "argument --cpu-blocks:" in err and "num_cpu_blocks > 0" in err, err
    assert not out.exists() or not any(out.iterdir())


def test_figures_sim_does_not_blame_a_flag_it_does_not_have(monkeypatch, tmp_path):
    """figures-sim has no --managers: an error about the manager comes from the figure code, a bug."""
    pytest.importorskip("plotly")
    from paged_edu.core.validation import FieldValueError
    from paged_edu.sim import compare

    def refuse(requests, config, cost):
        raise FieldValueError("manager", "a bug in the figure code")

    monkeypatch.setattr(compare, "prepare", refuse)
    with pytest.raises(FieldValueError, match="a bug in the figure code"):
        main(["figures-sim", "--out", str(tmp_path / "figs"), "--num-requests", "5", "--no-progress"])


FIGURES_BAD_FLAGS = [
    # (argv, flag the one-line error must name): every figures-sim flag that takes a value
    (["--out", "/proc/no/such/dir/figs"], "--out"),
    (["--data", "/proc/no/such/dir/data.json"], "--data"),
    (["--num-requests", "0"], "--num-requests"),
    (["--seed", "-1"], "--seed"),
    (["--format", "gif"], "--format"),
    (["--model", "gpt-5"], "--model"),
    (["--gpu", "a100"], "--gpu"),
    (["--kv-slots", "0"], "--kv-slots"),
    (["--kv-slots", "10"], "--kv-slots"),  # not one block of 16: refused by the simulator, blamed by field
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["--preemption", "drop"], "--preemption"),
    (["--preemption", "swap"], "--cpu-blocks"),
    (["--cpu-blocks", "-1"], "--cpu-blocks"),
    (["--policy", "lifo"], "--policy"),
]


@pytest.mark.parametrize("argv, flag", FIGURES_BAD_FLAGS, ids=[" ".join(a) for a, _ in FIGURES_BAD_FLAGS])
def test_figures_sim_every_bad_value_names_its_flag(argv, flag, tmp_path, capsys):
    pytest.importorskip("plotly")
    out = ["--out", str(tmp_path / "figs")] if "--out" not in argv else []
    err = _error(["figures-sim", "--num-requests", "5", "--no-progress", *out, *argv], capsys)
    assert err.startswith("paged-edu figures-sim: error:") and f"argument {flag}:" in err, err


def test_figures_sim_bad_values_cover_every_flag_that_takes_one():
    figures = _subparsers(_build_parser())["figures-sim"]
    takes_a_value = {s for a in figures._actions if a.nargs != 0 for s in a.option_strings}
    assert takes_a_value == {flag for _, flag in FIGURES_BAD_FLAGS}
