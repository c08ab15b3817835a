#!/usr/bin/env bash
# The test command: set up everything on a fresh Debian machine, then run lint and the whole suite
# (unit tests, and end-to-end tests on the built-in lab). Extra arguments go to every pytest run.
#
# A cold lab build takes many minutes on a small machine (the llama-server compile, the ~2.5 GB vLLM
# CPU image), so the phases overlap; everything is cached after the first run:
#   1. `lab.setup` (engine, registry, host and llama.cpp images) beside the unit tests (no lab needed);
#   2. `lab.setup --vllm` (the vLLM image) beside the llama.cpp lab tests;
#   3. the vLLM lab tests.
# The lab tests mostly wait (boots, health checks, timeouts), so they run in parallel: pytest-xdist
# workers, one test file each at a time (files keep their order), each worker with a lab of its own
# (LLMFLEET_TEST_LAB_WORKERS, default 3; 0 runs them in this process).
# Each phase prints its wall time; pytest lists its slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
phase() { printf '== %s (t+%ds)\n' "$1" $((SECONDS - t0)); }
mkdir -p .cache
rcs=()

finish() {  # PID LOG WHAT: wait, print the log, stop the run if it failed
  local rc=0; wait "$1" || rc=$?
  phase "$3 finished (exit $rc); its output:"
  cat "$2"
  if [ "$rc" -ne 0 ]; then echo "$3 failed: the lab tests cannot run" >&2; exit 1; fi
}
tests() {  # WHAT PYTEST-ARGS...: run pytest, remember its exit code
  local what=$1; shift
  phase "$what"
  local rc=0; python -m pytest -q -rs "$@" || rc=$?
  rcs+=("$what=$rc")
}

phase "bootstrap"
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

phase "ruff, import contracts (lint-imports), types (mypy)"
ruff check .
lint-imports --no-cache
mypy

phase "lab setup: Docker engine, registry, host and llama.cpp images (log: .cache/lab-setup.log)"
invoke lab.setup > .cache/lab-setup.log 2>&1 &
pid=$!
# lab.setup starts the Docker engine first; the image-build unit tests need it
for _ in $(seq 1 120); do
  docker info >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
tests "unit tests" --durations=10 -m "not lab" "$@"
finish "$pid" .cache/lab-setup.log "lab setup"

phase "lab setup --vllm: the vLLM CPU image (log: .cache/lab-setup-vllm.log)"
invoke lab.setup --vllm > .cache/lab-setup-vllm.log 2>&1 &
pid=$!
workers=${LLMFLEET_TEST_LAB_WORKERS:-3}
par=(); [ "$workers" -gt 0 ] && par=(-n "$workers" --dist loadfile)
tests "lab tests (llama.cpp)" --durations=15 -m "lab and not vllm" "${par[@]}" "$@"
finish "$pid" .cache/lab-setup-vllm.log "lab setup --vllm"
par=(); [ "$workers" -gt 0 ] && par=(-n 2 --dist loadfile)
tests "lab tests (vLLM)" --durations=5 -m "lab and vllm" "${par[@]}" "$@"

phase "done: ${rcs[*]}"
# every pytest run must pass; its exit 5 (no test ran) is a failure here too
for r in "${rcs[@]}"; do [ "${r##*=}" -eq 0 ] || exit 1; done
