// src/cuda/device_plan.cu — crisp::cuda::DevicePlan: the fixed-capacity device buffers of a batch
// plan (layout in src/plan/plan_layout.h, view in src/cuda/device_plan.h) and their conversion
// to and from the host crisp::Plan.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "common/shape_rules.h"
#include "crisp/cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/device_plan.h"
#include "cuda/device_plan_internal.h"
#include "cuda/setup_copies.h"
#include "cuda/work_order.h"
#include "plan/plan_layout.h"
#include "plan/rules.h"

namespace crisp {
namespace cuda_detail {

Batch normalized_shape(const Batch& batch) {
  const bool prompts = batch.cu_seqlens_k.empty();
  Batch out;
  out.cu_seqlens_q = batch.cu_seqlens_q;
  out.cu_seqlens_k = prompts ? batch.cu_seqlens_q : batch.cu_seqlens_k;
  detail::check_offsets(out.cu_seqlens_q, prompts ? "cu_seqlens" : "batch.cu_seqlens_q");
  if (prompts) return out;
  detail::check_offsets(out.cu_seqlens_k, "batch.cu_seqlens_k");
  detail::check_queries_within_keys(out);
  return out;
}

std::vector<layout::SequenceBases> sequence_bases(const Batch& batch, int block_size) {
  if (!shape_rules::valid_block_size(block_size))
    throw Error("config.block_size", "is " + std::to_string(block_size), shape_rules::kBlockSizeExpected);
  const std::vector<SequencePlan> shapes = detail::sequence_shapes(normalized_shape(batch), block_size, "batch");
  std::vector<layout::SequenceBases> bases;
  bases.reserve(shapes.size());
  int64_t block_base = 0, row_ptr_base = 0, col_base = 0;
  for (const SequencePlan& sp : shapes) {
    // The layout reserves each head the whole grid's causal triangle (below), indexed with int32,
    // chunks and decode steps included.
    constexpr int64_t kMaxDeviceBlocks = shape_rules::kMaxPromptBlocks;
    if (sp.num_blocks > kMaxDeviceBlocks)
      throw Error("batch", "a sequence of " + std::to_string(sp.n_k) + " keys spans " + std::to_string(sp.num_blocks) +
                               " blocks of " + std::to_string(block_size) + " on the device planner",
                  "at most " + std::to_string(kMaxDeviceBlocks) + " blocks a sequence (" +
                      std::to_string(kMaxDeviceBlocks * block_size) + " keys at B = " +
                      std::to_string(block_size) + ")");
    layout::SequenceBases b{};
    b.token_offset = sp.q_offset;
    b.n = sp.n_k;
    b.n_q = sp.n_q;
    b.kv_offset = sp.kv_offset;
    b.first_row = sp.first_row;
    b.num_blocks = sp.num_blocks;
    b.block_base = block_base;
    b.row_ptr_base = row_ptr_base;
    b.col_base = col_base;
    // NOTE: the capacity stays the N(N+1)/2 triangle of the whole prompt's grid per head, rows
    // before first_row included (they stay empty): one layout for prompts and chunks.
    block_base += b.num_blocks;
    row_ptr_base += b.num_blocks + 1;
    col_base += rules::causal_blocks(b.num_blocks);
    bases.push_back(b);
  }
  return bases;
}

namespace {

// NOTE: 256-byte alignment of every buffer, the alignment cudaMalloc guarantees, so each buffer
// starts on a fresh memory transaction whatever the sizes before it.
constexpr std::size_t kBufferAlignment = 256;

std::size_t align_up(std::size_t x) { return (x + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment; }

// Byte offsets of every buffer inside the one allocation.
struct BufferOffsets {
  std::size_t seqs, route, c_struct, jsd, nnz, vertical_flags, slash_flags, row_ptr, col;
  std::size_t work_order, sort_keys_in, sort_keys_out, sort_items_in, sort_temp, sort_temp_bytes;
  int64_t num_work_items;  // real rows (rows >= first_row) of every head
  int64_t total_blocks;    // sum of N
  int32_t max_num_blocks;
  int64_t causal_blocks;  // per head
  std::size_t total;
};

BufferOffsets buffer_offsets(int64_t num_heads, const std::vector<layout::SequenceBases>& bases) {
  const auto& last = bases.back();
  const std::size_t slots = bases.size() * static_cast<std::size_t>(num_heads);
  const std::size_t block_entries = static_cast<std::size_t>(last.block_base + last.num_blocks) * num_heads;
  const std::size_t row_ptr_entries = static_cast<std::size_t>(last.row_ptr_base + last.num_blocks + 1) * num_heads;
  BufferOffsets o{};
  o.causal_blocks = last.col_base + rules::causal_blocks(last.num_blocks);
  const std::size_t col_entries = static_cast<std::size_t>(o.causal_blocks) * num_heads;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align_up(bytes);
    return here;
  };
  o.seqs = take(bases.size() * sizeof(layout::SequenceBases));
  o.route = take(slots * sizeof(int32_t));
  o.c_struct = take(slots * sizeof(float));
  o.jsd = take(slots * sizeof(float));
  o.nnz = take(slots * sizeof(int32_t));
  o.vertical_flags = take(block_entries * sizeof(int8_t));
  o.slash_flags = take(block_entries * sizeof(int8_t));
  o.row_ptr = take(row_ptr_entries * sizeof(int32_t));
  o.col = take(col_entries * sizeof(int32_t));
  // The attention work order and the scratch of the sort that builds it (src/cuda/work_order.h).
  o.max_num_blocks = 0;
  for (const auto& b : bases) o.max_num_blocks = std::max(o.max_num_blocks, b.num_blocks);
  // The sort runs over every (query block, head, sequence) of the grid; the work items are its
  // real rows, those at or after the sequence's first_row.
  int64_t num_rows = 0, real_rows = 0;
  o.total_blocks = 0;
  for (const auto& b : bases) {
    o.total_blocks += b.num_blocks;
    num_rows += static_cast<int64_t>(b.num_blocks) * num_heads;
    real_rows += static_cast<int64_t>(b.num_blocks - b.first_row) * num_heads;
  }
  const int64_t padded = num_padded_items(num_heads, static_cast<int64_t>(bases.size()), o.max_num_blocks);
  o.sort_temp_bytes = work_order_supported(num_rows, padded) ? work_order_temp_bytes(num_rows) : 0;
  o.num_work_items = o.sort_temp_bytes > 0 ? real_rows : 0;
  const std::size_t items = o.sort_temp_bytes > 0 ? static_cast<std::size_t>(num_rows) : 0;
  o.work_order = take(items * sizeof(int32_t));
  o.sort_keys_in = take(items * sizeof(uint64_t));
  o.sort_keys_out = take(items * sizeof(uint64_t));
  o.sort_items_in = take(items * sizeof(int32_t));
  o.sort_temp = take(o.sort_temp_bytes);
  o.total = at;
  return o;
}

double resolve_scale(const Config& config, int64_t head_dim) {
  return shape_rules::resolve_softmax_scale(config.softmax_scale, head_dim);
}

Route route_from_code(int32_t code) {
  switch (code) {
    case rules::kRouteVs: return Route::vs;
    case rules::kRoutePe: return Route::pe;
    case rules::kRouteDense: return Route::dense;
    default:
      throw Error("DevicePlan", "holds route code " + std::to_string(code), "0 (vs), 1 (pe) or 2 (dense)");
  }
}

int32_t code_from_route(Route r) {
  switch (r) {
    case Route::vs: return rules::kRouteVs;
    case Route::pe: return rules::kRoutePe;
    default: return rules::kRouteDense;
  }
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace
}  // namespace cuda_detail

namespace cuda {

using cuda_detail::DevicePlanView;

bool available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return count > 0;
}

struct DevicePlan::Impl {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int block_size = 128;
  Batch batch;  // the normalized shape (both lists filled, no block table)
  Config config;
  double softmax_scale = 0.0;
  int64_t page_size = 0;  // of the paged K/V the last fill was made over (0: contiguous)
  std::vector<layout::SequenceBases> bases;
  cuda_detail::BufferOffsets offsets{};
  void* memory = nullptr;
  bool owns = false;
  DevicePlanView view;

