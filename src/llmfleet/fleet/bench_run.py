"""Run a benchmark against one deployed service, and keep its result (the shell around ``bench``).

``run_bench`` for one host and service:

1. resolve the service, its API key and the current release (one SSH round trip); nothing runs
   against a service that is not deployed;
2. forward the service's port over SSH (as the health check does) and run the health check's
   stages; a failing check refuses the bench;
3. while the load runs (``llmfleet.fleet.loadgen``, level by level): sample ``nvidia-smi`` on the
   host over the same SSH connection and the engine's ``/metrics`` through the tunnel, each about
   once a second, in two bounded threads;
4. put the planner's figures for the card beside the result (``knowledge.planner.plan_for_service``;
   the plan kept in the release's manifest when the planner cannot plan it);
5. save the result as ``bench.json`` in the release's folder on the host and under the local bench
   folder (``<bench_dir>/<host>/<service>/<release>/<time>.json``).

Results are read back from the host (every kept release's ``bench.json``) or, for a release the host
no longer keeps, from the local folder.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from llmfleet.errors import CheckFailed, LlmfleetError, RemoteError, UsageError
from llmfleet.fleet import bench as B
from llmfleet.fleet import loadgen
from llmfleet.health import check as health_mod
from llmfleet.health.speed_cache import is_lab
from llmfleet.inventory.ansible import Host, Inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge import release_state
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import store
from llmfleet.settings import Settings

DEFAULT_BENCH_DIR = "~/.local/state/llmfleet/bench"
SAMPLE_EVERY_S = 1.0
MAX_SAMPLES = 20_000  # per sampler: ~5 h at one a second, far beyond any bench's bound
METRICS_TIMEOUT_S = 3.0
MAX_METRICS_BYTES = 4 * 1024 * 1024

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# Selection (no SSH)


def pick_service(host: Host, settings: HostSettings, name: str | None) -> Service:
    services = list(settings.services)
    names = [s.name for s in services]
    if name:
        for s in services:
            if s.name == name:
                return s
        from llmfleet.suggest import did_you_mean

        raise UsageError(f"host {host.name} has no service {name!r}{did_you_mean(name, names)} (services: {', '.join(names) or 'none'})")
    if not services:
        raise UsageError(f"host {host.name} has no llmfleet_services in the inventory")
    if len(services) > 1:
        raise UsageError(f"host {host.name} runs {len(services)} services ({', '.join(names)}): choose one "
                         "with --service NAME")
    return services[0]


def resolve_api_key(service: Service, where: str) -> str | None:
    from llmfleet.release.secret import resolve_secret

    return resolve_secret(service.api_key, where)


# ---------------------------------------------------------------------------------------------
# Local store


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", part) or "_"


def local_dir(bench_dir: str, host: str, service: str, release: str | None) -> Path:
    return Path(os.path.expanduser(bench_dir)) / _safe(host) / _safe(service) / _safe(release or "no-release")


def save_local(bench_dir: str, doc: dict[str, Any]) -> Path:
    """Keep every run: one file per run, named by its time; the folder is the operator's (0700)."""
    folder = local_dir(bench_dir, doc["host"], doc["service"], doc.get("release"))
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = re.sub(r"[^0-9TZ]", "", str(doc.get("time") or "")) or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = folder / f"{stamp}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}-{n}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_local(bench_dir: str, host: str, service: str, release: str) -> dict[str, Any] | None:
    """The newest local result of one release, or None."""
    folder = local_dir(bench_dir, host, service, release)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.json"), reverse=True):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if B.valid_document(doc):
            return doc
    return None


# ---------------------------------------------------------------------------------------------
# Samplers (threads, bounded)


