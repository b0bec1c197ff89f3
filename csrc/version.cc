// Build facts the Python side reports (recstore._native.build_info()).
#include "version.h"

namespace recstore {

bool built_with_cuda() {
#ifdef RECSTORE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace recstore
