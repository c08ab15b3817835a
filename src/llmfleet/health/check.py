"""Staged health checks of a freshly started release.

Stages, each with its own time budget and a progress line:

1. ``unit``: the systemd unit is active;
2. ``container``: the engine's container is running;
3. ``health``: ``GET /health`` answers 200. llama.cpp answers 503 while it loads; vLLM does not
   listen until it has loaded (connections are refused or, through the SSH tunnel, reset). This
   stage gets the service's ``load_timeout_s`` (minutes for a 27B model);
4. ``models``: ``GET /v1/models`` lists the served name;
5. ``residency``: what the engine itself reported while loading (llama.cpp's layers and buffers per
   device, vLLM's weights and KV cache tokens) and nvidia-smi's GPU memory per process, compared with
   the plan (``llmfleet.health.residency``). A layer off the GPU, weights in host memory beyond the
   plan, weights far from the plan or a KV cache below context x concurrency fail here, quoting the
   engine's line, whatever the decode speed; a line the log does not hold is a WARN naming it;
6. ``completion``: a streamed chat completion; time to first token and decode tok/s are measured and
   compared with a floor (``decode_floor``: the service's or host's setting, else the fleet's own
   earlier measurements of the same combination, else the planner's sanity bound).

HTTP goes to a local port that the caller forwards over SSH, so no firewall opening is needed.
Every loop is bounded in count and in time. The SSE parsing and the arithmetic are pure functions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmfleet.knowledge.release_state import UnitProbe as UnitProbe

if TYPE_CHECKING:  # httpx loads when a check runs: a deploy with nothing to check never needs it
    import httpx

    from llmfleet.health.residency import Residency
    from llmfleet.health.speed_history import FleetGate
    from llmfleet.inventory.services import HostSettings, Service
    from llmfleet.knowledge.planner import PlanSummary

# Without any floor of its own (a plan without ``health_floor_tokps``) the floor falls back to a
# fraction of the realistic low end. Residency is decided by the engine's own report (stage
# ``residency``); the speed floor only catches what that report cannot show.
DEFAULT_FLOOR_FRACTION = 0.25
MAX_POLLS = 10_000
PROMPT = "Count from one to one hundred, separated by spaces."


# ---------------------------------------------------------------------------------------------
# Pure parts


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any] | str]:
    """Server-sent events of an OpenAI stream -> each ``data:`` JSON object, or ``"[DONE]"``.

    Comments (``:``), other fields (``event:``, ``id:``) and blank lines are skipped; a ``data:``
    that is not JSON is skipped too (an engine's keep-alive, say), never a crash.
    """
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if not payload:
            continue
        if payload == "[DONE]":
            yield "[DONE]"
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


def chunk_text(chunk: dict[str, Any]) -> str:
    """The generated text a chat-completion chunk carries (content or reasoning)."""
    out = []
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            for k in ("content", "reasoning_content", "reasoning"):
                v = delta.get(k)
                if isinstance(v, str):
                    out.append(v)
        text = choice.get("text")
        if isinstance(text, str):
            out.append(text)
    return "".join(out)


def chunk_error(chunk: dict[str, Any]) -> str | None:
    err = chunk.get("error")
    if err is None:
        return None
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


@dataclass(frozen=True)
class StreamStats:
    tokens: int
    ttft_s: float | None
    decode_tokps: float | None
    total_s: float
    usage_tokens: int | None = None
    engine_tokps: float | None = None
    text: str = ""
    whole_stream: bool = False  # decode_tokps is tokens over the whole stream, prefill included (see below)


def stream_stats(t_start: float, events: list[tuple[float, dict[str, Any]]], t_end: float) -> StreamStats:
    """Time to first token and decode speed from timestamped chunks.

    Tokens: ``usage.completion_tokens`` when the engine reports it, else one per chunk that carries
    text (both engines stream one token per chunk). Decode tok/s counts the tokens after the first
    over the time from the first to the last text chunk, so prefill is not in it. An engine that sends
    its tokens in fewer than two chunks, or all at one instant (a busy API server coalesces them), gives
    no such span: then the figure is the tokens over the whole stream, prefill included (a lower bound,
    ``whole_stream``), when there are at least two tokens.
    """
    text_times: list[float] = []
    text_parts: list[str] = []
    usage_tokens: int | None = None
    engine_tokps: float | None = None
    for t, chunk in events:
        piece = chunk_text(chunk)
        if piece:
            text_times.append(t)
            text_parts.append(piece)
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            usage_tokens = usage["completion_tokens"]
        timings = chunk.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("predicted_per_second"), int | float):
            engine_tokps = float(timings["predicted_per_second"])
    chunks = len(text_times)
    tokens = usage_tokens if usage_tokens is not None and usage_tokens >= chunks else chunks
    ttft = (text_times[0] - t_start) if text_times else None
    tokps: float | None = None
    if chunks >= 2:
        span = text_times[-1] - text_times[0]
        if span > 0:
            # Tokens generated after the first chunk, over the time they took.
            tokps = tokens * (chunks - 1) / chunks / span
    whole = False
    if tokps is None and tokens >= 2 and t_end > t_start:
        tokps, whole = tokens / (t_end - t_start), True
    return StreamStats(
        tokens=tokens, ttft_s=ttft, decode_tokps=tokps, total_s=t_end - t_start,
        usage_tokens=usage_tokens, engine_tokps=engine_tokps, text="".join(text_parts)[:200], whole_stream=whole,
    )


def realistic_tokps(plan: PlanSummary | None) -> float | None:
    """The planner's realistic batch-1 decode figure (the low end of its speed model's range)."""
    return plan.realistic_low if plan is not None else None


def model_floor_tokps(plan: PlanSummary | None) -> float | None:
    """The planner's own health floor (``health_floor_tokps``): a sanity bound from its speed model
    (docs/planner.md "Health floor"). None when the plan has none."""
    return plan.health_floor_tokps if plan is not None else None


@dataclass(frozen=True)
class Floor:
    """The decode speed below which a deploy fails, and where that figure came from."""

    tokps: float | None
    source: str


def _explicit(settings: Any, name: str) -> bool:
    return settings is not None and name in getattr(settings, "model_fields_set", set())


def decode_floor(service: Service, settings: HostSettings | None = None, plan: PlanSummary | None = None,
                 fleet: FleetGate | None = None) -> Floor:
    """The floor for one service, first match wins:

    1. the service's ``health.min_tokps`` (an absolute figure);
    2. the service's ``health.floor_fraction`` when set explicitly, times the planner's realistic figure;
    3. the host's ``llmfleet_health_min_tokps``;
    4. the host's ``llmfleet_health_floor_fraction`` times the realistic figure;
    5. the fleet's own measurements: a fraction of the median decode of earlier healthy runs of the
       same card, engine, image, model, quant and context class (``health.speed_history``);
    6. the planner's ``health_floor_tokps`` (a sanity bound below every public measurement of the card);
    7. the default 0.25 times the realistic figure (a plan without its own floor).

    A fraction of 0 turns the floor off. No realistic figure (no plan) means no floor, and says so.
    An absolute floor is for engines that do not run on the card the plan is for: the lab's CPU
    engines stand in for a simulated card, so the lab inventory declares ``min_tokps`` (docs/deploy.md).
    Whether the weights are on the GPU is decided by the residency stage from the engine's own
    report, not by this floor.
    """
    h = service.health
    realistic = realistic_tokps(plan)
    if h.min_tokps is not None:
        return Floor(float(h.min_tokps), f"the service's health.min_tokps {h.min_tokps:g} tok/s")
    fraction: float | None = None
    who = "default"
    if _explicit(h, "floor_fraction"):
        fraction, who = float(h.floor_fraction), "the service's health.floor_fraction"
    elif settings is not None and settings.health_min_tokps is not None:
        return Floor(float(settings.health_min_tokps),
                     f"the host's llmfleet_health_min_tokps {settings.health_min_tokps:g} tok/s")
    elif settings is not None and settings.health_floor_fraction is not None:
        fraction, who = float(settings.health_floor_fraction), "the host's llmfleet_health_floor_fraction"
    if fraction is None:
        if fleet is not None:
            return Floor(fleet.tokps, fleet.source)
        own = model_floor_tokps(plan)
        if own is not None:
            return Floor(own, f"the planner's floor {own:.1f} tok/s: a sanity bound below every public measurement "
                              "of this card class (docs/planner.md)")
        fraction = DEFAULT_FLOOR_FRACTION
    if fraction <= 0:
        return Floor(None, f"decode floor disabled ({who} is 0)")
    if realistic is None:
        return Floor(None, "no realistic decode figure from the planner; floor not applied")
    return Floor(realistic * fraction,
                 f"{fraction:g} x the planner's realistic {realistic:.1f} tok/s ({who})")


@dataclass(frozen=True)
class SpeedVerdict:
    ok: bool
    message: str
    floor: float | None


def judge_speed(measured: float | None, floor: Floor) -> SpeedVerdict:
    if floor.tokps is None:
        return SpeedVerdict(True, floor.source, None)
    if measured is None:
        return SpeedVerdict(False, "the stream gave too few tokens to measure decode speed", floor.tokps)
    if measured < floor.tokps:
        return SpeedVerdict(
            False,
            f"decode {measured:.1f} tok/s is below the floor {floor.tokps:.1f} tok/s ({floor.source}): the "
            f"model is probably not resident on the GPU (CPU offload); check `invoke plan` and the engine log",
            floor.tokps,
        )
    return SpeedVerdict(True, f"decode {measured:.1f} tok/s >= floor {floor.tokps:.1f} tok/s ({floor.source})",
                        floor.tokps)


def metrics_series_count(text: str, prefix: str) -> int:
    """Samples in a Prometheus text exposition whose metric name starts with ``prefix`` (comments and
    other series skipped; never raises)."""
    if not prefix:
        return 0
    return sum(1 for line in text.splitlines() if line.startswith(prefix) and not line.startswith("#"))


def models_list_ids(body: Any) -> list[str]:
    data = body.get("data") if isinstance(body, dict) else None
    ids: list[str] = []
    for m in data or []:
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            ids.append(m["id"])
        if isinstance(m, dict) and isinstance(m.get("aliases"), list):
            ids.extend(a for a in m["aliases"] if isinstance(a, str))
    return ids


# ---------------------------------------------------------------------------------------------
# The checker (I/O through injected callables and httpx)


@dataclass
class StageResult:
    name: str
    ok: bool
    seconds: float
    message: str


@dataclass
class HealthReport:
    ok: bool
    stages: list[StageResult] = field(default_factory=list)
    ttft_s: float | None = None
    decode_tokps: float | None = None
    tokens: int | None = None
    floor_tokps: float | None = None
    realistic_tokps: float | None = None
    floor_source: str = ""
    residency: dict[str, Any] | None = None  # residency.Residency.to_dict()

    @property
    def failed(self) -> StageResult | None:
        return next((s for s in self.stages if not s.ok), None)

    @property
    def message(self) -> str:
        f = self.failed
        if f is None:
            return "healthy" + (f", decode {self.decode_tokps:.1f} tok/s" if self.decode_tokps else "")
        return f"stage {f.name} failed: {f.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": "healthy" if self.ok else "unhealthy",
            "stages": [s.__dict__ for s in self.stages],
            "ttft_s": self.ttft_s,
            "decode_tokps": self.decode_tokps,
            "tokens": self.tokens,
            "floor_tokps": self.floor_tokps,
            "realistic_tokps": self.realistic_tokps,
            **({"floor_source": self.floor_source} if self.floor_source else {}),
            **({"residency": self.residency} if self.residency is not None else {}),
        }


class _StageFailed(Exception):
    pass


@dataclass
class HealthChecker:
    """Run the stages against one service.

    ``probe`` returns the unit/container state (one SSH round trip); ``base_url`` is the forwarded
    local URL of the engine. ``progress`` gets one line per stage and per notable wait.
    """

    probe: Callable[[], UnitProbe]
    base_url: str
    served_name: str
    api_key: str | None = None
    load_timeout_s: float = 900
    stage_timeout_s: float = 60
    max_tokens: int = 64
    floor: Floor = Floor(None, "no floor given")
    realistic: float | None = None
    measure_speed: bool = True
    # The residency check (one SSH round trip after /v1/models answers): None skips the stage.
    residency: Callable[[], Residency] | None = None
    # A wait polls soon after it starts, then less often: poll_min_s, doubled up to poll_interval_s
    # (a tiny model answers /health within a fraction of a second; a 27B one takes minutes).
    poll_min_s: float = 0.05
    poll_interval_s: float = 0.5
    probe_every_s: float = 5.0
    progress: Callable[[str], None] = lambda line: None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # the unit/container state the switch's own round trip answered: the first stages start from it
    initial: UnitProbe | None = None
    # An exporter (no model): instead of /health, /v1/models and a completion, wait until /metrics
    # answers 200 with a series whose name starts with this (knowledge/exporters.py).
    metrics_series: str | None = None
    metrics_path: str = "/metrics"  # where it is read; with metrics_series "" any 200 there passes (the gateway)
    _last_probe: tuple[float, UnitProbe] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial is not None:
            self._last_probe = (self.clock(), self.initial)

    def _probe(self, max_age_s: float = 0.0) -> UnitProbe:
        """The unit/container state; one answered less than ``max_age_s`` ago is reused (one round
        trip serves the unit and the container stages when both are already fine)."""
        last = self._last_probe
        if last is not None and max_age_s > 0 and self.clock() - last[0] <= max_age_s:
            return last[1]
        p = self.probe()
        self._last_probe = (self.clock(), p)
        return p

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def run(self) -> HealthReport:
        report = HealthReport(ok=False, realistic_tokps=self.realistic, floor_source=self.floor.source)
        stages: list[tuple[str, Callable[[httpx.Client], str]]] = [
            ("unit", self._unit),
            ("container", self._container),
        ]
        if self.metrics_series is not None:
            stages.append(("metrics", self._metrics))
        else:
            stages += [("health", self._health), ("models", self._models)]
            if self.residency is not None:
                stages.append(("residency", lambda c: self._residency(report)))
            if self.measure_speed:
                stages.append(("completion", lambda c: self._completion(c, report)))
        import httpx

        # Plain HTTP (the local end of the SSH tunnel) never uses TLS: no CA bundle to load (~25 ms).
        with httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(10.0, connect=5.0), trust_env=False,
                          verify=False) as c:  # plain HTTP to the tunnel's end, or a gateway's own TLS (not verified)
            for name, fn in stages:
                t0 = self.clock()
                try:
                    msg = fn(c)
                    report.stages.append(StageResult(name, True, round(self.clock() - t0, 3), msg))
                    self.progress(f"  {name:<10} ok    {self.clock() - t0:6.1f}s  {msg}")
                except _StageFailed as exc:
                    report.stages.append(StageResult(name, False, round(self.clock() - t0, 3), str(exc)))
                    self.progress(f"  {name:<10} FAIL  {self.clock() - t0:6.1f}s  {exc}")
                    return report
        report.ok = True
        return report

    # -- stages ----------------------------------------------------------------------------------

    def _poll(self, timeout: float, step: Callable[[], tuple[bool, str]], what: str) -> str:
        deadline = self.clock() + timeout
        last = "no answer yet"
        pause = min(self.poll_min_s, self.poll_interval_s)
        for _ in range(MAX_POLLS):
            done, last = step()
            if done:
                return last
            now = self.clock()
            if now >= deadline:
                break
            self.sleep(min(pause, max(deadline - now, 0.0)))
            pause = min(pause * 2, self.poll_interval_s)
        raise _StageFailed(f"{what} not reached within {timeout:.0f}s (last: {last})")

    def _unit(self, _c: Any) -> str:
        first = [True]

        def step() -> tuple[bool, str]:
            p = self._probe(max_age_s=2.0 if first[0] else 0.0)
            first[0] = False
            if p.unit == "failed":
                raise _StageFailed("systemd unit failed (start limit hit or compose exited)")
            return p.unit == "active", f"unit {p.unit}"

        return self._poll(self.stage_timeout_s, step, "unit active")

    def _container(self, _c: Any) -> str:
        seen_exit = [0]
        first = [True]

        def step() -> tuple[bool, str]:
            p = self._probe(max_age_s=2.0 if first[0] else 0.0)
            first[0] = False
            if p.container == "running":
                return True, "container running"
            if p.container in {"exited", "dead"}:
                seen_exit[0] += 1
                if seen_exit[0] >= 2:
                    raise _StageFailed(f"container {p.container} with exit code {p.exit_code}")
            return False, f"container {p.container or 'absent'}, unit {p.unit}"

        return self._poll(self.stage_timeout_s, step, "container running")

    def _health(self, c: httpx.Client) -> str:
        import httpx

        last_probe = [self.clock()]
        bad = [0]
        started = self.clock()
        announced = [started]

        def step() -> tuple[bool, str]:
            try:
                r = c.get("/health", timeout=httpx.Timeout(5.0, connect=3.0))
                if r.status_code == 200:
                    return True, f"/health 200 after {self.clock() - started:.1f}s"
                state = f"/health {r.status_code}" + (" (loading)" if r.status_code == 503 else "")
            except httpx.TransportError as exc:
                state = f"not listening yet ({type(exc).__name__})"
            now = self.clock()
            if now - last_probe[0] >= self.probe_every_s:
                last_probe[0] = now
                p = self.probe()
                if p.unit == "failed" or p.container in {"exited", "dead", None}:
                    bad[0] += 1
                    if bad[0] >= 2:
                        raise _StageFailed(
                            f"engine stopped while loading: unit {p.unit}, container {p.container or 'absent'}"
                            + (f" (exit {p.exit_code})" if p.exit_code is not None else "")
                        )
                else:
                    bad[0] = 0
            if now - announced[0] >= 15:
                announced[0] = now
                self.progress(f"  health     ...   {now - started:6.1f}s  {state}")
            return False, state

        return self._poll(self.load_timeout_s, step, "/health 200")

    def _metrics(self, c: httpx.Client) -> str:
        """An exporter: /metrics answers 200 and carries its own series (a bare 200 could be anything
        listening on the port)."""
        import httpx

        series = self.metrics_series or ""
        path = self.metrics_path
        started = self.clock()
        bad = [0]
        last_probe = [started]

        def step() -> tuple[bool, str]:
            try:
                r = c.get(path, timeout=httpx.Timeout(10.0, connect=3.0))
                if r.status_code == 200 and not series:
                    return True, f"{path} 200 after {self.clock() - started:.1f}s"
                if r.status_code == 200:
                    found = metrics_series_count(r.text, series)
                    if found:
                        return True, (f"/metrics 200 with {found} {series}* sample{'s' if found != 1 else ''} "
                                      f"after {self.clock() - started:.1f}s")
                    state = f"{path} 200 without {series}* series"
                else:
                    state = f"{path} {r.status_code}"
            except httpx.TransportError as exc:
                state = f"not listening yet ({type(exc).__name__})"
            now = self.clock()
            if now - last_probe[0] >= self.probe_every_s:
                last_probe[0] = now
                p = self.probe()
                bad[0] = bad[0] + 1 if p.unit == "failed" or p.container in {"exited", "dead", None} else 0
                if bad[0] >= 2:
                    raise _StageFailed(f"exporter stopped: unit {p.unit}, container {p.container or 'absent'}"
                                       + (f" (exit {p.exit_code})" if p.exit_code is not None else ""))
            return False, state

        return self._poll(self.stage_timeout_s, step, f"{path} with {series}* series" if series else f"{path} 200")

    def _models(self, c: httpx.Client) -> str:
        import httpx

        def step() -> tuple[bool, str]:
            try:
                r = c.get("/v1/models", headers=self._headers())
            except httpx.TransportError as exc:
                return False, f"/v1/models: {type(exc).__name__}"
            if r.status_code in (401, 403):
                raise _StageFailed(f"/v1/models answered {r.status_code}: the API key was refused")
            if r.status_code != 200:
                return False, f"/v1/models {r.status_code}"
            try:
                ids = models_list_ids(r.json())
            except ValueError:
                return False, "/v1/models answered with something that is not JSON"
            if self.served_name in ids:
                return True, f"/v1/models lists {self.served_name!r}"
            raise _StageFailed(f"/v1/models lists {ids[:5]!r}, not the served name {self.served_name!r}")

        return self._poll(self.stage_timeout_s, step, f"/v1/models listing {self.served_name!r}")

    def _residency(self, report: HealthReport) -> str:
        assert self.residency is not None
        try:
            verdict = self.residency()
        except Exception as exc:  # noqa: BLE001 - host output or a dropped round trip: a WARN, never a crash
            report.residency = {"status": "warn", "findings": [{"status": "warn", "what": "evidence",
                                                                "message": f"could not be read: {exc}"}]}
            return f"WARN: the engine's load report could not be read ({type(exc).__name__}: {exc})"
        report.residency = verdict.to_dict()
        if verdict.status == "fail":
            raise _StageFailed(verdict.message)
        return verdict.message

    def _completion(self, c: httpx.Client, report: HealthReport) -> str:
        import httpx

        body = {
            "model": self.served_name,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,  # an exact token count for the measurement; only in this probe
        }
        deadline = self.clock() + self.stage_timeout_s
        events: list[tuple[float, dict[str, Any]]] = []
        t0 = self.clock()
        try:
            with c.stream("POST", "/v1/chat/completions", json=body, headers=self._headers(),
                          timeout=httpx.Timeout(self.stage_timeout_s, connect=5.0)) as r:
                if r.status_code != 200:
                    detail = r.read()[:300].decode("utf-8", "replace")
                    raise _StageFailed(f"chat completion answered {r.status_code}: {detail}")
                for n, ev in enumerate(iter_sse(r.iter_lines())):
                    if ev == "[DONE]":
                        break
                    assert isinstance(ev, dict)
                    err = chunk_error(ev)
                    if err:
                        raise _StageFailed(f"chat completion error: {err}")
                    events.append((self.clock(), ev))
                    if self.clock() > deadline or n > 20 * self.max_tokens + 100:
                        raise _StageFailed(f"chat completion did not finish within {self.stage_timeout_s:.0f}s")
        except httpx.TransportError as exc:
            raise _StageFailed(f"chat completion: {type(exc).__name__}: {exc}") from None
        stats = stream_stats(t0, events, self.clock())
        report.ttft_s = stats.ttft_s
        report.decode_tokps = stats.decode_tokps
        report.tokens = stats.tokens
        if stats.tokens == 0:
            raise _StageFailed("chat completion streamed no tokens")
        verdict = judge_speed(stats.decode_tokps, self.floor)
        report.floor_tokps = verdict.floor
        ttft = f"{stats.ttft_s * 1000:.0f} ms" if stats.ttft_s is not None else "?"
        speed = f"{stats.decode_tokps:.1f} tok/s" if stats.decode_tokps is not None else "? tok/s"
        if not verdict.ok:
            said = "" if stats.decode_tokps is not None else f" ({stats.tokens} token(s) in {len(events)} chunk(s): {stats.text[:60]!r})"
            raise _StageFailed(verdict.message + said)
        how = " (over the whole stream: the engine sent its tokens in one burst)" if stats.whole_stream else ""
        return f"{stats.tokens} tokens, TTFT {ttft}, decode {speed}{how}; {verdict.message}"

