"""Pictures of bench results: tok/s and time to first token against concurrency, one line per release.

Pure up to the last step: ``plot_data`` turns result documents into series, ``scene`` lays them out as
a list of shapes (lines, dots, text) in pixel coordinates, and two small writers draw that scene:
``svg`` (stdlib only; ``html`` wraps it with the numbers as a table into one self-contained file, no
script, no external link) and ``png`` (Pillow, the optional ``plot`` extra: ``pip install
'llmfleet[plot]'``).
"""

from __future__ import annotations

import html as html_mod
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.fleet import bench as B

WIDTH, HEIGHT = 1100, 460
PANEL_W, PANEL_H = 440, 300
LEFT, TOP = 80, 70
GAP = 110
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
AXIS = "#444444"
GRID = "#dddddd"


# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class Point:
    concurrency: int
    aggregate_tokps: float | None
    decode_tokps: float | None
    ttft_ms: float | None


@dataclass(frozen=True)
class Series:
    label: str  # release (and prompt length when there are several)
    release: str
    prompt_tokens: int
    points: tuple[Point, ...]


def plot_data(docs: Sequence[dict[str, Any]]) -> list[Series]:
    """One series per (release, prompt length), points sorted by concurrency."""
    prompts = sorted({k[1] for d in docs for k in B.levels_of(d)})
    out: list[Series] = []
    for d in docs:
        rid = str(d.get("release") or "?")
        by_prompt: dict[int, list[Point]] = {}
        for (c, p), lv in sorted(B.levels_of(d).items()):
            ttft = lv.get("ttft_p50_s")
            by_prompt.setdefault(p, []).append(Point(c, lv.get("aggregate_tokps"), lv.get("decode_tokps_p50"),
                                                     None if ttft is None else float(ttft) * 1000.0))
        for p in sorted(by_prompt):
            label = rid if len(prompts) <= 1 else f"{rid} · prompt {p}"
            out.append(Series(label, rid, p, tuple(by_prompt[p])))
    return out


def nice_max(v: float) -> float:
    """The smallest 1/2/2.5/5 x 10^k at or above v (an axis end)."""
    if v <= 0 or math.isnan(v):
        return 1.0
    k = math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        top = m * 10**k
        if top >= v * 0.999999:
            return float(top)
    return float(10 ** (k + 1))


def ticks(top: float, n: int = 5) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def fmt_tick(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.3g}"


# ---------------------------------------------------------------------------------------------
# Scene


@dataclass(frozen=True)
class Shape:
    kind: str  # line | polyline | dot | text | rect
    points: tuple[tuple[float, float], ...]
    colour: str = AXIS
    width: float = 1.0
    dash: bool = False
    text: str = ""
    size: int = 12
    anchor: str = "start"  # start | middle | end


@dataclass
class Scene:
    width: int
    height: int
    title: str
    shapes: list[Shape] = field(default_factory=list)


