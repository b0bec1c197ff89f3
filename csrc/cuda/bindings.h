// Python bindings of the CUDA twin (recstore._native.CudaTable, cuda_available,
// cuda_device_count); called from csrc/module.cc when CUDA is built in.
#pragma once

#include <nanobind/nanobind.h>

void bind_cuda(nanobind::module_& m);
