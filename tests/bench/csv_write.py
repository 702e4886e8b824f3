"""What `mstail parse --to csv` spends writing a row: `write_csv` over MindFormers-like records (a source, the
reserved keys, 8 metrics), CPU time per row, best of --rounds; and of that, a row's `time` as ISO 8601 (`csv_time`).

Run: python tests/bench/csv_write.py [--rows 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib
import io
import time

output = importlib.import_module("mstail.tailer.offline.output")  # the module, not the package's `output` function


def rows(count: int) -> list:
    return [{"source": "rank_0", "step": step, "epoch": 1, "time": 1.7e9 + step * 0.257, "segment": 0, "line": step,
             "loss": 1.0 / step, "lr": 1e-4, "grad_norm": 1.5, "loss_scale": 65536.0, "overflow": 0,
             "step_time_ms": 257.0, "samples_per_s": 31.1, "perplexity": 2.7} for step in range(1, count + 1)]


def best_cpu(work, rounds: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    records = rows(args.rows)
    whole = best_cpu(lambda: output.write_csv(records, io.StringIO()), args.rounds)
    times = best_cpu(lambda: [output.csv_time(r["time"]) for r in records], args.rounds)
    print(f"write_csv: {whole / args.rows * 1e6:.2f} us CPU a row ({args.rows:,} rows, best of {args.rounds})")
    print(f"  of which csv_time: {times / args.rows * 1e6:.2f} us a row")


if __name__ == "__main__":
    main()
