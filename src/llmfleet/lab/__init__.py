"""The lab: a simulated GPU fleet on this machine (system containers with sshd, Docker and an nvidia-smi simulator)."""
