"""The package as a user gets it: the wheel's contents, and `mstail` installed from it into a clean venv.

The repository keeps top-level folders named tailer/, parsers/ and web/, which install as `mstail.tailer`,
`mstail.parsers` and `mstail.web` (pyproject.toml's `package-dir`). Nothing here imports from the source tree:

- the wheel is built from a copy of the sources (so the repository's build/ and *.egg-info are never touched
  and a stale build/lib cannot hide a missing file), then read with `zipfile`;
- one venv per module, WITHOUT system site packages (the repository is installed editable in the system
  interpreter and must not leak in), gets the wheel and its dependencies from the package index (no `test`
  extra, so no MindSpore), and every command runs from an unrelated folder with PYTHONPATH dropped;
- the same venv then gets the index's own `tailer` and `web.py` (top-level modules `tailer` and `web`, the
  names of this repository's folders) beside mstail, and loses `web.py` again.

Every subprocess is bounded; the server listens on loopback only and is stopped with SIGINT.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11: tomli is a dependency there
    import tomli as tomllib  # type: ignore[no-redef]

# pip installs may fetch from the index: up to PIP_TIMEOUT_S each, so a test may take several of them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_LOG = ROOT / "sample_logs" / "mindformers_v1.8_nonsink_worker_0.log"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]

PIP_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 30.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_BANNER = re.compile(r"mstail: serving (http://127\.0\.0\.1:\d+)")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through an *_proxy

# Not part of a build: left out of the copy the wheel is built from.
_SKIP_AT_ROOT = {".git", "build", "dist", "tests", "docs", "sample_logs", ".ci", ".benchmarks", ".hypothesis",
                 ".pytest_cache", ".venv", "venv"}


def run(cmd: Sequence[str], timeout: float = RUN_TIMEOUT_S, check: bool = True, **kwargs: object
        ) -> subprocess.CompletedProcess:
    """Run `cmd` (bounded), capture text; with `check`, fail with its output unless it exits 0."""
    result = subprocess.run([os.fspath(c) for c in cmd], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout, **kwargs)  # type: ignore[call-overload]
    if check:
        assert result.returncode == 0, (
            f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
        )
    return result


def source_files(folder: str) -> List[str]:
    """Files under ROOT/folder (recursively, bytecode excluded), as paths relative to ROOT/folder."""
    base = ROOT / folder
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def expected_wheel_files() -> Dict[str, Path]:
    """What the wheel must hold, in wheel paths, mapped to the source file each comes from."""
    expected: Dict[str, Path] = {}
    # every module, subpackages included (an explicit `packages` list must name each of them)
    for package, folder in (("mstail", "mstail"), ("mstail/tailer", "tailer"), ("mstail/parsers", "parsers"),
                            ("mstail/web", "web")):
        for rel in source_files(folder):
            if rel.endswith(".py"):
                expected[f"{package}/{rel}"] = ROOT / folder / rel
    for name in (ROOT / "parsers" / "formats").glob("*.toml"):
        expected[f"mstail/parsers/formats/{name.name}"] = name
    expected["mstail/parsers/record.schema.json"] = ROOT / "parsers" / "record.schema.json"
    for rel in source_files("web/static"):
        expected[f"mstail/web/static/{rel}"] = ROOT / "web" / "static" / rel
    return expected


# -- the wheel ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mstail's wheel, built (bounded) from a copy of the sources with `pip wheel --no-deps`."""
    src = tmp_path_factory.mktemp("src") / "mstail-src"

    def ignore(folder: str, names: List[str]) -> List[str]:
        at_root = Path(folder) == ROOT
        return [n for n in names if n == "__pycache__" or n.endswith((".egg-info", ".pyc"))
                or (at_root and n in _SKIP_AT_ROOT)]

    shutil.copytree(ROOT, src, ignore=ignore)
    out = tmp_path_factory.mktemp("wheelhouse")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    base = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(out)]
    # The installed setuptools builds it without the index; an isolated build (setuptools from the index) is
    # the fallback for an interpreter whose setuptools is missing or too old.
    first = run(base + ["--no-build-isolation"], timeout=PIP_TIMEOUT_S, check=False, cwd=str(src), env=env)
    if first.returncode != 0:
        second = run(base, timeout=PIP_TIMEOUT_S, check=False, cwd=str(src), env=env)
        assert second.returncode == 0, (
            f"pip wheel failed with and without build isolation\n--- without isolation ---\n{first.stderr[-3000:]}"
            f"\n--- isolated ---\n{second.stdout[-2000:]}\n{second.stderr[-3000:]}"
        )
    wheels = sorted(out.glob("*.whl"))
    assert [w.name for w in wheels] == [f"mstail-{VERSION}-py3-none-any.whl"], wheels
    return wheels[0]


