"""Other tools' habits on llmfleet's command line: one line naming llmfleet's way to do the same.

An operator used to ``ansible-playbook`` types ``-e k=v``, ``--limit``, ``-K`` or ``--tags``; one used to
kamal or systemctl names the host, service or release as a bare word (``deploy gpu-v100-01``,
``rollback --host H 20261201T120000Z-0123456789``); others type ``help``, ``version``, ``--dry-run`` or
``--tail``. Invoke's parser only knows that the word is no flag of the task. These functions turn that
into the flag the task does have ("did you mean --check?"), or a line saying llmfleet has none and what
to do instead. Every flag a hint offers for a task is one of that task's flags (``flags``: the spellings
the task takes, e.g. its Invoke ParserContext's ``flags``).

Pure: the parser's error handlers (``cli.flags.usage_line``, ``cli.main``) call these with what they know.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Habit:
    """A flag llmfleet does not take, from another tool, and llmfleet's way instead."""

    spellings: tuple[str, ...]  # as typed: "-e", "--extra-vars"
    origin: str  # the tool and its long flag, e.g. "Ansible's --extra-vars" ("" for no tool in particular)
    equivalents: tuple[str, ...] = ()  # llmfleet flags that do the same; the first the task has is offered
    instead: str = ""  # when the task has none of them: what to do ({prog} is the command as typed)
    takes_value: bool = True  # the habit's flag takes a value (shown in the suggested flag)
    say_missing: bool = True  # where the task has no equivalent, say so before ``instead``


SET_IN_INVENTORY = "set it in the inventory (host_vars/HOST.yml or group_vars/GROUP.yml)"

HABITS: tuple[Habit, ...] = (
    Habit(("-e", "--extra-vars"), "Ansible's --extra-vars", ("--set",),
          "llmfleet has no extra vars: set a variable in the inventory (host_vars/HOST.yml or "
          "group_vars/GROUP.yml); `{prog} upgrade --set FIELD=VALUE` sets a service field on every service",
          say_missing=False),
    Habit(("--limit", "-l"), "Ansible's --limit", ("--host", "--group"), "it works on no hosts"),
    Habit(("-C", "--check", "--dry-run", "-n", "--noop", "--what-if"), "", ("--check",),
          "`{prog} status` shows what runs where", takes_value=False),
    Habit(("-D", "--diff"), "Ansible's --diff", ("--diff",), "`{prog} deploy --check --diff` shows a deploy's diffs"),
    Habit(("-K", "--ask-become-pass", "--ask-sudo-pass"), "Ansible's --ask-become-pass", (),
          "llmfleet never asks for a sudo password: where the inventory sets ansible_become, remote commands "
          "run through `sudo -n`, so give that user passwordless sudo", takes_value=False),
    Habit(("-b", "--become", "--sudo"), "Ansible's --become", (),
          "set ansible_become: true for the host in the inventory (host_vars/HOST.yml or group_vars/GROUP.yml)",
          takes_value=False),
    Habit(("--become-user",), "Ansible's --become-user", (),
          "set ansible_become_user for the host in the inventory (host_vars/HOST.yml or group_vars/GROUP.yml)"),
    Habit(("--become-method",), "Ansible's --become-method", (),
          "llmfleet becomes root through sudo only (ansible_become_method in the inventory)"),
    Habit(("-u", "--user"), "Ansible's --user", (),
          "set ansible_user for the host in the inventory (host_vars/HOST.yml or group_vars/GROUP.yml)"),
    Habit(("--private-key", "--key-file"), "Ansible's --private-key", (),
          "set ansible_ssh_private_key_file in the inventory (host_vars/HOST.yml or group_vars/GROUP.yml), "
          "or load the key into ssh-agent"),
    Habit(("-k", "--ask-pass"), "Ansible's --ask-pass", (),
          "llmfleet logs in with SSH keys only: set ansible_ssh_private_key_file in the inventory, or use "
          "ssh-agent", takes_value=False),
    Habit(("-c", "--connection"), "Ansible's --connection", (),
          "llmfleet always connects over SSH (ansible_connection ssh, paramiko or smart in the inventory)"),
    Habit(("--ssh-common-args", "--ssh-extra-args"), "Ansible's --ssh-common-args", (),
          "set ansible_ssh_common_args for the host in the inventory (host_vars/HOST.yml or group_vars/GROUP.yml)"),
    Habit(("-t", "--tags", "--skip-tags"), "Ansible's --tags", ("--service",),
          "llmfleet has no tags: a task acts on whole services", say_missing=False),
    Habit(("-f", "--forks"), "Ansible's --forks", ("--forks",)),
    Habit(("-T", "--timeout"), "Ansible's --timeout", ("--timeout",),
          "set llmfleet.ssh.connect_timeout (SSH connect) or llmfleet.ssh.command_timeout (each remote "
          "command) in invoke.yaml"),
    Habit(("--vault-password-file",), "Ansible's --vault-password-file", ("--vault-password-file",),
          "set ANSIBLE_VAULT_PASSWORD_FILE to a file holding the vault password (every task reads it)"),
    Habit(("--ask-vault-pass", "--ask-vault-password", "-J", "--vault-id"), "Ansible's --ask-vault-pass",
          ("--vault-password-file",),
          "set ANSIBLE_VAULT_PASSWORD_FILE to a file holding the vault password (every task reads it)",
          takes_value=False),
    Habit(("--syntax-check",), "Ansible's --syntax-check", (),
          "`{prog} inventory --check` validates the inventory offline", takes_value=False),
    Habit(("--list-hosts",), "Ansible's --list-hosts", (), "`{prog} inventory` lists the hosts", takes_value=False),
    Habit(("--list-tasks",), "Ansible's --list-tasks", (), "`{prog} --list` lists the tasks", takes_value=False),
    Habit(("-v", "--verbose", "-vv", "-vvv", "-vvvv"), "", ("-v",), takes_value=False),
    Habit(("--tail", "--lines"), "", ("-n",), "`{prog} logs -n N` shows a service's last lines"),
    Habit(("-y", "--assume-yes", "--force"), "", ("--yes",), takes_value=False),
)

