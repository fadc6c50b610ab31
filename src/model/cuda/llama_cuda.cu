// src/model/cuda/llama_cuda.cu — the Llama runner on one GPU (see llama_cuda.h).
//
// Data layout follows the CPU runner exactly, so every step can be compared with it:
//   x, xn      [n, E]        residual stream and its RMSNorm (token-major, float32)
//   qkv        [n, qkv_dim]  Q heads | K heads | V heads per token; RoPE applied in place
//   k/v cache  [layer][Hkv, capacity, hd]  float32, post-RoPE keys
//   attn       [n, Hq·hd]    attention output, token-major (ready for W_o)
// The prefill attention reads Q/K/V through strided views into `qkv` (no transposes), exactly
// as the CPU runner hands crisp::prefill views into its buffers.
#include "model/cuda/llama_cuda.h"
#include "common/shape_rules.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "crisp/cuda.h"
#include "crisp/error.h"

namespace crisp {
namespace model {
namespace cuda_runner {
namespace {

[[noreturn]] void throw_cuda(cudaError_t status, const char* what) {
  throw Error(std::string("CUDA ") + what, std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")",
              "cudaSuccess");
}
#define MODEL_CUDA_CHECK(expr)                                \
  do {                                                        \
    const cudaError_t model_status_ = (expr);                 \
    if (model_status_ != cudaSuccess) throw_cuda(model_status_, #expr); \
  } while (0)
// After a kernel launch: a launch-configuration error, named after the kernel.
#define MODEL_CUDA_LAUNCH(name)                                            \
  do {                                                                     \
    const cudaError_t model_status_ = cudaGetLastError();                  \
    if (model_status_ != cudaSuccess) throw_cuda(model_status_, "launch of " name); \
  } while (0)
#define MODEL_CUBLAS_CHECK(expr)                                                                       \
  do {                                                                                                 \
    const cublasStatus_t model_blas_status_ = (expr);                                                  \
    if (model_blas_status_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      throw Error(std::string("cuBLAS ") + #expr, cublasGetStatusString(model_blas_status_),           \
                  "CUBLAS_STATUS_SUCCESS");                                                            \
    }                                                                                                  \
  } while (0)

// A device allocation of `count` elements of T (cudaMalloc / cudaFree), move-only.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) { resize(count); }
  ~DeviceArray() { release(); }
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr; o.count_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      count_ = o.count_;
      o.ptr_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  // Reallocates when more room is needed (contents are not kept).
  void resize(std::size_t count) {
    if (count <= count_) return;
    release();
    MODEL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(count, 1) * sizeof(T)));
    count_ = count;
  }
  void upload(const T* host, std::size_t count) {
    resize(count);
    if (count > 0) MODEL_CUDA_CHECK(cudaMemcpy(ptr_, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  T* get() const { return ptr_; }
  std::size_t size() const { return count_; }

 private:
  void release() {
    if (ptr_) cudaFree(ptr_);  // errors at teardown are not actionable
    ptr_ = nullptr;
    count_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// ---------------------------------------------------------------- kernels

// NOTE: 256 threads per row for the row-wise kernels (RMSNorm, embedding, RoPE): rows are
// 576-3072 wide for the models this runs, so one pass of a block covers a row in 1-12 steps.
constexpr int kRowThreads = 256;

__device__ inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

__global__ void embed_kernel(const int32_t* tokens, const float* table, float* x, int64_t dim) {
  const int64_t t = blockIdx.x;
  const float* src = table + static_cast<int64_t>(tokens[t]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) x[t * dim + i] = src[i];
}

// y = x / sqrt(mean(x²) + eps) ⊙ w per row; the sum of squares in float64 as on the CPU.
__global__ void rms_norm_kernel(const float* x, const float* weight, float* y, int64_t dim, double eps) {
  const float* row = x + blockIdx.x * dim;
  float* out = y + blockIdx.x * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += static_cast<double>(row[i]) * row[i];
  __shared__ double partial[kRowThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    double s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / static_cast<double>(dim) + eps));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[i] = (row[i] * inv) * weight[i];
}

// One token per block (position first_position + blockIdx.x): rotates the adjacent pairs
// (x[2i], x[2i+1]) of the first rotary_dim dims of every Q and K head in place (as Rope::apply),
// copies K and V into the cache, and writes float16 copies of the token's Q/K/V when qkv16 is set.
__global__ void rope_cache_kernel(float* qkv, __half* qkv16, const float* cos_table, const float* sin_table,
                                  float* k_cache, float* v_cache, int64_t first_position, int64_t capacity,
                                  int64_t q_dim, int64_t kv_dim, int64_t head_dim, int64_t rotary_dim) {
  const int64_t t = blockIdx.x;
  const int64_t pos = first_position + t;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t half = rotary_dim / 2;
  float* row = qkv + t * qkv_dim;
  for (int64_t pair = threadIdx.x; pair < qkv_dim / 2; pair += blockDim.x) {
    const int64_t col = 2 * pair;
    const int64_t in_head = col % head_dim;
    float x0 = row[col], x1 = row[col + 1];
    if (col < q_dim + kv_dim && in_head < rotary_dim) {
      const int64_t i = in_head / 2;
      const float c = cos_table[pos * half + i], s = sin_table[pos * half + i];
      const float r0 = x0 * c - x1 * s;
      const float r1 = x0 * s + x1 * c;
      x0 = r0;
      x1 = r1;
      row[col] = x0;
      row[col + 1] = x1;
    }
    if (qkv16 != nullptr) {
      qkv16[t * qkv_dim + col] = __float2half_rn(x0);
      qkv16[t * qkv_dim + col + 1] = __float2half_rn(x1);
    }
    if (col >= q_dim) {
      const bool is_k = col < q_dim + kv_dim;
      const int64_t c = is_k ? col - q_dim : col - q_dim - kv_dim;
      const int64_t g = c / head_dim;
      float* cache = (is_k ? k_cache : v_cache) + (g * capacity + pos) * head_dim + (c % head_dim);
      cache[0] = x0;
      cache[1] = x1;
    }
  }
}

// act[r, i] = SiLU(gate[r, i]) · up[r, i], rows of gate_up laid out [gate (ff) | up (ff)].
__global__ void swiglu_kernel(const float* gate_up, float* act, int64_t rows, int64_t ff) {
  const int64_t total = rows * ff;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / ff, i = idx % ff;
    const float g = gate_up[r * 2 * ff + i];
    act[idx] = g / (1.0f + expf(-g)) * gate_up[r * 2 * ff + ff + i];
  }
}

// attn[t, h, :] (float32, token-major) from the kernel's float16 output view [Hq, n, hd] laid
// out token-major too (strides {hd, Hq·hd, 1}): a plain element-wise widening.
__global__ void widen_kernel(const __half* in, float* out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __half2float(in[i]);
}

// ---- float32 attention over key ranges, one warp per query (decode and the reference prefill)

// NOTE: up to 8 dims per lane = head_dim <= 256, the library's limit.
constexpr int kMaxDimsPerLane = 8;

// Online softmax state of one warp: running max m, running sum l, and the weighted value sum
// acc (lane holds dims lane + 32·i).
struct WarpSoftmax {
  float m = -INFINITY;
  float l = 0.0f;
  float acc[kMaxDimsPerLane];
};

// Folds keys [begin, end) of one kv head into `st`. q holds the query (lane layout as acc).
__device__ inline void warp_attend_range(const float (&q)[kMaxDimsPerLane], const float* keys, const float* values,
                                         int64_t head_dim, int64_t begin, int64_t end, float scale,
                                         WarpSoftmax& st, int lane) {
  for (int64_t j = begin; j < end; ++j) {
    const float* k = keys + j * head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) dot += q[i] * k[d];
    }
    for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float s = dot * scale;
    const float m_new = fmaxf(st.m, s);
    const float correction = expf(st.m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    st.l = st.l * correction + p;
    const float* v = values + j * head_dim;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      st.acc[i] = st.acc[i] * correction + (d < head_dim ? p * v[d] : 0.0f);
    }
    st.m = m_new;
  }
}

__device__ inline void load_query(const float* q, int64_t head_dim, int lane, float (&out)[kMaxDimsPerLane]) {
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    out[i] = d < head_dim ? q[d] : 0.0f;
  }
}

// NOTE: decode splits the cached keys into chunks of 256 (4 warps x 64 keys) so a 32k-token cache
// gives 128 blocks per head: enough to fill the GPU with a single query per head.
constexpr int kDecodeWarps = 4;
constexpr int64_t kDecodeChunk = 256;

// Partial attention of one (head, key chunk): partial[(h · splits + chunk) · (hd + 2)] =
// {m, l, acc[hd]}. keys [0, keys) of the cache at head group h / group.
__global__ void decode_partial_kernel(const float* qkv, const float* k_cache, const float* v_cache, int64_t capacity,
                                      int64_t keys, int64_t head_dim, int64_t group, float scale, int64_t splits,
                                      float* partial) {
  const int64_t h = blockIdx.y, chunk = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* kc = k_cache + (h / group) * capacity * head_dim;
  const float* vc = v_cache + (h / group) * capacity * head_dim;
  float q[kMaxDimsPerLane];
  load_query(qkv + h * head_dim, head_dim, lane, q);
  WarpSoftmax st;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) st.acc[i] = 0.0f;
  const int64_t begin = chunk * kDecodeChunk;
  const int64_t end = min_i64(keys, begin + kDecodeChunk);
  const int64_t per_warp = kDecodeChunk / kDecodeWarps;
  const int64_t w_begin = begin + warp * per_warp;
  const int64_t w_end = min_i64(end, w_begin + per_warp);
  if (w_begin < w_end) warp_attend_range(q, kc, vc, head_dim, w_begin, w_end, scale, st, lane);

