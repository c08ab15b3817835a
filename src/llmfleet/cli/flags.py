"""The task surface's flags: chosen short flags, numbers checked while parsing, usage errors as exit 2.

Every task is declared with ``fleet_task`` (Invoke's ``@task`` with ``FleetTask``):

- short flags are chosen, never generated (Invoke would give every flag the first free letter):
  Ansible's letters where Ansible has them (``SHORT``), ``-h`` stays help, and a safety override
  (``--allow-unpinned``, ``--accept-new-host-keys``, ``--yes``) has no short flag;
- ``--host`` is also ``--limit`` / ``-l`` (an Ansible ``--limit`` pattern), except in a task with
  its own ``limit`` flag (``inventory``), where ``-l`` is that flag;
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
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from invoke import Program, Task
from invoke import task as invoke_task
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument, ParserContext

# Parameter name -> its short flag. Ansible's letters: -i inventory, -l limit, -f forks, -C check,
# -D diff, -v verbose, -T timeout; -n a number of lines/records, as tail and journalctl.
SHORT: dict[str, str] = {
    "inventory": "i",
    "limit": "l",  # a task's own --limit (inventory's, as ansible-inventory -l); else -l is --host
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
    k_suffix: bool = False  # 32k = 32768, 1M = 1048576 (token counts: binary, as context lengths are)
    metavar: str = "N"

    def describe(self) -> str:
        what = "a whole number" if self.kind is int else "a number"
        if self.low is not None and self.high is not None:
            rng = f"{'more than ' if self.low_open else ''}{_fmt(self.low)} to {_fmt(self.high)}"
        elif self.low is not None:
            rng = f"more than {_fmt(self.low)}" if self.low_open else f"{_fmt(self.low)} or more"
        else:
            rng = ""
        return f"{what}{', ' + rng if rng else ''}" + (" (e.g. 8192, 8k or 1M)" if self.k_suffix else "")

    def parse(self, flag: str, raw: Any) -> int | float:
        text = str(raw).strip().replace("_", "")
        scale = 1
        if self.k_suffix and text[-1:].lower() in ("k", "m"):
            text, scale = text[:-1], 1024 if text[-1:].lower() == "k" else 1024 * 1024
        try:
            if self.kind is int and scale > 1 and "." in text:  # 1.5k = 1536: whole once scaled
                exact = Decimal(text) * scale
                if exact != exact.to_integral_value() or not exact.is_finite():
                    raise ValueError(text)
                value: int | float = int(exact)
            else:
                value = int(text) * scale if self.kind is int else float(text) * scale
        except (ValueError, ArithmeticError):
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
# A hint here names no task's flag: ``refusal`` adds the task's own (--timeout, -v, --check) where it has one.
REFUSED: dict[str, str] = {
    "command-timeout": "set llmfleet.ssh.command_timeout in invoke.yaml",
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


def refusal(token: str, prog: str, *, before_task: bool = False, task: str | None = None,
            flags: Container[str] | None = None) -> str:
    """One line refusing Invoke core flag ``token``; ``task``/``flags``: the task it was given with (after
    it, or before it) and that task's flags, for a hint naming only flags the task has."""
    name = refused_flag(token) or token.lstrip("-")
    why = REFUSED.get(name, "not an llmfleet flag").format(prog=prog)
    own = flags if flags is not None else ()
    if name == "command-timeout" and task and "--timeout" in own:
        why = f"give {task}'s own --timeout (`{prog} {task} --timeout SECONDS`), or {why}"
    elif name in ("echo", "debug") and task:
        why = ("give -v after the task name to see each remote command" if "--verbose" in own
               else f"{task} has no -v (`{prog} --help {task}` lists its flags)")
    elif name == "dry" and task and "--check" in own:
        why = (f"llmfleet runs no local shell commands; see what {task} would change with "
               f"`{prog} {task} --check{' --diff' if '--diff' in own else ''}`")
    shown = token.split("=", 1)[0] if token.startswith("--") else token[:2]
    long = f" (--{name})" if shown != f"--{name}" else ""
    return f"error: llmfleet does not take Invoke's {shown}{long}{' before the task name' if before_task else ''}: {why}"


def hints(text: str) -> str:
    """A message's command hints in the words the user typed (`llmfleet deploy`, not `invoke deploy`)."""
    return text if PROG == "invoke" else text.replace("`invoke ", f"`{PROG} ")


_NO_IDEA = re.compile(r"^No idea what '(.*)' is!$")
_NEEDS = re.compile(r"^Flag <\w+: (\S+?)(?: \(.*?\))? .*> needed value and was not given one!$")
_NO_VALUE = re.compile(r"^Flag <\w+: (\S+?)(?: \(.*?\))? .*> doesn't take any value!$")


def _after(argv: Sequence[str], task: str | None) -> list[str]:
    """The words of ``argv`` after the task name (all of them without a task)."""
    words = list(argv[1:])
    return words[words.index(task) + 1:] if task and task in words else words


def _task_words(rest: Sequence[str], tasks: Any) -> list[str]:
    """``rest`` up to the next task name (Invoke takes several tasks on one command line)."""
    names = set(tasks)
    out: list[str] = []
    for word in rest:
        if word in names:
            break
        out.append(word)
    return out


