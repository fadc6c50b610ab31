// integrations/llama.cpp/ggml-crisp-cuda.cu — routes llama.cpp's prompt-processing attention on
// the CUDA backend through crisp's CUDA plan + attend, reading the KV cache in place. Compiled into
// ggml-cuda by crisp.patch (as its own source, with its own include paths, so the rest of
// ggml-cuda compiles as upstream does); the layouts, the mask check and its one synchronisation,
// the memory and the fallbacks are explained in docs/llama_cpp.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.cuh"
#include "crisp/cuda.h"
#include "cuda/device_plan.h"
#include "cuda/last_use.h"
#include "ggml-crisp-cuda-check.h"
#include "ggml-crisp-cuda.h"
#include "ggml-crisp-rules.h"

// Functions are static as well as in an anonymous namespace: nvcc names the namespace, and ggml's
// -Wmissing-declarations would flag them otherwise.
namespace {

using namespace ggml_crisp;

// ---------------------------------------------------------------- the launch queue
// A crisp op enqueues about 40 launches and copies (the planner's kernels, its work-order sort,
// the attention, the conversions) where llama.cpp's flash attention enqueues one. During a prompt
// the host runs ahead of the GPU until CUDA's launch queue is full; with crisp a ubatch's launches
// no longer fit in it, so the host is still launching the last layers when it should be filling
// the next ubatch's KQ mask, and the GPU idles while it does: the 8B-shaped model at 64k lost
// about 4 s of 14 that way (bench/RESULTS.md, session 15). Four times CUDA's default queue (the
// driver's CUDA_SCALE_LAUNCH_QUEUES, which later llama.cpp releases also set for pipeline
// parallelism) holds a ubatch again. Set when this library is loaded, before CUDA initialises;
// a value the user set is kept, and where CUDA was initialised earlier (another library) it has
// no effect.
// NOTE: "4x", the scale llama.cpp chose upstream; the 64k run went from 4.9k to 6.4-6.8k tok/s.
[[maybe_unused]] static const bool g_launch_queues_scaled = [] {
  return setenv("CUDA_SCALE_LAUNCH_QUEUES", "4x", /*overwrite=*/0) == 0;
}();

// ---------------------------------------------------------------- the debug check of every stage
// CRISP_HOOK_SYNC_CHECK=1: the hook synchronises its stream and checks for a CUDA error on entry
// (an earlier op's kernel) and after each of its stages, and aborts naming the stage and the op's
// shape. Without it an illegal access of any asynchronous kernel surfaces at the hook's next
// synchronisation (the mask verdict), far from its cause. Off by default: it costs a
// synchronisation per stage.
static bool sync_check_requested() {
  static const bool requested = [] {
    const char * value = std::getenv("CRISP_HOOK_SYNC_CHECK");
    return value != nullptr && std::strcmp(value, "0") != 0 && value[0] != '\0';
  }();
  return requested;
}

// CRISP_HOOK_TIMING=1: the hook synchronises its stream at each stage and adds the host time since
// the previous stage to that stage's total; the totals (calls, ms, µs per call) go to stderr at
// exit. It measures where the hook's fixed cost per op goes (bench/RESULTS.md, session 10: crisp's
// attention did not fall with density on the small models); the synchronisations serialise the
// stages, so the sum is an upper bound of the hook's time, and llama-bench figures taken with it on
// are not speed figures. Off by default. The first call of a stage is printed apart from the median
// of the later ones: it pays one-time costs (CUDA's lazy loading of a kernel at its first launch,
// 7 ms for the planner's first call in session 14), which would otherwise dominate a mean over the
// few calls of a short run.
// CRISP_HOOK_TIMING=host: the same stages without the synchronisations, each the host's own time
// (a stage that blocks — a synchronisation, cudaFree, a synchronous copy — shows how long the host
// waited there); for where the host's time goes in a run that keeps its asynchrony.
// CRISP_HOOK_TIMING=gpu (the first device and stream the hook runs on only): the same stages on
// the GPU's clock, without synchronisations: a CUDA event
// recorded on the stream at each mark, the time between consecutive events read back once they
// have completed (polled at each mark, without waiting, and at a mask verdict's synchronisation;
// a noted mask has none), so the marks of the last ops before exit are left out. A stage's time is what
// the GPU spent between the two points of the stream, its idle time waiting for the host
// included; the time from one op's last mark to the next op's entry (llama.cpp's other nodes of
// the layer, and whatever idles between) is its own stage.
enum class HookTiming { off, synchronised, host, gpu };
static HookTiming timing_mode() {
  static const HookTiming mode = [] {
    const char * value = std::getenv("CRISP_HOOK_TIMING");
    if (value == nullptr || value[0] == '\0' || std::strcmp(value, "0") == 0) return HookTiming::off;
    if (std::strcmp(value, "host") == 0) return HookTiming::host;
    return std::strcmp(value, "gpu") == 0 ? HookTiming::gpu : HookTiming::synchronised;
  }();
  return mode;
}
static const char * timing_mode_name() {
  switch (timing_mode()) {
    case HookTiming::host: return "host time of each stage, no synchronisation added";
    case HookTiming::gpu: return "GPU time between the stages' marks, no synchronisation added";
    default: return "stream synchronised at every stage";
  }
}

struct StageTimes {
  struct Total {
    std::vector<double> each;  // seconds of every call, in order
  };
  std::mutex mutex;
  std::vector<std::pair<std::string, Total>> totals;  // by stage, in the order first seen
  std::chrono::steady_clock::time_point last;
  // gpu mode: events recorded and not yet read (stage, event), the last one read, spare events.
  std::vector<std::pair<std::string, cudaEvent_t>> pending;
  cudaEvent_t last_event = nullptr;
  std::vector<cudaEvent_t> spare_events;
  int device = -1;                // the one device and stream gpu mode times: the first seen
  cudaStream_t stream = nullptr;
  void add(const std::string & stage, double seconds) {
    auto it = std::find_if(totals.begin(), totals.end(), [&](const auto & entry) { return entry.first == stage; });
    if (it == totals.end()) it = totals.insert(it, {stage, {}});
    it->second.each.push_back(seconds);
  }
  ~StageTimes() {
    if (totals.empty()) return;
    std::fprintf(stderr, "crisp: CRISP_HOOK_TIMING (CUDA hook, %s)\n", timing_mode_name());
    std::fprintf(stderr, "crisp:   %-58s %8s %10s %10s %12s %10s\n", "stage", "calls", "total ms", "us/call",
                 "first us", "median us");
    for (auto & [name, t] : totals) {
      const auto calls = static_cast<long long>(t.each.size());
      double seconds = 0.0;
      for (const double s : t.each) seconds += s;
      const double first = t.each.empty() ? 0.0 : t.each.front();
      std::vector<double> later(t.each.size() > 1 ? t.each.begin() + 1 : t.each.end(), t.each.end());
      double median = 0.0;
      if (!later.empty()) {
        std::nth_element(later.begin(), later.begin() + later.size() / 2, later.end());
        median = later[later.size() / 2];
      }
      std::fprintf(stderr, "crisp:   %-58s %8lld %10.3f %10.1f %12.1f %10.1f\n", name.c_str(), calls,
                   seconds * 1e3, calls ? seconds * 1e6 / calls : 0.0, first * 1e6, median * 1e6);
    }
  }
};
StageTimes g_stage_times;

// gpu mode, with g_stage_times.mutex held: the pending events that have completed, in the order
// recorded (up to the first that has not, which cudaEventQuery tells without waiting); the time
// between consecutive events goes to the later one's stage.
static void consume_completed_marks() {
  StageTimes & t = g_stage_times;
  size_t done = 0;
  for (; done < t.pending.size(); ++done) {
    auto & [stage, event] = t.pending[done];
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) break;
    CUDA_CHECK(status);
    if (t.last_event != nullptr) {
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, t.last_event, event));
      t.add(stage, ms * 1e-3);
      t.spare_events.push_back(t.last_event);
    }
    t.last_event = event;
  }
  t.pending.erase(t.pending.begin(), t.pending.begin() + static_cast<std::ptrdiff_t>(done));
}

