"""Every `invoke ...` command in docs/runbooks/*.md names a task that exists and flags it takes.

Commands are read from fenced code blocks (lines starting with ``invoke ``) and from inline code
spans. The lab tests (tests/lab/test_upgrade.py, test_status.py) run the runbooks' commands against
lab hosts; this test keeps the documents true to the task surface.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest

from llmfleet.cli import ns

RUNBOOKS = Path(__file__).resolve().parents[1] / "docs" / "runbooks"
REQUIRED = {"fleet-upgrade.md", "rollback.md", "rotate-api-key.md", "driver-upgrade.md", "troubleshooting.md"}
_INLINE = re.compile(r"`(invoke [^`]+)`")


def commands(text: str, *, fenced_only: bool = False) -> list[str]:
    """``invoke ...`` commands: whole lines in fenced blocks, and (unless ``fenced_only``) inline code
    spans, which may be partial (``invoke plan -q gptq-int4`` in a sentence)."""
    out: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            if line.strip().startswith("invoke "):
                out.append(line.strip())
        elif not fenced_only:
            out.extend(m.group(1) for m in _INLINE.finditer(line))
    return out


def all_commands() -> list[tuple[str, str]]:
    return [(p.name, cmd) for p in sorted(RUNBOOKS.glob("*.md")) for cmd in commands(p.read_text())]


def task_arguments(name: str) -> list:
    """The task's parser arguments. (Invoke's get_arguments pops the task's help entries: work on a
    copy, or later readers of the collection lose the help texts.)"""
    task = copy.copy(ns[name])
    task.help = dict(ns[name].help or {})
    return task.get_arguments()


def task_flags(name: str) -> tuple[set[str], set[str]]:
    """(flags, flags that take a value) of a task, as its parser spells them."""
    flags: set[str] = set()
    valued: set[str] = set()
    for arg in task_arguments(name):
        for n in arg.names:
            n = n.strip("_").replace("_", "-")
            flag = f"--{n}" if len(n) > 1 else f"-{n}"
            flags.add(flag)
            if arg.takes_value:
                valued.add(flag)
            elif len(n) > 1:
                flags.add(f"--no-{n}")
    return flags, valued


def check_command(cmd: str) -> list[str]:
    """Problems with one command line (empty when it is valid)."""
    argv = shlex.split(cmd, comments=True)
    assert argv[0] == "invoke"
    if len(argv) < 2 or argv[1].startswith("-"):
        return [f"{cmd!r}: no task name"]
    name = argv[1]
    if name not in ns.task_names:
        return [f"{cmd!r}: no task {name!r} (tasks: {', '.join(sorted(ns.task_names))})"]
    flags, valued = task_flags(name)
    problems: list[str] = []
    i = 2
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-"):
            flag = tok.split("=", 1)[0]
            if flag not in flags:
                problems.append(f"{cmd!r}: task {name} has no flag {flag} (it has {', '.join(sorted(flags))})")
            elif flag in valued and "=" not in tok:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    problems.append(f"{cmd!r}: {flag} needs a value")
                i += 1
        else:
            positional = [a for a in task_arguments(name) if a.positional]
            if not positional:
                problems.append(f"{cmd!r}: unexpected argument {tok!r} (task {name} takes only flags)")
        i += 1
    return problems


def test_every_required_runbook_exists_and_has_commands():
    present = {p.name for p in RUNBOOKS.glob("*.md")}
    assert REQUIRED <= present, f"missing runbooks: {REQUIRED - present}"
    for name in REQUIRED:
        assert commands((RUNBOOKS / name).read_text()), f"{name} has no invoke command"


@pytest.mark.parametrize(("doc", "cmd"), all_commands(), ids=[f"{d}:{c}" for d, c in all_commands()])
def test_runbook_command_exists(doc, cmd):
    problems = check_command(cmd)
    assert not problems, f"{doc}: " + "; ".join(problems)


@pytest.mark.parametrize(
    ("cmd", "ok"),
    [
        ("invoke status --group lab_fleet", True),
        ("invoke upgrade --group g --serial 1,25%,100% --max-fail-percentage 20 --check", True),
        ("invoke upgrade --group g --set context=1 --set concurrency=2", True),
        ("invoke audit -n 5", True),
        ("invoke statuz --group g", False),
        ("invoke status --grop g", False),
        ("invoke upgrade --group", False),
        ("invoke releases gpu-1", False),
    ],
)
def test_the_checker_itself(cmd, ok):
    assert (not check_command(cmd)) is ok


def test_troubleshooting_covers_the_field_reports_symptoms():
    text = (RUNBOOKS / "troubleshooting.md").read_text()
    for heading in ("## CUDA out of memory at start", "## Decode suddenly at 1-4 tok/s",
                    '## "no kernel image is available for execution on the device"', "## AWQ on Volta",
                    "## bf16 on Volta", "## A stuck lock"):
        assert heading in text
    sections = text.split("\n## ")[1:]
    for sec in sections:
        title = sec.splitlines()[0]
        assert "**Diagnose**" in sec, f"{title}: no Diagnose step"
        assert commands(sec), f"{title}: names no llmfleet command"


def test_the_driver_upgrade_pre_check_refuses_a_branch_that_drops_the_card():
    """The runbook's own pre-check command (an assumed R590+ driver on a V100) is a FAIL: R580 is the
    last branch for Maxwell, Pascal and Volta."""
    from llmfleet.knowledge import compat
    from llmfleet.knowledge.preflight import apply_assumptions, parse_assumptions
    from tests.test_preflight import facts_for, run, svc

    text = (RUNBOOKS / "driver-upgrade.md").read_text()
    pre = [c for c in commands(text, fenced_only=True) if "--assume driver=59" in c]
    assert pre, "driver-upgrade.md shows no pre-check with an R590+ driver"
    assume = shlex.split(pre[0])[shlex.split(pre[0]).index("--assume") + 1]
    cat = compat.load_engine_catalog()
    facts, _ = apply_assumptions(facts_for("v100-535"), parse_assumptions([assume]), cat)
    checks = {c.id: c for c in run("v100-535", svc(), facts=facts).checks}
    assert checks["cuda-driver"].status == "fail", checks["cuda-driver"]
    assert "R580 is the last branch" in checks["cuda-driver"].message
    # the same driver on a Turing card is judged on CUDA alone
    t4, _ = apply_assumptions(facts_for("t4-470"), parse_assumptions([assume]), cat)
    assert "last branch" not in {c.id: c for c in run("t4-470", svc(), facts=t4).checks}["cuda-driver"].message