def test_wheel_holds_one_package_with_its_data_and_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = f"mstail-{VERSION}.dist-info"
        assert {n.split("/", 1)[0] for n in names} == {"mstail", dist_info}

        expected = expected_wheel_files()
        for must in ("mstail/__init__.py", "mstail/__main__.py", "mstail/tailer/app/cli.py",
                     "mstail/parsers/formats/mindformers.toml", "mstail/web/static/index.html",
                     "mstail/web/static/vendor/echarts-5.6.0-mstail.min.js"):
            assert must in expected, f"{must} is not in the source tree any more: update this test"
        missing = sorted(set(expected) - names)
        assert not missing, f"in the source tree but not in the wheel: {missing}"
        # What is packed is the source file, byte for byte (package data is not rewritten on the way).
        for name, path in expected.items():
            if not name.endswith(".py"):
                assert zf.read(name) == path.read_bytes(), name

        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(f"{dist_info}/entry_points.txt").decode("utf-8"))
        assert dict(entry_points["console_scripts"]) == {"mstail": "mstail.tailer.app.cli:main"}
        if f"{dist_info}/top_level.txt" in names:  # setuptools writes it; other backends need not
            assert zf.read(f"{dist_info}/top_level.txt").decode("utf-8").split() == ["mstail"]


# -- the venv -----------------------------------------------------------------------------------------------
@dataclass
class Venv:
    path: Path
    site_packages: Path
    workdir: Path  # an unrelated folder: the cwd of everything run here
    env: Dict[str, str]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def mstail(self) -> Path:
        return self.path / "bin" / "mstail"

    def run(self, *cmd: object, timeout: float = RUN_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
        return run([os.fspath(c) for c in cmd], timeout=timeout, check=check, cwd=str(self.workdir), env=self.env)

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(self.python, "-m", "pip", *args, timeout=PIP_TIMEOUT_S)

    def origin(self, module: str) -> str:
        """Where `module` is found in the venv ("None" if nowhere), without importing it."""
        code = f"import importlib.util as u; s = u.find_spec({module!r}); print(s.origin if s else None)"
        return self.run(self.python, "-c", code).stdout.strip()


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv (no system site packages) with the wheel and its dependencies installed, built once."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", str(path)], timeout=60)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONUNBUFFERED="1",
        MSTAIL_STATE_DIR=str(tmp_path_factory.mktemp("venv-state")),
        MSTAIL_FORMATS_DIR=str(tmp_path_factory.mktemp("venv-formats") / "none"),  # no formats from ~/.config
    )
    workdir = tmp_path_factory.mktemp("elsewhere")
    probe = run([path / "bin" / "python", "-c", "import sysconfig, sys; print(sysconfig.get_paths()['purelib']); "
                 "print(sys.prefix != sys.base_prefix)"], cwd=str(workdir), env=env)
    site_packages, in_venv = probe.stdout.split()
    assert in_venv == "True"
    made = Venv(path, Path(site_packages), workdir, env)
    # Before installing: the editable mstail of the system interpreter must not be visible here.
    assert made.origin("mstail") == "None", "mstail leaks into the fresh venv before it is installed"
    made.pip("install", str(wheel))
    assert made.origin("mstail") == str(made.site_packages / "mstail" / "__init__.py")
    return made


