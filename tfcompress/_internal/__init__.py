"""The one place where tfcompress touches TensorFlow's and Keras' private API.

Everything in this package is either a private module (``tensorflow.python``,
``tensorflow.core``, ``keras.src``), a private attribute or hook of a public
TensorFlow/Keras class (``strategy.extended._cross_device_ops``, tf-keras'
``_implements_*_batch_hooks``), or an internal namespace (``tf.__internal__``).
Each use says why tfcompress needs it. The rest of the package calls the small
functions and base classes re-exported here (``from tfcompress import
_internal as internal``), so that a TensorFlow or Keras upgrade breaks in one
package with a clear error: ``tests/test_internal.py`` checks that the names
still exist, and that no module outside this package uses a private
TensorFlow or Keras name.

One module per topic:

* :mod:`~tfcompress._internal.functions`: tf.function checks that automatic
  control dependencies leave unordered, conds compiled when first taken, and
  functions that trace once per input on purpose;
* :mod:`~tfcompress._internal.collectives`: TensorFlow's ``CollectiveAllReduce``
  (the hook tfcompress subclasses), its launchers and collective keys;
* :mod:`~tfcompress._internal.strategies`: a strategy's cross-device ops
  object, its workers, the coordination service;
* :mod:`~tfcompress._internal.checkpoint`: worker-local state variables and
  checkpoint-only trackables;
* :mod:`~tfcompress._internal.keras`: Keras 3 and tf-keras hooks.

This package sits below every subpackage (``ops < codecs < compressors <
distribute < keras < tools``) and imports nothing from the rest of tfcompress.
Keras is imported only by the functions that need it (it is optional for the
layers below ``tfcompress.keras``).
"""

from tfcompress._internal.checkpoint import (
    CheckpointOnlyHolder,
    SerializedCheckpointState,
    in_saved_model_export,
    worker_local_variable,
)
from tfcompress._internal.collectives import (
    CollectiveAllReduce,
    CollectiveAllReduceHook,
    ReduceOp,
    collective_init_args,
    devices_of,
    group_by_size,
    group_size_of,
    is_indexed_slices,
    launcher_all_gather,
    launcher_all_to_all,
    launcher_batch_all_reduce,
    new_collective_keys,
    options_of,
)
from tfcompress._internal.functions import rare_cond, traced_per_input, unordered_check
from tfcompress._internal.keras import (
    TfKerasCallbackHooks,
    keras3_fit_functions,
    keras3_fit_functions_replaced,
    keras3_loss_scale_branches,
    keras3_map_structure,
    keras3_model_strategy,
    keras3_resume_at_epoch,
    keras3_symbolic_build,
    model_strategy,
    replace_keras3_fit_functions,
    scalar_summary_metadata,
    strategy_supports_no_merge_call,
)
from tfcompress._internal.strategies import (
    CHECKED_TF_VERSIONS,
    cross_device_ops_of,
    cross_device_ops_or_none,
    in_multi_worker_mode,
    num_workers,
    replace_cross_device_ops,
    report_error_to_cluster,
)

__all__ = [
    "CHECKED_TF_VERSIONS",
    "CheckpointOnlyHolder",
    "CollectiveAllReduce",
    "CollectiveAllReduceHook",
    "ReduceOp",
    "SerializedCheckpointState",
    "TfKerasCallbackHooks",
    "collective_init_args",
    "cross_device_ops_of",
    "cross_device_ops_or_none",
    "devices_of",
    "group_by_size",
    "group_size_of",
    "in_multi_worker_mode",
    "in_saved_model_export",
    "is_indexed_slices",
    "keras3_fit_functions",
    "keras3_fit_functions_replaced",
    "keras3_loss_scale_branches",
    "keras3_map_structure",
    "keras3_model_strategy",
    "keras3_resume_at_epoch",
    "keras3_symbolic_build",
    "launcher_all_gather",
    "launcher_all_to_all",
    "launcher_batch_all_reduce",
    "model_strategy",
    "new_collective_keys",
    "num_workers",
    "options_of",
    "replace_cross_device_ops",
    "replace_keras3_fit_functions",
    "report_error_to_cluster",
    "scalar_summary_metadata",
    "strategy_supports_no_merge_call",
    "rare_cond",
    "traced_per_input",
    "unordered_check",
    "worker_local_variable",
]
