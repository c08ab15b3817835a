"""How many hosts one controller drives: a simulated fleet of 200 / 1,000 hosts on loopback.

Two steps:

  python bench/fleet_scale_bench.py record     # once per change of the remote scripts (needs the lab)
  python bench/fleet_scale_bench.py run        # the measurement (no lab needed)

``record`` brings up one lab host of its own (lab-node-01 of inventory/lab, a real llama.cpp service),
deploys it, then runs ``facts``, ``status --no-metrics``, ``upgrade --check`` and a no-change ``deploy``
against it while recording every command llmfleet sends and what the host answered, into
bench/data/simfleet-lab-node.json (with the images.lock entries its releases were rendered with: ``run``
renders the same ones whatever the lab's images are now); then removes the lab host.
tests/test_simfleet_recording.py replays those commands against the committed recording (no lab) and
fails, naming this command, when the code sends one it does not hold.

``run`` starts a simulated fleet (``python -m llmfleet.lab.simfleet``: one process, one loopback port per
host, paramiko's server side answering from the recording, each answer delayed by the time the real
host took) and, for each fleet size and forks value, runs the controller as its own process
(``llmfleet status --no-metrics`` and ``llmfleet upgrade --check``; ``--commands deploy``: a no-change
``deploy``, which with ``--hosts 1 --forks 1`` is one deploy against a host that answers like the lab
host did, on its own CPU) and reports its wall time, CPU time
(user+sys, whole process, and per host past a one-host run), peak memory (max RSS), peak open file
descriptors and threads (sampled every 50 ms from /proc), and how many hosts failed. The server's
unmatched commands are printed: a stale recording shows up as failures, never as a fast run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "bench" / "data" / "simfleet-lab-node.json"
RECORD_HOST = "lab-node-01"
RECORD_COMMAND = "python bench/fleet_scale_bench.py record"
LAB_KEY = ROOT / ".lab" / "id_ed25519"
sys.path.insert(0, str(ROOT / "src"))


def controller_argv(command: str, inv: Path | str, forks: int) -> list[str]:
    """The controller's command line for one measured command against the simulated fleet's inventory
    (tests/test_simfleet_recording.py replays the same against the committed recording)."""
    return {
        "status": ["status", "-i", str(inv), "--group", "simfleet", "--no-metrics", "--json",
                   "--forks", str(forks), "--timeout", "120"],
        "upgrade-check": ["upgrade", "-i", str(inv), "--group", "simfleet", "--check", "--json",
                          "--forks", str(forks)],
        # a no-change deploy (as recorded: every service on its current, healthy release)
        "deploy": ["deploy", "-i", str(inv), "--group", "simfleet", "--json", "--forks", str(forks)],
        "facts": ["facts", "-i", str(inv), "--group", "simfleet", "--json"],  # (no --forks: facts has none)
    }[command]


def recorded_lock(lock_path: Path, host_vars: dict) -> str:
    """The lock text of the images the recorded host's services name, as the recording run resolved them."""
    from llmfleet.images.lock import ImageLock, load_lock, render_lock

    lock = load_lock(lock_path)
    keys = {s.get("image") for s in host_vars.get("llmfleet_services") or []} & set(lock.images)
    return render_lock(ImageLock(images={k: lock.images[k] for k in sorted(keys)}, path=str(lock_path)))


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}/{os.cpu_count()} cores"


# -- record ------------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    from llmfleet.cli.main import program

    try:
        program.run(["llmfleet", *argv])  # exits (SystemExit) on a failure; exit=False would hide its code
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


