"""Mixed precision with dynamic loss scaling, 2 real workers, tf-keras and Keras 3.

tests/workers/mixed_precision_worker.py trains one MLP per compressor under
``mixed_float16`` with an initial loss scale of 2**32: the first steps
overflow float16 on both workers and are skipped while the scale comes down
(the forced-overflow case), and later worker 1 alone feeds one batch that
overflows, so the workers must agree to skip that step as well (Keras 3's
LossScaleOptimizer decides from each worker's own gradients; tfcompress' fix
makes them agree, see tfcompress/distribute/keras3_multiworker.py). No run may
hang; the weights, the compressor state and the test loss end finite and
identical on both workers, and the accuracy stays close to uncompressed mixed
precision after the same steps.

Measured (Keras 3, 150 steps, test accuracy): uncompressed 0.962, QSGD,
EF(TopK 5%) and DIANA(QSGD) 0.960, GradiVeQ 0.942-0.947. GradiVeQ's gap is
its own on this short task, not mixed precision's: in float32
(``--variants gradiveq@float32,none@float32``) GradiVeQ reached 0.952 against
0.965 uncompressed.
"""

import json

import pytest

from tests.multiworker import run_workers

pytestmark = pytest.mark.slow

STEPS = 150
INITIAL_SCALE = 2.0**32
CLOSE = ("qsgd", "ef_topk", "diana_qsgd")


def results(keras: str, variants: list[str], out) -> list[dict]:
    run_workers(
        "mixed_precision_worker.py",
        ["--keras", keras, "--variants", ",".join(variants), "--out", str(out)]
        + ["--steps", str(STEPS), "--initial-scale", str(INITIAL_SCALE)],
        timeout=600,
    )
    return [json.loads((out / f"worker{task}.json").read_text()) for task in range(2)]


@pytest.mark.parametrize("keras", ["tf_keras", "keras3"])
def test_mixed_precision_fit_skips_overflow_steps_consistently_and_converges(keras, tmp_path):
    variants = ["none", *CLOSE, "gradiveq"]
    worker0, worker1 = results(keras, variants, tmp_path)
    for variant in variants:
        run, other = worker0[variant], worker1[variant]
        # Both workers applied the same steps: same weights, bit for bit.
        assert run["weights"] == other["weights"], variant
        assert run["weights_finite"] and run["state_finite"], (variant, run)
        assert run["final_loss"] == run["final_loss"] and run["final_loss"] < 1.0, (variant, run)
        # The forced overflow was skipped, the scale came down and training went on.
        assert run["loss_scale"] < INITIAL_SCALE / 2**10, (variant, run)
        skipped = STEPS - run["iterations"] if keras == "keras3" else None
        if skipped is not None:
            assert 10 <= skipped <= 30, (variant, run)
    exact = worker0["none"]["accuracy"]
    assert exact > 0.9, worker0["none"]
    for variant in CLOSE:
        assert worker0[variant]["accuracy"] >= exact - 0.01, (variant, worker0[variant], exact)
    # GradiVeQ's own gap on this short task (1.3 points in float32, see above).
    assert worker0["gradiveq"]["accuracy"] >= exact - 0.035, (worker0["gradiveq"], exact)
