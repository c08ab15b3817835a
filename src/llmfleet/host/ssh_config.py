"""OpenSSH client configuration, resolved for one host the way ``ssh -G HOST`` resolves it.

Paramiko's reader lacks ``Include`` and parts of ``Match``; this one follows OpenSSH's readconf.c:
``Host`` patterns (globs, ``!`` negation) match the name given to ssh; ``Match`` criteria ``all``,
``host`` (the HostName so far), ``originalhost``, ``user``, ``localuser``, ``exec``, ``canonical``,
``final`` (with negation); ``Include`` with globs, relative to ``~/.ssh`` (user file) or ``/etc/ssh``
(system file), conditional inside a Host/Match block; the first value obtained for a keyword wins,
except the list keywords (``IdentityFile``, ``CertificateFile``, forwards) which accumulate;
``Match final`` re-reads the files with the final host name. ``%`` tokens are expanded in HostName,
IdentityFile, CertificateFile, ProxyCommand, ControlPath and friends.

Pure apart from reading the config files (and running ``Match exec`` commands, as ssh does).
"""

from __future__ import annotations

import fnmatch
import getpass
import glob
import os
import pwd
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
MULTI = {"identityfile", "certificatefile", "localforward", "remoteforward", "dynamicforward", "sendenv"}
# keywords whose value gets %-token expansion (OpenSSH's ssh_config(5) TOKENS section)
_TOKENS_FULL = {"identityfile", "certificatefile", "controlpath", "identityagent", "knownhostscommand",
                "localcommand", "proxycommand", "remotecommand", "userknownhostsfile", "revokedhostkeys"}
MAX_DEPTH = 16


class SshConfigError(ValueError):
    """A config file cannot be read or holds a bad line."""


@dataclass
class Resolved:
    """The options for one host: keyword (lower case) -> values (one, or several for list keywords)."""

    host: str
    options: dict[str, list[str]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)

    def expanded(self, key: str) -> list[str]:
        """The values of ``key`` with ``%`` tokens expanded, as ssh does when it uses them
        (``ssh -G`` prints them unexpanded)."""
        return [expand_tokens(v, self.tokens) if key.lower() in _TOKENS_FULL else v for v in self.all(key)]

    def get(self, key: str, default: str | None = None) -> str | None:
        vals = self.options.get(key.lower())
        return vals[0] if vals else default

    def all(self, key: str) -> list[str]:
        return list(self.options.get(key.lower(), []))

    @property
    def hostname(self) -> str:
        return self.get("hostname") or self.host

    @property
    def port(self) -> int:
        return int(self.get("port") or 22)

    @property
    def user(self) -> str | None:
        return self.get("user")


_LINE = re.compile(r"^([^\s=]+)\s*(?:=\s*)?(.*)$")


def _split(line: str) -> tuple[str, list[str]]:
    """``Keyword args`` or ``Keyword=args``; arguments may be double-quoted."""
    m = _LINE.match(line.strip())
    if not m:
        raise SshConfigError(f"cannot parse {line!r}")
    try:
        args = shlex.split(m.group(2), comments=False, posix=True)
    except ValueError as exc:
        raise SshConfigError(f"bad quoting: {exc}") from None
    return m.group(1).lower(), args


