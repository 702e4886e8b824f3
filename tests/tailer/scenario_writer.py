"""A writer process for the reliability scenarios: sequence-numbered lines, written the way trainings write.

    python scenario_writer.py PATH --count N [--start S] [--tag T] [--rate LINES_PER_S]
        [--max-bytes N --backups K] [--rotate-every S]      RotatingFileHandler (rename + create), as MindFormers
        [--raw] [--batch N] [--truncate]                    one O_APPEND fd kept open (survives mv / rm of PATH)
        [--pause-after K --pause S]                         stop after line K for S seconds (then go on)
        [--split-line K --split-at B --split-pause S]       line K written in two parts, B bytes then the rest
        [--keep-mtime]                                      after each write, set the mtime back (NFS-like stat)
        [--times FILE]                                      "seq unix_time" after each written line (latency)
        [--header-bytes N]                                  N bytes of identical banner lines first (same head)
        [--jsonl-text TEXT] [--crlf] [--bom] [--bytewise]   JSONL events carrying TEXT; CRLF ends; a BOM; 1-byte writes
        [--giant-after K --giant-bytes N]                   after line K: N bytes without a newline (1 MiB writes)
        [--tqdm-after K --tqdm-seconds S]                   after line K: `\r` progress redraws for S s, then `\n`
        [--garbage-after K]                                 after line K: random bytes, a NUL run, a sparse hole,
                                                            ANSI-coloured lines (that still count as lines)
        [--traceback-after K,..]                            after line K: a raw Python traceback, split over 2 writes
        [--torchrun N [--traceback-after K]]                N ranks' lines in one file, each tagged `[rankR]: ` (tag R);
                                                            after line K the last rank crashes: its traceback's lines
                                                            come one per line of the others, which go on

Lines are `w=<tag> seq=<8 digits> pad=xxxx`, parsed by `PATTERN` (tests/tailer/scenario_support.py) into
records with `step` = seq and `w` = tag, so missing / duplicate / out-of-order lines are exact. Writes go on an
absolute schedule (`--rate`); "done" is printed at the end.
"""

import argparse
import json
import logging
import logging.handlers
import os
import random
import sys
import time

JSONL_TEXT = None


def line_of(tag: int, seq: int, pad: int) -> str:
    if JSONL_TEXT is not None:
        return json.dumps({"kind": "note", "w": tag, "step": seq, "message": "%s %d" % (JSONL_TEXT, seq)},
                          ensure_ascii=False)
    return "w=%d seq=%08d pad=%s" % (tag, seq, "x" * pad)


