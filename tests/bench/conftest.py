# tests/bench/ holds benchmarks: plain scripts run by hand (`python tests/bench/latency.py`), never collected.
collect_ignore_glob = ["*.py"]
