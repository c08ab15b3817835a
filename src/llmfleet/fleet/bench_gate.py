"""``upgrade --bench-gate PCT``: a host's new release may not decode more than PCT% slower than the one
it replaced; if it does, the host goes back to the replaced release and counts as failed.

Per host of the upgrade, around its deploy:

1. bench each service the deploy may change, on the release it runs now (the baseline; a short,
   fixed load: ``GATE_PARAMS``), and keep that result with that release;
2. deploy (the full deploy: its own health check and rollback stay as they are);
3. on ``deployed``: bench the new release the same way, keep the result, and compare
   (``bench.gate_verdict``: per-stream decode p50, the worst level decides);
4. slower than allowed: ``rollback_host`` to the baseline's release. The host's result becomes
   ``rolled_back`` with the figures as the reason, a failed host for the rollout: a canary batch of
   one stops the rollout there.

Measured back to back on the same host, so the baseline and the candidate see the same machine. A
host with nothing deployed yet has no baseline and is not gated (said in its log).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmfleet.errors import LlmfleetError
from llmfleet.fleet import bench as B
from llmfleet.fleet import bench_run
from llmfleet.release.decide import Result
from llmfleet.settings import Settings

#: The gate's load: one stream (the field report's figure), a short prompt, exact 64-token answers.
GATE_PARAMS = B.BenchParams(concurrency=(1,), prompt_tokens=(64,), max_tokens=64, requests=5,
                            request_timeout_s=120.0)


def _measure(inv: Any, host: str, service: str, *, config: Settings | dict[str, Any], bench_dir: str, who: str,
             params: B.BenchParams, log: Callable[[str], None]) -> tuple[dict[str, Any] | None, str]:
    try:
        run = bench_run.run_bench(inv, host, service_name=service, params=params, config=config,
                                  bench_dir=bench_dir, who=who, log=lambda line: log(f"bench gate: {line}"))
    except LlmfleetError as exc:
        return None, str(exc)
    return run.doc, ""


def gated(
    deploy: Callable[[str], Any],
    inventory: Any,
    *,
    pct: float,
    config: Settings | dict[str, Any],
    options: Any,
    services: dict[str, list[str] | None],
    log: Callable[[str], None],
    bench_dir: str | None = None,
    params: B.BenchParams = GATE_PARAMS,
    rollback: Callable[..., Any] | None = None,
) -> Callable[[str], Any]:
    """Wrap the per-host ``deploy`` of an upgrade with the bench gate (see the module docstring).

    ``services``: host -> the services its deploy changes (None: all of the host's services).
    ``rollback`` defaults to ``llmfleet.release.deploy.rollback_host``.
    """
    from llmfleet.inventory.ansible import load_inventory, settings_for

    B.gate_verdict(None, None, pct)  # the percentage's range, before any host is touched
    inv = inventory if hasattr(inventory, "hosts") else load_inventory(inventory)
    folder = bench_dir or bench_run.DEFAULT_BENCH_DIR
    who = getattr(options, "who", None) or ""
    if rollback is None:
        from llmfleet.release.deploy import rollback_host

        rollback = rollback_host

    def run(host: str) -> Any:
        def hlog(line: str) -> None:
            log(f"{host}: {line}")

        names = services.get(host) or [s.name for s in settings_for(inv.hosts[host]).services]
        baseline: dict[str, dict[str, Any]] = {}
        for name in names:
            doc, why = _measure(inv, host, name, config=config, bench_dir=folder, who=who, params=params, log=hlog)
            if doc is None:
                hlog(f"bench gate: {name}: no baseline ({why}); this service is not gated")
            else:
                baseline[name] = doc
                hlog(f"bench gate: {name}: baseline on release {doc.get('release')}: decode "
                     f"{_decode(doc)} tok/s per stream")
        outcome = deploy(host)
        if getattr(outcome, "result", None) != Result.DEPLOYED:
            return outcome
        for name, base in baseline.items():
            new_release = (getattr(outcome, "releases", None) or {}).get(name)
            if new_release == base.get("release"):
                continue  # this service did not change
            cand, why = _measure(inv, host, name, config=config, bench_dir=folder, who=who, params=params, log=hlog)
            verdict = B.gate_verdict(base, cand, pct)
            if cand is None:
                verdict = B.GateVerdict(False, f"the new release could not be benchmarked: {why}")
            hlog(f"bench gate: {name}: {'pass' if verdict.ok else 'FAIL'}: {verdict.message}")
            if verdict.ok:
                continue
            previous = str(base.get("release"))
            back = rollback(inv, host, service=name, to=previous, config=config, options=options, log=hlog)
            result = getattr(back, "result", "failed")
            reason = f"bench gate: {name}: release {new_release}: {verdict.message}"
            if result == Result.ROLLED_BACK:
                outcome.result = Result.ROLLED_BACK
                outcome.reason = f"{reason}; back on release {previous}"
                outcome.releases = {**dict(outcome.releases or {}), name: previous}
            else:
                outcome.result = Result.FAILED
                outcome.reason = (f"{reason}; ROLLBACK to {previous} FAILED: "
                                  f"{getattr(back, 'reason', '') or result}; check the host now")
            return outcome
        return outcome

    return run


def _decode(doc: dict[str, Any]) -> str:
    vals = [v for lv in B.levels_of(doc).values() if (v := lv.get("decode_tokps_p50"))]
    return f"{min(vals):.1f}" if vals else "-"
