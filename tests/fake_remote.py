"""A scripted remote for the deploy executor's tests, in the style of ``fabric.testing``
(fabric/fabric ``fabric/testing/base.py``: ``Session(commands=[Command(cmd, out, exit)])``).

Each ``Command`` is one expected round trip, in order: the exact script the executor must send
(built with the same pure builders the executor uses) and the answer the host gives. A script that
was not expected, or one sent out of order, fails the test with both texts; ``assert_done`` checks
that every expected command was sent. ``Command(cmd=None)`` accepts any script (for a step whose
text another test pins), and ``raises`` answers with an exception (a dropped connection).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmfleet.host.ssh import Result


@dataclass
class Command:
    cmd: str | None
    out: str = ""
    exit: int = 0
    err: str = ""
    raises: BaseException | None = None
    sent_stdin: bytes | None = field(default=None, init=False)


class FakeRemote:
    def __init__(self, commands: list[Command], name: str = "h1") -> None:
        self.name = name
        self.expected = list(commands)
        self.sent: list[str] = []
        self.round_trips = 0
        self.closed = False
        self.forwarded: list[int] = []
        self.forwarded_to: list[str] = []  # the address on the host each forward reaches

    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None, sudo: bool = False,
            check: bool = False) -> Result:
        self.round_trips += 1
        self.sent.append(command)
        if not self.expected:
            raise AssertionError(f"unexpected command #{len(self.sent)} (none left):\n{command}")
        want = self.expected.pop(0)
        if want.cmd is not None and want.cmd != command:
            raise AssertionError(f"command #{len(self.sent)} differs\n--- expected\n{want.cmd}\n--- sent\n{command}")
        want.sent_stdin = stdin
        if want.raises is not None:
            raise want.raises
        return Result(rc=want.exit, stdout=want.out, stderr=want.err, command=command)

    @contextlib.contextmanager
    def forward(self, port: int, host: str = "127.0.0.1") -> Iterator[int]:
        self.forwarded.append(port)
        self.forwarded_to.append(host)
        yield 1

    def close(self) -> None:
        self.closed = True

    def assert_done(self) -> None:
        left = [c.cmd for c in self.expected]
        assert not left, f"{len(left)} expected command(s) never sent; the first:\n{left[0]}"
