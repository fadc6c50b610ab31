// src/cuda/work_order.cu — the attention work order (see work_order.h): one kernel computes each
// work item's cost (its CSR row length), cub's radix sort orders the items by descending cost.
#include "cuda/work_order.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <limits>

#include "cuda/cuda_check.h"
#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {

namespace {

// cub sorts with an int item count.
constexpr int64_t kMaxSortItems = std::numeric_limits<int>::max();

// Item i decodes as the attention kernels decode it: h = i % H, s = (i / H) % S,
// r = N_s - 1 - i / (H * S); the cost is the number of key blocks row r lists (0 past the
// sequence's first block).
__global__ void work_cost_kernel(const DevicePlanView view, int64_t num_items, uint32_t* keys, int32_t* items) {
  const int64_t H = view.num_heads, S = view.num_sequences;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < num_items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = i % H, s = (i / H) % S;
    const layout::SequenceBases b = view.seqs[s];
    const int64_t r = b.num_blocks - 1 - i / (H * S);
    uint32_t cost = 0;
    if (r >= 0) {
      const int32_t* row_ptr = view.row_ptr + layout::row_ptr_offset(b, h, H);
      cost = static_cast<uint32_t>(row_ptr[r + 1] - row_ptr[r]);
    }
    keys[i] = cost;
    items[i] = static_cast<int32_t>(i);
  }
}

int bits_for(uint32_t max_value) {
  int bits = 1;
  while (bits < 32 && (max_value >> bits) != 0) ++bits;
  return bits;
}

}  // namespace

int64_t num_work_items(int64_t num_q_heads, int64_t num_sequences, int64_t max_num_blocks) {
  return num_q_heads * num_sequences * max_num_blocks;
}

bool work_order_worthwhile(int64_t num_items, int64_t num_rows) {
  return num_items > 0 && num_items <= kMaxWorkItemsPerRow * num_rows;
}

std::size_t work_order_temp_bytes(int64_t num_items) {
  if (num_items <= 0 || num_items > kMaxSortItems) return 0;
  std::size_t bytes = 0;
  CRISP_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(num_items)));
  return bytes;
}

void build_work_order(DevicePlanView& view, cudaStream_t stream) {
  const int64_t n = view.num_work_items;
  if (n <= 0 || view.work_order == nullptr || view.sort_temp == nullptr) {
    view.work_order_ready = false;
    return;
  }
  // NOTE: 256 threads x up to 1024 CTAs, grid-stride: the pass is a few hundred thousand items at most.
  const int threads = 256;
  const int64_t ctas = std::min<int64_t>((n + threads - 1) / threads, 1024);
  work_cost_kernel<<<static_cast<unsigned>(ctas), threads, 0, stream>>>(view, n, view.sort_keys_in, view.sort_items_in);
  CRISP_CUDA_CHECK_LAUNCH("work_cost_kernel");
  // A row lists at most N key blocks: sorting only those bits makes the sort 1-2 passes.
  std::size_t temp_bytes = view.sort_temp_bytes;
  CRISP_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      view.sort_temp, temp_bytes, view.sort_keys_in, view.sort_keys_out, view.sort_items_in, view.work_order,
      static_cast<int>(n), 0, bits_for(static_cast<uint32_t>(view.max_num_blocks)), stream));
  view.work_order_ready = true;
}

}  // namespace cuda_detail
}  // namespace crisp
