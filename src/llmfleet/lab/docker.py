"""Thin wrapper over the docker CLI: argv lists only (no shell), every call bounded in time.

The lab talks to its local Docker engine through the CLI, not the Python SDK: it needs the CLI anyway
(BuildKit builds, ``exec -i`` with stdin, ``cp``, ``push`` with the credential helpers, compose), and
one client means one API-version negotiation. What is read back is JSON (``inspect``, ``--format
'{{json .}}'``), parsed with ``json``, never columns of text (docs/lab.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmfleet.errors import CheckFailed

DOCKER = os.environ.get("LLMFLEET_DOCKER", "docker")


def run(args: Sequence[str], *, timeout: float = 120, check: bool = True, input: bytes | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [DOCKER, *args]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, input=input,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"`docker {' '.join(args[:3])}` took longer than {timeout:.0f}s") from None
    except FileNotFoundError:
        raise CheckFailed("docker CLI not found: run `invoke lab.setup` (installs docker.io) or install Docker") from None
    if check and proc.returncode != 0:
        raise CheckFailed(f"`docker {' '.join(args[:3])}` failed: {error_line(proc.stderr) or proc.returncode}")
    return proc


def error_line(stderr: bytes) -> str:
    """The line of docker's stderr that says what went wrong: the CLI ends with a usage hint
    ("Run 'docker run --help' ...") after the daemon's own "docker: Error response ..." line."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(("Run 'docker", "See 'docker"))]
    return (said or lines or [""])[-1]


def out(args: Sequence[str], **kw) -> str:
    return run(args, **kw).stdout.decode(errors="replace").strip()


def ok(args: Sequence[str], timeout: float = 30) -> bool:
    try:
        return run(args, timeout=timeout, check=False).returncode == 0
    except CheckFailed:
        return False


def image_exists(ref: str) -> bool:
    return ok(["image", "inspect", "--format", "{{.Id}}", ref])


def image_id(ref: str) -> str:
    return out(["image", "inspect", "--format", "{{.Id}}", ref])


def inspect(kind: str, name: str) -> dict | None:
    proc = run([kind, "inspect", name], check=False, timeout=30)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout or b"[]")
    return data[0] if data else None


def inspect_many(kind: str, names: Sequence[str]) -> list[dict]:
    """``docker KIND inspect`` of several objects at once (one call); objects gone meanwhile are skipped."""
    if not names:
        return []
    proc = run([kind, "inspect", *names], check=False, timeout=60)
    try:
        data = json.loads(proc.stdout or b"[]")
    except ValueError:
        data = []
    return [d for d in data if isinstance(d, dict)]


@dataclass(frozen=True)
class Container:
    name: str
    state: str  # running, exited, created, ...
    labels: dict[str, str]
    info: dict  # the whole ``docker container inspect`` document


def containers(label: str) -> list[Container]:
    """Every container (running or not) with this label (``key`` or ``key=value``), from ``inspect``:
    labels come as a JSON object, so a label value may hold any character."""
    ids = out(["ps", "-aq", "--filter", f"label={label}"]).split()
    found = []
    for d in inspect_many("container", ids):
        cfg = d.get("Config") or {}
        found.append(Container(name=str(d.get("Name", "")).lstrip("/"), state=str((d.get("State") or {}).get("Status", "")),
                               labels=dict(cfg.get("Labels") or {}), info=d))
    return sorted(found, key=lambda c: c.name)


_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int | None:
    """``"12.5MiB"`` -> bytes (Docker prints sizes with go-units: B, kB/MB/GB decimal, KiB/MiB/GiB binary);
    None when it is not a size."""
    m = _SIZE.match(text or "")
    if not m:
        return None
    factor = _UNITS.get((m.group(2) or "b").lower())
    return None if factor is None else int(float(m.group(1)) * factor)


def memory_usage(names: Sequence[str]) -> dict[str, int]:
    """Memory in use per running container, in bytes (``docker stats --no-stream``, JSON lines)."""
    if not names:
        return {}
    text = out(["stats", "--no-stream", "--format", "{{json .}}", *names], timeout=60)
    usage: dict[str, int] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        size = parse_size(str(row.get("MemUsage", "")).split("/")[0])
        if size is not None and row.get("Name"):
            usage[str(row["Name"])] = size
    return usage


def stream(args: Sequence[str], on_line: Callable[[str], None], *, timeout: float, env: dict | None = None,
           ) -> int:
    """Run docker with output streamed line by line to ``on_line``; returns the exit code."""
    import selectors
    import time

    proc = subprocess.Popen([DOCKER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                raise CheckFailed(f"`docker {' '.join(args[:2])}` took longer than {timeout:.0f}s")
            if not sel.select(timeout=min(left, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                on_line(line.decode(errors="replace"))
        if buf:
            on_line(buf.decode(errors="replace"))
        return proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        sel.close()
        if proc.poll() is None:
            proc.kill()
