// tools/demo_backend.h — where `crisp demo` runs: the CPU backend, or the CUDA backend when the
// library was built with it and a GPU is present. The demo only sees host data and wall times.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"

namespace crisp_cli {

class DemoBackend {
 public:
  virtual ~DemoBackend() = default;
  // "cpu (2 threads, f32)", "cuda (NVIDIA H200)", ...
  virtual std::string description() const = 0;
  // Makes the workload's Q, K, V available to the backend (copies them to the device if needed).
  virtual void load(crisp::Workload& workload) = 0;
  // crisp::plan() of the loaded inputs; *ms receives its wall time (device work included).
  virtual crisp::Plan plan(const crisp::Config& config, double* ms) = 0;
  // crisp::attend() of the loaded inputs following `plan`; *ms receives its wall time (device
  // work included). out [Hq, n, d] and lse [Hq, n] come back as host float32.
  virtual void attend(const crisp::Plan& plan, std::vector<float>& out, std::vector<float>& lse,
                      double* ms) = 0;
};

// choice: "auto" (CUDA when built and a GPU is present, else CPU), "cpu" or "cuda" (an error
// when unavailable). threads: CPU threads, 0 = all.
std::unique_ptr<DemoBackend> make_demo_backend(const std::string& choice, int threads);

}  // namespace crisp_cli
