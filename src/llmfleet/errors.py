"""Errors that end a task with a meaningful exit code and a one-line message."""

from __future__ import annotations


class LlmfleetError(Exception):
    """Base class. ``exit_code`` follows the CLI contract: 1 check failed, 2 usage error."""

    exit_code = 1


class UsageError(LlmfleetError):
    """Bad input from the operator (flags, inventory, catalogs). Nothing was contacted or changed."""

    exit_code = 2


class InventoryError(UsageError):
    """The inventory is malformed or fails the llmfleet schema."""


class CheckFailed(LlmfleetError):
    """A check (preflight, health, plan) failed."""

    exit_code = 1


class RemoteError(LlmfleetError):
    """A host could not be reached or a remote step failed."""

    exit_code = 1
