"""A live progress line for fleet runs: per batch, how many hosts are done, running, failed, waiting.

On a terminal the line is rewritten in place (at most a few times a second); in a log (not a terminal)
a line is written when the batch starts, at most every ``every_s`` seconds while it runs, and when it
ends, so 1,000 hosts make a handful of lines instead of thousands. Thread-safe: hosts report from
their worker threads. ``Tally`` is pure (counts and the text); ``LiveLine`` does the writing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Tally:
    """Counts of one batch."""

    batch: int
    batches: int
    hosts: int
    started: float
    running: int = 0
    done: int = 0
    failed: int = 0
    results: dict[str, int] = field(default_factory=dict)

    @property
    def waiting(self) -> int:
        return max(0, self.hosts - self.done - self.running)

    def text(self, now: float) -> str:
        by = ", ".join(f"{n} {r}" for r, n in sorted(self.results.items()))
        return (f"batch {self.batch}/{self.batches}: {self.done}/{self.hosts} done"
                f"{f' ({by})' if by else ''}, {self.failed} failed, {self.running} running, "
                f"{self.waiting} waiting [{now - self.started:.0f}s]")


class LiveLine:
    """Writes a Tally's text: in place on a terminal, throttled lines elsewhere."""

    def __init__(self, write: Callable[[str], object], *, terminal: bool, every_s: float = 10.0,
                 min_interval_s: float = 0.2, clock: Callable[[], float] = time.monotonic) -> None:
        self.write = write
        self.terminal = terminal
        self.every_s = every_s
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._tally: Tally | None = None
        self._shown = float("-inf")

    def begin(self, batch: int, batches: int, hosts: int) -> None:
        with self._lock:
            self._tally = Tally(batch=batch, batches=batches, hosts=hosts, started=self.clock())
            self._show(force=True)

    def host_started(self) -> None:
        with self._lock:
            if self._tally is not None:
                self._tally.running += 1
                self._show()

    def host_done(self, result: str, failed: bool) -> None:
        with self._lock:
            t = self._tally
            if t is None:
                return
            t.running = max(0, t.running - 1)
            t.done += 1
            t.failed += int(failed)
            t.results[result] = t.results.get(result, 0) + 1
            self._show()

    def end(self) -> None:
        with self._lock:
            if self._tally is not None:
                self._show(force=True, final=True)
            self._tally = None

    def _show(self, *, force: bool = False, final: bool = False) -> None:
        now = self.clock()
        gap = self.min_interval_s if self.terminal else self.every_s
        if not force and now - self._shown < gap:
            return
        self._shown = now
        assert self._tally is not None
        text = self._tally.text(now)
        if self.terminal:
            self.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self.write(text + "\n")
