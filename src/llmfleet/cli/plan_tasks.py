"""``invoke plan``: will this model fit this card, with which engine flags, and how fast can it decode."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmfleet.cli.common import console, escape, inventory_path, load_settings, print_json
from llmfleet.cli.flags import FRACTION, POSITIVE, TOKENS, Number, fleet_task
from llmfleet.errors import CheckFailed, UsageError

if TYPE_CHECKING:
    from llmfleet.knowledge.planner import Plan

GB = 1e9
GBIT = Number(float, low=0, low_open=True, metavar="GBIT")  # Gbit/s between hosts
MICROSECONDS = Number(float, low=0, metavar="US")
TOKPS = Number(float, low=0, low_open=True, metavar="TOKPS")  # a decode target, tokens/s


def _host_settings(c, inventory: str | None, host: str):
    from llmfleet.inventory.ansible import load_inventory, settings_for

    inv = load_inventory(inventory_path(c, inventory), script_timeout=load_settings(c).inventory_timeout)
    if host not in inv.hosts:
        raise UsageError(f"{inv.path}: no host {host!r}; hosts: {', '.join(inv.hosts) or 'none'}")
    return settings_for(inv.hosts[host])


def _host_sources(c, inventory: str | None, host: str) -> tuple[dict[str, str], bool]:
    """Which inventory file set each of the host's variables, and whether it is a lab host (whose
    fleet records are kept apart: ``speed_cache.is_lab``)."""
    from llmfleet.health import speed_cache
    from llmfleet.inventory.ansible import load_inventory

    inv = load_inventory(inventory_path(c, inventory), script_timeout=load_settings(c).inventory_timeout)
    h = inv.hosts.get(host)
    return (dict(h.sources), speed_cache.is_lab(h)) if h is not None else ({}, False)


def _gpu_for(c, inventory: str | None, gpu: str | None, host: str | None):
    """A catalog card from --gpu (id, nvidia-smi name or inventory host) or from --host's llmfleet_gpu."""
    from llmfleet.knowledge.catalog import find_gpu

    if gpu:
        try:
            return find_gpu(gpu), None
        except UsageError as catalog_error:
            try:
                settings = _host_settings(c, inventory, gpu)
            except UsageError:
                raise catalog_error from None
            host = gpu
            if not settings.gpu:
                raise UsageError(f"host {gpu}: llmfleet_gpu is not set; give --gpu with a card name") from None
            return find_gpu(settings.gpu), settings
    if host:
        settings = _host_settings(c, inventory, host)
        if not settings.gpu:
            raise UsageError(f"host {host}: llmfleet_gpu is not set in the inventory; give --gpu with a card name")
        return find_gpu(settings.gpu), settings
    raise UsageError("give --gpu (catalog id, nvidia-smi name or inventory host) or --host")


def _hosts_of(c, inventory: str | None, host: str, svc) -> int:
    """The hosts a service spans: its head and its workers (groups expanded by the deploy side's rule)."""
    workers = list(getattr(svc, "workers", None) or [])
    if not workers:
        return 1
    from llmfleet.inventory.ansible import load_inventory

    try:
        from llmfleet.release.multihost import workers_of
    except ImportError:  # no multi-host deploy in this build: count the names as hosts
        return 1 + len(workers)
    inv = load_inventory(inventory_path(c, inventory), script_timeout=load_settings(c).inventory_timeout)
    return 1 + len(workers_of(inv, host, svc))


def _gather(c, inventory: str | None, host: str, accept_new_host_keys: bool):
    """The host's facts in one SSH round trip (its cards and the sizes of its services' model files)."""
    from llmfleet.host import facts as facts_mod
    from llmfleet.host import ssh
    from llmfleet.inventory.ansible import load_inventory, settings_for

    inv = load_inventory(inventory_path(c, inventory), script_timeout=load_settings(c).inventory_timeout)
    if host not in inv.hosts:
        raise UsageError(f"{inv.path}: no host {host!r}; hosts: {', '.join(inv.hosts) or 'none'}")
    h = inv.hosts[host]
    settings = settings_for(h)
    with ssh.connect(h, config=load_settings(c), accept_new_host_keys=accept_new_host_keys) as remote:
        return facts_mod.gather(remote, root=settings.root, model_paths=[s.model_path for s in settings.services if s.model_path])


