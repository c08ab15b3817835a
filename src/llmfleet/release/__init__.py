"""One service on one host: rendered files, releases on the host and the remote scripts that
manage them, deploy and rollback, the switch's confirmation and the audit trail. Judging a started
release (health, residency, speed, watchdog) is ``llmfleet.health``."""

# The fleet's speed measurements under their former names, for the callers that still use them.
from llmfleet.health import speed_cache as speed_cache
from llmfleet.health import speed_history as speed_history
from llmfleet.health import speed_overlay as speed_overlay

__all__ = ["speed_cache", "speed_history", "speed_overlay"]
