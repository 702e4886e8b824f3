"""Alert rules on crafted MindFormers logs (parsed by the real parser, fed to the engine), the rule file, and the
clean sample logs (no alert) / the sample logs with a NaN step or a crash (exactly those alerts)."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from mstail.parsers import SourceParser
from mstail.tailer.alerts.engine import AlertConfigError, AlertEngine, load_alert_rules
from tests.parsers.support import FORMATS, parse_file

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0  # the crafted logs' first step (local time in the log, as MindFormers writes it)
PREFIX = "[{level}] {ts},{ms:03d} [mindformers/core/callback/callback.py:314] print_output_info: "


def _prefix(t: float, level: str = "INFO") -> str:
    return PREFIX.format(level=level, ts=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)), ms=int(t * 1000) % 1000)


def step_line(step: int, loss: float, t: float, norm: float = 1.0, overflow: bool = False, scale: float = 65536.0,
              ms: int = 500) -> str:
    """A MindFormers v1.3 sink step line (the format of sample_logs/mindformers_v1.3_sink_info.log)."""
    return _prefix(t) + (
        f"{{ Epoch:[  1/  1], step:[{step:5d}/10000], loss: {loss:.6f}, per_step_time: {ms}ms, lr: 1e-05, "
        f"overflow cond: {overflow}, loss_scale: {scale}, global_norm: [{norm}]"
    )


def training(n: int, step_s: float = 0.5, **overrides: Dict[int, Dict[str, Any]]) -> List[Tuple[float, str]]:
    """(time, line) for steps 1..n of a calm run (loss ~2 with small noise, norm ~1); `at={step: {...}}` changes steps."""
    at = overrides.get("at", {})
    lines = [(T0 - 1, _prefix(T0 - 1) + ".........Starting Training Model..........")]
    for step in range(1, n + 1):
        t = T0 + step * step_s
        kwargs: Dict[str, Any] = {"loss": 2.0 + 0.05 * ((step * 7919) % 11) / 11, "norm": 1.0 + 0.1 * ((step * 31) % 7) / 7}
        kwargs.update(at.get(step, {}))
        lines.append((t, step_line(step, t=t, ms=int(step_s * 1000), **kwargs)))
    return lines


class Run:
    """Crafted lines -> the real parser -> the engine, with each line read at its own log time (live)."""

    def __init__(self, overrides: Optional[Dict[str, Any]] = None, source: str = "rank_0") -> None:
        self.engine = AlertEngine(load_alert_rules(overrides=overrides))
        self.parser = SourceParser(FORMATS)
        self.source = source
        self.changes: List[Dict[str, Any]] = []
        self.now = T0

    def feed(self, lines: Sequence[Tuple[float, str]]) -> "Run":
        for number, (t, line) in enumerate(lines, 1):
            self.now = t
            for item in self.parser.feed(line, number, t) + self.parser.flush(t, force=True):
                self.changes += self.engine.observe(self.source, item.data, t)
        return self

    def tick(self, now: float, state: str = "following") -> List[Dict[str, Any]]:
        self.now = now
        got = self.engine.tick(now, {self.source: state})
        self.changes += got
        return got

    def fired(self, rule: Optional[str] = None) -> List[Dict[str, Any]]:
        return [c for c in self.changes if c["state"] == "firing" and (rule is None or c["rule"] == rule)]

    def resolved(self, rule: str) -> List[Dict[str, Any]]:
        return [c for c in self.changes if c["state"] == "resolved" and c["rule"] == rule]


def test_a_calm_run_raises_nothing_and_ending_it_arms_no_hang() -> None:
    run = Run().feed(training(300))
    run.feed([(run.now + 1, _prefix(run.now + 1) + ".........Training Over!.............")])
    assert run.tick(run.now + 3600) == []
    assert run.changes == [] and run.engine.table() == {"active": [], "resolved": [], "count": 0}


@pytest.mark.parametrize("metric,value", [("loss", math.nan), ("norm", math.nan), ("loss", math.inf)])
def test_nonfinite_fires_at_once_counts_repeats_and_resolves(metric: str, value: float) -> None:
    bad = {s: {metric: value} for s in (40, 41, 42)}
    run = Run().feed(training(60, at=bad))
    fired = run.fired("nonfinite")
    assert len(fired) == 1 and fired[0]["step"] == 40 and fired[0]["severity"] == "critical"
    assert ("loss" if metric == "loss" else "grad_norm") in fired[0]["message"]
    assert len(run.resolved("nonfinite")) == 1  # 5 finite steps after 42
    [alert] = run.engine.table()["resolved"]
    assert alert["count"] == 3 and alert["step"] == 42 and alert["state"] == "resolved"
    assert {k for k in alert} >= {"id", "rule", "source", "step", "severity", "message", "first_seen", "last_seen", "count"}
    assert [c["rule"] for c in run.changes] == ["nonfinite", "nonfinite"]  # the repeats were not published again


def test_loss_spike_robust_window_after_warm_up_only() -> None:
    # warm-up: a steep fall from 10 must not fire; then one spike to 6 at step 150 fires (loss ~2).
    warm = {s: {"loss": 10.0 - 0.4 * s} for s in range(1, 20)}
    run = Run().feed(training(200, at={**warm, 150: {"loss": 6.0}}))
    fired = run.fired()
    assert [(c["rule"], c["step"]) for c in fired] == [("loss_spike", 150)]
    assert run.resolved("loss_spike")
    # too early: a spike at step 5 (window < min_window) is not judged
    assert Run().feed(training(40, at={5: {"loss": 50.0}})).fired() == []


def test_the_seeds_mean_ratio_rule_as_configuration() -> None:
    config = {"loss_spike": {"method": "mean_ratio", "ratio": 1.5, "window": 50, "min_window": 50}}
    run = Run(config).feed(training(120, at={60: {"loss": 3.2}, 100: {"loss": 2.9}}))
    assert [c["step"] for c in run.fired("loss_spike")] == [60]  # 2.9 < 1.5 x mean(~2.02)
    assert Run(config).feed(training(120, at={30: {"loss": 9.0}})).fired() == []  # before 50 steps


def test_grad_norm_ratio_and_absolute() -> None:
    run = Run().feed(training(100, at={80: {"norm": 25.0}}))
    [alert] = run.fired("grad_norm")
    assert alert["step"] == 80 and "rolling median" in alert["message"]
    run = Run({"grad_norm": {"absolute": 5.0}}).feed(training(10, at={3: {"norm": 6.5}}))  # before min_window
    [alert] = run.fired("grad_norm")
    assert alert["step"] == 3 and "above 5" in alert["message"]


def test_overflow_streak_and_loss_scale_floor() -> None:
    streak = {s: {"overflow": True, "scale": 65536.0 / 2 ** (s - 49)} for s in range(50, 70)}
    run = Run().feed(training(80, at=streak))
    [overflow] = run.fired("overflow")
    assert overflow["step"] == 59 and "10 consecutive" in overflow["message"]
    [floor] = run.fired("loss_scale")
    assert floor["step"] == 65 and floor["severity"] == "critical"  # 65536 / 2**16 = 1.0 = the floor
    assert run.resolved("overflow")
    # short bursts (dynamic loss scaling at start) and a constant scale of 1.0 raise nothing
    calm = {s: {"overflow": True} for s in (3, 4, 5, 9)}
    calm.update({s: {"scale": 1.0, **calm.get(s, {})} for s in range(1, 61)})
    assert Run().feed(training(60, at=calm)).fired() == []


def test_error_events_and_terminate_training() -> None:
    lines = training(30)
    t = lines[-1][0] + 1
    lines.append((t, _prefix(t, "ERROR") + "Run task failed, error msg: Inner Error!"))
    lines.append((t, "Traceback (most recent call last):"))
    lines.append((t, '  File "run_mindformer.py", line 263, in <module>'))
    lines.append((t + 1, _prefix(t + 1) + "ok"))
    run = Run().feed(lines)
    [alert] = run.fired("error")
    assert alert["step"] == 30 and alert["message"] == "Run task failed, error msg: Inner Error! (step 30)"
    assert alert["severity"] == "error"
    # the phrase alone, in an event that is not an error
    engine = AlertEngine()
    got = engine.observe("r", {"kind": "end", "step": 3, "message": "Received terminate training signal", "time": T0}, T0)
    assert [c["rule"] for c in got] == ["error"]


def test_a_crash_alert_says_the_exception_and_the_step() -> None:
    # Before: the message was "Traceback (most recent call last):", and MindSpore's "terminating training" (as
    # LossMonitor raises it) did not match the phrase "terminate training".
    traceback = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
                 "    model.train(2, dataset, callbacks=[LossMonitor()])\n  File \"callback/_loss_monitor.py\", line 87\n"
                 "ValueError: For 'loss' of the network, epoch: 1 step: 7, loss is NAN or INF, terminating training.")
    [alert] = AlertEngine().observe("r", {"kind": "error", "step": 7, "message": traceback, "time": T0}, T0)
    assert alert["message"] == ("ValueError: For 'loss' of the network, epoch: 1 step: 7, loss is NAN or INF, "
                                "terminating training. (step 7)")
    [alert] = AlertEngine().observe("r", {"kind": "checkpoint", "step": 7, "time": T0,
                                          "message": "loss is NAN or INF, terminating training"}, T0)
    assert alert["rule"] == "error"


def test_hang_after_max_of_min_and_k_times_median_step_time_unless_training_ended() -> None:
    run = Run({"hang": {"min_s": 2.0, "k": 10.0}}).feed(training(50, step_s=0.5))
    last = run.now
    assert run.engine.hang_bound("rank_0") == pytest.approx(5.0)  # 10 x 0.5 s > 2 s
    assert run.tick(last + 4.9) == []
    [hang] = run.tick(last + 5.1)
    assert hang["rule"] == "hang" and hang["step"] == 50 and hang["severity"] == "critical"
    assert run.tick(last + 6) == []  # deduplicated
    run.feed([(last + 7, step_line(51, 2.0, last + 7))])
    assert run.tick(last + 7.1)[0]["state"] == "resolved"
    # the end of training disarms it
    run = Run({"hang": {"min_s": 2.0, "k": 1.0}}).feed(training(10))
    run.feed([(run.now, _prefix(run.now) + ".........Training Over!.............")])
    assert run.tick(run.now + 100) == []
    # an old finished-looking log (last record long ago) is history, not a hang
    run = Run({"hang": {"min_s": 2.0}})
    for t, line in training(10):
        for item in run.parser.feed(line, 1, t + 86400) + run.parser.flush(t + 86400, force=True):
            run.engine.observe("rank_0", item.data, t + 86400)
    assert run.tick(T0 + 86400 + 1000) == []


def test_source_gone_is_its_own_state_and_suppresses_hang() -> None:
    run = Run({"hang": {"min_s": 1.0}}).feed(training(20))
    [gone] = run.tick(run.now + 0.5, state="gone")
    assert gone["rule"] == "gone" and gone["severity"] == "warning"
    assert run.tick(run.now + 100, state="gone") == []  # no hang on a file that is gone
    back = run.tick(run.now + 0.1, state="following")  # back, but still no new step after 100 s: hung
    assert [(c["rule"], c["state"]) for c in back] == [("gone", "resolved"), ("hang", "firing")]


class EveryHangEngine(AlertEngine):
    """The hang rule judged for every source at every tick: what `AlertEngine.tick` passes over must not matter."""

    def tick(self, now: float, states: Dict[str, str], writing: Any = None) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        self._stragglers(now, out)
        for source, follower_state in states.items():
            state, gone = self._sources.get(source), follower_state == "gone"
            if gone:
                self._fire("gone", source, state.last_step if state else None, now, "log file disappeared", out)
            else:
                self._resolve("gone", source, now, out, "log file is back")
            if state is not None:
                self._hang(source, state, gone, now, writing, out)
        return out


@pytest.mark.parametrize("seed", range(4))
def test_a_tick_gives_the_changes_of_judging_every_source(seed: int) -> None:
    """40 sources with their own step times, pauses (past the hang bound or not), files gone and back, writers
    leaving, live records and history: each tick's changes equal those of judging the hang rule everywhere."""
    rng = random.Random(seed)
    rules = {"hang": {"min_s": 3.0, "k": 4.0}, "straggler": {"min_window": 3, "window": 5}}
    fast, every = AlertEngine(load_alert_rules(overrides=rules)), EveryHangEngine(load_alert_rules(overrides=rules))
    sources = [f"rank_{n}" for n in range(40)]
    period = {s: rng.choice([0.1, 0.5, 1.0, 2.0]) for s in sources}
    paused_until = dict.fromkeys(sources, 0.0)
    states = dict.fromkeys(sources, "following")
    writer_gone = set()
    step = dict.fromkeys(sources, 0)
    now, changes = T0, 0
    for _ in range(400):
        now += 0.25
        for source in sources:
            if rng.random() < 0.01:
                paused_until[source] = now + rng.choice([2.0, 5.0, 12.0, 30.0])
            if rng.random() < 0.005:
                states[source] = "gone" if states[source] != "gone" else "following"
            if rng.random() < 0.003:
                writer_gone.symmetric_difference_update({source})
            if now >= paused_until[source] and rng.random() < 0.25 / period[source]:
                step[source] += 1
                record = {"step": step[source], "time": now, "loss": 2.0, "step_time_ms": 1000 * period[source]}
                history = step[source] < 3
                assert fast.observe(source, record, now, history) == every.observe(source, record, now, history)
        if rng.random() < 0.5:
            got = fast.tick(now, dict(states), lambda s: s not in writer_gone)
            assert got == every.tick(now, dict(states), lambda s: s not in writer_gone)
            changes += len(got)
    assert fast.table() == every.table()
    assert changes > 20  # hangs, gones and their resolves happened


