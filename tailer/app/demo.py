"""`mstail demo`: a simulated MindFormers training that writes real-format logs while mstail serves them.

Two ranks write `output/log/rank_N/info.log` through `logging`'s RotatingFileHandler with MindFormers'
file-handler format, exactly as MindFormers v1.8+ prints MFLossMonitor step and progress lines: warmup +
cosine lr, a decaying noisy loss, a gradient norm, and now and then an overflow step that halves the loss
scale (it doubles back after `scale_window` (100) clean steps, like DynamicLossScaleUpdateCell).
"""

from __future__ import annotations

import datetime
import logging
import logging.handlers
import math
import random
import threading
from pathlib import Path
from typing import List

FILE_FORMAT = "[%(levelname)s] %(asctime)s [mindformers/core/callback/callback.py:%(lineno)d] %(funcName)s: %(message)s"


class SimulatedTraining:
    """Writes one rank's log, one step every `step_s` seconds, in its own thread.

    Args:
        log_dir: the `output/log` directory; the file is `log_dir/rank_{rank}/info.log`.
        rank: the rank id (a little slower per rank, so the ranks differ as real ones do).
        epochs, steps_per_epoch: the run's length; default 4 x 500 steps.
        step_s: wall time between steps; default 0.2 s.
        seed: random seed for the noise.
    """

    def __init__(self, log_dir: Path, rank: int = 0, epochs: int = 4, steps_per_epoch: int = 500, step_s: float = 0.2, seed: int = 0) -> None:
        self.path = Path(log_dir) / f"rank_{rank}" / "info.log"
        self.rank, self.epochs, self.steps_per_epoch, self.step_s = rank, epochs, steps_per_epoch, step_s
        self.random = random.Random(seed + rank)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"demo-rank{rank}", daemon=True)

    def start(self) -> "SimulatedTraining":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=2)

    def _logger(self) -> logging.Logger:
        logger = logging.getLogger(f"mstail.demo.rank{self.rank}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        handler = logging.handlers.RotatingFileHandler(self.path, maxBytes=50 * 1024 * 1024, backupCount=5, encoding="utf-8")
        handler.setFormatter(logging.Formatter(FILE_FORMAT))
        logger.handlers[:] = [handler]
        return logger

    def _run(self) -> None:
        logger = self._logger()
        logger.info(".........Starting Training Model..........")
        total = self.epochs * self.steps_per_epoch
        scale, clean_steps = 65536.0, 0
        avg: List[float] = []
        for step in range(1, total + 1):
            if self.stop_event.wait(self.step_s):
                break
            epoch, in_epoch = (step - 1) // self.steps_per_epoch + 1, (step - 1) % self.steps_per_epoch + 1
            overflow = self.random.random() < 0.006
            if overflow:
                scale, clean_steps = max(scale / 2, 1.0), 0
            else:
                clean_steps += 1
                if clean_steps == 100:  # scale_window
                    scale, clean_steps = min(scale * 2, 2.0 ** 18), 0  # a demo ceiling keeps the chart readable
            loss = self._loss(step)
            avg = avg + [loss] if in_epoch > 1 else [loss]
            step_ms = int(self.step_s * 1000 * (1 + 0.05 * self.rank) * self.random.uniform(0.9, 1.15))
            logger.info(
                "{ Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.6f/%5.6f], per_step_time: %dms, lr: %s, overflow cond: %s, "
                "loss_scale: %s, global_norm: [%s], train_throughput_per_npu: %.3fT",
                epoch, self.epochs, in_epoch, self.steps_per_epoch, loss, sum(avg) / len(avg), step_ms,
                repr(_lr(step, total)), overflow, scale, repr(round(self._norm(step), 7)), 120.0 * 200 / max(step_ms, 1),
            )
            remaining = datetime.timedelta(seconds=int((total - step) * self.step_s))
            percent = step / total * 100
            bar = "|%-50s|" % ("█" * int(50 * percent / 100))
            logger.info("  %4.1f%% %s %.5f samples/s/p  %s }", percent, bar, 8 / (step_ms / 1000), remaining)
            if step % self.steps_per_epoch == 0:
                logger.info("......Saving ckpt......")
        else:
            logger.info(".........Training Over!.............")
        for handler in logger.handlers:
            handler.close()

    def _loss(self, step: int) -> float:
        return 2.1 + 8.3 * math.exp(-step / 350) + self.random.gauss(0, 0.04 + 0.1 * math.exp(-step / 500))

    def _norm(self, step: int) -> float:
        return 0.8 + 3.0 * math.exp(-step / 200) + abs(self.random.gauss(0, 0.15))


def _lr(step: int, total: int, peak: float = 1e-4, floor: float = 1e-5, warmup: int = 100) -> float:
    """Warmup then cosine decay, rendered as float32 str() like MindFormers does."""
    if step <= warmup:
        value = peak * step / warmup
    else:
        progress = (step - warmup) / max(total - warmup, 1)
        value = floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
    return float(f"{value:.8g}")


def start_demo(log_dir: Path, ranks: int = 2, step_s: float = 0.2) -> List[SimulatedTraining]:
    return [SimulatedTraining(log_dir, rank=r, step_s=step_s).start() for r in range(ranks)]
