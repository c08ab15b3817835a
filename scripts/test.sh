#!/usr/bin/env bash
# The test command: set up everything on a fresh Debian machine, then run lint and the whole suite
# (unit tests, and end-to-end tests on the built-in lab). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check .

if invoke --list 2>/dev/null | grep -q 'lab.setup'; then
  echo "== lab setup (Docker engine, registry, lab images incl. vLLM CPU; cached after the first run)"
  invoke lab.setup --vllm
fi

echo "== pytest"
set +e
python -m pytest -q -rs "$@"
rc=$?
set -e
# pytest's exit 5 means no test ran: that is a failure here, not a pass
exit $rc
