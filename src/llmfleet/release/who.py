"""Who runs a command, as the lock holder and the audit lines name it: ``user@machine`` (no I/O beyond
the process's own user and host name; light to import, for commands that may end after one round trip)."""

from __future__ import annotations

import getpass
import os
import socket


def default_who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (a container without passwd entry)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
