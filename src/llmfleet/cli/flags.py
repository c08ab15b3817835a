"""The task surface's flags: chosen short flags, numbers checked while parsing, usage errors as exit 2.

Every task is declared with ``fleet_task`` (Invoke's ``@task`` with ``FleetTask``):

- short flags are chosen, never generated (Invoke would give every flag the first free letter):
  Ansible's letters where Ansible has them (``SHORT``), ``-h`` stays help, and a safety override
  (``--allow-unpinned``, ``--accept-new-host-keys``, ``--yes``) has no short flag;
- ``--host`` is also ``--limit`` / ``-l`` (an Ansible ``--limit`` pattern), except in a task with
  its own ``limit`` flag;
- every numeric flag declares what it accepts (``Number``); a bad value is refused while the command
  line is parsed, before the task body runs: one line, exit 2, nothing contacted;
- ``-v`` (``verbose``) prints each remote command, secrets masked, with its duration.

Invoke's own Program exits 1 on a parse error (unknown flag, missing value); ``install()`` makes
both ``invoke`` (tasks.py) and the ``llmfleet`` console script exit 2 with one line instead.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from invoke import Program, Task
from invoke import task as invoke_task
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument, ParserContext

# Parameter name -> its short flag. Ansible's letters: -i inventory, -l limit, -f forks, -C check,
# -D diff, -v verbose, -T timeout; -n a number of lines/records, as tail and journalctl.
SHORT: dict[str, str] = {
    "inventory": "i",
    "forks": "f",
    "check": "C",
    "diff": "D",
    "verbose": "v",
    "timeout": "T",
    "follow": "f",  # as tail -f and journalctl -f (no task has both --forks and --follow)
}
# Never a short flag: each changes what llmfleet is willing to do.
SAFETY_OVERRIDES = frozenset({"allow_unpinned", "accept_new_host_keys", "yes"})


@dataclass(frozen=True)
class Number:
    """What a numeric flag accepts; ``parse`` turns the text into the value or refuses it."""

    kind: type  # int or float
    low: float | None = None
    low_open: bool = False  # True: the value must be more than ``low``
    high: float | None = None
    k_suffix: bool = False  # 32k = 32768 (token counts)
    metavar: str = "N"

    def describe(self) -> str:
        what = "a whole number" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            rng = f"{'more than ' if self.low_open else ''}{_fmt(self.low)} to {_fmt(self.high)}"
        elif self.low is not None:
            rng = f"more than {_fmt(self.low)}" if self.low_open else f"{_fmt(self.low)} or more"
        else:
            rng = ""
        return f"{what}{', ' + rng if rng else ''}" + (" (e.g. 8192 or 8k)" if self.k_suffix else "")

    def parse(self, flag: str, raw: Any) -> int | float:
        text = str(raw).strip().replace("_", "")
        scale = 1
        if self.k_suffix and text.lower().endswith("k"):
            text, scale = text[:-1], 1024
        try:
            value: int | float = int(text) * scale if self.kind is int else float(text) * scale
        except ValueError:
            raise ParseError(f"{flag}: {raw!r} is not {self.describe()}") from None
        if value != value or value in (float("inf"), float("-inf")):  # NaN, inf
            raise ParseError(f"{flag}: {raw!r} is not {self.describe()}")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and value > self.high
        if too_low or too_high:
            raise ParseError(f"{flag}: {raw!r} is out of range; give {self.describe()}")
        return value

    def bad_values(self) -> list[str]:
        """Values this flag must refuse (for the table-driven test of every numeric flag)."""
        out = ["abc", "", "1e999" if self.kind is float else "1.5", "nan" if self.kind is float else "0x10"]
        if self.low is not None:
            out.append(_fmt(self.low) if self.low_open else _fmt(self.low - 1))
            out.append("-1")
        if self.high is not None:
            out.append(_fmt(self.high + 1))
        return out


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


POSITIVE = Number(int, low=1, metavar="N")  # forks, counts of GPUs or sequences
LINES = Number(int, low=1, high=10_000, metavar="N")  # -n: lines or records
SECONDS = Number(float, low=0, low_open=True, metavar="SECONDS")  # timeouts
SECONDS_OR_ZERO = Number(float, low=0, metavar="SECONDS")  # pauses
PERCENT = Number(float, low=0, high=100, metavar="PERCENT")
FRACTION = Number(float, low=0, low_open=True, high=1, metavar="FRACTION")
TOKENS = Number(int, low=1, k_suffix=True, metavar="TOKENS")


class NumberArgument(Argument):
    """An Invoke argument whose value is checked by a ``Number`` as it is parsed."""

    number: Number
    metavar: str

    def set_value(self, value: Any, cast: bool = True) -> None:
        if not cast or value is None:
            return super().set_value(value, cast=cast)
        self.raw_value = value
        name = (self.name or "").replace("_", "-")
        self._value = self.number.parse(f"-{name}" if len(name) == 1 else f"--{name}", value)


class FleetTask(Task):
    """Invoke's Task with chosen short flags and parse-time number checks (see the module docstring)."""

    def __init__(self, body: Callable, *, numbers: dict[str, Number] | None = None, **kwargs: Any) -> None:
        kwargs["auto_shortflags"] = False
        super().__init__(body, **kwargs)
        self.numbers = dict(numbers or {})
        params = inspect.signature(body).parameters
        for name, p in params.items():
            d = p.default
            if isinstance(d, int | float) and not isinstance(d, bool) and name not in self.numbers:
                raise TypeError(f"task {body.__name__}: numeric flag {name!r} needs a Number in numbers=")
        unknown = set(self.numbers) - set(params)
        if unknown:
            raise TypeError(f"task {body.__name__}: numbers= names no parameter: {sorted(unknown)}")

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        names = list(opts["names"])
        short = SHORT.get(name)
        if short and short not in taken_names and name not in SAFETY_OVERRIDES:
            names.append(short)
        if name == "host" and "limit" not in taken_names:
            names += ["limit", "l"]
        opts["names"] = names
        number = self.numbers.get(name)
        if number is not None:
            opts["kind"] = int if number.kind is int else str
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        # Invoke pops each help entry as it uses it: keep ours, so the task can be parsed again (a
        # second Program in one process, the docs checker, completion).
        kept = dict(self.help)
        try:
            args = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept
        for arg in args:
            key = arg.attr_name or arg.name
            number = self.numbers.get(key) if key else None
            if number is not None:
                arg.__class__ = NumberArgument
                assert isinstance(arg, NumberArgument)
                arg.number = number
                arg.metavar = number.metavar
        return args


