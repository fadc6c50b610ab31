// src/cuda/plan_device.cu — planning on the device: crisp::cuda::plan_async and the backend's
// crisp::detail::cuda_plan (plan_async into a temporary DevicePlan, then to_host).
//
// Launch sequence (on the caller's stream, no host synchronisation, fixed-size launches so the
// whole sequence can be captured in a CUDA graph; step 2's key means run on the workspace's side
// stream, forked from and joined back into the caller's with events, beside step 1):
//   1. proxy pass 1 + combine + pass 2 (plan_proxy.cuh): pv, ps, C_struct (+ v, u);
//   2. block means of K (jsd routing and PE), routing (+ JS distance);
//   3. cumulative / topk token selections (plan_select.cuh) for the VS heads;
//   4. verticals and slashes with anchors and min/max budget clamps;
//   5. PE heads: block means of Q, block-causal softmax P, global coverage (radix select);
//   6. layout: row counts (and membership bits), scan into row_ptr + nnz, columns.
//
// Workspace: plan_async keeps one planning workspace per DevicePlan (one cudaMalloc, made on the
// first call and again only when the shape or the parts the config needs outgrow it; a destroyed
// DevicePlan's workspace is kept as a spare for the next one); call plan_async once before
// capturing it in a graph. cuda_plan uses a workspace of its own, freed on return.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend.h"
#include "crisp/cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/device_plan.h"
#include "cuda/device_plan_internal.h"
#include "cuda/last_use.h"
#include "cuda/setup_copies.h"
#include "cuda/work_order.h"
#include "cuda/plan_common.cuh"
#include "cuda/plan_kernels.cuh"
#include "cuda/plan_proxy.cuh"
#include "cuda/plan_proxy_mma.cuh"
#include "cuda/plan_select.cuh"
#include "cuda/hopper/hopper_attention.h"  // hopper::kernel_available, make_tensor_map
#include "cuda/hopper/tile_shape.h"         // hopper::paged_box_rows
#include "cuda/hopper/plan_proxy_wgmma.cuh"
#include "plan/plan_params.h"
#include "plan/select.h"

