// Device discovery that tolerates machines without a GPU or driver: the static
// CUDA runtime reports cudaErrorNoDevice / cudaErrorInsufficientDriver there, and
// the module must still import and answer "no device".
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "device.h"

namespace recstore {
namespace cuda {

int device_count() noexcept {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the error for the next caller
    return 0;
  }
  return count < 0 ? 0 : count;
}

bool available() noexcept { return device_count() > 0; }

std::string device_name(int index) {
  cudaDeviceProp prop{};
  RS_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
}

int resolve_device(int device) {
  const int count = device_count();
  if (count == 0) throw std::runtime_error("no CUDA device is available");
  if (device < 0) RS_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= count)
    throw std::invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" +
                                std::to_string(count) + " visible)");
  return device;
}

}  // namespace cuda
}  // namespace recstore