BY_SPELLING: dict[str, Habit] = {s: h for h in HABITS for s in h.spellings}


def habit(token: str) -> Habit | None:
    """The habit ``token`` (``--limit=x``, ``-T5``, ``-e``) is, if any."""
    if token in BY_SPELLING:
        return BY_SPELLING[token]
    if token.startswith("--"):
        return BY_SPELLING.get(token.split("=", 1)[0])
    if re.fullmatch(r"-v{2,}", token):
        return BY_SPELLING["-vvv"]
    if token.startswith("-") and len(token) > 2 and token[1] != "-":  # -T5, -ekey=value
        return BY_SPELLING.get(token[:2])
    return None


def _shown(token: str) -> str:
    return token.split("=", 1)[0] if token.startswith("--") else token[:2] if not re.fullmatch(r"-v+", token) \
        else token


def _inline_value(token: str) -> str | None:
    """The value given in the token itself: ``--limit=x`` -> x, ``-T5`` -> 5."""
    if token.startswith("--"):
        return token.split("=", 1)[1] if "=" in token else None
    if len(token) > 2 and not re.fullmatch(r"-v+", token):
        return token[2:]
    return None


def _origin(h: Habit, shown: str) -> str:
    if not h.origin:
        return ""
    tool, _, long = h.origin.partition(" ")
    return f" ({h.origin})" if long != shown else f" (an {tool[:-2]} flag)"


def _quote_value(value: str) -> str:
    import shlex

    return shlex.quote(value)


def flag_hint(token: str, task: str, flags: Container[str], prog: str, value: str | None = None) -> str | None:
    """One error line for flag ``token`` given after ``task`` (whose flags are ``flags``), when it is
    another tool's habit; ``value``: the word after it on the command line, if any. None: not a habit."""
    h = habit(token)
    if h is None:
        return None
    shown = _shown(token)
    value = _inline_value(token) or value
    if value is not None and (value.startswith("-") or not h.takes_value):
        value = None
    where = f"error: {task}: no flag {shown}{_origin(h, shown)}"
    have = [e for e in h.equivalents if e in flags]
    if have:
        eq = have[0]
        arg = f" {_quote_value(value)}" if value is not None else ""
        return f"{where}; did you mean `{prog} {task} {eq}{arg}`?"
    instead = h.instead.format(prog=prog)
    if h.equivalents and h.say_missing:
        missing = " or ".join(h.equivalents)
        return f"{where}: {task} has no {missing}; {instead}" if instead else \
            f"{where}: {task} has no {missing} (`{prog} --help {task}` lists its flags)"
    return f"{where}: {instead}"


def owners(contexts: Mapping[str, Any]) -> dict[str, list[str]]:
    """Flag spelling (``--host``, ``-l``) -> the tasks that take it; ``contexts``: task name -> its
    Invoke ParserContext."""
    out: dict[str, list[str]] = {}
    for name, ctx in contexts.items():
        for arg in ctx.args.values():
            for n in arg.names:
                out.setdefault(f"-{n}" if len(n) == 1 else f"--{n}", []).append(name)
    return out


