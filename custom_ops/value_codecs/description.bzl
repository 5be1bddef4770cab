"""Build description of custom_ops/value_codecs: the Deflate value codec (zlib).

One dict literal, read by Bazel (`load(":description.bzl", "DESCRIPTION")` in
this folder's BUILD) and by the pip build and the packaging
(tfcompress/ops/_description.py evaluates it with ast.literal_eval). Patterns
are relative to this folder; `srcs` leaves out whatever `gpu_srcs` matches.
"""

DESCRIPTION = {
    "srcs": ["cc/ops/*.cc", "cc/kernels/*.cc"],
    # Deflate stays on the CPU: zlib has no device implementation.
    "gpu_srcs": [],
    "hdrs": ["cc/kernels/*.h", "cc/kernels/*.cuh"],
    "copts": [],
    "system_libraries": [
        {
            "name": "zlib",
            "header": "zlib.h",
            "linkopts": ["-lz"],
            "what": "the Deflate value codec (deflate_encode, deflate_decode)",
            "install_hint": "apt-get install zlib1g-dev (Debian/Ubuntu) or dnf install zlib-devel (Fedora)",
        },
    ],
}
