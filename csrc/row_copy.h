// Row copies for the gather paths.
//
// A large gather writes far more output than the caches hold, so ordinary
// stores make the core read every output line before overwriting it (a third
// stream of memory traffic next to the row reads and the writes). Streaming
// (non-temporal) stores skip that read and go straight to memory; a batch
// small enough to stay in cache keeps plain copies, since the caller is about
// to read it.
#pragma once

#include <stdint.h>

#include <cstring>

#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define RECSTORE_STREAM_STORES 1
#else
#define RECSTORE_STREAM_STORES 0
#endif

namespace recstore {

// Output bytes above which a gather streams its stores (well past a core's L2).
constexpr int64_t kStreamOutputBytes = int64_t{4} << 20;

// Whether rows of `row_bytes` written to `out` can be streamed.
inline bool can_stream(const void* out, int64_t row_bytes, int64_t n) {
#if RECSTORE_STREAM_STORES
  return (reinterpret_cast<uintptr_t>(out) & 15) == 0 && (row_bytes & 15) == 0 &&
         n * row_bytes >= kStreamOutputBytes;
#else
  (void)out, (void)row_bytes, (void)n;
  return false;
#endif
}

// Copies one row; `stream` only when can_stream() said so for this output.
inline void copy_row(char* dst, const char* src, int64_t bytes, bool stream) {
#if RECSTORE_STREAM_STORES
  if (stream) {
    for (int64_t off = 0; off < bytes; off += 16) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + off));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + off), v);
    }
    return;
  }
#endif
  std::memcpy(dst, src, static_cast<size_t>(bytes));
}

inline void zero_row(char* dst, int64_t bytes, bool stream) {
#if RECSTORE_STREAM_STORES
  if (stream) {
    const __m128i z = _mm_setzero_si128();
    for (int64_t off = 0; off < bytes; off += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + off), z);
    return;
  }
#endif
  std::memset(dst, 0, static_cast<size_t>(bytes));
}

// Orders a thread's streamed stores before it reports its share done.
inline void stream_fence(bool stream) {
#if RECSTORE_STREAM_STORES
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

inline void prefetch_row(const char* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

}  // namespace recstore