@dataclass
class Samplers:
    """nvidia-smi over SSH and /metrics through the tunnel, about once a second each, until stopped."""

    remote: Any
    base_url: str
    engine: str
    api_key: str | None = None
    every_s: float = SAMPLE_EVERY_S
    clock: Callable[[], float] = time.monotonic
    gpu: list[B.GpuSample] = field(default_factory=list)
    metrics: list[B.MetricsSample] = field(default_factory=list)
    gpu_error: str = ""
    metrics_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Samplers:
        for fn in (self._gpu_loop, self._metrics_loop):
            t = threading.Thread(target=fn, daemon=True, name=f"llmfleet-bench-{fn.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def _gpu_loop(self) -> None:
        failures = 0
        while not self._stop.is_set() and len(self.gpu) < MAX_SAMPLES:
            t = self.clock()
            try:
                res = self.remote.run(B.gpu_query_command(), timeout=10)
                got = B.parse_gpu_sample(res.stdout, t) if res.rc == 0 else []
                if got:
                    self.gpu.extend(got)
                    failures = 0
                else:
                    failures += 1
                    self.gpu_error = (res.stderr or res.stdout).strip().splitlines()[-1:][0][:200] \
                        if (res.stderr or res.stdout).strip() else f"nvidia-smi exit {res.rc}"
            except LlmfleetError as exc:
                failures += 1
                self.gpu_error = str(exc)[:200]
            if failures >= 3:
                return  # no nvidia-smi (or no driver): no GPU figures, said in the notes
            self._stop.wait(max(0.05, self.every_s - (self.clock() - t)))

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(METRICS_TIMEOUT_S), trust_env=False,
                            verify=not self.base_url.startswith("http://"))  # no TLS, no CA bundle to load

    def _read_metrics(self, c: httpx.Client) -> bool:
        """One /metrics reading appended to ``metrics``; False (the error kept) when it failed."""
        from llmfleet.fleet.metrics import engine_metrics

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        t = self.clock()
        try:
            with c.stream("GET", "/metrics", headers=headers) as resp:
                if resp.status_code != 200:
                    raise httpx.HTTPError(f"/metrics answered {resp.status_code}")
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        break
            m = engine_metrics(self.engine, body.decode("utf-8", "replace"))
        except Exception as exc:  # noqa: BLE001 - a sampler must never stop the bench
            self.metrics_error = f"{type(exc).__name__}: {exc}"[:200]
            return False
        with self._lock:
            if len(self.metrics) < MAX_SAMPLES:
                self.metrics.append(B.MetricsSample(t=t, requests_running=m.requests_running,
                                                    requests_waiting=m.requests_waiting,
                                                    kv_cache_usage=m.kv_cache_usage))
        return True

    def read_metrics_now(self) -> bool:
        """A reading taken at once, whatever the period: a level reads the engine's metrics at its start
        and its end, so a level shorter than the period (or a sampler thread starved on a busy machine)
        still has figures."""
        with self._client() as c:
            return self._read_metrics(c)

    def _metrics_loop(self) -> None:
        failures = 0
        with self._client() as c:
            while not self._stop.is_set() and len(self.metrics) < MAX_SAMPLES:
                t = self.clock()
                if self._read_metrics(c):
                    failures = 0
                else:
                    failures += 1
                    if failures >= 3:
                        return
                self._stop.wait(max(0.05, self.every_s - (self.clock() - t)))


# ---------------------------------------------------------------------------------------------
# The plan beside the result


def plan_beside(service: Service, settings: HostSettings, remote: Any, manifest: Manifest | None,
                log: Log) -> B.PlanFigures:
    """The planner's ceiling and realistic range for this service on the host's card."""
    from llmfleet.knowledge import planner

    card: str | None = settings.gpu
    count = 1
    try:
        res = remote.run("nvidia-smi --query-gpu=name --format=csv,noheader", timeout=15)
        names = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()] if res.rc == 0 else []
        if names:
            card = names[0]
            count = len(names)
    except LlmfleetError:
        pass
    if card:
        try:
            plan = planner.plan_for_service(service, card, count)
            return B.plan_figures(plan, f"planner: {service.model} on {card}", card)
        except Exception as exc:  # noqa: BLE001 - no plan is a note, never a failed bench
            log(f"planner: {type(exc).__name__}: {exc}"[:300])
    kept = manifest.plan if manifest else None
    if isinstance(kept, dict):
        return B.plan_figures(kept, "the plan kept in the release's manifest", card)
    return B.PlanFigures(None, None, "no plan (card unknown: set llmfleet_gpu or check nvidia-smi)", card)


# ---------------------------------------------------------------------------------------------
# Running a bench


@dataclass
class BenchRun:
    """One bench: what was measured, and where it was kept."""

    doc: dict[str, Any]
    saved_host: bool = False
    saved_local: str | None = None
    others: dict[str, dict[str, Any]] = field(default_factory=dict)  # other releases' saved results


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _state(remote: Any, settings: HostSettings, service: str) -> release_state.ServiceState | None:
    res = remote.run(store.state_script(settings.root), sudo=True, timeout=60)
    if not res.ok and "@@end" not in res.stdout and "@@none" not in res.stdout:
        raise RemoteError(f"host {remote.name}: reading the releases failed: "
                          f"{(res.stderr or res.stdout).strip()[-200:]}")
    return release_state.parse_state(res.stdout).get(service)


def health_gate(remote: Any, service: Service, paths: store.Paths, base_url: str, api_key: str | None,
                log: Log) -> health_mod.HealthReport:
    """The deploy's health check, with no load wait: a service still loading is not benchmarked."""

    def probe() -> health_mod.UnitProbe:
        return store.parse_unit_probe(remote.run(store.unit_probe_script(paths), sudo=True, timeout=30).stdout)

    checker = health_mod.HealthChecker(
        probe=probe, base_url=base_url, served_name=service.public_name, api_key=api_key,
        load_timeout_s=min(service.health.stage_timeout_s, 30), stage_timeout_s=service.health.stage_timeout_s,
        max_tokens=service.health.max_tokens, floor=health_mod.Floor(None, "no floor: bench measures speed itself"),
        progress=lambda line: log(f"health:{line}"),
    )
    return checker.run()


