"""Another program holding the state file's lock: what a client sees of a real mstail meanwhile.

A real `mstail --log FILE --state-dir DIR --port 0` follows a MindFormers writer process (tests/conftest.py's) at
--rate steps/s; a second process (Python's sqlite3, as a `sqlite3` shell's `BEGIN EXCLUSIVE` would) holds the state
file's exclusive lock for --lock seconds from --before s after the first records. Meanwhile a client asks /healthz
every 50 ms (each answer's time) and another reads /api/stream (each record's arrival minus the time just before
the writer wrote its line). Reported, over the lock (from 0.5 s after it was taken, when a commit had met it):
/healthz p50/p99/max, live records p50/p99/max (and, for comparison, those written from 1 s after the release),
whether /healthz said the lock and how often stderr did; then how long after the release the history was written
again (/healthz 200, nothing unsaved), and whether every step was stored exactly once, in order (the API, and the
state file after a clean stop).

Run: python tests/bench/state_lock.py [--lock 60] [--rate 10] [--before 3] [--after 5]

Goal: /healthz and live p99 <= 100 ms during the lock, written again within 2 s of the release, nothing lost or
doubled. Exit status 0 when met, 1 otherwise. Linux only (/proc/loadavg).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from benchsupport import load_test_support

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostile"))
from state_lock import HealthProbe, LockHolder, StreamProbe, percentile, write_times

GOAL_P99_S = 0.100
GOAL_CLEARED_S = 2.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", type=float, default=60.0, help="seconds the other process holds the lock")
    ap.add_argument("--rate", type=float, default=10.0, help="steps a second the writer logs")
    ap.add_argument("--before", type=float, default=3.0, help="seconds of steps before the lock")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of steps after it")
    args = ap.parse_args()
    support = load_test_support()
    work = Path(tempfile.mkdtemp(prefix="mstail-bench-lock-"))
    log, times, state_dir = work / "rank_0" / "info.log", work / "times.txt", work / "state"
    log.parent.mkdir()
    log.touch()
    steps = int(args.rate * (args.before + args.lock + args.after + 2))
    server = support.start_mstail([log], work / "mstail", args=("--state-dir", str(state_dir)))
    (state,) = state_dir.glob("*.sqlite")
    health, stream = HealthProbe(server.url), StreamProbe(server.url)
    writer = support.spawn_writer(log, steps=steps, interval_s=1.0 / args.rate, times_path=times)
    try:
        server.wait_records(1)
        time.sleep(args.before)
        holder = LockHolder(state, args.lock)
        released = holder.wait()
        over = support.wait_until(lambda: next((asked for asked, _, status, facts in health.samples if asked > released
                                               and status == 200 and not facts["problems"] and not facts["unsaved"]),
                                              None), 60, message="/healthz 200 with nothing unsaved")
        support.finish_writer(writer, timeout=args.after + 30)
        server.wait_records(steps, timeout=30)
        support.wait_until(lambda: len(stream.arrived) >= steps, 30, message="every step on the stream")
    finally:
        health.stop()
        stream.stop()
        if writer.poll() is None:
            writer.kill()
    stderr = server.stderr
    records = [r["step"] for r in server.get_json(f"/api/records?limit={steps + 100}")]
    server.stop()
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True) as conn:
        stored = [row[0] for row in conn.execute("SELECT json_extract(data, '$.step') FROM items WHERE kind IS NULL "
                                                 "ORDER BY seq")]

    during = health.between(holder.held_at + 0.5, released)
    answers = [took for _, took, _, _ in during]
    written = write_times(times)
    delays = [stream.arrived[("rank_0", step)] - at for step, at in written.items()
              if holder.held_at + 0.5 <= at <= released]
    unlocked = [stream.arrived[("rank_0", step)] - at for step, at in written.items()
                if at > released + 1.0]  # the same machine's figure without the lock
    said = any(status == 503 and any("database is locked" in p for p in facts["problems"]) for _, _, status, facts
               in during)
    whole = list(range(1, steps + 1))
    complete = records == whole and stored == whole and stream.duplicates == 0 and sorted(
        step for _, step in stream.arrived) == whole
    with open("/proc/loadavg", encoding="ascii") as f:
        load = " ".join(f.read().split()[:3])

    def figures(values: list) -> str:
        return (f"p50 {percentile(values, 50) * 1000:.0f} ms, p99 {percentile(values, 99) * 1000:.0f} ms, "
                f"max {max(values) * 1000:.0f} ms over {len(values)}")

    print(f"lock held {released - holder.held_at:.1f} s by another process; {args.rate:g} steps/s; load {load}")
    print(f"/healthz during the lock: {figures(answers)}")
    print(f"live records during the lock (write -> SSE client): {figures(delays)}")
    print(f"live records from 1 s after the release (no lock): {figures(unlocked)}")
    print(f"said: /healthz {'yes' if said else 'NO'}, stderr {stderr.count('cannot write the history')} time(s), "
          f"written again said {stderr.count('the history is written again')} time(s)")
    print(f"written again {over - released:.2f} s after the release; {steps} steps: "
          f"{'every one stored once, in order' if complete else 'MISSING OR DOUBLED'} (API, stream, state file)")
    met = (percentile(answers, 99) <= GOAL_P99_S and percentile(delays, 99) <= GOAL_P99_S and said
           and over - released <= GOAL_CLEARED_S and complete)
    print("goal met" if met else "goal NOT met")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
