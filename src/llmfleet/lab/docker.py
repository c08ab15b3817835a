"""Thin wrapper over the docker CLI: argv lists only (no shell), every call bounded in time."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence

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
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise CheckFailed(f"`docker {' '.join(args[:3])}` failed: {err[-1] if err else proc.returncode}")
    return proc


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
