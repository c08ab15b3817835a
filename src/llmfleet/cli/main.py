"""Console script ``llmfleet``: Invoke's Program over the same collection as tasks.py.

``llmfleet deploy --host X`` and ``invoke deploy --host X`` are the same thing. Like ``invoke``, the
console script reads ``invoke.yaml`` from the current directory as the project configuration.

The program offers only the core flags it honours: ``--help``, ``--version``, ``--list``,
``--complete``, ``--print-completion-script`` and ``-f/--config`` (the file is read and checked
first). Invoke's other core flags (``--dry``, ``--echo``, ``--pty``, ...) change how *local shell
commands* run, and llmfleet runs none: they are refused (one line, exit 2) instead of being accepted
and ignored - ``--dry`` must never let a deploy start.
"""

from __future__ import annotations

import os

from invoke import Program
from invoke.exceptions import Exit
from invoke.parser import ParserContext

from llmfleet import __version__
from llmfleet.cli import ns
from llmfleet.cli.flags import refusal, refused_flag

HONOURED = ("help", "version", "list", "complete", "print-completion-script", "config")


def config_schema() -> dict:
    from llmfleet.cli.config_check import schema

    return schema(ns.configuration().get("llmfleet", {}))


class LlmfleetProgram(Program):
    @property
    def initial_context(self) -> ParserContext:
        """The core flags offered: only those honoured (help, completion and the parser see these)."""
        return ParserContext(args=[a for a in self.core_args() if a.name in HONOURED])

    def parse_core_args(self) -> None:
        super().parse_core_args()
        # Invoke's Program reads every core flag's value (write-pyc, dry, echo, ...): the flags not
        # offered are there with their defaults, never set from the command line.
        ctx = self.core[0]
        for arg in self.core_args():
            if arg.name not in ctx.args:
                ctx.add_arg(arg)

    def create_config(self) -> None:
        # ~/.invoke.yaml and /etc/invoke.yaml may serve other projects: only their llmfleet section is checked
        from llmfleet.cli.config_check import check_file

        known = config_schema()
        for prefix in ("/etc/invoke", "~/.invoke"):
            for suffix in (".yaml", ".yml", ".json"):
                err = check_file(prefix + suffix, known, must_exist=False, top_level=False)
                if err:
                    raise Exit(f"error: {err}", code=2)
        super().create_config()

    def parse_core(self, argv: list[str] | None) -> None:
        super().parse_core(argv)
        prog = self.binary
        first = self.core.unparsed[0] if self.core.unparsed else None
        if first is not None and first.startswith("-"):
            raise Exit(self.before_task_error(first, self.core.unparsed[1:]), code=2)
        path = self.args.config.value
        flag = "-f"
        if path is None and os.environ.get("INVOKE_RUNTIME_CONFIG"):
            path, flag = os.environ["INVOKE_RUNTIME_CONFIG"], "INVOKE_RUNTIME_CONFIG="
        if path is not None:
            from llmfleet.cli.config_check import check_file

            err = check_file(str(path), config_schema(), must_exist=True, flag=flag.rstrip("="))
            if err:
                if str(path).isdigit():
                    err += f" (-f before the task name is a config file; after it, --forks: `{prog} deploy -f {path}`)"
                raise Exit(f"error: {err}", code=2)

    def before_task_error(self, first: str, rest: list[str]) -> str:
        """One line for flag ``first`` given before the task name (``rest``: the words after it)."""
        from llmfleet.cli import habits
        from llmfleet.suggest import did_you_mean

        prog = self.binary
        contexts = {str(c.name): c for c in ns.to_contexts()}
        task = next((w for w in rest if w in contexts), None)
        flags = contexts[task].flags if task else None
        value = rest[0] if "=" not in first and rest and rest[0] != task and not rest[0].startswith("-") else None
        refused = refused_flag(first)
        ansible_e = refused == "echo" and first[:2] == "-e" and (
            len(first) > 2 or (value is not None and ("=" in value or value.startswith(("@", "{")))))
        if refused and not ansible_e and not (flags is not None and first.split("=", 1)[0] in flags):
            return refusal(first, prog, before_task=True, task=task, flags=flags)
        line = habits.before_task_hint(first, prog, task, flags, value, habits.owners(contexts))
        if line is not None:
            return line
        known = [f"--{a.name}" for a in self.core_args() if a.name in HONOURED]
        hint = did_you_mean(first.split("=", 1)[0], known, cutoff=0.7)
        return (f"error: no flag {first} before the task name{hint} (`{prog} --help` shows the flags; "
                f"`{prog} --help TASK` a task's)")

    def parse_collection(self) -> None:
        super().parse_collection()
        # A fixed namespace has no tasks.py location; use the working directory as the project (its
        # invoke.yaml checked first: every key, since this file is llmfleet's).
        from llmfleet.cli.config_check import check_file

        known = config_schema()
        for suffix in (".yaml", ".yml", ".json"):
            err = check_file("invoke" + suffix, known, must_exist=False)
            if err:
                raise Exit(f"error: {err}", code=2)
        self.config.set_project_location(os.getcwd())
        self.config.load_project()

    def parse_cleanup(self) -> None:
        root = self.args.list.value
        if isinstance(root, str) and root not in self.collection.collections:
            from llmfleet.suggest import did_you_mean

            spaces = sorted(self.collection.collections)
            if root in self.collection.task_names:
                raise Exit(f"error: --list {root}: {root} is a task, not a namespace; `{self.binary} --help {root}` "
                           "shows its flags", code=2)
            hint = did_you_mean(root, spaces)
            after = (f"; to pick a host, give -l after the task: `{self.binary} deploy -l {root}`"
                     if not hint else "")
            raise Exit(f"error: --list {root}: no such namespace{hint} (namespaces: {', '.join(spaces)}){after}",
                       code=2)
        super().parse_cleanup()


program = LlmfleetProgram(namespace=ns, version=__version__, name="llmfleet", binary="llmfleet")


def main() -> None:
    program.run()  # a closed pipe ends quietly with 141 (flags.install)