def test_cooldown_reopens_a_flapping_alert_and_publishes_again_only_after_it() -> None:
    engine = AlertEngine(load_alert_rules(overrides={"general": {"cooldown_s": 100.0}, "nonfinite": {"clear_after": 1}}))

    def rec(step: int, loss: float, now: float) -> List[Dict[str, Any]]:
        return engine.observe("r", {"step": step, "loss": loss, "time": now}, now)

    assert rec(1, math.nan, 0)[0]["notify"] is True
    assert rec(2, 1.0, 1)[0]["state"] == "resolved"
    again = rec(3, math.nan, 2)
    assert again[0]["id"] == "a1" and again[0]["state"] == "firing" and again[0]["notify"] is False
    assert rec(4, math.nan, 50) == []  # still firing, within the cooldown: table only
    assert rec(5, math.nan, 150)[0]["notify"] is True  # cooldown over: published again
    assert engine.table()["active"][0]["count"] == 4
    rec(6, 1.0, 151)
    assert rec(7, math.nan, 400)[0]["id"] == "a2"  # resolved long ago: a new alert


def test_disabled_rules_stay_silent() -> None:
    off = {name: {"enabled": False} for name in ("nonfinite", "loss_spike")}
    assert Run(off).feed(training(60, at={40: {"loss": math.nan}, 50: {"loss": 40.0}})).fired() == []