// Starts (first = true) or closes a timed stage: the time since the previous mark goes to `stage`.
// One mark per host thread would be needed for several devices driven at once; the hook's ops of one
// device are serial, which is what the timing is for.
static void time_stage(ggml_backend_cuda_context & ctx, const char * stage, bool first = false) {
  const HookTiming mode = timing_mode();
  if (mode == HookTiming::off) return;
  if (mode == HookTiming::gpu) {
    std::lock_guard<std::mutex> lock(g_stage_times.mutex);
    if (g_stage_times.device < 0) {
      g_stage_times.device = ctx.device;
      g_stage_times.stream = ctx.stream();
    }
    // Events belong to one device, and are timed on one stream.
    if (ctx.device != g_stage_times.device || ctx.stream() != g_stage_times.stream) return;
    consume_completed_marks();
    cudaEvent_t event = nullptr;
    if (!g_stage_times.spare_events.empty()) {
      event = g_stage_times.spare_events.back();
      g_stage_times.spare_events.pop_back();
    } else {
      CUDA_CHECK(cudaEventCreate(&event));
    }
    CUDA_CHECK(cudaEventRecord(event, ctx.stream()));
    g_stage_times.pending.emplace_back(first ? "between the hook's ops (llama.cpp's nodes, idle time)" : stage, event);
    return;
  }
  if (mode == HookTiming::synchronised) CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(g_stage_times.mutex);
  if (!first) g_stage_times.add(stage, std::chrono::duration<double>(now - g_stage_times.last).count());
  g_stage_times.last = now;
}

// gpu mode, right after a synchronisation of the stream: every event recorded so far has
// completed, and goes to its stage.
static void read_gpu_marks(int device, cudaStream_t stream) {
  if (timing_mode() != HookTiming::gpu) return;
  std::lock_guard<std::mutex> lock(g_stage_times.mutex);
  if (device != g_stage_times.device || stream != g_stage_times.stream) return;
  consume_completed_marks();
}

