"""The CUDA half of the Bazel build: the installed CUDA toolkit as a repository, and nvcc for the GPU sources.

`bazel build --config=cuda ...` (.bazelrc: --define=tfcompress_cuda=true,
the config_setting //build_defs:cuda) compiles every domain's `gpu_srcs`
(*_gpu.cu.cc) with nvcc into its kernels library, compiles the C++ sources
with -DGOOGLE_CUDA=1 (their `#if GOOGLE_CUDA` GPU kernel registrations) and
links the CUDA runtime (libcudart_static.a), as the pip build does
(tfcompress/ops/_gpu_plan.py: GPU_ARCHS, NVCC_FLAGS, the major-version rule).
A plain `bazel build` builds the CPU kernels only and needs no toolkit.
Bazel 4.2.3 has no CUDA rules offline, so nvcc runs in one genrule per GPU
source and its object joins the library's srcs through if_cuda (a select,
as tensorflow/custom-op's if_cuda).

local_cuda finds the toolkit: $CUDA_HOME, else /usr/local/cuda, else the
folder above the bin/ of the nvcc on PATH; one with bin/nvcc and
include/cuda_runtime.h. It links its include/ and libcudart_static.a into the
repository, whose BUILD has two cc_libraries ("headers", "cudart_static"),
and writes defs.bzl with CUDA, a dict: found, home, nvcc, version (nvcc's
release, e.g. "12.5") and reason (why none was taken). Like the pip build it
takes only a toolkit of TensorFlow's CUDA major version (a library linked
with another CUDA runtime would run beside TensorFlow's in one process),
unless TFCOMPRESS_BAZEL_ANY_CUDA=1 is set when the repository is made
(bazel build --repo_env=TFCOMPRESS_BAZEL_ANY_CUDA=1 ...), which takes any.
With --config=cuda and no toolkit taken, the nvcc genrules fail with the
reason. Nothing is downloaded.
"""

load("@local_tensorflow//:flags.bzl", "TF_CUDA_VERSION", "TF_DEFINES")

# The pip build's nvcc flags (tfcompress/ops/_gpu_plan.py, NVCC_FLAGS) and GPU
# architectures (GPU_ARCHS, machine code for each, PTX of the newest);
# tests/ops/test_bazel.py checks that the two agree.
NVCC_FLAGS = [
    "-x",
    "cu",
    "-std=c++17",
    "-DGOOGLE_CUDA=1",
    "--expt-relaxed-constexpr",
    "--fmad=false",
    "-Xcompiler",
    "-fPIC",
    "-O2",
]
GPU_ARCHS = ["sm_80", "sm_90"]

def _gencode_flags():
    flags = ["-gencode=arch=compute_%s,code=%s" % (arch[3:], arch) for arch in GPU_ARCHS]
    newest = GPU_ARCHS[-1][3:]
    flags.append("-gencode=arch=compute_%s,code=compute_%s" % (newest, newest))
    return flags

def if_cuda(if_true, if_false = []):
    """`if_true` in a build with --config=cuda, `if_false` otherwise (a select)."""
    return select({
        "//build_defs:cuda": if_true,
        "//conditions:default": if_false,
    })

def _shell_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"

def cuda_objects(name, srcs, hdrs, include_root, cuda):
    """One nvcc genrule per GPU source; returns the labels of their objects.

    Args:
      name: a prefix for the genrules' names (the domain).
      srcs: the GPU sources (*_gpu.cu.cc), relative to the package.
      hdrs: the headers they may include (labels or files).
      include_root: the folder their includes are relative to, from the
        execution root ("custom_ops": "bitpack/cc/kernels/bitpack.h").
      cuda: @local_cuda//:defs.bzl's CUDA.

    Returns:
      The objects (".pic.o", position-independent), for if_cuda in a
      cc_library's srcs.
    """
    reason = _unusable_reason(cuda)
    objects = []
    for src in srcs:
        rule = "%s_%s" % (name, src.replace("/", "_").replace(".", "_"))
        out = rule + ".pic.o"
        if reason:
            cmd = "echo %s >&2; exit 1" % _shell_quote(
                "tfcompress: --config=cuda needs a CUDA toolkit for %s: %s" % (src, reason),
            )
        else:
            cmd = " ".join(
                [_shell_quote(cuda["nvcc"])] +
                NVCC_FLAGS + _gencode_flags() +
                ["-D" + define for define in TF_DEFINES] +
                ["-I" + include_root, "-c", "$(location %s)" % src, "-o", "$@"],
            )
        native.genrule(
            name = rule,
            srcs = [src] + hdrs,
            outs = [out],
            cmd = cmd,
            message = "nvcc " + src,
        )
        objects.append(":" + out)
    return objects

