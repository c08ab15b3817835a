"""``invoke provision`` beside an equivalent ``ansible-playbook``: a first run (bare -> provisioned) and the
converged (no-change) run, on two identical bare lab hosts, with their end states compared.

Brings up its own uniquely named lab (``llmfleet-pv<hex>``) from a generated copy of ``inventory/lab/``
(so it never disturbs another lab) with two bare Debian 12 hosts of the same card, so that their desired
state is the same (R580): ``gpu-bare-02`` is provisioned by ``invoke provision`` and ``gpu-bare-05`` by
``ansible-playbook bench/ansible/provision.yml`` (ansible-core's apt, template, dpkg_selections, user,
file, systemd_service and reboot modules; the same packages and versions, files, holds, group, folders,
Docker runtime and persistence unit, a reboot when the driver changed). The lab is torn down at the end.

Ansible comes from its own virtual environment, ``.cache/provision-bench/ansible-venv`` (git-ignored;
created once with ``pip install ansible-core==2.17.7`` through this machine's configured package
index). Its apt module needs python3-apt on the host, which the lab's package repository does not carry:
before anything is measured, python3-apt, python-apt-common and distro-info-data (Debian 12's .debs,
fetched once into ``.cache/provision-bench/debs`` with this machine's own ``apt-get download``, so this
machine must be Debian 12 too) are installed with ``dpkg -i`` on BOTH hosts, so they start alike.
ansible-playbook runs with ``bench/ansible/ansible.cfg`` (pipelining, no interpreter discovery,
OpenSSH ControlPersist as Ansible's default), the lab's key and user, and host keys checked against the
lab's known_hosts.

What it measures, each as the wall time of the whole command (process start included):

1. first run: ``invoke provision --host gpu-bare-02 --yes --json`` on the bare host, then
   ``ansible-playbook -l gpu-bare-05`` on the other (one after the other, in that order);
2. cross-checks (not timed): what ``invoke provision --check`` says of the Ansible host (``converged``
   when the playbook reached llmfleet's desired state) and the tasks ``ansible-playbook --check`` would
   change on the llmfleet host;
3. converged run: ``--runs`` (default 5) runs of each, interleaved (llmfleet, ansible, llmfleet, ...):
   median, min and max; for llmfleet also its own in-run seconds and round trips (from ``--json``);
   every llmfleet run must say ``converged`` and every playbook run ``changed=0``; the ratio of the
   medians (ansible / llmfleet);
4. end state: ``dpkg-query -W`` (every package, version and status), ``apt-mark showhold``, the managed
   files (content, mode, owner) and /etc/docker/daemon.json, the folders, the deploy user's groups, the
   Docker and persistence units, the driver nvidia-smi reports, read on both hosts through
   ``docker exec`` and compared: every difference is printed.

The goal it checks: a converged host checked in under 1 s (whole command), at least 10x faster than the
playbook's no-change run.

Needs the lab set up once (``invoke lab.setup``) and Docker. Run from the project root:

    .venv/bin/python bench/provision_bench.py [--runs 5] [--json] [--keep]

Every subprocess has a time-out and every loop a bound; it talks to loopback and the lab's hosts only
(besides the one-time pip install and apt-get download above, through this machine's configured sources).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_load import load  # noqa: E402

from llmfleet.provision.desired import DRIVER_PIN_FILE, JOURNALD_FILE, LIMITS_FILE  # noqa: E402

KEY = ROOT / ".lab" / "id_ed25519"
LOCK = ROOT / ".lab" / "images.lock"
ANSIBLE_DIR = ROOT / "bench" / "ansible"
PLAYBOOK = ANSIBLE_DIR / "provision.yml"
ANSIBLE_CFG = ANSIBLE_DIR / "ansible.cfg"
CACHE = ROOT / ".cache" / "provision-bench"  # git-ignored (/.cache/)
VENV = CACHE / "ansible-venv"
DEBS = CACHE / "debs"
ANSIBLE_CORE = "2.17.7"
PY_APT = ("python3-apt", "python-apt-common", "distro-info-data")
LLMFLEET_HOST = "gpu-bare-02"  # Tesla T4
ANSIBLE_HOST = "gpu-bare-05"  # Tesla T4: the same desired state
DEPLOY_USER = "deploy"
FIRST_RUN_TIMEOUT_S = 1200
CONVERGED_TIMEOUT_S = 300
MAX_RUNS = 50
GOAL_S = 1.0
GOAL_RATIO = 10.0

# ---------------------------------------------------------------------------------------------
# Pure helpers


def summarize(xs: Iterable[float]) -> dict[str, Any]:
    """n, median, min, max (seconds, 3 decimals) and every value; None figures for no values."""
    vals = [float(x) for x in xs]
    if not vals:
        return {"n": 0, "median_s": None, "min_s": None, "max_s": None, "all_s": []}
    return {"n": len(vals), "median_s": round(statistics.median(vals), 3), "min_s": round(min(vals), 3),
            "max_s": round(max(vals), 3), "all_s": [round(v, 3) for v in vals]}


def recap(text: str, host: str) -> dict[str, int]:
    """The host's counts in ansible-playbook's PLAY RECAP (ok, changed, unreachable, failed, skipped, ...);
    {} when the recap has no line for it."""
    for line in reversed(text.splitlines()):
        words = line.split()
        if words[:2] == [host, ":"]:
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
    return {}


def changed_tasks(text: str, host: str) -> list[str]:
    """The tasks (and handlers) ansible-playbook reported ``changed`` for the host, in order."""
    out: list[str] = []
    task = ""
    for line in text.splitlines():
        m = re.match(r"(?:TASK|RUNNING HANDLER) \[(.*)\]", line)
        if m:
            task = m.group(1)
        elif line.startswith(f"changed: [{host}]") and task and task not in out:
            out.append(task)
    return out


def state_script(folders: Sequence[str], user: str) -> str:
    """A sh script that prints a host's provisioned state in ``== section`` blocks (run as root)."""
    q = shlex.quote
    files = (DRIVER_PIN_FILE, LIMITS_FILE, JOURNALD_FILE, "/etc/docker/daemon.json")
    lines = ["echo '== packages (dpkg-query -W)'",
             "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' | sort",
             "echo '== holds (apt-mark showhold)'", "apt-mark showhold | sort"]
    for f in files:
        lines += [f"echo {q('== file ' + f)}", f"stat -c '%a %U:%G' {q(f)} 2>&1", f"cat {q(f)} 2>&1; echo"]
    for d in [*folders, posixdir(JOURNALD_FILE)]:
        lines += [f"echo {q('== folder ' + d)}", f"stat -c '%F %a %U:%G' {q(d)} 2>&1"]
    lines += [f"echo {q('== groups of ' + user)}", f"id -nG {q(user)} 2>&1"]
    for unit in ("docker.service", "nvidia-persistenced.service"):
        lines += [f"echo '== unit {unit} (is-enabled, is-active)'", f"systemctl is-enabled {unit} 2>&1",
                  f"systemctl is-active {unit} 2>&1"]
    lines += ["echo '== driver (nvidia-smi)'", "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1"]
    return "\n".join(lines) + "\n"


