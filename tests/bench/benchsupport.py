"""What the benchmark scripts share (they run as plain scripts: `python tests/bench/NAME.py`)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any, Sequence, Tuple

HERE = Path(__file__).resolve().parent


def load_test_support() -> Any:
    """tests/conftest.py (real mstail start-up and the MindFormers writer), loaded as a plain module."""
    spec = importlib.util.spec_from_file_location("mstail_test_support", HERE.parent / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def serve_rank_logs(support: Any, prefix: str, ranks: int, args: Sequence[str] = ()) -> Tuple[Any, Path, Path]:
    """Empty `output/log/rank_N/info.log` files in a new temp dir (the writers append to these very files) and a
    real mstail following them: (server, log_dir, work_dir)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    log_dir = work / "output" / "log"
    for rank in range(ranks):
        (log_dir / f"rank_{rank}").mkdir(parents=True)
        (log_dir / f"rank_{rank}" / "info.log").touch()
    server = support.start_mstail([str(log_dir / "rank_*" / "info.log")], work / "mstail", args=tuple(args))
    return server, log_dir, work
