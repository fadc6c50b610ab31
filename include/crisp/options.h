// crisp/options.h — how a call runs (never what it computes: that is the Config). Every choice is
// a typed field; `automatic` leaves it to the library.
#pragma once

namespace crisp {

// Arithmetic of the CPU backend.
enum class Precision {
  f32,  // float32 compute, float64 accumulation of the spec's sums (proxy masses, coverage sums)
  f64,  // float64 everywhere: the reference the tests compare every backend with
};

// Which backend runs a call. automatic: the device of the views (all on one device).
enum class Backend { automatic, cpu, cuda };

// Which CUDA attention kernel runs a call.
//   automatic: the Hopper kernel where it can run (an sm_90 device, a build with sm_90a code,
//              bf16/f16, head dim 64, 128 or 256, block size 64 or 128) and the call is large
//              enough for it to pay off (crisp::cuda::automatic_prefers_hopper: query heads x
//              the keys the queries see x head dim >= 2^35; a call that sets schedule,
//              ping_pong or gqa_packing takes the Hopper kernel at any size), otherwise the
//              portable one.
//              The environment variable CRISP_KERNEL (auto | portable | hopper), when set, takes
//              the place of `automatic`: the one override of these options, read in one place
//              (src/options.cpp), for runs whose code cannot be changed;
//   portable:  the portable (sm_80-class) kernel;
//   hopper:    the Hopper kernel; a crisp::Error naming "options.cuda.kernel" when it cannot run.
enum class Kernel { automatic, portable, hopper };
// How the Hopper kernel schedules its work items: persistent CTAs taking items from a counter,
// heaviest rows first, or one CTA per item in that order. automatic: the kernel's default
// (src/cuda/hopper/hopper_attention.h).
enum class Schedule { automatic, persistent, grid };
// Whether the Hopper kernel's two consumer warpgroups take turns on the tensor cores (block size
// 128). automatic: the kernel's default.
enum class PingPong { automatic, on, off };
// Whether the Hopper kernel packs each GQA group into one tile (spec §10): it then computes
// crisp::gqa_union(plan), which is denser wherever the group's layouts differ. automatic: the
// kernel's default (separate). Applies at block size 128, group sizes 2/4/8/16, whole-plan
// launches; elsewhere the heads run separately.
enum class GqaPacking { automatic, separate, pack };

// The CUDA attention kernel and its settings. Schedule, ping-pong and packing are Hopper-kernel
// settings: with kernel == portable they must stay automatic (crisp::Error otherwise).
struct CudaOptions {
  Kernel kernel = Kernel::automatic;
  Schedule schedule = Schedule::automatic;
  PingPong ping_pong = PingPong::automatic;
  GqaPacking gqa_packing = GqaPacking::automatic;
};

// NOTE: the most CPU threads any entry point accepts (Options::num_threads, the model runner,
// every --threads): far above any machine's cores, yet low enough that the OpenMP runtime's
// per-thread stacks cannot exhaust memory (100000 threads crashed it).
constexpr int kMaxThreads = 1024;

struct Options {
  Precision precision = Precision::f32;  // CPU backend
  int num_threads = 0;                   // CPU threads; 0 = all hardware threads; at most kMaxThreads
  void* stream = nullptr;                // cudaStream_t for the CUDA backend (nullptr = default stream)
  // The backend a call must run on; a view on another device is a crisp::Error naming it.
  Backend backend = Backend::automatic;
  // CUDA backend only; must stay default when backend == cpu.
  CudaOptions cuda;
};

const char* to_string(Backend backend);
const char* to_string(Kernel kernel);
const char* to_string(Schedule schedule);
const char* to_string(PingPong ping_pong);
const char* to_string(GqaPacking packing);

}  // namespace crisp
