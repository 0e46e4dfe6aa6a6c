"""``gymtrace timeline``: a run's episodes on one picture, a self-contained HTML page (a canvas) or
Chrome trace-event JSON for Perfetto and ``chrome://tracing``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gymtrace._cli.common import read_picture

DEFAULT_HTML = "gymtrace-timeline.html"
DEFAULT_CHROME = "gymtrace-timeline.json"


def run(args: argparse.Namespace) -> int:
    from gymtrace._read.pictures.runview import RunNotFound
    from gymtrace._read.pictures.timeline import timeline_page, write_chrome_trace

    try:
        view = read_picture(args)
    except RunNotFound as exc:
        print(f"gymtrace timeline: {exc}", file=sys.stderr)
        return 2
    chrome = args.format == "chrome"
    out = Path(args.output or (DEFAULT_CHROME if chrome else DEFAULT_HTML))
    if chrome:
        with open(out, "w", encoding="utf-8") as f:
            write_chrome_trace(view, f)
    else:
        out.write_text(timeline_page(view), encoding="utf-8")
    print(
        f"run {view.name}: {len(view.rollouts)} rollouts, {len(view.bars)} bars in {len(view.lanes)} lanes,"
        f" {len(view.bands)} train steps -> {out}"
    )
    return 0
