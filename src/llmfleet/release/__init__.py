"""One service on one host: rendered files, releases on the host and the remote scripts that
manage them, deploy and rollback, the switch's confirmation and the audit trail. Judging a started
release (health, residency, speed, watchdog) is ``llmfleet.health``."""
