"""Workers that ask for different compression settings: creating the strategy must fail on each.

Usage: mismatched_settings.py [--compression NAME --aggregation MODE0,MODE1,...] [--record DIR]

Without options worker 0 asks for fp16, worker 1 for identity. With
``--compression`` every worker asks for that compressor, and worker ``i`` for
aggregation mode ``i`` of ``--aggregation``. A worker that gets the error prints
it and exits 3; with ``--record`` it writes it to DIR/worker<i>.txt and exits 0
instead, so that the run ends only once every worker has met the error (the
launcher stops the others as soon as one worker fails). No error: exit 1.
"""

import argparse
import os
import pathlib

import tfcompress

parser = argparse.ArgumentParser()
parser.add_argument("--compression")
parser.add_argument("--aggregation", default="auto")
parser.add_argument("--record")
args = parser.parse_args()

index = int(os.environ["TFCOMPRESS_WORKER_INDEX"])
if args.compression is None:
    compression = "fp16" if index == 0 else "identity"
else:
    compression = args.compression
modes = args.aggregation.split(",")
aggregation = modes[index % len(modes)]
try:
    tfcompress.distribute.MultiWorkerMirroredStrategy(
        compression=compression, aggregation=aggregation
    )
except ValueError as error:
    print("MISMATCH:", error, flush=True)
    if args.record:
        pathlib.Path(args.record, f"worker{index}.txt").write_text(str(error))
        raise SystemExit(0) from error
    raise SystemExit(3) from error
print("no error", flush=True)
raise SystemExit(1)
