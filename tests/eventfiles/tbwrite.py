"""A real tensorboardX writer as MindFormers' MFLossMonitor uses it, run as a separate process by the live tests, and
its values as the tests expect them.

    python -m tests.eventfiles.tbwrite FOLDER FIRST LAST [--pause S] [--new-file-at STEP] [--tensor] [--times FILE]

Writes steps FIRST..LAST (MFLossMonitor's tags, each with its "vs samples" twin), flushing after every step and
sleeping `--pause` seconds between steps; `--new-file-at STEP` closes the writer before STEP and opens another in the
same folder (a relaunch: a second file); `--tensor` writes `loss` as a rank-0 float tensor with the `scalars`
plugin (TensorFlow 2's and newer writers' way) instead of `simple_value`; `--times FILE` appends "STEP TIME" right
after each step's flush (the live latency bench).
"""

from __future__ import annotations

import argparse
import time
from typing import Dict

import numpy as np

GLOBAL_BATCH = 64


def values(step: int) -> Dict[str, float]:
    """The float32 values written at `step`, as Python floats (what a bit-exact reader must give), by mstail's
    metric names."""
    return {
        "loss": float(np.float32(10.0 / (step + 1) + 1e-7 * step)),
        "lr": float(np.float32(1e-4 * (1 + step % 7) / 3)),
        "grad_norm": float(np.float32(np.pi * step / 17)),
        "global_batch_size": float(np.float32(GLOBAL_BATCH)),
    }


def _tensor_scalar(tag: str, value: float):  # type: ignore[no-untyped-def]
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboardX.proto.tensor_pb2 import TensorProto

    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    tensor = TensorProto(dtype=1, float_val=[value])  # DT_FLOAT, rank 0
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)])


def main() -> None:
    from tensorboardX import SummaryWriter

    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--new-file-at", type=int, default=None)
    parser.add_argument("--tensor", action="store_true")
    parser.add_argument("--times", default=None)
    args = parser.parse_args()
    writer = SummaryWriter(args.folder, flush_secs=3600)
    for step in range(args.first, args.last + 1):
        if step == args.new_file_at:
            writer.close()
            time.sleep(1.1)  # file names carry the time in seconds: the new file's name sorts after the old one's
            writer = SummaryWriter(args.folder, flush_secs=3600)
        v = values(step)
        samples = step * GLOBAL_BATCH
        for tag, name in (("learning-rate", "lr"), ("batch-size", "global_batch_size")):
            writer.add_scalar(tag, v[name], step)
            writer.add_scalar(f"{tag} vs samples", v[name], samples)
        if args.tensor:
            writer.file_writer.add_summary(_tensor_scalar("loss", v["loss"]), step)
        else:
            writer.add_scalar("loss", v["loss"], step)
        writer.add_scalar("loss vs samples", v["loss"], samples)
        writer.add_scalar("grad-norm", v["grad_norm"], step)
        writer.add_scalar("grad-norm vs samples", v["grad_norm"], samples)
        writer.flush()
        if args.times:
            with open(args.times, "a", encoding="ascii") as times:
                times.write(f"{step} {time.time()!r}\n")
        if args.pause:
            time.sleep(args.pause)
    writer.close()


if __name__ == "__main__":
    main()
