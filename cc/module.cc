// The pybind11 module prism_jax._prism_ops: hands XLA the FFI handlers as PyCapsules.
// registrations() -> {"cpu": {target: capsule}, "CUDA": {...}}; "CUDA" only in CUDA builds.
#include <pybind11/pybind11.h>

#include "cc/handlers.h"

namespace py = pybind11;

PRISM_FOR_EACH_HANDLER(PRISM_DECLARE_CPU)
#ifdef PRISM_WITH_CUDA
PRISM_FOR_EACH_HANDLER(PRISM_DECLARE_CUDA)
#endif

namespace {

template <typename Fn>
py::capsule Encapsulate(Fn* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

py::dict Registrations() {
  py::dict cpu;
#define PRISM_ADD_CPU(name, cpu_fn, cuda_fn) cpu[name] = Encapsulate(cpu_fn);
  PRISM_FOR_EACH_HANDLER(PRISM_ADD_CPU)
#undef PRISM_ADD_CPU
  py::dict out;
  out["cpu"] = cpu;
#ifdef PRISM_WITH_CUDA
  py::dict cuda;
#define PRISM_ADD_CUDA(name, cpu_fn, cuda_fn) cuda[name] = Encapsulate(cuda_fn);
  PRISM_FOR_EACH_HANDLER(PRISM_ADD_CUDA)
#undef PRISM_ADD_CUDA
  out["CUDA"] = cuda;
#endif
  return out;
}

}  // namespace

#ifndef PRISM_CUDA_DEVICE_OPT
#define PRISM_CUDA_DEVICE_OPT 3
#endif

PYBIND11_MODULE(_prism_ops, m) {
  m.doc() = "prism_jax XLA FFI custom calls (CPU, and CUDA when built with nvcc)";
  m.def("registrations", &Registrations,
        "Returns {platform: {target_name: capsule}} for jax.ffi.register_ffi_target.");
#ifdef PRISM_WITH_CUDA
  m.attr("with_cuda") = true;
  // NVVM's level for our kernels (CMake's PRISM_CUDA_DEVICE_OPT): below 3 only CI's compile
  // check, which benchmarks/gpu_suite.sh refuses to run.
  m.attr("cuda_device_opt") = PRISM_CUDA_DEVICE_OPT;
  m.def("int8_gemm_workspace_bytes", &PrismInt8GemmWorkspaceBytes, py::arg("m"), py::arg("k"),
        py::arg("n"), py::arg("f32"),
        "Bytes of workspace prism_int8_gemm's CUDA handler wants for this shape on this device "
        "(0 when no CUDA device is visible).");
#else
  m.attr("with_cuda") = false;
#endif
}
