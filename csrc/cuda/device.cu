// Device discovery that tolerates machines without a GPU or driver: the static
// CUDA runtime reports cudaErrorNoDevice / cudaErrorInsufficientDriver there, and
// the module must still import and answer "no device".
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

}  // namespace cuda
}  // namespace recstore