def fleet_task(*, numbers: dict[str, Number] | None = None, **kwargs: Any) -> Callable[[Callable], FleetTask]:
    """``@fleet_task(help=..., numbers=...)``: an Invoke task with llmfleet's flag rules, its errors
    turned into one line and an exit code, and ``-v`` tracing when the task has ``verbose``."""

    def deco(fn: Callable) -> FleetTask:
        from llmfleet.cli.common import handles_errors

        return invoke_task(klass=FleetTask, numbers=numbers, **kwargs)(handles_errors(_traced(fn)))

    return deco


def _traced(fn: Callable) -> Callable:
    if "verbose" not in inspect.signature(fn).parameters:
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        if not kw.get("verbose"):
            return fn(*args, **kw)
        from llmfleet.cli.common import print_trace
        from llmfleet.host import trace

        with trace.tracing(print_trace):
            return fn(*args, **kw)

    return wrapper


# ---------------------------------------------------------------------------------------------
# Usage errors: one line, exit 2 (for Invoke's own Program too)

# Invoke's core flags (Program.core_args and task_args) llmfleet does not take -> why. They change how
# *local shell commands* run, and llmfleet runs none: accepted and ignored, `--dry` would let a deploy
# start. The `llmfleet` program does not offer them; under `invoke` those that reach a task are refused.
REFUSED: dict[str, str] = {
    "command-timeout": "give the task's own --timeout, or set llmfleet.ssh.command_timeout in invoke.yaml",
    "debug": "give -v after the task name to see each remote command",
    "dry": "llmfleet runs no local shell commands; see what a deploy would change with `{prog} deploy --check --diff`",
    "echo": "give -v after the task name to see each remote command",
    "hide": "llmfleet runs no local shell commands",
    "list-depth": "`{prog} --list` lists every task",
    "list-format": "`{prog} --list` lists every task",
    "prompt-for-sudo-password": "remote sudo follows the inventory (ansible_become)",
    "pty": "llmfleet runs no local shell commands",
    "warn-only": "llmfleet runs no local shell commands",
    "write-pyc": "not an llmfleet setting",
    "collection": "llmfleet's tasks are built in",
    "no-dedupe": "not an llmfleet setting",
    "search-root": "llmfleet's tasks are built in",
}
REFUSED_SHORT: dict[str, str] = {"T": "command-timeout", "d": "debug", "R": "dry", "e": "echo", "D": "list-depth",
                                 "F": "list-format", "p": "pty", "w": "warn-only", "c": "collection",
                                 "r": "search-root"}
# Refused under the stock `invoke` program too (it needs -c, -r, -d, -D, -F for itself)
REFUSED_UNDER_INVOKE = ("command-timeout", "dry", "echo", "hide", "prompt-for-sudo-password", "pty", "warn-only")
# The command the user typed, for hints (`llmfleet ...` or `invoke ...`); set when a Program runs.
PROG = "invoke"


