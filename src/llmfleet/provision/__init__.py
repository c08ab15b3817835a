"""Provisioning: from a bare GPU host to one where a deploy serves (docs/provision.md).

Pure core: ``facts`` (the one facts script and its never-raising parser), ``desired`` (what the host's
services need), ``steps`` (desired vs facts -> ordered steps, each with its exact shell). Shell:
``run`` (SSH, deploy lock, audit, reboot, verification).
"""