def posixdir(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def parse_state(text: str) -> dict[str, str]:
    """``== section`` blocks -> {section: its text}."""
    out: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:]
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def compare(a: dict[str, str], b: dict[str, str], a_name: str, b_name: str) -> list[str]:
    """Every section that differs, as a unified diff (a -> b); [] when both states are the same."""
    out = []
    for section in dict.fromkeys([*a, *b]):
        x, y = a.get(section), b.get(section)
        if x == y:
            continue
        diff = difflib.unified_diff((x or "").splitlines(keepends=True), (y or "").splitlines(keepends=True),
                                    fromfile=f"{a_name}", tofile=f"{b_name}", n=0)
        out.append(f"{section}:\n" + "".join(ln for ln in diff if not ln.startswith("@@")))
    return out


def model_folders(inventory: Path) -> list[str]:
    """The llmfleet root and the services' model folders the inventory's group_vars name."""
    data = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text()) or {}
    out = [str(data.get("llmfleet_root") or "/opt/llmfleet")]
    for svc in data.get("llmfleet_services") or []:
        path = (svc or {}).get("model_path")
        folder = posixdir(str(path).rstrip("/")) if path else ""
        if folder and folder != "/" and folder not in out:
            out.append(folder)
    return out


# ---------------------------------------------------------------------------------------------
# Set-up: Ansible, python3-apt


