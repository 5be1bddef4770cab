"""``python -m tfcompress.bench.aggregate --worker ...``: one worker of the benchmark."""

import sys

from tfcompress.bench.aggregate.worker import worker_main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit("run as: tfcompress bench aggregate ...")