  // Merge the warps of the block.
  __shared__ float sm_m[kDecodeWarps], sm_l[kDecodeWarps];
  __shared__ float sm_acc[kDecodeWarps][32 * kMaxDimsPerLane];
  if (lane == 0) {
    sm_m[warp] = st.m;
    sm_l[warp] = st.l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) sm_acc[warp][lane + 32 * i] = st.acc[i];
  __syncthreads();
  if (warp != 0) return;
  float m = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, sm_m[w]);
  float l = 0.0f;
  float acc[kMaxDimsPerLane] = {};
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (sm_m[w] == -INFINITY) continue;  // a warp with no keys
    const float f = expf(sm_m[w] - m);
    l += sm_l[w] * f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] += sm_acc[w][lane + 32 * i] * f;
  }
  float* out = partial + (h * splits + chunk) * (head_dim + 2);
  if (lane == 0) {
    out[0] = m;
    out[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < head_dim) out[2 + d] = acc[i];
  }
}

// attn[h, :] = merge of the head's chunk partials. One warp per head.
__global__ void decode_merge_kernel(const float* partial, int64_t splits, int64_t head_dim, float* attn) {
  const int64_t h = blockIdx.x;
  const int lane = threadIdx.x;
  const float* base = partial + h * splits * (head_dim + 2);
  float m = -INFINITY;
  for (int64_t c = 0; c < splits; ++c) m = fmaxf(m, base[c * (head_dim + 2)]);
  float l = 0.0f;
  float acc[kMaxDimsPerLane] = {};
  for (int64_t c = 0; c < splits; ++c) {
    const float* p = base + c * (head_dim + 2);
    if (p[0] == -INFINITY) continue;
    const float f = expf(p[0] - m);
    l += p[1] * f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) acc[i] += p[2 + d] * f;
    }
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < head_dim) attn[h * head_dim + d] = acc[i] * inv;
  }
}