namespace crisp {
namespace cuda_detail {
namespace planner {
namespace {

// NOTE: aim for this many proxy work items per SM (two resident 256-thread blocks per SM at
// d = 128, two waves) and at least this many key tiles per item, so the split-K partials stay
// small against the streamed keys.
constexpr int kProxyItemsPerSm = 4;
constexpr int64_t kProxyMinTilesPerItem = 8;
// NOTE: a planner workspace that must grow takes at least 1.5x its old size: a prompt prefilled in
// 2k-token chunks up to 64k then reallocates about 9 times instead of 32.
constexpr double kWorkspaceGrowth = 1.5;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// What a config needs besides the always-present buffers.
struct Needs {
  bool token_level = false;  // cumulative / topk: v, u and selections
  bool key_means = false;    // jsd routing or PE heads possible
  bool pe = false;           // PE heads possible
  bool last_rows = false;    // proxy_last_rows: the last rows' pooled sums
};

Needs needs_of(const PlanParams& p) {
  Needs n;
  if (p.dense) return n;
  n.token_level = select::walks_tokens(p);
  n.pe = p.routing != Routing::none;
  n.key_means = n.pe || select::needs_jsd(p);
  n.last_rows = p.proxy_last_rows > 0;
  return n;
}

bool covers(const Needs& have, const Needs& want) {
  return (have.token_level || !want.token_level) && (have.key_means || !want.key_means) && (have.pe || !want.pe) &&
         (have.last_rows || !want.last_rows);
}

// Host-known shape of one planning call.
struct Shape {
  int64_t H = 0, Hkv = 0, d = 0;
  int B = 128;
  bool tensor_cores = false;  // proxy on plan_proxy_mma.cuh (bf16 / fp16, d 64 / 128 / 256, aligned rows)
  std::vector<layout::SequenceBases> bases;
  std::vector<int8_t> estimated;
  bool operator==(const Shape& o) const {
    if (H != o.H || Hkv != o.Hkv || d != o.d || B != o.B || tensor_cores != o.tensor_cores ||
        estimated != o.estimated || bases.size() != o.bases.size())
      return false;
    for (std::size_t s = 0; s < bases.size(); ++s)
      if (bases[s].n != o.bases[s].n || bases[s].n_q != o.bases[s].n_q ||
          bases[s].token_offset != o.bases[s].token_offset || bases[s].kv_offset != o.bases[s].kv_offset)
        return false;
    return true;
  }
};

// Whether large radix selections list their candidates (plan_select.cuh); set_select_compaction.
std::atomic<bool>& select_compaction_setting() {
  static std::atomic<bool> on{true};
  return on;
}

}  // namespace

// A second stream for planner work that does not need the main stream's latest kernels, so that
// it fills SMs the main stream's kernels leave idle: fork() orders it after everything enqueued on
// `main` so far, join() orders `main` after everything enqueued on it. Both are event waits, which
// a graph capture of `main` follows (the side stream joins the capture and is joined back).
class SideStream {
 public:
  SideStream() = default;
  ~SideStream() {  // no throw from a destructor
    if (fork_ != nullptr) cudaEventDestroy(fork_);
    if (join_ != nullptr) cudaEventDestroy(join_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t fork(cudaStream_t main) {
    if (stream_ == nullptr) {
      CRISP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      CRISP_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
      CRISP_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    }
    CRISP_CUDA_CHECK(cudaEventRecord(fork_, main));
    CRISP_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
    return stream_;
  }
  void join(cudaStream_t main) {
    CRISP_CUDA_CHECK(cudaEventRecord(join_, stream_));
    CRISP_CUDA_CHECK(cudaStreamWaitEvent(main, join_, 0));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

// The planner's temporary device memory for one batch shape (one allocation, reused).
//
// A new shape re-lays the buffers out in the memory it has and allocates only when that is too
// small (growing by kWorkspaceGrowth, so a prompt prefilled in chunks, whose shape grows with every
// chunk, reallocates a few times rather than every chunk). The shape tables go up in the stream's
// order (upload_async) and the histograms are cleared there too, so a new shape costs no host
// synchronisation unless the memory grows (cudaFree and cudaMalloc synchronise). Work of an
// earlier call on another stream is waited for with an event (begin_use / end_use).
class PlanWorkspace {
 public:
  PlanWorkspace() = default;
  ~PlanWorkspace() {  // no throw from a destructor
    if (memory_ != nullptr) cudaFree(memory_);
  }
  PlanWorkspace(const PlanWorkspace&) = delete;
  PlanWorkspace& operator=(const PlanWorkspace&) = delete;

  // Makes `stream` wait for the work of the previous call when that ran on another stream (a
  // stream being captured into a graph neither waits nor records: its work runs at replay).
  void begin_use(cudaStream_t stream) {
    CRISP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture_));
    if (capture_ == cudaStreamCaptureStatusNone) last_use_.wait(stream);
  }
  // Marks the end of this call's work on `stream`.
  void end_use(cudaStream_t stream) {
    if (capture_ == cudaStreamCaptureStatusNone) last_use_.record(stream);
  }

  // Lays the buffers out for `shape` when it differs from the last one or the config needs
  // buffers this layout lacks; returns whether it did (a new shape). Call between begin_use and
  // end_use on the same stream.
  bool ensure(const Shape& shape, const Needs& needs, cudaStream_t stream) {
    if (memory_ != nullptr && shape == shape_ && covers(needs_, needs)) return false;
    shape_ = shape;
    needs_ = needs;
    try {
      build_items();
      lay_out(stream);
    } catch (...) {
      shape_ = Shape{};  // matches no call's shape: the next one lays the buffers out again
      throw;
    }
    return true;
  }

  int device() const { return device_; }          // -1 before the first allocation
  SideStream& side() { return side_; }
  std::size_t capacity() const { return capacity_; }
  const Shape& shape() const { return shape_; }
  const Workspace& ws() const { return ws_; }
  const ProxyWorkItem* items() const { return items_dev_; }
  int64_t num_items() const { return static_cast<int64_t>(items_.size()); }
  const int64_t* item_base() const { return item_base_dev_; }
  const int32_t* splits() const { return splits_dev_; }
  const int8_t* estimated() const { return estimated_dev_; }
  SelectState* states(int which) const { return states_ + which * slots_; }
  unsigned long long* hist_count() const { return hist_count_; }
  uint32_t* candidates() const { return candidates_; }
  // Candidates per slot of a selection over at most max_len entries per slot
  // (select_candidate_capacity, plan_select.cuh); 0 (no compaction) when the setting is off or
  // entry indices would not fit 32 bits. Within the buffer lay_out sized for the largest.
  int64_t candidate_capacity(int64_t max_len) const {
    if (!select_compaction_setting().load() || max_len > static_cast<int64_t>(UINT32_MAX)) return 0;
    return select_candidate_capacity(max_len);
  }
  unsigned long long* hist_mass() const { return hist_mass_; }  // fixed point (plan_select.cuh)
  int64_t slots() const { return slots_; }
  int32_t max_blocks() const { return max_blocks_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t max_causal() const { return max_causal_; }
  std::size_t block_entries() const { return block_entries_; }
  std::size_t token_entries() const { return token_entries_; }
  std::size_t bytes() const { return bytes_; }
  bool any_estimated() const { return !items_.empty(); }
  const float4* records() const { return records_; }
  float4* records() { return records_; }
  float* record_max() { return record_max_; }
  double* bin_sums() { return bin_sums_; }

 private:
  // Room for `bytes`: the memory held when it is large enough, else a larger allocation (the old
  // one freed first: cudaFree waits for the work still reading it).
  void reserve(std::size_t bytes) {
    if (memory_ != nullptr && bytes <= capacity_) return;
    const std::size_t grown = static_cast<std::size_t>(static_cast<double>(capacity_) * kWorkspaceGrowth);
    const std::size_t want = std::max(bytes, grown);
    if (memory_ != nullptr) CRISP_CUDA_CHECK(cudaFree(memory_));
    memory_ = nullptr;
    capacity_ = 0;
    const cudaError_t status = cudaMalloc(&memory_, want);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      memory_ = nullptr;
      throw Error("plan workspace", "cudaMalloc of " + std::to_string(want) + " bytes failed (" +
                                        cudaGetErrorString(status) + ")",
                  "enough free device memory for the planner's workspace");
    }
    capacity_ = want;
    CRISP_CUDA_CHECK(cudaGetDevice(&device_));
  }

  void build_items() {
    int device = 0, sms = 132;
    CRISP_CUDA_CHECK(cudaGetDevice(&device));
    CRISP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const std::size_t S = shape_.bases.size();
    const int64_t group = shape_.H / shape_.Hkv;
    const int64_t rows_per_item = shape_.tensor_cores ? mma_rows(shape_.d) : kProxyTileRows;
    items_.clear();
    item_base_.assign(S, 0);
    splits_.assign(S, 0);
    records_count_ = 0;
    int64_t estimated_tokens = 0;
    for (std::size_t s = 0; s < S; ++s)
      if (shape_.estimated[s]) estimated_tokens += shape_.bases[s].n;
    for (std::size_t s = 0; s < S; ++s) {
      if (!shape_.estimated[s]) continue;
      const layout::SequenceBases& sb = shape_.bases[s];
      // The rows of each head at a stride of R (plan_common.cuh; R = L = B on the tensor-core path).
      const int64_t R = proxy_row_stride(rules::proxy_rows(sb.n_q, shape_.B));
      const int64_t row_tiles = (group * R + rows_per_item - 1) / rows_per_item;
      // Splits of this sequence's keys, in proportion to its share of the tokens.
      const double share = static_cast<double>(sb.n) / static_cast<double>(estimated_tokens);
      int64_t splits = 1;
      int64_t unit = kProxyTileKeys, units = (sb.n + kProxyTileKeys - 1) / kProxyTileKeys;
      if (shape_.tensor_cores) {
        // One CTA per SM (plan_proxy_mma.cuh): one wave of whole-key-block ranges.
        unit = shape_.B;
        units = sb.num_blocks;
        splits = static_cast<int64_t>(share * static_cast<double>(sms) / static_cast<double>(shape_.Hkv * row_tiles));
        splits = std::max<int64_t>(1, std::min(splits, units));
      } else {
        const int64_t target_items = static_cast<int64_t>(sms) * kProxyItemsPerSm;
        splits = static_cast<int64_t>(std::ceil(share * static_cast<double>(target_items) /
                                                static_cast<double>(shape_.Hkv * row_tiles)));
        splits = std::max<int64_t>(1, std::min(splits, units / kProxyMinTilesPerItem));
      }
      splits_[s] = static_cast<int32_t>(splits);
      item_base_[s] = static_cast<int64_t>(items_.size());
      for (int64_t kv = 0; kv < shape_.Hkv; ++kv)
        for (int64_t rt = 0; rt < row_tiles; ++rt) {
          const int64_t rows_here = std::min(rows_per_item, group * R - rt * rows_per_item);
          for (int64_t sp = 0; sp < splits; ++sp) {
            ProxyWorkItem it{};
            it.seq = static_cast<int32_t>(s);
            it.kv = static_cast<int32_t>(kv);
            it.row_tile = static_cast<int32_t>(rt);
            it.split = static_cast<int32_t>(sp);
            it.key_begin = units * sp / splits * unit;
            it.key_end = units * (sp + 1) / splits * unit;
            it.record_base = records_count_;
            it.record_pitch = static_cast<int32_t>(rows_here);
            items_.push_back(it);
          }
          // Records of the fused pass, one per (row of the tile, key block); the two-pass path
          // (token-level rules) uses the first mma_warps(d) of each block's (rows_here >= L >= 64).
          if (shape_.tensor_cores) records_count_ += static_cast<int64_t>(sb.num_blocks) * rows_here;
        }
    }
  }

  void lay_out(cudaStream_t stream) {
    const Shape& sh = shape_;
    const std::size_t S = sh.bases.size();
    slots_ = static_cast<int64_t>(S) * sh.H;
    const auto& last = sh.bases.back();
    block_entries_ = static_cast<std::size_t>(last.block_base + last.num_blocks) * sh.H;
    const std::size_t causal_entries = static_cast<std::size_t>(last.col_base + rules::causal_blocks(last.num_blocks)) * sh.H;
    const std::size_t tokens = static_cast<std::size_t>(last.kv_offset + last.n);  // key positions of the batch
    token_entries_ = tokens * sh.H;
    max_blocks_ = 0;
    max_tokens_ = 0;
    max_causal_ = 0;
    for (const auto& b : sh.bases) {
      max_blocks_ = std::max(max_blocks_, b.num_blocks);
      max_tokens_ = std::max(max_tokens_, b.n);
      max_causal_ = std::max(max_causal_, rules::causal_blocks(b.num_blocks));
    }
    const std::size_t key_block_entries = static_cast<std::size_t>(last.block_base + last.num_blocks) * sh.Hkv;

    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t here = at;
      at += align_up(std::max<std::size_t>(bytes, 1));
      return here;
    };
    const std::size_t o_items = take(std::max<std::size_t>(items_.size(), 1) * sizeof(ProxyWorkItem));
    const std::size_t o_item_base = take(S * sizeof(int64_t));
    const std::size_t o_splits = take(S * sizeof(int32_t));
    const std::size_t o_estimated = take(S * sizeof(int8_t));
    const std::size_t rows_per_item = sh.tensor_cores ? mma_rows(sh.d) : kProxyTileRows;
    const std::size_t o_partial = take(std::max<std::size_t>(items_.size(), 1) * rows_per_item * sizeof(float2));
    const std::size_t o_records = take(static_cast<std::size_t>(records_count_) * sizeof(float4));
    const std::size_t o_record_max = take(static_cast<std::size_t>(records_count_) * sizeof(float));
    const std::size_t o_bin_sums = sh.tensor_cores ? take(block_entries_ * kFusedBinsPitch * sizeof(double)) : 0;
    const std::size_t o_row_max = take(slots_ * sh.B * sizeof(float));
    const std::size_t o_row_inv = take(slots_ * sh.B * sizeof(float));
    const std::size_t o_pv = take(block_entries_ * sizeof(double));
    const std::size_t o_ps = take(block_entries_ * sizeof(double));
    const std::size_t o_cs = take(slots_ * sizeof(double));
    const std::size_t o_v = needs_.token_level ? take(token_entries_ * sizeof(double)) : 0;
    const std::size_t o_u = needs_.token_level ? take(token_entries_ * sizeof(double)) : 0;
    const std::size_t o_pv_last = needs_.last_rows ? take(block_entries_ * sizeof(double)) : 0;
    const std::size_t o_ps_last = needs_.last_rows ? take(block_entries_ * sizeof(double)) : 0;
    const std::size_t o_kmeans = needs_.key_means ? take(key_block_entries * sh.d * sizeof(float)) : 0;
    const std::size_t o_qmeans = needs_.pe ? take(block_entries_ * sh.d * sizeof(float)) : 0;
    const std::size_t o_pe_prob = needs_.pe ? take(causal_entries * sizeof(double)) : 0;
    const std::size_t o_pe_keep = needs_.pe ? take(causal_entries * sizeof(int8_t)) : 0;
    const std::size_t o_topk_v = take(block_entries_ * sizeof(int8_t));
    const std::size_t o_topk_s = take(block_entries_ * sizeof(int8_t));
    const int64_t layout_steps = layout_steps_before(max_blocks_);  // per slot: every row of the longest
    const std::size_t o_layout_bits = take(static_cast<std::size_t>(slots_ * layout_steps) * 32);
    const std::size_t o_states = take(3 * slots_ * sizeof(SelectState));
    const std::size_t o_hist_count = take(slots_ * kSelectBins * sizeof(unsigned long long));
    const std::size_t o_hist_mass = take(slots_ * kSelectBins * sizeof(unsigned long long));
    // Every selection's candidates (token walks over max_tokens_, PE over max_causal_) fit here.
    const int64_t max_select = std::max(needs_.token_level ? max_tokens_ : 0, needs_.pe ? max_causal_ : 0);
    const std::size_t o_candidates =
        take(static_cast<std::size_t>(slots_) * select_candidate_capacity(max_select) * sizeof(uint32_t));
    bytes_ = at;

    reserve(bytes_);
    char* base = static_cast<char*>(memory_);
    items_dev_ = reinterpret_cast<ProxyWorkItem*>(base + o_items);
    item_base_dev_ = reinterpret_cast<int64_t*>(base + o_item_base);
    splits_dev_ = reinterpret_cast<int32_t*>(base + o_splits);
    estimated_dev_ = reinterpret_cast<int8_t*>(base + o_estimated);
    ws_ = Workspace{};
    ws_.partial_stats = reinterpret_cast<float2*>(base + o_partial);
    records_ = reinterpret_cast<float4*>(base + o_records);
    record_max_ = reinterpret_cast<float*>(base + o_record_max);
    bin_sums_ = sh.tensor_cores ? reinterpret_cast<double*>(base + o_bin_sums) : nullptr;
    ws_.row_max = reinterpret_cast<float*>(base + o_row_max);
    ws_.row_inv_den = reinterpret_cast<float*>(base + o_row_inv);
    ws_.pv_sum = reinterpret_cast<double*>(base + o_pv);
    ws_.ps_sum = reinterpret_cast<double*>(base + o_ps);
    ws_.cs_sum = reinterpret_cast<double*>(base + o_cs);
    if (needs_.token_level) {
      ws_.v_sum = reinterpret_cast<double*>(base + o_v);
      ws_.u_sum = reinterpret_cast<double*>(base + o_u);
    }
    if (needs_.last_rows) {
      ws_.pv_last_sum = reinterpret_cast<double*>(base + o_pv_last);
      ws_.ps_last_sum = reinterpret_cast<double*>(base + o_ps_last);
    }
    if (needs_.key_means) ws_.key_means = reinterpret_cast<float*>(base + o_kmeans);
    if (needs_.pe) {
      ws_.query_means = reinterpret_cast<float*>(base + o_qmeans);
      ws_.pe_prob = reinterpret_cast<double*>(base + o_pe_prob);
      ws_.pe_keep = reinterpret_cast<int8_t*>(base + o_pe_keep);
    }
    ws_.topk_vertical = reinterpret_cast<int8_t*>(base + o_topk_v);
    ws_.topk_slash = reinterpret_cast<int8_t*>(base + o_topk_s);
    ws_.layout_bits = reinterpret_cast<uint8_t*>(base + o_layout_bits);
    ws_.layout_steps_per_slot = layout_steps;
    states_ = reinterpret_cast<SelectState*>(base + o_states);
    hist_count_ = reinterpret_cast<unsigned long long*>(base + o_hist_count);
    hist_mass_ = reinterpret_cast<unsigned long long*>(base + o_hist_mass);
    candidates_ = reinterpret_cast<uint32_t*>(base + o_candidates);

    // The shape tables, once per shape, in the stream's order.
    upload_async(items_dev_, items_.data(), items_.size() * sizeof(ProxyWorkItem), stream);
    upload_async(item_base_dev_, item_base_.data(), S * sizeof(int64_t), stream);
    upload_async(splits_dev_, splits_.data(), S * sizeof(int32_t), stream);
    upload_async(estimated_dev_, sh.estimated.data(), S * sizeof(int8_t), stream);
    // The histogram bins start at zero; each scan clears what it used.
    CRISP_CUDA_CHECK(cudaMemsetAsync(hist_count_, 0, slots_ * kSelectBins * sizeof(unsigned long long), stream));
    CRISP_CUDA_CHECK(cudaMemsetAsync(hist_mass_, 0, slots_ * kSelectBins * sizeof(unsigned long long), stream));
  }

  Shape shape_;
  Needs needs_;
  std::vector<ProxyWorkItem> items_;
  std::vector<int64_t> item_base_;
  std::vector<int32_t> splits_;
  void* memory_ = nullptr;
  std::size_t bytes_ = 0;     // in use by the current layout
  std::size_t capacity_ = 0;  // allocated
  int device_ = -1;
  LastUse last_use_;
  SideStream side_;  // created on the first plan, on this workspace's device
  cudaStreamCaptureStatus capture_ = cudaStreamCaptureStatusNone;
  Workspace ws_;
  ProxyWorkItem* items_dev_ = nullptr;
  int64_t* item_base_dev_ = nullptr;
  int32_t* splits_dev_ = nullptr;
  int8_t* estimated_dev_ = nullptr;
  int64_t records_count_ = 0;
  float4* records_ = nullptr;  // records of the tensor-core proxy (fused pass or pass 2)
  float* record_max_ = nullptr;  // their row maxima (fused pass)
  double* bin_sums_ = nullptr;   // [block array][kFusedBinsPitch] finalize scratch (fused pass)
  SelectState* states_ = nullptr;
  unsigned long long* hist_count_ = nullptr;
  unsigned long long* hist_mass_ = nullptr;
  uint32_t* candidates_ = nullptr;  // [slot][candidate_capacity] entry indices (plan_select.cuh)
  int64_t slots_ = 0;
  int32_t max_blocks_ = 0;
  int64_t max_tokens_ = 0, max_causal_ = 0;
  std::size_t block_entries_ = 0, token_entries_ = 0;
};

namespace {

// Optional per-stage timing of plan_async (environment CRISP_PLAN_TIMING=1): CUDA events between
// the stages, one line on stderr per call after a synchronisation of the stream. Off by default
// (it synchronises, so it is not for graph capture); meant for profiling the planner.
class StageTimer {
 public:
  explicit StageTimer(cudaStream_t stream)
      : stream_(stream), enabled_(crisp::detail::plan_timing_requested() == crisp::detail::PlanTiming::stages) {
    mark("start");
  }
  ~StageTimer() {
    for (auto& m : marks_) cudaEventDestroy(m.second);
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  void mark(const char* name) {
    if (!enabled_) return;
    cudaEvent_t e = nullptr;
    CRISP_CUDA_CHECK(cudaEventCreate(&e));
    CRISP_CUDA_CHECK(cudaEventRecord(e, stream_));
    marks_.emplace_back(name, e);
  }
  void report() {
    if (!enabled_ || marks_.size() < 2) return;
    CRISP_CUDA_CHECK(cudaEventSynchronize(marks_.back().second));
    std::string line = "plan stages (ms):";
    float total = 0.f;
    for (std::size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0.f;
      CRISP_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
      total += ms;
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.3f", marks_[i].first, ms);
      line += buf;
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, " | total %.3f\n", total);
    std::fputs((line + buf).c_str(), stderr);
  }

 private:
  cudaStream_t stream_;
  bool enabled_ = false;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
};

// bf16 / fp16: the inputs the tensor-core proxy and the vectorised means kernels take.
template <typename T>
constexpr bool kTwoByte = std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value;

// Calls launch(std::integral_constant<int, V>) with the block-means variant (plan_kernels.cuh):
// V = the head dim for 16-byte loads (the tensor-core proxy's layout), else 0.
template <typename T, typename Launch>
void with_means_variant(const Shape& sh, Launch launch) {
  if constexpr (kTwoByte<T>) {
    if (sh.tensor_cores && sh.d == 256) return launch(std::integral_constant<int, 256>{});
    if (sh.tensor_cores && sh.d == 128) return launch(std::integral_constant<int, 128>{});
    if (sh.tensor_cores) return launch(std::integral_constant<int, 64>{});
  }
  launch(std::integral_constant<int, 0>{});
}

unsigned grid_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

std::size_t max_shared_memory_per_block();  // below
void set_smem(const void* kernel, std::size_t bytes);  // below

// Candidate values select_rest_kernel can stage in shared memory: what the device allows a block
// beyond the kernel's static shared memory (read once), at most `capacity`.
int64_t rest_staged_capacity(int64_t capacity) {
  if (capacity == 0) return 0;
  static const std::size_t static_bytes = [] {
    cudaFuncAttributes attributes{};
    CRISP_CUDA_CHECK(cudaFuncGetAttributes(&attributes, select_rest_kernel));
    return attributes.sharedSizeBytes;
  }();
  const std::size_t optin = max_shared_memory_per_block();
  const std::size_t room = optin > static_bytes ? optin - static_bytes : 0;
  return std::min<int64_t>(capacity, static_cast<int64_t>(room / sizeof(double)));
}

// Runs one radix selection (plan_select.cuh) over `values` for every slot, then marks: every
// entry, or (ties_only: a reader that compares the entries with the stop itself, as the layout
// does for PE) only the ties of a stop that keeps some of them.
template <typename Mark>
void run_select(const PlanWorkspace& pw, const double* values, SelectState* states, int64_t max_len, const Mark* mark,
                cudaStream_t stream, bool ties_only = false) {
  const int slots = static_cast<int>(pw.slots());
  if (max_len <= kSelectChunk) {  // every slot is one chunk: the whole selection in one launch
    if (mark != nullptr)
      select_one_block_kernel<true><<<slots, kSelectThreads, 0, stream>>>(values, states, *mark, ties_only);
    else
      select_one_block_kernel<false><<<slots, kSelectThreads, 0, stream>>>(values, states, Mark{}, false);
    CRISP_CUDA_CHECK_LAUNCH("select_one_block_kernel");
    return;
  }
  const int64_t capacity = pw.candidate_capacity(max_len);
  const dim3 grid(grid_for(std::max<int64_t>(max_len, 1), static_cast<int>(kSelectChunk)), slots);
  const int grid_passes = select_grid_passes(max_len);
  for (int pass = 0; pass < grid_passes; ++pass) {
    const int shift = 64 - kSelectDigitBits * (pass + 1);
    select_histogram_kernel<<<grid, kSelectThreads, 0, stream>>>(values, states, pw.hist_count(), pw.hist_mass(), shift,
                                                                 pw.candidates(), capacity);
    CRISP_CUDA_CHECK_LAUNCH("select_histogram_kernel");
    select_scan_kernel<<<slots, kSelectBins, 0, stream>>>(states, pw.hist_count(), pw.hist_mass(), shift, slots,
                                                          capacity);
    CRISP_CUDA_CHECK_LAUNCH("select_scan_kernel");
  }
  const int64_t staged = rest_staged_capacity(capacity);
  set_smem(reinterpret_cast<const void*>(&select_rest_kernel), staged * sizeof(double));
  select_rest_kernel<<<slots, kSelectRestThreads, staged * sizeof(double), stream>>>(values, states, pw.candidates(),
                                                                                     capacity, staged, grid_passes);
  CRISP_CUDA_CHECK_LAUNCH("select_rest_kernel");
  if (mark != nullptr) {
    if (!ties_only) {
      select_mark_kernel<<<grid, kSelectThreads, 0, stream>>>(values, states, *mark);
      CRISP_CUDA_CHECK_LAUNCH("select_mark_kernel");
    }
    select_mark_ties_kernel<<<slots, 1024, 0, stream>>>(values, states, *mark);
    CRISP_CUDA_CHECK_LAUNCH("select_mark_ties_kernel");
  }
}

template <typename T>
Strided3<T> strided(const TensorView& v) {
  return Strided3<T>{static_cast<const T*>(v.data), v.stride[0], v.stride[1], v.stride[2]};
}

void set_smem(const void* kernel, std::size_t bytes) {
  // Every launch with dynamic shared memory opts in: a kernel's static shared memory counts
  // against the 48 KB default too (vs_flags_kernel's 1 KB beside N x 10 bytes near N = 4900), and
  // the limit depends on the device (227 KB on sm_90, 163 KB on sm_80), checked by the launch.
  if (bytes > 0)
    CRISP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

std::atomic<int>& proxy_mma_kernel_setting() {
  static std::atomic<int> setting{static_cast<int>(ProxyMmaKernel::automatic)};
  return setting;
}

// The fused pass on wgmma (hopper/plan_proxy_wgmma.cuh) where the device runs the binary's sm_90a
// code, unless set_proxy_mma_kernel chose mma.sync. Its shared memory (at most 225 KB, d = 256)
// fits every sm_90 device.
bool wgmma_proxy() {
  return proxy_mma_kernel_setting().load() == static_cast<int>(ProxyMmaKernel::automatic) &&
         hopper::kernel_available();
}

// §1 on tensor cores (plan_proxy_mma.cuh). Pooled rules (noise_floor, and every PE/JSD need): one
// fused pass over K (softmax partials and per-row masses), combine, rows and bins finalize. Token-level
// rules (cumulative, topk need v and u per token): pass 1, combine, pass 2, finalize.
template <typename T, int kDim>
void proxy_on_tensor_cores(const Strided3<T>& qs, const Strided3<T>& ks, const TensorView& k, const ProxyParams& pp,
                           const ProxyMmaRecords& records, const ProxyCombineParams& cp, const ProxyFinalizeParams& fp,
                           const dim3& combine_grid, unsigned items, int slots, int max_blocks, bool token_level,
                           cudaStream_t stream) {
  constexpr std::size_t smem = proxy_mma_smem_bytes<T, kDim>();
  constexpr int kThreads = mma_warps(kDim) * 32;
  if (!token_level) {
    // The wgmma kernel's key tiles come by TMA: int32 coordinates, so at most 2^31 rows of K (a
    // larger paged pool plans on mma.sync).
    if (wgmma_proxy() && k.shape[1] <= std::numeric_limits<int32_t>::max()) {
      constexpr std::size_t wgmma_smem = proxy_wgmma_smem_bytes<kDim>();
      const int box_rows = pp.keys.table != nullptr
                               ? hopper::paged_box_rows(static_cast<int>(pp.keys.page_size), kMmaKeyTile)
                               : kMmaKeyTile;
      const CUtensorMap k_map = hopper::make_tensor_map("k", k.data, k.dtype, kDim, k.shape[0], k.shape[1],
                                                        k.stride[0], k.stride[1], box_rows);
      set_smem(reinterpret_cast<const void*>(&proxy_wgmma_kernel<T, kDim>), wgmma_smem);
      proxy_wgmma_kernel<T, kDim><<<items, kThreads, wgmma_smem, stream>>>(qs, k_map, pp, records);
      CRISP_CUDA_CHECK_LAUNCH("proxy_wgmma_kernel (fused pass)");
    } else {
      set_smem(reinterpret_cast<const void*>(&proxy_mma_kernel<T, kDim, kFusedPass, false>), smem);
      proxy_mma_kernel<T, kDim, kFusedPass, false><<<items, kThreads, smem, stream>>>(qs, ks, pp, records);
      CRISP_CUDA_CHECK_LAUNCH("proxy_mma_kernel (fused pass)");
    }
    proxy_combine_kernel<mma_rows(kDim), true><<<combine_grid, 256, 0, stream>>>(cp);
    CRISP_CUDA_CHECK_LAUNCH("proxy_combine_kernel");
    proxy_mma_rows_kernel<<<dim3(grid_for(max_blocks, kRowsFinalizeWarps), slots), kRowsFinalizeWarps * 32, 0,
                            stream>>>(fp);
    CRISP_CUDA_CHECK_LAUNCH("proxy_mma_rows_kernel");
    proxy_mma_bins_kernel<<<slots, 256, 0, stream>>>(fp);
    CRISP_CUDA_CHECK_LAUNCH("proxy_mma_bins_kernel");
    return;
  }
  set_smem(reinterpret_cast<const void*>(&proxy_mma_kernel<T, kDim, 1, false>), smem);
  proxy_mma_kernel<T, kDim, 1, false><<<items, kThreads, smem, stream>>>(qs, ks, pp, records);
  CRISP_CUDA_CHECK_LAUNCH("proxy_mma_kernel (pass 1)");
  proxy_combine_kernel<mma_rows(kDim), true><<<combine_grid, 256, 0, stream>>>(cp);
  CRISP_CUDA_CHECK_LAUNCH("proxy_combine_kernel");
  set_smem(reinterpret_cast<const void*>(&proxy_mma_kernel<T, kDim, 2, true>), smem);
  proxy_mma_kernel<T, kDim, 2, true><<<items, kThreads, smem, stream>>>(qs, ks, pp, records);
  CRISP_CUDA_CHECK_LAUNCH("proxy_mma_kernel (pass 2)");
  proxy_mma_finalize_kernel<<<slots, 256, 0, stream>>>(fp);
  CRISP_CUDA_CHECK_LAUNCH("proxy_mma_finalize_kernel");
}

// The stages of one planning call (the launch sequence at the top of this file), sharing the
// call's shape, workspace and kernel parameters.
template <typename T>
class PlanStages {
 public:
  PlanStages(const TensorView& q, const TensorView& k, const KeyTable& keys, const PlanParams& params,
             const DevicePlanView& view, PlanWorkspace& pw, double scale, cudaStream_t stream)
      : sh_(pw.shape()), ws_(pw.ws()), pw_(pw), view_(view), qs_(strided<T>(q)), ks_(strided<T>(k)), k_(k),
        needs_(needs_of(params)), slots_(static_cast<int>(pw.slots())), max_n_(pw.max_blocks()), scale_(scale),
        stream_(stream) {
    sp_.view = view;
    sp_.ws = ws_;
    sp_.estimated = pw.estimated();
    sp_.num_kv_heads = static_cast<int32_t>(sh_.Hkv);
    sp_.group = static_cast<int32_t>(sh_.H / sh_.Hkv);
    sp_.head_dim = static_cast<int32_t>(sh_.d);
    sp_.scale = static_cast<float>(scale);
    sp_.keys = keys;
    sp_.plan = params;
    sp_.walk_v = pw.states(0);
    sp_.walk_u = pw.states(1);
    sp_.pe_select = pw.states(2);
  }

  // 1. Proxy map: pv, ps, C_struct (+ v, u for the token walks).
  void proxy_map() {
    ProxyParams pp{};
    pp.seqs = view_.seqs;
    pp.items = pw_.items();
    pp.num_q_heads = static_cast<int32_t>(sh_.H);
    pp.group = sp_.group;
    pp.head_dim = static_cast<int32_t>(sh_.d);
    pp.block = sh_.B;
    pp.last_rows = static_cast<int32_t>(sp_.plan.proxy_last_rows);
    pp.scale = static_cast<float>(scale_);
    pp.w_sink = sp_.plan.w_sink;
    pp.w_local = sp_.plan.w_local;
    pp.keys = sp_.keys;
    pp.ws = ws_;
    ProxyCombineParams cp{};
    cp.seqs = view_.seqs;
    cp.item_base = pw_.item_base();
    cp.splits = pw_.splits();
    cp.num_sequences = static_cast<int32_t>(sh_.bases.size());
    cp.num_q_heads = static_cast<int32_t>(sh_.H);
    cp.num_kv_heads = static_cast<int32_t>(sh_.Hkv);
    cp.group = pp.group;
    cp.block = sh_.B;
    cp.ws = ws_;
    const dim3 combine_grid(grid_for(pp.group * sh_.B, 256), static_cast<unsigned>(sh_.Hkv),
                            static_cast<unsigned>(sh_.bases.size()));
    const unsigned items = static_cast<unsigned>(pw_.num_items());
    if constexpr (kTwoByte<T>) {
      if (sh_.tensor_cores) {
        // pv, ps and C_struct come as plain stores from the finalize kernel, v as plain stores
        // from pass 2; only u is accumulated with atomics.
        if (needs_.token_level)
          CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.u_sum, 0, pw_.token_entries() * sizeof(double), stream_));
        ProxyFinalizeParams fp{};
        fp.seqs = view_.seqs;
        fp.items = pw_.items();
        fp.item_base = pw_.item_base();
        fp.splits = pw_.splits();
        fp.estimated = pw_.estimated();
        fp.records = pw_.records();
        fp.record_max = pw_.record_max();
        fp.bin_sums = pw_.bin_sums();
        fp.num_q_heads = static_cast<int32_t>(sh_.H);
        fp.group = pp.group;
        fp.block = sh_.B;
        fp.rows_per_item = mma_rows(sh_.d);
        fp.last_rows = pp.last_rows;
        fp.ws = ws_;
        const ProxyMmaRecords records{pw_.records(), pw_.record_max()};
        if (sh_.d == 64)
          proxy_on_tensor_cores<T, 64>(qs_, ks_, k_, pp, records, cp, fp, combine_grid, items, slots_, max_n_,
                                        needs_.token_level, stream_);
        else if (sh_.d == 128)
          proxy_on_tensor_cores<T, 128>(qs_, ks_, k_, pp, records, cp, fp, combine_grid, items, slots_, max_n_,
                                         needs_.token_level, stream_);
        else
          proxy_on_tensor_cores<T, 256>(qs_, ks_, k_, pp, records, cp, fp, combine_grid, items, slots_, max_n_,
                                         needs_.token_level, stream_);
        return;
      }
    }
    CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.pv_sum, 0, pw_.block_entries() * sizeof(double), stream_));
    CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.ps_sum, 0, pw_.block_entries() * sizeof(double), stream_));
    CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.cs_sum, 0, slots_ * sizeof(double), stream_));
    if (needs_.token_level) {
      CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.v_sum, 0, pw_.token_entries() * sizeof(double), stream_));
      CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.u_sum, 0, pw_.token_entries() * sizeof(double), stream_));
    }
    if (needs_.last_rows) {
      CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.pv_last_sum, 0, pw_.block_entries() * sizeof(double), stream_));
      CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.ps_last_sum, 0, pw_.block_entries() * sizeof(double), stream_));
    }
    const std::size_t smem = proxy_smem_bytes(static_cast<int>(sh_.d));
    set_smem(reinterpret_cast<const void*>(&proxy_kernel<T, 1, false>), smem);
    proxy_kernel<T, 1, false><<<items, kProxyThreads, smem, stream_>>>(qs_, ks_, pp);
    CRISP_CUDA_CHECK_LAUNCH("proxy_kernel (pass 1)");
    proxy_combine_kernel<kProxyTileRows, false><<<combine_grid, 256, 0, stream_>>>(cp);
    CRISP_CUDA_CHECK_LAUNCH("proxy_combine_kernel");
    if (needs_.token_level) {
      set_smem(reinterpret_cast<const void*>(&proxy_kernel<T, 2, true>), smem);
      proxy_kernel<T, 2, true><<<items, kProxyThreads, smem, stream_>>>(qs_, ks_, pp);
    } else {
      set_smem(reinterpret_cast<const void*>(&proxy_kernel<T, 2, false>), smem);
      proxy_kernel<T, 2, false><<<items, kProxyThreads, smem, stream_>>>(qs_, ks_, pp);
    }
    CRISP_CUDA_CHECK_LAUNCH("proxy_kernel (pass 2)");
  }

  // 2a. Block means of K (jsd routing and PE heads), on `stream`.
  void key_means(cudaStream_t stream) {
    if (!needs_.key_means) return;
    const dim3 grid(max_n_, static_cast<unsigned>(sh_.Hkv), static_cast<unsigned>(sh_.bases.size()));
    with_means_variant<T>(sh_, [&](auto vec_dim) {
      key_means_kernel<T, vec_dim.value><<<grid, means_threads(vec_dim.value), 0, stream>>>(ks_, sp_);
    });
    CRISP_CUDA_CHECK_LAUNCH("key_means_kernel");
  }

  // 2b. Routing (+ JS distance); dense for the slots of unestimated sequences.
  void route() {
    const std::size_t route_smem = (static_cast<std::size_t>(max_n_) + sh_.d) * sizeof(float);
    set_smem(reinterpret_cast<const void*>(&route_kernel<T>), route_smem);
    route_kernel<T><<<slots_, 256, route_smem, stream_>>>(qs_, sp_);
    CRISP_CUDA_CHECK_LAUNCH("route_kernel");
  }

  // 3. The token walks of the VS heads (§3 cumulative / topk), both sides.
  void token_walks() {
    if (!needs_.token_level) return;
    const bool topk = sp_.plan.vs_rule == VsRule::topk;
    if (topk) {
      CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.topk_vertical, 0, pw_.block_entries(), stream_));
      CRISP_CUDA_CHECK(cudaMemsetAsync(ws_.topk_slash, 0, pw_.block_entries(), stream_));
    }
    for (int side = 0; side < 2; ++side) {
      const bool vertical = side == 0;
      SelectState* st = pw_.states(side);
      init_token_select_kernel<<<grid_for(slots_, 128), 128, 0, stream_>>>(st, sp_, vertical, slots_);
      CRISP_CUDA_CHECK_LAUNCH("init_token_select_kernel");
      const double* tokens = vertical ? ws_.v_sum : ws_.u_sum;
      if (topk) {
        const TopkMark mark{vertical ? ws_.topk_vertical : ws_.topk_slash, view_.seqs, static_cast<int32_t>(sh_.H),
                            sh_.B, vertical};
        run_select(pw_, tokens, st, pw_.max_tokens(), &mark, stream_);
      } else {
        run_select<TopkMark>(pw_, tokens, st, pw_.max_tokens(), nullptr, stream_);
      }
    }
  }

  // 4. Verticals and slashes: the per-side pipeline of src/plan/select.h.
  void vs_flags() {
    const std::size_t vs_smem = static_cast<std::size_t>(max_n_) * (sizeof(double) + 2) + 16;
    set_smem(reinterpret_cast<const void*>(&vs_flags_kernel), vs_smem);
    vs_flags_kernel<<<slots_, 1024, vs_smem, stream_>>>(sp_);
    CRISP_CUDA_CHECK_LAUNCH("vs_flags_kernel");
  }

  // 5a. PE heads: block means of Q.
  void query_means() {
    const dim3 grid(max_n_, slots_);
    with_means_variant<T>(sh_, [&](auto vec_dim) {
      query_means_kernel<T, vec_dim.value><<<grid, means_threads(vec_dim.value), 0, stream_>>>(qs_, sp_);
    });
    CRISP_CUDA_CHECK_LAUNCH("query_means_kernel");
  }

  // 5b. PE heads: the block-causal softmax P.
  void pe_prob() {
    const auto pe_tiles = static_cast<unsigned>(layout::triangle_tiles(grid_for(max_n_, kPeTile)));
    pe_logit_kernel<<<dim3(pe_tiles, slots_), kPeThreads, 0, stream_>>>(sp_);
    CRISP_CUDA_CHECK_LAUNCH("pe_logit_kernel");
    pe_softmax_kernel<<<dim3(grid_for(max_n_, kPeSoftmaxWarps), slots_), kPeSoftmaxWarps * 32, 0, stream_>>>(sp_);
    CRISP_CUDA_CHECK_LAUNCH("pe_softmax_kernel");
  }

  // 5c. PE heads: global coverage (select::pe_walk, a radix select: its stop, and the kept ties in
  // pe_keep when only some are, which layout_kernel reads) or the row floor (select::pe_floor_keeps,
  // a parallel mark of pe_keep).
  void pe_select() {
    if (!select::pe_walks(sp_.plan)) {
      pe_floor_kernel<<<dim3(grid_for(max_n_, kPeSoftmaxWarps), slots_), kPeSoftmaxWarps * 32, 0, stream_>>>(sp_);
      CRISP_CUDA_CHECK_LAUNCH("pe_floor_kernel");
      return;
    }
    SelectState* st = pw_.states(2);
    init_pe_select_kernel<<<grid_for(slots_, 128), 128, 0, stream_>>>(st, sp_, slots_);
    CRISP_CUDA_CHECK_LAUNCH("init_pe_select_kernel");
    const PeMark mark{ws_.pe_keep, view_.seqs, static_cast<int32_t>(sh_.H)};
    run_select(pw_, ws_.pe_prob, st, pw_.max_causal(), &mark, stream_, /*ties_only=*/true);  // layout_kernel reads the stop
  }

  // 6. Layout: row counts, scan into row_ptr + nnz, columns.
  void layout() {
    const dim3 layout_grid(grid_for(max_n_, kLayoutWarps), slots_);
    layout_kernel<false><<<layout_grid, kLayoutWarps * 32, 0, stream_>>>(sp_);
    CRISP_CUDA_CHECK_LAUNCH("layout_kernel (count)");
    layout_scan_kernel<<<slots_, 1024, 0, stream_>>>(sp_);
    CRISP_CUDA_CHECK_LAUNCH("layout_scan_kernel");
    layout_kernel<true><<<layout_grid, kLayoutWarps * 32, 0, stream_>>>(sp_);
    CRISP_CUDA_CHECK_LAUNCH("layout_kernel (fill)");
  }

  bool needs_pe() const { return needs_.pe; }

 private:
  const Shape& sh_;
  const Workspace& ws_;
  PlanWorkspace& pw_;
  const DevicePlanView& view_;
  const Strided3<T> qs_, ks_;
  const TensorView k_;  // the wgmma proxy's TMA map of K
  const Needs needs_;
  const int slots_;
  const int max_n_;
  const double scale_;
  const cudaStream_t stream_;
  SlotParams sp_{};
};

