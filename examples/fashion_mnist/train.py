"""Train a small CNN or a wide MLP on Fashion-MNIST with compressed gradient aggregation.

One worker of a multi-worker run; start it with the launcher, for example::

    tfcompress launch -n 2 -- python examples/fashion_mnist/train.py --compression fp16

The program is :mod:`tfcompress.bench.train_worker` (read it there: a
``model.fit`` script whose only tfcompress-specific line is the strategy). It
lives in the package so that ``tfcompress bench train`` runs it from an
installed tfcompress; this file runs it from a checkout, and
``python -m tfcompress.bench.train_worker`` does the same anywhere.
``--help`` lists the options.
"""

import sys

from tfcompress.bench.train_worker import main

if __name__ == "__main__":
    sys.exit(main())
