"""Launcher-tagged lines of several ranks in one file (torchrun `[rankN]: `, `[defaultN]:`, mpirun
`[1,N]<stdout>:`): one parser per rank, items marked with their part; untagged lines parse as before."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from mstail.parsers import SourceParser, load_formats
from mstail.parsers.interleave import InterleavedParser
from mstail.parsers.record import PART_KEY

SAMPLE = Path(__file__).resolve().parents[2] / "sample_logs" / "mindformers_v1.8_nonsink_worker_0.log"
FORMATS = load_formats(user_dir=Path("/nonexistent"))


def parse(parser, lines: List[str]) -> List[Tuple[str, str, object]]:  # type: ignore[no-untyped-def]
    items = []
    for number, line in enumerate(lines, 1):
        items += parser.feed(line, number, 0.0)
    items += parser.flush(0.0, force=True)
    return [(item.data.get(PART_KEY, ""), item.kind, item.data.get("step", item.data.get("kind"))) for item in items]


def fresh() -> InterleavedParser:
    return InterleavedParser(lambda: SourceParser(FORMATS))


def test_an_untagged_log_parses_exactly_as_with_a_source_parser() -> None:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    plain = SourceParser(FORMATS)
    expected = [i.data for n, line in enumerate(lines, 1) for i in plain.feed(line, n, 0.0)] + [
        i.data for i in plain.flush(0.0, force=True)]
    parser = fresh()
    got = [i.data for n, line in enumerate(lines, 1) for i in parser.feed(line, n, 0.0)] + [
        i.data for i in parser.flush(0.0, force=True)]
    assert str(got) == str(expected) and len(got) > 10  # str: NaN values compare equal
    assert parser.parts == {} and parser.format is not None and parser.counts == plain.counts


def test_every_tag_form_becomes_its_rank_and_ranks_never_mix() -> None:
    body = SAMPLE.read_text(encoding="utf-8").splitlines()
    single = parse(SourceParser(FORMATS), body)
    steps = [step for _, kind, step in single if kind == "record"]
    lines = []
    for line in body:  # the same log written by three ranks, line by line interleaved, each tagged differently
        lines += [f"[rank0]: {line}", f"[default1]:{line}", f"[1,2]<stderr>: {line}"]
    got = parse(fresh(), lines)
    for part in ("rank0", "default1", "rank2"):
        assert [step for name, kind, step in got if name == part and kind == "record"] == steps
    assert {name for name, _, _ in got} == {"rank0", "default1", "rank2"}


def test_a_snapshot_restores_every_part() -> None:
    lines = [f"[rank{r}]: {line}" for line in SAMPLE.read_text(encoding="utf-8").splitlines() for r in (0, 1)]
    whole = parse(fresh(), lines)
    half = len(lines) // 2
    first = fresh()
    before = parse(first, lines[:half])
    assert not first.holding
    second = fresh()
    assert second.restore(first.snapshot()) and set(second.parts) == {"rank0", "rank1"}
    assert before + parse(second, lines[half:]) == whole
    unknown = first.snapshot()
    unknown.parts["rank0"].format = "nope"
    assert not fresh().restore(unknown)


def test_mstail_parse_gives_each_tagged_rank_its_own_source(tmp_path: Path) -> None:
    """Offline as live: `mstail parse` of a torchrun-style file; the ranks' records are those of the untagged log."""
    import io
    import json

    from mstail.tailer.offline import run_parse

    body = SAMPLE.read_text(encoding="utf-8").splitlines()
    tagged = tmp_path / "train.log"
    tagged.write_text("launcher: starting 2 ranks\n" + "".join(f"[rank{r}]: {line}\n" for line in body for r in (0, 1)))
    plain = tmp_path / "plain.log"
    plain.write_text("\n".join(body) + "\n")

    def rows(path: Path):  # type: ignore[no-untyped-def]
        out = io.StringIO()
        run_parse([str(path)], FORMATS, None, "jsonl", out, jobs=1)
        return [json.loads(line) for line in out.getvalue().splitlines()]

    expected = [{k: v for k, v in r.items() if k not in ("source", "line")} for r in rows(plain)]
    got = rows(tagged)
    (file_id,) = {r["source"].split("/")[0] for r in got}
    assert {r["source"] for r in got} == {f"{file_id}/rank0", f"{file_id}/rank1"}
    for rank in (f"{file_id}/rank0", f"{file_id}/rank1"):
        assert [{k: v for k, v in r.items() if k not in ("source", "line")} for r in got if r["source"] == rank] == expected


def test_explain_shows_each_tagged_line_as_its_rank_saw_it(tmp_path: Path) -> None:
    import io

    from mstail.tailer.offline import run_explain

    body = SAMPLE.read_text(encoding="utf-8").splitlines()
    tagged = tmp_path / "train.log"
    tagged.write_text("".join(f"[rank{r}]: {line}\n" for line in body for r in (0, 1)))
    out = io.StringIO()
    run_explain([str(tagged)], FORMATS, None, out)
    shown = out.getvalue().splitlines()
    steps = [line for line in shown if "mindformers/step (record)" in line and "prefixed" in line]
    assert steps and all(line.startswith(("train.log[rank0]:", "train.log[rank1]:")) for line in steps)
    assert sum("[rank0]" in line for line in steps) == sum("[rank1]" in line for line in steps)
    assert "0  lines that look like metrics but matched no rule" in out.getvalue()


def test_launcher_tags_beyond_the_cap_go_to_the_files_own_parser() -> None:
    # Before: 20,000 tags in one file became 20,000 sources (and a 13.9 MB /metrics).
    from mstail.parsers.interleave import MAX_PARTS

    parser = fresh()
    for rank in range(MAX_PARTS + 50):
        parser.feed(f"[rank{rank}]: epoch: 1 step: 1, loss is 2.0", rank + 1, 0.0)
    assert len(parser.parts) == MAX_PARTS and parser.overflow_lines == 50