# -- the rules file -------------------------------------------------------------------------------------------------
def test_rules_file_overrides_and_errors_name_file_rule_and_key(tmp_path: Path) -> None:
    good = tmp_path / "alerts.toml"
    good.write_text('[general]\ncooldown_s = 60\n[hang]\nmin_s = 120\nk = 5\n[loss_spike]\nenabled = false\n')
    rules = load_alert_rules(str(good))
    assert rules.rules["hang"]["min_s"] == 120.0 and rules.general["cooldown_s"] == 60.0 and not rules.on("loss_spike")
    cases = {
        "[hangs]\nmin_s = 1\n": "rule 'hangs': unknown rule",
        "[hang]\nminimum = 1\n": "rule 'hang': key 'minimum': unknown key",
        "[hang]\nmin_s = 'x'\n": "rule 'hang': key 'min_s': expected a non-negative number",
        "[loss_spike]\nmethod = 'mean'\n": "key 'method': expected one of mad, mean_ratio",
        "[overflow]\nstreak = 0\n": "rule 'overflow': key 'streak': must be at least 1",
        "[nonfinite]\nenabled = 1\n": "key 'enabled': expected true or false",
        "hang = 3\n": "rule 'hang': must be a table",
        "[hang\n": "not valid TOML",
    }
    for text, expected in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(AlertConfigError) as info:
            load_alert_rules(str(bad))
        assert str(info.value).startswith(str(bad)) and expected in str(info.value), str(info.value)


