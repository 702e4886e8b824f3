"""`serve.WebImports`: on a restart the web part (uvicorn, FastAPI, the app's routes) is imported in a thread of its
own beside `Store.load`; `serve` waits for it before anything forks. Each case runs in a fresh interpreter, where
nothing of the web part is imported yet."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # new interpreters


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_thread_imports_what_serve_needs_and_wait_waits_for_it() -> None:
    done = _run(
        "import sys\n"
        "from mstail.tailer.app.serve import WebImports\n"
        "assert not any(name in sys.modules for name in WebImports.MODULES)\n"
        "imports = WebImports()\n"
        "imports.wait()\n"
        "missing = [name for name in WebImports.MODULES if name not in sys.modules]\n"
        "assert not missing, missing\n"
        "from mstail.web import create_app\n"
        "print('ok')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


def test_an_import_failing_in_the_thread_is_raised_by_serves_own_import_not_said_twice() -> None:
    done = _run(
        "import sys\n"
        "sys.modules['fastapi'] = None  # `import fastapi` raises ImportError\n"
        "from mstail.tailer.app.serve import WebImports\n"
        "WebImports().wait()\n"
        "print('waited')\n"
        "from mstail.web import create_app\n"
    )
    assert done.stdout == "waited\n"
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1 and "ModuleNotFoundError: import of fastapi halted" in done.stderr
