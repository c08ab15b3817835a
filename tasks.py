"""Invoke entry point: ``invoke --list``. The tasks live in the llmfleet package (src/llmfleet/cli)."""

from llmfleet.cli import ns  # noqa: F401  (Invoke looks for ``ns``)
