"""Ansible-compatible inventories and the schema of llmfleet's own variables (``llmfleet_*``)."""