def measure(
    base_url: str,
    service: Service,
    api_key: str | None,
    params: B.BenchParams,
    *,
    samplers: Samplers | None,
    log: Log,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[B.Level], list[str]]:
    """Every level: calibrate the prompt size once per prompt length, then each concurrency."""
    target = loadgen.Target(base_url=base_url, model=service.public_name, api_key=api_key)
    levels: list[B.Level] = []
    notes: list[str] = []
    seed = 0
    for p in params.prompt_tokens:
        ratio, note = loadgen.calibrate(target, p, params.request_timeout_s)
        words = loadgen.words_for(p, ratio)
        notes.append(f"prompt {p}: {note}")
        for c in params.concurrency:
            n = params.requests_for(c)
            bound = f"{n} requests" if n is not None else ""
            if params.duration_s is not None:
                bound += (" or " if bound else "") + f"{params.duration_s:g} s"
            log(f"level: concurrency {c}, prompt ~{p} tokens, {params.max_tokens} output tokens, {bound}")
            t0 = clock()
            if samplers is not None:
                samplers.read_metrics_now()
            results = loadgen.run_level(target, concurrency=c, words=words, max_tokens=params.max_tokens,
                                        requests=n, duration_s=params.duration_s, timeout_s=params.request_timeout_s,
                                        seed=seed, clock=clock)
            if samplers is not None:
                samplers.read_metrics_now()
            t1 = clock()
            seed += len(results) + 1
            lv = B.aggregate_level(c, p, params.max_tokens, results,
                                   samplers.gpu if samplers else (), samplers.metrics if samplers else (),
                                   window=(t0, t1))
            levels.append(lv)
            dec = "-" if lv.decode_tokps_p50 is None else f"{lv.decode_tokps_p50:.1f}"
            agg = "-" if lv.aggregate_tokps is None else f"{lv.aggregate_tokps:.1f}"
            ttft = "-" if lv.ttft_p50_s is None else f"{lv.ttft_p50_s * 1000:.0f} ms"
            log(f"  {lv.ok}/{lv.requests} ok in {lv.wall_s:.1f}s: decode p50 {dec} tok/s per stream, "
                f"aggregate {agg} tok/s, TTFT p50 {ttft}" + (f"; errors: {lv.error_samples[0]}" if lv.errors else ""))
    return levels, notes


def run_bench(
    inv: Inventory,
    host_name: str,
    *,
    service_name: str | None,
    params: B.BenchParams,
    config: Settings | dict[str, Any],
    bench_dir: str = DEFAULT_BENCH_DIR,
    who: str = "",
    log: Log = lambda line: None,
    save: bool = True,
    remote: Any = None,
) -> BenchRun:
    """Benchmark one service of one host (see the module docstring). Raises CheckFailed when the
    service is not deployed or its health check fails (nothing was measured), UsageError for bad input."""
    host = inv.hosts.get(host_name)
    if host is None:
        raise UsageError(f"{inv.path}: no host {host_name!r}")
    settings = settings_for(host)
    service = pick_service(host, settings, service_name)
    api_key = resolve_api_key(service, f"host {host.name}: service {service.name}")
    own = remote is None
    if own:
        from llmfleet.host import ssh

        remote = ssh.connect(host, config=config)
    try:
        return _run(host, settings, service, api_key, remote, params, bench_dir, who, log, save)
    finally:
        if own:
            try:
                remote.close()
            except Exception:  # noqa: BLE001,S110 - closing a dead connection must not hide the result
                pass