template <typename T>
void plan_typed(const TensorView& q, const TensorView& k, const KeyTable& keys, const PlanParams& params,
                const DevicePlanView& view, PlanWorkspace& pw, double scale, cudaStream_t stream) {
  PlanStages<T> stages(q, k, keys, params, view, pw, scale, stream);
  const bool estimate = pw.any_estimated();
  // The key means run on the workspace's side stream beside the proxy pass (memory-bound work on
  // the SMs beyond the proxy's one wave of CTAs, which fill every register of theirs); the
  // "proxy" stage time includes them. The layout of the non-PE slots beside the PE path was
  // measured slower (it took bandwidth from pe_logit and the softmax; bench/RESULTS.md, session 18).
  StageTimer timer(stream);
  if (estimate) {
    const cudaStream_t side = pw.side().fork(stream);  // before the proxy: K only
    stages.proxy_map();                                 // enqueued first, so its CTAs start first
    stages.key_means(side);
    pw.side().join(stream);
    timer.mark("proxy");
  }
  stages.route();
  timer.mark("means+route");
  if (estimate) stages.token_walks();
  timer.mark("token_select");
  stages.vs_flags();
  timer.mark("vs_flags");
  if (estimate && stages.needs_pe()) {
    stages.query_means();
    timer.mark("pe_qmeans");
    stages.pe_prob();
    timer.mark("pe_prob");
    stages.pe_select();
  }
  timer.mark("pe_select");
  stages.layout();
  timer.mark("layout");
  timer.report();
}

// tokens < 0: any token count (the page pool of paged K).
void check_input(const TensorView& v, const char* name, int64_t heads, int64_t tokens, int64_t dim) {
  if (v.device != Device::cuda)
    throw Error(name, std::string("is on ") + to_string(v.device), "a view on Device::cuda");
  if (v.data == nullptr) throw Error(name, "has no data", "a device pointer");
  if (v.rank != 3) throw Error(name, "has rank " + std::to_string(v.rank), "rank 3 [heads, tokens, dim]");
  if (tokens < 0) tokens = v.shape[1];
  if (v.shape[0] != heads || v.shape[1] != tokens || v.shape[2] != dim)
    throw Error(name,
                "has shape [" + std::to_string(v.shape[0]) + ", " + std::to_string(v.shape[1]) + ", " +
                    std::to_string(v.shape[2]) + "]",
                "[" + std::to_string(heads) + ", " + std::to_string(tokens) + ", " + std::to_string(dim) +
                    "] as the DevicePlan was made for");
}

// The planner's view of paged K (null table: contiguous), after the API's checks of the table
// (detail::normalize_batch: page size, pointer, device, pool size, pages per sequence) against the
// DevicePlan's batch shape. Its page ids are device memory: not read here.
KeyTable key_table(const BlockTable& table, const TensorView& q, const TensorView& k, const cuda::DevicePlan& plan) {
  if (table.empty()) {
    detail::check_table_is_set_or_empty(table, "block_table");
    return KeyTable{};
  }
  detail::normalize_batch(Batch(plan.batch().cu_seqlens_q, plan.batch().cu_seqlens_k, table), q, k, nullptr);
  return KeyTable{table.data, table.max_pages_per_sequence, table.page_size};
}

// The most shared memory one block of a kernel may opt into on the current device (227 KB on
// sm_90, 163 KB on sm_80), read once per device.
std::size_t max_shared_memory_per_block() {
  static std::mutex mutex;
  static std::map<int, std::size_t> by_device;
  int device = 0;
  CRISP_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = by_device.find(device);
  if (it != by_device.end()) return it->second;
  int bytes = 0;
  CRISP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return by_device[device] = static_cast<std::size_t>(bytes);
}

// sm_90 allows 232448 bytes per block: every head dim's tensor-core proxy fits there; on sm_80
// (166912) the token-level pass at d 128 and both passes at d 256 do not.
static_assert(proxy_mma_block_smem_bytes(128, false) == 163840 && proxy_mma_block_smem_bytes(128, true) == 176128,
              "the d = 128 tensor-core proxy's shared memory (plan_proxy_mma.cuh)");
static_assert(proxy_mma_block_smem_bytes(256, true) <= 232448, "d = 256's tensor-core proxy must fit sm_90");

// Whether any sequence of the shape is estimated (plans a proxy): the proxy kernels run only then.
bool any_estimated(const Shape& sh) {
  for (const int8_t e : sh.estimated)
    if (e) return true;
  return false;
}

// Can the proxy run on tensor cores (plan_proxy_mma.cuh)? bf16 / fp16, d 64, 128 or 256, rows of
// contiguous elements at 16-byte aligned addresses (cp.async of 16-byte chunks), and L = B proxy
// rows for every estimated sequence (a chunk of n_q < B queries runs the FFMA path, whose row
// tiles take any L), and a block's shared memory within what the device allows.
// At d = 256 the tensor-core kernel holds 256 query rows and two key stages in shared memory,
// 192 KB: within sm_90's 227 KB per CTA, not sm_80's 163 KB, where the FFMA path's 200 KB does not
// fit either: plan_on_device then refuses head_dim with an Error. Other head dims up to 256 plan on
// the FFMA path.
// proxy_last_rows with a token-level rule plans on the FFMA path too: the two-pass tensor-core
// kernel keeps its masses per warp of 32 rows, so it cannot single out the last R rows.
bool tensor_core_proxy(const TensorView& q, const TensorView& k, int64_t d, const Shape& sh, const Needs& needs,
                       std::size_t smem_per_block) {
  if (needs.last_rows && needs.token_level) return false;
  // NOTE: 160-198 KB at d 128 / 256 (plan_proxy_mma.cuh): above what sm_80 (163 KB) or sm_86/89
  // (99 KB) allow per block for some shapes; those plan on the FFMA path, which needs less.
  if (proxy_mma_block_smem_bytes(d, needs.token_level) > smem_per_block) return false;
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) return false;
  if (d != 64 && d != 128 && d != 256) return false;
  for (std::size_t s = 0; s < sh.bases.size(); ++s)
    if (sh.estimated[s] && sh.bases[s].n_q < sh.B) return false;
  for (const TensorView* v : {&q, &k}) {
    if (v->stride[2] != 1 || v->stride[1] % 8 != 0 || v->stride[0] % 8 != 0) return false;
    if (reinterpret_cast<std::uintptr_t>(v->data) % 16 != 0) return false;
  }
  return true;
}

}  // namespace

// The whole device planning of q/k into `plan`, using `pw` as workspace.
void plan_on_device(const TensorView& q, const TensorView& k, const BlockTable& block_table, const Config& given,
                    cuda::DevicePlan& plan, PlanWorkspace& pw, cudaStream_t stream) {
  const Config config = given.for_keys(plan.batch().longest_keys());  // as the DevicePlan was sized
  using Clock = std::chrono::steady_clock;
  const bool host_timing = crisp::detail::plan_timing_requested() == crisp::detail::PlanTiming::host;
  const Clock::time_point t_start = host_timing ? Clock::now() : Clock::time_point{};
  config.validate();
  const DevicePlanView& view = view_of(plan);
  check_input(q, "q", plan.num_q_heads(), plan.total_tokens(), plan.head_dim());
  check_input(k, "k", plan.num_kv_heads(), block_table.empty() ? plan.total_keys() : -1, plan.head_dim());
  const KeyTable keys = key_table(block_table, q, k, plan);
  if (q.dtype != k.dtype)
    throw Error("k", std::string("has dtype ") + to_string(k.dtype) + " but q has " + to_string(q.dtype),
                "q and k of one dtype");
  plan.set_config(config);  // checks the block size
  plan.set_page_size(block_table.empty() ? 0 : block_table.page_size);

  Shape sh;
  sh.H = plan.num_q_heads();
  sh.Hkv = plan.num_kv_heads();
  sh.d = plan.head_dim();
  sh.B = plan.block_size();
  sh.bases = sequence_bases(plan.batch(), sh.B);
  const PlanParams params = plan_params(config);
  sh.estimated.resize(sh.bases.size());
  for (std::size_t s = 0; s < sh.bases.size(); ++s) sh.estimated[s] = select::estimates(params, sh.bases[s].n);
  const Needs needs = needs_of(params);
  const std::size_t smem_per_block = max_shared_memory_per_block();
  sh.tensor_cores = tensor_core_proxy(q, k, sh.d, sh, needs, smem_per_block);
  const std::size_t ffma_smem = proxy_block_smem_bound(static_cast<int>(sh.d));
  if (!sh.tensor_cores && any_estimated(sh) && ffma_smem > smem_per_block)
    throw Error("head_dim",
                "is " + std::to_string(sh.d) + ": planning needs up to " + std::to_string(ffma_smem) +
                    " bytes of shared memory per block (the proxy kernel), this device allows " +
                    std::to_string(smem_per_block),
                "a head dim whose proxy fits the device (sm_90: every supported head dim), or bf16 / f16 inputs "
                "whose tensor-core proxy fits");
  const Clock::time_point t_checked = host_timing ? Clock::now() : Clock::time_point{};
  pw.begin_use(stream);
  // Records the end of this call's work even when a later step throws after launching some.
  struct EndUse {
    PlanWorkspace& pw;
    cudaStream_t stream;
    ~EndUse() {
      try {
        pw.end_use(stream);
      } catch (...) {  // no throw from a destructor; the error stays with the stream
      }
    }
  } end_use{pw, stream};
  const bool new_workspace = pw.ensure(sh, needs, stream);
  const Clock::time_point t_workspace = host_timing ? Clock::now() : Clock::time_point{};
  const double scale = plan.softmax_scale();
  switch (q.dtype) {
    case DType::f32: plan_typed<float>(q, k, keys, params, view, pw, scale, stream); break;
    case DType::f64: plan_typed<double>(q, k, keys, params, view, pw, scale, stream); break;
    case DType::f16: plan_typed<__half>(q, k, keys, params, view, pw, scale, stream); break;
    case DType::bf16: plan_typed<__nv_bfloat16>(q, k, keys, params, view, pw, scale, stream); break;
  }
  const Clock::time_point t_kernels = host_timing ? Clock::now() : Clock::time_point{};
  build_work_order(mutable_view_of(plan), stream);
  if (host_timing) {
    const auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    std::fprintf(stderr, "plan host (ms): checks %.3f workspace %.3f%s kernels %.3f work_order %.3f | total %.3f\n",
                 ms(t_start, t_checked), ms(t_checked, t_workspace), new_workspace ? " (new shape)" : "",
                 ms(t_workspace, t_kernels), ms(t_kernels, Clock::now()), ms(t_start, Clock::now()));
  }
}

}  // namespace planner

void set_proxy_mma_kernel(ProxyMmaKernel kernel) {
  planner::proxy_mma_kernel_setting().store(static_cast<int>(kernel));
}
void set_select_compaction(bool on) { planner::select_compaction_setting().store(on); }
}  // namespace cuda_detail

namespace cuda {

namespace {
// One planning workspace per live DevicePlan, keyed by its view's address; the entry is
// erased when that DevicePlan is destroyed (cuda_detail::release_planner_workspace) and its
// workspace kept as a spare for the next DevicePlan planned on the same device, so that a caller
// who makes a DevicePlan per shape (llama.cpp's hook: one per ubatch) does not allocate and free
// a workspace each time. The maps are never destroyed: a DevicePlan held by a static object (a
// cache of plans in a library, as llama.cpp's CUDA hook keeps) is destroyed at exit after a
// function-local static made later would be, and would then erase from a destroyed map and free
// its workspace a second time.
using cuda_detail::planner::PlanWorkspace;
// NOTE: spares kept per device: one for the DevicePlan that replaces the one destroyed, one more
// for a caller that keeps two shapes in flight (a model whose layers differ in heads).
constexpr std::size_t kSpareWorkspaces = 2;

std::mutex& workspace_mutex() {
  static std::mutex m;  // trivially destructible
  return m;
}
std::map<const void*, std::unique_ptr<PlanWorkspace>>& workspaces() {
  static auto* w = new std::map<const void*, std::unique_ptr<PlanWorkspace>>;
  return *w;
}
std::map<int, std::vector<std::unique_ptr<PlanWorkspace>>>& spare_workspaces() {
  static auto* s = new std::map<int, std::vector<std::unique_ptr<PlanWorkspace>>>;
  return *s;
}

// A spare of `device` (the largest), or a new workspace. Called under workspace_mutex().
std::unique_ptr<PlanWorkspace> take_spare(int device) {
  auto it = spare_workspaces().find(device);
  if (it == spare_workspaces().end() || it->second.empty()) return std::make_unique<PlanWorkspace>();
  auto& spares = it->second;
  auto largest = std::max_element(spares.begin(), spares.end(), [](const auto& a, const auto& b) {
    return a->capacity() < b->capacity();
  });
  std::unique_ptr<PlanWorkspace> taken = std::move(*largest);
  spares.erase(largest);
  return taken;
}
}  // namespace

void plan_async(const TensorView& q, const TensorView& k, const Config& config, DevicePlan& plan, void* stream,
                const BlockTable& block_table) {
  const void* key = cuda_detail::workspace_key(cuda_detail::view_of(plan));  // unique per live DevicePlan
  PlanWorkspace* pw = nullptr;
  {
    int device = 0;
    CRISP_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(workspace_mutex());
    auto& slot = workspaces()[key];
    if (!slot) slot = take_spare(device);
    pw = slot.get();
  }
  cuda_detail::planner::plan_on_device(q, k, block_table, config, plan, *pw, static_cast<cudaStream_t>(stream));
}

void release_cached_workspaces() {
  std::vector<std::unique_ptr<PlanWorkspace>> dying;
  {
    std::lock_guard<std::mutex> lock(workspace_mutex());
    for (auto& [device, spares] : spare_workspaces())
      for (auto& spare : spares) dying.push_back(std::move(spare));
    spare_workspaces().clear();
  }
  // `dying` frees its device memory here, outside the lock (cudaFree waits for the device).
}

}  // namespace cuda

void cuda_detail::release_planner_workspace(const void* key) noexcept {
  if (key == nullptr) return;
  std::unique_ptr<cuda_detail::planner::PlanWorkspace> dying;
  try {
    std::lock_guard<std::mutex> lock(cuda::workspace_mutex());
    auto it = cuda::workspaces().find(key);
    if (it == cuda::workspaces().end()) return;
    dying = std::move(it->second);
    cuda::workspaces().erase(it);
    // Kept for the next DevicePlan of its device: the work still reading it is ordered before the
    // next use by that use's begin_use (same stream, or an event).
    if (dying && dying->device() >= 0) {
      auto& spares = cuda::spare_workspaces()[dying->device()];
      if (spares.size() < cuda::kSpareWorkspaces) spares.push_back(std::move(dying));
    }
  } catch (...) {  // a failed lock or allocation: leave the entry rather than throw from a destructor
    return;
  }
  // `dying`, when not kept, frees its device memory here, outside the lock.
}

namespace detail {

Plan cuda_plan(const TensorView& q, const TensorView& k, const Config& config, const Batch& normalized_batch,
               const Options& options) {
  cuda::DevicePlan plan(q.heads(), k.heads(), q.dim(), normalized_batch, config);
  cuda_detail::planner::PlanWorkspace workspace;
  const cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  cuda_detail::planner::plan_on_device(q, k, normalized_batch.block_table, config, plan, workspace, stream);
  Plan host = plan.to_host(options.stream);
  return host;
}

}  // namespace detail
}  // namespace crisp
