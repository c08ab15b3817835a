"""llmfleet's settings: built once from the configuration (invoke.yaml, ``~/.invoke.yaml``, ``-f``,
``INVOKE_LLMFLEET_*``) and passed down to every module that needs one, never re-read on the way.

``Settings.of`` takes a ``Settings`` as it is, or the ``llmfleet`` section of Invoke's config: either
nested (``{"ssh": {...}, "audit_log": ...}``, as invoke.yaml writes it) or flat (the SSH keys next to
the others, as tests and scripts pass them). A value of the wrong type is a usage error naming its key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmfleet.errors import UsageError

DEFAULT_INVENTORY = "inventory/lab/"
DEFAULT_KNOWN_HOSTS = "~/.local/state/llmfleet/known_hosts"
DEFAULT_AUDIT_LOG = "~/.local/state/llmfleet/audit.jsonl"
DEFAULT_PULL_TIMEOUT_S = 1800.0
DEFAULT_INVENTORY_TIMEOUT_S = 30.0


def _number(key: str, value: Any, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"llmfleet.{key}: {value!r} is not a number; fix invoke.yaml or INVOKE_LLMFLEET_*") from None
    if v <= 0:
        raise UsageError(f"llmfleet.{key}: {value!r} must be more than 0")
    return v


def _text(key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str | os.PathLike):
        raise UsageError(f"llmfleet.{key}: {value!r} is not a string; fix invoke.yaml or INVOKE_LLMFLEET_*")
    return str(value)


@dataclass(frozen=True)
class SshSettings:
    connect_timeout: float = 10.0  # seconds to open a TCP + SSH session
    command_timeout: float = 120.0  # seconds one remote command may run
    user: str | None = None  # login user when the inventory sets no ansible_user
    known_hosts: str = DEFAULT_KNOWN_HOSTS  # host keys llmfleet accepted
    config_file: str | None = None  # OpenSSH client config (None: ~/.ssh/config and /etc/ssh/ssh_config)

    @classmethod
    def of(cls, data: SshSettings | Settings | Mapping[str, Any] | None) -> SshSettings:
        if isinstance(data, SshSettings):
            return data
        if isinstance(data, Settings):
            return data.ssh
        d = dict(data or {})
        if isinstance(d.get("ssh"), Mapping):
            d = {**d, **d["ssh"]}
        return cls(
            connect_timeout=_number("ssh.connect_timeout", d.get("connect_timeout"), 10.0),
            command_timeout=_number("ssh.command_timeout", d.get("command_timeout"), 120.0),
            user=_text("ssh.user", d.get("user")),
            known_hosts=_text("ssh.known_hosts", d.get("known_hosts")) or DEFAULT_KNOWN_HOSTS,
            config_file=_text("ssh.config_file", d.get("config_file")),
        )

    def bounded(self, timeout: float) -> SshSettings:
        """Connect and command timeouts no longer than ``timeout`` (at least 1 s)."""
        return replace(self, connect_timeout=max(1.0, min(self.connect_timeout, timeout)),
                       command_timeout=max(1.0, min(self.command_timeout, timeout)))

    @property
    def known_hosts_path(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts))


@dataclass(frozen=True)
class Settings:
    ssh: SshSettings = field(default_factory=SshSettings)
    inventory: str = DEFAULT_INVENTORY
    audit_log: str = DEFAULT_AUDIT_LOG  # the local audit log
    images_lock: str | None = None  # None: images.lock at the repository root (or the inventory's own)
    pull_timeout: float = DEFAULT_PULL_TIMEOUT_S  # seconds one image pull may take
    inventory_timeout: float = DEFAULT_INVENTORY_TIMEOUT_S  # seconds one inventory script may run
    roles_path: Any = None  # folder(s) searched for engine roles before the packaged ones
    templates_path: Any = None  # folder(s) searched for templates before the packaged ones
    bench_dir: str | None = None  # where `invoke bench` keeps its results (None: llmfleet.fleet.bench_run's default)
    prometheus_targets: str | None = None  # file_sd folder re-written after a rollout (docs/monitoring.md)

    @classmethod
    def of(cls, data: Settings | Mapping[str, Any] | None) -> Settings:
        if isinstance(data, Settings):
            return data
        d = dict(data or {})
        return cls(
            ssh=SshSettings.of(d),
            inventory=_text("inventory", d.get("inventory")) or DEFAULT_INVENTORY,
            audit_log=_text("audit_log", d.get("audit_log")) or DEFAULT_AUDIT_LOG,
            images_lock=_text("images_lock", d.get("images_lock")),
            pull_timeout=_number("pull_timeout", d.get("pull_timeout"), DEFAULT_PULL_TIMEOUT_S),
            inventory_timeout=_number("inventory_timeout", d.get("inventory_timeout"), DEFAULT_INVENTORY_TIMEOUT_S),
            roles_path=d.get("roles_path"),
            templates_path=d.get("templates_path"),
            bench_dir=_text("bench_dir", d.get("bench_dir")),
            prometheus_targets=_text("prometheus_targets", d.get("prometheus_targets")),
        )

    @property
    def search_config(self) -> dict[str, Any]:
        """The configuration keys ``render.search_paths`` reads."""
        return {"roles_path": self.roles_path, "templates_path": self.templates_path}

    def bounded(self, timeout: float) -> Settings:
        return replace(self, ssh=self.ssh.bounded(timeout))

    @property
    def audit_log_path(self) -> Path:
        return Path(os.path.expanduser(self.audit_log))


