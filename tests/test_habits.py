"""Other tools' habits on the command line (cli.habits): each gets llmfleet's way in one line, and a hint
names only flags the task it is given for has, in the words the user typed (`llmfleet` or `invoke`).

Table-driven over every task x every habit spelling and every refused Invoke core flag, after the task
name and before it; every command a hint shows in backticks is parsed back against the collection.
"""

from __future__ import annotations

import re
import shlex

import pytest
from invoke import Program

from llmfleet.cli import habits, ns
from llmfleet.cli.flags import REFUSED, TOKENS, refusal
from llmfleet.cli.main import LlmfleetProgram

CONTEXTS = {c.name: c for c in ns.to_contexts()}
TASKS = sorted(CONTEXTS)
OWNERS = habits.owners(CONTEXTS)
CORE = {"--help", "--version", "--list", "-h", "-V", "-l"}
SPELLINGS = sorted({s for h in habits.HABITS for s in h.spellings})
REFUSED_LONG = sorted(f"--{n}" for n in REFUSED)


def commands(line: str, prog: str) -> list[list[str]]:
    """The commands of ``prog`` a line shows in backticks, split into words."""
    return [shlex.split(c) for c in re.findall(r"`([^`]*)`", line) if c.split()[:1] == [prog]]


def assert_valid(line: str, prog: str = "llmfleet", task: str | None = None) -> None:
    """Every `prog ...` command in the line names a task (or a core flag) and only flags it has; every
    "TASK has no --flag" is true; any other flag the line names (outside backticks, not the one refused) is
    one of ``task``'s."""
    assert line.startswith("error: ") and "\n" not in line, line
    if task is not None:
        prose = re.sub(r"`[^`]*`", "", line)
        prose = re.sub(r"(no flag|Invoke's|Ansible's|has no) -[\w-]+( \(--[\w-]+\))?( or -[\w-]+)?", "", prose)
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", prose):
            assert flag in CONTEXTS[task].flags, f"{task} has no {flag}: {line}"
    for words in commands(line, prog):
        rest = words[1:]
        if rest and rest[0] in CORE:
            assert all(w in CONTEXTS for w in rest[1:]), line
            continue
        assert rest and rest[0] in CONTEXTS, f"no task in {words}: {line}"
        flags = CONTEXTS[rest[0]].flags
        for w in rest[1:]:
            if w.startswith("-") and w not in ("-",):
                assert w.split("=", 1)[0] in flags, f"{rest[0]} has no {w}: {line}"
    for task, flag in re.findall(r"\b([\w.]+) has no (-[\w-]+)", line):
        if task in CONTEXTS:
            assert flag not in CONTEXTS[task].flags, line


@pytest.mark.parametrize("task", TASKS)
def test_every_habit_after_every_task_names_only_that_tasks_flags(task):
    flags = CONTEXTS[task].flags
    for spelling in SPELLINGS:
        if spelling in flags:
            continue  # the task's own flag: parsed, never a habit
        line = habits.flag_hint(spelling, task, flags, "llmfleet", "x")
        assert line is not None, spelling
        assert spelling in line, line
        assert_valid(line, task=task)


@pytest.mark.parametrize("task", TASKS)
def test_every_refused_core_flag_hint_names_only_that_tasks_flags(task):
    flags = CONTEXTS[task].flags
    for flag in REFUSED_LONG:
        for before in (False, True):
            assert_valid(refusal(flag, "llmfleet", before_task=before, task=task, flags=flags), task=task)


def test_before_the_task_name():
    for spelling in SPELLINGS:
        line = habits.before_task_hint(spelling, "llmfleet", None, None, "x", OWNERS)
        assert line is not None and "before the task name" in line, spelling
        assert_valid(line)
        for task in TASKS:
            line = habits.before_task_hint(spelling, "llmfleet", task, CONTEXTS[task].flags, "x", OWNERS)
            if line is not None:
                assert_valid(line, task=task)
    assert habits.before_task_hint("--host", "llmfleet", "deploy", CONTEXTS["deploy"].flags, "gpu-1", OWNERS) \
        == "error: --host goes after the task name: `llmfleet deploy --host gpu-1`"


@pytest.mark.parametrize(
    ("token", "task", "value", "says"),
    [
        ("-e", "deploy", "foo=bar", "llmfleet has no extra vars: set a variable in the inventory"),
        ("-e", "upgrade", "context=8192", "did you mean `llmfleet upgrade --set context=8192`?"),
        ("-T", "deploy", "5", "deploy has no --timeout; set llmfleet.ssh.connect_timeout"),
        ("--timeout", "render", "5", "render has no --timeout"),
        ("--dry-run", "deploy", None, "did you mean `llmfleet deploy --check`?"),
        ("--dry-run", "stop", None, "stop has no --check"),
        ("--tail", "logs", "20", "did you mean `llmfleet logs -n 20`?"),
        ("--tail=20", "logs", None, "did you mean `llmfleet logs -n 20`?"),
        ("-K", "deploy", None, "never asks for a sudo password"),
        ("-u", "deploy", "root", "set ansible_user"),
        ("--tags", "deploy", "chat", "did you mean `llmfleet deploy --service chat`?"),
        ("--tags", "status", "chat", "llmfleet has no tags"),
        ("-y", "remove", None, "did you mean `llmfleet remove --yes`?"),
        ("-vvv", "render", None, "render has no -v"),
        ("-D", "render", None, "render has no --diff"),
        ("--limit", "images.list", "x", "images.list has no --host or --group"),
        ("--ask-vault-pass", "inventory", None, "did you mean `llmfleet inventory --vault-password-file`?"),
        ("--ask-vault-pass", "deploy", None, "set ANSIBLE_VAULT_PASSWORD_FILE"),
    ],
)
def test_a_habit_gets_llmfleets_way(token, task, value, says):
    line = habits.flag_hint(token, task, CONTEXTS[task].flags, "llmfleet", value)
    assert line is not None and says in line, line


