"""The small Keras model that the Keras tests and their worker scripts train.

It takes the Keras module as an argument (tf-keras or Keras 3, imported by the
caller after it has set ``TF_USE_LEGACY_KERAS``) and imports neither Keras nor
tfcompress itself, so worker scripts can import it before choosing.
"""

from typing import Any


def small_conv_net(keras_module: Any, size: int, steps_per_execution: int = 1) -> Any:
    """Conv2D(8, 3, relu) -> Flatten -> Dense(4) logits on ``size x size x 1`` inputs.

    Compiled with SGD(0.05), sparse categorical cross-entropy on the logits
    and accuracy. Call it inside ``strategy.scope()`` for a distributed model.
    """
    model = keras_module.Sequential(
        [
            keras_module.Input((size, size, 1)),
            keras_module.layers.Conv2D(8, 3, activation="relu"),
            keras_module.layers.Flatten(),
            keras_module.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras_module.optimizers.SGD(0.05),
        loss=keras_module.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def small_dense_net(keras_module: Any, features: int, hidden: int, learning_rate: float) -> Any:
    """Dense(hidden, relu) -> Dense(4) logits on ``features`` inputs.

    Compiled with SGD(``learning_rate``) and sparse categorical cross-entropy on
    the logits. Call it inside ``strategy.scope()`` for a distributed model.
    """
    model = keras_module.Sequential(
        [
            keras_module.Input((features,)),
            keras_module.layers.Dense(hidden, activation="relu"),
            keras_module.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras_module.optimizers.SGD(learning_rate),
        loss=keras_module.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model
