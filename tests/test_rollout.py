"""Rollout batching and abort thresholds, matching Ansible's serial / max_fail_percentage."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.fleet.rollout import batch_aborts, batches, parse_serial

HOSTS = [f"h{i:02d}" for i in range(1, 13)]


@pytest.mark.parametrize(
    ("serial", "sizes"),
    [
        ("", [12]),
        ("1", [1] * 12),
        ("5", [5, 5, 2]),
        ("1,25%,100%", [1, 3, 8]),
        ("1,25%", [1, 3, 3, 3, 2]),
        ("10%", [1] * 12),            # int(1.2) = 1
        ("50%", [6, 6]),
        ("1,2,100", [1, 2, 9]),
        ("100%", [12]),
        ("30", [12]),
    ],
)
def test_batches_follow_ansible_serial(serial, sizes):
    got = batches(HOSTS, parse_serial(serial))
    assert [len(b) for b in got] == sizes
    assert [h for b in got for h in b] == HOSTS  # order kept, nothing lost or repeated


def test_percentages_are_of_the_whole_selection_not_the_remainder():
    # 25% of 12 is 3 for every batch, even when fewer hosts remain
    assert [len(b) for b in batches(HOSTS[:8], parse_serial("2,25%"))] == [2, 2, 2, 2]


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "0%", "150%", "1,,2", "2.5"])
def test_bad_serial_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="--serial"):
        parse_serial(bad)


@pytest.mark.parametrize(
    ("failed", "size", "max_pct", "aborts"),
    [
        (0, 4, 0, False),
        (1, 4, 0, True),        # 0%: any failure aborts
        (1, 4, 25, False),      # 25% is not strictly greater than 25%
        (2, 4, 25, True),
        (1, 3, 34, False),
        (1, 1, 99, True),       # a failed canary aborts unless 100% is allowed
        (1, 1, 100, False),
        (3, 4, None, False),    # default: only a batch where every host failed aborts
        (4, 4, None, True),
    ],
)
def test_batch_aborts(failed, size, max_pct, aborts):
    assert batch_aborts(failed, size, max_pct) is aborts
