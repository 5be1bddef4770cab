"""A repository made from the installed TensorFlow wheel: its headers, framework library and flags.

local_tensorflow runs Python (PYTHON_BIN_PATH, else python3 on PATH) to ask
tf.sysconfig where the wheel's headers and libtensorflow_framework are and
which flags custom ops must use, links both folders into the repository and
writes a BUILD with one cc_library, "tensorflow", holding the headers, the
framework library and TensorFlow's -D flags, and flags.bzl with TF_COPTS
(TensorFlow's other compile flags, e.g. --std=c++17), TF_DEFINES (the -D
flags again, for nvcc: //build_defs:cuda.bzl) and TF_CUDA_VERSION (the CUDA
release TensorFlow was built with, e.g. "12.5.1"; "" for a CPU build).
Nothing is downloaded.
"""

_QUERY = """
import json
import tensorflow as tf
print("TFCOMPRESS_TF " + json.dumps({
    "version": tf.__version__,
    "include": tf.sysconfig.get_include(),
    "lib": tf.sysconfig.get_lib(),
    "compile": tf.sysconfig.get_compile_flags(),
    "link": tf.sysconfig.get_link_flags(),
    "cuda": tf.sysconfig.get_build_info().get("cuda_version") or "",
}))
"""

def _local_tensorflow_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH") or ctx.which("python3") or ctx.which("python")
    if not python:
        fail("local_tensorflow: no Python found (set PYTHON_BIN_PATH to the one with TensorFlow)")
    result = ctx.execute([python, "-c", _QUERY], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = [line for line in result.stdout.splitlines() if line.startswith("TFCOMPRESS_TF ")]
    if result.return_code != 0 or not lines:
        fail("local_tensorflow: %s cannot import tensorflow:\n%s" % (python, result.stderr[-4000:]))
    tf = json.decode(lines[-1][len("TFCOMPRESS_TF "):])

    ctx.symlink(tf["include"], "include")
    defines = [flag[2:] for flag in tf["compile"] if flag.startswith("-D")]
    copts = [flag for flag in tf["compile"] if not flag.startswith("-D") and not flag.startswith("-I")]
    libraries = [flag[3:] for flag in tf["link"] if flag.startswith("-l:")]
    if len(libraries) != 1:
        fail("local_tensorflow: expected one -l:<framework library> in %s" % tf["link"])
    framework = libraries[0]
    ctx.symlink(tf["lib"] + "/" + framework, "lib/" + framework)

    ctx.file("flags.bzl", "\n".join([
        '"""TensorFlow %s\'s compile flags other than -I and -D (those travel with @local_tensorflow//:tensorflow), its -D flags for nvcc, its CUDA release."""' % tf["version"],
        "",
        "TF_COPTS = %s" % repr(copts),
        "",
        "TF_DEFINES = %s" % repr(defines),
        "",
        "TF_CUDA_VERSION = %s" % repr(tf["cuda"]),
        "",
    ]))
    ctx.file("BUILD", "\n".join([
        "# Made by //build_defs:tensorflow.bzl from TensorFlow %s at %s." % (tf["version"], tf["lib"]),
        'package(default_visibility = ["//visibility:public"])',
        "",
        "cc_library(",
        '    name = "tensorflow",',
        '    hdrs = glob(["include/**"]),',
        '    includes = ["include"],',
        "    defines = %s," % repr(defines),
        '    srcs = ["lib/%s"],' % framework,
        ")",
        "",
    ]))

local_tensorflow = repository_rule(
    implementation = _local_tensorflow_impl,
    environ = ["PYTHON_BIN_PATH", "PATH"],
    local = True,
    doc = "The installed TensorFlow wheel's headers, framework library and compile flags.",
)