# -- the sample logs --------------------------------------------------------------------------------------------------
CLEAN = [
    "sample_logs/mindformers_pynative_r2.0_pp_stage0_info.log",  # `grad_norm: NaN` there is None, not a NaN
    "sample_logs/mindyolo_train.log",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "real_logs").glob("*.log")),
]
#: sample logs written with a NaN step or a crash on purpose (sample_logs/README.md): exactly these alerts.
EXPECTED = {
    "sample_logs/metrics.jsonl": [("nonfinite", 5)],
    "sample_logs/mindformers_v1.3_sink_info.log": [("nonfinite", 12)],  # one overflow step: no streak
    "sample_logs/mindspore_lossmonitor.log": [("nonfinite", 11)],
    "sample_logs/mindformers_v1.8_nonsink_worker_0.log": [("nonfinite", 7), ("error", 20)],
    "sample_logs/mindformers_v1.9_eval_worker_0.log": [("error", 9)],
    "sample_logs/mindformers_pynative_worker_0.log": [("nonfinite", 7), ("error", 9)],
    "sample_logs/megatron_mindspeed_llm.log": [("nonfinite", 7)],  # the NaN iteration's grad norm
    "sample_logs/hf_trainer_stdout.log": [("nonfinite", 6)],
}


def _alerts_of(relative: str) -> List[Tuple[str, Any]]:
    records, events, _ = parse_file(ROOT / relative)
    items = sorted(records + events, key=lambda d: d.get("line", 0))
    engine = AlertEngine()
    fired = []
    last = 0.0
    for data in items:
        now = data.get("time") or T0
        last = max(last, now)
        fired += [c for c in engine.observe("s", data, now) if c["state"] == "firing"]
    fired += engine.tick(last + 30, {"s": "following"})  # within the 60 s hang floor
    return [(c["rule"], c.get("step")) for c in fired]