def refused_flag(token: str) -> str | None:
    """The Invoke core flag ``token`` names (``--dry``, ``-R``, ``--hide=x``, ``-T5``), if llmfleet refuses it."""
    if token.startswith("--"):
        name = token[2:].split("=", 1)[0]
        return name if name in REFUSED else None
    if token.startswith("-") and len(token) >= 2:
        return REFUSED_SHORT.get(token[1])
    return None


def refusal(token: str, prog: str, *, before_task: bool = False) -> str:
    """One line refusing Invoke core flag ``token``."""
    name = refused_flag(token) or token.lstrip("-")
    why = REFUSED.get(name, "not an llmfleet flag").format(prog=prog)
    shown = token.split("=", 1)[0] if token.startswith("--") else token[:2]
    long = f" (--{name})" if shown != f"--{name}" else ""
    return f"error: llmfleet does not take Invoke's {shown}{long}{' before the task name' if before_task else ''}: {why}"


def hints(text: str) -> str:
    """A message's command hints in the words the user typed (`llmfleet deploy`, not `invoke deploy`)."""
    return text if PROG == "invoke" else text.replace("`invoke ", f"`{PROG} ")


_NO_IDEA = re.compile(r"^No idea what '(.*)' is!$")
_NEEDS = re.compile(r"^Flag <\w+: (\S+?)(?: \(.*?\))? .*> needed value and was not given one!$")
_NO_VALUE = re.compile(r"^Flag <\w+: (\S+?)(?: \(.*?\))? .*> doesn't take any value!$")


def usage_line(exc: ParseError, prog: str | None = None, tasks: Any = ()) -> str:
    """Invoke's parse error as one line that names the task and the flag (and the closest known name)."""
    from llmfleet.suggest import did_you_mean

    prog = prog or PROG
    msg = str(exc).strip()
    ctx = getattr(exc, "context", None)
    task = getattr(ctx, "name", None)
    where = f"{task}: " if task else ""
    if m := _NO_IDEA.match(msg):
        what = m.group(1)
        if what.startswith("-"):
            if refused_flag(what):
                return refusal(what, prog)
            known = sorted(getattr(ctx, "flags", {}) or {}) if ctx is not None else []
            hint = did_you_mean(what.split("=", 1)[0], [k for k in known if k.startswith("--")], cutoff=0.7)
            return f"error: {where}no flag {what}{hint} (`{prog} --help {task or 'TASK'}` lists the flags)"
        hint = did_you_mean(what, tasks)
        if task:
            return f"error: {what!r} is neither a task nor a flag of {task}{hint} (`{prog} --help {task}`)"
        return f"error: no task {what!r}{hint} (`{prog} --list` shows the tasks)"
    if m := _NEEDS.match(msg):
        return f"error: {where}{_flag(m.group(1))} needs a value"
    if m := _NO_VALUE.match(msg):
        return f"error: {where}{_flag(m.group(1))} takes no value"
    first = msg.splitlines()[0] if msg else "bad command line"
    return f"error: {where}{first}"


def _prog(program: Program) -> str:
    """The command the user typed: `llmfleet`, or `invoke`/`inv` (also under `python -m invoke`)."""
    name = getattr(program, "_binary", None) or ""
    if name and "[" not in name:  # Invoke's own program calls itself "inv[oke]"
        return name
    called = getattr(program, "argv", None) and program.called_as
    return called if called in ("invoke", "inv") else "invoke"


def _flag(name: str) -> str:
    name = name.replace("_", "-")
    return f"-{name}" if len(name) == 1 else f"--{name}"


