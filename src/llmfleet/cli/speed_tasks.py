"""``invoke speed``: the fleet's measured decode speed per card class against the planner's prediction."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    escape,
    load_settings,
    new_table,
    print_json,
    select_hosts,
)
from llmfleet.cli.flags import POSITIVE, SECONDS, fleet_task
from llmfleet.errors import CheckFailed, UsageError

DEFAULT_FORKS = 10
DEFAULT_TIMEOUT = 20


def planner_efficiency(card: str, engine: str) -> tuple[float, float] | None:
    """The planner's bandwidth efficiency (low, high) for a card's memory class and an engine; None
    for a card or engine the catalog does not know."""
    from llmfleet.knowledge.catalog import find_gpu, speed_assumptions

    try:
        return speed_assumptions(engine).efficiency_for(find_gpu(card).memory_type)[1]
    except Exception:  # noqa: BLE001 - a card or engine not in this catalog: no figure, not an error
        return None


def summaries(records: list[Any], *, lab: bool = False) -> list[Any]:
    """Per card class, with the planner's efficiency and the one fitted to the median."""
    import dataclasses

    from llmfleet.health import speed_history as sh

    out = []
    for s in sh.class_summaries(records, lab=lab):
        eff = planner_efficiency(s.card, s.engine)
        out.append(dataclasses.replace(s, efficiency=eff,
                                       fitted=sh.fitted_efficiency(s.median, s.ceiling, s.predicted, eff)))
    return out


def _n(v: float | None) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def _range(pair: tuple[float, float] | None, fmt: Any = _n) -> str:
    return "-" if pair is None else f"{fmt(pair[0])}-{fmt(pair[1])}"


def render(rows: list[Any], where: str) -> None:
    table = new_table("card", "engine", "model", "quant", "context", "predicted tok/s", "runs", "measured tok/s",
                      "median", "vs predicted", "planner eff.", "fitted eff.", title="decode speed: measured against "
                      "predicted (batch 1)")
    for s in rows:
        verdict = {"below": "[red]below[/red]", "above": "[yellow]above[/yellow]"}.get(s.verdict, s.verdict)
        card = s.card + (f" ({s.gpus} GPUs" + (f" x {s.hosts} hosts)" if s.hosts > 1 else ")") if s.gpus * s.hosts > 1 else "")
        table.add_row(escape(card), s.engine, escape(s.model), escape(s.quant), escape(s.context), _range(s.predicted),
                      f"{s.count} on {len(s.hosts_measured)} host(s)", _range((s.low, s.high)), _n(s.median), verdict,
                      _range(s.efficiency, lambda v: f"{v:.2f}"), "-" if s.fitted is None else f"{s.fitted:.2f}")
    console.print(table)
    console.print(f"[dim]{escape(where)}[/dim]")


@fleet_task(
    numbers={"forks": POSITIVE, "timeout": SECONDS},
    help={
        "host": "read these hosts first (Ansible pattern); without --host/--group: what this machine has kept",
        "group": "read these groups' hosts first (Ansible pattern)",
        "inventory": INVENTORY_HELP,
        "write": "write the figures as a speed overlay YAML file (docs/planner.md); `invoke plan` shows it when "
                 "llmfleet.speed_overlay names the file",
        "lab": "show lab hosts' runs (CPU engines for a simulated card) instead of real cards'",
        "json": 'print {"classes": [per card class], "hosts_read": [...], "cached_hosts": {host: when}, '
                '"unreachable": [...]}',
        "forks": f"hosts read at once (default {DEFAULT_FORKS})",
        "timeout": f"seconds allowed per host (default {DEFAULT_TIMEOUT})",
        "verbose": "print each remote command (secrets masked) with its exit status and duration",
    },
)
def speed(c, host=None, group=None, inventory=None, write=None, lab=False, json=False, forks=DEFAULT_FORKS,
          timeout=DEFAULT_TIMEOUT, verbose=False):
    """Measured decode speed per card class (card, engine, model, quant, context) against the planner's."""
    from llmfleet.health import speed_cache, speed_overlay
    from llmfleet.health import speed_history as sh

    out_path = None
    if write is not None:
        out_path = Path(str(write)).expanduser()
        if not str(write).strip() or out_path.is_dir():
            raise UsageError(f"--write {write!r}: give a file path for the overlay, e.g. --write speed-overlay.yaml")
        if not out_path.parent.is_dir():
            raise UsageError(f"--write {write}: folder {out_path.parent} does not exist; give a path in an existing folder")
    read_now: list[Any] = []
    if host or group:
        from llmfleet.fleet import speed as fleet_speed

        _inv, hosts = select_hosts(c, inventory, host, group)
        read_now = fleet_speed.query_speeds(hosts, config=load_settings(c), forks=forks, timeout=timeout)
    reached = [h for h in read_now if h.reachable]
    unreachable = [{"host": h.host, "error": h.error or "no answer"} for h in read_now if not h.reachable]
    records = sh.merge([r for h in reached for r in h.records], speed_cache.load(), [h.host for h in reached])
    seen = speed_cache.seen()
    cached_hosts = {h: seen.get(h, "") for h in sorted({r.host for r in records} - {h.host for h in reached})}
    rows = summaries(records, lab=lab)

    said = []
    if reached:
        said.append(f"read now: {', '.join(h.host for h in reached)}")
    if cached_hosts:
        said.append("kept on this machine: " + ", ".join(f"{h} (read {t or 'at an unknown time'})"
                                                        for h, t in cached_hosts.items()))
    where = "; ".join(said) or "no host read now and none kept on this machine: run `invoke speed --group G` or `invoke status`"
    if out_path is not None:
        if not rows:
            raise CheckFailed(f"--write {write}: no healthy measurement to write ({where})")
        text = speed_overlay.overlay_text(speed_overlay.overlay_document(rows, datetime.now(UTC)))
        out_path.write_text(text, encoding="utf-8")
    if json:
        print_json({"classes": [s.to_dict() for s in rows], "hosts_read": [h.host for h in reached],
                    "cached_hosts": cached_hosts, "unreachable": unreachable,
                    "written": str(out_path) if out_path is not None else None})
    else:
        if rows:
            render(rows, where)
        else:
            console.print(f"no healthy {'lab ' if lab else ''}decode measurement with a plan ({escape(where)})")
        if out_path is not None:
            console.print(f"wrote {escape(str(out_path))}: {len(rows)} card class(es)")
        if unreachable:
            console.print(f"[red]{len(unreachable)} host(s) unreachable[/red]: " + ", ".join(u["host"] for u in unreachable))
    if unreachable:
        raise CheckFailed(f"{len(unreachable)} of {len(read_now)} host(s) unreachable: "
                          + ", ".join(u["host"] for u in unreachable) + " (their kept records were used)")
