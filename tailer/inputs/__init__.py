"""Inputs: following files (rotation, truncation, checkpoints), lines and event-file frames, which files in a
folder are runs, and who is writing them. `kind.py` is the one interface an input kind implements."""
