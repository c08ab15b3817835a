"""The scripts that read an engine's log, run by a real sh against a log holding binary bytes (a NUL, an
invalid UTF-8 byte, a colour code: what an engine that prints raw tensor names or a progress bar leaves).
GNU grep treats such input as binary and prints ``grep: (standard input): binary file matches`` instead
of the matching lines; every log grep is ``grep -a``, so the lines come back as text and that message
never reaches a failed deploy's engine-log excerpt, the residency evidence or the RPC join check.

Fake ``journalctl`` and ``docker`` on PATH print the log; grep, sed and the shell are the machine's own.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llmfleet.release import cluster as C
from llmfleet.release import store as S
from llmfleet.release.executor import summarize_log

PATHS = S.Paths("/opt/llmfleet", "chat")
GREP_SAYS = b"binary file matches"
LOG = (
    b"build: 4567 (abc1234) with cc (Debian 12.2.0) for x86_64-linux-gnu\n"
    b"llama_model_loader: tensor \x00\xff\xfe blk.0.attn_q \x1b[0mweight\n"
    b"load_tensors: offloaded 33/33 layers to GPU\n"
    b"llama_init_from_model: using device RPC0 (10.0.0.12:50052) (unknown id) - 23000 MiB free\n"
    b"progress \r\x00\x00\r done\n"
    b"llama_init_from_model: using device RPC1 (10.0.0.13:50052) (unknown id) - 23000 MiB free\n"
    b"RuntimeError: CUDA error: out of memory \xff\n"
    b"main: exiting due to model loading error\n"
)


def run(script: str, tmp_path: Path, *, journal: bytes = b"", docker_log: bytes = b"") -> subprocess.CompletedProcess:
    """``script`` under sh with fake journalctl (prints ``journal``) and docker (``logs``: ``docker_log``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "journal").write_bytes(journal)
    (tmp_path / "docker.log").write_bytes(docker_log)
    fakes = {
        "journalctl": f'#!/bin/sh\ncat {tmp_path}/journal\n',
        "docker": f'#!/bin/sh\ncase "$1" in logs) cat {tmp_path}/docker.log ;; *) exit 1 ;; esac\n',
        "nvidia-smi": "#!/bin/sh\necho '4242, 1000'\n",
    }
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "LC_ALL": "C.UTF-8"}
    return subprocess.run(["sh", "-c", script], capture_output=True, env=env, timeout=30)


def test_grep_would_say_binary_file_matches_without_a():
    """The premise: this machine's grep answers a binary log with its message, not the lines."""
    plain = subprocess.run(["grep", "-E", "using device RPC"], input=LOG, capture_output=True, timeout=10)
    assert GREP_SAYS in plain.stdout + plain.stderr and b"RPC0" not in plain.stdout


@pytest.mark.parametrize("where", ["journal", "docker"])
def test_the_failed_deploys_engine_log_excerpt_keeps_the_text_lines(tmp_path, where):
    res = run(S.logs_script(PATHS, 200), tmp_path, **({"journal": LOG} if where == "journal" else {"docker_log": LOG}))
    assert GREP_SAYS not in res.stdout + res.stderr
    excerpt = summarize_log(res.stdout.decode("utf-8", "replace"))  # as ssh.Result decodes it
    assert "RuntimeError: CUDA error: out of memory" in excerpt
    assert "main: exiting due to model loading error" in excerpt
    assert "binary file" not in excerpt


def test_the_rpc_join_check_reads_the_devices_from_a_binary_log(tmp_path):
    res = run(C.rpc_log_script(PATHS), tmp_path, journal=LOG)
    assert GREP_SAYS not in res.stdout + res.stderr
    devices = C.rpc_devices(res.stdout.decode("utf-8", "replace"))
    assert devices == {"RPC0": "10.0.0.12:50052", "RPC1": "10.0.0.13:50052"}


def test_the_residency_evidence_keeps_the_load_lines_of_a_binary_log(tmp_path):
    from llmfleet.knowledge.engines.loadlog import LLAMACPP_GREP

    res = run(S.evidence_script(PATHS, LLAMACPP_GREP), tmp_path, docker_log=LOG)
    assert GREP_SAYS not in res.stdout + res.stderr
    ev = S.parse_evidence(res.stdout.decode("utf-8", "replace"))
    assert "load_tensors: offloaded 33/33 layers to GPU" in ev.log.splitlines()
    assert ev.log.splitlines()[0].startswith("build: 4567 (abc1234)")


@pytest.mark.parametrize("journal", [LOG, b"\x00\xff binary first line\n"])
def test_logs_follow_takes_a_binary_journal_for_a_journal(tmp_path, journal):
    """``invoke logs -f`` asks whether the unit has a journal (``grep -a -q .``) before following it."""
    script = S.service_logs_script(PATHS, 10, follow=True, seconds=1).replace("exec timeout 1 ", "echo ")
    res = run(script, tmp_path, journal=journal, docker_log=b"from docker\n")
    assert res.stdout.startswith(b"journalctl -u llmfleet-chat.service"), res.stdout
    assert GREP_SAYS not in res.stdout + res.stderr
