"""What finding the runs below a folder costs (`mstail DIR` walks it again whenever a file event may name a new run
file, at most every 0.1 s, and every 10 s anyway): `RunFinder.find()` on a tree of MindFormers runs as they look on
disk (output/log/rank_N/{info.log,info.log.1,error.log}, msrun_log/worker_N.log, a checkpoint folder per rank full of
.ckpt files, strategy files, a TensorBoard folder, a `train.log` stdout per run), next to a competent baseline in the
same process: one recursive glob per file kind (`**/rank_*/info.log`, `**/worker_*.log`, `**/*.jsonl`,
`**/events.out.*`), which finds the same files but names no run and bounds nothing; and with the formats as the
sidecar walks (text logs named by no convention judged by their head: the first walk judges, later ones reuse the
verdicts). Figures only, no goal.

Run: python tests/bench/folder_walk.py [--runs 50] [--ranks 8] [--ckpts 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, List

from mstail.parsers import load_formats
from mstail.tailer.inputs.runs import RunFinder

#: a run's stdout: MindSpore LossMonitor/TimeMonitor lines (found by what it holds)
STDOUT = Path(__file__).resolve().parents[1] / "real_logs" / "mindspore-2.10_lossmonitor_timemonitor_stdout.log"


def build(root: Path, runs: int, ranks: int, ckpts: int) -> int:
    """The tree; returns how many directory entries it holds."""
    entries = 0
    for run in range(runs):
        out = root / f"exp{run:03d}" / "output"
        out.mkdir(parents=True)
        (out.parent / "train.log").write_bytes(STDOUT.read_bytes())
        entries += 1
        for rank in range(ranks):
            files = [out / f"log/rank_{rank}/{name}" for name in ("info.log", "info.log.1", "error.log")]
            files += [out / f"checkpoint/rank_{rank}/llama_rank_{rank}-{step}_1.ckpt" for step in range(ckpts)]
            files += [out / f"strategy/ckpt_strategy_rank_{rank}.ckpt", out / f"msrun_log/worker_{rank}.log",
                      out / f"tensorboard/rank_{rank}/events.out.tfevents.1764672000.host"]
            for path in files:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"")
            entries += len(files)
    return entries


def glob_baseline(root: Path) -> List[str]:
    found: List[str] = []
    for pattern in ("**/rank_*/info.log", "**/worker_*.log", "**/*.jsonl", "**/events.out.*"):
        found += glob.glob(os.path.join(root, pattern), recursive=True)
    return found


def best(function: Callable[[], object], rounds: int) -> List[float]:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--ckpts", type=int, default=20, help="checkpoint files per rank")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mstail-walk-") as folder:
        root = Path(folder)
        entries = build(root, args.runs, args.ranks, args.ckpts)
        finder = RunFinder([str(root)])
        files = finder.find()
        assert len(files) == 2 * args.runs * args.ranks, len(files)  # worker logs and event files (info.log left out)
        judging = RunFinder([str(root)], load_formats())
        first = best(judging.find, 1)[0]
        assert len(judging.find()) == len(files) + args.runs  # and each run's train.log
        mine, theirs, formats = [], [], []
        for _ in range(args.rounds):  # alternating, so drift on a shared machine hits both
            mine += best(finder.find, 1)
            theirs += best(lambda: glob_baseline(root), 1)
            formats += best(judging.find, 1)
        load = open("/proc/loadavg").read().split()[:3]
        print(f"tree: {args.runs} runs x {args.ranks} ranks, {entries} files; {len(files)} run files found")
        print(f"RunFinder.find: median {statistics.median(mine) * 1e3:.1f} ms (min {min(mine) * 1e3:.1f})")
        print(f"4 recursive globs: median {statistics.median(theirs) * 1e3:.1f} ms (min {min(theirs) * 1e3:.1f})")
        print(f"RunFinder.find with the formats: first walk (judging {args.runs} heads) {first * 1e3:.1f} ms, then "
              f"median {statistics.median(formats) * 1e3:.1f} ms (min {min(formats) * 1e3:.1f})")
        print(f"ratio (find / globs, medians): {statistics.median(mine) / statistics.median(theirs):.2f}; "
              f"load {' '.join(load)}")


if __name__ == "__main__":
    main()
