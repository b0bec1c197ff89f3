// CUB-based sorting, grouping and selection used by the table kernels. Kept in
// one translation unit because CUB instantiations dominate compile time.
#include <cub/cub.cuh>

#include <algorithm>
#include <stdexcept>

#include "dedup.cuh"

namespace recstore {
namespace cuda {
namespace {

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = static_cast<int32_t>(i);
}

__global__ void iota64_kernel(int64_t* out, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = i;
}

__global__ void permute_kernel(const uint64_t* primary, const int64_t* rows, const int64_t* perm,
                               int64_t n, uint64_t* primary_out, int64_t* rows_out) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    primary_out[i] = primary[perm[i]];
    rows_out[i] = rows[perm[i]];
  }
}

void check_batch(int64_t n) {
  if (n < 0 || n >= (int64_t{1} << 31))
    throw std::invalid_argument("a CUDA batch holds at most 2^31 - 1 keys");
}

}  // namespace

UniqueKeys unique_keys(const int64_t* keys, int64_t n, cudaStream_t stream) {
  check_batch(n);
  UniqueKeys result;
  result.keys = Scratch<int64_t>(static_cast<size_t>(n), stream);
  result.offsets = Scratch<int32_t>(static_cast<size_t>(n) + 1, stream);
  result.order = Scratch<int32_t>(static_cast<size_t>(n), stream);
  if (n == 0) return result;
  const int num = static_cast<int>(n);

  Scratch<int32_t> positions(n, stream);
  Scratch<int64_t> sorted(n, stream);
  Scratch<int32_t> counts(n, stream);
  Scratch<int32_t> num_runs(1, stream);
  iota_kernel<<<grid_for(n), kBlock, 0, stream>>>(positions.get(), n);
  RS_CUDA_LAUNCH_CHECK();

  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted.get(),
                                                positions.get(), result.order.get(), num, 0, 64,
                                                stream));
  RS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, sorted.get(),
                                                   result.keys.get(), counts.get(), num_runs.get(),
                                                   num, stream));
  RS_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, counts.get(),
                                              result.offsets.get() + 1, num, stream));
  size_t temp_bytes = std::max(sort_bytes, std::max(rle_bytes, scan_bytes));
  Scratch<unsigned char> temp(temp_bytes, stream);

  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, keys, sorted.get(),
                                                positions.get(), result.order.get(), num, 0, 64,
                                                stream));
  RS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp.get(), rle_bytes, sorted.get(),
                                                   result.keys.get(), counts.get(), num_runs.get(),
                                                   num, stream));
  result.count = read_scalar(num_runs.get(), stream);
  RS_CUDA_CHECK(cudaMemsetAsync(result.offsets.get(), 0, sizeof(int32_t), stream));
  RS_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.get(), scan_bytes, counts.get(),
                                              result.offsets.get() + 1,
                                              static_cast<int>(result.count), stream));
  return result;
}

int64_t distinct_sorted(const int64_t* keys, int64_t n, int64_t* out, cudaStream_t stream) {
  check_batch(n);
  if (n == 0) return 0;
  const int num = static_cast<int>(n);
  Scratch<int64_t> sorted(n, stream);
  Scratch<int32_t> num_out(1, stream);
  size_t sort_bytes = 0, unique_bytes = 0;
  RS_CUDA_CHECK(
      cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, keys, sorted.get(), num, 0, 64, stream));
  RS_CUDA_CHECK(cub::DeviceSelect::Unique(nullptr, unique_bytes, sorted.get(), out, num_out.get(),
                                          num, stream));
  Scratch<unsigned char> temp(std::max(sort_bytes, unique_bytes), stream);
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.get(), sort_bytes, keys, sorted.get(), num, 0,
                                               64, stream));
  RS_CUDA_CHECK(cub::DeviceSelect::Unique(temp.get(), unique_bytes, sorted.get(), out,
                                          num_out.get(), num, stream));
  return read_scalar(num_out.get(), stream);
}

int64_t select_flagged(const int64_t* keys, const uint8_t* flags, int64_t n, int64_t* out,
                       cudaStream_t stream) {
  if (n == 0) return 0;
  Scratch<int64_t> num_out(1, stream);
  size_t bytes = 0;
  RS_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, bytes, keys, flags, out, num_out.get(), n,
                                           stream));
  Scratch<unsigned char> temp(bytes, stream);
  RS_CUDA_CHECK(cub::DeviceSelect::Flagged(temp.get(), bytes, keys, flags, out, num_out.get(), n,
                                           stream));
  return read_scalar(num_out.get(), stream);
}

void smallest_k(const uint64_t* primary, const uint64_t* secondary, const int64_t* rows,
                int64_t n, int64_t k, int64_t* out, cudaStream_t stream) {
  check_batch(n);
  if (k <= 0 || n == 0) return;
  if (k > n) throw std::logic_error("smallest_k: k exceeds the candidates");
  const int num = static_cast<int>(n);
  // Two stable radix sorts: by the secondary key, then by the primary one.
  Scratch<int64_t> idx(n, stream), by_secondary(n, stream);
  Scratch<uint64_t> secondary_sorted(n, stream), primary_perm(n, stream), primary_sorted(n, stream);
  Scratch<int64_t> rows_perm(n, stream), rows_sorted(n, stream);
  iota_rows(idx.get(), n, stream);
  size_t bytes1 = 0, bytes2 = 0;
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes1, secondary, secondary_sorted.get(),
                                                idx.get(), by_secondary.get(), num, 0, 64,
                                                stream));
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes2, primary_perm.get(),
                                                primary_sorted.get(), rows_perm.get(),
                                                rows_sorted.get(), num, 0, 64, stream));
  Scratch<unsigned char> temp(std::max(bytes1, bytes2), stream);
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), bytes1, secondary,
                                                secondary_sorted.get(), idx.get(),
                                                by_secondary.get(), num, 0, 64, stream));
  permute_kernel<<<grid_for(n), kBlock, 0, stream>>>(primary, rows, by_secondary.get(), n,
                                                     primary_perm.get(), rows_perm.get());
  RS_CUDA_LAUNCH_CHECK();
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), bytes2, primary_perm.get(),
                                                primary_sorted.get(), rows_perm.get(),
                                                rows_sorted.get(), num, 0, 64, stream));
  RS_CUDA_CHECK(cudaMemcpyAsync(out, rows_sorted.get(), sizeof(int64_t) * k,
                                cudaMemcpyDeviceToDevice, stream));
}

void iota_rows(int64_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  iota64_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, n);
  RS_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace recstore
