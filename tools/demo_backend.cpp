// tools/demo_backend.cpp — see demo_backend.h.
#include "demo_backend.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <omp.h>

#include "commands.h"
#include "progress.h"

#if defined(CRISP_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "crisp/cuda.h"
#endif

namespace crisp_cli {
namespace {

class CpuBackend final : public DemoBackend {
 public:
  explicit CpuBackend(int threads) { options_.num_threads = threads; }

  std::string description() const override {
    // OpenMP's default team size honours the CPU affinity mask (taskset, cgroups), unlike
    // std::thread::hardware_concurrency().
    const int threads = options_.num_threads > 0 ? options_.num_threads : omp_get_max_threads();
    return "cpu (" + std::to_string(threads) + " threads, f32)";
  }

  void load(crisp::Workload& workload) override {
    q_ = workload.q_view();
    k_ = workload.k_view();
    v_ = workload.v_view();
  }

  crisp::Plan plan(const crisp::Config& config, double* ms) override {
    crisp::Plan result;
    *ms = time_ms([&] { result = crisp::plan(q_, k_, config, {}, options_); });
    return result;
  }

  void attend(const crisp::Plan& plan, std::vector<float>& out, std::vector<float>& lse,
              double* ms) override {
    const int64_t heads = q_.heads(), tokens = q_.tokens(), dim = q_.dim();
    out.assign(static_cast<std::size_t>(heads * tokens * dim), 0.0f);
    lse.assign(static_cast<std::size_t>(heads * tokens), 0.0f);
    const auto out_view = crisp::TensorView::contiguous(out.data(), crisp::DType::f32, heads, tokens, dim);
    const auto lse_view = crisp::TensorView::contiguous2d(lse.data(), crisp::DType::f32, heads, tokens);
    *ms = time_ms([&] { crisp::attend(q_, k_, v_, plan, out_view, lse_view, options_); });
  }

 private:
  crisp::Options options_;
  crisp::TensorView q_, k_, v_;
};

#if defined(CRISP_WITH_CUDA)
// NOTE: the GPU kernels take bf16; the demo converts the float32 workload once (round to
// nearest even) and converts O back to float32 for the comparison.
uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw crisp::Error("--backend cuda", std::string(what) + " failed: " + cudaGetErrorString(status),
                       "a working CUDA device, or --backend cpu");
  }
}

// Device memory owned by the demo.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) { check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { std::swap(ptr_, o.ptr_); return *this; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

class CudaBackend final : public DemoBackend {
 public:
  CudaBackend() {
    cudaDeviceProp prop{};
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = prop.name;
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~CudaBackend() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }

  std::string description() const override { return "cuda (" + name_ + ", bf16)"; }

  void load(crisp::Workload& workload) override {
    heads_ = workload.spec.num_q_heads;
    kv_heads_ = workload.spec.num_kv_heads;
    tokens_ = workload.total_tokens;
    dim_ = workload.spec.head_dim;
    cu_seqlens_ = workload.cu_seqlens;
    q_ = upload(workload.q, heads_);
    k_ = upload(workload.k, kv_heads_);
    v_ = upload(workload.v, kv_heads_);
    out_ = DeviceBuffer(static_cast<std::size_t>(heads_ * tokens_ * dim_) * sizeof(uint16_t));
    lse_ = DeviceBuffer(static_cast<std::size_t>(heads_ * tokens_) * sizeof(float));
  }

  crisp::Plan plan(const crisp::Config& config, double* ms) override {
    plan_ = crisp::cuda::DevicePlan(heads_, kv_heads_, dim_, cu_seqlens_, config);
    // The first run of each preset pays for kernel loading; the second is timed.
    for (int run = 0; run < 2; ++run) {
      *ms = timed([&] { crisp::cuda::plan_async(view(q_, heads_), view(k_, kv_heads_), config, plan_); });
    }
    return plan_.to_host();
  }

  void attend(const crisp::Plan&, std::vector<float>& out, std::vector<float>& lse,
              double* ms) override {
    const auto out_view = view(out_, heads_);
    const auto lse_view = crisp::TensorView::contiguous2d(lse_.get(), crisp::DType::f32, heads_,
                                                          tokens_, crisp::Device::cuda);
    for (int run = 0; run < 2; ++run) {
      *ms = timed([&] {
        crisp::cuda::attend_async(view(q_, heads_), view(k_, kv_heads_), view(v_, kv_heads_), plan_,
                                  out_view, lse_view);
      });
    }
    std::vector<uint16_t> staged(static_cast<std::size_t>(heads_ * tokens_ * dim_));
    check_cuda(cudaMemcpy(staged.data(), out_.get(), staged.size() * sizeof(uint16_t),
                          cudaMemcpyDeviceToHost), "cudaMemcpy");
    out.resize(staged.size());
    for (std::size_t i = 0; i < staged.size(); ++i) out[i] = from_bf16(staged[i]);
    lse.resize(static_cast<std::size_t>(heads_ * tokens_));
    check_cuda(cudaMemcpy(lse.data(), lse_.get(), lse.size() * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy");
  }

 private:
  DeviceBuffer upload(const std::vector<float>& host, int64_t heads) {
    std::vector<uint16_t> staged(static_cast<std::size_t>(heads * tokens_ * dim_));
    for (std::size_t i = 0; i < staged.size(); ++i) staged[i] = to_bf16(host[i]);
    DeviceBuffer buffer(staged.size() * sizeof(uint16_t));
    check_cuda(cudaMemcpy(buffer.get(), staged.data(), staged.size() * sizeof(uint16_t),
                          cudaMemcpyHostToDevice), "cudaMemcpy");
    return buffer;
  }
  crisp::TensorView view(const DeviceBuffer& buffer, int64_t heads) const {
    return crisp::TensorView::contiguous(buffer.get(), crisp::DType::bf16, heads, tokens_, dim_,
                                         crisp::Device::cuda);
  }
  // Wall time of the device work enqueued by f on the default stream.
  template <typename F>
  double timed(F&& f) {
    check_cuda(cudaEventRecord(start_), "cudaEventRecord");
    f();
    check_cuda(cudaEventRecord(stop_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

  std::string name_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  int64_t heads_ = 0, kv_heads_ = 0, tokens_ = 0, dim_ = 0;
  crisp::SeqLens cu_seqlens_;
  DeviceBuffer q_, k_, v_, out_, lse_;
  crisp::cuda::DevicePlan plan_;
};

std::unique_ptr<DemoBackend> make_cuda_backend_if_present() {
  if (!crisp::cuda::available()) return nullptr;
  return std::make_unique<CudaBackend>();
}
#else
// Built without the CUDA backend: the CPU is the only backend.
std::unique_ptr<DemoBackend> make_cuda_backend_if_present() { return nullptr; }
#endif

bool cuda_built() {
#if defined(CRISP_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace

std::unique_ptr<DemoBackend> make_demo_backend(const std::string& choice, int threads) {
  if (choice == "cpu") return std::make_unique<CpuBackend>(threads);
  std::unique_ptr<DemoBackend> cuda = make_cuda_backend_if_present();
  if (cuda) return cuda;
  if (choice == "cuda") {
    throw crisp::Error("--backend", cuda_built() ? "cuda was asked for but no usable GPU was found"
                                                 : "cuda was asked for but this build has no CUDA backend",
                       "--backend cpu or auto");
  }
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace crisp_cli
