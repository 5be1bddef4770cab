"""Build description of custom_ops/common: the headers every domain includes.

Its `copts` apply to every domain. Read like the domains' descriptions (by
Bazel and by tfcompress/ops/_description.py); it has no sources of its own.
"""

DESCRIPTION = {
    "srcs": [],
    "gpu_srcs": [],
    "hdrs": ["cc/*.h", "cc/*.cuh"],
    # The installed TensorFlow headers trip hundreds of their own deprecation
    # warnings; they say nothing about our code and drown real diagnostics.
    "copts": ["-Wno-deprecated-declarations"],
    "system_libraries": [],
}