def ensure_ansible(log: Callable[[str], None]) -> Path:
    """ansible-playbook from the bench's own virtual environment (made once)."""
    exe = VENV / "bin" / "ansible-playbook"
    if exe.exists():
        res = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
        if f"core {ANSIBLE_CORE}]" in res.stdout:
            return exe
    log(f"installing ansible-core {ANSIBLE_CORE} into {VENV.relative_to(ROOT)}")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"ansible-core=={ANSIBLE_CORE}"], check=True,
                   timeout=900)
    return exe


def ensure_debs(log: Callable[[str], None]) -> list[Path]:
    """python3-apt and its two missing dependencies as Debian 12 .debs (apt-get download, once)."""
    have = {p.name.split("_")[0]: p for p in DEBS.glob("*.deb")}
    if all(n in have for n in PY_APT):
        return [have[n] for n in PY_APT]
    osr = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    if "VERSION_CODENAME=bookworm" not in osr:
        raise SystemExit(f"python3-apt for the lab's Debian 12 hosts: put {', '.join(PY_APT)} .debs (bookworm) "
                         f"in {DEBS} (this machine is not Debian 12, apt-get download would fetch others)")
    DEBS.mkdir(parents=True, exist_ok=True)
    log(f"apt-get download {' '.join(PY_APT)} into {DEBS.relative_to(ROOT)}")
    subprocess.run(["apt-get", "download", "-q", *PY_APT], cwd=DEBS, check=True, timeout=300, capture_output=True)
    have = {p.name.split("_")[0]: p for p in DEBS.glob("*.deb")}
    return [have[n] for n in PY_APT]


def install_debs(container: str, debs: Sequence[Path]) -> None:
    """dpkg -i the .debs on a lab host (copied through docker exec: docker cp cannot write its tmpfs)."""
    folder = "/var/tmp/provision-bench"
    subprocess.run(["docker", "exec", container, "mkdir", "-p", folder], check=True, timeout=60)
    for deb in debs:
        with deb.open("rb") as fh:
            subprocess.run(["docker", "exec", "-i", container, "sh", "-c", f"cat > {folder}/{deb.name}"], stdin=fh,
                           check=True, timeout=60)
    res = subprocess.run(["docker", "exec", container, "sh", "-c",
                          f"dpkg -i {folder}/*.deb && rm -rf {folder} && python3 -c 'import apt'"],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"{container}: python3-apt did not install:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")


# ---------------------------------------------------------------------------------------------
# The two commands


