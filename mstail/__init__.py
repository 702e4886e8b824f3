"""mstail: live curves from MindSpore/MindFormers training logs.

The installed package is `mstail`, whose subpackages come from the repository's top-level folders
(pyproject.toml's `package-dir`):

- `mstail.parsers` (parsers/): lines -> records. Formats as data, the record contract (`mstail.parsers.record`).
- `mstail.tailer` (tailer/): bytes -> lines -> history; the sidecar loop, alerts, `mstail parse`, the CLI.
- `mstail.web` (web/): history -> people. The FastAPI app, SSE, the page.
- `mstail.callback` (this folder): the JSONL callback that runs inside a MindSpore training.

ARCHITECTURE.md describes the data flow, the threads and the contracts.
"""



def __getattr__(name: str) -> str:
    # `__version__` looked up when asked for: importlib.metadata costs about 40 ms of every command's start-up.
    if name != "__version__":
        raise AttributeError(f"module 'mstail' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("mstail")
    except PackageNotFoundError:  # a source tree used without installing it
        found = "0+unknown"
    globals()["__version__"] = found
    return found
