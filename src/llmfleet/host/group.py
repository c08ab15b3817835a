"""One way to run a function over many hosts: a bounded pool of threads, results in the hosts' order,
one result object per host (in the manner of Fabric's ``GroupResult``).

A host whose function raises, or that has not answered within ``timeout`` seconds, gets a result with
``error`` set instead of a value, and never hides the other hosts' results. With one worker (or one
host) the function runs in the caller's thread, so Ctrl-C reaches it (a deploy then goes back to its
previous release). Without a timeout the pool waits for every started host before returning or
raising, so no host is left half-way when the caller moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
H = TypeVar("H")


@dataclass(frozen=True)
class HostResult(Generic[H, T]):
    host: H
    value: T | None = None
    error: str | None = None
    exception: Exception | None = None  # what the function raised, for a caller that raises it again

    @property
    def ok(self) -> bool:
        return self.error is None


class GroupResult(list[HostResult[H, T]]):
    """Per-host results, in the order the hosts were given."""

    @property
    def failed(self) -> list[HostResult[H, T]]:
        return [r for r in self if not r.ok]

    @property
    def succeeded(self) -> list[HostResult[H, T]]:
        return [r for r in self if r.ok]

    def values(self) -> Iterator[T | None]:
        return (r.value for r in self)


def _one(fn: Callable[[H], T], host: H) -> HostResult[H, T]:
    try:
        return HostResult(host, fn(host))
    except Exception as exc:  # noqa: BLE001 - one host's failure must not hide the others
        return HostResult(host, error=f"{type(exc).__name__}: {exc}", exception=exc)


def run_on_hosts(fn: Callable[[H], T], hosts: Sequence[H], *, forks: int, timeout: float | None = None,
                 thread_name: str = "llmfleet") -> GroupResult[H, T]:
    """``fn`` over ``hosts``, at most ``forks`` at a time. See the module docstring."""
    items = list(hosts)
    if not items:
        return GroupResult()
    workers = max(1, min(int(forks), len(items)))
    if workers == 1 and timeout is None:
        return GroupResult(_one(fn, h) for h in items)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name)
    futures = [pool.submit(_one, fn, h) for h in items]
    try:
        done, _ = wait(futures, timeout=timeout)
    finally:
        # with a time limit, late hosts are left to end on their own limits; without one, wait for them
        pool.shutdown(wait=timeout is None, cancel_futures=True)
    out: GroupResult[Any, T] = GroupResult()
    for h, fut in zip(items, futures, strict=True):
        if fut in done:
            out.append(fut.result())
        elif fut.cancelled():
            out.append(HostResult(h, error="not started"))
        else:
            out.append(HostResult(h, error=f"no answer within {timeout:.0f}s"))
    return out
