"""A writer process for tailing tests: appends sequence-numbered lines through `logging`.

    python seq_writer.py PATH COUNT [--interval S] [--max-bytes N] [--backups K]

With --max-bytes the file rotates exactly as MindFormers' RotatingFileHandler does (rename to PATH.1 ...).
Prints "done" on stdout at the end, so a test knows every line has been written.
"""

import argparse
import logging
import logging.handlers
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("count", type=int)
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--max-bytes", type=int, default=0)
    parser.add_argument("--backups", type=int, default=0)
    parser.add_argument("--start", type=int, default=1)
    args = parser.parse_args()
    handler = logging.handlers.RotatingFileHandler(args.path, maxBytes=args.max_bytes, backupCount=args.backups)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("seq")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    for i in range(args.start, args.start + args.count):
        logger.info("line=%08d padding=%s", i, "x" * 40)
        if args.interval:
            time.sleep(args.interval)
    handler.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
