// Python bindings of the CUDA twin (recstore._native.CudaTable, cuda_available,
// cuda_device_count); called from csrc/module.cc when CUDA is built in.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

void bind_cuda(nanobind::module_& m);

// The gpu_cache tier's CUDA twin (recstore._native.CudaCacheTable; cache_bindings.cc).
void bind_cuda_cache(nanobind::module_& m);

// The caller's stream as a cudaStream_t value (GIL held): an int, an object with a
// `cuda_stream` attribute, or None for torch's current stream on `device` (0 without torch).
uintptr_t caller_stream(const nanobind::handle& stream, int device);
