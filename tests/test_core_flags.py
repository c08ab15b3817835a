"""The `llmfleet` program offers only the core flags it honours; every other Invoke core flag is refused
before anything runs: one line on stderr, exit 2, no traceback, no SSH connection (none opened, no
socket connected), nothing written to the audit log. `--dry` in particular never lets a deploy start.

Table-driven over every task x every refused core flag spelling, before the task name and after it
(where the task does not own the same spelling, e.g. deploy's -D is --diff).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
from invoke import Program

from llmfleet.cli import ns
from llmfleet.cli.flags import REFUSED, REFUSED_SHORT
from llmfleet.cli.main import HONOURED, LlmfleetProgram

REPO = Path(__file__).resolve().parents[1]
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")
CORE = Program().core_args() + Program().task_args()
VALUE = {"command-timeout": "5", "hide": "both", "list-depth": "1", "list-format": "json", "collection": "tasks",
         "search-root": "."}
TASKS = sorted(ns.task_names)
POSITIONAL = {"images.build": "vllm", "images.pin": "vllm=0.19.1", "images.inspect": "vllm:0.19.1",
              "lock.release": "x"}


def spellings() -> list[tuple[str, str]]:
    """(flag as typed, core flag name) for every refused core flag, long and short."""
    out = []
    for arg in CORE:
        if arg.name in HONOURED:
            continue
        for n in arg.names:
            out.append((f"--{n}" if len(n) > 1 else f"-{n}", arg.name))
    return sorted(out)


REFUSED_SPELLINGS = spellings()


def test_every_invoke_core_flag_is_honoured_or_refused():
    names = {a.name for a in CORE}
    assert names == set(HONOURED) | set(REFUSED), "a new Invoke core flag: honour it or refuse it"
    assert {f.lstrip("-") for f, _ in REFUSED_SPELLINGS if len(f) == 2} == set(REFUSED_SHORT)


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Every way out recorded (and refused): llmfleet's SSH connect, paramiko, any socket connect."""
    opened: list[str] = []

    def refuse(what):
        def f(*a, **k):
            opened.append(what)
            raise OSError(f"{what}: no connection in this test")
        return f

    import llmfleet.host.ssh as ssh

    monkeypatch.setattr(ssh, "connect_target", refuse("ssh.connect_target"))
    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse("paramiko.SSHClient.connect"))
    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setenv("HOME", str(tmp_path))  # the audit log and known_hosts would land here
    monkeypatch.chdir(tmp_path)
    yield opened
    assert not (tmp_path / ".local").exists(), "something was written under ~/.local"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    program = LlmfleetProgram(namespace=ns, name="llmfleet", binary="llmfleet")
    code = 0
    try:
        program.run(["llmfleet", *argv], exit=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def typed(flag: str, name: str) -> list[str]:
    return [flag, VALUE[name]] if name in VALUE else [flag]


def task_flags(task: str):
    """The task's flags, short ones included (aliases of the Lexicon: `in` sees them, iteration does not)."""
    return next(c for c in ns.to_contexts() if c.name == task).flags


@pytest.mark.parametrize("task", TASKS)
def test_refused_core_flags_before_and_after_every_task(task, no_network, capsys):
    own = task_flags(task)
    positional = [POSITIONAL[task]] if task in POSITIONAL else []
    for flag, name in REFUSED_SPELLINGS:
        cases = [[*typed(flag, name), task, *positional]]
        if flag not in own:
            cases.append([task, *positional, *typed(flag, name)])
            if positional:
                cases.append([task, *typed(flag, name)])  # where the positional argument belongs
        for argv in cases:
            code, out, err = run(argv, capsys)
            lines = err.strip().splitlines()
            assert code == 2, (argv, code, out, err)
            assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
            assert flag.split("=")[0] in lines[0], (argv, err)
            assert "Traceback" not in err and not out, (argv, out, err)
    assert no_network == []


def test_dry_never_starts_a_deploy(no_network, capsys, tmp_path):
    code, out, err = run(["--dry", "deploy", "--host", "gpu-v100-01", "-i", str(REPO / "inventory/example")], capsys)
    assert code == 2 and "--dry" in err and "deploy --check" in err
    assert no_network == []


@pytest.mark.parametrize(("argv", "says"), [
    (["-f", "4", "deploy"], "-f 4: no such config file"),
    (["-f", "/nonexistent.yaml", "deploy"], "-f /nonexistent.yaml: no such config file"),
    (["-l", "gpu-v100-01", "deploy"], "`llmfleet deploy -l gpu-v100-01`"),
    (["-l", "deploy"], "deploy is a task, not a namespace"),
    (["--bogus", "status"], "no flag --bogus before the task name"),
    (["statu"], "did you mean 'status'"),
    (["deploy", "--hots", "x"], "did you mean '--host'?"),
])
def test_misuse_is_one_line_and_exit_2(argv, says, no_network, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and says in err, (code, err)
    assert "Traceback" not in err and not out


@pytest.mark.parametrize(("name", "text", "says"), [
    ("invoke.yaml", "llmfleet:\n  inventory: [a\n  x: 1\n", "invoke.yaml line 3: not valid YAML"),
    ("invoke.yaml", "llmfleet:\n  inventroy: fleet/\n", "invoke.yaml line 2: unknown setting 'llmfleet.inventroy' "
                                                      "(did you mean 'inventory'?)"),
    ("invoke.yaml", "llmflet:\n  inventory: fleet/\n", "invoke.yaml line 1: unknown setting 'llmflet'"),
    ("invoke.yaml", "llmfleet:\n  ssh:\n    usr: me\n", "line 3: unknown setting 'llmfleet.ssh.usr'"),
    ("broken.yaml", "a: [\n", "broken.yaml line 2: not valid YAML"),
    ("conf.yaml", "llmfleet:\n  inventroy: x\n", "conf.yaml line 2: unknown setting"),
])
def test_a_bad_config_file_is_one_line_naming_it(name, text, says, no_network, capsys, tmp_path):
    (tmp_path / name).write_text(text)
    argv = ["status"] if name == "invoke.yaml" else ["-f", name, "status"]
    code, out, err = run(argv, capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and says in err, (code, err)
    assert not out


def test_a_good_config_file_is_read(no_network, capsys, tmp_path):
    inv = tmp_path / "fleet"
    inv.mkdir()
    (inv / "hosts.yml").write_text("g:\n  hosts:\n    only-host:\n      x: 1\n")
    (tmp_path / "conf.yaml").write_text(f"llmfleet:\n  inventory: {inv}\n  ssh:\n    user: me\nrun:\n  echo: false\n")
    code, out, err = run(["-f", "conf.yaml", "inventory", "--host", "only-host"], capsys)
    assert code == 0, err
    assert '"x": 1' in out


@pytest.mark.parametrize("task", ["images.build", "images.pin", "images.inspect", "lock.release", "deploy"])
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_task_help_flag_is_help(task, flag, no_network, capsys):
    code, out, err = run([task, flag], capsys)
    assert code == 0 and f"{task} [--options]" in out, (code, out, err)


def test_a_closed_pipe_ends_quietly(tmp_path):
    res = subprocess.run(f"'{LLMFLEET}' --list | head -1", shell=True, cwd=tmp_path,  # noqa: S602
                         capture_output=True, text=True, timeout=60)
    assert res.stderr == "", res.stderr
    assert res.stdout.strip() == "Subcommands:"
    # the reader gone before a byte is written: every write meets a closed pipe
    p = subprocess.Popen([LLMFLEET, "--list"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


@pytest.mark.parametrize("args", [["--list"], ["speed", "-h"], ["catalog.release", "--help"]])
def test_a_closed_pipe_ends_quietly_under_invoke_too(args):
    """Stock `invoke` loads the tasks (and llmfleet's handling) after its run began: listing, help and
    a task's output still end quietly when the reader has gone."""
    invoke = str(Path(sys.executable).parent / "invoke")
    p = subprocess.Popen([invoke, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


def test_hints_name_the_command_typed(no_network, capsys):
    _code, _out, err = run(["deploy", "--nope"], capsys)
    assert "`llmfleet --help deploy`" in err
    res = subprocess.run([sys.executable, "-m", "invoke", "--dry", "status"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "--dry" in res.stderr and "`invoke deploy --check --diff`" in res.stderr


def test_the_connection_detector_sees_a_connection(no_network, capsys):
    """The fixture above would notice: a task that does reach a host is recorded."""
    code, _out, _err = run(["status", "-i", str(REPO / "inventory/example"), "--host", "all", "--timeout", "1"],
                           capsys)
    assert code != 0 and no_network, "no connection attempt was recorded"
    no_network.clear()


def test_warnings_and_check_findings_name_the_command_typed(tmp_path):
    """`inventory --check` warnings, like errors, say `llmfleet images.pin` when llmfleet was typed."""
    import shutil

    shutil.copytree(REPO / "inventory/example", tmp_path / "inventory")
    res = subprocess.run([LLMFLEET, "inventory", "--check"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "`llmfleet images.pin`" in res.stderr and "`invoke " not in res.stderr


def test_under_invoke_a_missing_or_broken_config_file_is_one_line(tmp_path):
    """The stock `invoke` program (tasks.py) too: -f that is not there, a malformed -f or invoke.yaml."""
    import shutil

    (tmp_path / "broken.yaml").write_text("a: [\n")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "tasks.py", project / "tasks.py")
    (project / "invoke.yaml").write_text("llmfleet:\n  x: [\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    for argv, cwd, says in (
        (["-f", "/nonexistent.yaml", "status"], REPO, "error: -f /nonexistent.yaml: no such config file"),
        (["-f", str(tmp_path / "broken.yaml"), "status"], REPO, "broken.yaml line 2: not valid YAML"),
        (["--list"], project, "invoke.yaml line 3: not valid YAML"),
    ):
        res = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=cwd, capture_output=True, text=True,
                             timeout=60, env=env)
        assert res.returncode == 2, (argv, res.stderr[-2000:])
        assert res.stderr.strip().splitlines() == [res.stderr.strip()] and says in res.stderr, (argv, res.stderr)
