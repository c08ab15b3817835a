"""Careless commands: the basics (no task, help, a typo, listing) and closed or odd stdin/stdout."""

from tests.careless import Cmd

ROWS = [
    Cmd(("--list",), 0, says="deploy"),
    Cmd(("deploi", "--host", "gpu-v100-01"), 2, says="deploy"),
    Cmd(("inventory", "--list"), 0, says="gpu-v100-01"),
    Cmd(("render", "--host", "gpu-v100-01", "--hots", "x"), 2, says="--host"),
    Cmd(("plan", "--gpu", "v100-sxm2-32gb", "--model", "qwen2.5-7b", "--json"), 0, json=True),
    Cmd(("status", "--host", "gpu-4090-01"), 1, connects=True, one_line=False),

    # stdin closed (`<&-`) where a task would ask: the flag that answers instead, exit 2
    Cmd(("remove", "--host", "gpu-v100-01", "--service", "qwen32b"), 2, says="--yes", stdin="closed"),
    Cmd(("lock.release", "gpu-v100-01"), 1, says="no SSH banner", stdin="closed", connects=True),
    # the reader of stdout went away (`| head -0`): quietly, 141, as --list already did
    Cmd(("plan", "--gpu", "v100-sxm2-32gb", "--model", "qwen2.5-7b"), 141, stdout="closed", silent=True),
    Cmd(("render", "--host", "gpu-v100-01"), 141, stdout="closed", silent=True),
    Cmd(("inventory", "--list"), 141, stdout="closed", silent=True),
    Cmd(("--list",), 141, stdout="closed", silent=True),
    # a binary file where a YAML lock is expected
    Cmd(("images.list", "--lock", "some.bin"), 2, says="some.bin: not a text file", files={"some.bin": b"\x00\xff\xfe"}),
]

# a usage error Invoke finds before the task runs is JSON too when --json was asked for
ROWS += [
    Cmd(("images.pin", "--json"), 2, json=True),
    Cmd(("lock.release", "--json"), 2, json=True),
    Cmd(("deploy", "--host", "gpu-v100-01", "--json", "--bogus"), 2, json=True, says="--bogus"),
]
