"""Flags people can trust: short flags chosen (Ansible's letters), no short flag for a safety override, -h is
help, and every usage error (bad number, unknown flag, missing value) is one line and exit 2, no traceback.

The numeric options are discovered from the Invoke collection (every argument with a ``Number``), and every
option of every task is checked to have one if it takes a number, so a new flag cannot slip past.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Program

from llmfleet.cli import ns
from llmfleet.cli.flags import SAFETY_OVERRIDES, SHORT, NumberArgument

REPO = Path(__file__).resolve().parents[1]
ANSIBLE_LETTERS = {"inventory": "i", "host": "l", "forks": "f", "check": "C", "diff": "D", "verbose": "v"}


def arguments(name: str) -> list:
    task = copy.copy(ns[name])
    task.help = dict(ns[name].help or {})  # get_arguments pops the help entries
    return task.get_arguments()


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in this process (the same Program class `invoke` and `llmfleet` use)."""
    program = Program(namespace=ns, name="llmfleet", binary="llmfleet")
    code = 0
    try:
        program.run(["llmfleet", *argv], exit=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


NUMERIC = [(name, arg) for name in sorted(ns.task_names) for arg in arguments(name) if isinstance(arg, NumberArgument)]
CASES = [(name, arg, bad) for name, arg in NUMERIC for bad in arg.number.bad_values()]


def flag_of(arg) -> str:
    longs = [n for n in arg.names if len(n) > 1]
    return "--" + longs[0].replace("_", "-") if longs else "-" + arg.names[0]


def test_numeric_options_were_found():
    found = {(name, arg.name) for name, arg in NUMERIC}
    for expected in [("status", "forks"), ("status", "timeout"), ("audit", "n"), ("upgrade", "pause"),
                     ("upgrade", "max_fail_percentage"), ("plan", "gpus"), ("plan", "context"), ("deploy", "forks"),
                     ("logs", "n")]:
        assert expected in found


@pytest.mark.parametrize("name", sorted(ns.task_names))
def test_every_numeric_option_checks_its_value(name):
    for arg in arguments(name):
        if not isinstance(arg, NumberArgument):
            assert arg.kind not in (int, float), f"{name} --{arg.name}: a number without a Number check"


@pytest.mark.parametrize(("task", "arg", "bad"), CASES,
                         ids=[f"{t}-{a.name}-{b!r}" for t, a, b in CASES])
def test_a_bad_number_is_one_line_and_exit_2(task, arg, bad, capsys):
    code, out, err = run([task, f"{flag_of(arg)}={bad}"], capsys)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag_of(arg).lstrip("-") in lines[0], err
    assert "Traceback" not in err and not out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["status", "--forks", "abc"], "--forks: 'abc' is not a whole number"),
        (["status", "--timeout", "-1"], "--timeout: '-1' is out of range"),
        (["releases", "--timeout", "abc"], "--timeout: 'abc' is not a number"),
        (["audit", "--timeout", "abc"], "--timeout: 'abc' is not a number"),
        (["upgrade", "--forks", "abc"], "--forks: 'abc' is not a whole number"),
        (["plan", "--gpus", "0"], "--gpus: '0' is out of range"),
        (["plan", "--context", "32q"], "--context: '32q' is not a whole number"),
        (["status", "--bogus"], "status: no flag --bogus"),
        (["status", "--forks"], "status: --forks needs a value"),
        (["statuz"], "no task 'statuz'"),
        (["releases", "gpu-1"], "'gpu-1' is neither a task nor a flag of releases"),
        (["deploy", "-a"], "deploy: no flag -a"),  # no generated short flag for --accept-new-host-keys
        (["deploy", "-l"], "deploy: --host needs a value"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv, says, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2, (code, out, err)
    assert err.strip().splitlines() == [err.strip()] and says in err, err
    assert "Traceback" not in err


def test_values_that_are_fine_are_taken(capsys):
    # a k suffix for token counts, decimals for seconds: parsed, then the body runs (and wants a model)
    code, _out, err = run(["plan", "--context", "8k", "--gpus", "2", "--gpu", "a10"], capsys)
    assert code == 2 and "give --model" in err


def test_short_flags_are_chosen_not_generated():
    allowed = set(SHORT.values()) | {"n"}
    for name in ns.task_names:
        params = {a.attr_name or a.name: a for a in arguments(name)}
        for pname, arg in params.items():
            shorts = [n for n in arg.names if len(n) == 1]
            if pname in SAFETY_OVERRIDES:
                assert not shorts, f"{name} --{pname}: a safety override has no short flag"
            for s in shorts:
                assert s in allowed or (pname == "host" and s == "l"), f"{name} --{pname}: -{s} was not chosen"
                assert s != "h", f"{name}: -h is help"
            if pname in ANSIBLE_LETTERS and not (pname == "host" and "limit" in params):
                assert ANSIBLE_LETTERS[pname] in arg.names, f"{name} --{pname}: Ansible's -{ANSIBLE_LETTERS[pname]}"
        if "host" in params and "limit" not in params:
            assert "limit" in params["host"].names, f"{name}: --limit is --host"


@pytest.mark.parametrize("task", ["deploy", "status", "logs", "plan"])
def test_dash_h_is_help(task, capsys):
    code, out, _err = run([task, "-h"], capsys)
    assert code == 0 and f"{task} [--options]" in out


def test_invoke_itself_exits_2_with_one_line():
    """The stock `invoke` program (tasks.py) follows the same contract."""
    res = subprocess.run([sys.executable, "-m", "invoke", "status", "--forks", "abc"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: --forks: 'abc' is not a whole number, 1 or more"]
    res = subprocess.run([sys.executable, "-m", "invoke", "deploy", "--nope"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: deploy: no flag --nope (`invoke --help deploy` lists the flags)"]


def test_a_tables_text_cells_and_title_name_the_command_as_typed(monkeypatch):
    from rich.table import Table

    from llmfleet.cli import common, flags

    monkeypatch.setattr(flags, "PROG", "llmfleet")
    t = Table(title="from `invoke plan`")
    t.add_column("check")
    t.add_column("fix")
    t.add_row("image", "pin it: `invoke images.pin vllm=0.19.1`")
    from rich.text import Text

    styled = Text("`invoke x` styled")
    t.add_row("disk", styled)  # not plain text: left as it is
    common._hint_cells(t)
    assert t.columns[1]._cells == ["pin it: `llmfleet images.pin vllm=0.19.1`", styled]
    assert t.title == "from `llmfleet plan`"
    monkeypatch.setattr(flags, "PROG", "invoke")
    t2 = Table()
    t2.add_column("fix")
    t2.add_row("`invoke images.pin`")
    assert common._hint_cells(t2).columns[0]._cells == ["`invoke images.pin`"]
