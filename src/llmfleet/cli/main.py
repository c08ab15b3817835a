"""Console script ``llmfleet``: Invoke's Program over the same collection as tasks.py."""

from __future__ import annotations

from invoke import Program

from llmfleet import __version__
from llmfleet.cli import ns

program = Program(namespace=ns, version=__version__, name="llmfleet", binary="llmfleet")


def main() -> None:
    program.run()
