"""Model push throughput in the lab: `invoke models.push` beside plain scp and rsync of the same file, in one run.

    .venv/bin/python bench/model_push_bench.py [--size-mib 1024] [--hosts 1,4] [--no-resume] [--json] [--keep] [--write]

Needs `invoke lab.setup` once (the lab host image carries rsync for this comparison). Brings up its own
uniquely named lab (lab-node-01..05 from a generated copy of inventory/lab/), generates a file of
``--size-mib`` MiB (random bytes, GGUF magic first) and measures, each to 1 host and to 4 hosts at once:

- push, from here: ``models.push`` with ``--source FILE`` (local sha256, send over paramiko, sha256sum
  on the host, rename, manifest); MB/s of the send phase per host and in aggregate, and the whole
  command's wall time;
- push, host to host: ``--from lab-node-01`` (the source's OpenSSH client streams to the targets);
- push from here, seeded (4 hosts): ``models.push``'s seeding on, this machine sends one copy and
  each host holding a verified copy sends on; the bytes this machine sent against the file's size;
- scp and rsync of the same file from here to /tmp on the same hosts (OpenSSH; rsync over ssh), the
  same number of hosts at once, no verification;

then a push cut half-way (its sshd session killed) and run again: the bytes sent again against the
file's size. Every "host" is a container on this machine: all copies share its CPU cores (the figures
say what the transfer costs in CPU as much as in network). ``--write`` puts the table in docs/bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from machine_load import load  # noqa: E402

from llmfleet.inventory.ansible import load_inventory  # noqa: E402
from llmfleet.lab import hosts as lab_hosts  # noqa: E402
from llmfleet.models import push as P  # noqa: E402

HOSTS = ["lab-node-01", "lab-node-02", "lab-node-03", "lab-node-04", "lab-node-05"]
MP = "/srv/models/bench/model.gguf"
MB = 1e6


class _Done(Exception):
    """Every asked case measured: leave the try (the lab comes down in its finally)."""


def make_file(path: Path, mib: int) -> None:
    with path.open("wb") as fh:
        fh.write(b"GGUF")
        block = os.urandom(2**20)
        for i in range(mib):
            fh.write(bytes([i % 251]) + block[1:])


def clear(lab: str, hosts: list[str]) -> None:
    for h in hosts:
        subprocess.run(["docker", "exec", f"{lab}-{h}", "sh", "-c", f"rm -rf {MP} {MP}.llmfleet.* /tmp/bench.*"],
                       check=True, capture_output=True, timeout=60)


def push(inv_path: str, config: dict, targets: list[str], *, source: str | None = None, from_host: str | None = None,
         limit_rate: int | None = None, seed: bool = False) -> tuple[list[P.Outcome], float]:
    inv = load_inventory(inv_path)
    jobs = P.plan_jobs(inv, [inv.hosts[h] for h in targets], service="pushed", source=source, from_host=from_host)
    t0 = time.monotonic()
    outs = P.push(inv, jobs, config=config, options=P.Options(limit_rate=limit_rate, forks=len(targets), who="bench",
                                                              seed=seed))
    return outs, time.monotonic() - t0


def copy_cmd(tool: str, key: Path, kh: Path, port: int, src: Path, dest: str) -> list[str]:
    ssh_opts = ["-i", str(key), "-o", f"UserKnownHostsFile={kh}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes"]
    if tool == "scp":
        return ["scp", "-q", *ssh_opts, "-P", str(port), str(src), f"deploy@127.0.0.1:{dest}"]
    return ["rsync", "-a", "--inplace", "-e", " ".join(["ssh", *ssh_opts, "-p", str(port)]), str(src),
            f"deploy@127.0.0.1:{dest}"]


def plain(tool: str, inv_path: str, key: Path, kh: Path, targets: list[str], src: Path) -> float:
    """Wall seconds to copy ``src`` to every target at once with scp or rsync."""
    inv = load_inventory(inv_path)
    t0 = time.monotonic()
    procs = [subprocess.Popen(copy_cmd(tool, key, kh, int(inv.hosts[h].vars["ansible_port"]), src,
                                       f"/tmp/bench.{tool}"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for h in targets]
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"{tool} failed: {err.decode().strip()[-300:]}")
    return time.monotonic() - t0


def row(name: str, hosts: int, size: int, seconds: float, per_host: list[float] | None = None,
        wall: float | None = None) -> dict:
    per = per_host or [size / seconds]
    return {"how": name, "hosts": hosts, "per_host_MBps": round(sum(per) / len(per) / MB, 1),
            "aggregate_MBps": round(size * hosts / seconds / MB, 1), "seconds": round(seconds, 2),
            "wall_s": round(wall, 2) if wall is not None else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the lab afterwards")
    ap.add_argument("--write", action="store_true", help="write the table into docs/bench.md")
    ap.add_argument("--hosts", default="1,4", help="host counts to measure, of 1 and 4 (default 1,4); --write needs both")
    ap.add_argument("--no-resume", action="store_true", help="skip the cut-and-resume case")
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",") if x.strip()]
    if not set(counts) <= {1, 4} or (args.write and (sorted(counts) != [1, 4] or args.no_resume)):
        raise SystemExit("--hosts takes 1, 4 or 1,4; --write needs every case (--hosts 1,4, no --no-resume)")
    if not shutil.which("rsync") or not shutil.which("scp"):
        raise SystemExit("scp and rsync are needed on this machine for the comparison (apt-get install rsync)")
    work = Path(tempfile.mkdtemp(prefix="llmfleet-mbench-"))
    lab = f"llmfleet-mbench-{secrets.token_hex(2)}"
    key = ROOT / ".lab" / "id_ed25519"
    kh = work / "known_hosts"
    inv_path = lab_hosts.generate_inventory(ROOT / "inventory" / "lab", work / "inventory", key_path=key,
                                            lock_path=ROOT / ".lab" / "images.lock")
    src = work / "model.gguf"
    make_file(src, args.size_mib)
    size = src.stat().st_size
    (inv_path / "group_vars" / "lab_fleet.yml").write_text(yaml.safe_dump({"llmfleet_services": [{
        "name": "pushed", "engine": "llamacpp", "model": "m", "model_path": MP, "image": "llamacpp:lab-cpu",
        "model_source": str(src)}]}))
    config = {"known_hosts": str(kh), "connect_timeout": 10, "command_timeout": 600}
    rows: list[dict] = []
    try:
        lab_hosts.up(str(inv_path), lab=lab, names=HOSTS, known_hosts=kh, key_path=key, stage=False)
        print(f"lab {lab} up; file {size / MB:.0f} MB; load {load()}", file=sys.stderr)
        for n in counts:
            targets = HOSTS[:n]
            clear(lab, HOSTS)
            outs, wall = push(str(inv_path), config, targets, source=str(src))
            assert all(o.result == "pushed" for o in outs), [o.error for o in outs]
            span = max(o.send_seconds for o in outs)
            rows.append(row("push from here", n, size, span, [o.rate for o in outs if o.rate], wall))
            if n > 2:  # seeded: this machine sends one copy, the hosts that hold one send on (a tree)
                clear(lab, HOSTS)
                outs, wall = push(str(inv_path), config, targets, source=str(src), seed=True)
                assert all(o.result == "pushed" for o in outs), [o.error for o in outs]
                here = sum(n_ for o in outs for k, n_ in o.bytes_by_source.items() if k.endswith("(this machine)"))
                # the copies run one after another along the tree: the span is the whole send, first to last
                r = row("push from here, seeded", n, size, wall, [o.rate for o in outs if o.rate], wall)
                r["from_here_bytes"] = here
                r["from_hosts_bytes"] = sum(o.bytes_sent for o in outs) - here
                rows.append(r)
            # host to host: lab-node-01 (holding a verified copy) sends to the next n hosts
            if n == 1:
                outs, _ = push(str(inv_path), config, ["lab-node-01"], source=str(src))
            dests = HOSTS[1:1 + n]
            clear(lab, dests)
            outs, wall = push(str(inv_path), config, dests, from_host="lab-node-01")
            assert all(o.result == "pushed" for o in outs), [o.error for o in outs]
            span = max(o.send_seconds for o in outs)
            rows.append(row("push host to host", n, size, span, [o.rate for o in outs if o.rate], wall))
            for tool in ("scp", "rsync"):
                clear(lab, HOSTS)
                secs = plain(tool, str(inv_path), key, kh, targets, src)
                rows.append(row(tool, n, size, secs))
        resume = None
        if args.no_resume:
            raise _Done
        # resume after a cut half-way
        clear(lab, HOSTS)
        victim = "lab-node-01"
        part = MP + ".llmfleet.part"

        def cut() -> None:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                got = subprocess.run(["docker", "exec", f"{lab}-{victim}", "sh", "-c", f"stat -c %s {part} || echo 0"],
                                     capture_output=True, text=True).stdout.strip()
                if got.isdigit() and int(got) > size // 2:
                    subprocess.run(["docker", "exec", f"{lab}-{victim}", "pkill", "-9", "-f", "sshd: deploy"])
                    return
                time.sleep(0.2)

        killer = threading.Thread(target=cut)
        killer.start()
        first, _ = push(str(inv_path), config, [victim], source=str(src), limit_rate=100 * 2**20)
        killer.join()
        again, _ = push(str(inv_path), config, [victim], source=str(src))
        resume = {"first_result": first[0].result, "first_error": first[0].error, "sent_before_cut": first[0].bytes_sent,
                  "resumed_from": again[0].bytes_resumed, "sent_again": again[0].bytes_sent, "size": size,
                  "sent_again_fraction": round(again[0].bytes_sent / size, 3), "second_result": again[0].result}
    except _Done:
        pass
    finally:
        if not args.keep:
            lab_hosts.down(lab, known_hosts=kh)
        shutil.rmtree(work, ignore_errors=True)
    by = {(r["how"], r["hosts"]): r for r in rows}
    for r in rows:
        for tool in ("scp", "rsync"):
            base = by.get((tool, r["hosts"]))
            if base and r["how"].startswith("push"):
                r[f"vs_{tool}"] = round(r["aggregate_MBps"] / base["aggregate_MBps"], 2)
    doc = {"size_bytes": size, "rows": rows, "resume": resume, "cores": os.cpu_count(), "load": load()}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    lines = ["| copy | hosts | per host MB/s | aggregate MB/s | seconds (send) | wall s | vs scp | vs rsync |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['how']} | {r['hosts']} | {r['per_host_MBps']} | {r['aggregate_MBps']} | {r['seconds']} | "
                     f"{r['wall_s'] if r['wall_s'] is not None else '-'} | {r.get('vs_scp', '-')} | "
                     f"{r.get('vs_rsync', '-')} |")
    for r in rows:
        if "from_here_bytes" in r:
            lines += ["", f"Seeded, {r['hosts']} hosts: this machine sent {r['from_here_bytes']:,} bytes "
                          f"({r['from_here_bytes'] / size:.2f}x the file), the hosts {r['from_hosts_bytes']:,}; its "
                          "seconds are the whole push (the copies run along the tree, one after another)."]
    if resume is not None:
        lines.append("")
        why = (resume["first_error"] or resume["first_result"]).split(": ", 1)[-1].split(";")[0]
        lines.append(f"Resume after a cut half-way (`{why}`): the re-run "
                     f"resumed from {resume['resumed_from']:,} bytes and sent {resume['sent_again']:,} of {size:,} "
                     f"({resume['sent_again_fraction']:.0%}); result {resume['second_result']}.")
    table = "\n".join(lines)
    print(table)
    if args.write:
        from planner_floor_table import write_between_markers

        write_between_markers("model-push-bench", table, ROOT / "docs" / "bench.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
