"""Liveness by work done on a real vLLM (CPU) in the lab: the engine core process stopped while the API
process lives keeps /health at 200 and hangs every completion (the way a hung engine behaves in
vllm#39863). The host's watchdog must judge it hung, status must say so, and the unit must be restarted
with the evidence in the audit log. The llama.cpp counterpart (its main loop held while its HTTP threads
answer) is ``test_faults.py::test_engine_loop_frozen_with_health_still_200_is_judged_hung_and_restarted``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from llmfleet.lab import faults as F
from llmfleet.release import store as R
from llmfleet.release.deploy import DeployOptions, deploy_host
from tests.lab.test_faults import status_health

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

HOST = "gpu-4090-01"
SERVICE = "tiny-vllm"
ROOT = "/opt/llmfleet"
WATCHDOG = {"interval_s": 5, "failures": 2, "max_restarts_per_hour": 3, "probe_timeout_s": 5, "stall_window_s": 20}


class Host:
    """What ``faults.watch_until_restarted`` and ``status_health`` need of a lab host."""

    def __init__(self, lab, config) -> None:
        self.lab, self.inventory_path, self.host, self.config = lab, lab.inventory_path, HOST, config

    def exec(self, script: str, **kw) -> subprocess.CompletedProcess:
        return self.lab.exec(HOST, ["sh", "-c", script], check=False, **kw)


@pytest.fixture
def fast_watchdog(lab):
    """The host's watchdog every 5 s for this test; the host's variables as they were afterwards."""
    lab.ensure_hosts(HOST)
    path = Path(lab.inventory_path) / "host_vars" / f"{HOST}.yml"
    before = path.read_text() if path.exists() else None
    data = (yaml.safe_load(before) or {}) if before else {}
    path.write_text(yaml.safe_dump({**data, "llmfleet_watchdog": WATCHDOG}, sort_keys=True))
    yield
    if before is None:
        path.unlink()
    else:
        path.write_text(before)
    lab.exec(HOST, ["systemctl", "stop", f"llmfleet-{SERVICE}.service"], check=False, timeout=180)


def test_vllm_engine_core_stopped_with_its_api_alive_is_judged_hung_and_restarted(lab, fast_watchdog, tmp_path):
    config = dict(lab.config, audit_log=str(tmp_path / "audit.jsonl"))
    lines: list[str] = []
    slow = {"health": {"load_timeout_s": 900, "stage_timeout_s": 120, "min_tokps": 1, "max_tokens": 16},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "LLMFLEET_LAB_TEST": "liveness"}}
    o = deploy_host(lab.inventory_path, HOST, config=config, options=DeployOptions(who="tester", overrides=slow),
                    log=lines.append)
    assert o.result in {"deployed", "unchanged"}, o.reason + "\n" + "\n".join(lines[-20:])
    h = Host(lab, config)
    container = f"llmfleet-{SERVICE}"
    started = h.exec(f"docker inspect --format '{{{{.State.StartedAt}}}}' {container}").stdout.strip()
    # the engine core: vLLM's second process in the container (its log lines say "(EngineCore pid=N)")
    found = h.exec("pgrep -f '[E]ngineCore'").stdout.split()  # the pattern does not match this shell
    assert len(found) == 1, f"expected one EngineCore process on the host, found {found}"
    h.exec(f"kill -STOP {int(found[0])}")
    t0 = time.monotonic()
    try:
        health = h.exec("curl -fsS -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:8000/health").stdout
        assert health == "200", "the fault must leave the API process answering /health"
        seen = F.watch_until_restarted(h, started, t0, timeout=300, service=SERVICE,
                                       health=status_health(h, SERVICE))
    finally:
        h.exec(f"kill -CONT {int(found[0])} 2>/dev/null")
    print(f"\nvLLM engine core stopped: {seen}")  # the figures docs/services.md quotes (pytest -s)
    assert seen["restarted_after_s"] is not None, seen
    assert "hung" in seen["health_seen"], seen
    audit = [a for a in F.parse_audit(h.exec(f"cat {R.audit_path(ROOT)}").stdout)
             if a.get("action") == "watchdog-restart" and a.get("service") == SERVICE]
    assert audit and audit[-1]["result"] == "restarted", audit
    assert audit[-1]["detail"].startswith("2 failed judgements in a row; last: idle; a 1-token completion did not "
                                          "finish within 5 s"), audit[-1]
