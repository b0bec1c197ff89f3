// What the process can see of CUDA devices. Plain C++ so the Python bindings
// need no CUDA headers; implemented in device.cu.
#pragma once

#include <string>

namespace recstore {
namespace cuda {

// Number of usable CUDA devices; 0 when there is no driver, no device, or any
// error from the runtime (never throws, never aborts).
int device_count() noexcept;

// device_count() > 0.
bool available() noexcept;

// "name (sm_XY, N MiB)" of device `index`; throws std::runtime_error on error.
std::string device_name(int index);

// The device a table is placed on: `device`, or the current one when it is -1.
// Throws std::runtime_error without a device, std::invalid_argument for an index
// past the visible ones.
int resolve_device(int device);

}  // namespace cuda
}  // namespace recstore
