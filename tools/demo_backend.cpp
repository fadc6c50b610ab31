// tools/demo_backend.cpp — see demo_backend.h.
#include "demo_backend.h"

#include <string>
#include <thread>

#include "commands.h"
#include "progress.h"

namespace crisp_cli {
namespace {

class CpuBackend final : public DemoBackend {
 public:
  explicit CpuBackend(int threads) { options_.num_threads = threads; }

  std::string description() const override {
    const unsigned threads =
        options_.num_threads > 0 ? static_cast<unsigned>(options_.num_threads) : std::thread::hardware_concurrency();
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

// The CUDA backend of the demo: only in builds with the CUDA backend and its public header.
std::unique_ptr<DemoBackend> make_cuda_backend_if_present() { return nullptr; }

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
