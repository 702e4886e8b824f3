"""Derived series (mstail.parsers.derived): the built-in perplexity, the expression language and what it refuses,
IEEE results where Python raises, records and amends through `InterleavedParser`, and `mstail parse` output."""

from __future__ import annotations

import json
import math
import operator
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from mstail.parsers import SourceParser, builtin_formats
from mstail.parsers.derived import Derived, DerivedError, Deriver, compile_expression, load_derived
from mstail.parsers.interleave import InterleavedParser
from mstail.parsers.record import Item

from .support import SAMPLES

LARGEST = sys.float_info.max


def test_perplexity_of_the_lm_loss_only_clipped_where_it_overflows() -> None:
    record = {"step": 1, "loss": 2.0, "eval_loss": 1.0, "mtp_1_loss": 800.0, "load_balancing_loss": 0.3,
              "loss_scale": 65536.0, "loss_avg": 2.1, "lr": 1e-4, "lm_loss": 800.0}
    assert Derived().values(record) == {"perplexity": math.exp(2.0), "lm_perplexity": LARGEST}  # no load_balancing_...
    chosen = Derived(perplexity=("loss", "eval_loss", "nll")).values({**record, "nll": 0.0})
    assert chosen == {"perplexity": math.exp(2.0), "eval_perplexity": math.e, "nll_perplexity": 1.0}
    assert math.isnan(Derived().values({"loss": math.nan})["perplexity"])  # a NaN loss stays visible
    assert Derived().values({"loss": math.inf})["perplexity"] == math.inf
    assert Derived().values({"loss": 2.0, "perplexity": 9.0}) == {}  # the log's own value wins
    assert Derived(perplexity=False).values({"loss": 2.0}) == {}
    assert Derived().values({"loss": "n/a", "step": 3}) == {}  # not a number: nothing derived


@pytest.mark.parametrize("text,values,want", [
    ("samples_per_s * seq", {"samples_per_s": 3.0}, 3.0 * 4096),
    ("-(a + 2) ** 2 / b", {"a": 1.0, "b": 3.0}, -3.0),
    ("max(a, b, 7) - min(a, b)", {"a": 1.0, "b": 3.0}, 6.0),
    ("log(exp(a)) + sqrt(b) + abs(-a) + log2(8) + log10(100)", {"a": 1.0, "b": 4.0}, 1 + 2 + 1 + 3 + 2),
    ("a / 0", {"a": 2.0}, math.inf),
    ("-a / 0", {"a": 2.0}, -math.inf),
    ("a * 1e308 * 10", {"a": 2.0}, math.inf),  # overflow: inf, as IEEE says (only perplexity is clipped)
    ("exp(a)", {"a": 1000.0}, math.inf),  # where Python raises OverflowError
    ("10 ** a", {"a": 400.0}, math.inf),
])
def test_expressions(text: str, values: Dict[str, float], want: float) -> None:
    series = compile_expression("x", text, {"seq": 4096.0})
    got = series.evaluate(values)
    assert got == (pytest.approx(want) if math.isfinite(want) else want)


def random_expression(rng: Any, depth: int) -> Any:
    """A random expression of the language as (its text, a plain evaluation of it): operands that are metrics,
    numbers and a constant, in every position, nested."""
    pick = rng.random()
    if depth == 0 or pick < 0.25:
        leaf = rng.choice(["a", "b", "c", "k", "0", "2.5", "3", "1e308"])
        if leaf in ("a", "b", "c"):
            return leaf, lambda v: v[leaf]
        number = 7.0 if leaf == "k" else float(leaf)
        return leaf, lambda v: number
    if pick < 0.75:
        symbol = rng.choice(["+", "-", "*", "/", "**"])
        (left, lf), (right, rf) = random_expression(rng, depth - 1), random_expression(rng, depth - 1)
        op = {"+": operator.add, "-": operator.sub, "*": operator.mul, "**": operator.pow, "/": ieee_divide}[symbol]
        return f"({left} {symbol} {right})", lambda v: op(lf(v), rf(v))
    if pick < 0.85:
        inner, fn = random_expression(rng, depth - 1)
        return f"(-{inner})", lambda v: -fn(v)
    name = rng.choice(["exp", "log", "sqrt", "abs", "min", "max"])
    args = [random_expression(rng, depth - 1) for _ in range(rng.randint(2, 3) if name in ("min", "max") else 1)]
    function = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "abs": abs, "min": min, "max": max}[name]
    return f"{name}({', '.join(t for t, _ in args)})", lambda v: function(*[f(v) for _, f in args])


