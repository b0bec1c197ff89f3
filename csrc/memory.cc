// alloc_zeroed / free_zeroed, prefault and PageFaulter (see memory.h).
#include "memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "parallel.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL: touched below
#endif

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

void prefault(void* p, size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(p) + bytes;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
  // A write fault per page that leaves its byte as it is, even if another thread
  // writes the same byte meanwhile (an atomic add of zero).
  for (uintptr_t at = std::max(begin, reinterpret_cast<uintptr_t>(p)); at < end;
       at = (at / page + 1) * page) {
    __atomic_fetch_add(reinterpret_cast<char*>(at), 0, __ATOMIC_RELAXED);
  }
}

PageFaulter::PageFaulter(char* base, size_t bytes) {
  if (bytes < kPageBytes) return;
  base_ = base;
  bytes_ = bytes;
  faulted_.assign((bytes + kPageBytes - 1) / kPageBytes, 0);
}

void PageFaulter::fault_in() {
  if (wanted_.empty()) return;
  // Adjacent pages go in one call; each thread takes whole pages.
  std::sort(wanted_.begin(), wanted_.end());
  parallel_for(static_cast<int64_t>(wanted_.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e;) {
      int64_t j = i + 1;
      while (j < e && wanted_[j] == wanted_[j - 1] + 1) ++j;
      const size_t offset = static_cast<size_t>(wanted_[i]) * kPageBytes;
      const size_t end = std::min(bytes_, static_cast<size_t>(wanted_[j - 1] + 1) * kPageBytes);
      prefault(base_ + offset, end - offset);
      i = j;
    }
  });
  for (uint32_t page : wanted_) {
    faulted_bytes_ += std::min(kPageBytes, bytes_ - static_cast<size_t>(page) * kPageBytes);
  }
  wanted_.clear();
}

}  // namespace recstore