def garbage(tag: int, seq: int, pad: int) -> bytes:
    """Random bytes (seeded; invalid UTF-8 on purpose), then ANSI-coloured lines which must still parse."""
    rng = random.Random(seq)
    noise = bytes(rng.randrange(256) for _ in range(3000))
    noise = noise.replace(b"\n", b"").replace(b"\r", b"")
    lines = [noise[i:i + 300] for i in range(0, len(noise), 300)]
    return b"\n".join(lines) + b"\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--start", type=int, default=1)
    ap.add_argument("--tag", type=int, default=0)
    ap.add_argument("--pad", type=int, default=30)
    ap.add_argument("--rate", type=float, default=0.0, help="lines per second (0 = as fast as possible)")
    ap.add_argument("--max-bytes", type=int, default=0)
    ap.add_argument("--backups", type=int, default=0)
    ap.add_argument("--rotate-every", type=float, default=0.0)
    ap.add_argument("--raw", action="store_true")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--truncate", action="store_true")
    ap.add_argument("--pause-after", type=int, default=0)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--split-line", type=int, default=0)
    ap.add_argument("--split-at", type=int, default=0)
    ap.add_argument("--split-pause", type=float, default=0.0)
    ap.add_argument("--keep-mtime", action="store_true")
    ap.add_argument("--times", default="")
    ap.add_argument("--header-bytes", type=int, default=0)
    ap.add_argument("--jsonl-text", default=None)
    ap.add_argument("--crlf", action="store_true")
    ap.add_argument("--bom", action="store_true")
    ap.add_argument("--bytewise", action="store_true")
    ap.add_argument("--giant-after", type=int, default=0)
    ap.add_argument("--giant-bytes", type=int, default=50 << 20)
    ap.add_argument("--tqdm-after", type=int, default=0)
    ap.add_argument("--tqdm-seconds", type=float, default=1.0)
    ap.add_argument("--garbage-after", type=int, default=0)
    ap.add_argument("--traceback-after", default="", help="comma-separated line numbers")
    ap.add_argument("--torchrun", type=int, default=0, help="ranks writing to the one file, tagged as torchrun does")
    args = ap.parse_args()
    global JSONL_TEXT
    JSONL_TEXT = args.jsonl_text
    if args.jsonl_text is not None or args.giant_after or args.tqdm_after or args.garbage_after or args.traceback_after:
        args.raw = True
    args.raw = args.raw or bool(args.torchrun)
    ranks = list(range(args.torchrun))
    crash_lines = []  # the crashed rank's traceback lines still to come, one per line of the others

    os.makedirs(os.path.dirname(os.path.abspath(args.path)), exist_ok=True)
    handler = None
    fd = -1
    if args.raw or args.split_line or args.keep_mtime:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if args.truncate else 0)
        fd = os.open(args.path, flags, 0o644)
    else:
        handler = logging.handlers.RotatingFileHandler(
            args.path, mode="w" if args.truncate else "a", maxBytes=args.max_bytes, backupCount=args.backups)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger("scenario")
        logger.propagate = False
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    times = open(args.times, "a") if args.times else None
    first_mtime = None

    def write(text: str, seqs) -> None:  # type: ignore[no-untyped-def]
        nonlocal first_mtime
        if handler is not None:
            for chunk in text.splitlines():
                logger.info("%s", chunk)  # one record per line: RotatingFileHandler may roll between any two
        else:
            data = text.encode("utf-8")
            if args.crlf:
                data = data.replace(b"\n", b"\r\n")
            if args.bytewise:
                for i in range(len(data)):
                    os.write(fd, data[i:i + 1])
                    if i % 7 == 0:
                        time.sleep(0.0005)
            else:
                os.write(fd, data)
            if args.keep_mtime:
                st = os.fstat(fd)
                if first_mtime is None:
                    first_mtime = (st.st_atime_ns, st.st_mtime_ns)
                os.utime(fd, ns=first_mtime)  # size grows, mtime stays: what a lagging attribute cache shows
        if times is not None:
            now = time.time()
            times.write("".join("%d %.6f\n" % (seq, now) for seq in seqs))
            times.flush()

    if args.bom:
        os.write(fd, b"\xef\xbb\xbf")
    if args.header_bytes:
        banner = ""
        while len(banner) < args.header_bytes:
            banner += "banner: identical first KiB in every rank file, like a config dump %04d\n" % len(banner)
        write(banner, [])

    t0 = time.monotonic()
    next_rotation = t0 + args.rotate_every if args.rotate_every else None
    seq, end = args.start, args.start + args.count
    written = 0
    while seq < end:
        if args.rate:
            delay = t0 + written / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if next_rotation is not None and time.monotonic() >= next_rotation and handler is not None:
            handler.doRollover()
            next_rotation += args.rotate_every
        n = min(args.batch, end - seq)
        seqs = list(range(seq, seq + n))
        if args.split_line in seqs:
            text = line_of(args.tag, args.split_line, args.pad) + "\n"
            before = "".join(line_of(args.tag, s, args.pad) + "\n" for s in seqs if s < args.split_line)
            after = "".join(line_of(args.tag, s, args.pad) + "\n" for s in seqs if s > args.split_line)
            write(before + text[: args.split_at], [s for s in seqs if s < args.split_line])
            time.sleep(args.split_pause)
            write(text[args.split_at:] + after, [s for s in seqs if s >= args.split_line])
        elif args.torchrun:
            text = ""
            for s in seqs:
                for r in ranks:
                    if crash_lines and r == ranks[0]:
                        text += "[rank%d]: %s\n" % (args.torchrun - 1, crash_lines.pop(0))
                    text += "[rank%d]: %s\n" % (r, line_of(r, s, args.pad))
            write(text, seqs)
        else:
            write("".join(line_of(args.tag, s, args.pad) + "\n" for s in seqs), seqs)
        seq += n
        written += n
        last = seqs[-1]
        if args.giant_after == last:
            chunk = b"y" * (1 << 20)
            left = args.giant_bytes
            while left > 0:
                os.write(fd, chunk[:left])
                left -= len(chunk)
            os.write(fd, b"\n")
        if args.tqdm_after == last:
            began = time.monotonic()
            i = 0
            while time.monotonic() - began < args.tqdm_seconds:
                i += 1
                os.write(fd, ("\r%3d%%|%-20s| %d/1000 [00:%02d<00:10, 9.8it/s]" % (i % 101, "#" * (i % 21), i, i % 60)).encode())
                time.sleep(0.01)
            os.write(fd, b"\n")
        if args.garbage_after == last:
            os.write(fd, garbage(args.tag, last, args.pad))
            # a NUL run longer than the 1 MiB line limit, then a line glued to it (a crashed writer's tail)
            os.write(fd, b"\0" * (1536 << 10) + (line_of(args.tag, seq, args.pad) + "\n").encode())
            seq += 1
            # a sparse hole (the file is extended without data), then the next line after it
            os.ftruncate(fd, os.fstat(fd).st_size + (2 << 20))
            os.write(fd, (line_of(args.tag, seq, args.pad) + "\n").encode())
            seq += 1
            for _ in range(3):
                os.write(fd, ("\x1b[32m%s\x1b[0m\n" % line_of(args.tag, seq, args.pad)).encode())
                seq += 1
            end += 5  # the lines above carry the next sequence numbers: the count stays `count` plain lines
        if args.torchrun and str(last) in args.traceback_after.split(","):
            ranks.pop()  # the last rank crashes here
            crash_lines += ["Traceback (most recent call last):", '  File "train.py", line 10, in <module>', "    main()",
                            '  File "train.py", line 7, in main', '    raise ValueError("w=1 seq=1 pad=x")',
                            "ValueError: w=1 seq=1 pad=x"]
        elif str(last) in args.traceback_after.split(","):
            os.write(fd, b"Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\n")
            time.sleep(0.2)  # the rest arrives in a later write (and likely a later read pass)
            os.write(fd, b"    main()\n  File \"train.py\", line 7, in main\n    raise ValueError(\"w=1 seq=1 pad=x\")\n"
                         b"ValueError: w=1 seq=1 pad=x\n")
        if args.pause_after and args.pause_after in seqs:
            time.sleep(args.pause)
            t0 += args.pause
    if handler is not None:
        handler.close()
    if fd >= 0:
        os.close(fd)
    if times is not None:
        times.close()
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
