"""The lab reads Docker's answers as JSON and Docker's sizes by their units (no column parsing)."""

from __future__ import annotations

import pytest

from llmfleet.lab.docker import parse_size


# Docker prints sizes with go-units (docker/go-units size.go): BytesSize for `docker stats` memory
# (binary: B, KiB, MiB, GiB, TiB) and HumanSize elsewhere (decimal: B, kB, MB, GB, TB).
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0B", 0),
        ("512B", 512),
        ("12.5MiB", 13_107_200),
        ("1.9GiB", int(1.9 * 1024**3)),
        ("3kB", 3000),
        ("2.5GB", 2_500_000_000),
        (" 47.3MiB ", int(47.3 * 1024**2)),
        ("--", None),
        ("12 parsecs", None),
        ("", None),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected
