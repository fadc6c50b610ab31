// integrations/llama.cpp/ggml-crisp-cuda-check.cu — the CUDA hook's debug check of its outputs
// (ggml-crisp-cuda-check.h). Off by default: it computes every attention op twice (three times
// with the exact attention, whose naive kernel takes seconds per op at 8k tokens) and synchronises
// per op. It was written to locate Gemma 3's lost answers on the CUDA window path
// (docs/llama_cpp.md, "Gemma 3"): every op agreed with llama.cpp's kernel, and crisp's outputs
// were closer to the exact attention than llama.cpp's.
//
//   CRISP_HOOK_CHECK_OUTPUT=1      llama.cpp's kernel recomputes each op crisp took; ops whose
//                                  largest difference exceeds kOutputCheckTolerance of their
//                                  largest value are logged, the worst of each kind at exit
//   CRISP_HOOK_CHECK_OUTPUT=exact  also an exact attention in double from the same Q/K/V (the
//                                  note's visible positions): the RMS and largest error of crisp's
//                                  and of llama.cpp's output against it, per kind, at exit
//   CRISP_HOOK_CHECK_KEEP=crisp (default) | llama | llama_f16 | exact
//                                  which output stays in dst: crisp's, llama.cpp's, llama.cpp's
//                                  rounded to f16 (crisp's output type), or the exact one (with
//                                  CRISP_HOOK_CHECK_OUTPUT=exact): whether an answer follows the
//                                  values or the rest of crisp's computation
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common.cuh"
#include "fattn.cuh"
#include "ggml-crisp-cuda-check.h"
#include "ggml-crisp-cuda.h"

namespace {

enum class CheckMode { off, compare, exact };
enum class Keep { crisp, llama, llama_f16, exact };

static CheckMode check_mode() {
  static const CheckMode mode = [] {
    const char * value = std::getenv("CRISP_HOOK_CHECK_OUTPUT");
    if (value == nullptr) return CheckMode::off;
    if (std::strcmp(value, "1") == 0) return CheckMode::compare;
    if (std::strcmp(value, "exact") == 0) return CheckMode::exact;
    if (value[0] != '\0' && std::strcmp(value, "0") != 0)
      GGML_ABORT("crisp: CRISP_HOOK_CHECK_OUTPUT=%s: expected 1, exact or 0", value);
    return CheckMode::off;
  }();
  return mode;
}

static Keep keep_mode() {
  static const Keep keep = [] {
    const char * value = std::getenv("CRISP_HOOK_CHECK_KEEP");
    if (value == nullptr || std::strcmp(value, "crisp") == 0) return Keep::crisp;
    if (std::strcmp(value, "llama") == 0) return Keep::llama;
    if (std::strcmp(value, "llama_f16") == 0) return Keep::llama_f16;
    if (std::strcmp(value, "exact") == 0 && check_mode() == CheckMode::exact) return Keep::exact;
    GGML_ABORT("crisp: CRISP_HOOK_CHECK_KEEP=%s: expected crisp, llama, llama_f16 or (with "
               "CRISP_HOOK_CHECK_OUTPUT=exact) exact", value);
  }();
  return keep;
}

// NOTE: 2e-2 of the op's largest reference value: f16 inputs through two different kernels agree
// to a few 1e-3 of it on Gemma 3 (the worst op of an 8k prompt: 8e-3); an op that reads a wrong key
// is off by tens of percent (a window one key too wide or narrow: 0.28-0.37).
constexpr float kOutputCheckTolerance = 2e-2f;

thread_local bool t_computing_reference = false;

// result[0]: the largest |crisp - llama|, result[1]: the largest |llama|, result[2]: crisp's
// non-finite outputs (non-negative floats order as their bits).
__global__ void difference_kernel(const float * __restrict__ crisp_out, const float * __restrict__ llama_out, int64_t n,
                                  unsigned int * result) {
  float diff = 0.0f, ref = 0.0f;
  unsigned int non_finite = 0;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const float a = crisp_out[e], b = llama_out[e];
    if (!isfinite(a)) ++non_finite;
    else diff = fmaxf(diff, fabsf(a - b));
    ref = fmaxf(ref, fabsf(b));
  }
  atomicMax(&result[0], __float_as_uint(diff));
  atomicMax(&result[1], __float_as_uint(ref));
  if (non_finite) atomicAdd(&result[2], non_finite);
}