def _unusable_reason(cuda):
    """Why the toolkit of `cuda` cannot build the GPU sources ("" when it can)."""
    if not cuda["found"]:
        return cuda["reason"]
    if not TF_CUDA_VERSION:
        return "the installed TensorFlow is not a CUDA build"
    tf_major = TF_CUDA_VERSION.split(".")[0]
    if cuda["version"].split(".")[0] != tf_major and not cuda["any_version"]:
        return ("nvcc %s (%s) is not CUDA %s, which TensorFlow was built with (%s); " +
                "set CUDA_HOME to a CUDA %s toolkit, or build with " +
                "--repo_env=TFCOMPRESS_BAZEL_ANY_CUDA=1 to take it anyway") % (
            cuda["version"],
            cuda["nvcc"],
            tf_major,
            TF_CUDA_VERSION,
            tf_major,
        )
    return ""

def _toolkit_home(ctx):
    """The first folder with bin/nvcc and include/cuda_runtime.h, or None."""
    candidates = []
    if ctx.os.environ.get("CUDA_HOME"):
        candidates.append(ctx.os.environ["CUDA_HOME"])
    candidates.append("/usr/local/cuda")
    nvcc = ctx.which("nvcc")
    if nvcc:
        candidates.append(str(nvcc.realpath.dirname.dirname))
    for home in candidates:
        if ctx.path(home + "/bin/nvcc").exists and ctx.path(home + "/include/cuda_runtime.h").exists:
            return home
    return None

def _nvcc_version(ctx, nvcc):
    """nvcc's CUDA release ("12.5"), or None."""
    result = ctx.execute([nvcc, "--version"])
    if result.return_code != 0:
        return None
    for line in result.stdout.splitlines():
        marker = line.find("release ")
        if marker >= 0:
            return line[marker + len("release "):].split(",")[0].strip()
    return None

_EMPTY_BUILD = """# Made by //build_defs:cuda.bzl: no CUDA toolkit taken ({reason}).
package(default_visibility = ["//visibility:public"])

cc_library(name = "headers")

cc_library(name = "cudart_static")
"""

_TOOLKIT_BUILD = """# Made by //build_defs:cuda.bzl from the CUDA {version} toolkit at {home}.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
)
"""

def _local_cuda_impl(ctx):
    cuda = {
        "found": False,
        "home": "",
        "nvcc": "",
        "version": "",
        "reason": "",
        "any_version": ctx.os.environ.get("TFCOMPRESS_BAZEL_ANY_CUDA", "") == "1",
    }
    home = _toolkit_home(ctx)
    runtime = None
    if home:
        for folder in ["lib64", "lib"]:
            if ctx.path("%s/%s/libcudart_static.a" % (home, folder)).exists:
                runtime = "%s/%s/libcudart_static.a" % (home, folder)
                break
    version = _nvcc_version(ctx, home + "/bin/nvcc") if home else None
    if not home:
        cuda["reason"] = ("no CUDA toolkit (bin/nvcc and include/cuda_runtime.h) in $CUDA_HOME, " +
                          "/usr/local/cuda or beside the nvcc on PATH")
    elif not runtime:
        cuda["reason"] = "no libcudart_static.a in %s/lib64 or %s/lib" % (home, home)
    elif not version:
        cuda["reason"] = "%s/bin/nvcc --version names no CUDA release" % home
    else:
        cuda.update(found = True, home = home, nvcc = home + "/bin/nvcc", version = version)
        ctx.symlink(home + "/include", "include")
        ctx.symlink(runtime, "lib/libcudart_static.a")
    if cuda["found"]:
        ctx.file("BUILD", _TOOLKIT_BUILD.format(version = version, home = home))
    else:
        ctx.file("BUILD", _EMPTY_BUILD.format(reason = cuda["reason"]))
    ctx.file("defs.bzl", "\n".join([
        '"""The CUDA toolkit that //build_defs:cuda.bzl took for --config=cuda."""',
        "",
        "CUDA = %s" % repr(cuda),
        "",
    ]))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_HOME", "PATH", "TFCOMPRESS_BAZEL_ANY_CUDA"],
    local = True,
    doc = "The installed CUDA toolkit's headers, static runtime and nvcc (for --config=cuda).",
)