def check_installed_mstail(venv: Venv, tmp_path: Path) -> None:
    """(a) `mstail parse`, (b) `python -m mstail --version`, (c) `mstail --log` serving on loopback."""
    # (a) the formats (package data) load and parse a real MindFormers log to JSON lines
    parsed = venv.run(venv.mstail, "parse", SAMPLE_LOG)
    assert "Traceback" not in parsed.stderr, parsed.stderr
    rows = [json.loads(line) for line in parsed.stdout.splitlines() if line.strip()]
    steps = [row["step"] for row in rows]
    assert steps and steps[0] == 1 and steps == sorted(set(steps)), steps
    assert "mindformers" in parsed.stderr, parsed.stderr

    # (b) the version comes from the installed distribution's metadata (not "0+unknown")
    for cmd in ((venv.python, "-m", "mstail", "--version"), (venv.mstail, "--version")):
        assert venv.run(*cmd).stdout.strip() == f"mstail {VERSION}"

    # (c) serve on loopback, read the banner, ask /healthz and the page, stop with SIGINT
    workdir = Path(tmp_path)
    workdir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = workdir / "serve.stdout", workdir / "serve.stderr"
    cmd = [str(venv.mstail), "--log", str(SAMPLE_LOG), "--port", "0", "--no-state"]
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=str(venv.workdir), env=venv.env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            match = _BANNER.search(stdout_path.read_text("utf-8", "replace"))
            if match:
                url = match.group(1)
                break
            assert proc.poll() is None, (
                f"mstail exited with {proc.returncode} before serving:\n{stderr_path.read_text('utf-8', 'replace')}")
            assert time.monotonic() < deadline, (
                f"no serving line within {START_TIMEOUT_S} s:\n{stderr_path.read_text('utf-8', 'replace')}")
            time.sleep(0.05)

        with _NO_PROXY.open(url + "/healthz", timeout=5) as response:
            assert response.status == 200
            assert json.loads(response.read().decode("utf-8"))["status"] == "ok"
        with _NO_PROXY.open(url + "/", timeout=5) as response:
            page = response.read().decode("utf-8")
        assert "/static/vendor/echarts-" in page and "/static/app.js" in page
        # the static files (package data of mstail.web) are what the installed package serves
        for rel in ("app.js", "vendor/echarts-5.6.0-mstail.min.js"):
            with _NO_PROXY.open(f"{url}/static/{rel}", timeout=5) as response:
                assert response.read() == (ROOT / "web" / "static" / rel).read_bytes(), rel
        # and the record's schema (package data of mstail.parsers), which the page reads
        with _NO_PROXY.open(f"{url}/static/record.schema.json", timeout=5) as response:
            assert response.read() == (ROOT / "parsers" / "record.schema.json").read_bytes()

        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"mstail did not exit within {STOP_TIMEOUT_S} s of SIGINT") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    stderr = stderr_path.read_text("utf-8", "replace")
    assert "Traceback" not in stderr, stderr


def test_installed_wheel_parses_reports_version_and_serves(venv: Venv, tmp_path: Path) -> None:
    check_installed_mstail(venv, tmp_path)


def test_index_packages_named_tailer_and_web_do_not_collide(venv: Venv, tmp_path: Path) -> None:
    # PyPI's `tailer` and `web.py` install top-level packages tailer/ and web/: what a bare `import tailer` or
    # `import web` now finds. mstail's own modules live under mstail/ and must not care.
    venv.pip("install", "tailer", "web.py")
    assert venv.origin("tailer") == str(venv.site_packages / "tailer" / "__init__.py")
    assert venv.origin("web") == str(venv.site_packages / "web" / "__init__.py")
    check_installed_mstail(venv, tmp_path / "with-both")

    # Removing web.py removes what its RECORD lists (site-packages/web/...), never mstail/web.
    mstail_web = venv.site_packages / "mstail" / "web"
    wanted = [mstail_web / name[len("mstail/web/"):] for name in expected_wheel_files()
              if name.startswith("mstail/web/")]
    venv.pip("uninstall", "-y", "web.py")
    assert venv.origin("web") == "None"
    gone = [str(p) for p in wanted if not p.is_file()]
    assert not gone, f"uninstalling web.py removed mstail files: {gone}"
    check_installed_mstail(venv, tmp_path / "without-web")