def scene(series: Sequence[Series], title: str) -> Scene:
    sc = Scene(WIDTH, HEIGHT, title)
    add = sc.shapes.append
    add(Shape("text", ((WIDTH / 2, 28),), text=title, size=16, anchor="middle"))
    xs = sorted({p.concurrency for s in series for p in s.points})
    panels = [
        ("output tok/s (solid: aggregate, dashed: per stream p50)",
         lambda p: (p.aggregate_tokps, p.decode_tokps)),
        ("time to first token p50 (ms)", lambda p: (p.ttft_ms, None)),
    ]
    for i, (ylabel, pick) in enumerate(panels):
        x0 = LEFT + i * (PANEL_W + GAP)
        y0 = TOP
        vals = [v for s in series for p in s.points for v in pick(p) if v is not None]
        top = nice_max(max(vals) if vals else 1.0)
        add(Shape("text", ((x0, y0 - 12),), text=ylabel, size=12))
        for t in ticks(top):
            y = y0 + PANEL_H - PANEL_H * t / top
            add(Shape("line", ((x0, y), (x0 + PANEL_W, y)), colour=GRID))
            add(Shape("text", ((x0 - 8, y + 4),), text=fmt_tick(t), size=11, anchor="end"))
        add(Shape("line", ((x0, y0), (x0, y0 + PANEL_H)), colour=AXIS, width=1.5))
        add(Shape("line", ((x0, y0 + PANEL_H), (x0 + PANEL_W, y0 + PANEL_H)), colour=AXIS, width=1.5))

        def xpos(c: int, _x0: float = x0) -> float:
            if len(xs) <= 1:
                return _x0 + PANEL_W / 2
            return _x0 + 20 + (PANEL_W - 40) * xs.index(c) / (len(xs) - 1)

        for c in xs:
            add(Shape("text", ((xpos(c), y0 + PANEL_H + 18),), text=str(c), size=11, anchor="middle"))
        add(Shape("text", ((x0 + PANEL_W / 2, y0 + PANEL_H + 40),), text="concurrent streams", size=12,
                  anchor="middle"))
        for k, s in enumerate(series):
            colour = COLOURS[k % len(COLOURS)]
            for which in (0, 1):
                pts = [(xpos(p.concurrency), y0 + PANEL_H - PANEL_H * pick(p)[which] / top)
                       for p in s.points if pick(p)[which] is not None]
                if not pts:
                    continue
                if len(pts) > 1:
                    add(Shape("polyline", tuple(pts), colour=colour, width=2.0, dash=which == 1))
                for pt in pts:
                    add(Shape("dot", (pt,), colour=colour, width=3.5))
    # legend
    ly = TOP + PANEL_H + 62
    lx = float(LEFT)
    for k, s in enumerate(series):
        colour = COLOURS[k % len(COLOURS)]
        add(Shape("line", ((lx, ly - 4), (lx + 24, ly - 4)), colour=colour, width=3))
        add(Shape("text", ((lx + 30, ly),), text=s.label, size=12))
        lx += 40 + 7.2 * len(s.label)
        if lx > WIDTH - 200:
            lx, ly = LEFT, ly + 18
    return sc


# ---------------------------------------------------------------------------------------------
# Writers


def _num(v: float) -> str:
    return f"{v:.1f}"


def svg(sc: Scene) -> str:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{sc.width}" height="{sc.height}" '
           f'viewBox="0 0 {sc.width} {sc.height}" font-family="DejaVu Sans, Arial, sans-serif">',
           f'<title>{html_mod.escape(sc.title)}</title>',
           f'<rect x="0" y="0" width="{sc.width}" height="{sc.height}" fill="#ffffff"/>']
    for s in sc.shapes:
        dash = ' stroke-dasharray="6 4"' if s.dash else ""
        if s.kind == "line":
            (x1, y1), (x2, y2) = s.points
            out.append(f'<line x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" y2="{_num(y2)}" stroke="{s.colour}" '
                       f'stroke-width="{s.width:g}"{dash}/>')
        elif s.kind == "polyline":
            pts = " ".join(f"{_num(x)},{_num(y)}" for x, y in s.points)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{s.colour}" stroke-width="{s.width:g}"{dash}/>')
        elif s.kind == "dot":
            (x, y), = s.points
            out.append(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{s.width:g}" fill="{s.colour}"/>')
        elif s.kind == "text":
            (x, y), = s.points
            out.append(f'<text x="{_num(x)}" y="{_num(y)}" font-size="{s.size}" fill="{s.colour}" '
                       f'text-anchor="{s.anchor}">{html_mod.escape(s.text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _cell(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return html_mod.escape(str(v))


def html(docs: Sequence[dict[str, Any]], title: str) -> str:
    """One self-contained page: the picture (inline SVG) and every figure as a table."""
    picture = svg(scene(plot_data(docs), title))
    rows = []
    for d in docs:
        for r in B.table_rows(d):
            ttft50 = None if r["ttft_p50_s"] is None else r["ttft_p50_s"] * 1000
            ttft95 = None if r["ttft_p95_s"] is None else r["ttft_p95_s"] * 1000
            rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in (
                _cell(r["release"]), _cell(r["concurrency"]), _cell(r["prompt_tokens"]), _cell(r["requests"]),
                _cell(r["errors"]), _cell(ttft50, 0), _cell(ttft95, 0), _cell(r["decode_tokps_p50"]),
                _cell(r["aggregate_tokps"]), _cell(r["gpu_memory_used_mib_max"], 0),
                _cell(None if r["kv_cache_usage_max"] is None else r["kv_cache_usage_max"] * 100, 0),
                _cell(r["requests_waiting_max"], 0), _cell(r["ceiling_tokps"]),
                _cell(r["decode_vs_ceiling"], 2))) + "</tr>")
    notes = [f"<li>{html_mod.escape(str(d.get('release')))}: {html_mod.escape(n)}</li>"
             for d in docs for n in d.get("notes") or []]
    head = ("release", "streams", "prompt", "requests", "errors", "TTFT p50 ms", "TTFT p95 ms", "decode p50 tok/s",
            "aggregate tok/s", "GPU MiB max", "KV % max", "waiting max", "ceiling tok/s", "decode/ceiling")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html_mod.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
        "td:first-child{text-align:left}</style>",
        "</head><body>",
        picture,
        "<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>",
        *rows,
        "</tbody></table>",
        ("<ul>" + "".join(notes) + "</ul>") if notes else "",
        "</body></html>",
        "",
    ])