static void sync_check(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, const char * stage) {
  time_stage(ctx, stage);
  if (!sync_check_requested()) return;
  cudaError_t status = cudaStreamSynchronize(ctx.stream());
  if (status == cudaSuccess) status = cudaGetLastError();
  if (status == cudaSuccess) return;
  const ggml_tensor * q = dst->src[0];
  const ggml_tensor * k = dst->src[1];
  GGML_ABORT("crisp: CRISP_HOOK_SYNC_CHECK: CUDA error %s (%s) %s, op %s: Q [d %lld, n_q %lld, heads %lld], "
             "K/V [rows %lld, kv heads %lld, row stride %zu B], mask [cells %lld, rows %lld]",
             cudaGetErrorName(status), cudaGetErrorString(status), stage, dst->name, (long long) q->ne[0],
             (long long) q->ne[1], (long long) q->ne[2], (long long) k->ne[1], (long long) k->ne[2], k->nb[1],
             (long long) dst->src[3]->ne[0], (long long) dst->src[3]->ne[1]);
}

// ---------------------------------------------------------------- the mask check, on the device
// One block reads row 0 and writes the n_past it implies (ggml_crisp::n_past_of_row0) or -1.
// NOTE: 256 threads: row 0 is n_kv cells (a few thousand); one block is plenty.
constexpr int kRow0Threads = 256;
__global__ void mask_row0_kernel(const uint16_t * __restrict__ row0, int64_t n_kv, int64_t n_q, int * result) {
  __shared__ unsigned long long first_nonzero;
  if (threadIdx.x == 0) first_nonzero = static_cast<unsigned long long>(n_kv);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x)
    if (!is_zero_f16(row0[j])) {
      atomicMin(&first_nonzero, static_cast<unsigned long long>(j));
      break;  // later cells of this thread's stride cannot be smaller
    }
  __syncthreads();
  if (threadIdx.x == 0) *result = static_cast<int>(n_past_of_row0(static_cast<int64_t>(first_nonzero), n_q, n_kv));
}

// Every cell of the first n_q rows against ggml_crisp::mask_cell_ok under `note` with the n_past in
// *result; any mismatch writes -1, and a block that starts after that returns at once (a mask the
// hook declines is usually told from its first rows). A memory-bound scan: a thread reads 8 cells
// (16 bytes) a load when the rows are 16-byte aligned (kVector), else one cell a load.
// NOTE: 256 threads x 4 loads x 8 cells: 8192 cells of a row per block, 16 KB read per block (one
// cell per thread and load, session 22's kernel, read a 16k x 16k mask at about 0.4 TB/s).
constexpr int kMaskThreads = 256;
constexpr int kMaskCellsPerLoad = 8;
constexpr int kMaskLoadsPerThread = 4;
constexpr int64_t kMaskCellsPerBlock = int64_t(kMaskThreads) * kMaskLoadsPerThread * kMaskCellsPerLoad;
template <bool kVector>
__global__ void mask_cells_kernel(const char * __restrict__ mask, size_t row_bytes, int64_t n_kv, int64_t n_q,
                                  ggml_kq_mask_note note, int * result) {
  const int n_past = *static_cast<volatile int *>(result);  // -1: row 0 or an earlier block ruled it out
  if (n_past < 0) return;
  note.n_past = n_past;
  for (int64_t i = blockIdx.y; i < n_q; i += gridDim.y) {
    const uint16_t * row = reinterpret_cast<const uint16_t *>(mask + i * row_bytes);
    bool ok = true;
#pragma unroll
    for (int load = 0; load < kMaskLoadsPerThread; ++load) {
      const int64_t j0 = blockIdx.x * kMaskCellsPerBlock + (int64_t(load) * kMaskThreads + threadIdx.x) * kMaskCellsPerLoad;
      if (kVector && j0 + kMaskCellsPerLoad <= n_kv) {
        const uint4 packed = *reinterpret_cast<const uint4 *>(row + j0);
        const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
        for (int c = 0; c < kMaskCellsPerLoad; ++c) {
          const uint16_t bits = static_cast<uint16_t>(words[c / 2] >> (16 * (c % 2)));
          ok &= mask_cell_ok(bits, note, i, j0 + c);
        }
      } else {
        for (int c = 0; c < kMaskCellsPerLoad && j0 + c < n_kv; ++c) ok &= mask_cell_ok(row[j0 + c], note, i, j0 + c);
      }
    }
    if (!ok) *result = -1;
  }
}

__global__ void store_int_kernel(int * word, int value) { *word = value; }

// Pinned host word the verdict is copied into (per host thread: ggml may drive devices from
// several threads).
static int * pinned_verdict() {
  thread_local int * word = nullptr;
  if (!word) CUDA_CHECK(cudaMallocHost(&word, sizeof(int)));
  return word;
}

