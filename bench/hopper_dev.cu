// bench/hopper_dev.cu — development harness of the Hopper attention kernel (not part of the build):
// builds block CSR plans (dense causal, random density, varlen) straight into the device plan
// layout, runs the portable kernel and the Hopper kernel (the library's stage count and 2 stages),
// checks both against a naive fp32 GPU reference, and times them at long lengths.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc \
//        bench/hopper_dev.cu src/cuda/hopper/hopper_attention.cu -o hopper_dev
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention_kernel.cuh"
#include "cuda/hopper/hopper_attention.h"
#include "cuda/hopper/hopper_attention_kernel.cuh"

namespace att = crisp::cuda_detail::attention;
namespace hop = crisp::cuda_detail::hopper;
using crisp::layout::SequenceBases;

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int B = 128;
int D = 128;  // head dim of the current cases (64 or 128)

// Naive reference: one thread per (head, token); fp32; keys from the plan's row.
template <int D>
__global__ void reference_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* out,
                                 float* lse, int64_t tokens, int H, int q_per_kv, crisp::cuda_detail::DevicePlanView plan,
                                 float scale) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= tokens * H) return;
  const int h = idx / tokens;
  const int64_t t = idx % tokens;
  int s = 0;
  while (!(t >= plan.seqs[s].token_offset && t < plan.seqs[s].token_offset + plan.seqs[s].n)) ++s;
  const SequenceBases b = plan.seqs[s];
  const int query = t - b.token_offset, r = query / B, kvh = h / q_per_kv;
  const int* rp = plan.row_ptr + crisp::layout::row_ptr_offset(b, h, H);
  const int* cols = plan.col + crisp::layout::col_offset(b, h, H);
  const __nv_bfloat16* qr = q + ((int64_t)h * tokens + t) * D;
  float m = -INFINITY;
  for (int i = rp[r]; i < rp[r + 1]; ++i)
    for (int key = cols[i] * B; key < min((cols[i] + 1) * B, (int)b.n) && key <= query; ++key) {
      const __nv_bfloat16* kr = k + ((int64_t)kvh * tokens + b.token_offset + key) * D;
      float dot = 0.f;
      for (int x = 0; x < D; ++x) dot += __bfloat162float(qr[x]) * __bfloat162float(kr[x]);
      m = fmaxf(m, dot * scale);
    }
  float acc[D];
  for (int x = 0; x < D; ++x) acc[x] = 0.f;
  float sum = 0.f;
  for (int i = rp[r]; i < rp[r + 1]; ++i)
    for (int key = cols[i] * B; key < min((cols[i] + 1) * B, (int)b.n) && key <= query; ++key) {
      const __nv_bfloat16* kr = k + ((int64_t)kvh * tokens + b.token_offset + key) * D;
      const __nv_bfloat16* vr = v + ((int64_t)kvh * tokens + b.token_offset + key) * D;
      float dot = 0.f;
      for (int x = 0; x < D; ++x) dot += __bfloat162float(qr[x]) * __bfloat162float(kr[x]);
      const float pr = expf(dot * scale - m);
      sum += pr;
      for (int x = 0; x < D; ++x) acc[x] += pr * __bfloat162float(vr[x]);
    }
  for (int x = 0; x < D; ++x) out[((int64_t)h * tokens + t) * D + x] = acc[x] / sum;
  lse[(int64_t)h * tokens + t] = m + logf(sum);
}

struct HostPlan {
  std::vector<SequenceBases> seqs;
  std::vector<int> row_ptr, col;
  double pairs = 0;  // sum over heads of nnz - N/2
  int max_blocks = 0;
};

