// src/options.cpp — crisp/options.h: names of the choices, their validation (every call and
// crisp::Attention check options here), the one environment override, CRISP_KERNEL, and the
// planner's profiling switch CRISP_PLAN_TIMING: the library reads the environment only here.
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend.h"
#include "crisp/cuda.h"
#include "crisp/error.h"
#include "crisp/options.h"

namespace crisp {

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "auto";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "invalid";
}

const char* to_string(Kernel kernel) {
  switch (kernel) {
    case Kernel::automatic: return "auto";
    case Kernel::portable: return "portable";
    case Kernel::hopper: return "hopper";
  }
  return "invalid";
}

const char* to_string(Schedule schedule) {
  switch (schedule) {
    case Schedule::automatic: return "auto";
    case Schedule::persistent: return "persistent";
    case Schedule::grid: return "grid";
  }
  return "invalid";
}

const char* to_string(PingPong ping_pong) {
  switch (ping_pong) {
    case PingPong::automatic: return "auto";
    case PingPong::on: return "on";
    case PingPong::off: return "off";
  }
  return "invalid";
}

const char* to_string(GqaPacking packing) {
  switch (packing) {
    case GqaPacking::automatic: return "auto";
    case GqaPacking::separate: return "separate";
    case GqaPacking::pack: return "pack";
  }
  return "invalid";
}

namespace detail {
namespace {

// An enum value outside its enumerators (a cast from an integer) prints as "invalid".
template <typename E>
void check_enum(E value, const char* name, const char* expected) {
  if (std::strcmp(to_string(value), "invalid") == 0)
    throw Error(name, "is not one of its enumerators (" + std::to_string(static_cast<int>(value)) + ")", expected);
}

}  // namespace

void check_cuda_options(const CudaOptions& cuda) {
  check_enum(cuda.kernel, "options.cuda.kernel", "Kernel::automatic, portable or hopper");
  check_enum(cuda.schedule, "options.cuda.schedule", "Schedule::automatic, persistent or grid");
  check_enum(cuda.ping_pong, "options.cuda.ping_pong", "PingPong::automatic, on or off");
  check_enum(cuda.gqa_packing, "options.cuda.gqa_packing", "GqaPacking::automatic, separate or pack");
  if (cuda.kernel != Kernel::portable) return;
  // The Hopper kernel's settings mean nothing to the portable kernel: asking for both is a mistake.
  const auto hopper_only = [](const char* name, const char* value) {
    throw Error(name, std::string("is ") + value + " but options.cuda.kernel is portable",
                "auto (a setting of the Hopper kernel) or kernel hopper/auto");
  };
  if (cuda.schedule != Schedule::automatic) hopper_only("options.cuda.schedule", to_string(cuda.schedule));
  if (cuda.ping_pong != PingPong::automatic) hopper_only("options.cuda.ping_pong", to_string(cuda.ping_pong));
  if (cuda.gqa_packing != GqaPacking::automatic)
    hopper_only("options.cuda.gqa_packing", to_string(cuda.gqa_packing));
}

void check_options(const Options& options) {
  if (options.num_threads < 0 || options.num_threads > kMaxThreads)
    throw Error("options.num_threads", "is " + std::to_string(options.num_threads),
                "0 (all hardware threads) or a count up to " + std::to_string(kMaxThreads));
  if (options.precision != Precision::f32 && options.precision != Precision::f64)
    throw Error("options.precision", "is not a Precision value", "Precision::f32 or Precision::f64");
  check_enum(options.backend, "options.backend", "Backend::automatic, cpu or cuda");
  check_cuda_options(options.cuda);
  if (options.backend == Backend::cpu) {
    const CudaOptions defaults;
    const bool is_default = options.cuda.kernel == defaults.kernel && options.cuda.schedule == defaults.schedule &&
                            options.cuda.ping_pong == defaults.ping_pong &&
                            options.cuda.gqa_packing == defaults.gqa_packing;
    if (!is_default)
      throw Error("options.cuda", "sets a CUDA kernel choice but options.backend is cpu",
                  "the default CudaOptions on the CPU backend, or backend cuda/auto");
  }
}

void check_backend(const Options& options, const TensorView& q) {
  // CUDA views in a CUDA build on a machine without a usable device: named here, not by the first
  // CUDA call deep in the planner (cub's sort, a launch).
  if (q.device == Device::cuda && cuda_backend_built() && !cuda::available())
    throw Error("q",
                "is on Device::cuda but this process has no usable CUDA device (crisp::cuda::available() is false: "
                "no device or driver, or an earlier CUDA error in this process)",
                "tensors on Device::cpu here, or a machine with a CUDA device and driver");
  if (options.backend == Backend::automatic) return;
  const Device wanted = options.backend == Backend::cuda ? Device::cuda : Device::cpu;
  if (q.device != wanted)
    throw Error("q", std::string("is on ") + to_string(q.device) + " but options.backend is " +
                         to_string(options.backend),
                std::string("views on Device::") + to_string(wanted) + " (or options.backend auto)");
}

CudaOptions resolve_kernel_override(const CudaOptions& cuda) {
  check_cuda_options(cuda);
  if (cuda.kernel != Kernel::automatic) return cuda;
  // NOTE: the one environment override of the options (crisp/options.h): it only stands in for
  // Kernel::automatic, so a caller's explicit choice always wins.
  const char* value = std::getenv("CRISP_KERNEL");
  if (value == nullptr || value[0] == '\0') return cuda;
  CudaOptions resolved = cuda;
  if (std::strcmp(value, "auto") == 0) return resolved;
  if (std::strcmp(value, "portable") == 0) {
    resolved.kernel = Kernel::portable;
  } else if (std::strcmp(value, "hopper") == 0) {
    resolved.kernel = Kernel::hopper;
  } else {
    throw Error("CRISP_KERNEL", std::string("is \"") + value + "\"", "auto, portable or hopper");
  }
  // The override replaces the kernel only; Hopper settings are dropped with the portable kernel.
  if (resolved.kernel == Kernel::portable) {
    resolved.schedule = Schedule::automatic;
    resolved.ping_pong = PingPong::automatic;
    resolved.gqa_packing = GqaPacking::automatic;
  }
  return resolved;
}

PlanTiming plan_timing_requested() {
  static const PlanTiming requested = [] {
    const char* v = std::getenv("CRISP_PLAN_TIMING");
    if (v == nullptr || v[0] == '\0' || v[0] == '0') return PlanTiming::off;
    return std::strcmp(v, "host") == 0 ? PlanTiming::host : PlanTiming::stages;
  }();
  return requested;
}

}  // namespace detail
}  // namespace crisp