// NOTE: 4 query rows (warps) per block for the reference prefill; it exists for exactness, not speed.
constexpr int kReferenceWarps = 4;

// Float32 block-sparse causal attention following a CSR plan (one sequence): query i of head h
// reads the key blocks col[row_ptr[h][r] .. row_ptr[h][r+1]) of its query block r, keys <= i.
// row_ptr: [Hq][N + 1] offsets into col (already absolute).
__global__ void reference_attention_kernel(const float* qkv, int64_t qkv_dim, const float* k_cache,
                                           const float* v_cache, int64_t capacity, int64_t n, int64_t num_heads,
                                           int64_t head_dim, int64_t group, int64_t block_size, int64_t num_blocks,
                                           float scale, const int32_t* row_ptr, const int32_t* col, float* attn) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kReferenceWarps) + warp;
  const int64_t h = blockIdx.y;
  if (i >= n) return;
  const float* kc = k_cache + (h / group) * capacity * head_dim;
  const float* vc = v_cache + (h / group) * capacity * head_dim;
  float q[kMaxDimsPerLane];
  load_query(qkv + i * qkv_dim + h * head_dim, head_dim, lane, q);
  WarpSoftmax st;
#pragma unroll
  for (int d = 0; d < kMaxDimsPerLane; ++d) st.acc[d] = 0.0f;
  const int64_t r = i / block_size;
  const int32_t* rp = row_ptr + h * (num_blocks + 1);
  for (int32_t e = rp[r]; e < rp[r + 1]; ++e) {
    const int64_t c = col[e];
    const int64_t begin = c * block_size;
    const int64_t end = min_i64(begin + block_size, i + 1);
    if (begin < end) warp_attend_range(q, kc, vc, head_dim, begin, end, scale, st, lane);
  }
  const float inv = 1.0f / st.l;
  float* out = attn + i * num_heads * head_dim + h * head_dim;