def record(out: Path) -> None:
    from llmfleet.inventory.ansible import load_inventory
    from llmfleet.lab import hosts as lab_hosts
    from llmfleet.lab.simfleet import Recording, recorder

    work = Path(tempfile.mkdtemp(prefix="llmfleet-simrec-"))
    lab = f"llmfleet-simrec-{secrets.token_hex(2)}"
    inv_dir = lab_hosts.generate_inventory(ROOT / "inventory" / "lab", work / "inventory",
                                           key_path=ROOT / ".lab" / "id_ed25519",
                                           lock_path=ROOT / ".lab" / "images.lock")
    known = work / "known_hosts"
    cfg = work / "cfg.yaml"
    cfg.write_text(json.dumps({"llmfleet": {"ssh": {"known_hosts": str(known)},
                                            "audit_log": str(work / "audit.jsonl")}}))
    base = ["-f", str(cfg)]
    sel = ["-i", str(inv_dir)]
    try:
        t0 = time.monotonic()
        lab_hosts.up(str(inv_dir), lab=lab, names=[RECORD_HOST], known_hosts=known,
                     key_path=ROOT / ".lab" / "id_ed25519")
        print(f"lab host up in {time.monotonic() - t0:.1f}s", flush=True)
        rc = _cli([*base, "deploy", *sel, "--host", RECORD_HOST])
        print(f"first deploy: exit {rc}", flush=True)
        if rc != 0:
            raise SystemExit("the first deploy of the lab host failed; nothing recorded")
        host_vars = dict(load_inventory(str(inv_dir)).hosts[RECORD_HOST].vars)
        rec = Recording(host=RECORD_HOST, host_vars=host_vars,
                        recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        notes="lab-node-01 of inventory/lab (llama.cpp, tiny model), deployed and healthy",
                        images_lock=recorded_lock(ROOT / ".lab" / "images.lock", host_vars))
        runs = {
            "facts": ["facts", *sel, "--host", RECORD_HOST, "--json"],
            "status": ["status", *sel, "--host", RECORD_HOST, "--no-metrics", "--json"],
            "upgrade-check": ["upgrade", *sel, "--group", "lab_fleet", "--host", RECORD_HOST, "--check", "--json"],
            "deploy": ["deploy", *sel, "--host", RECORD_HOST, "--json"],
        }
        for label, argv in runs.items():
            for _ in range(2):  # twice: both answers of anything that changes between runs are kept
                with recorder(rec, label):
                    rc = _cli([*base, *argv])
            print(f"recorded {label}: exit {rc}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        # The controller side of the simulated fleet sets its own key and lock paths.
        for k in ("ansible_ssh_private_key_file", "llmfleet_images_lock", "ansible_port"):
            rec.host_vars.pop(k, None)
        out.write_text(rec.to_json())
        print(f"{out}: {len(rec.entries)} commands recorded", flush=True)
    finally:
        lab_hosts.down(lab, known_hosts=known)


# -- run ---------------------------------------------------------------------------------------------


def write_fleet(work: Path, ports: list[int], key_type: str, key_b64: str, host_vars: dict, *,
                images_lock: str = "", key_path: Path = LAB_KEY) -> tuple[Path, Path]:
    """The simulated fleet's inventory, known_hosts and configuration under ``work``. The images lock is the
    recording's own (``images_lock``: the digests its releases were rendered with), else the lab's."""
    import yaml

    from llmfleet.lab.simfleet import fleet_inventory, known_hosts_text

    hv = dict(host_vars)
    hv["ansible_ssh_private_key_file"] = str(key_path)
    if images_lock:
        (work / "images.lock").write_text(images_lock)
        hv["llmfleet_images_lock"] = str(work / "images.lock")
    else:
        hv["llmfleet_images_lock"] = str(ROOT / ".lab" / "images.lock")
    inv = work / f"inventory-{len(ports)}.yml"
    inv.write_text(yaml.safe_dump(fleet_inventory(ports, hv), sort_keys=False))
    known = work / "known_hosts"
    known.write_text(known_hosts_text(ports, key_type, key_b64))
    cfg = work / "cfg.yaml"
    cfg.write_text(json.dumps({"llmfleet": {"ssh": {"known_hosts": str(known), "connect_timeout": 30,
                                                    "command_timeout": 120},
                                            "audit_log": str(work / "audit.jsonl")}}))
    return inv, cfg


def measure(argv: list[str], timeout: float, src: Path = ROOT / "src", cache: Path | None = None) -> dict:
    """Run the controller as a process; wall, CPU, max RSS from wait4, peak fds/threads sampled from /proc.
    ``cache``: its cache folder (the simulated hosts' speeds must not reach the user's own history)."""
    env = dict(os.environ, PYTHONPATH=str(src), COLUMNS="160")
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    code = "import sys; from llmfleet.cli.main import program; program.run(['llmfleet', *sys.argv[1:]])"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak_fd = peak_thr = 0
    deadline = t0 + timeout
    out = bytearray()
    os.set_blocking(proc.stdout.fileno(), False)
    while True:
        try:
            chunk = proc.stdout.read()
            if chunk:
                out += chunk
        except (BlockingIOError, TypeError):
            pass
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            peak_fd = max(peak_fd, len(os.listdir(f"/proc/{proc.pid}/fd")))
            with open(f"/proc/{proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("Threads:"):
                        peak_thr = max(peak_thr, int(line.split()[1]))
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    wall = time.monotonic() - t0
    rest = proc.stdout.read() or b""
    out += rest
    proc.returncode = os.waitstatus_to_exitcode(status)
    failed: int | None = None
    results: dict[str, int] = {}
    try:
        doc = json.loads(out.decode())
        if "rows" in doc:
            failed = len(doc.get("unreachable", []))
        elif "hosts" in doc:
            for h in doc["hosts"]:
                results[h.get("result")] = results.get(h.get("result"), 0) + 1
            failed = sum(n for r, n in results.items() if r not in {"check", "unchanged", "deployed"})
    except (ValueError, AttributeError):
        pass
    if proc.returncode != 0:  # kept for a look: which hosts failed and why
        keep = Path(tempfile.mkstemp(prefix="llmfleet-controller-", suffix=".json")[1])
        keep.write_bytes(bytes(out))
        results["output"] = str(keep)  # type: ignore[assignment]
    return {"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
            "maxrss_mib": round(ru.ru_maxrss / 1024, 1), "peak_fds": peak_fd, "peak_threads": peak_thr,
            "rc": proc.returncode, "failed_hosts": failed, "results": results}


def run(sizes: list[int], forks_list: list[int], commands: list[str], latency: float, repeat: int,
        sources: dict[str, Path]) -> None:
    from llmfleet.lab.simfleet import Recording

    if not RECORDING.exists():
        raise SystemExit(f"{RECORDING} is missing: run `{RECORD_COMMAND}` (needs the lab)")
    rec = Recording.load(RECORDING)
    print(f"recording: {RECORDING.relative_to(ROOT)} ({len(rec.entries)} commands, host {rec.host}, "
          f"{rec.recorded_at}); latency x{latency}; load {load()}", flush=True)
    results = []
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"llmfleet-simfleet-{n}-"))
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        server = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.lab.simfleet", "--recording", str(RECORDING), "--hosts", str(n),
             "--authorized-key", str(ROOT / ".lab" / "id_ed25519.pub"), "--out", str(work),
             "--latency", str(latency), "--max-seconds", "3000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        try:
            line = server.stdout.readline()
            if not line:
                raise SystemExit("the simulated fleet did not start")
            info = json.loads((work / "ports.json").read_text())
            lock = rec.images_lock
            inv, cfg = write_fleet(work, info["ports"], info["key_type"], info["key"], rec.host_vars, images_lock=lock)
            inv1, _ = write_fleet(work, info["ports"][:1], info["key_type"], info["key"], rec.host_vars, images_lock=lock)
            write_fleet(work, info["ports"], info["key_type"], info["key"], rec.host_vars,
                        images_lock=lock)  # known_hosts: all
            for cmd in commands:
                for side, src in sources.items():
                    # the one-host run also fills this side's cache (parsed catalogs) before the measured runs
                    cache = work / f"cache-{side}"
                    one = measure(["-f", str(cfg), *controller_argv(cmd, inv1, 1)], timeout=120, src=src,
                                  cache=cache)
                    for forks in forks_list:
                        runs = [measure(["-f", str(cfg), *controller_argv(cmd, inv, forks)], timeout=1800, src=src,
                                        cache=cache) for _ in range(repeat)]
                        walls = [r["wall_s"] for r in runs]
                        best = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
                        # the controller's CPU for each host past the first (none for a fleet of one)
                        per_host_ms = (best["cpu_s"] - one["cpu_s"]) / (n - 1) * 1000 if n > 1 else None
                        row = {"side": side, "command": cmd, "hosts": n, "forks": forks, **best,
                               "wall_spread_s": [min(walls), max(walls)],
                               "cpu_per_host_ms": round(per_host_ms, 1) if per_host_ms is not None else None, "one_host_cpu_s": one["cpu_s"],
                               "hosts_per_min": round(n / best["wall_s"] * 60), "load": load()}
                        results.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            server.stdin.close()
            try:
                tail = server.stdout.read()
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                tail = ""
            print(f"server ({n} hosts): {tail.strip()}", flush=True)
    print("\nside    command        hosts forks  wall_s (spread)     hosts/min  cpu_s  cpu/host_ms  maxrss_MiB  fds  thr  failed")
    for r in results:
        print(f"{r['side']:<7} {r['command']:<14} {r['hosts']:>5} {r['forks']:>5}  {r['wall_s']:>6} "
              f"({r['wall_spread_s'][0]}-{r['wall_spread_s'][1]})".ljust(44)
              + f"{r['hosts_per_min']:>9}  {r['cpu_s']:>5}  {'-' if r['cpu_per_host_ms'] is None else r['cpu_per_host_ms']:>11}  {r['maxrss_mib']:>10}  "
              f"{r['peak_fds']:>3}  {r['peak_threads']:>3}  {r['failed_hosts']}")
    if results:
        print(f"median wall over runs; machine load at the end {load()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", default=str(RECORDING))
    m = sub.add_parser("run")
    m.add_argument("--hosts", default="200,1000")
    m.add_argument("--forks", default="10,50,100")
    m.add_argument("--commands", default="status,upgrade-check")
    m.add_argument("--latency", type=float, default=1.0, help="scale of the recorded command times (0: none)")
    m.add_argument("--repeat", type=int, default=1)
    m.add_argument("--src", default=f"this={ROOT / 'src'}",
                   help="NAME=PATH,...: controller sources to compare, run side by side in one run "
                        "(e.g. before=/tmp/base/src,after=src from `git archive`)")
    a = p.parse_args()
    if a.cmd == "record":
        record(Path(a.out))
    else:
        run([int(x) for x in a.hosts.split(",")], [int(x) for x in a.forks.split(",")],
            [c.strip() for c in a.commands.split(",")], a.latency, max(1, a.repeat),
            {k: Path(v).resolve() for k, v in (x.split("=", 1) for x in a.src.split(","))})


if __name__ == "__main__":
    main()