def expand_tokens(value: str, table: dict[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "%" and i + 1 < len(value):
            t = value[i + 1]
            out.append("%" if t == "%" else table.get(t, value[i : i + 2]))
            i += 2
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


def _match_pattern_list(name: str, patterns: list[str], case_insensitive: bool = True) -> bool:
    """OpenSSH match_pattern_list: a negated match wins and makes the whole list false.

    ``Match host/originalhost`` compare lowercased (match_hostname); ``Host`` lines and ``Match
    user`` compare exactly (match_pattern)."""
    if case_insensitive:
        name = name.lower()
    got = False
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        if case_insensitive:
            p = p.lower()
        if fnmatch.fnmatchcase(name, p.replace("[", "[[]")):
            if neg:
                return False
            got = True
    return got


class _Reader:
    def __init__(self, host_arg: str, *, local_user: str, home: str, cmdline: dict[str, list[str]]) -> None:
        self.host_arg = host_arg
        self.original = host_arg
        self.local_user = local_user
        self.home = home
        self.options: dict[str, list[str]] = {}
        for k, v in cmdline.items():
            self.options[k.lower()] = list(v)
        self.want_final = False

    # -- values -----------------------------------------------------------------------------------

    def set(self, key: str, args: list[str]) -> None:
        if not args:
            raise SshConfigError(f"{key}: missing argument")
        if key in MULTI:
            self.options.setdefault(key, [])
            for a in args if key != "sendenv" else args:
                if a not in self.options[key]:
                    self.options[key].append(a)
            return
        if key in self.options:
            return
        if key in ("proxyjump", "proxycommand") and ("proxyjump" in self.options or "proxycommand" in self.options):
            return  # one proxy setting: the first of either wins, as in readconf.c
        if key in ("proxycommand", "localcommand", "remotecommand", "knownhostscommand"):
            self.options[key] = [" ".join(args)]
        elif key in ("globalknownhostsfile", "userknownhostsfile"):
            self.options[key] = [" ".join(args)]
        else:
            self.options[key] = [args[0]]

    # -- Match ------------------------------------------------------------------------------------

    def _match_host(self, final: bool) -> str:
        hn = self.options.get("hostname")
        if final:
            return hn[0] if hn else self.host_arg
        if hn:
            return hn[0].replace("%%", "\0").replace("%h", self.host_arg).replace("\0", "%")
        return self.host_arg

    def match(self, args: list[str], final: bool, where: str) -> bool:
        result = True
        i = 0
        if not args:
            raise SshConfigError(f"{where}: Match needs criteria")
        while i < len(args):
            crit = args[i]
            neg = crit.startswith("!")
            c = crit[1:].lower() if neg else crit.lower()
            i += 1
            if c == "all":
                ok = True
            elif c in ("canonical", "final"):
                if c == "final":
                    self.want_final = True
                ok = final
            else:
                if i >= len(args):
                    raise SshConfigError(f"{where}: Match {c} needs an argument")
                arg = args[i]
                i += 1
                pats = arg.split(",")
                if c == "host":
                    ok = _match_pattern_list(self._match_host(final), pats)
                elif c == "originalhost":
                    ok = _match_pattern_list(self.original, pats)
                elif c == "user":
                    user = self.options.get("user", [self.local_user])[0]
                    ok = _match_pattern_list(user, pats, case_insensitive=False)
                elif c == "localuser":
                    ok = _match_pattern_list(self.local_user, pats, case_insensitive=False)
                elif c == "exec":
                    cmd = self.expand(arg, "exec", final)
                    try:
                        ok = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, timeout=30,  # noqa: S603
                                            check=False).returncode == 0
                    except (OSError, subprocess.TimeoutExpired):
                        ok = False
                elif c in ("tagged", "localnetwork", "version", "sessiontype", "command"):
                    ok = False if c != "tagged" else _match_pattern_list(self.options.get("tag", [""])[0], pats)
                else:
                    raise SshConfigError(f"{where}: unsupported Match criterion {c!r}")
            if neg:
                ok = not ok
            result = result and ok
        return result

    # -- tokens -----------------------------------------------------------------------------------

    def expand(self, value: str, key: str, final: bool = True) -> str:
        host = self.options.get("hostname", [self.host_arg])[0]
        port = self.options.get("port", ["22"])[0]
        user = self.options.get("user", [self.local_user])[0]
        if key == "hostname":
            table = {"h": self.host_arg}
        else:
            table = {
                "h": host, "n": self.original, "p": port, "r": user, "u": self.local_user,
                "d": self.home, "i": str(os.getuid()), "L": socket.gethostname().split(".")[0],
                "l": socket.gethostname(), "j": self.options.get("proxyjump", [""])[0],
            }
        return expand_tokens(value, table)

    # -- files ------------------------------------------------------------------------------------

    def read(self, path: str, *, user_file: bool, final: bool, active: bool, never: bool, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise SshConfigError(f"{path}: Include nested too deep")
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            if depth == 0:
                return
            raise
        except OSError as exc:
            raise SshConfigError(f"{path}: cannot read: {exc.strerror}") from None
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{lineno}"
            try:
                key, args = _split(line)
            except SshConfigError as exc:
                raise SshConfigError(f"{where}: {exc}") from None
            if key == "host":
                active = False if never else _match_pattern_list(self.hostmatch(final), args, case_insensitive=False)
            elif key == "match":
                m = self.match(args, final, where)
                active = False if never else m
            elif key == "include":
                outer = active
                for pattern in args:
                    p = os.path.expanduser(pattern) if pattern.startswith("~") else pattern
                    if pattern.startswith("~") and not user_file:
                        raise SshConfigError(f"{where}: Include: ~ is not allowed in the system file")
                    if not os.path.isabs(p):
                        p = os.path.join(self.home, ".ssh", p) if user_file else os.path.join("/etc/ssh", p)
                    for inc in sorted(glob.glob(p)):
                        self.read(inc, user_file=user_file, final=final, active=outer,
                                  never=never or not outer, depth=depth + 1)
                active = outer
            elif active:
                if key in self.options and key not in MULTI:
                    continue
                self.set(key, [self.expand(a, key, final) if key == "hostname" else a for a in args])

    def hostmatch(self, final: bool) -> str:
        if final:
            hn = self.options.get("hostname")
            return hn[0] if hn else self.host_arg
        return self.host_arg


def resolve(
    host: str,
    *,
    config_file: str | None = None,
    options: dict[str, list[str]] | None = None,
    local_user: str | None = None,
    home: str | None = None,
) -> Resolved:
    """``ssh [-F config_file] [-o key=value ...] host`` resolved like ``ssh -G``.

    ``options`` are command-line options (``-o``, ``-p``, ``-l``, ``-i``, ``-J``): they win over the
    files. Without ``config_file`` the user's ``~/.ssh/config`` then ``/etc/ssh/ssh_config`` are read.
    Keys without a default in the files stay absent (``Resolved.port`` says 22, ``user`` None).
    """
    local_user = local_user or getpass.getuser()
    if home is None:
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = os.path.expanduser("~")
    host_arg = host
    cmdline = {k.lower(): list(v) for k, v in (options or {}).items()}
    files: list[tuple[str, bool]]
    if config_file:
        files = [(os.path.expanduser(config_file), True)]
    else:
        files = [(os.path.join(home, ".ssh", "config"), True), (SYSTEM_CONFIG, False)]

    def one_pass(r: _Reader, final: bool) -> None:
        for path, user_file in files:
            r.read(path, user_file=user_file, final=final, active=True, never=False, depth=0)

    r = _Reader(host_arg, local_user=local_user, home=home, cmdline=cmdline)
    r.original = host
    one_pass(r, final=False)
    if "hostname" in r.options:
        r.options["hostname"] = [r.options["hostname"][0].lower()]
    if r.want_final:
        # ssh.c: the final pass matches Host lines against the (lowercased) host name resolved so far
        r.host_arg = r.options.get("hostname", [host_arg])[0].lower()
        r.options["hostname"] = [r.host_arg]
        one_pass(r, final=True)
    out = dict(r.options)
    out.setdefault("hostname", [host_arg])
    out["hostname"] = [out["hostname"][0].lower()]
    fqdn = socket.gethostname()
    tokens = {
        "h": out["hostname"][0], "n": host, "p": out.get("port", ["22"])[0],
        "r": out.get("user", [local_user])[0], "u": local_user, "d": home, "i": str(os.getuid()),
        "L": fqdn.split(".")[0], "l": fqdn, "j": out.get("proxyjump", [""])[0],
    }
    return Resolved(host=host, options=out, tokens=tokens)
