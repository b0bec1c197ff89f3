// The out-of-line conversion of a whole payload (transport.h), built with the
// engine's optimisation flags rather than the bindings module's size-first ones.
#include "transport.h"

namespace recstore {

void convert_payload(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t count) {
  convert_parallel(src, src_dtype, dst, dst_dtype, count);
}

}  // namespace recstore
