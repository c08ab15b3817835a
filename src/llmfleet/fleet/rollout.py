"""Fleet rollouts with Ansible's semantics: ``serial`` batches and ``max_fail_percentage``.

Pure. ``serial`` is a list of batch sizes (ints or percentages of the whole selection); the last one
repeats until every host is placed, so ``1,25%,100%`` is a canary host, then quarter-fleet batches,
then the rest. A batch aborts the rollout when its failed share is strictly greater than
``max_fail_percentage``; without one, only a batch in which every host failed aborts (Ansible's
defaults, from ansible-core's PlaybookExecutor and linear strategy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from llmfleet.errors import UsageError

T = TypeVar("T")


def parse_serial(text: str | None) -> list[int | str]:
    """``"1,25%,100%"`` → ``[1, "25%", "100%"]``. Empty → one batch of everything."""
    if text is None or not str(text).strip():
        return []
    out: list[int | str] = []
    for raw in str(text).split(","):
        item = raw.strip()
        if item.endswith("%"):
            num = item[:-1]
            if not num.isdigit() or not 0 < int(num) <= 100:
                raise UsageError(f"--serial: {item!r} is not a percentage between 1% and 100%")
            out.append(item)
        elif item.isdigit() and int(item) > 0:
            out.append(int(item))
        else:
            raise UsageError(f"--serial: {item!r} is not a positive number or a percentage (e.g. 1,25%,100%)")
    return out


def _size(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return int(int(value[:-1]) / 100.0 * total) or 1
    return int(value)


def batches(hosts: Sequence[T], serial: Sequence[int | str]) -> list[list[T]]:
    """Split hosts into batches as Ansible's ``serial`` does."""
    remaining = list(hosts)
    total = len(remaining)
    plan = list(serial) or [-1]
    out: list[list[T]] = []
    i = 0
    while remaining:
        size = _size(plan[min(i, len(plan) - 1)], total)
        if size <= 0:
            out.append(remaining)
            break
        out.append(remaining[:size])
        remaining = remaining[size:]
        i += 1
    return out


def batch_aborts(failed: int, batch_size: int, max_fail_percentage: float | None) -> bool:
    """Whether a finished batch stops the rollout."""
    if batch_size <= 0:
        return False
    if max_fail_percentage is None:
        return failed >= batch_size
    return failed / batch_size > max_fail_percentage / 100.0