@pytest.mark.parametrize("relative", CLEAN)
def test_clean_sample_logs_raise_no_alert(relative: str) -> None:
    assert _alerts_of(relative) == []


@pytest.mark.parametrize("relative", sorted(EXPECTED))
def test_sample_logs_with_a_nan_or_a_crash_raise_exactly_those(relative: str) -> None:
    assert _alerts_of(relative) == EXPECTED[relative]


def test_every_sample_log_is_covered() -> None:
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "sample_logs").iterdir() if p.suffix in (".log", ".jsonl")}
    on_disk |= {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "real_logs").glob("*.log")}
    assert on_disk == set(CLEAN) | set(EXPECTED)


def test_straggler_one_rank_persistently_slower_than_the_others() -> None:
    engine = AlertEngine()
    runs = {}
    for rank, step_s in (("rank_0", 0.5), ("rank_1", 0.5), ("rank_2", 0.8)):
        run = Run(source=rank)
        run.engine = engine
        runs[rank] = run.feed(training(30, step_s=step_s))
    states = {rank: "following" for rank in runs}
    now = T0 + 20
    [alert] = engine.tick(now, states)
    assert (alert["rule"], alert["source"], alert["state"]) == ("straggler", "rank_2", "firing")
    assert "800 ms vs 500 ms" in alert["message"]
    assert engine.tick(now + 0.5, states) == []  # deduplicated
    # a single slow step is not persistent; rank_2 back at speed for a window resolves it
    runs["rank_2"].feed([(now + 1 + i * 0.5, step_line(31 + i, 2.0, now + 1 + i * 0.5, ms=500)) for i in range(20)])
    [back] = engine.tick(now + 12, states)
    assert (back["rule"], back["state"]) == ("straggler", "resolved")
    runs["rank_1"].feed([(now + 13, step_line(31, 2.0, now + 13, ms=5000))])
    assert engine.tick(now + 13.1, states) == []
    # alone, or with ranks equally slow (per_step_time is synchronous in data parallel), nothing fires
    solo = Run().feed(training(30, step_s=0.8))
    assert solo.tick(solo.now + 1) == []