// density < 0: dense causal; else column 0 and the diagonal always, others with probability p.
HostPlan make_plan(const std::vector<int64_t>& lens, int H, double density, uint64_t seed) {
  HostPlan hp;
  int64_t tok = 0, bb = 0, rb = 0, cb = 0;
  for (int64_t n : lens) {
    const int N = (n + B - 1) / B;
    hp.seqs.push_back({tok, n, N, bb, rb, cb});
    tok += n;
    bb += N;
    rb += N + 1;
    cb += (int64_t)N * (N + 1) / 2;
    hp.max_blocks = std::max(hp.max_blocks, N);
  }
  hp.row_ptr.assign(rb * H, 0);
  hp.col.assign(cb * H, -1);
  std::mt19937_64 rng(seed);
  for (const auto& b : hp.seqs) {
    const int N = b.num_blocks;
    const double total = (double)N * (N + 1) / 2, forced = 2.0 * N - 1;
    const double p = density < 0 ? 1.0 : std::clamp((density * total - forced) / std::max(1.0, total - forced), 0.0, 1.0);
    std::bernoulli_distribution pick(p);
    for (int h = 0; h < H; ++h) {
      int* rp = hp.row_ptr.data() + crisp::layout::row_ptr_offset(b, h, H);
      int* cols = hp.col.data() + crisp::layout::col_offset(b, h, H);
      int cnt = 0;
      rp[0] = 0;
      for (int r = 0; r < N; ++r) {
        for (int c = 0; c <= r; ++c)
          if (c == 0 || c == r || pick(rng)) cols[cnt++] = c;
        rp[r + 1] = cnt;
      }
      hp.pairs += cnt - 0.5 * N;
    }
  }
  return hp;
}

struct DevPlan {
  crisp::cuda_detail::DevicePlanView view{};
  void *seqs = nullptr, *rp = nullptr, *col = nullptr;
  DevPlan(const HostPlan& hp, int H) {
    CK(cudaMalloc(&seqs, hp.seqs.size() * sizeof(SequenceBases)));
    CK(cudaMalloc(&rp, hp.row_ptr.size() * 4));
    CK(cudaMalloc(&col, hp.col.size() * 4));
    CK(cudaMemcpy(seqs, hp.seqs.data(), hp.seqs.size() * sizeof(SequenceBases), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rp, hp.row_ptr.data(), hp.row_ptr.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(col, hp.col.data(), hp.col.size() * 4, cudaMemcpyHostToDevice));
    view.num_sequences = hp.seqs.size();
    view.num_heads = H;
    view.block_size = B;
    view.seqs = (const SequenceBases*)seqs;
    view.row_ptr = (int*)rp;
    view.col = (int*)col;
  }
  ~DevPlan() {
    cudaFree(seqs);
    cudaFree(rp);
    cudaFree(col);
  }
};

struct Problem {
  int H, Hkv;
  int64_t tokens;
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
};

// Approximately normal values (sum of 4 hashed uniforms), generated on the device.
__global__ void fill_kernel(__nv_bfloat16* dst, int64_t count, float mul, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < 4; ++j) {
      uint64_t z = (uint64_t)i * 4 + j + seed * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      acc += (float)(z >> 40) * (1.f / 16777216.f) - 0.5f;
    }
    dst[i] = __float2bfloat16(acc * 1.7320508f * mul);  // variance of the sum of 4 U(-1/2,1/2) is 1/3
  }
}

Problem make_problem(int H, int Hkv, int64_t tokens, uint64_t seed) {
  Problem p{H, Hkv, tokens};
  auto fill = [&](__nv_bfloat16** dst, int64_t count, float mul) {
    CK(cudaMalloc(dst, count * 2));
    fill_kernel<<<1024, 256>>>(*dst, count, mul, seed++);
    CK(cudaGetLastError());
  };
  // Scores with a spread like real attention (q.k / sqrt(d) ~ N(0, 2^2)).
  fill(&p.q, (int64_t)H * tokens * D, 1.4f);
  fill(&p.k, (int64_t)Hkv * tokens * D, 1.4f);
  fill(&p.v, (int64_t)Hkv * tokens * D, 1.f);
  CK(cudaMalloc(&p.o, (int64_t)H * tokens * D * 2));
  CK(cudaMalloc(&p.lse, (int64_t)H * tokens * 4));
  return p;
}

att::Params make_params(const Problem& pr, const DevPlan& dp, const HostPlan& hp) {
  att::Params p{};
  p.q = pr.q;
  p.k = pr.k;
  p.v = pr.v;
  p.out = pr.o;
  p.lse = pr.lse;
  p.q_stride_head = pr.tokens * D;
  p.q_stride_token = D;
  p.k_stride_head = p.v_stride_head = pr.tokens * D;
  p.k_stride_token = p.v_stride_token = D;
  p.o_stride_head = pr.tokens * D;
  p.o_stride_token = D;
  p.lse_stride_head = pr.tokens;
  p.lse_stride_token = 1;
  p.num_q_heads = pr.H;
  p.q_per_kv = pr.H / pr.Hkv;
  p.num_items = static_cast<int32_t>(pr.H * static_cast<int64_t>(hp.seqs.size()) * hp.max_blocks);
  p.scale = 1.f / std::sqrt((float)D);
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.plan = dp.view;
  return p;
}

