"""Real MindSpore 2.10 summary writers, run as a separate process by the live tests.

    python -m tests.eventfiles.mswrite RECORD_FOLDER COLLECTOR_FOLDER STEPS PAUSE

First `SummaryRecord` writes STEPS steps of two scalars (`loss`, `lr`: `values(step)`), flushing after each and
sleeping PAUSE seconds; then a small `Model.train` runs with `SummaryCollector(collect_freq=1)` writing into
COLLECTOR_FOLDER, and a `LossLog` callback prints each step's loss as the collector saw it (one JSON line per step
on stdout: `{"step": N, "loss": X}`), which the test compares with what mstail served.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict

import numpy as np


def values(step: int) -> Dict[str, float]:
    """The float32 values SummaryRecord writes at `step`, as Python floats."""
    return {"loss": float(np.float32(3.0 / step + 1e-6 * step)), "lr": float(np.float32(0.01 * 0.9 ** step))}


def main() -> None:
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindspore.train import Callback, Model, SummaryCollector, SummaryRecord

    from tests.callback import nets

    record_folder, collector_folder, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with SummaryRecord(record_folder) as summary:
        for step in range(1, steps + 1):
            for tag, value in values(step).items():
                summary.add_value("scalar", tag, Tensor(np.float32(value)))
            summary.record(step)
            summary.flush()
            time.sleep(pause)

    class LossLog(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            args = run_context.original_args()
            loss = args.net_outputs
            print(json.dumps({"step": args.cur_step_num, "loss": float(np.float32(loss.asnumpy()))}), flush=True)

    net = nn.Dense(4, 1)
    model = Model(net, loss_fn=nets.MeanLoss(), optimizer=nn.SGD(net.trainable_params(), learning_rate=0.01))
    collector = SummaryCollector(collector_folder, collect_freq=1, keep_default_action=False,
                                 collect_specified_data={"collect_metric": True})
    model.train(2, nets.dataset(nets.features()), callbacks=[collector, LossLog()], dataset_sink_mode=False)
    del ms


if __name__ == "__main__":
    main()