def ieee_divide(a: float, b: float) -> float:
    if b:
        return a / b
    return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1.0, b)


@pytest.mark.parametrize("seed", range(5))
def test_compiled_expressions_are_the_plain_evaluation(seed: int) -> None:
    """An expression's compiled form (operands read in place where they are metrics or numbers) gives what
    evaluating its tree plainly gives, IEEE where Python raises: random expressions over random values, NaN,
    infinities, zeros and overflowing ones included."""
    import random

    rng = random.Random(seed)
    odd = [0.0, -0.0, 1.0, -2.5, 1e-300, 1e300, math.nan, math.inf, -math.inf, 3.7, 710.0]
    for _ in range(400):
        text, plain = random_expression(rng, rng.randint(1, 4))
        series = compile_expression("x", text, {"k": 7.0})
        for _ in range(5):
            values = {name: rng.choice(odd) for name in series.names}
            try:
                want = float(plain(values))
            except OverflowError:
                want = math.inf
            except (ValueError, ZeroDivisionError, TypeError):
                want = math.nan
            assert repr(series.evaluate(values)) == repr(want), (text, values)


@pytest.mark.parametrize("text", ["0 / 0", "log(-a)", "sqrt(-a)", "(-a) ** 0.5", "a / 0 - a / 0"])
def test_undefined_results_are_nan(text: str) -> None:
    assert math.isnan(compile_expression("x", text, {}).evaluate({"a": 2.0}))