def _value_flags(ctx: Any) -> set[str]:
    """Every spelling of the flags of ``ctx`` (an Invoke ParserContext) that take a value."""
    out: set[str] = set()
    for arg in getattr(ctx, "args", {}).values():
        if arg.takes_value:
            out |= {f"-{n}" if len(n) == 1 else f"--{n.replace('_', '-')}" for n in arg.names}
    return out


def usage_line(exc: ParseError, prog: str | None = None, tasks: Any = (), argv: Sequence[str] = (),
               contexts: dict[str, Any] | None = None) -> str:
    """Invoke's parse error as one line that names the task and the flag (and the closest known name, or
    llmfleet's way for another tool's habit: cli.habits). ``argv``: the command line, for the word after
    the flag and the rest of the task's words; ``contexts``: task name -> its ParserContext."""
    from llmfleet.cli import habits
    from llmfleet.suggest import did_you_mean

    prog = prog or PROG
    msg = str(exc).strip()
    ctx = getattr(exc, "context", None)
    task = getattr(ctx, "name", None)
    where = f"{task}: " if task else ""
    flags = getattr(ctx, "flags", None) if ctx is not None else None
    if m := _NO_IDEA.match(msg):
        what = m.group(1)
        rest = _after(argv, task)
        at = next((i for i, w in enumerate(rest) if w == what or w.startswith(what + "=")), None)
        nxt = None
        if at is not None:  # the word after the flag (Invoke splits --flag=value before it gets here)
            nxt = rest[at].split("=", 1)[1] if rest[at] != what else rest[at + 1] if at + 1 < len(rest) else None
        if what.startswith("-"):
            if task and flags is not None:
                with_value = nxt is not None and not nxt.startswith("-") and nxt not in tasks
                if refused_flag(what) and not (refused_flag(what) in ("command-timeout", "list-depth", "collection")
                                               or (what[:2] == "-e" and (with_value or len(what) > 2))):
                    return refusal(what, prog, task=task, flags=flags)
                line = habits.flag_hint(what, task, flags, prog, nxt if with_value else None)
                if line is not None:
                    return line
            if refused_flag(what):
                return refusal(what, prog, task=task, flags=flags)
            if not task and contexts:  # before the task name (under `invoke`)
                following = next((w for w in rest if w in contexts), None)
                line = habits.before_task_hint(what, prog, following,
                                               contexts[following].flags if following else None,
                                               nxt, habits.owners(contexts))
                if line is not None:
                    return line
            known = sorted(flags or {}) if flags is not None else []
            known = [k for k in known if k.startswith("--") and not refused_flag(k)]
            hint = did_you_mean(what.split("=", 1)[0], known, cutoff=0.7)
            return f"error: {where}no flag {what}{hint} (`{prog} --help {task or 'TASK'}` lists the flags)"
        if not task and (habit := habits.first_word_hint(what, prog, rest, tasks)):
            return f"error: no task {what!r}{habit}"  # a habit word (version, help) before a look-alike task
        hint = did_you_mean(what, tasks)
        if task and at is not None and at > 0 and rest[at - 1] == "-e" and flags is not None:
            # `invoke deploy -e k=v`: Invoke took -e as its --echo; the word after it is Ansible's extra vars
            line = habits.flag_hint("-e", task, flags, prog, what)
            if line is not None:
                return line
        if task:
            if not hint:
                hint = habits.word_hint(what, task, flags or (), prog, _task_words(rest, tasks),
                                        _value_flags(ctx))
                if hint:
                    return f"error: {what!r} is neither a task nor a flag of {task}{hint}"
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
                contexts = {c.name: c for c in coll.to_contexts()} if coll is not None else None
                argv = getattr(self, "argv", None) or ()
                line = usage_line(exc, _prog(self), tasks, argv, contexts)
                if "--json" in argv:  # every --json outcome is one JSON document, a usage error's too
                    from llmfleet.cli.common import error_document, print_json

                    print_json(error_document(line, 2))
                raise Exit(line, code=2) from None

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
        parsed = getattr(self, "tasks", None) or []
        ctx = parsed[0] if len(parsed) == 1 else None
        for name in REFUSED_UNDER_INVOKE:
            if name in self.args and self.args[name].value:
                raise Exit(refusal(f"--{name}", _prog(self), task=getattr(ctx, "name", None),
                                   flags=getattr(ctx, "flags", None)), code=2)
        return cleanup(self)

    update = Program.update_config

    @functools.wraps(update)
    def update_config_checked(self: Program, merge: bool = True) -> Any:
        # `invoke -f FILE`: a file that is not there is an error, not silently skipped
        path = self.args.config.value if "config" in self.args else None
        if path and not os.path.exists(os.path.expanduser(str(path))):
            parsed = getattr(self, "tasks", None) or []
            names = [c.name for c in parsed if "--forks" not in c.flags]
            why = ""
            if str(path).isdigit() and names:  # `render -f 5`: a task without --forks left -f to Invoke's core
                why = f" ({names[0]} has no --forks: after a task that has none, -f names a config file)"
            raise Exit(f"error: -f {path}: no such config file{why}", code=2)
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
