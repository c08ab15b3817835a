"""``bench``: measure a deployed service (TTFT, decode and aggregate tok/s per concurrency), keep the
result with the release, compare two releases, plot them (``docs/bench.md``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    err_console,
    escape,
    inventory_path,
    load_settings,
    print_json,
)
from llmfleet.cli.flags import fleet_task
from llmfleet.errors import UsageError
from llmfleet.fleet import bench_defaults as D  # the defaults in the help text


def _who() -> str:
    from llmfleet.release.who import default_who

    return default_who()


def _num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(float(v)) >= 100 else f"{v:.{digits}f}"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 1000:.0f}"


def _compare_ids(values: Any) -> list[str]:
    ids: list[str] = []
    for v in values or []:
        ids += [x.strip() for x in str(v).replace(" ", ",").split(",") if x.strip()]
    return ids


def print_result(doc: dict[str, Any]) -> None:
    plan = doc.get("plan") or {}
    title = f"bench {doc.get('host')}/{doc.get('service')} ({doc.get('engine')}, {doc.get('model')}) " \
            f"release {doc.get('release')}"
    from rich.table import Table

    table = Table(title=escape(title))
    for col in ("streams", "prompt", "ok/req", "TTFT p50 ms", "TTFT p95 ms", "decode p50 tok/s", "aggregate tok/s",
                "GPU MiB", "KV %", "waiting", "decode/ceiling", "vs realistic"):
        table.add_column(col, justify="left" if col == "vs realistic" else "right")
    from llmfleet.fleet import bench as B

    for r in B.table_rows(doc):
        kv = r["kv_cache_usage_max"]
        ratio = r["decode_vs_ceiling"]
        errs = f"[red]{r['requests'] - r['errors']}/{r['requests']}[/red]" if r["errors"] else \
            f"{r['requests']}/{r['requests']}"
        prompt = str(r["prompt_tokens"]) + (f" ({r['prompt_tokens_counted']:.0f})"
                                            if r["prompt_tokens_counted"] is not None else "")
        table.add_row(str(r["concurrency"]), prompt, errs, _ms(r["ttft_p50_s"]), _ms(r["ttft_p95_s"]),
                      _num(r["decode_tokps_p50"]), _num(r["aggregate_tokps"]), _num(r["gpu_memory_used_mib_max"], 0),
                      "-" if kv is None else f"{kv * 100:.0f}", _num(r["requests_waiting_max"], 0),
                      "-" if ratio is None else f"{ratio * 100:.0f}%", r["decode_vs_realistic"])
    console.print(table)
    rng = plan.get("realistic_tokps")
    ceiling = plan.get("ceiling_tokps")
    console.print(f"plan ({escape(str(plan.get('source')))}): ceiling "
                  f"{_num(ceiling)} tok/s, realistic {_num(rng[0]) + '-' + _num(rng[1]) if rng else '-'} tok/s "
                  "per stream (batch 1); prompt column: asked (engine's count)")
    for n in doc.get("notes") or []:
        console.print(f"note: {escape(n)}")


def print_compare(a: dict[str, Any], b: dict[str, Any], where: dict[str, str]) -> None:
    ra, rb = a.get("release"), b.get("release")
    from rich.table import Table

    table = Table(title=escape(f"bench {a.get('host')}/{a.get('service')}: A {ra} -> B {rb}"))
    for col in ("streams", "prompt", "decode p50 A", "B", "change", "aggregate A", "B", "change",
                "TTFT p50 ms A", "B", "change", "errors A/B"):
        table.add_column(col, justify="right")

    def ch(m: dict[str, Any]) -> str:
        c = m["change_pct"]
        if c is None:
            return "-"
        colour = "green" if m["better"] else ("red" if m["better"] is False else "white")
        return f"[{colour}]{c:+.0f}%[/{colour}]"

    from llmfleet.fleet import bench as B

    for r in B.compare(a, b):
        d, g, t, e = r["decode_tokps_p50"], r["aggregate_tokps"], r["ttft_p50_s"], r["errors"]
        table.add_row(str(r["concurrency"]), str(r["prompt_tokens"]), _num(d["a"]), _num(d["b"]), ch(d),
                      _num(g["a"]), _num(g["b"]), ch(g), _ms(t["a"]), _ms(t["b"]), ch(t),
                      f"{_num(e['a'], 0)}/{_num(e['b'], 0)}")
    console.print(table)
    for rid in (ra, rb):
        console.print(f"{rid}: from {escape(where.get(str(rid), '?'))}")


@fleet_task(
    iterable=["compare"],
    help={
        "host": "the host (inventory name) whose service to measure",
        "service": "the service to measure (needed when the host runs several)",
        "concurrency": f"concurrent streams, comma-separated (default {','.join(map(str, D.DEFAULT_CONCURRENCY))})",
        "prompt_tokens": "prompt lengths in tokens, comma-separated (default "
                         f"{','.join(map(str, D.DEFAULT_PROMPT_TOKENS))}); sized with the engine's own count",
        "max_tokens": f"output tokens per request, exact (ignore_eos) (default {D.DEFAULT_MAX_TOKENS})",
        "requests": "requests per level (default: 2 x concurrency, at least 4)",
        "duration": "seconds per level: no new request after it (with --requests: whichever comes first)",
        "request_timeout": "seconds one request may take (default 300)",
        "json": "print the result (or the comparison) as JSON",
        "plot_": "also draw tok/s and TTFT against concurrency per release: FILE.png, FILE.html or FILE.svg",
        "compare": "RELEASE_A,RELEASE_B (or the flag twice): compare two saved results; measures nothing",
        "inventory": INVENTORY_HELP,
        "no_save": "do not keep the result (bench.json on the host, the local copy)",
    },
)
def bench(c, host=None, service=None, concurrency=None, prompt_tokens=None, max_tokens=None, requests=None,
          duration=None, request_timeout=None, json=False, plot_=None, compare=None, inventory=None, no_save=False):
    """Measure a deployed service: TTFT, decode and aggregate tok/s per concurrency, beside the plan."""
    from llmfleet.fleet import bench as B
    from llmfleet.fleet import bench_run
    from llmfleet.fleet import plot as plot_mod
    from llmfleet.inventory.ansible import load_inventory

    plot_file = plot_
    if not host:
        raise UsageError("bench: choose the host with --host NAME")
    settings = load_settings(c)
    bench_dir = settings.bench_dir or bench_run.DEFAULT_BENCH_DIR
    if plot_file:
        ext = str(plot_file).lower().rsplit(".", 1)[-1]
        if ext not in ("png", "html", "htm", "svg"):
            raise UsageError(f"--plot {plot_file}: give a file ending in .png, .html or .svg")
    inv = load_inventory(inventory_path(c, inventory), script_timeout=load_settings(c).inventory_timeout)
    if host not in inv.hosts:
        raise UsageError(f"{inv.path}: no host {host!r}; hosts: {', '.join(inv.hosts) or '(none)'}")
    ids = _compare_ids(compare)
    if compare is not None and ids:
        if len(ids) != 2:
            raise UsageError("--compare: give two release ids, e.g. --compare A,B (see `invoke releases --host H`)")
        a, b, where = bench_run.load_pair(inv, host, service_name=service, a=ids[0], b=ids[1],
                                          config=settings, bench_dir=bench_dir)
        if plot_file:
            plot_mod.write(plot_file, [a, b], f"{host}/{a.get('service')}: {ids[0]} vs {ids[1]}")
        if json:
            print_json({"a": a, "b": b, "from": where, "comparison": B.compare(a, b),
                        "plot": plot_file})
        else:
            print_compare(a, b, where)
            if plot_file:
                console.print(f"plot: {plot_file}")
        return
    try:
        params = B.parse_params(concurrency, prompt_tokens, max_tokens, duration, requests, request_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    def log(line: str) -> None:
        err_console.print(f"{datetime.now(UTC):%H:%M:%S} {escape(line)}")

    run = bench_run.run_bench(inv, host, service_name=service, params=params, config=settings,
                              bench_dir=bench_dir, who=_who(), log=log, save=not no_save)
    doc = run.doc
    if plot_file:
        others = [run.others[k] for k in sorted(run.others)]
        plot_mod.write(plot_file, [*others, doc], f"{host}/{doc['service']}: tok/s and TTFT per release")
    if json:
        print_json({"result": doc, "rows": B.table_rows(doc), "saved": {"host": run.saved_host,
                    "local": run.saved_local}, "plot": plot_file})
    else:
        print_result(doc)
        saved_at = [x for x in ((f"{host}:.../releases/{doc['release']}/bench.json" if run.saved_host else None),
                                run.saved_local) if x]
        if saved_at:
            console.print("saved: " + escape(", ".join(saved_at)))
        if plot_file:
            console.print(f"plot: {escape(str(plot_file))}")
