"""`mstail parse`, offline: chains of rotated files and their lines (`reading`), run serially or in worker processes (`run`,
`parallel`), written as JSONL or CSV (`output`)."""

from mstail.tailer.offline.reading import Chain, InputError, ParseError, Summary, chain_lines, chains, parse_chain
from mstail.tailer.offline.output import OutputError, output
from mstail.tailer.offline.run import run_explain, run_parse

__all__ = ["Chain", "InputError", "OutputError", "ParseError", "Summary", "chain_lines", "chains", "output", "parse_chain",
           "run_explain", "run_parse"]
