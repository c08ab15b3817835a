"""Careless commands: ssh (rows for tests/test_careless_commands.py; tests/careless.py says what each asserts)."""

from tests.careless import Cmd

ROWS: list[Cmd] = [
    # a host that accepts TCP and never speaks SSH: one line with the reason, not paramiko's traceback
    Cmd(("status", "--host", "gpu-v100-01"), 1, says="no SSH banner from 127.0.0.1:", connects=True),
    Cmd(("facts", "--host", "gpu-v100-01"), 1, says="is sshd listening there?", connects=True),
    Cmd(("preflight", "--host", "gpu-v100-01"), 1, says="no SSH banner", connects=True, one_line=False),
    # nothing listens: refused, said as such
    Cmd(("facts", "--host", "gpu-4090-01"), 1, says="connection refused: is sshd running there"),
    # a folder that is no inventory: its first executable runs (as Ansible runs it) and its failure ends the load
    Cmd(("inventory", "-i", "/etc", "--list"), 2, says="run as an inventory script, as Ansible does"),
    Cmd(("status", "-i", "/etc"), 2, says="run as an inventory script, as Ansible does"),
    Cmd(("inventory", "-i", "tools", "--list"), 2, says="tools/helper --list: exited 2: usage: helper",
        files={"tools/helper": b"#!/bin/sh\necho 'usage: helper [-x]' >&2\nexit 2\n", "tools/hosts.ini": b"[web]\nw1\n"}),
    # an inventory script that never answers: killed at the time limit (here 2 s), named
    Cmd(("facts", "-i", "slow"), 2, says="slow/cloud.sh --list: no answer within 2 s, killed",
        files={"slow/cloud.sh": b"#!/bin/sh\nsleep 100000\n"}, env={"INVOKE_LLMFLEET_INVENTORY_TIMEOUT": "2"}),
    Cmd(("inventory", "-i", "slow", "--list"), 2, says="slow/cloud.sh --list: no answer within 2 s, killed",
        files={"slow/cloud.sh": b"#!/bin/sh\nsleep 100000\n"}, env={"INVOKE_LLMFLEET_INVENTORY_TIMEOUT": "2"}),
    # ANSIBLE_CONFIG naming a missing file: passed over as Ansible does, with a warning naming it
    Cmd(("inventory", "--host", "gpu-v100-01"), 0, says="ANSIBLE_CONFIG names /nonexistent/ansible.cfg, which does not exist",
        env={"ANSIBLE_CONFIG": "/nonexistent/ansible.cfg"}),
]