def test_a_flag_that_is_no_habit_is_left_to_the_parser():
    assert habits.flag_hint("--bogus", "deploy", CONTEXTS["deploy"].flags, "llmfleet") is None


@pytest.mark.parametrize(
    ("task", "rest", "says"),
    [
        ("deploy", ["gpu-v100-01"], "`llmfleet deploy --host gpu-v100-01`?"),
        ("rollback", ["gpu-v100-01", "chat"], "`llmfleet rollback --host gpu-v100-01 --service chat`?"),
        ("status", ["gpu-v100-01"], "`llmfleet status --host gpu-v100-01`?"),
        ("rollback", ["--host", "h1", "20261201T120000Z-0123456789"],
         "`llmfleet rollback --host h1 --to 20261201T120000Z-0123456789`?"),
        ("rollback", ["-l", "h1", "chat"], "`llmfleet rollback -l h1 --service chat`?"),
        ("logs", ["gpu-1", "chat", "-n", "5"], "`llmfleet logs --host gpu-1 --service chat -n 5`?"),
        ("deploy", ["help"], "`llmfleet --help deploy`"),
        ("deploy", ["version"], "`llmfleet --version`"),
    ],
)
def test_a_bare_word_gets_the_flag_it_belongs_to(task, rest, says):
    ctx = CONTEXTS[task]
    takes = {f"--{a.name}" for a in ctx.args.values() if a.takes_value} | {"-l", "-n", "-i", "-f"}
    word = next(w for w in rest if not w.startswith("-") and not (rest.index(w) and rest[rest.index(w) - 1]
                                                                  in takes))
    hint = habits.word_hint(word, task, ctx.flags, "llmfleet", rest, takes)
    assert says in hint, hint
    assert_valid(f"error: x{hint}")


def test_a_bare_word_with_no_flag_to_go_to_gets_no_guess():
    ctx = CONTEXTS["images.list"]
    assert habits.word_hint("gpu-1", "images.list", ctx.flags, "llmfleet", ["gpu-1"]) == ""
    ctx = CONTEXTS["status"]  # a second bare word: status has no --service
    assert habits.word_hint("h1", "status", ctx.flags, "llmfleet", ["h1", "chat"]) == ""


@pytest.mark.parametrize(
    ("word", "following", "says"),
    [("help", [], "`llmfleet --help`"), ("help", ["deploy"], "`llmfleet --help deploy`"),
     ("version", [], "`llmfleet --version`"), ("list", [], "`llmfleet --list`"), ("gpu-1", [], "")],
)
def test_a_first_word_that_is_no_task(word, following, says):
    hint = habits.first_word_hint(word, "llmfleet", following, TASKS)
    assert (says in hint) if says else hint == ""


def run(program: Program, argv: list[str], capsys) -> tuple[int, str]:
    try:
        program.run([program.binary or "invoke", *argv], exit=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["deploy", "--host", "h1", "-e", "foo=bar"], "`{prog} upgrade --set FIELD=VALUE`"),
        (["deploy", "--host", "h1", "-e"], "--echo"),
        (["deploy", "h1"], "`{prog} deploy --host h1`"),
        (["--dry-run", "deploy"], "`{prog} deploy --check`"),
        (["logs", "--tail", "5"], "`{prog} logs -n 5`"),
        (["help"], "`{prog} --help`"),
    ],
)
@pytest.mark.parametrize("prog", ["llmfleet", "invoke"])
def test_hints_name_the_command_as_typed(argv, says, prog, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    program = (LlmfleetProgram(namespace=ns, name="llmfleet", binary="llmfleet") if prog == "llmfleet"
               else Program(namespace=ns, name="invoke", binary="invoke"))
    code, err = run(program, argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert says.format(prog=prog) in lines[0], err
    other = "invoke" if prog == "llmfleet" else "llmfleet"
    assert f"`{other} " not in lines[0], err


@pytest.mark.parametrize(
    ("text", "value"),
    [("8192", 8192), ("8k", 8192), ("256k", 262144), ("256K", 262144), ("1M", 1048576), ("1m", 1048576),
     ("1.5k", 1536), ("0.5M", 524288), ("1_000", 1000)],
)
def test_token_counts_take_k_and_m(text, value):
    assert TOKENS.parse("--context", text) == value


@pytest.mark.parametrize("text", ["1MB", "M", "k", "1.2345k", "1e3k", "infk", "nank", "1G", "1Mi"])
def test_token_counts_refuse_anything_else(text):
    from invoke.exceptions import ParseError

    with pytest.raises(ParseError, match=r"is not a whole number, 1 or more \(e\.g\. 8192, 8k or 1M\)"):
        TOKENS.parse("--context", text)