__global__ void round_to_f16_kernel(float * __restrict__ values, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    values[e] = __half2float(__float2half(values[e]));
}

// atomicAdd on a double by compare-and-swap: the native one needs sm_60, and ggml's default
// architecture list starts below it.
__device__ void atomic_add_double(double * address, double value) {
  auto * word = reinterpret_cast<unsigned long long *>(address);
  unsigned long long old = *word, assumed;
  do {
    assumed = old;
    old = atomicCAS(word, assumed, __double_as_longlong(__longlong_as_double(assumed) + value));
  } while (assumed != old);
}

// The exact attention of (query row, head) = (blockIdx.x, blockIdx.y) in double from the f32 Q and
// the f16 / bf16 K/V cells the note makes visible; thread x owns output dimension x. err: the sums
// of squared errors of crisp's and llama.cpp's outputs, of the squared exact values, and the largest
// absolute errors (doubles as bits). exact_out (or null): the exact values, as dst lays them out.
// NOTE: 256 threads: one per output dimension (head dims up to 256); a debug path, the scores are
// recomputed per dimension rather than staged.
constexpr int kExactThreads = 256;
template <typename T>
__global__ void exact_attention_kernel(const char * __restrict__ q, size_t q_nb1, size_t q_nb2, const char * __restrict__ k,
                                       size_t k_nb1, size_t k_nb2, const char * __restrict__ v, size_t v_nb1,
                                       size_t v_nb2, int64_t d, int64_t heads, int64_t group, float scale,
                                       ggml_kq_mask_note note, const float * __restrict__ crisp_out,
                                       const float * __restrict__ llama_out, double * err, float * exact_out) {
  const int64_t row = blockIdx.x, h = blockIdx.y, kv_h = h / group;
  const int64_t position = note.n_past + row;
  const int64_t first =
      note.n_window > 0 && position - note.n_window + 1 > 0 ? position - note.n_window + 1 : 0;
  __shared__ float q_row[kExactThreads];
  __shared__ double partial[kExactThreads];
  __shared__ double row_max, denominator;
  for (int64_t x = threadIdx.x; x < d; x += blockDim.x)
    q_row[x] = *reinterpret_cast<const float *>(q + row * q_nb1 + h * q_nb2 + x * sizeof(float));
  __syncthreads();
  auto cell_of = [&](int64_t p) { return note.ring_cells > 0 ? (p + note.ring_shift) % note.ring_cells : p; };
  auto score = [&](int64_t p) {
    const T * key = reinterpret_cast<const T *>(k + cell_of(p) * k_nb1 + kv_h * k_nb2);
    double s = 0.0;
    for (int64_t x = 0; x < d; ++x) s += double(q_row[x]) * double(float(key[x]));
    return s * double(scale);
  };
  auto reduce = [&](double value, bool take_max) {
    partial[threadIdx.x] = value;
    __syncthreads();
    double all = take_max ? -1e300 : 0.0;
    for (int t = 0; t < static_cast<int>(blockDim.x); ++t) all = take_max ? fmax(all, partial[t]) : all + partial[t];
    __syncthreads();
    return all;
  };
  double m = -1e300;
  for (int64_t p = first + threadIdx.x; p <= position; p += blockDim.x) m = fmax(m, score(p));
  m = reduce(m, true);
  if (threadIdx.x == 0) row_max = m;
  __syncthreads();
  double l = 0.0;
  for (int64_t p = first + threadIdx.x; p <= position; p += blockDim.x) l += exp(score(p) - row_max);
  l = reduce(l, false);
  if (threadIdx.x == 0) denominator = l;
  __syncthreads();
  for (int64_t x = threadIdx.x; x < d; x += blockDim.x) {
    double o = 0.0;
    for (int64_t p = first; p <= position; ++p) {
      const T * value = reinterpret_cast<const T *>(v + cell_of(p) * v_nb1 + kv_h * v_nb2);
      o += exp(score(p) - row_max) * double(float(value[x]));
    }
    o /= denominator;
    const int64_t e = (row * heads + h) * d + x;  // dst is [d, heads, n_q]
    const double a = double(crisp_out[e]) - o, b = double(llama_out[e]) - o;
    if (exact_out != nullptr) exact_out[e] = static_cast<float>(o);
    atomic_add_double(&err[0], a * a);
    atomic_add_double(&err[1], b * b);
    atomic_add_double(&err[2], o * o);
    atomicMax(reinterpret_cast<unsigned long long *>(&err[3]), __double_as_longlong(fabs(a)));
    atomicMax(reinterpret_cast<unsigned long long *>(&err[4]), __double_as_longlong(fabs(b)));
  }
}

