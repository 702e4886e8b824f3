"""Event files written by real writers (tensorboardX in a separate process, tests/eventfiles/tbwrite.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]


#: This folder's fixtures that start a writer process: their tests are `slow` (tests/conftest.py), as those of
#: the shared process fixtures are.
_WRITER_FIXTURES = {"event_file", "tensor_event_file"}


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    for item in items:
        if _WRITER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def write_tensorboard(folder: Path, first: int, last: int, *options: str) -> List[Path]:
    """Run the tensorboardX writer to its end; the folder's files, oldest first."""
    subprocess.run([sys.executable, "-m", "tests.eventfiles.tbwrite", str(folder), str(first), str(last), *options],
                   cwd=ROOT, check=True, timeout=60)
    return sorted(folder.iterdir())


@pytest.fixture(scope="session")
def event_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tensorboardX file of 12 steps (4 scalars each, with their samples twins: 97 frames)."""
    (path,) = write_tensorboard(tmp_path_factory.mktemp("tb"), 1, 12)
    return path


@pytest.fixture(scope="session")
def tensor_event_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 12 steps with `loss` as a rank-0 tensor of the `scalars` plugin."""
    (path,) = write_tensorboard(tmp_path_factory.mktemp("tbt"), 1, 12, "--tensor")
    return path
