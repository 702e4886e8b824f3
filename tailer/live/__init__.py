"""The live sidecar: the reading pass over every source (`sidecar.Tailer`), the catch-up child for big files,
the planner that paces reads, and the hub that hands new items to the web layer."""