// What the check saw, per kind of op (0: global, 1: windowed), printed at exit.
struct Totals {
  std::mutex mutex;
  long long checked[2] = {0, 0}, over[2] = {0, 0};
  double worst[2] = {0.0, 0.0};
  std::string worst_op[2];
  long long exact_ops[2] = {0, 0};
  double squared[2][3] = {};  // crisp's error, llama.cpp's error, the exact values
  double largest[2][2] = {};  // crisp's, llama.cpp's
  ~Totals() {
    for (int w = 0; w < 2; ++w) {
      const char * kind = w ? "windowed" : "global";
      if (checked[w])
        std::fprintf(stderr, "crisp: CRISP_HOOK_CHECK_OUTPUT: %s ops: %lld checked, %lld over %.0e; worst %.3e (%s)\n",
                     kind, checked[w], over[w], double(kOutputCheckTolerance), worst[w], worst_op[w].c_str());
      if (exact_ops[w])
        std::fprintf(stderr, "crisp: CRISP_HOOK_CHECK_OUTPUT=exact: %s ops %lld: relative RMS error crisp %.3e, "
                     "llama.cpp %.3e; largest error crisp %.3e, llama.cpp %.3e\n", kind, exact_ops[w],
                     std::sqrt(squared[w][0] / squared[w][2]), std::sqrt(squared[w][1] / squared[w][2]), largest[w][0],
                     largest[w][1]);
    }
  }
};
Totals g_totals;

}  // namespace

bool ggml_crisp_cuda_output_check_requested() { return check_mode() != CheckMode::off; }

bool ggml_crisp_cuda_computing_reference() { return t_computing_reference; }

