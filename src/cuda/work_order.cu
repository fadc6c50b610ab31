// src/cuda/work_order.cu — the attention work order (see work_order.h): one kernel enumerates the
// real rows and gives each its sort key (its CSR row length, then its query block's distance from
// the end), cub's radix sort orders them by descending key.
#include "cuda/work_order.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <limits>

#include "cuda/cuda_check.h"
#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

int bits_for(uint64_t max_value) {
  int bits = 1;
  while (bits < 64 && (max_value >> bits) != 0) ++bits;
  return bits;
}

// The cost of a row: its CSR row length in the plan.
struct PlanRowCost {
  DevicePlanView view;
  __device__ uint64_t operator()(const layout::SequenceBases& b, int64_t h, int64_t r) const {
    const int32_t* row_ptr = view.row_ptr + layout::row_ptr_offset(b, h, view.num_heads);
    return static_cast<uint64_t>(row_ptr[r + 1] - row_ptr[r]);
  }
};
// The cost of a packed-GQA item: the length of its group's union row (the key blocks it loads and
// computes for all `group` heads of its tile).
struct UnionRowCost {
  const int32_t* union_len;
  int32_t group, num_kv_heads;
  __device__ uint64_t operator()(const layout::SequenceBases& b, int64_t h, int64_t r) const {
    return static_cast<uint64_t>(union_len[layout::block_array_offset(b, h / group, num_kv_heads) + r]);
  }
};

// Row j of the batch's grid: sequence s holds rows [H * block_base_s, H * (block_base_s + N_s)), its
// row j' = j - H * block_base_s is head h = j' % H, query block r = N_s - 1 - j' / H. A real row
// (r >= first_row_s) has key ((cost + 1) << from_end_bits) | (max N - 1 - from_end): sorted
// descending (a stable radix sort), the heaviest rows come first, equal costs with the later query
// block first, and equal keys keep the enumeration order (s, then h): together, ascending item
// code, the kernels' own order. A row before first_row (a chunk's rows without queries) has key 0
// and sorts after every real row, past the num_work_items entries the kernels take.
template <class Cost>
__global__ void work_key_kernel(const DevicePlanView view, const Cost cost_of, int64_t num_rows, int from_end_bits,
                                uint64_t* keys, int32_t* codes) {
  const int64_t H = view.num_heads, S = view.num_sequences;
  const uint64_t last_from_end = static_cast<uint64_t>(view.max_num_blocks - 1);
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < num_rows;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // The last sequence whose first row is at or before j (block_base ascends with s).
    int64_t lo = 0, hi = S - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (view.seqs[mid].block_base * H <= j) lo = mid;
      else hi = mid - 1;
    }
    const int64_t s = lo;
    const layout::SequenceBases b = view.seqs[s];
    const int64_t local = j - b.block_base * H;
    const int64_t h = local % H, from_end = local / H;
    const int64_t r = b.num_blocks - 1 - from_end;
    const int64_t code = h + H * (s + S * from_end);
    const uint64_t from_end_key = from_end_bits > 0 ? last_from_end - static_cast<uint64_t>(from_end) : 0u;
    keys[j] = r < b.first_row ? 0u : ((cost_of(b, h, r) + 1u) << from_end_bits) | from_end_key;
    codes[j] = static_cast<int32_t>(code);
  }
}

}  // namespace

int64_t num_padded_items(int64_t num_q_heads, int64_t num_sequences, int64_t max_num_blocks) {
  return num_q_heads * num_sequences * max_num_blocks;
}

bool work_order_supported(int64_t num_rows, int64_t num_padded) {
  return num_rows > 0 && num_padded <= kMaxInt;
}

int64_t sorted_rows(const DevicePlanView& view) { return static_cast<int64_t>(view.num_heads) * view.total_blocks; }

std::size_t work_order_temp_bytes(int64_t num_rows) {
  if (num_rows <= 0 || num_rows > kMaxInt) return 0;
  std::size_t bytes = 0;
  CRISP_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(num_rows)));
  return bytes;
}

namespace {

// Keys of every row of the grid by `cost_of`, then the descending sort into `order` (its first
// num_work_items entries are the real rows).
template <class Cost>
void sort_rows(const DevicePlanView& view, const Cost& cost_of, const WorkOrderScratch& scratch, int32_t* order,
               cudaStream_t stream) {
  const int64_t rows = sorted_rows(view);
  // A row lists at most N key blocks: the key has bits(max N - 1) + bits(max N + 1) significant
  // bits (21 at 128k tokens and B = 128), so the sort is a few 8-bit passes. One sequence
  // enumerates its rows in item-code order (j = code = h + H from_end), which the stable sort keeps
  // among equal costs: the key is the cost alone (11 bits at 128k tokens: two passes, not three).
  const int from_end_bits = view.num_sequences == 1 ? 0 : bits_for(static_cast<uint64_t>(view.max_num_blocks - 1));
  const int key_bits = from_end_bits + bits_for(static_cast<uint64_t>(view.max_num_blocks) + 1u);
  // NOTE: 256 threads x up to 1024 CTAs, grid-stride: the pass is a few hundred thousand rows at most.
  const int threads = 256;
  const int64_t ctas = std::min<int64_t>((rows + threads - 1) / threads, 1024);
  work_key_kernel<<<static_cast<unsigned>(ctas), threads, 0, stream>>>(view, cost_of, rows, from_end_bits,
                                                                       scratch.keys_in, scratch.items_in);
  CRISP_CUDA_CHECK_LAUNCH("work_key_kernel");
  std::size_t temp_bytes = scratch.temp_bytes;
  CRISP_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(scratch.temp, temp_bytes, scratch.keys_in, scratch.keys_out,
                                                             scratch.items_in, order, static_cast<int>(rows), 0,
                                                             key_bits, stream));
}

}  // namespace

void build_work_order(DevicePlanView& view, cudaStream_t stream) {
  if (view.num_work_items <= 0 || view.work_order == nullptr || view.sort_temp == nullptr) {
    view.work_order_ready = false;
    return;
  }
  const WorkOrderScratch scratch{view.sort_keys_in, view.sort_keys_out, view.sort_items_in, view.sort_temp,
                                 view.sort_temp_bytes};
  sort_rows(view, PlanRowCost{view}, scratch, view.work_order, stream);
  view.work_order_ready = true;
}

void build_union_work_order(const DevicePlanView& view, const int32_t* union_len, int group,
                            const WorkOrderScratch& scratch, int32_t* order, cudaStream_t stream) {
  if (view.num_work_items <= 0) return;
  sort_rows(view, UnionRowCost{union_len, group, view.num_heads / group}, scratch, order, stream);
}

}  // namespace cuda_detail
}  // namespace crisp