def install() -> None:
    """Exit 2 with one line on any command-line error, and show each number flag's metavar in help."""
    global _installed
    if _installed:
        return

    def exit_2(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(self: Program, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except ParseError as exc:
                coll = getattr(self, "collection", None)
                tasks = list(coll.task_names) if coll is not None else []
                raise Exit(usage_line(exc, _prog(self), tasks), code=2) from None

        return wrapper

    def quiet_on_closed_pipe(method: Callable) -> Callable:
        """The reader went away (`llmfleet --list | head -1`, `invoke TASK -h | head`, `... status | head`):
        end quietly with 141, as a Unix tool killed by SIGPIPE would. Wraps ``run`` (llmfleet's program)
        and the steps that print, which stock ``invoke`` reaches after loading the tasks (and so this)."""

        @functools.wraps(method)
        def wrapper(self: Program, *args: Any, **kwargs: Any) -> Any:
            try:
                result = method(self, *args, **kwargs)
                sys.stdout.flush()
                return result
            except BrokenPipeError:
                # Python would complain once more while flushing stdout at exit: point it at /dev/null.
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                sys.exit(141)

        return wrapper

    run = Program.run

    @functools.wraps(run)
    def run_naming_the_program(self: Program, *args: Any, **kwargs: Any) -> Any:
        global PROG
        PROG = _prog(self)
        return run(self, *args, **kwargs)

    cleanup = Program.parse_cleanup

    @functools.wraps(cleanup)
    def cleanup_refusing(self: Program) -> Any:
        # `invoke --dry deploy`, `invoke status -e`: flags for local shell commands llmfleet never runs
        for name in REFUSED_UNDER_INVOKE:
            if name in self.args and self.args[name].value:
                raise Exit(refusal(f"--{name}", _prog(self)), code=2)
        return cleanup(self)

    update = Program.update_config

    @functools.wraps(update)
    def update_config_checked(self: Program, merge: bool = True) -> Any:
        # `invoke -f FILE`: a file that is not there is an error, not silently skipped
        path = self.args.config.value if "config" in self.args else None
        if path and not os.path.exists(os.path.expanduser(str(path))):
            raise Exit(f"error: -f {path}: no such config file", code=2)
        return update(self, merge)

    from invoke.config import Config

    load_yaml = Config._load_yaml

    @functools.wraps(load_yaml)
    def load_yaml_one_line(self: Config, path: Any) -> Any:
        import invoke.config

        try:
            return load_yaml(self, path)
        except invoke.config.yaml.YAMLError as exc:  # Invoke's own (vendored) yaml  # a malformed invoke.yaml under `invoke`: one line naming file and line
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise Exit(f"error: {path}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})",
                       code=2) from None

    _patch(Program, "update_config", update_config_checked)
    _patch(Config, "_load_yaml", load_yaml_one_line)
    _patch(Program, "run", run_naming_the_program)
    _patch(Program, "parse_cleanup", cleanup_refusing)
    _patch(Program, "parse_tasks", exit_2(Program.parse_tasks))
    _patch(Program, "parse_cleanup", quiet_on_closed_pipe(exit_2(Program.parse_cleanup)))
    _patch(Program, "execute", quiet_on_closed_pipe(Program.execute))
    _patch(Program, "run", quiet_on_closed_pipe(Program.run))

    help_for = ParserContext.help_for

    @functools.wraps(help_for)
    def help_with_metavar(self: ParserContext, flag: str) -> tuple[str, str]:
        names, text = help_for(self, flag)
        arg = self.flags.get(flag)
        metavar = arg.metavar if isinstance(arg, NumberArgument) else None
        if metavar:
            names = re.sub(r"(?<=[ =\[])(INT|STRING)\b", metavar, names)
        elif arg is not None and arg.kind is list:  # a repeatable flag takes a value too: say so
            value = "SOURCE" if arg.name == "inventory" else "VALUE"
            names = ", ".join(f"{n} {value}" if len(n.lstrip("-")) == 1 else f"{n}={value}"
                              for n in names.split(", "))
        return names, text

    _patch(ParserContext, "help_for", help_with_metavar)
    _help_before_positionals()
    _installed = True


_installed = False  # install() ran: Invoke's classes are patched once per process


def _patch(cls: type, name: str, method: Callable[..., Any]) -> None:
    """Replace a method of one of Invoke's classes for the whole process (start-up only)."""
    setattr(cls, name, method)


def _help_before_positionals() -> None:
    """``TASK -h`` / ``TASK --help`` is help even for a task whose positional argument is still missing
    (``images.pin -h``): Invoke's parser would take the flag as the argument's value."""
    from invoke.parser.parser import ParseMachine

    handle = ParseMachine.handle

    @functools.wraps(handle)
    def handle_help_first(self: ParseMachine, token: str) -> None:
        ctx = self.context
        if (ctx is not None and ctx.name and ctx.missing_positional_args and not self.waiting_for_flag_value
                and token not in ctx.flags and token not in ctx.inverse_flags):
            if token in ("-h", "--help") and self.initial is not None and token in self.initial.flags:
                self.initial.flags[token].value = ctx.name
                return None
            if token.startswith("-") and len(token) > 1 and not token[1:2].isdigit():
                # a flag where the positional argument belongs (`images.pin --dry`): never its value
                self.error(f"No idea what {token!r} is!")
        return handle(self, token)

    complete = ParseMachine.complete_context

    @functools.wraps(complete)
    def complete_unless_help(self: ParseMachine) -> None:
        ctx = self.context
        helped = self.initial is not None and "help" in self.initial.args and ctx is not None and ctx.name \
            and self.initial.args["help"].value == ctx.name
        if helped and ctx.missing_positional_args:
            if ctx not in self.result:
                self.result.append(ctx)
            return None
        return complete(self)

    _patch(ParseMachine, "handle", handle_help_first)
    _patch(ParseMachine, "complete_context", complete_unless_help)
