// Zero-filled, page-backed-on-demand allocations for the large table arrays.
//
// Large blocks are mapped anonymously, so untouched pages cost nothing; when
// `huge` is set they are also advised onto transparent huge pages, which
// removes most TLB misses from random row and index accesses.
//
// The first touch of a page costs a fault that zeroes it. Taken as rows are
// first written, those faults come one at a time wherever the rows fall;
// PageFaulter batches them: the pages under a call's new rows are found
// (one byte per page of bookkeeping) and faulted in over the cores before the
// rows are written, each a populate of the page, so a first pull costs about
// what zeroing the memory it touches costs.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace recstore {

void* alloc_zeroed(size_t bytes, bool huge);
void free_zeroed(void* p, size_t bytes);

// Faults in [p, p + bytes) for writing without changing what it holds.
void prefault(void* p, size_t bytes);

// The pages of one arena that are already faulted in, and faulting in more.
// Not thread-safe: its table's exclusive lock is held around every call.
class PageFaulter {
 public:
  // Granularity of the bookkeeping (the huge-page size the arenas are advised onto).
  static constexpr size_t kPageBytes = size_t{2} << 20;

  PageFaulter() = default;
  // An arena of `bytes` at `base`; arenas below one page are left to ordinary faults.
  PageFaulter(char* base, size_t bytes);

  bool active() const { return base_ != nullptr; }
  // Notes the page under [offset, offset + bytes) of the arena for the next fault_in().
  void want(size_t offset, size_t bytes) {
    size_t first = offset / kPageBytes, last = (offset + bytes - 1) / kPageBytes;
    for (size_t page = first; page <= last; ++page) {
      if (!faulted_[page]) {
        faulted_[page] = 1;
        wanted_.push_back(static_cast<uint32_t>(page));
      }
    }
  }
  // Faults in every page wanted since the last call, over the cores.
  void fault_in();
  // Bytes faulted in so far.
  size_t faulted_bytes() const { return faulted_bytes_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<uint8_t> faulted_;  // per page: already faulted in (or wanted)
  std::vector<uint32_t> wanted_;
  size_t faulted_bytes_ = 0;
};

}  // namespace recstore
