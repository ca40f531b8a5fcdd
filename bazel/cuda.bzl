"""nvcc as plain genrules: Bazel 4 has no CUDA rules and rules_cuda would be a download."""

load("@prism_config//:config.bzl", "NVCC")

# CMakeLists.txt's CUDA flags. -fmad=false: the canonical reduction is multiply-then-add on
# every device (cc/numerics.h). -fvisibility=hidden is what pybind11_add_module gives CMake.
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "-DPRISM_WITH_CUDA",
    "-fmad=false",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-Xcompiler=-fPIC,-fvisibility=hidden",
]

def cuda_objects(name, srcs, hdrs):
    """Compiles each .cu in srcs with nvcc to <name>/<stem>.pic.o; returns those labels.

    The .pic.o suffix tells cc_binary the objects are position independent, so it links them
    into the shared library as they are. hdrs: the project headers the sources include.
    """
    config = Label("@prism_config//:BUILD").workspace_root  # external/prism_config
    includes = [
        "-I.",  # the execution root is the repository root: #include "cc/common.h"
        "-isystem %s/xla_ffi/include" % config,
        "-isystem %s/cutlass/include" % config,
    ]
    objects = []
    for src in srcs:
        stem = src.split("/")[-1].rsplit(".", 1)[0]
        out = "%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s" % (name, stem),
            srcs = [src] + hdrs + [
                "@prism_config//:xla_ffi_headers",
                "@prism_config//:cutlass_headers",
            ],
            outs = [out],
            cmd = " ".join([NVCC] + NVCC_FLAGS + includes + ["-c $(location %s) -o $@" % src]),
            message = "nvcc " + src,
        )
        objects.append(":" + out)
    return objects