@pytest.mark.parametrize("text,why", [
    ("__import__('os').system('true')", "not allowed"),
    ("a.real", "not allowed"),
    ("a[0]", "not allowed"),
    ("lambda: 1", "not allowed"),
    ("a if b else c", "not allowed"),
    ("a < b", "not allowed"),
    ("'text'", "not allowed"),
    ("exp", "is a function"),
    ("exp(a, b)", "one argument"),
    ("exp(x=a)", "not allowed"),
    ("a +", "not an expression"),
    ("-" * 150 + "a", "more than"),
    ("a" + " + a" * 300, "longer than"),
])
def test_what_the_language_refuses(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        compile_expression("x", text, {})


def test_series_use_constants_other_series_and_need_all_their_names() -> None:
    derived = Derived(series=(compile_expression("tokens_per_s", "samples_per_s * seq", {"seq": 2048.0}),
                              compile_expression("tokens_per_card", "tokens_per_s / cards", {"cards": 8.0})))
    assert derived.values({"loss": 1.0, "samples_per_s": 4.0}) == {
        "perplexity": math.e, "tokens_per_s": 8192.0, "tokens_per_card": 1024.0}
    assert derived.values({"loss": 1.0}) == {"perplexity": math.e}  # no samples_per_s: neither series


def test_load_derived_file_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "derived.toml"
    good.write_text('perplexity = false\n[constants]\nseq_length = 4096\n[series]\n'
                    'tokens_per_s = "samples_per_s * seq_length"\n', encoding="utf-8")
    derived = load_derived(str(good))
    assert not derived.perplexity and [s.name for s in derived.series] == ["tokens_per_s"]
    assert derived.values({"samples_per_s": 2.0, "loss": 1.0}) == {"tokens_per_s": 8192.0}
    assert load_derived(None) == Derived()
    for text, why in [("[series]\nstep = \"loss * 2\"\n", "reserved"), ("[series]\nx = 3\n", "must be a string"),
                      ("[constants]\nk = \"a\"\n", "must be a number"), ("colour = 1\n", "unknown key"),
                      ("perplexity = 1\n", "true, false or a list"), ("[series\n", "not valid TOML"),
                      ("perplexity = [\"step\"]\n", "true, false or a list"),
                      ("perplexity = [\"a\\u001b_loss\"]\n", "true, false or a list"),
                      ("[series]\nx = \"open('f')\"\n", "series x: `open")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(DerivedError, match=why):
            load_derived(str(bad))
    with pytest.raises(DerivedError, match="cannot read"):
        load_derived(str(tmp_path / "missing.toml"))


def test_an_amend_gets_what_its_values_make_computable() -> None:
    derived = Derived(series=(compile_expression("loss_per_ms", "loss / step_time_ms", {}),))
    deriver = Deriver(derived)
    record = Item("record", {"step": 7, "segment": 0, "loss": 2.0})
    amend = Item("amend", {"step": 7, "segment": 0, "step_time_ms": 500.0})
    late = Item("amend", {"step": 6, "segment": 0, "step_time_ms": 1.0})  # not the last record's: left alone
    deriver.apply([record, amend, late])
    assert record.data["perplexity"] == math.exp(2.0) and "loss_per_ms" not in record.data
    assert amend.data == {"step": 7, "segment": 0, "step_time_ms": 500.0, "loss_per_ms": 0.004}  # no perplexity again
    assert late.data == {"step": 6, "segment": 0, "step_time_ms": 1.0}


@pytest.mark.parametrize("seed", range(20))
def test_an_amend_that_brings_no_input_is_not_derived_again(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Deriver` computes an amend's derived values only when the amend brings a metric some series reads
    (`Derived.reads_any`): the items are those of computing them after every amend."""
    import random

    rng = random.Random(seed)
    derived = Derived(series=(compile_expression("a2", "a * 2", {}), compile_expression("ab", "a2 + b", {}),
                              compile_expression("tc", "train_loss * c", {})))
    names = ["a", "b", "c", "loss", "train_loss", "lr", "samples_per_s"]

    def stream() -> list:
        items = []
        for step in range(1, 30):
            record = {"step": step, "segment": 0, **{n: rng.random() for n in rng.sample(names, rng.randint(0, 3))}}
            items.append(Item("record", record))
            for _ in range(rng.randint(0, 3)):
                new = [n for n in rng.sample(names, rng.randint(1, 3)) if n not in record]
                items.append(Item("amend", {"step": step, "segment": 0, **{n: rng.random() for n in new}}))
                record = {**record, **items[-1].data}
        return items

    items = stream()
    fast = [repr(i) for i in Deriver(derived).apply([Item(k, dict(d)) for k, d in items])]
    monkeypatch.setattr(Derived, "reads_any", lambda self, keys: True)
    assert fast == [repr(i) for i in Deriver(derived).apply([Item(k, dict(d)) for k, d in items])]
    assert any("tc" in i or "ab" in i for i in fast if i.startswith("Item(kind='amend'"))  # amends do derive


def plain_values(derived: Derived, record: Dict[str, Any]) -> Dict[str, float]:
    """The module's rule written out plainly, per record (what `Derived.values` compiles per key set): perplexity
    for each loss the record lacks it of, then each declared series it lacks, in order, when every name the series
    reads is a number, the record's or one derived before it."""
    def number(value: Any) -> Any:
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:
                return None
        return None

    out: Dict[str, float] = {}
    names = set(record)
    for key in record:
        name = key[: -len("loss")] + "perplexity"
        if key in derived.perplexity and name not in names:
            names.add(name)
            if number(record[key]) is not None:
                try:
                    out[name] = math.exp(number(record[key]))
                except OverflowError:
                    out[name] = LARGEST
    for series in derived.series:
        if series.name in names:
            continue
        names.add(series.name)
        numbers = {used: number(out[used] if used in out else record.get(used)) for used in series.names}
        if None not in numbers.values():
            out[series.name] = series.evaluate(numbers)
    return out


#: Series that chain (`ab` reads `a2`, `pa` reads the derived perplexity), read one declared later (`early`), share
#: a name with a metric (`b`) or with a perplexity (`eval_perplexity`), and go non-finite (`lc`, `over`).
CHAINED = {"a2": "a * 2", "ab": "a2 + b", "pa": "perplexity * a", "early": "later + 1", "later": "a - b",
           "b": "a / 3", "eval_perplexity": "eval_loss * 10", "lc": "log(c)", "over": "exp(a2) * c",
           "tl": "train_loss ** 2"}
ODD_VALUES = [math.nan, math.inf, -math.inf, 0.0, -2.5, 3, True, 10 ** 400, "n/a", None, 800.0, 1e-300]


@pytest.mark.parametrize("seed", range(10))
def test_compiled_values_are_the_plain_rule(seed: int) -> None:
    """`Derived.values` (a function compiled per key set: series that can never be computed for it left out) gives,
    value for value and in order, what the plain rule gives: chained series, names read before they are declared,
    series a record has already, NaN, infinite, huge, boolean and non-numeric values, the same key set seen again,
    and records and amends through `Deriver` (an amend making a series computable)."""
    import random

    rng = random.Random(seed)
    names = ["a", "b", "c", "loss", "eval_loss", "train_loss", "perplexity", "later", "lr", "ab"]
    for perplexity in (True, False, ("loss", "eval_loss", "train_loss")):
        derived = Derived(perplexity=perplexity, series=tuple(
            compile_expression(name, text, {}) for name, text in rng.sample(sorted(CHAINED.items()), rng.randint(1, 10))))
        for _ in range(300):
            record = {"step": 1, **{n: rng.choice(ODD_VALUES + [rng.uniform(-5, 5)] * 6)
                                    for n in rng.sample(names, rng.randint(0, len(names)))}}
            assert repr(derived.values(record)) == repr(plain_values(derived, record)), record

        read = {used for series in derived.series for used in series.names}

        def plain_apply(items: list) -> list:  # `Deriver.apply` with the plain rule, written out
            last: Dict[str, Any] = {}
            for kind, data in items:
                if kind == "record":
                    data.update(plain_values(derived, data))
                    last = dict(data)
                elif data["step"] == last.get("step"):
                    last.update(data)
                    if not any(k in read or k in derived.perplexity for k in data):
                        continue  # nothing a series reads: nothing computed again (a series read before it is
                        # declared is computed when something is, as it was)
                    added = plain_values(derived, last)
                    data.update(added)
                    last.update(added)
            return items

        items = []
        for step in range(1, 40):
            record = {"step": step, **{n: rng.choice(ODD_VALUES + [rng.uniform(-5, 5)] * 6)
                                       for n in rng.sample(names, rng.randint(0, 4))}}
            items.append(Item("record", record))
            for _ in range(rng.randint(0, 2)):
                new = {n: rng.uniform(-5, 5) for n in rng.sample(names, 2) if n not in record}
                items.append(Item("amend", {"step": step, "segment": 0, **new}))
                record = {**record, **new}
        got = Deriver(derived).apply([Item(k, dict(d)) for k, d in items])
        assert repr(got) == repr(plain_apply([Item(k, dict(d)) for k, d in items]))


def test_interleaved_parser_derives_for_each_launcher_tagged_rank() -> None:
    parser = InterleavedParser(lambda: SourceParser(builtin_formats()), Derived())
    items = []
    for n, line in enumerate(['[rank0]: {"step": 1, "loss": 1.0}', '[rank1]: {"step": 1, "loss": 2.0}',
                              '{"step": 1, "loss": 3.0}']):
        items += parser.feed(line, n + 1, 0.0)
    items += parser.flush(0.0, force=True)
    got = {(i.data.get("_part"), i.data["loss"]): i.data["perplexity"] for i in items if i.kind == "record"}
    assert got == {("rank0", 1.0): math.e, ("rank1", 2.0): math.exp(2.0), (None, 3.0): math.exp(3.0)}
    plain = InterleavedParser(lambda: SourceParser(builtin_formats()))
    assert all("perplexity" not in i.data for i in plain.feed('{"step": 1, "loss": 1.0}', 1, 0.0)
               + plain.flush(0.0, force=True))


@pytest.mark.slow
def test_mstail_parse_writes_derived_series_in_jsonl_and_csv(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"step": s, "time": 1.7e9 + s, "loss": 10.0 / s, "samples_per_s": 2.0 * s}) + "\n"
                           for s in range(1, 6)), encoding="utf-8")
    spec = tmp_path / "derived.toml"
    spec.write_text('[constants]\nseq_length = 1024\n[series]\ntokens_per_s = "samples_per_s * seq_length"\n',
                    encoding="utf-8")

    def parse(*extra: str) -> Any:
        run = subprocess.run([sys.executable, "-m", "mstail", "parse", str(log), *extra], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        return run.stdout

    rows = [json.loads(line) for line in parse("--derived", str(spec)).splitlines()]
    assert [r["perplexity"] for r in rows] == pytest.approx([math.exp(10.0 / s) for s in range(1, 6)])
    assert [r["tokens_per_s"] for r in rows] == [2048.0 * s for s in range(1, 6)]
    assert list(rows[0])[-2:] == ["perplexity", "tokens_per_s"]  # after the log's own metrics
    header, first = parse("--derived", str(spec), "--to", "csv").splitlines()[:2]
    assert header.split(",")[-2:] == ["perplexity", "tokens_per_s"] and first.endswith(",2048.0")
    assert "perplexity" in parse() and "tokens_per_s" not in parse()  # built in; the file's series only with it
    bad = subprocess.run([sys.executable, "-m", "mstail", "parse", str(log), "--derived", str(log)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("mstail: ") and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_the_sidecar_serves_derived_series(tmp_path: Path) -> None:
    from tests.conftest import start_mstail

    log = tmp_path / "job" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps({"step": s, "time": 1.7e9 + s, "loss": 10.0 / s, "samples_per_s": 2.0 * s}) + "\n"
                           for s in range(1, 6)), encoding="utf-8")
    spec = tmp_path / "derived.toml"
    spec.write_text('[constants]\nseq_length = 1024\n[series]\ntokens_per_s = "samples_per_s * seq_length"\n',
                    encoding="utf-8")
    server = start_mstail([], tmp_path / "mstail", args=["--jsonl", str(log), "--derived", str(spec)])
    try:
        server.wait_records(5, timeout=30)
        [source] = server.get_json("/api/sources")
        assert source["metrics"][-2:] == ["perplexity", "tokens_per_s"]
        [ppl] = server.get_json("/api/series?metric=perplexity")["series"]
        assert ppl["x"] == [1, 2, 3, 4, 5] and ppl["last"] == pytest.approx([math.exp(10.0 / s) for s in range(1, 6)])
        [tps] = server.get_json("/api/series?metric=tokens_per_s")["series"]
        assert tps["last"] == [2048.0 * s for s in range(1, 6)]
        with open(log, "a", encoding="utf-8") as f:  # live: derived as they come, also for a NaN loss
            f.write(json.dumps({"step": 6, "time": 1.7e9 + 6, "loss": "NaN", "samples_per_s": 12.0}) + "\n")
        server.wait_records(6, timeout=30)
        [record] = server.get_json("/api/records?after=5")
        assert record["perplexity"] == "NaN" and record["tokens_per_s"] == 12288.0
    finally:
        server.stop()


def test_perplexity_of_the_losses_a_file_names(tmp_path: Path) -> None:
    spec = tmp_path / "derived.toml"
    spec.write_text('perplexity = ["loss", "eval_loss"]\n', encoding="utf-8")
    derived = load_derived(str(spec))
    assert derived.values({"loss": 0.0, "eval_loss": 0.0, "z_loss": 0.0}) == {"perplexity": 1.0, "eval_perplexity": 1.0}
    spec.write_text("perplexity = true\n", encoding="utf-8")
    assert load_derived(str(spec)) == Derived() and Derived().perplexity == ("loss", "lm_loss")


@pytest.mark.parametrize("text, message", [
    ('[series]\na = "b + 1"\nb = "a * 2"\n', "series a: reads b, declared after it"),  # a cycle
    ('[series]\nearly = "later + 1"\nlater = "loss * 2"\n', "series early: reads later, declared after it"),
    ('[series]\nx = "x + 1"\n', "series x: it reads itself"),
    ('[constants]\nlr = 0.1\n[series]\nscaled = "lr * 2"\n', "constant lr: named like a metric of the built-in formats"),
    ('[constants]\nseq_length = 2\nscaled = 3\n[series]\nscaled = "loss * seq_length"\n', "constant scaled: named like a series"),
    ('[constants]\nperplexity = 3\n', "constant perplexity: named like a perplexity"),
    # names the metric-name sanitiser would change (a series is a metric; a constant stands where one may)
    ('[series]\n"" = "loss * 2"\n', "series '': cannot be a metric name"),
    ('[series]\n"__proto__" = "loss * 2"\n', "series '__proto__': cannot be a metric name"),
    ('[series]\n"a\\u001b[2J" = "loss * 2"\n', r"series 'a\\x1b\[2J': cannot be a metric name"),
    (f'[series]\n{"x" * 257} = "loss * 2"\n', "series 'x+': cannot be a metric name"),
    ('[constants]\n"k\\n" = 2\n', r"constant 'k\\n': cannot be a metric name"),
])
@pytest.mark.slow  # runs `python -m mstail`
def test_a_bad_name_an_order_cycle_or_shadowing_constant_is_a_one_line_error(tmp_path: Path, text: str,
                                                                              message: str) -> None:
    spec = tmp_path / "derived.toml"
    spec.write_text(text, encoding="utf-8")
    with pytest.raises(DerivedError, match=f"^{re.escape(str(spec))}: {message}") as caught:
        load_derived(str(spec))
    assert "\n" not in str(caught.value)
    for command in (["parse"], ["serve", "--port", "0", "--state-dir", str(tmp_path / "state"), "--log"]):
        result = subprocess.run([sys.executable, "-m", "mstail", *command, str(SAMPLES / "metrics.jsonl"),
                                 "--derived", str(spec)], capture_output=True, timeout=60)
        assert result.returncode == 2 and result.stdout == b"", command
        assert result.stderr.decode().strip().splitlines() == [f"mstail: {caught.value}"], command
