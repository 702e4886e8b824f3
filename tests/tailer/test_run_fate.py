"""Every run ends in a fate the user can trust: real writer processes end in every way a training ends, and a real
mstail says finished, died or stopped for each (never "done" without evidence), with a `died` alert for the deaths
it watched, naming the last step, the total and the error line.

- a MindFormers log (its step lines carry the total): SIGKILL at step 10 of 100 -> died; "Training Over!" ->
  finished; no marker but the last step is the total -> finished; a traceback in the followed file -> died with its
  exception line; a traceback only in the process's stdout, which is not followed, the info.log without an error
  line -> died (its writer left before the total);
- a plain MindSpore LossMonitor log (no total, no end line): SIGKILL or a clean exit -> stopped (nothing says
  whether it finished), no alert; a traceback -> died;
- the JSONL callback under real MindSpore `Model.train`: SIGKILL mid-run -> died (it logged its start with the total
  and no end); a clean end -> finished; an exception -> died.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from mstail.parsers import load_formats
from mstail.tailer.alerts.engine import load_alert_rules
from mstail.tailer.config import Config
from mstail.tailer.live.hub import Hub
from mstail.tailer.history.store import Store
from mstail.tailer.live.sidecar import Tailer
from tests.conftest import ROOT, wait_until
from tests.tailer.test_sidecar import run_until

pytestmark = pytest.mark.slow

TOTAL = 100
KILL_AT = 10
WRITER = r'''
import logging, os, sys, time
kind, path, ending = sys.argv[1], sys.argv[2], sys.argv[3]
TOTAL, KILL_AT = int(sys.argv[4]), int(sys.argv[5])
steps = TOTAL if ending in ("over", "total") else KILL_AT if ending == "kill" else 15
if kind == "mindformers":
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "[%(levelname)s] %(asctime)s [mindformers/core/callback/callback.py:314] print_output_info: %(message)s"))
    log = logging.getLogger("mindformers")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info(".........Starting Training Model..........")
    for step in range(1, steps + 1):
        log.info("{ Epoch:[  1/  1], step:[%5d/%5d], loss: %.6f, per_step_time: 30ms, lr: 1e-05, overflow cond: False, "
                 "loss_scale: 1.0, global_norm: [1.0]", step, TOTAL, 3.0 - step / 100)
        time.sleep(0.01)
    if ending == "over":
        log.info(".........Training Over!.............")
else:  # MindSpore's LossMonitor on stdout (the followed file)
    for step in range(1, steps + 1):
        print(f"epoch: 1 step: {step}, loss is {3.0 - step / 100:.6f}", flush=True)
        time.sleep(0.01)
if ending == "kill":
    os.write(int(os.environ["READY_FD"]), b"ready\n")
    time.sleep(120)  # alive, holding the file: killed by the test
if ending.startswith("raise"):
    deadline = time.monotonic() + 60
    while not os.path.exists(path + ".go") and time.monotonic() < deadline:
        time.sleep(0.02)  # alive until the test saw mstail follow its steps: a death watched, not history read
    raise ValueError("For 'loss' of the network, the loss is NAN or INF, terminating training.")
'''


def spawn(kind: str, runs: Path, ending: str) -> "subprocess.Popen[bytes]":
    """A writer process; its stderr (where a traceback goes) is the followed file itself, as in an msrun worker log,
    or an unfollowed stdout file for `raise_stdout`. Says "ready" on `proc.ready` once killable."""
    path = runs / f"{kind}_{ending}.log"
    read, write = os.pipe()
    if kind == "lossmonitor":
        out = open(path, "ab")
        err = out
    else:
        out = open(runs / f"{kind}_{ending}.stdout", "ab")
        err = out if ending == "raise_stdout" else open(path, "ab")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, kind, str(path), ending, str(TOTAL), str(KILL_AT)],
                            stdout=out, stderr=err, pass_fds=(write,), env={**os.environ, "READY_FD": str(write)})
    os.close(write)
    proc.ready = os.fdopen(read, "rb")  # type: ignore[attr-defined]
    out.close()
    if err is not out:
        err.close()
    return proc


def by_name(server: Any) -> Dict[str, Dict[str, Any]]:
    return {Path(s["path"]).name: s for s in server.get_json("/api/sources")}


def alerts_of(server: Any) -> Dict[str, List[Dict[str, Any]]]:
    table = server.get_json("/api/alerts")
    out: Dict[str, List[Dict[str, Any]]] = {}
    for alert in table["active"] + table["resolved"]:
        out.setdefault(alert["source"], []).append(alert)
    return out


def test_killed_crashed_and_finished_text_logs_get_their_fate_and_deaths_an_alert(
        tmp_path: Path, mstail_server: Any) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    server = mstail_server(str(runs / "*.log"))
    endings = {"mindformers": ("kill", "over", "total", "raise_file", "raise_stdout"),
               "lossmonitor": ("kill", "exit", "raise_file")}
    writers = {f"{kind}_{ending}.log": spawn(kind, runs, ending) for kind, all_ in endings.items() for ending in all_}
    try:
        for name, proc in writers.items():
            if name.endswith("_kill.log"):
                assert proc.ready.readline() == b"ready\n"  # type: ignore[attr-defined]
                proc.send_signal(signal.SIGKILL)
        raising = [name for name in writers if "_raise_" in name]
        wait_until(lambda: all(by_name(server).get(n, {}).get("records") == 15 for n in raising), 30,
                   message="mstail following the raising writers' steps")
        for name in raising:
            (runs / f"{name}.go").touch()
        for proc in writers.values():
            proc.wait(timeout=30)
        fates = {"mindformers_kill.log": "died", "mindformers_over.log": "finished", "mindformers_total.log": "finished",
                 "mindformers_raise_file.log": "died", "mindformers_raise_stdout.log": "died",
                 "lossmonitor_kill.log": "stopped", "lossmonitor_exit.log": "stopped", "lossmonitor_raise_file.log": "died"}
        wait_until(lambda: {n: s["state"] for n, s in by_name(server).items()} == fates, 30,
                   message=f"the fates {fates}")
        sources = by_name(server)
        alerts = alerts_of(server)
        rules = {name: sorted(a["rule"] for a in alerts.get(s["id"], [])) for name, s in sources.items()}
        assert rules == {"mindformers_kill.log": ["died"], "mindformers_over.log": [], "mindformers_total.log": [],
                         "mindformers_raise_file.log": ["died", "error"], "mindformers_raise_stdout.log": ["died"],
                         "lossmonitor_kill.log": [], "lossmonitor_exit.log": [], "lossmonitor_raise_file.log":
                         ["died", "error"]}
        died = {name: next(a for a in alerts[sources[name]["id"]] if a["rule"] == "died")
                for name, r in rules.items() if "died" in r}
        assert all(a["severity"] == "critical" and a["state"] == "firing" for a in died.values())
        assert f"step {KILL_AT} of {TOTAL}" in died["mindformers_kill.log"]["message"]
        assert "step 15 of 100" in died["mindformers_raise_stdout.log"]["message"]
        for name in ("mindformers_raise_file.log", "lossmonitor_raise_file.log"):
            assert "ValueError: For 'loss' of the network" in died[name]["message"], died[name]
        assert sources["lossmonitor_kill.log"]["end_reason"].startswith("its writer left (step 10)")
        assert not any(s["end_guessed"] for s in sources.values())
    finally:
        for proc in writers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            proc.ready.close()  # type: ignore[attr-defined]


CALLBACK_WRITER = r'''
import os, sys, time
sys.path.insert(0, os.environ["MSTAIL_ROOT"])
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
from mstail.callback import JsonlCallback
from tests.callback import nets

class Slow(Callback):
    """A step every 20 ms; `kill_at`: says it is ready there (and the test kills it); `raise_at`: raises there."""
    def __init__(self, kill_at=None, raise_at=None):
        super().__init__()
        self.kill_at, self.raise_at = kill_at, raise_at
    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        time.sleep(0.02)
        if step == self.raise_at:
            raise ValueError("loss is NAN or INF, terminating training")
        if step == self.kill_at:
            os.write(int(os.environ["READY_FD"]), b"ready\n")
            time.sleep(120)

def train(path, epochs, **slow):
    net = nn.Dense(4, 1)
    model = Model(net, loss_fn=nets.MeanLoss(), optimizer=nn.SGD(net.trainable_params(), learning_rate=0.01))
    model.train(epochs, nets.dataset(nets.features()), callbacks=[JsonlCallback(path), Slow(**slow)])

folder = sys.argv[1]
train(f"{folder}/exit.jsonl", 4)
try:
    train(f"{folder}/raise.jsonl", 4, raise_at=7)
except ValueError:
    pass
train(f"{folder}/kill.jsonl", 40, kill_at=12)
'''


@pytest.mark.mindspore
def test_the_jsonl_callback_under_model_train_killed_crashed_or_finished(tmp_path: Path, mstail_server: Any) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    server = mstail_server(args=("--jsonl", str(metrics / "*.jsonl")))
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", CALLBACK_WRITER, str(metrics)], pass_fds=(write,),
                            env={**os.environ, "MSTAIL_ROOT": str(ROOT), "READY_FD": str(write)}, cwd=str(ROOT))
    os.close(write)
    try:
        with os.fdopen(read, "rb") as ready:
            assert ready.readline() == b"ready\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        fates = {"exit.jsonl": "finished", "raise.jsonl": "died", "kill.jsonl": "died"}
        wait_until(lambda: {n: s["state"] for n, s in by_name(server).items()} == fates, 30, message=f"{fates}")
        sources = by_name(server)
        assert sources["kill.jsonl"]["total_steps"] == 40 * 5  # the start event's total, shown as "step N / total"
        alerts = alerts_of(server)
        rules = {name: sorted(a["rule"] for a in alerts.get(s["id"], [])) for name, s in sources.items()}
        assert rules == {"exit.jsonl": [], "raise.jsonl": ["died", "error"], "kill.jsonl": ["died"]}
        [killed] = alerts[sources["kill.jsonl"]["id"]]
        assert "step 12 of 200" in killed["message"] and killed["severity"] == "critical"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


REPLAY = r'''
import sys, time
source, target = sys.argv[1], sys.argv[2]
with open(source, "rb") as handle:
    lines = handle.read().splitlines(keepends=True)
with open(target, "ab", buffering=0) as out:
    for line in lines:
        out.write(line)
        time.sleep(0.005)
'''
#: how each sample log's run ends: only the MindFormers v1.8 worker log records a crash (a traceback in epoch 2)
SAMPLE_FATES = {
    "hf_trainer_stdout.log": "finished", "megatron_mindspeed_llm.log": "finished", "metrics.jsonl": "finished",
    "mindformers_pynative_r2.0_pp_stage0_info.log": "finished", "mindformers_pynative_worker_0.log": "finished",
    "mindformers_v1.3_sink_info.log": "finished", "mindformers_v1.8_nonsink_worker_0.log": "died",
    "mindformers_v1.9_eval_worker_0.log": "finished", "mindspore_lossmonitor.log": "stopped",
    "mindyolo_train.log": "finished",
}


def test_sample_logs_replayed_by_writers_end_as_they_did_and_only_the_crash_raises_died(
        tmp_path: Path, mstail_server: Any) -> None:
    samples = sorted(p for p in (ROOT / "sample_logs").iterdir() if p.suffix in (".log", ".jsonl"))
    assert {p.name for p in samples} == set(SAMPLE_FATES)
    server = mstail_server(str(tmp_path / "*.log"), args=("--jsonl", str(tmp_path / "*.jsonl")))
    writers = [subprocess.Popen([sys.executable, "-c", REPLAY, str(p), str(tmp_path / p.name)]) for p in samples]
    for proc in writers:
        assert proc.wait(timeout=30) == 0
    wait_until(lambda: {n: s["state"] for n, s in by_name(server).items()} == SAMPLE_FATES, 30,
               message=f"the fates {SAMPLE_FATES}")
    sources = by_name(server)
    died = {name for name, s in sources.items() for a in alerts_of(server).get(s["id"], []) if a["rule"] == "died"}
    assert died == {"mindformers_v1.8_nonsink_worker_0.log"}
    crash = next(a for a in alerts_of(server)[sources["mindformers_v1.8_nonsink_worker_0.log"]["id"]]
                 if a["rule"] == "died")
    assert "RuntimeError: Call aclnnMatmul failed" in crash["message"] and "step 20 of 24" in crash["message"]


def test_where_writers_cannot_be_seen_the_silence_decides_and_the_fate_says_it_is_a_guess(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written from another node over a network filesystem: its writer is out of sight, so its run is judged
    over once silent past the hang bound, and its fate says that it is a guess (an end logged is none). No network
    filesystem can be mounted here: `network_fs`'s answer is stood in for."""
    from mstail.tailer.live import sidecar as tailer_module

    monkeypatch.setattr(tailer_module, "network_fs", lambda path, *rest: "nfs4")
    prefix = "[INFO] 2026-12-07 10:00:00,000 [mindformers/core/callback/callback.py:314] print_output_info: "
    for name, steps, over in (("killed", 10, False), ("over", TOTAL, True), ("total", TOTAL, False)):
        lines = [f"{prefix}{{ Epoch:[  1/  1], step:[{s:5d}/{TOTAL:5d}], loss: 2.5, per_step_time: 30ms, lr: 1e-05, "
                 "overflow cond: False, loss_scale: 1.0, global_norm: [1.0]" for s in range(1, steps + 1)]
        lines += [f"{prefix}.........Training Over!............."] if over else []
        (tmp_path / f"{name}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rules = load_alert_rules(overrides={"hang": {"min_s": 0.5, "k": 1.0}})
    config = Config(logs=(str(tmp_path / "*.log"),), poll_s=0.05, alert_rules=rules)
    tailer = Tailer(config, load_formats(user_dir=Path("/nonexistent")), Store(), Hub())
    want = {"killed": ("died", True), "over": ("finished", False), "total": ("finished", True)}

    def fates() -> Dict[str, Any]:
        return {Path(i.path).stem: (i.state, i.end_guessed) for i in tailer.store.sources.values()}

    asyncio.run(run_until(tailer, lambda: fates() == want, timeout_s=20))
    assert fates() == want
    infos = {Path(i.path).stem: i for i in tailer.store.sources.values()}
    assert all(i.hang_rule == "time bound" for i in infos.values())
    assert infos["killed"].end_reason == f"its writer left before the last step (step 10 of {TOTAL}), no end logged"
    assert not [a for a in tailer.alerts.table()["active"] if a["rule"] == "died"]  # a guess: the hang rule's to say


def test_a_restart_remembers_how_a_run_ended(tmp_path: Path, mstail_server: Any) -> None:
    """The history keeps a run's end: a restarted mstail resumes reading after the `end` event, and still says the
    run finished (not "stopped": its parser never reads that event again)."""
    path = tmp_path / "metrics.jsonl"
    lines = ['{"kind": "start", "step": 0, "message": "training started"}']
    lines += [f'{{"step": {s}, "loss": {3.0 - s / 100}}}' for s in range(1, 6)]
    lines += ['{"kind": "end", "step": 5, "message": "training ended"}']
    subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.argv[2])", str(path),
                    "\n".join(lines) + "\n"], check=True)
    first = mstail_server(args=("--jsonl", str(path)))
    wait_until(lambda: [s["state"] for s in first.get_json("/api/sources")] == ["finished"], 10, message="finished")
    assert first.stop() == 0
    again = mstail_server(args=("--jsonl", str(path)))
    wait_until(lambda: again.get_json("/api/sources")[0]["records"] == 5, 10, message="the history loaded")
    # nobody writes the file: without the end it would be "stopped" 10 s after the start
    wait_until(lambda: [s["state"] for s in again.get_json("/api/sources")] == ["finished"], 15, message="finished")
    assert again.get_json("/api/sources")[0]["end_reason"] == "logged its end (step 5)"


def test_a_crash_logged_before_mstail_started_is_died_without_an_alert(tmp_path: Path, mstail_server: Any) -> None:
    """README: `died` is not for a run that was over before mstail read it. The crash's traceback ends the file, so
    the parser holds it until its grace period ends, after the history was read: it is still history."""
    crashed = tmp_path / "crashed.log"
    shutil.copyfile(ROOT / "sample_logs" / "mindformers_v1.8_nonsink_worker_0.log", crashed)
    two_days_ago = time.time() - 2 * 86400
    os.utime(crashed, (two_days_ago, two_days_ago))
    server = mstail_server(str(crashed))
    wait_until(lambda: [s["state"] for s in server.get_json("/api/sources")] == ["died"], 30, message="died")
    assert "RuntimeError: Call aclnnMatmul failed" in server.get_json("/api/sources")[0]["end_reason"]
    assert "died" not in {a["rule"] for a in server.get_json("/api/alerts")["active"]}
