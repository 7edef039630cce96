"""The soak's samples as an SVG: one panel per figure (the agent's RSS, open descriptors and
threads, the state folder, the log) against minutes, the warm-up shaded. Written by hand, so
that plotting needs nothing beyond the standard library.

Run from the repository root:
    .venv/bin/python -m bench.soak_plot SOAK_JSON OUT_SVG

SOAK_JSON is the ``soak.json`` bench/soak.py writes into its ``--out`` folder.
"""

from __future__ import annotations

import json
import sys
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.soak import compaction_bound

if TYPE_CHECKING:
    from bench.soak import Result

WIDTH, PANEL_HEIGHT, LEFT, RIGHT, TOP, GAP = 760, 110, 60, 40, 56, 38
# (title, unit, value of a sample dict)
PANELS: tuple[tuple[str, str, Any], ...] = (
    ("agent RSS", "MB", lambda s: s["rss_kb"] / 1024),
    ("agent open descriptors", "", lambda s: s["fds"]),
    ("agent threads", "", lambda s: s["threads"]),
    ("state folder (snapshot + journal)", "kB", lambda s: s["state_bytes"] / 1024),
    ("agent log (with its rotated file)", "kB", lambda s: s["log_bytes"] / 1024),
)
STATE_PANEL = 3


def _y_range(high: float) -> tuple[float, float]:
    """From 0, so that a flat line looks flat and growth looks like its share of the whole."""
    return 0.0, max(high * 1.25, 1.0)


def _label(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.1f}"


def svg_text(document: dict[str, Any]) -> str:
    samples = document["samples"]
    options = document["options"]
    warmup_min = (options["warmup_minutes"] if options.get("warmup_minutes") is not None
                  else min(5.0, options["minutes"] / 3))
    minutes = [s["t_s"] / 60 for s in samples]
    x_max = max(minutes[-1] if minutes else 1.0, 1e-9)
    plot_width = WIDTH - LEFT - RIGHT
    height = TOP + len(PANELS) * (PANEL_HEIGHT + GAP) + 10
    verdict = "all bounds held" if not document["violations"] else (
        f"{len(document['violations'])} bounds violated")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
             f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">nri-numa soak: '
             f'{options["minutes"]:g} min of pod churn on containerd 2.1.9</text>',
             f'<text x="{LEFT}" y="38">a sample every {options["sample_seconds"]:g} s, '
             f'{len(samples)} samples; {escape(verdict)}</text>']

    def x_of(minute: float) -> float:
        return LEFT + minute / x_max * plot_width

    for index, (title, unit, value) in enumerate(PANELS):
        top = TOP + index * (PANEL_HEIGHT + GAP) + 14
        values = [value(s) for s in samples]
        # The state panel also shows its bound (bench/soak.py), so its range reaches it.
        bound = (compaction_bound(max(s["snapshot_bytes"] for s in samples)) / 1024
                 if index == STATE_PANEL and samples else None)
        low, high = _y_range(max(max(values, default=1), bound or 0))

        def y_of(v: float, top: float = top, low: float = low, high: float = high) -> float:
            return top + PANEL_HEIGHT - (v - low) / (high - low) * PANEL_HEIGHT

        shown = f"{title}" + (f" ({unit})" if unit else "")
        if values:
            shown += f": {_label(values[0])} at start, {_label(values[-1])} at the end"
        parts.append(f'<text x="{LEFT}" y="{top - 5}" font-weight="bold">{escape(shown)}</text>')
        parts.append(f'<rect x="{LEFT}" y="{top}" width="{x_of(min(warmup_min, x_max)) - LEFT:.1f}" '
                     f'height="{PANEL_HEIGHT}" fill="#eeeeee"/>')
        parts.append(f'<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PANEL_HEIGHT}" '
                     'fill="none" stroke="#888"/>')
        for tick in (low, (low + high) / 2, high):
            y = y_of(tick)
            parts.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT + plot_width}" '
                         f'y2="{y:.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                         f'{_label(tick)}</text>')
        for step in range(6):
            minute = x_max * step / 5
            parts.append(f'<text x="{x_of(minute):.1f}" y="{top + PANEL_HEIGHT + 13}" '
                         f'text-anchor="middle">{_label(minute)} min</text>')
        if bound is not None:
            y = y_of(bound)
            parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_width}" y2="{y:.1f}" '
                         'stroke="#c03030" stroke-dasharray="5,4"/>')
            parts.append(f'<text x="{LEFT + plot_width - 4}" y="{y - 4:.1f}" text-anchor="end" '
                         f'fill="#c03030">what compaction allows: {bound:.0f} kB</text>')
        points = " ".join(f"{x_of(m):.1f},{y_of(v):.1f}" for m, v in zip(minutes, values))
        parts.append(f'<polyline points="{points}" fill="none" stroke="#1f5fbf" '
                     'stroke-width="1.6"/>')
    parts.append(f'<text x="{LEFT}" y="{height - 4}" fill="#666">shaded: the warm-up, not judged '
                 'for growth (bench/soak.py)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_svg(result: Result | dict[str, Any], path: Path) -> None:
    document = result if isinstance(result, dict) else json.loads(result.to_json())
    path.write_text(svg_text(document))


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    write_svg(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