// The mask check itself: two kernels on the op's stream, then the op's one synchronisation. With
// `noted` null: n_past read off row 0, then every cell against the plain causal rule (n_past or
// -1). With a note: every cell against it (its n_past, or -1).
static int64_t check_mask_on_device(ggml_backend_cuda_context & ctx, const ggml_tensor * dst, const ggml_tensor * mask,
                                    int64_t n_q, int64_t n_kv, cudaStream_t stream, const ggml_kq_mask_note * noted) {
  ggml_cuda_pool_alloc<int> verdict(ctx.pool(), 1);
  if (noted == nullptr)
    mask_row0_kernel<<<1, kRow0Threads, 0, stream>>>(static_cast<const uint16_t *>(mask->data), n_kv, n_q, verdict.get());
  else
    store_int_kernel<<<1, 1, 0, stream>>>(verdict.get(), static_cast<int>(noted->n_past));
  const ggml_kq_mask_note note = noted != nullptr ? *noted : plain_causal_note(0);
  // NOTE: at most 65535 rows per launch (gridDim.y's limit), the kernel strides over the rest.
  const dim3 grid(static_cast<unsigned>((n_kv + kMaskCellsPerBlock - 1) / kMaskCellsPerBlock),
                  static_cast<unsigned>(std::min<int64_t>(n_q, 65535)));
  const char * cells = static_cast<const char *>(mask->data);
  if (reinterpret_cast<uintptr_t>(cells) % 16 == 0 && mask->nb[1] % 16 == 0)
    mask_cells_kernel<true><<<grid, kMaskThreads, 0, stream>>>(cells, mask->nb[1], n_kv, n_q, note, verdict.get());
  else
    mask_cells_kernel<false><<<grid, kMaskThreads, 0, stream>>>(cells, mask->nb[1], n_kv, n_q, note, verdict.get());
  CUDA_CHECK(cudaGetLastError());
  sync_check(ctx, dst, "after the mask verdict kernels");
  int * host = pinned_verdict();
  CUDA_CHECK(cudaMemcpyAsync(host, verdict.get(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  read_gpu_marks(ctx.device, stream);
  return *host;
}

// The verdicts of the current graph compute. Every layer's op of a compute reads the same KQ mask
// node (two for Gemma 3's sliding-window layers: llama.cpp's input, or its F16 cast computed once
// early in the graph), which no later op of the compute writes, so the first op's verdict stands
// for the others: they skip the mask kernels and the synchronisation. The key is the node (its
// data, shape and strides are fixed within a compute), so a different mask node is checked on its
// own even at a reused address, and the ubatch's query count. A new compute
// (ggml_crisp_cuda_graph_compute_begin) starts a new generation. CRISP_HOOK_VERDICT_CACHE=0 turns
// the reuse off (every op checks its mask).
std::atomic<unsigned long long> g_compute_generation{0};

struct Verdict {
  unsigned long long generation;
  int device;
  const ggml_tensor * mask;  // the graph node: two masks of one compute are two nodes, even where
                             // ggml's allocator lays the second where the first was
  int64_t n_q;
  int64_t n_past;
};
std::mutex g_verdicts_mutex;
std::vector<Verdict> g_verdicts;  // of the current generation only

static bool verdict_cache_enabled() {
  static const bool enabled = [] {
    const char * value = std::getenv("CRISP_HOOK_VERDICT_CACHE");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

// n_past when the mask is bottom-right causal over a contiguous prefix, else -1: two kernels on
// the op's stream, then the op's one synchronisation (a 4-byte copy the host must see before it
// can choose between crisp and llama.cpp's kernel); or the verdict an earlier op of the same
// compute found for the same mask and shape.
static int64_t causal_prefix_on_device(ggml_backend_cuda_context & ctx, const ggml_tensor * dst) {
  const ggml_tensor * mask = dst->src[3];
  const int64_t n_q = dst->src[0]->ne[1];
  cudaStream_t stream = ctx.stream();
  const int64_t n_kv = mask->ne[0];
  Verdict key{g_compute_generation.load(std::memory_order_relaxed), ctx.device, mask, n_q, -1};
  const auto same = [&](const Verdict & v) {
    return v.generation == key.generation && v.device == key.device && v.mask == key.mask && v.n_q == key.n_q;
  };
  if (verdict_cache_enabled()) {
    std::lock_guard<std::mutex> lock(g_verdicts_mutex);
    for (const Verdict & v : g_verdicts)
      if (same(v)) return v.n_past;
  }
  key.n_past = check_mask_on_device(ctx, dst, mask, n_q, n_kv, stream, nullptr);
  if (verdict_cache_enabled()) {
    std::lock_guard<std::mutex> lock(g_verdicts_mutex);
    g_verdicts.erase(std::remove_if(g_verdicts.begin(), g_verdicts.end(),
                                    [&](const Verdict & v) { return v.generation != key.generation; }),
                     g_verdicts.end());
    g_verdicts.push_back(key);
  }
  return key.n_past;
}

// ---------------------------------------------------------------- conversions
// Q: F32 [d, n_q, Hq] with ggml byte strides -> T [n_q, Hq, d] (crisp view {d, Hq*d, 1}).
template <typename T>
__global__ void q_to_scratch_kernel(const char * __restrict__ q, size_t nb1, size_t nb2, int64_t d, int64_t heads,
                                    int64_t n, T * __restrict__ out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = e % d, h = (e / d) % heads, t = e / (d * heads);
    const float value = *reinterpret_cast<const float *>(q + t * nb1 + h * nb2 + x * sizeof(float));
    out[e] = T(value);
  }
}

// O: T [n_q, Hq, d], the layout of dst -> F32 dst.
template <typename T>
__global__ void out_to_f32_kernel(const T * __restrict__ in, int64_t n, float * __restrict__ dst) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    dst[e] = float(in[e]);
}

// ---------------------------------------------------------------- statistics on the device
// kept blocks of every query head of a one-sequence plan (its nnz slots), added to a device counter.
__global__ void add_kept_blocks_kernel(const int32_t * __restrict__ nnz, int heads, unsigned long long * counter) {
  unsigned long long sum = 0;
  for (int h = threadIdx.x; h < heads; h += blockDim.x) sum += static_cast<unsigned long long>(nnz[h]);
  if (sum) atomicAdd(counter, sum);
}

// One counter per device, allocated on first use and never freed (8 bytes).
std::mutex g_counter_mutex;
unsigned long long * g_kept_counter[GGML_CUDA_MAX_DEVICES] = {};

static unsigned long long * kept_counter(int device) {
  std::lock_guard<std::mutex> lock(g_counter_mutex);
  if (!g_kept_counter[device]) {
    CUDA_CHECK(cudaMalloc(&g_kept_counter[device], sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemset(g_kept_counter[device], 0, sizeof(unsigned long long)));
    CUDA_CHECK(cudaDeviceSynchronize());  // done before the next op's count, on any stream
  }
  return g_kept_counter[device];
}

// ---------------------------------------------------------------- device plans, cached per shape
// A DevicePlan is made for one batch shape. Every layer of a ubatch has the same shape, so the
// plan of the shape is made once per ubatch and reused by all its layers; a later ubatch (a longer
// prefix) is a new shape. Each cached plan lives in device memory of its slot that the hook keeps
// and grows (never frees while it runs), and is made on the op's stream: a new shape costs no
// host synchronisation (a DevicePlan of its own would cudaMalloc, copy synchronously and, when
// evicted, cudaFree, each a device-wide wait; crisp keeps the planner's workspace of a destroyed
// DevicePlan for the next). NOTE: 4 shapes kept per device: the current ubatch's, and a few for
// models whose layers differ in heads or head dim; the least recently used slot is reused first.
constexpr size_t kCachedPlans = 4;
// NOTE: a slot that must grow takes 1.25x what the shape needs: the next ubatch's plan (a longer
// prefix) then usually fits without another cudaFree / cudaMalloc.
constexpr double kSlotGrowth = 1.25;

// A sliding-window layer's plan (the dense preset with its window) and a global layer's (the
// policy's) of one ubatch have the same shape: the window tells them apart.
struct PlanKey {
  int device;
  int64_t q_heads, kv_heads, head_dim, n_q, n_k;
  int block_size;
  int64_t window;
  bool operator==(const PlanKey & o) const {
    return std::tie(device, q_heads, kv_heads, head_dim, n_q, n_k, block_size, window) ==
           std::tie(o.device, o.q_heads, o.kv_heads, o.head_dim, o.n_q, o.n_k, o.block_size, o.window);
  }
};

struct PlanSlot {
  PlanKey key{};
  std::unique_ptr<crisp::cuda::DevicePlan> plan;  // null until made, or after a refill failed
  void * memory = nullptr;                        // the slot's device memory (never freed while the process runs)
  size_t capacity = 0;
  crisp::cuda_detail::LastUse last_use;  // recorded after each op that used the slot's memory
};

// Per device: a lock held by an op from its plan's lookup until its use is recorded, and the slots.
std::mutex g_plans_mutex[GGML_CUDA_MAX_DEVICES];
std::list<PlanSlot> g_plans[GGML_CUDA_MAX_DEVICES];  // most recent first

// The slot of key.device holding the plan of `key` (made on `stream` when new), moved to the
// front, with `stream` ordered after the slot's last use elsewhere. Called with
// g_plans_mutex[key.device] held. Throws crisp::Error (the op then declines) when the plan cannot
// be made; the slot then goes to the back, to be refilled first.
static PlanSlot & plan_for(const PlanKey & key, const crisp::Config & config, cudaStream_t stream) {
  std::list<PlanSlot> & plans = g_plans[key.device];
  for (auto it = plans.begin(); it != plans.end(); ++it)
    if (it->plan && it->key == key) {
      plans.splice(plans.begin(), plans, it);
      plans.front().last_use.wait(stream);  // its plan is rewritten by this op
      return plans.front();
    }
  if (plans.size() < kCachedPlans) {
    plans.emplace_front();
  } else {
    plans.splice(plans.begin(), plans, std::prev(plans.end()));  // the least recent
  }
  PlanSlot & slot = plans.front();
  // The old plan's ops on another stream finish before the new plan's set-up overwrites the memory.
  slot.last_use.wait(stream);
  slot.plan.reset();  // its planner workspace goes to crisp's spares
  slot.key = key;
  try {
    const crisp::Batch batch({0, key.n_q}, {0, key.n_k});
    const size_t need = crisp::cuda::DevicePlan::bytes_required(key.q_heads, batch, key.block_size);
    if (need > slot.capacity) {
      if (slot.memory) CUDA_CHECK(cudaFree(slot.memory));  // waits for the work still reading it
      slot.memory = nullptr;
      slot.capacity = 0;
      const size_t want = static_cast<size_t>(static_cast<double>(need) * kSlotGrowth);
      if (cudaMalloc(&slot.memory, want) != cudaSuccess) {
        (void)cudaGetLastError();
        slot.memory = nullptr;
        throw crisp::Error("sparse prefill", "cudaMalloc of " + std::to_string(want) + " bytes for the plan failed",
                           "free device memory for crisp's plan of the ubatch");
      }
      slot.capacity = want;
    }
    slot.plan = std::make_unique<crisp::cuda::DevicePlan>(key.q_heads, key.kv_heads, key.head_dim, batch, config,
                                                          slot.memory, slot.capacity, stream);
  } catch (...) {
    plans.splice(plans.end(), plans, plans.begin());
    throw;
  }
  return slot;
}

static bool cuda_head_dim_supported(int64_t head_dim) { return crisp::cuda::head_dim_supported(head_dim); }

// What crisp's CUDA kernels read.
static BackendLimits cuda_limits() {
  BackendLimits limits;
  limits.f32_kv = false;  // crisp's CUDA kernels read f16 or bf16
  limits.head_dim_supported = cuda_head_dim_supported;
  limits.row_alignment = 16;  // crisp's CUDA kernels load 16-byte rows
  return limits;
}

// A ring's block table (ggml_crisp::ring_block_table_entry), on the op's stream.
__global__ void ring_table_kernel(int32_t * table, int64_t pages, int64_t page, ggml_kq_mask_note ring, int64_t n_kv) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pages; i += int64_t(gridDim.x) * blockDim.x)
    table[i] = ring_block_table_entry(i, page, ring, n_kv);
}

template <typename T>
static void compute(ggml_backend_cuda_context & ctx, ggml_tensor * dst, crisp::DType dtype, const KeyLayout & layout,
             const crisp::Config & config) {
  const ggml_tensor * q = dst->src[0];
  const ggml_tensor * k = dst->src[1];
  const ggml_tensor * v = dst->src[2];
  cudaStream_t stream = ctx.stream();
  const int64_t n_past = layout.note.n_past;
  const int64_t d = q->ne[0], n_q = q->ne[1], heads = q->ne[2], kv_heads = k->ne[2], n_k = n_past + n_q;
  const int64_t n = d * heads * n_q;
  // A sliding-window layer reads its keys from the ring (the op's n_kv cells) as pages.
  const bool windowed = layout.windowed();
  const int64_t n_kv = dst->src[3]->ne[0];
  const int64_t key_rows = windowed ? n_kv : n_k;
  const int64_t pages = windowed ? ring_table_pages(n_k, layout.ring_page) : 0;
  ggml_cuda_pool_alloc<int32_t> table(ctx.pool(), std::max<int64_t>(pages, 1));
  crisp::BlockTable block_table;
  if (windowed) {
    ring_table_kernel<<<ggml_crisp_element_blocks(pages), kGgmlCrispElementThreads, 0, stream>>>(table.get(), pages, layout.ring_page,
                                                                           layout.note, n_kv);
    CUDA_CHECK(cudaGetLastError());
    block_table.data = table.get();
    block_table.device = crisp::Device::cuda;
    block_table.max_pages_per_sequence = pages;
    block_table.page_size = layout.ring_page;
  }

  // Q and O in dst's token-major layout [n_q, Hq, d], crisp views {d, Hq*d, 1}; LSE [Hq, n_q].
  ggml_cuda_pool_alloc<T> q_scratch(ctx.pool(), n), out_scratch(ctx.pool(), n);
  ggml_cuda_pool_alloc<float> lse(ctx.pool(), heads * n_q);
  auto token_major = [&](void * data) {
    crisp::TensorView view;
    view.data = data;
    view.dtype = dtype;
    view.device = crisp::Device::cuda;
    view.shape = {heads, n_q, d};
    view.stride = {d, heads * d, 1};
    return view;
  };
  auto cache_view = [&](const ggml_tensor * t) {
    const int64_t es = static_cast<int64_t>(ggml_type_size(t->type));
    crisp::TensorView view;
    view.data = t->data;
    view.dtype = dtype;
    view.device = crisp::Device::cuda;
    view.shape = {kv_heads, key_rows, d};
    view.stride = {static_cast<int64_t>(t->nb[2]) / es, static_cast<int64_t>(t->nb[1]) / es, 1};
    return view;
  };
  const crisp::TensorView qv = token_major(q_scratch.get()), out = token_major(out_scratch.get());
  const crisp::TensorView kv = cache_view(k), vv = cache_view(v);
  const crisp::TensorView lse_view = crisp::TensorView::contiguous2d(lse.get(), crisp::DType::f32, heads, n_q, crisp::Device::cuda);

  q_to_scratch_kernel<T><<<ggml_crisp_element_blocks(n), kGgmlCrispElementThreads, 0, stream>>>(
      static_cast<const char *>(q->data), q->nb[1], q->nb[2], d, heads, n, q_scratch.get());
  CUDA_CHECK(cudaGetLastError());
  sync_check(ctx, dst, "after Q's conversion into the pool");
  const int block_size = config.for_keys(n_k).block_size;  // the DevicePlan's (short prompts: 64)
  const PlanKey key{ctx.device, heads, kv_heads, d, n_q, n_k, block_size, config.window};
  std::unique_lock<std::mutex> plans_lock(g_plans_mutex[ctx.device]);  // until the slot's use is recorded
  PlanSlot & slot = plan_for(key, config, stream);
  crisp::cuda::DevicePlan & plan = *slot.plan;  // valid while the lock is held
  sync_check(ctx, dst, "after making or reusing the DevicePlan of the shape");
  // From here the slot's memory is in use on `stream`, whatever throws.
  struct RecordUse {
    PlanSlot & slot;
    cudaStream_t stream;
    ~RecordUse() {
      try {
        slot.last_use.record(stream);
      } catch (const crisp::Error &) {  // no throw from a destructor; the error stays with the stream
      }
    }
  } record_use{slot, stream};
  crisp::cuda::plan_async(qv, kv, config, plan, stream, block_table);
  sync_check(ctx, dst, "after crisp::cuda::plan_async");
  crisp::cuda::attend_async(qv, kv, vv, plan, out, lse_view, stream, {}, block_table);
  sync_check(ctx, dst, "after crisp::cuda::attend_async");
  // Past attend_async nothing throws: dst is written only from here on. The statistics' density
  // is that of the sparse plans: a window's band is left out of it.
  if (!windowed) {
    const auto * view = static_cast<const crisp::cuda_detail::DevicePlanView *>(plan.raw_view());
    add_kept_blocks_kernel<<<1, 32, 0, stream>>>(view->nnz, static_cast<int>(heads), kept_counter(ctx.device));
    sync_check(ctx, dst, "after the kept-blocks count");
  }
  out_to_f32_kernel<T><<<ggml_crisp_element_blocks(n), kGgmlCrispElementThreads, 0, stream>>>(out_scratch.get(), n,
                                                                         static_cast<float *>(dst->data));
  CUDA_CHECK(cudaGetLastError());
  sync_check(ctx, dst, "after O's conversion into dst");
  if (!windowed) count_blocks(0, heads * causal_blocks_of_op(n_past, n_q, block_size));
}

// CRISP_HOOK_CUDA_WINDOW=1 (read once): the CUDA hook computes sliding-window layers too.
static bool cuda_windows_enabled() {
  static const bool enabled = [] {
    const char * value = std::getenv("CRISP_HOOK_CUDA_WINDOW");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return enabled;
}
static const char * const kCudaWindowDeclineReason =
    "a sliding-window layer (crisp's CUDA window path is opt-in: CRISP_HOOK_CUDA_WINDOW=1; docs/llama_cpp.md)";

static void decline(const std::string & reason) {
  count_declined();
  log_once("sparse prefill falls back to llama.cpp's attention (CUDA): " + reason);
}

}  // namespace

bool ggml_crisp_cuda_flash_attn_ext(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
  if (ggml_crisp_cuda_computing_reference()) return false;  // CRISP_HOOK_CHECK_OUTPUT's second computation
  if (!is_prompt_op(dst)) return false;  // decode steps stay llama.cpp's
  const std::shared_ptr<const SparsePrefill> setting = current_setting();
  if (!setting) return false;
  ggml_cuda_set_device(ctx.device);  // the kernels below launch on the current device

  const std::string reason = shape_decline_reason(dst, cuda_limits());
  if (!reason.empty()) {
    decline(reason);
    return false;
  }
  // A stream being captured into a CUDA graph cannot wait for the mask verdict. ggml-cuda does not
  // capture a graph holding an op this hook would take (ggml_crisp_cuda_would_take); this keeps
  // any other capture (a caller's own) correct.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    decline("a stream being captured into a CUDA graph");
    return false;
  }
  time_stage(ctx, "", /*first=*/true);
  sync_check(ctx, dst, "on entry to crisp's hook (a kernel of an earlier op, llama.cpp's: crisp's own ops end checked)");
  // A mask llama.cpp noted is not read (no kernels, no synchronisation); others are.
  bool read_mask = false;
  const ggml_tensor * mask = dst->src[3];
  const int64_t n_q = dst->src[0]->ne[1];
  const KeyLayout layout = key_layout_of_op(
      dst,
      [&] {
        read_mask = true;
        return causal_prefix_on_device(ctx, dst);
      },
      [&](const ggml_kq_mask_note & note) {
        read_mask = true;
        return check_mask_on_device(ctx, dst, mask, n_q, mask->ne[0], ctx.stream(), &note) >= 0;
      });
  if (!layout.taken()) {
    time_stage(ctx, "the mask verdict's copy and synchronisation (op declined)");
    decline(kMaskDeclineReason);
    return false;
  }
  // Sliding-window layers on CUDA are opt-in (CRISP_HOOK_CUDA_WINDOW=1): on Gemma 3 in ubatches of
  // 512 crisp's CUDA window path lost answers llama.cpp's kernel keeps (docs/llama_cpp.md, "Known
  // problems"), while every op-level check agrees with the f64 reference; until the cause is found
  // llama.cpp computes those layers here. The CPU hook computes them.
  if (layout.windowed() && !cuda_windows_enabled()) {
    time_stage(ctx, "the mask's note (a sliding-window op, declined)");
    decline(kCudaWindowDeclineReason);
    return false;
  }
  time_stage(ctx, read_mask ? "the mask verdict's copy and synchronisation (op taken)" : "the mask's note (op taken)");

  const crisp::Config config = config_of_op(dst, *setting, layout);
  try {
    if (dst->src[1]->type == GGML_TYPE_F16) {
      compute<__half>(ctx, dst, crisp::DType::f16, layout, config);
    } else {
      compute<__nv_bfloat16>(ctx, dst, crisp::DType::bf16, layout, config);
    }
  } catch (const crisp::Error & e) {
    // crisp refused the shape before writing dst (compute writes dst last): llama.cpp's kernel
    // computes the op instead.
    decline(std::string("crisp refused the op: ") + e.what());
    return false;
  }
  if (ggml_crisp_cuda_output_check_requested()) ggml_crisp_cuda_check_output(ctx, dst, layout.note, layout.ring_page);
  count_handled();
  log_once("sparse prefill '" + setting->policy + "' computes the attention of prompt ubatches (CUDA)");
  return true;
}

// A sliding-window layer's op (its window mark) is declined on CUDA unless opted in: a graph whose
// crisp-eligible ops are all such is captured as upstream's. (The hook itself declines by the
// note: a windowed op whose positions are all still inside the window is noted plain causal and
// taken, as is one without a note whose window covers every cell; in a captured graph the hook
// declines such an op instead, which the capture check in ggml_crisp_cuda_flash_attn_ext keeps
// correct. Gemma 3's graphs hold global ops crisp takes, so they run uncaptured either way.)
bool ggml_crisp_cuda_would_take(const ggml_tensor * dst) {
  if (ggml_flash_attn_ext_get_window(dst) > 0 && !cuda_windows_enabled()) return false;
  return takes_unless_mask_declines(dst, cuda_limits());
}

void ggml_crisp_cuda_graph_compute_begin(void) { g_compute_generation.fetch_add(1, std::memory_order_relaxed); }

extern "C" bool ggml_cuda_set_sparse_prefill(const char * policy, const char * const * settings, int n_settings,
                                             char * error, size_t error_size) {
  return set_sparse_prefill(policy, settings, n_settings, error, error_size);
}

// kept_blocks are summed on each device (no synchronisation per op); reading them waits for every
// device to finish its work, so ask between batches, as llama.cpp's tools do.
extern "C" void ggml_cuda_get_sparse_prefill_stats(int64_t * handled, int64_t * declined, int64_t * kept_blocks,
                                                   int64_t * causal_blocks) {
  Stats s = stats();  // kept_blocks there is 0: this hook counts them on the devices
  if (kept_blocks) {
    std::lock_guard<std::mutex> lock(g_counter_mutex);
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    for (int device = 0; device < GGML_CUDA_MAX_DEVICES; ++device) {
      if (!g_kept_counter[device]) continue;
      unsigned long long value = 0;
      CUDA_CHECK(cudaSetDevice(device));
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemcpy(&value, g_kept_counter[device], sizeof(value), cudaMemcpyDeviceToHost));
      s.kept_blocks += static_cast<int64_t>(value);
    }
    CUDA_CHECK(cudaSetDevice(current));
  }
  store_stats(s, handled, declined, kept_blocks, causal_blocks);
}

extern "C" void ggml_cuda_reset_sparse_prefill_stats(void) {
  reset_stats();
  std::lock_guard<std::mutex> lock(g_counter_mutex);
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  for (int device = 0; device < GGML_CUDA_MAX_DEVICES; ++device) {
    if (!g_kept_counter[device]) continue;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemset(g_kept_counter[device], 0, sizeof(unsigned long long)));
    CUDA_CHECK(cudaDeviceSynchronize());  // done before the next op's count, on any stream
  }
  CUDA_CHECK(cudaSetDevice(current));
}
