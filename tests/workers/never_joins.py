"""Worker 0 starts a MultiWorkerMirroredStrategy; worker 1 never joins the cluster."""

import os
import time

if os.environ["TFCOMPRESS_WORKER_INDEX"] == "1":
    time.sleep(3600)
else:
    import tfcompress

    strategy = tfcompress.distribute.MultiWorkerMirroredStrategy(compression="fp16")
    print("strategy created", strategy.num_replicas_in_sync, flush=True)
    strategy.reduce("sum", strategy.run(lambda: 1.0), axis=None)