#pragma unroll
  for (int d = 0; d < kMaxDimsPerLane; ++d) {
    const int64_t dd = lane + 32 * d;
    if (dd < head_dim) out[dd] = st.acc[d] * inv;
  }
}

int grid_for(int64_t count, int threads) {
  // NOTE: grid-stride kernels: at most 4096 blocks, enough to fill any current GPU.
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(4096, (count + threads - 1) / threads)));
}

// NaN bytes over a buffer (RunOptions::cuda_poison_buffers): 0xFFFF.. is a NaN in f32 and f16.
template <typename T>
void poison(DeviceArray<T>& a, cudaStream_t s) {
  MODEL_CUDA_CHECK(cudaMemsetAsync(a.get(), 0xFF, a.size() * sizeof(T), s));
}

// ---------------------------------------------------------------- the weights on the device

struct DeviceLayer {
  DeviceArray<float> attn_norm, wqkv, wo, ffn_norm, w_gate_up, w_down;
};

// One upload of a model's weights, its stream and cuBLAS handle; shared by every context.
struct DeviceModel {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  int device = 0;
  DeviceArray<float> token_embd, output_norm, output;  // output empty when tied
  std::vector<DeviceLayer> layers;
  const float* output_weight = nullptr;

  explicit DeviceModel(const LlamaModel& model) {
    MODEL_CUDA_CHECK(cudaGetDevice(&device));
    MODEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MODEL_CUBLAS_CHECK(cublasCreate(&blas));
    MODEL_CUBLAS_CHECK(cublasSetStream(blas, stream));
    // float32 products as on the CPU: CUBLAS_DEFAULT_MATH never uses TF32 tensor cores for
    // cublasSgemm (TF32 needs CUBLAS_TF32_TENSOR_OP_MATH); set explicitly so a changed default
    // cannot slip in.
    MODEL_CUBLAS_CHECK(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    const LlamaHparams& hp = model.hparams();
    token_embd.upload(model.token_embedding(0), static_cast<std::size_t>(hp.n_vocab * hp.n_embd));
    output_norm.upload(model.output_norm());
    if (hp.tied_embeddings) {
      output_weight = token_embd.get();
    } else {
      output.upload(model.output_weight(), static_cast<std::size_t>(hp.n_vocab * hp.n_embd));
      output_weight = output.get();
    }
    layers.resize(model.layers().size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const LayerWeights& w = model.layers()[l];
      layers[l].attn_norm.upload(w.attn_norm);
      layers[l].wqkv.upload(w.wqkv);
      layers[l].wo.upload(w.wo);
      layers[l].ffn_norm.upload(w.ffn_norm);
      layers[l].w_gate_up.upload(w.w_gate_up);
      layers[l].w_down.upload(w.w_down);
    }
  }
  ~DeviceModel() {
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  // y[tokens, out] (row stride ldy) = x[tokens, depth] · w[out, depth]ᵀ, plus y when accumulate
  // (the residual adds: cuBLAS's epilogue computes acc + y, the CPU's x += delta).
  void gemm_xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t tokens,
                int64_t out, int64_t depth, bool accumulate) const {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // Row-major y = x·wᵀ is column-major yᵀ = w(ᵀ as stored) · xᵀ: w is column-major [depth, out].
    MODEL_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(tokens),
                                   static_cast<int>(depth), &alpha, w, static_cast<int>(ldw), x,
                                   static_cast<int>(ldx), &beta, y, static_cast<int>(ldy)));
  }
};

std::shared_ptr<DeviceModel> device_model_of(const LlamaModel& model) {
  std::shared_ptr<void>& cache = model.backend_cache();
  if (!cache) cache = std::make_shared<DeviceModel>(model);
  return std::static_pointer_cast<DeviceModel>(cache);
}

