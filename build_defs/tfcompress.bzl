"""Bazel targets made from the op domains' build descriptions (custom_ops/<domain>/description.bzl).

Each domain's BUILD loads its own DESCRIPTION and calls tfcompress_domain; the
top-level BUILD calls tfcompress_library over build_defs/domains.bzl. The same
descriptions drive the pip build (tfcompress/ops/_build.py), so sources, copts
and system libraries are stated once.

GPU sources (a description's gpu_srcs) are compiled with nvcc when the
build runs with --config=cuda (//build_defs:cuda.bzl: if_cuda, the nvcc
genrules, the CUDA toolkit repository); otherwise the libraries hold the CPU
kernels only, as the pip build's do without a CUDA toolkit.
"""

load("//build_defs:cuda.bzl", "cuda_objects", "if_cuda")
load("//custom_ops/common:description.bzl", _COMMON = "DESCRIPTION")
load("@local_cuda//:defs.bzl", "CUDA")
load("@local_tensorflow//:flags.bzl", "TF_COPTS")

# Headers are included from the custom_ops folder ("bitpack/cc/kernels/bitpack.h"),
# as the pip build's -I<custom_ops> does.
_INCLUDE_ROOT = "/custom_ops"

# With --config=cuda: the C++ sources' `#if GOOGLE_CUDA` GPU kernel
# registrations, the CUDA headers they include and the runtime they link.
_CUDA_COPTS = if_cuda(["-DGOOGLE_CUDA=1"])
_CUDA_DEPS = if_cuda(["@local_cuda//:headers", "@local_cuda//:cudart_static"])

def tfcompress_common(name, description):
    """The headers every domain includes (custom_ops/common).

    Makes the cc_library `name` and the filegroup `name`_headers (the same
    headers, as inputs of the nvcc genrules).

    Args:
      name: the cc_library's name.
      description: custom_ops/common's DESCRIPTION.
    """
    native.cc_library(
        name = name,
        hdrs = native.glob(description["hdrs"]),
        strip_include_prefix = _INCLUDE_ROOT,
        deps = ["@local_tensorflow//:tensorflow"],
    )
    native.filegroup(
        name = name + "_headers",
        srcs = native.glob(description["hdrs"]),
    )

def tfcompress_domain(domain, description):
    """The kernels of one domain, as a library to link and as its own loadable op library.

    Makes <domain>_kernels (a cc_library linked whole, so that its op and
    kernel registrations survive the link), lib<domain>_ops.so (a shared
    library for tf.load_op_library) and <domain>_ops (an alias of it). With
    --config=cuda the library also holds the domain's GPU kernels (one nvcc
    genrule per gpu_srcs file).

    Args:
      domain: the folder's name, e.g. "bitpack".
      description: the folder's DESCRIPTION.
    """
    hdrs = native.glob(description["hdrs"])
    gpu_objects = cuda_objects(
        name = domain,
        srcs = native.glob(description["gpu_srcs"]),
        hdrs = hdrs + ["//custom_ops/common:common_headers"],
        include_root = _INCLUDE_ROOT[1:],
        cuda = CUDA,
    )
    native.cc_library(
        name = domain + "_kernels",
        srcs = native.glob(description["srcs"], exclude = description["gpu_srcs"]) +
               if_cuda(gpu_objects),
        hdrs = hdrs,
        strip_include_prefix = _INCLUDE_ROOT,
        copts = TF_COPTS + _COMMON["copts"] + description["copts"] + _CUDA_COPTS,
        linkopts = [opt for library in description["system_libraries"] for opt in library["linkopts"]],
        deps = ["//custom_ops/common", "@local_tensorflow//:tensorflow"] + _CUDA_DEPS,
        alwayslink = True,
    )
    native.cc_binary(
        name = "libtfcompress_%s_ops.so" % domain,
        linkshared = True,
        deps = [":%s_kernels" % domain],
    )
    native.alias(name = domain + "_ops", actual = ":libtfcompress_%s_ops.so" % domain)

def tfcompress_library(name, domains):
    """The op library of every domain, libtfcompress_ops.so (what the pip build makes), and an alias.

    Args:
      name: the alias, e.g. "tfcompress_ops".
      domains: the custom_ops folders to link.
    """
    native.cc_binary(
        name = "libtfcompress_ops.so",
        linkshared = True,
        deps = ["//custom_ops/%s:%s_kernels" % (domain, domain) for domain in domains],
    )
    native.alias(name = name, actual = ":libtfcompress_ops.so")
