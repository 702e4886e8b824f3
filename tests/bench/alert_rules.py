"""The alert rules' CPU per record: `AlertEngine` alone (no store, no tailer) over --records records of one source,
fed the three ways mstail feeds it: a catch-up's batches (`observe_all` of --batch records flagged history), a live
pass's few records (`observe_all` of --live records at a time) and a restart's replay (`observe` of each).

The records: a calm loss with its noise and a slow descent, a grad norm, a loss scale, an overflow flag, the log's
step time and time; every 5,000 records a stretch of rule fodder (a NaN, a loss spike, a grad norm burst, an
overflow streak, the loss scale at its floor), so each record rule fires and resolves now and then. The default
rules (every record rule but trend on); --trend switches trend on too.

Run: python tests/bench/alert_rules.py [--records 1000000] [--batch 512] [--live 1] [--rounds 3] [--trend]
    [--before REV]
Prints per way: µs of CPU a record (best of the rounds) and the alert changes made (the same from one version of the
rules to another that does not change what they judge). --before REV: each round runs this code and REV's in turn
(separate processes, the same minutes), and prints both.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from mstail.tailer.alerts.engine import AlertEngine, load_alert_rules

T0 = 1_800_000_000.0


def records(count: int) -> List[Dict[str, Any]]:
    made = []
    for number in range(count):
        phase = number % 5000
        loss = 3.0 * math.exp(-number / count) * (1.0 + 0.02 * math.sin(number * 0.7))
        norm, scale, overflow = 1.0 + 0.1 * math.cos(number * 0.3), 65536.0, False
        if phase == 1000:
            loss = math.nan
        elif 2000 <= phase < 2003:
            loss *= 40.0
        elif 3000 <= phase < 3005:
            norm = 2e4
        elif 4000 <= phase < 4012:
            overflow = True
        elif 4500 <= phase < 4502:
            scale = 1.0
        made.append({"seq": number + 1, "source": "r0", "step": number + 1, "time": T0 + number * 0.5,
                     "segment": 0, "loss": loss, "grad_norm": norm, "loss_scale": scale, "overflow": overflow,
                     "step_time_ms": 500.0})
    return made


def batched(size: int, history: bool) -> Callable[[AlertEngine, List[Dict[str, Any]]], int]:
    def feed(engine: AlertEngine, items: List[Dict[str, Any]]) -> int:
        changes, flags = 0, [history] * size
        for start in range(0, len(items), size):
            part = items[start:start + size]
            changes += len(engine.observe_all("r0", part, T0 + start * 0.5, flags[:len(part)]))
        return changes
    return feed


def one_by_one(engine: AlertEngine, items: List[Dict[str, Any]]) -> int:
    return sum(len(engine.observe("r0", item, item["time"], history=True)) for item in items)


def alternate(args: argparse.Namespace, argv: List[str]) -> None:
    """Each round: this code, then --before's, each in a process of its own; the best of the rounds per way."""
    from restart import code_of

    with tempfile.TemporaryDirectory(prefix="mstail-alert-rules-") as work:
        site = code_of(args.before, Path(work))
        codes = {"this code": dict(os.environ), args.before: {**os.environ, "PYTHONPATH": str(site)}}
        best: Dict[str, Dict[str, float]] = {code: {} for code in codes}
        changes: Dict[str, Dict[str, str]] = {code: {} for code in codes}
        for _ in range(args.rounds):
            for code, env in codes.items():
                printed = subprocess.run([sys.executable, __file__, *argv, "--rounds", "1"], env=env, check=True,
                                         capture_output=True, text=True).stdout
                for line in printed.splitlines():
                    way, figures = line[:34].strip(), line[34:].split()
                    best[code][way] = min(best[code].get(way, math.inf), float(figures[0]))
                    changes[code][way] = figures[4]
        for code in codes:
            for way, figure in best[code].items():
                print(f"{code:>12}  {way:34} {figure:6.2f} µs a record   {changes[code][way]} alert changes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=512, help="records a catch-up batch")
    parser.add_argument("--live", type=int, default=1, help="records a live pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trend", action="store_true", help="the trend rule on too")
    parser.add_argument("--before", help="also run the code of this git revision, in turn with this code's")
    args = parser.parse_args()
    if args.before:
        argv = [f"--records={args.records}", f"--batch={args.batch}", f"--live={args.live}"] + (
            ["--trend"] if args.trend else [])
        alternate(args, argv)
        return
    items = records(args.records)
    overrides = {"trend": {"enabled": True}} if args.trend else None
    ways = {f"catch-up (observe_all of {args.batch})": batched(args.batch, True),
            f"live (observe_all of {args.live})": batched(args.live, False),
            "replay (observe of each)": one_by_one}
    for label, feed in ways.items():
        best, changes = math.inf, 0
        for _ in range(args.rounds):
            engine = AlertEngine(load_alert_rules(None, overrides))
            began = time.process_time()
            changes = feed(engine, items)
            best = min(best, time.process_time() - began)
        print(f"{label:34} {best / len(items) * 1e6:6.2f} µs a record   {changes} alert changes")


if __name__ == "__main__":
    main()
