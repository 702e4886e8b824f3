"""Bytes -> lines -> the sidecar: follow files, store history, fan out, and the `mstail` command.

Kept import-light on purpose: `tailer.callback` runs inside training scripts that have only mindspore and
the standard library installed.
"""

__version__ = "0.1.0"
