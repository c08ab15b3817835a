"""Console script ``llmfleet``: Invoke's Program over the same collection as tasks.py.

``llmfleet deploy --host X`` and ``invoke deploy --host X`` are the same thing. Like ``invoke``, the
console script reads ``invoke.yaml`` from the current directory as the project configuration.
"""

from __future__ import annotations

import os

from invoke import Program

from llmfleet import __version__
from llmfleet.cli import ns


class LlmfleetProgram(Program):
    def parse_collection(self) -> None:
        super().parse_collection()
        # A fixed namespace has no tasks.py location; use the working directory as the project.
        self.config.set_project_location(os.getcwd())
        self.config.load_project()


program = LlmfleetProgram(namespace=ns, version=__version__, name="llmfleet", binary="llmfleet")


def main() -> None:
    program.run()
