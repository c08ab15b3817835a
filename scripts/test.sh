#!/usr/bin/env bash
# The test command: set up everything on a fresh Debian machine, then run lint and the whole suite
# (unit tests, and end-to-end tests on the built-in lab). Extra arguments go to pytest.
# Each phase prints its wall time; pytest lists its slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
phase() { printf '== %s (t+%ds)\n' "$1" $((SECONDS - t0)); }

phase "bootstrap"
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

phase "ruff"
ruff check .

phase "lab setup (Docker engine, registry, lab images incl. vLLM CPU; cached after the first run)"
invoke lab.setup --vllm

phase "pytest"
set +e
python -m pytest -q -rs --durations=15 "$@"
rc=$?
set -e
phase "done: exit $rc"
# pytest's exit 5 means no test ran: that is a failure here, not a pass
exit $rc
