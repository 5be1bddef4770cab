"""Worker 0 asks for fp16, worker 1 for identity: creating the strategy must fail on both."""

import os

import tfcompress

compression = "fp16" if os.environ["TFCOMPRESS_WORKER_INDEX"] == "0" else "identity"
try:
    tfcompress.distribute.MultiWorkerMirroredStrategy(compression=compression)
except ValueError as error:
    print("MISMATCH:", error, flush=True)
    raise SystemExit(3) from error
print("no error", flush=True)