def test_straggler_never_compares_two_files_of_one_rank_nor_two_formats_or_runs() -> None:
    engine = AlertEngine()
    feeds = {"rank_0": 0.1, "worker_0": 0.3, "exp1/rank_1": 0.1, "exp2/rank_2": 0.3, "rank_4": 0.1, "rank_5": 0.3}
    for source, step_s in feeds.items():
        run = Run(source=source)
        run.engine = engine
        run.feed(training(30, step_s=step_s))
    # rank_0's info.log and its worker_0.log: one rank; exp1 and exp2: two runs; rank_4 and rank_5: two formats
    engine.peers("rank_0", None, "mindformers")
    engine.peers("worker_0", None, "mindformers")
    engine.peers("exp1/rank_1", "exp1", "mindformers")
    engine.peers("exp2/rank_2", "exp2", "mindformers")
    engine.peers("rank_4", "exp3", "mindformers")
    engine.peers("rank_5", "exp3", "jsonl")
    assert engine.tick(T0 + 20, dict.fromkeys(feeds, "following")) == []
    engine.peers("rank_5", "exp3", "mindformers")  # the same run and format: rank 5 is the straggler
    [alert] = engine.tick(T0 + 21, dict.fromkeys(feeds, "following"))
    assert (alert["rule"], alert["source"]) == ("straggler", "rank_5")

def test_trend_is_off_by_default_and_finds_plateau_and_divergence() -> None:
    flat = {s: {"loss": 2.0 + 0.001 * (s % 3)} for s in range(1, 201)}
    assert Run().feed(training(200, at=flat)).fired() == []
    config = {"trend": {"enabled": True, "window": 100, "min_window": 100, "every": 10}}
    [plateau] = Run(config).feed(training(200, at=flat)).fired("trend")
    assert plateau["step"] == 100 and "plateau" in plateau["message"]
    falling = {s: {"loss": 10.0 - 0.03 * s} for s in range(1, 201)}
    assert Run(config).feed(training(200, at=falling)).fired() == []
    rising = {s: {"loss": 2.0 + 0.01 * s} for s in range(1, 201)}
    run = Run({**config, "loss_spike": {"enabled": False}}).feed(training(200, at=rising))
    [diverging] = run.fired("trend")
    assert diverging["step"] == 100 and "diverging" in diverging["message"]


def test_an_alert_raised_by_a_log_line_carries_that_line_s_time_and_one_of_mstail_s_clock_none() -> None:
    """`logged_at`: the log's time of the record at the alert's step (read a day after it was written here, so
    mstail's clock and the log's differ); None where the line has no time, or for a rule judged on mstail's clock."""
    day = 86400.0
    run = Run()
    for number, (t, line) in enumerate(training(60, at={s: {"loss": math.nan} for s in (40, 41)}), 1):
        for item in run.parser.feed(line, number, t + day) + run.parser.flush(t + day, force=True):
            run.changes += run.engine.observe(run.source, item.data, t + day)
    [fired] = run.fired("nonfinite")
    assert fired["logged_at"] == pytest.approx(T0 + 40 * 0.5, abs=0.001) and fired["first_seen"] >= T0 + day
    [alert] = run.engine.table()["resolved"]
    assert alert["step"] == 41 and alert["logged_at"] == pytest.approx(T0 + 41 * 0.5, abs=0.001)  # the newest fire's
    hung = Run({"hang": {"min_s": 2.0, "k": 10.0}}).feed(training(50, step_s=0.5))
    [hang] = hung.tick(hung.now + 5.1)
    assert hang["rule"] == "hang" and hang["logged_at"] is None
    # a record whose time is the moment mstail read it (a print()-style line): no log time
    engine = AlertEngine()
    [read] = engine.observe("r", {"step": 3, "loss": math.nan, "time": T0, "estimated": "time"}, T0)
    assert read["rule"] == "nonfinite" and read["logged_at"] is None
    [error] = engine.observe("r", {"kind": "error", "step": 7, "message": "ValueError: x", "time": T0 - 5}, T0)
    assert error["logged_at"] == T0 - 5