def _b(n: int | float) -> str:
    return f"{n / GB:,.2f} GB" if n >= 1e8 else (f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{int(n):,} B")


def _split_rows(p: Plan) -> list[tuple[str, str]]:
    """The rows a plan over several cards or hosts adds: how it is split, the tightest card, the cost."""
    if p.gpus * p.hosts <= 1 or not p.per_gpu:
        return []
    if p.tensor_parallel_size > 1 or p.pipeline_parallel_size > 1:
        split = f"tensor parallel {p.tensor_parallel_size}" + (
            f" x pipeline parallel {p.pipeline_parallel_size} (one stage per host, Ray)" if p.hosts > 1 else "")
    else:
        split = f"llama.cpp {p.split_mode} split over {p.gpus * p.hosts} device(s)" + (
            f" ({(p.hosts - 1) * p.gpus} over RPC)" if p.hosts > 1 else "")
    g = p.per_gpu
    rows = [
        ("split", split + f"; layers per host {p.layers_per_host}"
         + (f", per device {p.layers_per_device}" if p.tensor_split else "")),
        ("per GPU", f"weights {_b(g['weights_bytes'])}, KV {_b(g['kv_cache_bytes'])} at the plan, overhead "
                    f"{_b(g['overhead_bytes'])}, budget {_b(g['budget_bytes'])}; {g['kv_heads']} KV head(s) per layer"),
    ]
    c = p.comm
    if c.get("how"):
        rows.append(("split cost", f"{c['low_us'] / 1000:.2f}-{c['high_us'] / 1000:.2f} ms per token: {c['how']}"))
    if p.deploy_adds:
        rows.append(("deploy adds", "; ".join(p.deploy_adds)))
    return rows


def fleet_measured(p: Plan, records: list[Any], overlay: list[Any]) -> dict[str, Any] | None:
    """What the fleet measured for the plan's card/engine/image/model/quant/context (the speed cache
    that ``invoke status`` and ``invoke speed`` fill; ``llmfleet.health.speed_history``), and the
    speed overlay's entry for its card class; None when there is neither."""
    import statistics

    from llmfleet.health import speed_history as sh
    from llmfleet.health import speed_overlay

    key = sh.key_for(p, p.image)
    if key is None:
        return None
    rs = sh.runs(records, key)
    others = [r for r in sh.runs(records, key, same_class=True) if r.key.image != key.image]
    entry = speed_overlay.entry_for(overlay, key)
    if not rs and not others and entry is None:
        return None
    vals = [r.tokps for r in rs]
    return {
        "key": key.to_dict(),
        "line": sh.measured_line(records, key),
        "runs": len(rs), "hosts": sorted({r.host for r in rs}),
        "min": min(vals) if vals else None, "max": max(vals) if vals else None,
        "median": statistics.median(vals) if vals else None,
        "other_images": sh.measured_line(others, key, same_class=True),
        "overlay": None if entry is None else {"line": entry.line(), "median": entry.median, "count": entry.count,
                                               "fitted_efficiency": entry.fitted, "source": entry.source},
    }


def calibration(p: Plan, overlay: list[Any]) -> tuple[float, str] | None:
    """The fitted efficiency the speed overlay holds for the plan's card class, with its source, for
    planning again with it (``PlanRequest.measured_efficiency``); None without one."""
    from llmfleet.health import speed_history as sh
    from llmfleet.health import speed_overlay

    entry = speed_overlay.entry_for(overlay, sh.key_for(p, p.image))
    if entry is None or entry.fitted is None:
        return None
    return entry.fitted, f"speed overlay: {entry.source}"


def _fleet_rows(fm: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not fm:
        return []
    rows = []
    if fm["line"]:
        rows.append(("fleet measured", fm["line"] + " (this image; `invoke speed`)"))
    if fm["other_images"]:
        rows.append(("other images", fm["other_images"] + " (same card class, other images)"))
    if fm["overlay"]:
        rows.append(("speed overlay", fm["overlay"]["line"]))
    return rows


def _fleet_sources(c) -> tuple[list[Any], list[Any]]:
    """The cached records and the configured speed overlay's entries (``llmfleet.speed_overlay``); an
    overlay that cannot be read is a warning, never the plan's failure."""
    from llmfleet.cli.common import cfg, err_console
    from llmfleet.health import speed_cache, speed_overlay

    records = speed_cache.load()
    path = cfg(c, "speed_overlay")
    if not path:
        return records, []
    try:
        text = Path(str(path)).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        err_console.print(f"[yellow]warning[/yellow]: llmfleet.speed_overlay {escape(str(path))}: {escape(exc.strerror or str(exc))}")
        return records, []
    entries, problems = speed_overlay.parse_overlay(text)
    for problem in problems:
        err_console.print(f"[yellow]warning[/yellow]: llmfleet.speed_overlay {escape(str(path))}: {escape(problem)}")
    return records, entries


def _floor_text(p: Plan) -> str:
    """The health floor with the context it is computed at: the health probe's short one, which reads
    less KV per token than the planned context, so the floor can be above that context's ceiling."""
    from llmfleet.knowledge.planner import HEALTH_PROBE_CONTEXT

    if p.health_floor_tokps is None or not p.decode_tokps_offload_eighth:
        return "none"
    probe = min(p.context, HEALTH_PROBE_CONTEXT)
    text = (f"{p.health_floor_tokps:,.1f} tok/s with the health probe's {probe:,} tokens in context (1/8 of the "
            f"layers off the GPU there: {p.decode_tokps_offload_eighth[0]:,.1f}-{p.decode_tokps_offload_eighth[1]:,.1f} tok/s)")
    if p.health_floor_tokps > p.decode_tokps_ceiling:
        text += (f"; above the ceiling at {p.context:,} tokens, where each token also reads the KV of "
                 f"{p.context:,} tokens, the health check's only {probe:,}")
    return text


def render_answer(p: Plan, floor: Any = None, *, fleet: dict[str, Any] | None = None, title: str | None = None,
                  host: str | None = None, service: bool = False, calibrated: str | None = None,
                  at: Plan | None = None) -> None:
    """The short answer (``knowledge.plan_answer``): fit, flags, speed, the deploy's floor, what next."""
    from rich.table import Table

    from llmfleet.knowledge.plan_answer import short_answer

    rows = short_answer(p, floor, measured=(fleet or {}).get("line") or None, calibrated=calibrated,
                        service=service, host=host, at=at)
    t = Table.grid(padding=(0, 2))
    t.add_column("figure", style="bold", no_wrap=True)
    t.add_column("value")
    for i, (k, v) in enumerate(rows):
        label = escape(k) if i else (f"[green]{k}[/green]" if p.fits else f"[red]{escape(k)}[/red]")
        t.add_row(label, escape(v))
    if title:
        console.print(f"[bold]{escape(title)}[/bold]")
    console.print(t)


def render_plan(p: Plan, title: str | None = None, fleet: dict[str, Any] | None = None) -> None:
    from rich.table import Table

    no_image = not p.fits and p.image is None and bool(p.notes) and p.notes[0].startswith("REFUSED: no ")
    verdict = "[green]FITS[/green]" if p.fits else "[red]NO IMAGE RUNS ON THIS CARD[/red]" if no_image else \
        "[red]DOES NOT FIT[/red]"
    where = f"{p.gpus} x {p.gpu_name}" + (f" on each of {p.hosts} hosts" if p.hosts > 1 else "")
    t = Table(title=title or f"{p.model} ({p.quant}) on {where}, {p.engine}: {verdict}",
              show_header=False, title_justify="left")
    t.add_column("figure", style="bold")
    t.add_column("value")
    kv = f"{p.kv_bytes_per_token:,} B/token (full attention)"
    if p.kv_sliding_bytes_per_token:
        kv += f" + {p.kv_sliding_bytes_per_token:,} B/token up to {p.kv_sliding_window} tokens (sliding window)"
    if p.kv_state_bytes_per_sequence:
        kv += f" + {_b(p.kv_state_bytes_per_sequence)}/sequence (linear-attention state)"
    rows = [
        ("parameters", f"{p.params / 1e9:.2f} B ({p.params:,})"),
        ("weights", f"{_b(p.weights_bytes)} ({p.weights_bytes:,} bytes); on the GPU(s): {_b(p.weights_gpu_bytes)}"),
        ("KV cache", kv + f"; KV dtype {p.kv_dtype}"),
        ("KV at the plan", f"{_b(p.kv_cache_bytes)} for {p.concurrency} x {p.context} tokens"),
        ("overhead", f"{_b(p.overhead_bytes)} (CUDA context, activations, CUDA graphs, buffers)"),
        ("memory", f"{_b(p.memory_bytes)} ({p.memory_bytes / 2**30:.1f} GiB) on {p.gpus * p.hosts} card(s); "
                   f"plan uses {p.gpu_memory_utilization:.0%} = {_b(p.budget_bytes)}"),
        ("resident", ("yes: every layer on the GPU" if p.resident else
                      f"[red]no[/red]: {p.gpu_layers} of {p.total_layers} layers would fit")),
        ("max context", f"{p.max_context_tokens:,} tokens at {p.concurrency} concurrent sequence(s)"),
        ("max concurrency", f"{p.max_concurrency:,} sequences at {p.context:,} tokens"),
        ("decode ceiling", f"{p.decode_tokps_ceiling:,.1f} tok/s at batch 1 with {p.context:,} tokens in context "
                           "(bandwidth / bytes read per token: the weights and that sequence's KV)"),
        ("decode realistic", f"{p.decode_tokps_realistic[0]:,.1f}-{p.decode_tokps_realistic[1]:,.1f} tok/s "
                             f"with {p.context:,} tokens in context "
                             f"({p.efficiency[0]:.0%}-{p.efficiency[1]:.0%} of the ceiling; speed model below)"),
        ("health floor", _floor_text(p)),
        ("image", p.image or "none in the catalog runs on this card"),
        ("engine flags", shlex.join(p.engine_args)),
    ]
    rows[9:9] = _split_rows(p)
    at = next(i for i, (k, _v) in enumerate(rows) if k == "decode realistic") + 1
    rows[at:at] = _fleet_rows(fleet)
    for k, v in rows:
        t.add_row(k, v if k in ("resident",) else escape(v))
    console.print(t)
    for n in p.notes:
        console.print(f"  - {escape(n)}")
    if p.alternatives:
        alt = Table(title="what would fit, best first", title_justify="left")
        for col in ("#", "change", "why", "max context", "max seqs", "decode tok/s", "weights"):
            alt.add_column(col)
        for a in p.alternatives:
            lo, hi = a["decode_tokps_realistic"]
            alt.add_row(str(a["rank"]), escape(a["flags"]), escape(a["why"]), f"{a['max_context_tokens']:,}",
                        str(a["max_concurrency"]), f"{lo:.1f}-{hi:.1f}", _b(a["weights_bytes"]))
        console.print(alt)
    console.print("[dim]assumptions:[/dim]")
    for name, text in p.assumptions.items():
        console.print(f"  [dim]{escape(name)}: {escape(text)}[/dim]")


def _answer_keys(p: Plan, floor: Any) -> dict[str, Any]:
    """What ``--json`` adds for the short answer: the expected decode figure and the deploy's floor."""
    from llmfleet.knowledge.plan_answer import expected_tokps

    return {"decode_tokps_expected": round(expected_tokps(p), 2),
            "deploy_floor": {"tokps": floor.tokps, "source": floor.source, "where": floor.where or None}}


def _at_typical(req: Any, p: Plan) -> Plan | None:
    """Without --context the flags take the most that fits; the headline decode is stated at the
    typical context (planner.yaml ``typical_context``): the same request planned at it. None when a
    context was given, the plan does not fit, or it already is at most the typical one."""
    from llmfleet.knowledge.catalog import typical_context
    from llmfleet.knowledge.planner import plan

    if req.context is not None or not p.fits or p.context <= typical_context():
        return None
    return plan(dataclasses.replace(req, context=typical_context()))


def _headline_keys(at: Plan | None) -> dict[str, Any]:
    """What ``--json`` adds for the headline decode: the context it is stated at, and its figures
    there (the plan's own when it is planned at that context)."""
    if at is None:
        return {}
    from llmfleet.knowledge.plan_answer import expected_tokps

    return {"decode_context": at.context,
            "decode_at_context": {"context": at.context, "decode_tokps_ceiling": at.decode_tokps_ceiling,
                                  "decode_tokps_realistic": list(at.decode_tokps_realistic),
                                  "decode_tokps_expected": round(expected_tokps(at), 2)}}


def _target(p: Plan, at: Plan | None, min_tokps: float | None, req: Any, model: Any, engine: Any,
            quant: Any) -> tuple[str, str] | None:
    """--min-tokps against the headline decode: (verdict, the line that says it); None without a
    target or for a plan that does not fit (its own failure says why)."""
    if min_tokps is None or not p.fits:
        return None
    from llmfleet.knowledge.plan_answer import expected_tokps
    from llmfleet.knowledge.plan_compare import BELOW, STRADDLES, target_verdict

    h = at or p
    lo, hi = h.decode_tokps_realistic
    point = expected_tokps(h)
    verdict = target_verdict(point, lo, min_tokps) or ""
    figure = (f"about {point:,.1f} tok/s (predicted {lo:,.1f}-{hi:,.1f}) with {h.context:,} tokens in context")
    if verdict == STRADDLES:
        return verdict, (f"--min-tokps {min_tokps:g}: {p.model} ({p.quant}), {p.engine} decodes {figure}; the point "
                         f"estimate meets the target but the range straddles it")
    if verdict != BELOW:
        return verdict, f"--min-tokps {min_tokps:g}: met ({figure})"
    from llmfleet.knowledge.plan_compare import what_meets

    other = ""
    try:
        c = _comparison(dataclasses.replace(req, context=h.context), model, None, None, min_tokps)
        other = what_meets(c)
    except Exception:  # noqa: BLE001 - the suggestion is a courtesy; the verdict stands without it
        other = ""
    fix = (f"what would meet it at this context: {other}" if other else
           "nothing in the catalog meets it on this card at this context: more cards (--gpus), a faster card "
           "or a shorter context")
    return verdict, (f"{p.model} ({p.quant}), {p.engine} on {p.gpus} x {p.gpu_name} does not meet --min-tokps "
                     f"{min_tokps:g}: {figure}; {fix}")


def _comparison(req: Any, model: Any, engine: Any, quant: Any, min_tokps: float | None, c: Any = None):
    """The comparison of ``req``'s model on its card, with the fleet's calibration and measurements."""
    from llmfleet.knowledge.catalog import load_public_decode
    from llmfleet.knowledge.plan_compare import compare
    from llmfleet.knowledge.planner.resolve import _resolve_model_id

    if isinstance(model, str) and model.lower().endswith(".gguf"):
        raise UsageError(f"--compare: {model} is a GGUF file with its own quant; give a catalog model name")
    spec = _resolve_model_id(model)[0]
    records, overlay = _fleet_sources(c) if c is not None else ([], [])

    def measured(p: Plan) -> str | None:
        fm = fleet_measured(p, records, overlay) if records or overlay else None
        return (fm or {}).get("line") or None

    return compare(dataclasses.replace(req, quant=None, engine=None), spec, engine=engine, quant=quant,
                   min_tokps=min_tokps, calibrate=lambda p: calibration(p, overlay) if overlay else None,
                   measured=measured, public=load_public_decode())


def _b_short(n: int) -> str:
    return f"{n / GB:,.1f} GB"


def render_comparison(cmp: Any) -> None:
    """The comparison as a ranked table, then the refused combinations, one line each."""
    from rich.table import Table

    from llmfleet.knowledge.plan_compare import BELOW, STRADDLES

    where = f"{cmp.gpus} x {cmp.gpu_name}" + (f" on each of {cmp.hosts} hosts" if cmp.hosts > 1 else "")
    title = (f"{cmp.model} on {where}: batch-1 decode at {cmp.context:,} tokens in context x {cmp.concurrency} "
             f"sequence(s), fastest first" + (f"; target {cmp.min_tokps:g} tok/s" if cmp.min_tokps else ""))
    t = Table(title=title, title_justify="left")
    for col in ("#", "engine", "quant", "image", "decode tok/s", "range", "headroom", "fits up to", "evidence"):
        t.add_column(col, no_wrap=col in ("#", "engine", "quant", "decode tok/s", "range"))
    for i, r in enumerate(cmp.ranked, 1):
        mark = {BELOW: " [red]below target[/red]", STRADDLES: " [yellow]range straddles target[/yellow]"}.get(
            r.target or "", "")
        t.add_row(str(i), r.engine, escape(r.quant), escape(r.image or ""), f"{r.point:,.1f}{mark}",
                  f"{r.low:,.1f}-{r.high:,.1f}", _b_short(r.headroom_bytes), f"{r.max_context:,}", escape(r.evidence.text))
    if cmp.ranked:
        console.print(t)
    else:
        console.print(f"[bold]{escape(title)}[/bold]: [red]nothing fits[/red]")
    if cmp.refused:
        console.print("[bold]refused or does not fit[/bold]")
        for r in cmp.refused:
            console.print(f"  {escape(r.name)}{f' ({r.image})' if r.image else ''}: {escape(r.reason)}")
    console.print("[dim]ranked by the middle of the predicted range; ranges that overlap are not a measured "
                  "difference. `invoke plan --model M --gpu G --engine E --quant Q` for one row's flags.[/dim]")


def _compare(req: Any, model: Any, *, engine: Any, quant: Any, min_tokps: float | None, json: bool,
             c: Any = None) -> None:
    cmp = _comparison(req, model, engine, quant, min_tokps, c)
    if json:
        print_json(cmp.to_dict())
    else:
        render_comparison(cmp)
    if not cmp.ranked:
        raise CheckFailed(f"{cmp.model}: no engine and quant fits {cmp.gpus} x {cmp.gpu_name} at {cmp.context:,} tokens")
    if not cmp.ok:
        best = cmp.ranked[0]
        raise CheckFailed(f"{cmp.model}: nothing that fits meets --min-tokps {min_tokps:g} at {cmp.context:,} tokens; "
                          f"fastest: {best.name} about {best.point:,.1f} tok/s (predicted {best.low:,.1f}-{best.high:,.1f})")


@fleet_task(
    name="plan",
    numbers={"gpus": POSITIVE, "context": TOKENS, "concurrency": POSITIVE, "gpu_memory_utilization": FRACTION,
             "hosts": POSITIVE, "network_gbps": GBIT, "network_latency_us": MICROSECONDS, "min_tokps": TOKPS},
    help={
        "model": "catalog name (e.g. qwen2.5-32b-instruct), a Hugging Face model folder, or a .gguf file",
        "quant": "fp16, bf16, fp8, int8, gptq-int4 (-g32 etc. for a group size), awq-int4, mxfp4, q4_0, q4_k_s, "
                 "q4_k_m, q5_k_m, q6_k, q8_0, mxfp4-moe (case-insensitive); a .gguf file brings its own",
        "gpu": "card: catalog id (v100-sxm2-32gb), nvidia-smi name ('Tesla V100-SXM2-32GB') or an inventory host",
        "host": "inventory host: its card (llmfleet_gpu); without --model, plan each of its services",
        "gpus": "GPUs to spread over, per host (vLLM tensor parallel, llama.cpp layer/row split); default 1",
        "hosts": "hosts to spread over, each with --gpus cards (vLLM pipeline parallel over Ray, llama.cpp RPC); "
                 "default 1, or a service's head + workers",
        "network_gbps": "with --hosts: Gbit/s between the hosts (default: the host's llmfleet_network_gbps, else 10)",
        "network_latency_us": "with --hosts: one-way latency per message in microseconds (default: 25-100)",
        "split_mode": "llama.cpp with several GPUs: layer (default) or row (one host)",
        "interconnect": "nvlink or pcie between the cards of a host (default: the card's catalog entry)",
        "context": "tokens per sequence (e.g. 8192, 8k or 1M; k = 1024); default: the flags take the most that "
                   "fits, the decode figures are at the typical context (planner.yaml typical_context)",
        "concurrency": "concurrent sequences (vLLM --max-num-seqs, llama.cpp -np); default 1",
        "kv_dtype": "KV cache dtype: auto, fp8 (vLLM); f16, q8_0, q4_0 (llama.cpp)",
        "engine": "vllm or llamacpp (default: llamacpp for GGUF, vllm otherwise)",
        "gpu_memory_utilization": "share of card memory the plan may use (vLLM's flag; default 0.90 vLLM, 0.95 llama.cpp)",
        "offload": "accept weights off the GPU (slow: shows the predicted PCIe/CPU-bound speed)",
        "image": "engine catalog image that serves (e.g. llamacpp:b5000-cu122): its KV layout and flag rules; "
                 "default: a service's image, else the newest catalog image with kernels for the card",
        "driver": "the host's NVIDIA driver (e.g. 470.256.02): the default image is one that runs on it, and "
                  "an image given is judged against it (default: the gathered facts' driver)",
        "inventory": "inventory for --host / --gpu HOST (default: llmfleet.inventory in invoke.yaml)",
        "gather": "with --host: gather the host's facts over SSH first (its real cards, memory and model files)",
        "accept_new_host_keys": "with --gather: record unknown SSH host keys (changed keys are still refused)",
        "json": "print the plan as JSON (bytes are bytes)",
        "explain": "after the short answer, everything behind it: memory, the speed model's bands and sources, "
                   "the health floor's derivation, notes, every alternative, assumptions",
        "verbose": "with --gather: print each remote command (secrets masked) with its exit status and duration",
        "compare": "rank every engine and quant that can serve the model on the card by predicted decode speed, at "
                   "one context (--context, default the typical one); --engine or --quant fixes that axis",
        "min_tokps": "a decode target in tokens/s at batch 1: a plan whose predicted figure is below it fails (exit 1)",
    },
)
def plan_task(c, model=None, quant=None, gpu=None, host=None, gpus=None, context=None, concurrency=None,
              kv_dtype=None, engine=None, gpu_memory_utilization=None, offload=False, inventory=None, json=False,
              gather=False, accept_new_host_keys=False, image=None, verbose=False, hosts=None, network_gbps=None,
              network_latency_us=None, split_mode=None, interconnect=None, driver=None, explain=False, compare=False,
              min_tokps=None):
    """Capacity plan: does a model fit a card, the engine flags, max context/concurrency, decode speed."""
    import re

    from llmfleet.cli.plan_floor import deploy_floor
    from llmfleet.knowledge.catalog import find_gpu
    from llmfleet.knowledge.planner import PlanRequest, plan, plan_for_service

    if driver is not None and not re.fullmatch(r"\d{2,4}(\.\d{1,4}){1,2}", str(driver)):
        raise UsageError(f"--driver {driver!r}: give the version nvidia-smi prints, e.g. 470.256.02 or 535.183.01")

    facts = None
    if gather:
        if not host:
            raise UsageError("--gather needs --host (the host whose facts to gather)")
        facts = _gather(c, inventory, host, accept_new_host_keys)
    if facts is not None and facts.gpus and not gpu:
        card, settings = None, _host_settings(c, inventory, host)
    else:
        card, settings = _gpu_for(c, inventory, gpu, host)
    n_gpus, ctx, conc, gmu = gpus, context, concurrency, gpu_memory_utilization
    if compare and model is None:
        raise UsageError("--compare needs --model (the model whose engines and quants to rank)")
    if model is None:
        if settings is None or not host:
            raise UsageError("give --model (catalog name, model folder or .gguf file), or --host to plan its services")
        if not settings.services:
            raise UsageError(f"host {host}: no llmfleet_services to plan; give --model")
        plans = {}
        floors = {}
        calibrated: dict[str, str | None] = {}
        records, overlay = _fleet_sources(c)
        sources, lab = _host_sources(c, inventory, host)
        for svc in settings.services:
            overrides = {k: v for k, v in {
                "quant": quant, "context": ctx, "concurrency": conc, "kv_dtype": kv_dtype, "engine": engine,
                "gpu_memory_utilization": gmu, "offload": True if offload else None, "image": image,
                "gpus": list(range(n_gpus)) if n_gpus else None}.items() if v is not None}
            svc = svc.model_copy(update=overrides)
            n_hosts = hosts or _hosts_of(c, inventory, host, svc)
            gbps = network_gbps if network_gbps is not None else getattr(settings, "network_gbps", None)
            plans[svc.name] = plan_for_service(svc, card, n_gpus or 1, facts=facts, hosts=n_hosts,
                                               network_gbps=gbps, network_latency_us=network_latency_us,
                                               driver=driver or None)
            # the floor from the plan as the deploy makes it (no speed overlay), by the deploy's function
            floors[svc.name] = deploy_floor(plans[svc.name], svc, settings, records, lab=lab, sources=sources)
            measured = calibration(plans[svc.name], overlay)
            calibrated[svc.name] = measured[1] if measured is not None else None
            if measured is not None:  # planned again with the efficiency this fleet measured
                plans[svc.name] = plan_for_service(svc, card, n_gpus or 1, facts=facts, hosts=n_hosts,
                                                   network_gbps=gbps, network_latency_us=network_latency_us,
                                                   driver=driver or None, measured_efficiency=measured)
        fleet = {k: fleet_measured(p, records, overlay) for k, p in plans.items()}
        if json:
            print_json({"host": host, "fits": all(p.fits for p in plans.values()),
                        "services": {k: p.to_dict() | {"fleet_measured": fleet[k]} | _answer_keys(p, floors[k])
                                     for k, p in plans.items()}})
        else:
            for name, p in plans.items():
                render_answer(p, floors[name], fleet=fleet[name], title=f"{host} / {name}", host=host, service=True,
                              calibrated=calibrated[name])
                if explain:
                    render_plan(p, title=f"{host} / {name}: {p.model} ({p.quant}) on {p.gpus} x {p.gpu_name}, "
                                f"{p.engine}: " + ("[green]FITS[/green]" if p.fits else "[red]DOES NOT FIT[/red]"),
                                fleet=fleet[name])
        bad = [k for k, p in plans.items() if not p.fits]
        if bad:
            raise CheckFailed(f"host {host}: {', '.join(bad)} do(es) not fit {plans[bad[0]].gpu_name}")
        return
    if card is None:  # from the gathered facts
        assert facts is not None  # the card is left open only when facts were gathered
        first = facts.gpus[0]
        card = find_gpu(first.catalog_id or first.name)
        if first.memory_total_mib:
            card = dataclasses.replace(card, memory_mib=int(first.memory_total_mib))
    req = PlanRequest(
        model=model, quant=quant, gpu=card, gpus=n_gpus or 1, context=ctx, concurrency=conc or 1,
        engine=engine, kv_dtype=kv_dtype or "auto", gpu_memory_utilization=gmu, offload=bool(offload),
        image=image or None, hosts=hosts or 1,
        network_gbps=network_gbps if network_gbps is not None else getattr(settings, "network_gbps", None),
        network_latency_us=network_latency_us, split_mode=split_mode or None, interconnect=interconnect or None,
        gpus_available=len(facts.gpus) if facts is not None and len(facts.gpus) > 1 else None,
        driver=driver or (facts.driver_version if facts is not None else None) or None,
    )
    if compare:
        _compare(req, model, engine=engine, quant=quant, min_tokps=min_tokps, json=json, c=c)
        return
    p = plan(req)
    records, overlay = _fleet_sources(c)
    # the floor a deploy of this plan would gate on (a service with the default health settings)
    floor = deploy_floor(p, None, None, records)
    measured = calibration(p, overlay)
    if measured is not None:  # planned again with the efficiency this fleet measured
        req = dataclasses.replace(req, measured_efficiency=measured)
        p = plan(req)
    measured_rows = fleet_measured(p, records, overlay)
    at = _at_typical(req, p)
    target = _target(p, at, min_tokps, req, model, engine, quant)
    if json:
        print_json(p.to_dict() | {"fleet_measured": measured_rows} | _answer_keys(p, floor) | _headline_keys(at)
                   | ({"min_tokps": min_tokps, "target": target[0]} if target else {}))
    else:
        render_answer(p, floor, fleet=measured_rows, calibrated=measured[1] if measured is not None else None,
                      at=at)
        if target and target[0] == "straddles":
            console.print(f"[yellow]WARN[/yellow]  {escape(target[1])}")
        if explain:
            render_plan(p, fleet=measured_rows)
    if not p.fits:
        first = p.notes[0] if p.notes else "does not fit"
        hosts_txt = f" on each of {p.hosts} hosts" if p.hosts > 1 else ""
        no_image = p.image is None and first.startswith("REFUSED: no ")  # no catalog image of the engine runs here
        raise CheckFailed(f"{p.model} ({p.quant}) {'cannot be served on' if no_image else 'does not fit'} {p.gpus} x "
                          f"{p.gpu_name}{hosts_txt}: {first}")
    if target and target[0] == "below":
        raise CheckFailed(target[1])