def png(sc: Scene) -> bytes:
    """The scene as a PNG (needs Pillow: the ``plot`` extra)."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise UsageError("a PNG needs Pillow: pip install 'llmfleet[plot]' (or write --plot FILE.html, which "
                         "needs nothing)") from None
    import io

    img = Image.new("RGB", (sc.width, sc.height), "white")
    draw = ImageDraw.Draw(img)
    fonts: dict[int, Any] = {}

    def font(size: int) -> Any:
        if size not in fonts:
            try:
                fonts[size] = ImageFont.load_default(size=size)
            except TypeError:  # Pillow < 10.1: one bitmap size
                fonts[size] = ImageFont.load_default()
        return fonts[size]

    def dashed(a: tuple[float, float], b: tuple[float, float], colour: str, width: int) -> None:
        length = math.dist(a, b)
        if length == 0:
            return
        steps = int(length // 10) + 1
        for i in range(steps):
            t0, t1 = i * 10 / length, min(1.0, (i * 10 + 6) / length)
            draw.line([(a[0] + (b[0] - a[0]) * t0, a[1] + (b[1] - a[1]) * t0),
                       (a[0] + (b[0] - a[0]) * t1, a[1] + (b[1] - a[1]) * t1)], fill=colour, width=width)

    anchors = {"start": "ls", "middle": "ms", "end": "rs"}
    for s in sc.shapes:
        w = max(1, round(s.width))
        if s.kind in ("line", "polyline"):
            for a, b in zip(s.points, s.points[1:], strict=False):
                if s.dash:
                    dashed(a, b, s.colour, w)
                else:
                    draw.line([a, b], fill=s.colour, width=w)
        elif s.kind == "dot":
            (x, y), = s.points
            r = s.width
            draw.ellipse([x - r, y - r, x + r, y + r], fill=s.colour)
        elif s.kind == "text":
            (x, y), = s.points
            try:
                draw.text((x, y), s.text, fill=s.colour, font=font(s.size), anchor=anchors[s.anchor])
            except (ValueError, TypeError):  # a bitmap font takes no anchor
                draw.text((x, y - s.size), s.text, fill=s.colour, font=font(s.size))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def write(path: str | Path, docs: Sequence[dict[str, Any]], title: str) -> Path:
    """Write ``.html`` (self-contained), ``.svg`` or ``.png`` by the file's extension."""
    p = Path(path).expanduser()
    ext = p.suffix.lower()
    if ext not in (".html", ".htm", ".svg", ".png"):
        raise UsageError(f"--plot {path}: give a file ending in .png, .html or .svg")
    if not docs or not any(B.levels_of(d) for d in docs):
        raise UsageError(f"--plot {path}: no measured level to draw")
    if ext == ".png":
        data: bytes = png(scene(plot_data(docs), title))
    elif ext == ".svg":
        data = svg(scene(plot_data(docs), title)).encode()
    else:
        data = html(docs, title).encode()
    if p.parent and not p.parent.exists():
        raise UsageError(f"--plot {path}: folder {p.parent} does not exist")
    p.write_bytes(data)
    return p
