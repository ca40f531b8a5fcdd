
# ---- CUDA (appended only when nvcc was found) ----

# CUTLASS/CuTe headers for the nvcc genrules (//bazel:cuda.bzl), which take plain files.
filegroup(
    name = "cutlass_headers",
    srcs = glob(["cutlass/include/**"]),
)

cc_import(
    name = "cudart_static_archive",
    static_library = "cuda/lib64/libcudart_static.a",
)

# What CMake's CUDA_RUNTIME_LIBRARY=Static links.
cc_library(
    name = "cudart_static",
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    deps = [":cudart_static_archive"],
)