def _run(host: Host, settings: HostSettings, service: Service, api_key: str | None, remote: Any,
         params: B.BenchParams, bench_dir: str, who: str, log: Log, save: bool) -> BenchRun:
    st = _state(remote, settings, service.name)
    if st is None or not st.current:
        raise CheckFailed(f"host {host.name}: service {service.name} is not deployed; nothing to benchmark "
                          f"(`invoke deploy --host {host.name}` first)")
    release = st.current
    info = st.current_release
    manifest = info.manifest if info else None
    paths = store.Paths(settings.root, service.name)
    notes: list[str] = []
    lab = is_lab(host)
    if lab:
        notes.append("lab host: the engine runs on the CPU and nvidia-smi is the lab's simulator, so GPU memory is "
                     "the simulator's configured figure and the plan's card figures do not describe this engine")
    if max(params.concurrency) > service.concurrency:
        notes.append(f"the service is deployed for {service.concurrency} concurrent sequence(s) (its `concurrency`); "
                     "requests beyond that queue in the engine")
    with remote.forward(service.port, settings.reach_address_for(service)) as local_port:
        base_url = f"http://127.0.0.1:{local_port}"
        log(f"{host.name}/{service.name}: release {release}; health check through SSH (port {service.port})")
        report = health_gate(remote, service, paths, base_url, api_key, log)
        if not report.ok:
            raise CheckFailed(f"host {host.name}: service {service.name}: health check failed ({report.message}); "
                              "not benchmarking an unhealthy service")
        plan = plan_beside(service, settings, remote, manifest, log)
        samplers = Samplers(remote=remote, base_url=base_url, engine=service.engine, api_key=api_key).start()
        try:
            levels, more = measure(base_url, service, api_key, params, samplers=samplers, log=log)
        finally:
            samplers.stop()
    notes += more
    if not samplers.gpu:
        notes.append(f"no GPU memory figures: nvidia-smi gave none ({samplers.gpu_error or 'no answer'})")
    if not samplers.metrics:
        notes.append(f"no engine metrics: /metrics gave none ({samplers.metrics_error or 'no answer'})")
    image = None
    if manifest:
        image = manifest.image.get("digest") or manifest.image.get("ref")
    doc = B.result_document(host=host.name, service=service.name, engine=service.engine, release=release,
                            model=service.model, image=image, params=params, levels=levels, plan=plan,
                            time=_now(), who=who, lab=lab, notes=notes)
    run = BenchRun(doc=doc)
    if save:
        res = remote.run(store.bench_write_script(paths, release, doc), sudo=True, timeout=60)
        run.saved_host = store.parse_bench_write(res.stdout)
        if not run.saved_host:
            log(f"warning: bench.json not written on {host.name}: {(res.stderr or res.stdout).strip()[-200:]}")
        try:
            run.saved_local = str(save_local(bench_dir, doc))
        except OSError as exc:
            log(f"warning: local copy not written under {bench_dir}: {exc}")
    try:
        run.others = {k: v for k, v in read_results(remote, settings, service.name).items()
                      if k != release and B.valid_document(v)}
    except LlmfleetError:
        run.others = {}
    return run


# ---------------------------------------------------------------------------------------------
# Reading results back


def read_results(remote: Any, settings: HostSettings, service: str,
                 release_ids: list[str] | None = None) -> dict[str, dict[str, Any]]:
    paths = store.Paths(settings.root, service)
    res = remote.run(store.bench_read_script(paths, release_ids), sudo=True, timeout=60)
    return store.parse_bench(res.stdout)


def check_release_id(rid: str) -> str:
    rid = str(rid).strip()
    if not release_state.RELEASE_ID_RE.match(rid):
        raise UsageError(f"--compare {rid!r}: not a release id (like 20261129T120000Z-0123456789); see "
                         "`invoke releases --host HOST`")
    return rid


def load_pair(
    inv: Inventory,
    host_name: str,
    *,
    service_name: str | None,
    a: str,
    b: str,
    config: Settings | dict[str, Any],
    bench_dir: str = DEFAULT_BENCH_DIR,
    remote: Any = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The results of releases A and B: the host's ``bench.json`` first, else the local copy.
    Returns (doc A, doc B, where each came from). CheckFailed names a release with no result."""
    a, b = check_release_id(a), check_release_id(b)
    host = inv.hosts.get(host_name)
    if host is None:
        raise UsageError(f"{inv.path}: no host {host_name!r}")
    settings = settings_for(host)
    service = pick_service(host, settings, service_name)
    found: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    own = remote is None
    err = ""
    try:
        if own:
            from llmfleet.host import ssh

            remote = ssh.connect(host, config=config)
        got = read_results(remote, settings, service.name, [a, b])
        for rid, doc in got.items():
            if B.valid_document(doc):
                found[rid], where[rid] = doc, f"{host.name}:{store.Paths(settings.root, service.name).release(rid)}"
    except LlmfleetError as exc:
        err = str(exc)
    finally:
        if own and remote is not None:
            try:
                remote.close()
            except Exception:  # noqa: BLE001,S110
                pass
    for rid in (a, b):
        if rid not in found:
            local_doc = load_local(bench_dir, host.name, service.name, rid)
            if local_doc is not None:
                found[rid], where[rid] = local_doc, str(local_dir(bench_dir, host.name, service.name, rid))
    missing = [r for r in (a, b) if r not in found]
    if missing:
        raise CheckFailed(f"no bench result for release {', '.join(missing)} of {host.name}/{service.name} "
                          f"(on the host or under {bench_dir}){'; host: ' + err if err else ''}; run "
                          f"`invoke bench --host {host.name}` while that release is current")
    return found[a], found[b], where