// kernel: 0 portable, 1 hopper
void launch(int kernel, const att::Params& p, const Problem& pr, const HostPlan& hp) {
  const int64_t ctas = (int64_t)pr.H * hp.seqs.size() * hp.max_blocks;
  if (kernel == 0) {
    auto kfn = D == 128 ? att::block_sparse_attention_kernel<__nv_bfloat16, 128, B>
                        : att::block_sparse_attention_kernel<__nv_bfloat16, 64, B>;
    const int smem = D == 128 ? att::smem_bytes<__nv_bfloat16, 128, B>() : att::smem_bytes<__nv_bfloat16, 64, B>();
    CK(cudaFuncSetAttribute(kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kfn<<<ctas, att::threads_per_cta<B>(), smem>>>(p);
  } else {
    const auto mq = hop::make_tensor_map(pr.q, crisp::DType::bf16, D, pr.H, pr.tokens, p.q_stride_head, p.q_stride_token);
    const auto mk = hop::make_tensor_map(pr.k, crisp::DType::bf16, D, pr.Hkv, pr.tokens, p.k_stride_head, p.k_stride_token);
    const auto mv = hop::make_tensor_map(pr.v, crisp::DType::bf16, D, pr.Hkv, pr.tokens, p.v_stride_head, p.v_stride_token);
    // kernel 1: ping-pong consumers; kernel 2: unsynchronised consumers (one CTA per item, no work order)
    auto kfn = D == 128 ? (kernel == 1 ? hop::hopper_attention_kernel<__nv_bfloat16, 128, true>
                                       : hop::hopper_attention_kernel<__nv_bfloat16, 128, false>)
                        : (kernel == 1 ? hop::hopper_attention_kernel<__nv_bfloat16, 64, true>
                                       : hop::hopper_attention_kernel<__nv_bfloat16, 64, false>);
    const int smem = D == 128 ? hop::smem_bytes<128, hop::kDefaultStages>() : hop::smem_bytes<64, hop::kDefaultStages>();
    CK(cudaFuncSetAttribute(kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kfn<<<ctas, hop::kThreads, smem>>>(mq, mk, mv, p);
  }
  CK(cudaGetLastError());
}

const char* kNames[] = {"portable", "hopper_pingpong", "hopper_unsync"};

int check_case(const char* name, std::vector<int64_t> lens, int H, int Hkv, double density, uint64_t seed) {
  int64_t tokens = 0;
  for (auto n : lens) tokens += n;
  Problem pr = make_problem(H, Hkv, tokens, seed);
  HostPlan hp = make_plan(lens, H, density, seed + 1);
  DevPlan dp(hp, H);
  att::Params p = make_params(pr, dp, hp);
  float *ref_o, *ref_l;
  CK(cudaMalloc(&ref_o, (int64_t)H * tokens * D * 4));
  CK(cudaMalloc(&ref_l, (int64_t)H * tokens * 4));
  if (D == 128)
    reference_kernel<128><<<(H * tokens + 127) / 128, 128>>>(pr.q, pr.k, pr.v, ref_o, ref_l, tokens, H, H / Hkv,
                                                            dp.view, p.scale);
  else
    reference_kernel<64><<<(H * tokens + 127) / 128, 128>>>(pr.q, pr.k, pr.v, ref_o, ref_l, tokens, H, H / Hkv,
                                                           dp.view, p.scale);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> ro(H * tokens * D), rl(H * tokens), l(H * tokens);
  std::vector<__nv_bfloat16> o(H * tokens * D);
  CK(cudaMemcpy(ro.data(), ref_o, ro.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rl.data(), ref_l, rl.size() * 4, cudaMemcpyDeviceToHost));
  int failures = 0;
  for (int kernel = 0; kernel < 3; ++kernel) {
    CK(cudaMemset(pr.o, 0xff, o.size() * 2));
    CK(cudaMemset(pr.lse, 0xff, l.size() * 4));
    launch(kernel, p, pr, hp);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      std::printf("%-28s %-13s CUDA error %s\n", name, kNames[kernel], cudaGetErrorString(e));
      std::exit(2);
    }
    CK(cudaMemcpy(o.data(), pr.o, o.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(l.data(), pr.lse, l.size() * 4, cudaMemcpyDeviceToHost));
    double err2 = 0, ref2 = 0, lse_err = 0;
    int64_t nans = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      const float x = __bfloat162float(o[i]);
      if (!std::isfinite(x)) {
        ++nans;
        continue;
      }
      err2 += (x - ro[i]) * (x - ro[i]);
      ref2 += ro[i] * ro[i];
    }
    for (size_t i = 0; i < l.size(); ++i) {
      if (!std::isfinite(l[i])) ++nans;
      else lse_err = std::max(lse_err, (double)std::fabs(l[i] - rl[i]));
    }
    const double rel = std::sqrt(err2 / ref2);
    const bool ok = nans == 0 && rel < 1e-2 && lse_err < 1e-3;
    if (!ok) ++failures;
    std::printf("%-28s %-13s rel.err %.2e  max|dLSE| %.2e  non-finite %lld  %s\n", name, kNames[kernel], rel, lse_err,
                (long long)nans, ok ? "OK" : "FAIL");
  }
  cudaFree(ref_o);
  cudaFree(ref_l);
  cudaFree(pr.q);
  cudaFree(pr.k);
  cudaFree(pr.v);
  cudaFree(pr.o);
  cudaFree(pr.lse);
  return failures;
}

void time_case(int64_t n, int H, int Hkv, double density, int kernel_mask) {
  Problem pr = make_problem(H, Hkv, n, 7);
  HostPlan hp = make_plan({n}, H, density, 8);
  DevPlan dp(hp, H);
  att::Params p = make_params(pr, dp, hp);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int kernel = 0; kernel < 3; ++kernel) {
    if (!(kernel_mask >> kernel & 1)) continue;
    launch(kernel, p, pr, hp);
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int rep = 0; rep < 3; ++rep) {
      cudaEventRecord(a);
      launch(kernel, p, pr, hp);
      cudaEventRecord(b);
      CK(cudaEventSynchronize(b));
      float t;
      cudaEventElapsedTime(&t, a, b);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double tflops = 4.0 * B * B * D * hp.pairs / (ms[1] * 1e-3) / 1e12;
    std::printf("d=%d n=%-7lld H=%d Hkv=%d density=%s%-5.2f %-9s %9.3f ms  %6.1f TFLOP/s\n", D, (long long)n, H, Hkv,
                density < 0 ? "dense " : "", density < 0 ? 1.0 : density, kNames[kernel], ms[1], tflops);
  }
  cudaFree(pr.q);
  cudaFree(pr.k);
  cudaFree(pr.v);
  cudaFree(pr.o);
  cudaFree(pr.lse);
}

int main(int argc, char** argv) {
  // hopper_dev [timing 0|1] [64 | both]: head dim 128 (default), 64, or both
  const bool timing = argc < 2 || std::atoi(argv[1]) != 0;
  std::vector<int> dims = {128};
  if (argc > 2) dims = std::string(argv[2]) == "64" ? std::vector<int>{64} : std::vector<int>{64, 128};
  int failures = 0;
  for (int dim : dims) {
    D = dim;
    std::printf("---- head dim %d\n", D);
    failures += check_case("dense_1seq_n1000_gqa2", {1000}, 4, 2, -1, 1);
    failures += check_case("dense_1seq_n2048_gqa4", {2048}, 8, 2, -1, 2);
    failures += check_case("random30_n3000_gqa2", {3000}, 4, 2, 0.3, 3);
    failures += check_case("varlen_dense_50_700_129_1024", {50, 700, 129, 1024}, 4, 1, -1, 4);
    failures += check_case("varlen_random10", {300, 1200, 65, 901}, 4, 4, 0.1, 5);
    failures += check_case("random20_n9000_h32_gqa4", {9000}, 32, 8, 0.2, 6);
    failures += check_case("varlen_random30_h16", {5000, 300, 7000, 129}, 16, 4, 0.3, 7);
  }
  std::printf("correctness failures (portable/hopper): %d\n", failures);
  if (timing) {
    for (int dim : dims) {
      D = dim;
      time_case(32768, 32, 8, -1, 7);
      time_case(131072, 32, 8, -1, 7);
      time_case(131072, 32, 8, 0.10, 7);
    }
  }
  return failures;
}
