// Python bindings of the native store engine (recstore._native).
#include <nanobind/nanobind.h>

#include "version.h"

namespace nb = nanobind;

NB_MODULE(_native, m) {
  m.doc() = "RecStore native store engine";
  m.def("built_with_cuda", &recstore::built_with_cuda,
        "True when the CUDA kernels were compiled into this module");
}
