"""Build description of custom_ops/bitpack: bit packing (PackBits/UnpackBits, PackSigns/UnpackSigns).

One dict literal, read by Bazel (`load(":description.bzl", "DESCRIPTION")` in
this folder's BUILD) and by the pip build and the packaging
(tfcompress/ops/_description.py evaluates it with ast.literal_eval). Patterns
are relative to this folder; `srcs` leaves out whatever `gpu_srcs` matches.
"""

DESCRIPTION = {
    "srcs": ["cc/ops/*.cc", "cc/kernels/*.cc"],
    "gpu_srcs": ["cc/kernels/*_gpu.cu.cc"],
    "hdrs": ["cc/kernels/*.h", "cc/kernels/*.cuh"],
    "copts": [],
    "system_libraries": [],
}
