"""Shared plumbing for task modules: error handling, output, host selection.

Task modules stay thin: parse flags, call the package, print. Everything here is about that shell.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from llmfleet.errors import LlmfleetError

if TYPE_CHECKING:
    from llmfleet.settings import Settings


class _LazyConsole:
    """A rich Console made on first use (importing rich costs start-up time `invoke --list` need not pay).

    Piped or logged output (CI, `| tee`) has no terminal width; rich would squeeze tables into 80
    columns. A wide fixed width is used there unless COLUMNS says otherwise."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Any = None

    @property
    def in_use(self) -> bool:
        """Whether the rich Console was made (something printed through it, or a live display runs)."""
        return self._console is not None

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """rich's print, with the command hints of plain text in the words typed (`llmfleet speed` for a
        user of the `llmfleet` command, `invoke speed` for one of `invoke`: ``flags.hints``)."""
        from llmfleet.cli.flags import hints

        self.__getattr__("print")(*(hints(o) if isinstance(o, str) else _hint_cells(o) for o in objects), **kwargs)

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
            self._console = Console(stderr=self._stderr, highlight=False, soft_wrap=True, width=width)
            self._console.on_broken_pipe = _reader_went_away  # rich would exit 1; the program ends with 141
        return getattr(self._console, name)


def _hint_cells(obj: Any) -> Any:
    """A rich Table's text cells and title with their command hints in the words typed (a preflight fix
    column that says `invoke images.pin` to an llmfleet user); anything else as it is."""
    from llmfleet.cli.flags import hints

    columns = getattr(obj, "columns", None)
    if isinstance(columns, list):
        for col in columns:
            cells = getattr(col, "_cells", None)
            if isinstance(cells, list):
                col._cells = [hints(c) if isinstance(c, str) else c for c in cells]
        if isinstance(getattr(obj, "title", None), str):
            obj.title = hints(obj.title)
    return obj


def _reader_went_away() -> None:
    """rich's on_broken_pipe: the reader of stdout went away (`llmfleet plan ... | head -1`). rich exits 1
    there; raised on, it reaches the program's closed-pipe handling (flags.install: quietly, 141)."""
    raise BrokenPipeError


def can_ask() -> bool:
    """Whether a question can be put to a person: stdin is a terminal (not closed, not a pipe or file)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):  # a closed or broken stdin
        return False


console: Any = _LazyConsole(stderr=False)
err_console: Any = _LazyConsole(stderr=True)


INVENTORY_HELP = ("inventory source: file, folder, script or 'h1,h2,' host list; repeat -i to merge several "
                  "(default: as Ansible finds it: ANSIBLE_INVENTORY, ansible.cfg, ./inventory)")


def _show_warning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
    from llmfleet.inventory.values import InventoryWarning

    if issubclass(category, InventoryWarning):
        from llmfleet.cli.flags import hints

        err_console.print(f"[yellow]warning[/yellow]: {escape(hints(str(message)))}")
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning
warnings.showwarning = _show_warning  # inventory warnings print as one "warning:" line on stderr


def cfg(c, key: str, default: Any = None) -> Any:
    """Read ``llmfleet.<key>`` from Invoke's config (invoke.yaml, env INVOKE_LLMFLEET_*, -f files)."""
    node = c.config.get("llmfleet", {}) or {}
    for part in key.split("."):
        if not isinstance(node, dict) and not hasattr(node, "get"):
            return default
        node = node.get(part, None)
        if node is None:
            return default
    return node


def inventory_path(c, inventory: str | list[str] | None) -> str | list[str]:
    """The ``-i`` sources: one path (str), or a list when there are several. Without ``-i``, found as
    Ansible finds it (llmfleet.inventory.discover): llmfleet.inventory in invoke.yaml, ANSIBLE_INVENTORY,
    ansible.cfg's [defaults] inventory, ./inventory."""
    from llmfleet.inventory.discover import find

    if isinstance(inventory, list | tuple):
        inventory = list(inventory) if inventory else None
    found = find(inventory, cfg(c, "inventory"), os.environ, os.getcwd(), os.path.expanduser("~"))
    return found.sources[0] if len(found.sources) == 1 else found.sources


def repeatable_inventory(collection) -> None:
    """Make ``-i/--inventory`` repeatable on every task that takes it (Ansible merges several -i)."""
    import inspect

    for t in collection.tasks.values():
        if "inventory" in inspect.signature(t.body).parameters and "inventory" not in t.iterable:
            t.iterable = [*t.iterable, "inventory"]
    for sub in collection.collections.values():
        repeatable_inventory(sub)


_json_documents = 0  # how many JSON documents this process has printed on stdout


def print_json(data: Any) -> None:
    global _json_documents
    _json_documents += 1
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def error_document(message: str, code: int) -> dict[str, Any]:
    """What a ``--json`` task prints on stdout when it ends before its own document (bad input, a host it
    could not reach, a missing file): the error line (as on stderr, without "error: ") and the exit code."""
    return {"error": message.removeprefix("error: "), "exit": code}


