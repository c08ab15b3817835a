"""Careless commands: the basics (no task, help, a typo, listing)."""

from tests.careless import Cmd

ROWS = [
    Cmd(("--list",), 0, says="deploy"),
    Cmd(("deploi", "--host", "gpu-v100-01"), 2, says="deploy"),
    Cmd(("inventory", "--list"), 0, says="gpu-v100-01"),
    Cmd(("render", "--host", "gpu-v100-01", "--hots", "x"), 2, says="--host"),
    Cmd(("plan", "--gpu", "v100-sxm2-32gb", "--model", "qwen2.5-7b", "--json"), 0, json=True),
    Cmd(("status", "--host", "gpu-4090-01"), 1, connects=True, one_line=False),
]