class Runner:
    def __init__(self, inv: Path, tmp: Path, known: Path, ansible: Path) -> None:
        self.inv, self.tmp = inv, tmp
        invoke = Path(sys.executable).parent / "invoke"
        self.invoke = [str(invoke)] if invoke.exists() else [sys.executable, "-m", "invoke"]
        self.ansible = ansible
        self.llmfleet_env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(known),
                                 INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "audit.jsonl"), COLUMNS="250")
        home = tmp / "ansible-home"
        self.ansible_env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_CFG), ANSIBLE_HOME=str(home),
                                ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp / "cp"),
                                ANSIBLE_SSH_COMMON_ARGS=f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
                                ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")

    def llmfleet_argv(self, host: str, *extra: str) -> list[str]:
        return [*self.invoke, "--search-root", str(ROOT), "provision", "-i", str(self.inv), "--host", host, *extra]

    def ansible_argv(self, host: str, *extra: str) -> list[str]:
        return [str(self.ansible), "-i", str(self.inv), "-l", host, str(PLAYBOOK), *extra]

    def timed(self, argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, subprocess.CompletedProcess]:
        t0 = time.perf_counter()
        res = subprocess.run(argv, cwd=self.tmp, capture_output=True, text=True, timeout=timeout, env=env)
        return time.perf_counter() - t0, res

    def llmfleet(self, host: str, *extra: str, timeout: float = CONVERGED_TIMEOUT_S) -> tuple[float, dict[str, Any]]:
        """One ``invoke provision --json`` run: (wall seconds, the host's result); a failed run stops the bench."""
        wall, res = self.timed(self.llmfleet_argv(host, *extra, "--json"), self.llmfleet_env, timeout)
        try:
            doc = json.loads(res.stdout)["hosts"][0]
        except (ValueError, KeyError, IndexError):
            raise SystemExit(f"invoke provision {host} (exit {res.returncode}):\n{res.stdout[-3000:]}\n"
                             f"{res.stderr[-3000:]}") from None
        if res.returncode != 0:
            raise SystemExit(f"invoke provision {host} (exit {res.returncode}): {doc.get('result')}: "
                             f"{doc.get('message')}\n{json.dumps(doc.get('steps'), indent=1)[-3000:]}")
        return wall, doc

    def playbook(self, host: str, *extra: str, timeout: float = CONVERGED_TIMEOUT_S) -> tuple[float, dict[str, Any]]:
        """One ansible-playbook run: (wall seconds, its PLAY RECAP counts and the tasks it changed); a failed
        run stops the bench."""
        wall, res = self.timed(self.ansible_argv(host, *extra), self.ansible_env, timeout)
        counts = recap(res.stdout, host)
        if res.returncode != 0 or not counts or counts.get("failed") or counts.get("unreachable"):
            raise SystemExit(f"ansible-playbook {host} (exit {res.returncode}):\n{res.stdout[-4000:]}\n"
                             f"{res.stderr[-2000:]}")
        (self.tmp / f"ansible-{host}-{int(time.time() * 1000)}.log").write_text(res.stdout)
        return wall, dict(counts, changed_tasks=changed_tasks(res.stdout, host))


def host_state(container: str, script: str) -> dict[str, str]:
    res = subprocess.run(["docker", "exec", "-i", container, "sh"], input=script, capture_output=True, text=True,
                         timeout=120)
    return parse_state(res.stdout)


