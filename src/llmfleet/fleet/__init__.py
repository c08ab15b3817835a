"""Many hosts: status, rolling upgrades, engine metrics."""