  ~Impl() {  // no throw from a destructor
    cuda_detail::release_planner_workspace(cuda_detail::workspace_key(view));
    if (owns && memory != nullptr) cudaFree(memory);
  }
};

namespace {

void check_shape(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim) {
  if (num_q_heads < 1) throw Error("num_q_heads", "is " + std::to_string(num_q_heads), ">= 1");
  if (num_kv_heads < 1 || num_q_heads % num_kv_heads != 0)
    throw Error("num_kv_heads", "is " + std::to_string(num_kv_heads),
                "a divisor of num_q_heads (" + std::to_string(num_q_heads) + ")");
  if (head_dim < 1 || head_dim > 256) throw Error("head_dim", "is " + std::to_string(head_dim), "1 .. 256");
}

std::unique_ptr<DevicePlan::Impl> make_impl(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                                            const Batch& batch, const Config& given) {
  check_shape(num_q_heads, num_kv_heads, head_dim);
  auto impl = std::make_unique<DevicePlan::Impl>();
  impl->num_q_heads = num_q_heads;
  impl->num_kv_heads = num_kv_heads;
  impl->head_dim = head_dim;
  impl->batch = cuda_detail::normalized_shape(batch);
  const Config config = given.for_keys(impl->batch.longest_keys());  // the short-prompt block size
  impl->block_size = config.block_size;
  impl->config = config;
  impl->softmax_scale = cuda_detail::resolve_scale(config, head_dim);
  impl->bases = cuda_detail::sequence_bases(impl->batch, config.block_size);
  impl->offsets = cuda_detail::buffer_offsets(num_q_heads, impl->bases);
  return impl;
}

// Points the view into `memory` and copies the sequence bases there: synchronously without a
// stream (finish_setup_copies), else in `stream`'s order (upload_async).
void bind(DevicePlan::Impl& impl, void* memory, cudaStream_t stream, bool on_stream) {
  impl.memory = memory;
  char* base = static_cast<char*>(memory);
  const auto& o = impl.offsets;
  DevicePlanView& v = impl.view;
  v.num_sequences = static_cast<int32_t>(impl.bases.size());
  v.num_heads = static_cast<int32_t>(impl.num_q_heads);
  v.block_size = impl.block_size;
  v.max_num_blocks = o.max_num_blocks;
  v.causal_blocks = o.causal_blocks;
  v.total_blocks = o.total_blocks;
  v.key_tokens = 0;
  v.max_keys = 0;
  for (const auto& b : impl.bases) {
    v.key_tokens += b.n;
    v.max_keys = std::max(v.max_keys, b.n);
  }
  v.seqs = reinterpret_cast<const layout::SequenceBases*>(base + o.seqs);
  v.route = reinterpret_cast<int32_t*>(base + o.route);
  v.c_struct = reinterpret_cast<float*>(base + o.c_struct);
  v.jsd = reinterpret_cast<float*>(base + o.jsd);
  v.nnz = reinterpret_cast<int32_t*>(base + o.nnz);
  v.vertical_flags = reinterpret_cast<int8_t*>(base + o.vertical_flags);
  v.slash_flags = reinterpret_cast<int8_t*>(base + o.slash_flags);
  v.row_ptr = reinterpret_cast<int32_t*>(base + o.row_ptr);
  v.col = reinterpret_cast<int32_t*>(base + o.col);
  if (o.sort_temp_bytes > 0) {
    v.work_order = reinterpret_cast<int32_t*>(base + o.work_order);
    v.num_work_items = o.num_work_items;
    v.sort_keys_in = reinterpret_cast<uint64_t*>(base + o.sort_keys_in);
    v.sort_keys_out = reinterpret_cast<uint64_t*>(base + o.sort_keys_out);
    v.sort_items_in = reinterpret_cast<int32_t*>(base + o.sort_items_in);
    v.sort_temp = base + o.sort_temp;
    v.sort_temp_bytes = o.sort_temp_bytes;
  }
  v.work_order_ready = false;
  // The bases are part of the batch shape: copied once, here.
  const std::size_t bytes = impl.bases.size() * sizeof(layout::SequenceBases);
  if (on_stream) {
    cuda_detail::upload_async(base + o.seqs, impl.bases.data(), bytes, stream);
  } else {
    CRISP_CUDA_CHECK(cudaMemcpy(base + o.seqs, impl.bases.data(), bytes, cudaMemcpyHostToDevice));
    cuda_detail::finish_setup_copies();
  }
}

DevicePlan::Impl& need(const std::unique_ptr<DevicePlan::Impl>& impl) {
  if (!impl) throw Error("DevicePlan", "is empty", "a DevicePlan constructed for a batch shape");
  return *impl;
}

// The batch shape of a plan: query and key offsets, checked to be contiguous (the normalized form).
Batch batch_of(const Plan& plan) {
  if (plan.sequences.empty()) throw Error("plan", "has no sequences", "at least one sequence");
  Batch batch({0}, {0});
  for (const auto& s : plan.sequences) {
    if (s.q_offset != batch.cu_seqlens_q.back())
      throw Error("plan", "sequence query offsets are not contiguous", "q_offset == sum of earlier n_q");
    if (s.kv_offset != batch.cu_seqlens_k.back())
      throw Error("plan", "sequence key offsets are not contiguous", "kv_offset == sum of earlier n_k");
    batch.cu_seqlens_q.push_back(s.q_offset + s.n_q);
    batch.cu_seqlens_k.push_back(s.kv_offset + s.n_k);
  }
  return batch;
}

}  // namespace

DevicePlan::DevicePlan() = default;
DevicePlan::~DevicePlan() = default;
DevicePlan::DevicePlan(DevicePlan&&) noexcept = default;
DevicePlan& DevicePlan::operator=(DevicePlan&&) noexcept = default;

DevicePlan::DevicePlan(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                       const Batch& batch, const Config& config)
    : impl_(make_impl(num_q_heads, num_kv_heads, head_dim, batch, config)) {
  void* memory = nullptr;
  const cudaError_t status = cudaMalloc(&memory, impl_->offsets.total);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("DevicePlan", "cudaMalloc of " + std::to_string(impl_->offsets.total) + " bytes failed (" +
                                  cudaGetErrorString(status) + ")",
                "enough free device memory (see DevicePlan::bytes_required), or a caller workspace");
  }
  impl_->owns = true;
  bind(*impl_, memory, nullptr, /*on_stream=*/false);
}

DevicePlan::DevicePlan(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                       const Batch& batch, const Config& config, void* workspace,
                       std::size_t workspace_bytes, void* stream)
    : impl_(make_impl(num_q_heads, num_kv_heads, head_dim, batch, config)) {
  if (workspace == nullptr) throw Error("workspace", "is null", "a device pointer");
  if (reinterpret_cast<std::uintptr_t>(workspace) % cuda_detail::kBufferAlignment != 0)
    throw Error("workspace", "is not 256-byte aligned", "a 256-byte aligned device pointer (as cudaMalloc returns)");
  if (workspace_bytes < impl_->offsets.total)
    throw Error("workspace", "holds " + std::to_string(workspace_bytes) + " bytes",
                "at least " + std::to_string(impl_->offsets.total) + " (DevicePlan::bytes_required)");
  bind(*impl_, workspace, static_cast<cudaStream_t>(stream), /*on_stream=*/stream != nullptr);
}

DevicePlan::DevicePlan(const Plan& plan, void* stream)
    : DevicePlan(plan.num_q_heads, plan.num_kv_heads, plan.head_dim, batch_of(plan), [&] {
        Config c = plan.config;
        c.block_size = plan.block_size;
        return c;
      }()) {
  upload(plan, stream);
}

std::size_t DevicePlan::bytes_required(int64_t num_q_heads, const Batch& batch, int block_size) {
  if (num_q_heads < 1) throw Error("num_q_heads", "is " + std::to_string(num_q_heads), ">= 1");
  return cuda_detail::buffer_offsets(num_q_heads, cuda_detail::sequence_bases(batch, block_size)).total;
}

std::size_t DevicePlan::bytes_required(int64_t num_q_heads, const SeqLens& cu_seqlens, int block_size) {
  return bytes_required(num_q_heads, Batch(cu_seqlens), block_size);
}

void DevicePlan::set_config(const Config& config) {
  Impl& m = need(impl_);
  if (config.block_size != m.block_size)
    throw Error("config.block_size", "is " + std::to_string(config.block_size),
                std::to_string(m.block_size) + ", the block size this DevicePlan was made for");
  m.config = config;
  m.softmax_scale = cuda_detail::resolve_scale(config, m.head_dim);
}

void DevicePlan::set_page_size(int64_t page_size) {
  if (page_size < 0) throw Error("page_size", "is " + std::to_string(page_size), ">= 0 (0: contiguous K/V)");
  need(impl_).page_size = page_size;
}

bool DevicePlan::empty() const { return !impl_; }
int64_t DevicePlan::page_size() const { return need(impl_).page_size; }
int64_t DevicePlan::num_q_heads() const { return need(impl_).num_q_heads; }
int64_t DevicePlan::num_kv_heads() const { return need(impl_).num_kv_heads; }
int64_t DevicePlan::head_dim() const { return need(impl_).head_dim; }
int DevicePlan::block_size() const { return need(impl_).block_size; }
int64_t DevicePlan::num_sequences() const { return static_cast<int64_t>(need(impl_).bases.size()); }
int64_t DevicePlan::total_tokens() const { return need(impl_).batch.cu_seqlens_q.back(); }
int64_t DevicePlan::total_keys() const { return need(impl_).batch.cu_seqlens_k.back(); }
const SeqLens& DevicePlan::cu_seqlens() const { return need(impl_).batch.cu_seqlens_q; }
const Batch& DevicePlan::batch() const { return need(impl_).batch; }
const Config& DevicePlan::config() const { return need(impl_).config; }
double DevicePlan::softmax_scale() const { return need(impl_).softmax_scale; }
std::size_t DevicePlan::bytes() const { return need(impl_).offsets.total; }
bool DevicePlan::owns_memory() const { return need(impl_).owns; }
const void* DevicePlan::raw_view() const { return &need(impl_).view; }

void DevicePlan::upload(const Plan& plan, void* stream_ptr) {
  Impl& m = need(impl_);
  const cudaStream_t stream = cuda_detail::as_stream(stream_ptr);
  const auto mismatch = [&](const std::string& what, int64_t got, int64_t want) {
    throw Error("plan", what + " is " + std::to_string(got),
                std::to_string(want) + ", as the DevicePlan was made for");
  };
  if (plan.num_q_heads != m.num_q_heads) mismatch("num_q_heads", plan.num_q_heads, m.num_q_heads);
  if (plan.num_kv_heads != m.num_kv_heads) mismatch("num_kv_heads", plan.num_kv_heads, m.num_kv_heads);
  if (plan.head_dim != m.head_dim) mismatch("head_dim", plan.head_dim, m.head_dim);
  if (plan.block_size != m.block_size) mismatch("block_size", plan.block_size, m.block_size);
  if (plan.sequences.size() != m.bases.size())
    mismatch("the number of sequences", static_cast<int64_t>(plan.sequences.size()),
             static_cast<int64_t>(m.bases.size()));
  for (std::size_t s = 0; s < m.bases.size(); ++s) {
    const auto& sp = plan.sequences[s];
    const auto& b = m.bases[s];
    if (sp.q_offset != b.token_offset || sp.n_q != b.n_q || sp.kv_offset != b.kv_offset || sp.n_k != b.n ||
        sp.num_blocks != b.num_blocks || sp.first_row != b.first_row ||
        static_cast<int64_t>(sp.heads.size()) != m.num_q_heads)
      throw Error("plan", "sequence " + std::to_string(s) + " does not match the DevicePlan's shape",
                  "q_offset " + std::to_string(b.token_offset) + ", n_q " + std::to_string(b.n_q) + ", kv_offset " +
                      std::to_string(b.kv_offset) + ", n_k " + std::to_string(b.n) + ", " +
                      std::to_string(m.num_q_heads) + " heads");
  }
  plan.check_well_formed();

  const int64_t H = m.num_q_heads;
  const auto& o = m.offsets;
  const std::size_t slots = m.bases.size() * static_cast<std::size_t>(H);
  std::vector<int32_t> route(slots), nnz(slots);
  std::vector<float> c_struct(slots), jsd(slots);
  std::vector<int8_t> vflags(o.slash_flags - o.vertical_flags, 0), sflags(o.row_ptr - o.slash_flags, 0);
  std::vector<int32_t> row_ptr((o.col - o.row_ptr) / sizeof(int32_t), 0);
  std::vector<int32_t> col;  // packed per slot, copied slot by slot
  char* dev = static_cast<char*>(m.memory);

  for (std::size_t s = 0; s < m.bases.size(); ++s) {
    const auto& b = m.bases[s];
    for (int64_t h = 0; h < H; ++h) {
      const HeadPlan& hp = plan.sequences[s].heads[h];
      const int64_t sl = layout::slot(static_cast<int64_t>(s), h, H);
      route[sl] = cuda_detail::code_from_route(hp.route);
      c_struct[sl] = static_cast<float>(hp.c_struct);
      jsd[sl] = static_cast<float>(hp.jsd);
      nnz[sl] = static_cast<int32_t>(hp.col.size());
      // The kernels index K/V with these columns: re-check the bounds that make that
      // memory-safe here, whatever check_well_formed covers.
      const bool rows_ok = hp.row_ptr.size() == static_cast<std::size_t>(b.num_blocks) + 1 && hp.row_ptr[0] == 0 &&
                           hp.row_ptr.back() == static_cast<int32_t>(hp.col.size()) &&
                           static_cast<int64_t>(hp.col.size()) <= rules::causal_blocks(b.num_blocks);
      if (!rows_ok)
        throw Error("plan", "sequence " + std::to_string(s) + ", head " + std::to_string(h) + " has a malformed row_ptr",
                    "N + 1 offsets from 0 to nnz <= N(N+1)/2");
      for (int32_t r = 0; r < b.num_blocks; ++r) {
        if (hp.row_ptr[r + 1] < hp.row_ptr[r])
          throw Error("plan", "row_ptr decreases at row " + std::to_string(r), "non-decreasing offsets");
        for (int32_t e = hp.row_ptr[r]; e < hp.row_ptr[r + 1]; ++e)
          if (hp.col[e] < 0 || hp.col[e] > r)
            throw Error("plan", "row " + std::to_string(r) + " lists key block " + std::to_string(hp.col[e]),
                        "key blocks in [0, row]");
      }
      const int64_t fo = layout::block_array_offset(b, h, H);
      for (int32_t x : hp.vertical) {
        if (x < 0 || x >= b.num_blocks)
          throw Error("plan", "vertical block " + std::to_string(x) + " out of range", "0 .. N-1");
        vflags[fo + x] = 1;
      }
      for (int32_t x : hp.slash) {
        if (x < 0 || x >= b.num_blocks)
          throw Error("plan", "slash block " + std::to_string(x) + " out of range", "0 .. N-1");
        sflags[fo + x] = 1;
      }
      std::memcpy(row_ptr.data() + layout::row_ptr_offset(b, h, H), hp.row_ptr.data(),
                  hp.row_ptr.size() * sizeof(int32_t));
      // Pageable source: cudaMemcpyAsync returns once the data sits in the driver's staging
      // memory, so hp.col may be released afterwards.
      if (!hp.col.empty())
        CRISP_CUDA_CHECK(cudaMemcpyAsync(dev + o.col + layout::col_offset(b, h, H) * sizeof(int32_t),
                                         hp.col.data(), hp.col.size() * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, stream));
    }
  }
  const auto put = [&](std::size_t offset, const void* src, std::size_t bytes) {
    if (bytes) CRISP_CUDA_CHECK(cudaMemcpyAsync(dev + offset, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  put(o.route, route.data(), route.size() * sizeof(int32_t));
  put(o.c_struct, c_struct.data(), c_struct.size() * sizeof(float));
  put(o.jsd, jsd.data(), jsd.size() * sizeof(float));
  put(o.nnz, nnz.data(), nnz.size() * sizeof(int32_t));
  put(o.vertical_flags, vflags.data(), vflags.size());
  put(o.slash_flags, sflags.data(), sflags.size());
  put(o.row_ptr, row_ptr.data(), row_ptr.size() * sizeof(int32_t));
  // The attention work order of the new rows, on the same stream.
  cuda_detail::build_work_order(m.view, stream);
  // Pageable copies may return before the DMA finishes only after staging; synchronising here
  // keeps the contract "host staging released before return" independent of driver details.
  CRISP_CUDA_CHECK(cudaStreamSynchronize(stream));

  Config c = plan.config;
  c.block_size = plan.block_size;
  m.config = c;
  m.softmax_scale = plan.softmax_scale > 0.0 ? plan.softmax_scale : cuda_detail::resolve_scale(c, m.head_dim);
  m.page_size = plan.page_size;
}

Plan DevicePlan::to_host(void* stream_ptr) const {
  const Impl& m = need(impl_);
  const cudaStream_t stream = cuda_detail::as_stream(stream_ptr);
  const int64_t H = m.num_q_heads;
  const auto& o = m.offsets;
  const std::size_t slots = m.bases.size() * static_cast<std::size_t>(H);
  const char* dev = static_cast<const char*>(m.memory);
  std::vector<int32_t> route(slots), nnz(slots);
  std::vector<float> c_struct(slots), jsd(slots);
  std::vector<int8_t> vflags(o.slash_flags - o.vertical_flags), sflags(o.row_ptr - o.slash_flags);
  std::vector<int32_t> row_ptr((o.col - o.row_ptr) / sizeof(int32_t));
  const auto get = [&](void* dst, std::size_t offset, std::size_t bytes) {
    if (bytes) CRISP_CUDA_CHECK(cudaMemcpyAsync(dst, dev + offset, bytes, cudaMemcpyDeviceToHost, stream));
  };
  get(route.data(), o.route, route.size() * sizeof(int32_t));
  get(c_struct.data(), o.c_struct, c_struct.size() * sizeof(float));
  get(jsd.data(), o.jsd, jsd.size() * sizeof(float));
  get(nnz.data(), o.nnz, nnz.size() * sizeof(int32_t));
  get(vflags.data(), o.vertical_flags, vflags.size());
  get(sflags.data(), o.slash_flags, sflags.size());
  get(row_ptr.data(), o.row_ptr, row_ptr.size() * sizeof(int32_t));
  CRISP_CUDA_CHECK(cudaStreamSynchronize(stream));

  Plan plan;
  plan.config = m.config;
  plan.block_size = m.block_size;
  plan.num_q_heads = m.num_q_heads;
  plan.num_kv_heads = m.num_kv_heads;
  plan.head_dim = m.head_dim;
  plan.softmax_scale = m.softmax_scale;
  plan.page_size = m.page_size;
  plan.sequences.resize(m.bases.size());
  for (std::size_t s = 0; s < m.bases.size(); ++s) {
    const auto& b = m.bases[s];
    SequencePlan& sp = plan.sequences[s];
    sp.q_offset = b.token_offset;
    sp.n_q = b.n_q;
    sp.kv_offset = b.kv_offset;
    sp.n_k = b.n;
    sp.num_blocks = b.num_blocks;
    sp.first_row = b.first_row;
    sp.heads.resize(H);
    for (int64_t h = 0; h < H; ++h) {
      HeadPlan& hp = sp.heads[h];
      const int64_t sl = layout::slot(static_cast<int64_t>(s), h, H);
      hp.route = cuda_detail::route_from_code(route[sl]);
      hp.c_struct = c_struct[sl];
      hp.jsd = jsd[sl];
      const int32_t count = nnz[sl];
      if (count < 0 || count > rules::causal_blocks(b.num_blocks))
        throw Error("DevicePlan", "slot " + std::to_string(sl) + " holds nnz " + std::to_string(count),
                    "0 .. N(N+1)/2");
      if (hp.route != Route::dense) {
        const int64_t fo = layout::block_array_offset(b, h, H);
        for (int32_t x = 0; x < b.num_blocks; ++x) {
          if (vflags[fo + x]) hp.vertical.push_back(x);
          if (sflags[fo + x]) hp.slash.push_back(x);
        }
      }
      const int32_t* rp = row_ptr.data() + layout::row_ptr_offset(b, h, H);
      hp.row_ptr.assign(rp, rp + b.num_blocks + 1);
      hp.col.resize(count);
      get(hp.col.data(), o.col + layout::col_offset(b, h, H) * sizeof(int32_t), count * sizeof(int32_t));
      hp.density = rules::density_of_rows(count, b.first_row, b.num_blocks);
    }
  }
  CRISP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return plan;
}

}  // namespace cuda
}  // namespace crisp