void ggml_crisp_cuda_check_output(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const ggml_kq_mask_note & note,
                                  int64_t ring_page) {
  const Keep keep = keep_mode();
  cudaStream_t stream = ctx.stream();
  const int64_t n = ggml_nelements(dst);
  ggml_cuda_pool_alloc<float> llama_out(ctx.pool(), n), exact_out(ctx.pool(), keep == Keep::exact ? n : 1);
  ggml_cuda_pool_alloc<unsigned int> result(ctx.pool(), 3);
  ggml_cuda_pool_alloc<double> err(ctx.pool(), 5);
  ggml_tensor copy = *dst;
  copy.data = llama_out.get();
  t_computing_reference = true;
  ggml_cuda_flash_attn_ext(ctx, &copy);
  t_computing_reference = false;
  CUDA_CHECK(cudaMemsetAsync(result.get(), 0, 3 * sizeof(unsigned int), stream));
  difference_kernel<<<ggml_crisp_element_blocks(n), kGgmlCrispElementThreads, 0, stream>>>(static_cast<const float *>(dst->data), llama_out.get(), n,
                                                           result.get());
  CUDA_CHECK(cudaGetLastError());
  const bool exact = check_mode() == CheckMode::exact;
  const ggml_tensor * q = dst->src[0];
  const ggml_tensor * k = dst->src[1];
  const ggml_tensor * v = dst->src[2];
  if (exact) {
    CUDA_CHECK(cudaMemsetAsync(err.get(), 0, 5 * sizeof(double), stream));
    float scale = 1.0f;
    std::memcpy(&scale, dst->op_params, sizeof(float));
    const dim3 grid(static_cast<unsigned>(q->ne[1]), static_cast<unsigned>(q->ne[2]));
    float * exact_values = keep == Keep::exact ? exact_out.get() : nullptr;
    auto launch = [&](auto element) {
      using T = decltype(element);
      exact_attention_kernel<T><<<grid, kExactThreads, 0, stream>>>(
          static_cast<const char *>(q->data), q->nb[1], q->nb[2], static_cast<const char *>(k->data), k->nb[1],
          k->nb[2], static_cast<const char *>(v->data), v->nb[1], v->nb[2], q->ne[0], q->ne[2], q->ne[2] / k->ne[2],
          scale, note, static_cast<const float *>(dst->data), llama_out.get(), err.get(), exact_values);
    };
    if (k->type == GGML_TYPE_F16) launch(__half());
    else launch(__nv_bfloat16());
    CUDA_CHECK(cudaGetLastError());
  }
  unsigned int host[3] = {0, 0, 0};
  double host_err[5] = {};
  CUDA_CHECK(cudaMemcpyAsync(host, result.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  if (exact) CUDA_CHECK(cudaMemcpyAsync(host_err, err.get(), sizeof(host_err), cudaMemcpyDeviceToHost, stream));
  if (keep == Keep::llama_f16) round_to_f16_kernel<<<ggml_crisp_element_blocks(n), kGgmlCrispElementThreads, 0, stream>>>(llama_out.get(), n);
  if (keep != Keep::crisp) {
    const float * kept = keep == Keep::exact ? exact_out.get() : llama_out.get();
    CUDA_CHECK(cudaMemcpyAsync(dst->data, kept, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));  // the pool's buffers are released on return

  float diff = 0.0f, ref = 0.0f;
  std::memcpy(&diff, &host[0], sizeof(float));
  std::memcpy(&ref, &host[1], sizeof(float));
  const double relative = host[2] ? HUGE_VAL : double(diff) / std::max(double(ref), 1e-30);
  char op[320];
  std::snprintf(op, sizeof(op), "op %s n_past %lld n_q %lld n_kv %lld window %d ring %d shift %d page %lld: max |diff| "
                "%.3e, max |llama.cpp| %.3e, non-finite %u", dst->name, (long long) note.n_past, (long long) q->ne[1],
                (long long) dst->src[3]->ne[0], note.n_window, note.ring_cells, note.ring_shift, (long long) ring_page,
                diff, ref, host[2]);
  const int w = note.n_window > 0 ? 1 : 0;
  std::lock_guard<std::mutex> lock(g_totals.mutex);
  ++g_totals.checked[w];
  if (relative > kOutputCheckTolerance) {
    ++g_totals.over[w];
    std::fprintf(stderr, "crisp: CRISP_HOOK_CHECK_OUTPUT: %s\n", op);
  }
  if (relative > g_totals.worst[w]) {
    g_totals.worst[w] = relative;
    g_totals.worst_op[w] = op;
  }
  if (exact) {
    ++g_totals.exact_ops[w];
    for (int i = 0; i < 3; ++i) g_totals.squared[w][i] += host_err[i];
    g_totals.largest[w][0] = std::max(g_totals.largest[w][0], host_err[3]);
    g_totals.largest[w][1] = std::max(g_totals.largest[w][1], host_err[4]);
  }
}
