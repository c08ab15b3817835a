"""Careless commands: ssh (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts)."""

from tests.careless import Cmd

ROWS: list[Cmd] = [
    # a host that accepts TCP and never speaks SSH: one line with the reason, not paramiko's traceback
    Cmd(("status", "--host", "gpu-v100-01"), 1, says="no SSH banner from 127.0.0.1:", connects=True),
    Cmd(("facts", "--host", "gpu-v100-01"), 1, says="is sshd listening there?", connects=True),
    Cmd(("preflight", "--host", "gpu-v100-01"), 1, says="no SSH banner", connects=True, one_line=False),
    # nothing listens: refused, said as such
    Cmd(("facts", "--host", "gpu-4090-01"), 1, says="connection refused: is sshd running there"),
]
