// alloc_zeroed / free_zeroed (see memory.h).
#include "memory.h"

#include <sys/mman.h>

#include <new>

namespace recstore {

void* alloc_zeroed(size_t bytes, bool huge) {
  if (bytes == 0) bytes = 1;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge && bytes >= (size_t{2} << 20)) madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)huge;
#endif
  return p;
}

void free_zeroed(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, bytes == 0 ? 1 : bytes);
}

}  // namespace recstore
