"""Packaged monitoring files: the Prometheus alert rules (``rules.yml``) and the Grafana dashboard
(``llmfleet-dashboard.json``); docs/monitoring.md says where each goes."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def packaged(name: str) -> Path:
    """The path of a packaged monitoring file."""
    return HERE / name