# ---------------------------------------------------------------------------------------------
# Printing


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def print_report(res: dict[str, Any], out: Callable[[str], None] = print) -> None:
    out(f"\nprovision bench, {res['date']}, {res['cores']} cores, {res['load_start']} at start, "
        f"{res['load_end']} at the end; lab {res['lab']}")
    out(f"llmfleet: {res['commands']['llmfleet']}")
    out(f"ansible:  {res['commands']['ansible']}")
    first = res["first_run"]
    out("\n1. first run, bare -> provisioned (wall time of the command, s)")
    out(f"   invoke provision --yes ({res['hosts']['llmfleet']}): {first['llmfleet']['wall_s']:.1f} "
        f"(in-run {first['llmfleet']['seconds']:.1f}, {first['llmfleet']['round_trips']} round trips, "
        f"{first['llmfleet']['steps_changed']} steps changed, reboot {first['llmfleet']['reboot_s']} s)")
    out(f"   ansible-playbook ({res['hosts']['ansible']}):       {first['ansible']['wall_s']:.1f} "
        f"(ok={first['ansible']['recap']['ok']} changed={first['ansible']['recap']['changed']} "
        f"skipped={first['ansible']['recap']['skipped']})")
    cross = res["cross_checks"]
    out(f"\n2. cross-checks: invoke provision --check on {res['hosts']['ansible']}: {cross['llmfleet_on_ansible_host']}; "
        f"ansible-playbook --check on {res['hosts']['llmfleet']}: changed={cross['ansible_on_llmfleet_host']['changed']}"
        + "".join(f"\n   would change: {t}" for t in cross["ansible_on_llmfleet_host"]["changed_tasks"]))
    conv = res["converged"]
    out(f"\n3. converged run, {conv['runs']} runs each, interleaved (s)")
    out(f"   {'command':<42} {'median':>7} {'min':>7} {'max':>7}  all")
    for key, label in (("llmfleet_wall", "invoke provision (whole command)"),
                       ("llmfleet_in_run", "invoke provision (its own in-run seconds)"),
                       ("ansible_wall", "ansible-playbook (whole command)")):
        s = conv[key]
        out(f"   {label:<42} {_f(s['median_s']):>7} {_f(s['min_s']):>7} {_f(s['max_s']):>7}  "
            + " ".join(f"{v:.3f}" for v in s["all_s"]))
    out(f"   llmfleet round trips per converged run: {conv['llmfleet_round_trips']}; playbook recap: "
        f"{conv['ansible_recap']}")
    out(f"   1-minute load average before each pair of runs: {conv['load_before_each']}")
    out(f"   ratio of the medians (ansible-playbook / invoke provision): {conv['ratio']:.1f}x")
    goal = res["goal"]
    out(f"   goal: converged under {GOAL_S:.0f} s: {'met' if goal['under_1s'] else 'NOT met'}; at least "
        f"{GOAL_RATIO:.0f}x faster than the playbook: {'met' if goal['ratio_10x'] else 'NOT met'}")
    out(f"\n4. end state, {res['hosts']['llmfleet']} (llmfleet) vs {res['hosts']['ansible']} (ansible-playbook): "
        + ("the same" if not res["differences"] else f"{len(res['differences'])} difference(s)"))
    for d in res["differences"]:
        out("   " + d.rstrip().replace("\n", "\n   "))


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="converged runs of each command")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--keep", action="store_true", help="leave the bench's lab (and its files) afterwards")
    args = ap.parse_args()
    if not 1 <= args.runs <= MAX_RUNS:
        ap.error(f"--runs between 1 and {MAX_RUNS}")
    from llmfleet.lab import hosts

    if not LOCK.exists():
        print("the lab is not set up: run `invoke lab.setup` first", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    ansible = ensure_ansible(log)
    debs = ensure_debs(log)
    lab = f"llmfleet-pv{secrets.token_hex(3)}"
    names = {"llmfleet": LLMFLEET_HOST, "ansible": ANSIBLE_HOST}
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
                           "load_start": load(), "lab": lab, "hosts": names, "ansible_core": ANSIBLE_CORE}
    log(f"machine: {res['load_start']}")
    tmp = Path(tempfile.mkdtemp(prefix="llmfleet-pvbench-"))
    known = tmp / "known_hosts"
    try:
        inv = hosts.generate_inventory(ROOT / "inventory" / "lab", tmp / "inventory", key_path=KEY, lock_path=LOCK)
        t0 = time.monotonic()
        hosts.up(str(inv), lab=lab, names=list(names.values()), known_hosts=known, key_path=KEY, log=log)
        log(f"lab {lab} up: {time.monotonic() - t0:.1f}s")
        for h in names.values():
            install_debs(f"{lab}-{h}", debs)
        log(f"python3-apt installed on {', '.join(names.values())}")
        run = Runner(inv, tmp, known, ansible)
        res["commands"] = {"llmfleet": " ".join(run.llmfleet_argv(LLMFLEET_HOST, "--json")),
                           "ansible": " ".join(run.ansible_argv(ANSIBLE_HOST))}

        # 1. first run
        log("first run: invoke provision")
        wall, doc = run.llmfleet(LLMFLEET_HOST, "--yes", timeout=FIRST_RUN_TIMEOUT_S)
        if doc["result"] != "changed":
            raise SystemExit(f"{LLMFLEET_HOST}: the first run was {doc['result']}, not changed: {doc['message']}")
        first_l = {"wall_s": round(wall, 3), "seconds": doc["seconds"], "round_trips": doc["round_trips"],
                   "steps_changed": sum(s["status"] == "changed" for s in doc["steps"]),
                   "reboot_s": doc.get("reboot_seconds"),
                   "steps_s": {s["name"]: s["seconds"] for s in doc["steps"]}}
        log(f"  {wall:.1f}s")
        log("first run: ansible-playbook")
        wall, counts = run.playbook(ANSIBLE_HOST, timeout=FIRST_RUN_TIMEOUT_S)
        res["first_run"] = {"llmfleet": first_l, "ansible": {"wall_s": round(wall, 3), "recap": counts}}
        log(f"  {wall:.1f}s")

        # 2. each tool's view of the other's host
        _, doc = run.llmfleet(ANSIBLE_HOST, "--check")
        _, counts = run.playbook(LLMFLEET_HOST, "--check")
        res["cross_checks"] = {"llmfleet_on_ansible_host": f"{doc['result']} ({len(doc['steps'])} steps)",
                               "llmfleet_on_ansible_host_steps": doc["steps"],
                               "ansible_on_llmfleet_host": counts}

        # 3. converged runs, interleaved
        walls_l: list[float] = []
        in_run: list[float] = []
        trips: set[int] = set()
        walls_a: list[float] = []
        recaps: set[str] = set()
        loads: list[float] = []
        for i in range(args.runs):
            loads.append(round(os.getloadavg()[0], 2))
            wall, doc = run.llmfleet(LLMFLEET_HOST)
            if doc["result"] != "converged":
                raise SystemExit(f"{LLMFLEET_HOST}: converged run {i + 1} was {doc['result']}: {doc['message']}")
            walls_l.append(wall)
            in_run.append(doc["seconds"])
            trips.add(doc["round_trips"])
            wall, counts = run.playbook(ANSIBLE_HOST)
            if counts.get("changed"):
                raise SystemExit(f"{ANSIBLE_HOST}: the playbook's run {i + 1} changed {counts['changed']} task(s)")
            walls_a.append(wall)
            recaps.add(" ".join(f"{k}={v}" for k, v in counts.items() if k in ("ok", "changed", "skipped")))
            log(f"converged run {i + 1}/{args.runs}: llmfleet {walls_l[-1]:.3f}s, ansible {wall:.3f}s "
                f"(load {loads[-1]:.1f} before)")
        conv = {"runs": args.runs, "llmfleet_wall": summarize(walls_l), "llmfleet_in_run": summarize(in_run),
                "ansible_wall": summarize(walls_a), "llmfleet_round_trips": sorted(trips),
                "ansible_recap": "; ".join(sorted(recaps)), "load_before_each": loads}
        conv["ratio"] = round(conv["ansible_wall"]["median_s"] / conv["llmfleet_wall"]["median_s"], 2)
        res["converged"] = conv
        res["goal"] = {"under_1s": conv["llmfleet_wall"]["median_s"] < GOAL_S,
                       "under_1s_every_run": conv["llmfleet_wall"]["max_s"] < GOAL_S,
                       "ratio_10x": conv["ratio"] >= GOAL_RATIO}

        # 4. end states
        script = state_script(model_folders(inv), DEPLOY_USER)
        a, b = (host_state(f"{lab}-{h}", script) for h in (LLMFLEET_HOST, ANSIBLE_HOST))
        res["differences"] = compare(a, b, f"{LLMFLEET_HOST} (llmfleet)", f"{ANSIBLE_HOST} (ansible-playbook)")
        res["state_sections"] = list(a)
        res["load_end"] = load()
    finally:
        if args.keep:
            log(f"kept: lab {lab} (`invoke lab.down --name {lab}`), files in {tmp}")
        else:
            hosts.down(lab, known_hosts=known)
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
