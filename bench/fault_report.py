"""Fault report: inject each fault on a lab host and print what happened.

    .venv/bin/python bench/fault_report.py [--host gpu-v100-01] [--only NAME,...] [--json]

Needs `invoke lab.setup` once. Brings up its own uniquely named lab host from a generated copy of
inventory/lab/ (a short confirmation timeout and a fast watchdog in its host_vars), then runs the
scenarios of llmfleet.lab.faults one after the other (the secrets scan last: every deploy of the run
carries an API key, and the scan looks for it in everything the run left behind). Columns: the fault, the step it hit, the
outcome (the deploy's result, or what the host did by itself), the release serving afterwards
(`current`, with /health 200 asked on the host), seconds from the injection until it served, what was
lost (releases gone, audit lines rewritten), and whether the next plain deploy converged.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.lab import faults as F  # noqa: E402
from llmfleet.lab import hosts, setup  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="gpu-v100-01", help="lab host to bring up")
    ap.add_argument("--only", default="", help=f"comma list of: {', '.join(F.FAULTS)}")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    chosen = [f.strip() for f in args.only.split(",") if f.strip()] or list(F.FAULTS)
    unknown = [f for f in chosen if f not in F.FAULTS]
    if unknown:
        print(f"--only: unknown fault {unknown[0]!r}; known: {', '.join(F.FAULTS)}", file=sys.stderr)
        return 2
    lab = f"llmfleet-fr{secrets.token_hex(3)}"
    results: list[F.FaultResult] = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        inv = hosts.generate_inventory(ROOT / "inventory" / "lab", Path(tmp) / "inventory",
                                       key_path=setup.KEY_PATH, lock_path=setup.LOCK_PATH)
        F.prepare_inventory(inv, args.host)
        known = Path(tmp) / "known_hosts"
        audit = Path(tmp) / "audit.jsonl"
        config = {"connect_timeout": 10, "command_timeout": 120, "known_hosts": str(known), "audit_log": str(audit)}
        try:
            hosts.up(str(inv), lab=lab, names=[args.host], known_hosts=known, key_path=setup.KEY_PATH)
            bench = F.FaultBench(str(inv), args.host, f"{lab}-{args.host}", config,
                                 log=(lambda _: None))
            for name in chosen:
                t0 = time.monotonic()
                try:
                    r = F.run_fault(bench, name, [audit])
                except Exception as exc:  # noqa: BLE001 - a scenario that breaks is a row, not a crash
                    r = F.FaultResult(name, "-", outcome=f"scenario error: {exc}"[:160])
                r.extra["scenario_s"] = round(time.monotonic() - t0, 1)
                results.append(r)
                if not args.json:
                    print(f"  {name}: {'ok' if r.ok else 'NOT OK'} ({r.extra['scenario_s']} s)", file=sys.stderr)
        finally:
            hosts.down(lab, known_hosts=known)
    total = round(time.monotonic() - t_all, 1)
    served = sum(1 for r in results if r.ok)
    if args.json:
        print(json.dumps({"results": [r.to_dict() for r in results], "ok": served, "of": len(results),
                          "not_injected": list(F.NOT_DONE), "total_s": total}, indent=2))
        return 0 if served == len(results) else 1
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"faults on lab host {args.host} ({total} s in all)")
    for col in ("fault", "injected at", "outcome", "serving afterwards", "time to serving s", "data lost",
                "next deploy", "ok"):
        t.add_column(col, overflow="fold")
    for r in results:
        t.add_row(escape(r.fault), escape(r.injected_at),
                  escape(r.outcome + (f" ({r.detail})" if r.detail and (not r.ok or r.extra.get("found") is not None)
                                      else "")),
                  r.serving or "NOTHING", "-" if r.time_to_serving_s is None else f"{r.time_to_serving_s:.1f}",
                  escape(r.data_lost), {True: "converged", False: "DID NOT converge", None: "-"}[r.converged],
                  "yes" if r.ok else "NO")
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(t)
    console.print(f"{served} of {len(results)} faults ended served, nothing lost, next deploy converged.")
    for r in results:
        if r.extra.get("cases"):
            console.print(escape(f"{r.fault}: " + "; ".join(
                f"{c['case']}: {'refused' if c['refused'] else 'NOT refused'} in {c['s']} s, {c['max_rss_mib']} MiB"
                for c in r.extra["cases"])))
    console.print(escape("Not injected here: " + "; ".join(F.NOT_DONE)))
    return 0 if served == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
