#!/usr/bin/env bash
# The main job on the built-in lab, from a fresh Debian 12 machine (root): set up llmfleet, build
# the lab (Docker engine, registry, images: minutes the first time, cached after), bring up the lab's
# simulated GPU hosts, preflight and deploy the default service on gpu-v100-01, and show its health.
# Extra arguments go to the deploy (e.g. --diff). Re-running it is safe: an unchanged deploy is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
HOST="${LLMFLEET_DEMO_HOST:-gpu-v100-01}"

step() { printf '\n== %s\n' "$*"; }

step "lab: engine, registry and images"
invoke lab.setup
step "lab: hosts"
invoke lab.up
step "plan for $HOST"
# informative: the deploy's preflight enforces the fit; the health floor shown is the one the deploy
# gates on (the lab's CPU engines: the inventory's health.min_tokps, not the card's figure)
invoke plan --host "$HOST" --gather || true
step "preflight $HOST"
invoke preflight --host "$HOST"
step "deploy $HOST"
invoke deploy --host "$HOST" "$@"   # lab.up recorded the host keys: strict checking applies
step "status"
invoke status --host "$HOST"