// Event pair for one timed interval on a stream.
class EventTimer {
 public:
  EventTimer() {
    MODEL_CUDA_CHECK(cudaEventCreate(&start_));
    MODEL_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(cudaStream_t s) { MODEL_CUDA_CHECK(cudaEventRecord(start_, s)); }
  void stop(cudaStream_t s) { MODEL_CUDA_CHECK(cudaEventRecord(stop_, s)); }
  double seconds() const {  // waits for the stop event
    MODEL_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    MODEL_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// ---------------------------------------------------------------- one sequence

class CudaContext final : public detail::ContextBackend {
 public:
  CudaContext(const LlamaModel& model, int64_t capacity, const RunOptions& options, const Rope& rope)
      : model_(model), dm_(device_model_of(model)), options_(options), capacity_(capacity) {
    const LlamaHparams& hp = model.hparams();
    if (rope.reserved_positions() < capacity) {
      throw Error("rope", "covers " + std::to_string(rope.reserved_positions()) + " positions",
                  "at least the context capacity " + std::to_string(capacity));
    }
    if (hp.head_dim > 32 * kMaxDimsPerLane) {
      throw Error("head_dim", "is " + std::to_string(hp.head_dim), "at most 256 on the CUDA backend");
    }
    rotary_dim_ = rope.rotary_dim();
    const std::size_t table = static_cast<std::size_t>(capacity * (rotary_dim_ / 2));
    cos_.upload(rope.cos_table(), table);
    sin_.upload(rope.sin_table(), table);
    const std::size_t cache = static_cast<std::size_t>(hp.n_layer * hp.n_head_kv * capacity * hp.head_dim);
    k_cache_.resize(cache);
    v_cache_.resize(cache);
    if (options.cuda_poison_buffers) {
      poison(k_cache_, dm_->stream);
      poison(v_cache_, dm_->stream);
    }
    scale_ = static_cast<float>(shape_rules::resolve_softmax_scale(options.attention.softmax_scale, hp.head_dim));
  }

  PrefillResult prefill(const std::vector<int32_t>& tokens, bool all_logits, const QkvObserver& observer) override {
    const LlamaHparams& hp = model_.hparams();
    const DeviceModel& dm = *dm_;
    const cudaStream_t s = dm.stream;
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int64_t E = hp.n_embd, hd = hp.head_dim, F = hp.n_ff;
    const int64_t Hq = hp.n_head, Hkv = hp.n_head_kv;
    const int64_t q_dim = Hq * hd, kv_dim = Hkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    const bool use_crisp_kernel = options_.cuda_attention == CudaPrefillAttention::crisp_f16;

    DeviceArray<int32_t> d_tokens;
    d_tokens.upload(tokens);
    DeviceArray<float> x(n * E), xn(n * E), qkv(n * qkv_dim), attn(n * q_dim), gate_up(n * 2 * F), act(n * F);
    DeviceArray<float> lse(Hq * n);
    DeviceArray<__half> qkv16, out16;
    if (use_crisp_kernel) {
      qkv16.resize(n * qkv_dim);
      out16.resize(n * q_dim);
    }
    if (options_.cuda_poison_buffers) {
      for (DeviceArray<float>* a : {&x, &xn, &qkv, &attn, &gate_up, &act, &lse}) poison(*a, s);
      if (use_crisp_kernel) {
        poison(qkv16, s);
        poison(out16, s);
      }
    }
    cuda::DevicePlan plan(Hq, Hkv, hd, {0, n}, options_.attention);
    EventTimer timer;
    std::vector<float> host_qkv;

    PrefillResult result;
    result.tokens = n;
    result.threads = 1;
    result.layer_density.reserve(static_cast<std::size_t>(hp.n_layer));
    double vs_share_sum = 0.0;

    embed_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, s>>>(d_tokens.get(), dm.token_embd.get(), x.get(), E);
    MODEL_CUDA_LAUNCH("embed_kernel");

    for (int64_t l = 0; l < hp.n_layer; ++l) {
      const DeviceLayer& w = dm.layers[l];
      float* kc = k_cache_.get() + l * Hkv * capacity_ * hd;
      float* vc = v_cache_.get() + l * Hkv * capacity_ * hd;

      rms_norm_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, s>>>(x.get(), w.attn_norm.get(), xn.get(), E, hp.rms_eps);
      MODEL_CUDA_LAUNCH("rms_norm_kernel");
      dm.gemm_xwt(xn.get(), E, w.wqkv.get(), E, qkv.get(), qkv_dim, n, qkv_dim, E, false);
      rope_cache_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, s>>>(
          qkv.get(), use_crisp_kernel ? qkv16.get() : nullptr, cos_.get(), sin_.get(), kc, vc, 0, capacity_, q_dim,
          kv_dim, hd, rotary_dim_);
      MODEL_CUDA_LAUNCH("rope_cache_kernel");

      if (observer) {
        host_qkv.resize(static_cast<std::size_t>(n * qkv_dim));
        MODEL_CUDA_CHECK(cudaMemcpyAsync(host_qkv.data(), qkv.get(), host_qkv.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, s));
        MODEL_CUDA_CHECK(cudaStreamSynchronize(s));
        float* h = host_qkv.data();
        observer(l, TensorView{h, DType::f32, Device::cpu, 3, {Hq, n, hd}, {hd, qkv_dim, 1}},
                 TensorView{h + q_dim, DType::f32, Device::cpu, 3, {Hkv, n, hd}, {hd, qkv_dim, 1}},
                 TensorView{h + q_dim + kv_dim, DType::f32, Device::cpu, 3, {Hkv, n, hd}, {hd, qkv_dim, 1}});
      }

      // The plan from the float32 post-RoPE Q/K (what the CPU planner reads), views into qkv.
      const TensorView q32{qkv.get(), DType::f32, Device::cuda, 3, {Hq, n, hd}, {hd, qkv_dim, 1}};
      const TensorView k32{qkv.get() + q_dim, DType::f32, Device::cuda, 3, {Hkv, n, hd}, {hd, qkv_dim, 1}};
      timer.start(s);
      cuda::plan_async(q32, k32, options_.attention, plan, s);
      if (use_crisp_kernel) {
        const TensorView q16{qkv16.get(), DType::f16, Device::cuda, 3, {Hq, n, hd}, {hd, qkv_dim, 1}};
        const TensorView k16{qkv16.get() + q_dim, DType::f16, Device::cuda, 3, {Hkv, n, hd}, {hd, qkv_dim, 1}};
        const TensorView v16{qkv16.get() + q_dim + kv_dim, DType::f16, Device::cuda, 3, {Hkv, n, hd}, {hd, qkv_dim, 1}};
        const TensorView o16{out16.get(), DType::f16, Device::cuda, 3, {Hq, n, hd}, {hd, q_dim, 1}};
        const TensorView lse_view = TensorView::contiguous2d(lse.get(), DType::f32, Hq, n, Device::cuda);
        cuda::attend_async(q16, k16, v16, plan, o16, lse_view, s);
        widen_kernel<<<grid_for(n * q_dim, kRowThreads), kRowThreads, 0, s>>>(out16.get(), attn.get(), n * q_dim);
        MODEL_CUDA_LAUNCH("widen_kernel");
        timer.stop(s);
        result.attention_seconds += timer.seconds();
        const Plan host_plan = plan.to_host(s);
        result.layer_density.push_back(host_plan.density());
        vs_share_sum += host_plan.vs_share();
      } else {
        const Plan host_plan = plan.to_host(s);  // the reference kernel reads the CSR
        run_reference_attention(host_plan, n, qkv.get(), qkv_dim, kc, vc, attn.get());
        timer.stop(s);
        result.attention_seconds += timer.seconds();
        result.layer_density.push_back(host_plan.density());
        vs_share_sum += host_plan.vs_share();
      }

      dm.gemm_xwt(attn.get(), q_dim, w.wo.get(), q_dim, x.get(), E, n, E, q_dim, true);
      rms_norm_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, s>>>(x.get(), w.ffn_norm.get(), xn.get(), E, hp.rms_eps);
      MODEL_CUDA_LAUNCH("rms_norm_kernel");
      dm.gemm_xwt(xn.get(), E, w.w_gate_up.get(), E, gate_up.get(), 2 * F, n, 2 * F, E, false);
      swiglu_kernel<<<grid_for(n * F, kRowThreads), kRowThreads, 0, s>>>(gate_up.get(), act.get(), n, F);
      MODEL_CUDA_LAUNCH("swiglu_kernel");
      dm.gemm_xwt(act.get(), F, w.w_down.get(), F, x.get(), E, n, E, F, true);
    }

    const int64_t logit_rows = all_logits ? n : 1;
    result.logits = logits_of(x.get() + (n - logit_rows) * E, logit_rows, xn.get());
    double density_sum = 0.0;
    for (double d : result.layer_density) density_sum += d;
    result.density = density_sum / static_cast<double>(hp.n_layer);
    result.vs_share = vs_share_sum / static_cast<double>(hp.n_layer);
    return result;
  }

  std::vector<float> decode(int32_t token, int64_t pos) override {
    const LlamaHparams& hp = model_.hparams();
    const DeviceModel& dm = *dm_;
    const cudaStream_t s = dm.stream;
    const int64_t E = hp.n_embd, hd = hp.head_dim, F = hp.n_ff;
    const int64_t Hq = hp.n_head, Hkv = hp.n_head_kv, group = Hq / Hkv;
    const int64_t q_dim = Hq * hd, kv_dim = Hkv * hd, qkv_dim = q_dim + 2 * kv_dim;
    const int64_t keys = pos + 1;
    const int64_t splits = (keys + kDecodeChunk - 1) / kDecodeChunk;

    if (dec_x_.size() == 0) {  // first decode of this context: its scratch, kept for the next ones
      dec_token_.resize(1);
      dec_x_.resize(E);
      dec_xn_.resize(E);
      dec_qkv_.resize(qkv_dim);
      dec_attn_.resize(q_dim);
      dec_gate_up_.resize(2 * F);
      dec_act_.resize(F);
      dec_partial_.resize(static_cast<std::size_t>(Hq * ((capacity_ + kDecodeChunk - 1) / kDecodeChunk) * (hd + 2)));
      if (options_.cuda_poison_buffers) {
        for (DeviceArray<float>* a : {&dec_x_, &dec_xn_, &dec_qkv_, &dec_attn_, &dec_gate_up_, &dec_act_, &dec_partial_})
          poison(*a, s);
      }
    }
    MODEL_CUDA_CHECK(cudaMemcpyAsync(dec_token_.get(), &token, sizeof(int32_t), cudaMemcpyHostToDevice, s));
    embed_kernel<<<1, kRowThreads, 0, s>>>(dec_token_.get(), dm.token_embd.get(), dec_x_.get(), E);
    MODEL_CUDA_LAUNCH("embed_kernel");
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      const DeviceLayer& w = dm.layers[l];
      float* kc = k_cache_.get() + l * Hkv * capacity_ * hd;
      float* vc = v_cache_.get() + l * Hkv * capacity_ * hd;
      rms_norm_kernel<<<1, kRowThreads, 0, s>>>(dec_x_.get(), w.attn_norm.get(), dec_xn_.get(), E, hp.rms_eps);
      MODEL_CUDA_LAUNCH("rms_norm_kernel");
      dm.gemm_xwt(dec_xn_.get(), E, w.wqkv.get(), E, dec_qkv_.get(), qkv_dim, 1, qkv_dim, E, false);
      rope_cache_kernel<<<1, kRowThreads, 0, s>>>(dec_qkv_.get(), nullptr, cos_.get(), sin_.get(), kc, vc, pos,
                                                  capacity_, q_dim, kv_dim, hd, rotary_dim_);
      MODEL_CUDA_LAUNCH("rope_cache_kernel");
      decode_partial_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(Hq)), kDecodeWarps * 32, 0, s>>>(
          dec_qkv_.get(), kc, vc, capacity_, keys, hd, group, scale_, splits, dec_partial_.get());
      MODEL_CUDA_LAUNCH("decode_partial_kernel");
      decode_merge_kernel<<<static_cast<unsigned>(Hq), 32, 0, s>>>(dec_partial_.get(), splits, hd, dec_attn_.get());
      MODEL_CUDA_LAUNCH("decode_merge_kernel");
      dm.gemm_xwt(dec_attn_.get(), q_dim, w.wo.get(), q_dim, dec_x_.get(), E, 1, E, q_dim, true);
      rms_norm_kernel<<<1, kRowThreads, 0, s>>>(dec_x_.get(), w.ffn_norm.get(), dec_xn_.get(), E, hp.rms_eps);
      MODEL_CUDA_LAUNCH("rms_norm_kernel");
      dm.gemm_xwt(dec_xn_.get(), E, w.w_gate_up.get(), E, dec_gate_up_.get(), 2 * F, 1, 2 * F, E, false);
      swiglu_kernel<<<grid_for(F, kRowThreads), kRowThreads, 0, s>>>(dec_gate_up_.get(), dec_act_.get(), 1, F);
      MODEL_CUDA_LAUNCH("swiglu_kernel");
      dm.gemm_xwt(dec_act_.get(), F, w.w_down.get(), F, dec_x_.get(), E, 1, E, F, true);
    }
    return logits_of(dec_x_.get(), 1, dec_xn_.get());
  }

 private:
  // Logits of `rows` hidden rows (device), normed into `scratch` (room for rows · E floats).
  std::vector<float> logits_of(const float* hidden, int64_t rows, float* scratch) {
    const LlamaHparams& hp = model_.hparams();
    const DeviceModel& dm = *dm_;
    const cudaStream_t s = dm.stream;
    rms_norm_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(hidden, dm.output_norm.get(), scratch,
                                                                         hp.n_embd, hp.rms_eps);
    MODEL_CUDA_LAUNCH("rms_norm_kernel");
    if (logits_.size() < static_cast<std::size_t>(rows * hp.n_vocab)) {
      logits_.resize(static_cast<std::size_t>(rows * hp.n_vocab));
      if (options_.cuda_poison_buffers) poison(logits_, s);
    }
    dm.gemm_xwt(scratch, hp.n_embd, dm.output_weight, hp.n_embd, logits_.get(), hp.n_vocab, rows, hp.n_vocab,
                hp.n_embd, false);
    std::vector<float> out(static_cast<std::size_t>(rows * hp.n_vocab));
    MODEL_CUDA_CHECK(cudaMemcpyAsync(out.data(), logits_.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    MODEL_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
  }

  // The float32 reference attention of one layer following `plan` (one sequence).
  void run_reference_attention(const Plan& plan, int64_t n, const float* qkv, int64_t qkv_dim, const float* kc,
                               const float* vc, float* attn) {
    const LlamaHparams& hp = model_.hparams();
    const SequencePlan& seq = plan.sequences.at(0);
    const int64_t N = seq.num_blocks;
    std::vector<int32_t> row_ptr, col;
    row_ptr.reserve(static_cast<std::size_t>(hp.n_head * (N + 1)));
    for (const HeadPlan& head : seq.heads) {
      const int32_t base = static_cast<int32_t>(col.size());
      for (int32_t r : head.row_ptr) row_ptr.push_back(base + r);
      col.insert(col.end(), head.col.begin(), head.col.end());
    }
    DeviceArray<int32_t> d_row_ptr, d_col;
    d_row_ptr.upload(row_ptr);
    d_col.upload(col);
    const cudaStream_t s = dm_->stream;
    const dim3 grid(static_cast<unsigned>((n + kReferenceWarps - 1) / kReferenceWarps), static_cast<unsigned>(hp.n_head));
    reference_attention_kernel<<<grid, kReferenceWarps * 32, 0, s>>>(
        qkv, qkv_dim, kc, vc, capacity_, n, hp.n_head, hp.head_dim, hp.n_head / hp.n_head_kv, plan.block_size, N,
        static_cast<float>(plan.softmax_scale), d_row_ptr.get(), d_col.get(), attn);
    MODEL_CUDA_LAUNCH("reference_attention_kernel");
    MODEL_CUDA_CHECK(cudaStreamSynchronize(s));  // d_row_ptr / d_col are freed on return
  }

  const LlamaModel& model_;
  std::shared_ptr<DeviceModel> dm_;
  RunOptions options_;
  int64_t capacity_;
  int64_t rotary_dim_ = 0;
  float scale_ = 1.0f;
  DeviceArray<float> cos_, sin_, k_cache_, v_cache_, logits_;
  // Decode scratch, allocated on the first decode and reused.
  DeviceArray<int32_t> dec_token_;
  DeviceArray<float> dec_x_, dec_xn_, dec_qkv_, dec_attn_, dec_gate_up_, dec_act_, dec_partial_;
};

}  // namespace

bool cuda_device_visible() { return crisp::cuda::available(); }

std::string device_name() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

std::unique_ptr<detail::ContextBackend> make_cuda_context(const LlamaModel& model, int64_t capacity,
                                                          const RunOptions& options, const Rope& rope) {
  return std::make_unique<CudaContext>(model, capacity, options, rope);
}

}  // namespace cuda_runner
}  // namespace model
}  // namespace crisp
