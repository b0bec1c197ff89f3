#pragma once

namespace recstore {
bool built_with_cuda();
}  // namespace recstore