def before_task_hint(token: str, prog: str, task: str | None, flags: Container[str] | None,
                     value: str | None, owners: dict[str, list[str]]) -> str | None:
    """One error line for flag ``token`` given before the task name. ``task``/``flags``: the task that
    follows on the command line, if any; ``owners``: flag spelling -> the tasks that take it."""
    shown = _shown(token)
    arg = _inline_value(token) or (value if value is not None and not value.startswith("-") else None)
    if task is not None and flags is not None and shown in flags:
        val = f" {_quote_value(arg)}" if arg is not None else ""
        return f"error: {shown} goes after the task name: `{prog} {task} {shown}{val}`"
    if task is not None and flags is not None:
        line = flag_hint(token, task, flags, prog, value)
        if line is not None:
            return line.replace(f"error: {task}: no flag {shown}", f"error: no flag {shown} before the task name", 1)
        return None
    h = habit(token)
    candidates = [e for e in h.equivalents if e in owners] if h else []
    candidates += [shown] if shown in owners else []
    if candidates:
        eq = candidates[0]
        tasks = sorted(owners[eq], key=lambda t: (t != "deploy", t))
        some = ", ".join(tasks[:3]) + (", ..." if len(tasks) > 3 else "")
        val = "" if h is not None and not h.takes_value else f" {_quote_value(arg)}" if arg is not None else " VALUE"
        return (f"error: no flag {shown} before the task name: {eq} is a flag of tasks ({some}), given after "
                f"the task name: `{prog} {tasks[0]} {eq}{val}`")
    if h is not None:
        return f"error: no flag {shown} before the task name{_origin(h, shown)}: {h.instead.format(prog=prog)}"
    return None


# A bare word after a task: a host, service or release named as kamal and systemctl take them.
RELEASE_LIKE = re.compile(r"^\d{8}")  # a release id starts with its date (20261129T120000Z-0123456789)
HELP_WORDS = frozenset({"help", "-help", "h", "?"})
VERSION_WORDS = frozenset({"version", "-version", "-V"})
LIST_WORDS = frozenset({"list", "ls", "tasks"})
BARE_FLAGS = ("--to", "--host", "--service")  # the order bare words are read in


def word_hint(word: str, task: str, flags: Container[str], prog: str, rest: Sequence[str],
              takes_value: Container[str] = ()) -> str:
    """The hint suffix for bare ``word`` after ``task``: ``rest`` is the task's part of the command line
    (the flags and words after the task name, ``word`` among them); ``takes_value``: its flags that take
    a value. "" when there is nothing better to say."""
    if word in HELP_WORDS:
        return f" (did you mean `{prog} --help {task}`?)"
    if word in VERSION_WORDS:
        return f" (did you mean `{prog} --version`?)"
    given = set()
    out: list[str] = []
    changed = False
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok.startswith("-") and len(tok) > 1:
            out.append(tok)
            name = tok.split("=", 1)[0]
            given.add(name)
            if "=" not in tok and name in takes_value and i + 1 < len(rest):
                out.append(rest[i + 1])
                i += 1
            i += 1
            continue
        flag = None
        if RELEASE_LIKE.match(tok) and "--to" in flags and not given & {"--to"}:
            flag = "--to"
        elif "--host" in flags and not given & {"--host", "-l", "--limit"}:
            flag = "--host"
        elif "--service" in flags and not given & {"--service"}:
            flag = "--service"
        if flag is None:
            return ""
        given.add(flag)
        out += [flag, tok]
        changed = True
        i += 1
    if not changed:
        return ""
    import shlex

    also = " a group is --group NAME" if "--group" in flags and "--host" in out and "--group" not in given else ""
    return f" (did you mean `{prog} {task} {' '.join(shlex.quote(t) for t in out)}`?{also})"


def first_word_hint(word: str, prog: str, following: Sequence[str], tasks: Iterable[str]) -> str:
    """The hint suffix for a first word that is no task (``help``, ``version``, ``list``)."""
    if word in HELP_WORDS:
        nxt = next((t for t in following if t in set(tasks)), None)
        return f" (did you mean `{prog} --help {nxt}`?)" if nxt else \
            f" (`{prog} --help` shows the flags, `{prog} --list` the tasks)"
    if word in VERSION_WORDS:
        return f" (did you mean `{prog} --version`?)"
    if word in LIST_WORDS:
        return f" (did you mean `{prog} --list`?)"
    return ""
