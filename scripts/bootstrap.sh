#!/usr/bin/env bash
# Set up llmfleet on a fresh Debian 12 machine (run as root, or with sudo available):
# system packages, then a virtualenv in .venv with llmfleet, the lab's extras (numpy, safetensors,
# tokenizers: the lab's tiny models) and the development tools.
# Idempotent: a second run installs nothing new. Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
command -v ssh-keygen >/dev/null || need_apt+=(openssh-client)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v git >/dev/null || need_apt+=(git)
# the registry tests run Debian's docker-registry binary on 127.0.0.1 (tests/registry_fixture.py)
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
# the monitoring tests run promtool (rules, the dashboard's queries) and the lab's Prometheus
# (tests/test_monitoring.py, tests/lab/test_prometheus.py): Debian's prometheus package has both
[ -x /usr/bin/promtool ] || need_apt+=(prometheus)
# the gateway tests check each rendered HAProxy configuration with `haproxy -c`
# (tests/test_gateway_config.py): Debian's haproxy package, the same 2.6 as the lab's gateway image
[ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "bootstrap: installing ${need_apt[*]}"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}" >/dev/null
  # the package's own service (port 5000, all interfaces) is not wanted: tests start their own
  if [[ " ${need_apt[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
  # nor Prometheus' own (port 9090, all interfaces): the lab test starts its own on a loopback port
  if [[ " ${need_apt[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  fi
  # nor HAProxy's own (its packaged configuration): the tests only check configurations, the lab runs its image
  if [[ " ${need_apt[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now haproxy >/dev/null 2>&1 || true
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.llmfleet-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing llmfleet into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -e '.[dev,lab]' 2>&1 | grep -v -E '^(WARNING: Location|  )' || true
  .venv/bin/python -c 'import llmfleet, invoke, fabric, prometheus_client, numpy' 
  touch "$stamp"
fi
# Byte-compile the package (and tasks.py) as a regular, non-editable install would: an editable
# install leaves that to the first import, and where PYTHONDONTWRITEBYTECODE is set (containers, CI
# images) every `invoke` run would compile ~40 modules from source again (~0.3 s per command).
# Quick when nothing changed (compileall compares timestamps); a stale .pyc is never used.
.venv/bin/python -m compileall -q -j 0 src/llmfleet tasks.py >/dev/null
