"""One service on one host: rendered files, releases on the host and the remote scripts that
manage them, deploy and rollback, health checks and the audit trail."""
