"""Offline parse speed: `mstail parse` next to the loop a competent user writes and the floor of merely reading lines.

Two cases, each of --size-mb (default 100 MB), written into a temporary folder:
- single (the goal's case, issue 16): one newest-style MindFormers `info.log` (step, progress, grouped-lr,
  TrainingStateMonitor and warning lines, checkpoints, two relaunches; about 60,000 steps). mstail parses it in
  pieces in worker processes (one per usable CPU), joined at checked seams.
- mixed: two sources built from real start-ups (tests/real_logs/) and v1.8 format strings
  (shared/research/log-formats.md §1-§4):
- `output/log/rank_0/info.log` (about 60 %): file-handler prefix; per step a non-sink step line with
  global_norm and throughput (an occasional nan, overflow and loss-scale halving), its progress line, the
  grouped-lr line and TrainingStateMonitor lines; a checkpoint block every 1000 steps; two crashes logged as
  ERROR records with their traceback, each followed by a relaunch (config dump again, `initial step`, steps
  resume from the last checkpoint: a new run segment).
- `output/msrun_log/worker_0.log` (about 40 %): the stdout prefix with the path-bearing logger name, the same
  kind of steps, MindSpore `[WARNING] ME(...)` lines, C++ glog lines and a few raw tracebacks.
  The two files are parsed by two worker processes.

Measured in the same run, alternating, best of --rounds (default 3):
- floor: iterate the files' lines in binary (`for line in file`), nothing else;
- line reading (for reference, no goal): mstail's own reading alone, `mstail.tailer.inputs.lines.LineSplitter` turning 1 MiB
  chunks into decoded lines with offsets;
- competent loop (both cases; issue 16's baseline): what a competent user writes for these logs: one `re.search` per
  line for each kind of line that gives a record its values (the step line and the progress line), each regex led by
  literal text, fields converted, non-finite numbers encoded, `json.dumps` per record;
- mstail: `python -m mstail parse FILES -o OUT` as a subprocess (start-up included), and the same command
  in-process (`mstail.tailer.app.cli.main`). Worker processes make wall time gain from a second CPU; CPU time counts the
  workers too;
- issue's prototype (the single case only): issue 16's prototype design finished for that log's lines and no others
  (parse_prototype.py: two forked workers, start-up included), for what goal 1 costs at best on this machine; its
  records are checked to equal mstail's.
The baseline's records are checked against mstail's (same steps, same values).

Run: python tests/bench/parse_speed.py [--case single|mixed|both] [--size-mb 100] [--rounds 3] [--keep DIR] [--stages]
[--timeline]

--stages: where a step's time goes, instead of the comparison: `mstail parse`'s path over the single case's log in
this process (`jobs=1`), one stage more each time (reading the blocks; the literal search; matching, records and
amends, `feed_block` into the main parser; the derived series; settling; rows and JSON: `--jobs 1` whole), the CPU
time of each run and the difference its stage adds, best of --rounds.

--timeline: when each process of one `mstail parse` subprocess over the single case's log does what (start-up,
imports, formats, the workers' pieces, seams, the join, the exit), seconds since the launch and CPU seconds, and how
long both CPUs were busy, --rounds times; the other figures are not measured.

Goals: `mstail parse` >= 2.5x faster than the competent loop on the single case (issue "History as columns", which
replaced the earlier issues' 4x after measuring what CPython allows) and <= 10x the floor (judged on the subprocess wall time; CPU times are printed next to them, as other load on a shared machine inflates
wall time, and the load average before and after). Exit status 0 when every case run meets both, 1 otherwise. The
baseline / mstail ratio of each round and their median are printed too, for information: on a machine whose speed
drifts, two runs of the same round are nearer in time than the two programs' best runs.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import io
import json
import math
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mstail.tailer.inputs.discovery import SourceNamer  # noqa: E402
from mstail.tailer.inputs.lines import LineSplitter  # noqa: E402
from mstail.tailer.inputs.kind import items_of as feed  # noqa: E402
from mstail.tailer.offline.reading import READ_CHUNK, Chain, chain_lines, new_parser, parse_chain  # noqa: E402

GOAL_VS_BASELINE = 2.5  # mstail at least this many times faster than the competent loop
GOAL_VS_FLOOR = 10.0  # mstail at most this many times the floor's time
REAL_LOGS = ROOT / "tests" / "real_logs"
MB = 1e6


# -- the mixed log ----------------------------------------------------------------------------------------------
FILE_PREFIX = "[{level}] {ts} [mindformers/{where}] {func}: "
STDOUT_PREFIX = "{ts} - mindformers/home/ma-user/work/runs/output/log[mindformers/{where}] - {level} - "
CALLBACK = "core/callback/callback.py"
STEP_LINE = (
    "{{ Epoch:[{epoch:3d}/{epochs:3d}], step:[{step:5d}/{spe:5d}], loss:[{loss:5.6f}/{avg:5.6f}], "
    "per_step_time: {ms}ms, lr: {lr}, overflow cond: {overflow}, loss_scale: {scale}, global_norm: [{norm}], "
    "train_throughput_per_npu: {tflops:.3f}T"
)
PROGRESS_LINE = "  {percent:4.1f}% |{bar:<50}| {sps:.5f} samples/s/p  {remain} }}"
PARAMS = ("model.layers.0.attention.wq.weight", "model.layers.0.feed_forward.w1.weight")  # TrainingStateMonitor
PID = 88317
ME_WARNINGS = (
    "[mindspore/context.py:1338] For 'context.set_context', the parameter 'ascend_config' will be deprecated and "
    "removed in a future version. Please use the api mindspore.device_context.ascend.op_precision.precision_mode() instead.",
    "[mindspore/train/serialization.py:1512] The type of model.layers.0.attention.wq.weight:Float32 in "
    "'parameter_dict' is different from the type of it in 'net':BFloat16, then the type convert from Float32 to "
    "BFloat16 in the network.",
)
GLOG_LINES = (
    "[WARNING] DEVICE({pid},ffffa4786be0,python):{ms_ts} [mindspore/ccsrc/plugin/res_manager/ascend/mem_manager/"
    "ascend_memory_adapter.cc:213] Initialize] Reserved memory size for other components(3187671040) is less than "
    "recommend size(4078088192), It may lead to Out Of Memory in HCCL or other components",
    "[WARNING] PRE_ACT({pid},ffff2c7ff0e0,python):{ms_ts} [mindspore/ccsrc/backend/common/mem_reuse/"
    "mem_dynamic_allocator.cc:541] operator()] Free memory is not enough, try to use the reserved memory.",
)
TRACEBACK = """Traceback (most recent call last):
  File "/home/ma-user/work/mindformers/run_mindformer.py", line 263, in <module>
    main(config_)
  File "/home/ma-user/work/mindformers/run_mindformer.py", line 48, in main
    trainer.train()
  File "/home/ma-user/work/mindformers/mindformers/trainer/trainer.py", line 485, in train
    self.trainer.train(
  File "/usr/local/python3.10/lib/python3.10/site-packages/mindspore/train/model.py", line 1201, in train
    self._train(epoch,
  File "/usr/local/python3.10/lib/python3.10/site-packages/mindspore/train/model.py", line 116, in wrapper
    func(self, *args, **kwargs)
RuntimeError: Call aclnnMatmul failed, detail:EZ9999: Inner Error!

----------------------------------------------------
- C++ Call Stack: (For framework developers)
----------------------------------------------------
mindspore/ccsrc/plugin/device/ascend/kernel/opapi/aclnn_kernel_mod.h:212 Launch"""
THREAD_TRACEBACK = """Exception in thread Thread-7 (_run_loader):
Traceback (most recent call last):
  File "/usr/local/python3.10/lib/python3.10/threading.py", line 1016, in _bootstrap_inner
    self.run()
  File "/usr/local/python3.10/lib/python3.10/site-packages/mindspore/dataset/engine/queue.py", line 88, in _run_loader
    batch = next(self._iterator)
OSError: [Errno 28] No space left on device: '/cache/dataset/shard_3.mindrecord'"""
CHECKPOINT = (
    "......Saving ckpt......",
    "global_batch_size: 512",
    "epoch_num: {epoch}",
    "step_num: {step}",
    "global_step: {global_step}",
    "Finish saving ckpt of epoch {epoch} step {step} using 3.{ms:03d} seconds",
)


def _preamble(name: str) -> List[str]:
    """The real start-up of a MindFormers 2.0.0 run (banners, config dumps): every line before its first step."""
    lines = (REAL_LOGS / name).read_text(encoding="utf-8").splitlines()
    first_step = next(i for i, line in enumerate(lines) if "{ Epoch:[" in line)
    return lines[:first_step]


class Clock:
    """Timestamps of the log's lines, formatted once per second."""

    def __init__(self, start: float) -> None:
        self.now = start
        self._second = -1
        self._text = ("", "")

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def stamps(self) -> Tuple[str, str]:
        """(logging's `2026-01-20 03:15:44,908`, MindSpore's `2026-01-20-03:15:44.908.089`)."""
        second = int(self.now)
        if second != self._second:
            self._second = second
            local = time.localtime(second)
            self._text = (time.strftime("%Y-%m-%d %H:%M:%S", local), time.strftime("%Y-%m-%d-%H:%M:%S", local))
        millis = int((self.now - second) * 1000)
        return f"{self._text[0]},{millis:03d}", f"{self._text[1]}.{millis:03d}.{(millis * 7) % 1000}"


class Training:
    """Step values of one simulated run: a decaying loss with noise, warm-up + cosine lr, rare nan/overflow."""

    def __init__(self, rng: random.Random, spe: int, epochs: int) -> None:
        self.rng, self.spe, self.epochs = rng, spe, epochs
        self.scale = 65536.0
        self.losses: List[float] = []  # this epoch's, for the non-sink running mean

    def step(self, global_step: int) -> Tuple[str, str, float, int]:
        """(step line, progress line, lr, step time in ms) of a global step."""
        rng = self.rng
        epoch, step = (global_step - 1) // self.spe + 1, (global_step - 1) % self.spe + 1
        if step == 1:
            self.losses = []
        total = self.spe * self.epochs
        loss = 2.0 + 9.0 * math.exp(-global_step / 3000.0) + rng.gauss(0.0, 0.05)
        norm = 1.2 + rng.random() * 0.6
        overflow = "False"
        if global_step % 7919 == 777:
            loss = norm = math.nan  # the running mean stays nan until the epoch ends, as MindFormers prints it
        elif rng.random() < 1 / 1500:
            overflow, self.scale = "True", self.scale / 2
        self.losses.append(loss)
        warmup, peak = 2000, 3e-4
        lr = peak * global_step / warmup if global_step < warmup else peak * 0.5 * (1 + math.cos(math.pi * global_step / total))
        ms = int(1800 + rng.random() * 120)
        line = STEP_LINE.format(
            epoch=epoch, epochs=self.epochs, step=step, spe=self.spe, loss=loss,
            avg=sum(self.losses) / len(self.losses), ms=ms, lr=f"{lr:.8g}", overflow=overflow,
            scale=self.scale, norm=f"{norm:.8g}", tflops=130 + rng.random() * 5,
        )
        percent = 100.0 * global_step / total
        remain = int((total - global_step) * ms / 1000)
        progress = PROGRESS_LINE.format(
            percent=percent, bar="\u2588" * int(percent / 2), sps=512 / 8 / (ms / 1000),
            remain=f"{remain // 3600}:{remain // 60 % 60:02d}:{remain % 60:02d}",
        )
        return line, progress, lr, ms




def _write_log(path: Path, size: int, rng: random.Random, preamble: List[str], prefix: str, worker: bool,
               warnings: bool = False) -> None:
    """One log file of about `size` bytes (see the module docstring for what it holds). info.log (worker=False)
    holds two crashes, each followed by a relaunch, and the end of training; a worker log (msrun truncates it on
    a relaunch) holds MindSpore's own lines too and ends with its crash. `warnings`: MindSpore's WARNING lines
    each step, as a run with a memory-tight device prints them (the single-file case: about 1.5 KB a step)."""
    spe = 1000
    epochs = max(2, math.ceil(size / 1500 / spe))  # about 1.5 KB per step
    training = Training(rng, spe, epochs)
    clock = Clock(1_764_000_000.0)
    relaunch_at = [] if worker else [size // 3, size * 2 // 3]
    written = 0
    lines: List[str] = []

    def log(where: str, func: str, message: str, level: str = "INFO") -> None:
        lines.append(prefix.format(level=level, ts=clock.stamps()[0], where=where, func=func) + message)

    def crash() -> None:
        if worker:  # stderr goes to the worker log raw
            lines.append(f"[ERROR] RUNTIME_FRAMEWORK({PID},ffffa4786be0,python):{clock.stamps()[1]} [mindspore/ccsrc/"
                         "runtime/pipeline/async_rqueue.cc:227] WorkerLoop] Run task failed")
            lines.extend(TRACEBACK.splitlines())
        else:  # logged as one ERROR record (cloud_monitor)
            log("tools/cloud_monitor.py:43", "wrapper", TRACEBACK, level="ERROR")

    def flush() -> int:
        data = ("\n".join(lines) + "\n").encode("utf-8")
        handle.write(data)
        lines.clear()
        return len(data)

    with open(path, "wb") as handle:
        global_step = 0
        while written < size:
            lines.extend(preamble)
            if global_step:  # a relaunch resumes from the last checkpoint
                global_step -= global_step % 1000
                log("trainer/base_trainer.py:1476", "training_process", f"initial epoch: {global_step // spe}")
                log("trainer/base_trainer.py:1477", "training_process", f"initial step: {global_step}")
            log("trainer/base_trainer.py:1680", "training_process", ".........Starting Training Model..........")
            while written < size and not (relaunch_at and written >= relaunch_at[0]):
                global_step += 1
                step_line, progress, lr, ms = training.step(global_step)
                clock.advance(ms / 1000)
                epoch, step = (global_step - 1) // spe + 1, (global_step - 1) % spe + 1
                log(f"{CALLBACK}:821", "print_output_info", step_line)
                if worker and global_step % 30 == 0:
                    lines.append(GLOG_LINES[0].format(pid=PID, ms_ts=clock.stamps()[1]))
                log(f"{CALLBACK}:838", "print_output_info", progress)
                log(f"{CALLBACK}:846", "print_output_info", f"default_lr: {lr:.6e}, equal to `lr:` above.")
                if warnings:
                    lines.append(GLOG_LINES[1].format(pid=PID, ms_ts=clock.stamps()[1]))
                    lines.append(f"[WARNING] ME({PID}:281473680449568,MainProcess):{clock.stamps()[1]} {ME_WARNINGS[1]}")
                where = f"Epoch:[{epoch:3d}/{epochs:3d}], step:[{step:5d}/{spe:5d}]"
                for param in PARAMS:
                    log(f"{CALLBACK}:1630", "_to_log", f"{where} local_norm/{param}: {rng.random() * 0.1:.6f}")
                if global_step % 1000 == 0:
                    for text in CHECKPOINT:
                        log(f"{CALLBACK}:1089", "step_end", text.format(epoch=epoch, step=step, global_step=global_step, ms=ms % 1000))
                if worker and global_step % 50 == 25:
                    lines.append(f"[WARNING] ME({PID}:281473680449568,MainProcess):{clock.stamps()[1]} {ME_WARNINGS[global_step // 50 % 2]}")
                if worker and global_step % 45 == 10:
                    lines.append(GLOG_LINES[1].format(pid=PID, ms_ts=clock.stamps()[1]))
                if worker and global_step % 20000 == 7000:
                    lines.extend(THREAD_TRACEBACK.splitlines())
                if len(lines) > 2000:
                    written += flush()
            if relaunch_at and written >= relaunch_at[0]:
                relaunch_at.pop(0)
                crash()
                clock.advance(600)
        if worker:
            crash()
        else:
            log("trainer/base_trainer.py:1689", "training_process", ".........Training Over!.............")
        written += flush()


def build_logs(folder: Path, size: int, seed: int = 1) -> List[Path]:
    rng = random.Random(seed)
    info = folder / "output" / "log" / "rank_0" / "info.log"
    worker = folder / "output" / "msrun_log" / "worker_0.log"
    for path in (info, worker):
        path.parent.mkdir(parents=True, exist_ok=True)
    info_start = _preamble("mindformers-2.0.0_graph_output_log_rank_0_info.log")
    worker_start = _preamble("mindformers-2.0.0_graph_stdout.log")
    _write_log(info, size * 6 // 10, rng, info_start, FILE_PREFIX, worker=False)
    _write_log(worker, size - size * 6 // 10, rng, worker_start, STDOUT_PREFIX, worker=True)
    return [info, worker]


def build_single_log(folder: Path, size: int, seed: int = 1) -> List[Path]:
    """The single-file case: one newest-style info.log (see the module docstring)."""
    info = folder / "single" / "output" / "log" / "rank_0" / "info.log"
    info.parent.mkdir(parents=True, exist_ok=True)
    start = _preamble("mindformers-2.0.0_graph_output_log_rank_0_info.log")
    _write_log(info, size, random.Random(seed), start, FILE_PREFIX, worker=False, warnings=True)
    return [info]


# -- the three measured programs --------------------------------------------------------------------------------
def floor(paths: Sequence[Path], out: Path) -> None:
    for path in paths:
        with open(path, "rb") as handle:
            for _ in handle:
                pass


def line_reading(paths: Sequence[Path], out: Path) -> None:
    """For reference: mstail's own reading alone (bytes -> decoded lines with offsets and numbers)."""
    for path in paths:
        splitter = LineSplitter()
        with open(path, "rb") as handle:
            for data in iter(lambda: handle.read(READ_CHUNK), b""):
                splitter.feed(data)


def json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


LINE_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def line_time(line: str) -> Optional[float]:
    found = LINE_TIME.search(line)
    if found is None:
        return None
    parsed = time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")
    return time.mktime(parsed) + int(found.group(2)) * 1000 / 1e6


# The loop a competent user writes (issue 16: "one `re.search` for the step line on every line, one for the
# progress line, `json.dumps` per record"): one regex per kind of line that makes a record's values (the step line
# and the progress line: the only ones in both cases' logs, under either prefix), each led by literal text, which
# `re` finds at C speed. Not the format's own rules: searched unanchored on whole lines, its progress rule is tried
# at every position of every line; that loop took 3x as long and flattered mstail.
STEP = re.compile(
    r"Epoch:\[\s*(\d+)/\s*\d+\], step:\[\s*(\d+)/\s*(\d+)\], loss:\[?\s*([-+\w.]+)(?:/\s*([-+\w.]+)\])?, .*?"
    r"per_step_time: *(\d+)ms, (?:lr: *([^,]+), )?overflow cond: *(\w+), loss_scale: *([^,]+)"
    r"(?:, global_norm: *\[?\s*([-+\w.]+)\]?)?(?:, train_throughput_per_npu: *([-+\w.]+)T)?")
PROGRESS = re.compile(r"\| *([-+\w.]+) samples/s/p")
STEP_FIELDS = ((4, "loss", float), (5, "loss_avg", float), (6, "step_time_ms", int), (7, "lr", float),
               (8, "overflow", lambda t: int(t == "True")), (9, "loss_scale", float), (10, "grad_norm", float),
               (11, "throughput_tflops", float))


def competent(paths: Sequence[Path], out_path: Path) -> None:
    """The competent loop: one `re.search` for the step line and one for the progress line per line, per file."""
    namer = SourceNamer()
    with open(out_path, "w", encoding="utf-8") as out:
        for path in paths:
            source, pending, last_step, segment = namer.name(path), None, None, 0
            with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
                for number, line in enumerate(handle, 1):
                    found = STEP.search(line)
                    if found is not None:
                        if pending is not None:
                            out.write(json.dumps({k: json_value(v) for k, v in pending.items()}) + "\n")
                        epoch = int(found[1])
                        step = (epoch - 1) * int(found[3]) + int(found[2])
                        segment += last_step is not None and step < last_step
                        last_step = step
                        pending = {"source": source, "step": step, "epoch": epoch, "time": line_time(line),
                                   "segment": segment, "line": number}
                        pending.update((name, convert(found[group])) for group, name, convert in STEP_FIELDS
                                       if found[group] is not None)
                        continue
                    found = PROGRESS.search(line)
                    if found is not None and pending is not None:
                        pending.setdefault("samples_per_s", float(found[1]))
            if pending is not None:
                out.write(json.dumps({k: json_value(v) for k, v in pending.items()}) + "\n")


def mstail_subprocess(paths: Sequence[Path], out: Path) -> None:
    command = [sys.executable, "-m", "mstail", "parse", *map(str, paths), "-o", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mstail parse failed ({done.returncode}): {done.stderr.strip()}")


def prototype(paths: Sequence[Path], out: Path) -> None:
    """Issue 16's prototype design, finished for the single case's log only (parse_prototype.py), as a subprocess."""
    (path,) = paths
    command = [sys.executable, str(Path(__file__).with_name("parse_prototype.py")), str(path), "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the prototype failed ({done.returncode}): {done.stderr.strip()}")


def mstail_in_process(paths: Sequence[Path], out: Path) -> None:
    from mstail.tailer.app.cli import main

    with contextlib.redirect_stderr(io.StringIO()):
        code = main(["parse", *map(str, paths), "-o", str(out)])
    if code != 0:
        raise SystemExit(f"mstail parse (in-process) failed ({code})")


# -- measuring --------------------------------------------------------------------------------------------------
def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (a subprocess's work counts too)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(
    programs: Dict[str, Callable[[Sequence[Path], Path], None]], paths: Sequence[Path], folder: Path, rounds: int
) -> Tuple[Dict[str, float], Dict[str, float], Dict[str, List[float]]]:
    """Best wall time and best CPU time of each program over `rounds`, the order rotating each round (noise hits
    all alike), and every round's wall times. CPU time is printed too because on a shared machine other
    processes' load inflates wall time."""
    best = {name: math.inf for name in programs}
    best_cpu = dict(best)
    walls: Dict[str, List[float]] = {name: [] for name in programs}
    names = list(programs)
    for round_no in range(rounds):
        order = names[round_no % len(names):] + names[: round_no % len(names)]
        for name in order:
            started, cpu_started = time.perf_counter(), cpu_seconds()
            programs[name](paths, folder / f"{name}.jsonl")
            elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu_started
            best[name], best_cpu[name] = min(best[name], elapsed), min(best_cpu[name], cpu)
            walls[name].append(elapsed)
            print(f"  round {round_no + 1}: {name:<20} {elapsed:7.2f} s  (cpu {cpu:.2f} s)", flush=True)
    return best, best_cpu, walls


def check(mstail_out: Path, other_out: Path, other: str, perplexity: bool = False) -> Tuple[bool, str]:
    """Both outputs hold the same records (steps and values, as JSON values: 1.5e-7 == 1.5e-07) in the same order.
    `other`: the program that wrote `other_out`; `perplexity`: it writes the built-in derived perplexity too."""
    with open(mstail_out, encoding="utf-8") as a, open(other_out, encoding="utf-8") as b:
        ours, theirs = [json.loads(line) for line in a], [json.loads(line) for line in b]
    if len(ours) != len(theirs):
        return False, f"{len(ours)} records from mstail, {len(theirs)} from the {other}"
    for mine, its in zip(ours, theirs):
        # mstail adds the built-in derived perplexity = exp(loss) (README, Derived series), work the competent loop skips
        if not perplexity:
            mine = {key: value for key, value in mine.items() if not key.endswith("perplexity")}
        if mine != its:
            return False, f"first difference:\n    mstail {mine}\n    {other} {its}"
    nan = sum(1 for r in ours if "NaN" in r.values())
    segments = len({(r["source"], r["segment"]) for r in ours})
    return True, f"{len(ours)} records identical (steps, values, times; {nan} with NaN; {segments} source segments)"


def run_case(name: str, paths: List[Path], folder: Path, rounds: int) -> bool:
    """Measure one case and print its figures; True when its goals are met."""
    baseline = BASELINE
    size = sum(p.stat().st_size for p in paths)
    lines = 0
    for path in paths:
        with open(path, "rb") as handle:
            lines += sum(1 for _ in handle)
    print(f"\n== {name}: {size / MB:.1f} MB, {lines:,} lines in {', '.join(str(p.relative_to(folder)) for p in paths)}")
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"Python {sys.version.split()[0]}")
    programs = {
        "floor": floor,
        "line reading": line_reading,
        baseline: competent,
        "mstail (subprocess)": mstail_subprocess,
        "mstail (in-process)": mstail_in_process,
    }
    if name == "single":
        programs[PROTOTYPE] = prototype
    out = folder / name
    out.mkdir(exist_ok=True)
    best, best_cpu, walls = measure(programs, paths, out, rounds)

    ok, detail = check(out / "mstail (subprocess).jsonl", out / f"{baseline}.jsonl", baseline)
    same = (out / "mstail (subprocess).jsonl").read_bytes() == (out / "mstail (in-process).jsonl").read_bytes()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    notes = {"floor": "iterating the lines in binary", "line reading": "mstail's reading alone, for reference"}
    for program, seconds in best.items():
        print(f"{program:<20} {seconds:7.2f} s  {size / MB / seconds:7.1f} MB/s  cpu {best_cpu[program]:6.2f} s  "
              f"{notes.get(program, '')}".rstrip())
    sub, inproc = best["mstail (subprocess)"], best["mstail (in-process)"]
    vs_baseline, vs_floor = best[baseline] / sub, sub / best["floor"]
    print(f"mstail vs {baseline}: {vs_baseline:.2f}x faster (in-process {best[baseline] / inproc:.2f}x)   goal >= {GOAL_VS_BASELINE:g}x")
    print(f"mstail vs floor: {vs_floor:.2f}x the floor's time (in-process {inproc / best['floor']:.2f}x)   goal <= {GOAL_VS_FLOOR:g}x")
    paired = sorted(n / m for n, m in zip(walls[baseline], walls["mstail (subprocess)"]))
    print(f"per round ({baseline} / mstail of the same round, nearer in time than the two bests on a drifting machine): "
          f"{', '.join(f'{r:.2f}x' for r in paired)}; median {statistics.median(paired):.2f}x (not judged)")
    cpu_sub = best_cpu["mstail (subprocess)"]
    print(f"by CPU time: {best_cpu[baseline] / cpu_sub:.2f}x faster than {baseline}, {cpu_sub / best_cpu['floor']:.2f}x the floor")
    print(f"check {baseline} == mstail: {'OK' if ok else 'FAILED'}: {detail}")
    print(f"check subprocess == in-process output: {'OK' if same else 'FAILED'}")
    if PROTOTYPE in best:
        proto_ok, proto_detail = check(out / "mstail (subprocess).jsonl", out / f"{PROTOTYPE}.jsonl", PROTOTYPE,
                                       perplexity=True)
        wall = best[PROTOTYPE]
        print(f"{PROTOTYPE} (parse_prototype.py: this log's lines only, none of mstail's generality): "
              f"{best[baseline] / wall:.2f}x faster than the {baseline}, {wall / best['floor']:.2f}x the floor; "
              f"check {PROTOTYPE} == mstail: {'OK' if proto_ok else 'FAILED'}: {proto_detail}")
    met = ok and same and vs_baseline >= GOAL_VS_BASELINE and vs_floor <= GOAL_VS_FLOOR
    print(f"{name}: {'goals met' if met else 'GOALS MISSED'}")
    return met


BASELINE = "competent loop"
PROTOTYPE = "issue's prototype"


def stages(path: Path, rounds: int) -> None:
    """Print the CPU time of `mstail parse`'s path over `path` in this process, a stage more each time (--stages)."""
    from mstail.parsers.blocks import finder_for
    from mstail.parsers.derived import load_derived
    from mstail.parsers.loader import load_formats
    from mstail.tailer.inputs.lines import Block
    from mstail.tailer.offline import run_parse

    formats, derived, chain = load_formats(), load_derived(None), Chain(path.name, [path])

    def reading() -> None:
        for _ in chain_lines(chain, blocks=True):
            pass

    def literal_search() -> None:  # the lines before the format is known are fed: it is needed for the search
        parser = new_parser(chain, formats, None, derived)
        for _, piece in chain_lines(chain, blocks=True):
            if parser.main.format is None or not isinstance(piece, Block):
                feed(parser, piece, 0.0)
            else:
                finder_for(parser.main.format).starts(piece.data)  # type: ignore[union-attr]

    def matching() -> None:  # the main parser's own items: no derived series
        parser = new_parser(chain, formats, None, derived)
        for _, piece in chain_lines(chain, blocks=True):
            feed(parser.main, piece, 0.0)  # type: ignore[arg-type, union-attr]

    def derived_series() -> None:
        parser = new_parser(chain, formats, None, derived)
        for _, piece in chain_lines(chain, blocks=True):
            feed(parser, piece, 0.0)  # type: ignore[arg-type]

    def settling() -> None:
        for _ in parse_chain(chain, new_parser(chain, formats, None, derived), now=0.0):  # type: ignore[arg-type]
            pass

    def rows_and_json() -> None:  # all of `mstail parse --jobs 1` but its start-up
        with open(os.devnull, "w", encoding="utf-8") as out, contextlib.redirect_stderr(io.StringIO()):
            run_parse([str(path)], formats, None, "jsonl", out, jobs=1, derived=derived)

    programs = [("reading", reading), ("literal search", literal_search), ("matching, records, amends", matching),
                ("derived series", derived_series), ("settling", settling), ("rows and JSON", rows_and_json)]
    best = {name: math.inf for name, _ in programs}
    print(f"\n== stages of one process over {path} (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    for _ in range(rounds):
        for name, program in programs:
            started = time.process_time()
            program()
            best[name] = min(best[name], time.process_time() - started)
    before = 0.0
    for name, seconds in best.items():
        print(f"{name:<26} cpu {seconds:6.3f} s  this stage {seconds - before:+6.3f} s")
        before = seconds
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# -- the timeline (--timeline) ---------------------------------------------------------------------------------
#: Run as the `mstail parse` subprocess of --timeline: each function of the parse path named in STEPS (where the tree
#: has it) notes when a process enters and leaves it, seconds since the launch and the process's CPU seconds, in a file.
TIMELINE_BOOT = r"""
import atexit, functools, importlib, os, sys, time
T0, NOTES = float(os.environ["TIMELINE_T0"]), os.environ["TIMELINE_NOTES"]
def note(what):
    with open(NOTES, "a", encoding="utf-8") as handle:  # small appends: whole lines, whichever process writes
        handle.write(f"{time.time() - T0:.4f} {os.getpid()} {time.process_time():.4f} {what}\n")
note("interpreter ready")
from mstail.tailer.app import cli
from mstail.tailer import offline
from mstail.tailer.offline import parallel, split
note("imports done (cli, offline)")
def noted(function, label):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        index = getattr(args[0], "index", None) if args else None  # a file's piece: which one
        what = f"{label} {index}" if isinstance(index, int) else label
        note(what + " >")
        try:
            return function(*args, **kwargs)
        finally:
            note(what + " <")
    return wrapper
for module_name, name, label in STEPS:
    owner = importlib.import_module(module_name)
    *path, name = name.split(".")  # "Class.method": a method
    for part in path:
        owner = getattr(owner, part)
    if hasattr(owner, name):
        setattr(owner, name, noted(getattr(owner, name), label))
atexit.register(note, "exit")
sys.exit(cli.main(sys.argv[1:]))
"""
STEPS = (  # module, function, what it is; a function imported by name elsewhere is wrapped there too
    ("mstail.tailer.app.cli", "_formats", "formats"),
    ("mstail.tailer.offline", "run_parse", "run_parse"),
    ("mstail.tailer.offline.parallel", "run_parallel", "run_parallel"),
    ("mstail.tailer.offline.parallel", "_worker_init", "worker start"),
    ("mstail.tailer.offline.parallel", "_parse_in_worker", "worker's unit"),
    ("mstail.tailer.offline.parallel", "parse_piece", "piece"),
    ("mstail.tailer.offline.split", "_lines_before", "lines before the piece"),
    ("mstail.tailer.offline.split", "_publish", "places published"),
    ("mstail.tailer.offline.split", "_seam", "seam"),
    ("mstail.tailer.offline.split", "_wait_for", "waiting for the next piece's places"),
    ("mstail.tailer.offline.parallel", "_joined", "join"),
    ("mstail.tailer.offline.parallel", "copy_jsonl", "copy"),
    ("mstail.tailer.offline.parallel", "copy_piece", "copy piece"),
    ("concurrent.futures.process", "ProcessPoolExecutor.shutdown", "workers stopped"),
    ("tempfile", "TemporaryDirectory.cleanup", "workers' files removed"),
)


def timeline(paths: Sequence[Path], folder: Path, rounds: int) -> None:
    """Print what each process of `mstail parse PATHS` does when (--timeline), `rounds` times."""
    notes = folder / "timeline.txt"
    boot = f"STEPS = {STEPS!r}\n{TIMELINE_BOOT}"
    for round_no in range(rounds):
        notes.unlink(missing_ok=True)
        print(f"\n== timeline {round_no + 1} of `mstail parse {' '.join(map(str, paths))}` (load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        launched = time.time()
        env = dict(os.environ, TIMELINE_T0=repr(launched), TIMELINE_NOTES=str(notes))
        done = subprocess.run([sys.executable, "-c", boot, "parse", *map(str, paths), "-o", str(folder / "timeline.jsonl")],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        ended = time.time() - launched
        if done.returncode != 0:
            raise SystemExit(f"mstail parse failed ({done.returncode}): {done.stderr.strip()}")
        events = sorted((float(at), int(pid), float(cpu), what)
                        for at, pid, cpu, what in (line.split(" ", 3) for line in notes.read_text().splitlines()))
        parent = events[0][1]
        names = {parent: "parent"}
        for _, pid, _, _ in events:
            names.setdefault(pid, f"worker {len(names)}")
        for at, pid, cpu, what in events:
            print(f"  {at:7.3f} s  {names[pid]:<9} cpu {cpu:6.3f} s  {what}")
        print(f"  {ended:7.3f} s  parent    exited")
        spans = {}  # a worker's (first, last) note: when it was busy
        for at, pid, _, _ in events:
            if pid != parent:
                first, last = spans.get(pid, (at, at))
                spans[pid] = (min(first, at), max(last, at))
        if spans:
            both = max(0.0, min(last for _, last in spans.values()) - max(first for first, _ in spans.values()))
            cpu = sum(max(c for _, p, c, _ in events if p == pid) for pid in spans)
            print(f"  workers from {min(f for f, _ in spans.values()):.3f} to {max(end for _, end in spans.values()):.3f} s "
                  f"(cpu {cpu:.3f} s); all of them at once for {both:.3f} s of {ended:.3f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("single", "mixed", "both"), default="both",
                        help="single: one info.log (the goal's case); mixed: two sources (default both)")
    parser.add_argument("--size-mb", type=float, default=100.0, help="size of each case's log (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each program; the best counts")
    parser.add_argument("--keep", metavar="DIR", help="write the logs and outputs here and keep them")
    parser.add_argument("--timeline", action="store_true",
                        help="what each process of one mstail parse of the single case's log does when")
    parser.add_argument("--stages", action="store_true",
                        help="the CPU time of each stage of mstail parse over the single case's log, in this process")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        folder = Path(args.keep) if args.keep else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mstail-bench-")))
        folder.mkdir(parents=True, exist_ok=True)
        formats_dir = folder / "no-user-formats"  # the built-ins only, whatever the user has configured
        formats_dir.mkdir(exist_ok=True)
        os.environ["MSTAIL_FORMATS_DIR"] = str(formats_dir)
        if args.stages:
            stages(build_single_log(folder, int(args.size_mb * MB))[0], args.rounds)
            return 0
        if args.timeline:
            timeline(build_single_log(folder, int(args.size_mb * MB)), folder, args.rounds)
            return 0
        # mstail's bytecode written once, as installing it with pip does: where PYTHONDONTWRITEBYTECODE is set (this
        # machine's shells), every start of `mstail parse` would compile its modules from source again.
        compileall.compile_dir(str(ROOT), rx=re.compile(r"[/\\](\.venv|tests|build)([/\\]|$)"), quiet=1)
        met = True
        if args.case in ("single", "both"):
            met &= run_case("single", build_single_log(folder, int(args.size_mb * MB)), folder, args.rounds)
        if args.case in ("mixed", "both"):
            met &= run_case("mixed", build_logs(folder, int(args.size_mb * MB)), folder, args.rounds)
        print("\ngoals met" if met else "\nGOALS MISSED")
        return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