def handles_errors(fn: Callable) -> Callable:
    """Turn llmfleet errors into Invoke's Exit: one line on stderr, the error's exit code. A task run
    with ``--json`` that ends so before printing its document prints ``error_document`` on stdout too:
    every ``--json`` outcome is one JSON document."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        printed = _json_documents
        wants_json = bool(kwargs.get("json"))
        try:
            return fn(*args, **kwargs)
        except LlmfleetError as exc:
            from llmfleet.cli.flags import hints

            line = hints(f"error: {exc}")
            if wants_json and _json_documents == printed:
                print_json(error_document(line, exc.exit_code))
            raise Exit(line, code=exc.exit_code) from None
        except Exit as exc:
            if wants_json and exc.code and _json_documents == printed:
                print_json(error_document(str(exc.message or "failed"), exc.code))
            raise
        except KeyboardInterrupt:
            if wants_json and _json_documents == printed:
                print_json(error_document("interrupted", 130))
            raise Exit("interrupted", code=130) from None

    return wrapper


def load_settings(c) -> Settings:
    """llmfleet's settings from Invoke's config (invoke.yaml, ~/.invoke.yaml, -f, INVOKE_LLMFLEET_*),
    built once per task and passed down."""
    from llmfleet.settings import Settings

    return Settings.of(c.config.get("llmfleet", {}) or {})


def escape(text: Any) -> str:
    """Rich markup escaping (rich imported on first use)."""
    from rich.markup import escape as _escape

    return _escape(str(text))


def new_table(*columns: str, **kwargs: Any) -> Any:
    """A rich Table with these columns (rich imported on first use)."""
    from rich.table import Table

    table = Table(**kwargs)
    for col in columns:
        table.add_column(col)
    return table


def print_trace(event: Any) -> None:
    """``-v``: one remote command (already masked), its exit status and duration, on stderr."""
    rc = "no exit status" if event.rc is None else f"rc={event.rc}"
    head = f"{event.host}: [{event.seconds:.2f}s {rc}]"
    body = event.command.strip("\n")
    if "\n" in body:
        body = "\n" + "\n".join("    " + line for line in body.splitlines())
    err_console.print(f"[dim]{escape(head)} {escape(body)}[/dim]")


# ---------------------------------------------------------------------------------------------
# JSON shapes shared by every task that reaches hosts: one object per task, whatever the number of
# hosts; an unreachable host is {"host": NAME, "error": WHY} in the "unreachable" list.


def unreachable_entry(host: str, error: str) -> dict[str, str]:
    return {"host": host, "error": error}


def host_document(key: str, items: list[Any], unreachable: list[dict[str, str]]) -> dict[str, Any]:
    return {key: items, "unreachable": unreachable}


def load_inv(c, inventory: Any) -> Any:
    """The inventory named by -i (or the configured default); loaded on demand (pydantic, yaml)."""
    from llmfleet.inventory.ansible import load_inventory

    return load_inventory(inventory_path(c, inventory), script_timeout=load_settings(c).inventory_timeout)


def select_hosts(c, inventory: Any, host: str | None, group: str | None) -> tuple[Any, list[Any]]:
    inv = load_inv(c, inventory)
    return inv, inv.select(host=host, group=group)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), for a timeline's start-up line; None elsewhere."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def print_timeline(outcome: Any, before: Sequence[tuple[str, float | None]] = ()) -> None:
    """``--timeline``: where one host's seconds went, stage by stage, on stderr; ``before``: the
    process's own stages before the host's run (start-up, inventory), as (name, seconds)."""
    rt = outcome.round_trips
    err_console.print(f"[bold]{escape(outcome.host)}[/]: timeline, {outcome.duration_s:.2f} s, "
                      f"{rt} SSH round trip{'s' if rt != 1 else ''}")
    for name, secs in before:
        if secs is not None:
            err_console.print(f"  {'':>8} {secs:6.2f}s       {escape(name)}")
    for st in outcome.timeline:
        trips = st.get("round_trips")
        trips_text = f"{trips:>2} rt" if trips else "     "
        err_console.print(f"  +{st['start_s']:6.2f}s {st['seconds']:6.2f}s {trips_text} {escape(st['stage'])}")


def log_line(line: str) -> None:
    """A timestamped progress line on stderr (stdout stays for the result). Written as is while nothing
    else uses rich on stderr (a live display would): importing rich is a twentieth of a second that a
    ``--json`` run need not pay."""
    from datetime import UTC, datetime

    from llmfleet.cli.flags import hints

    text = hints(f"{datetime.now(UTC):%H:%M:%S} {line}")
    if not err_console.in_use:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    else:
        err_console.print(escape(text))
