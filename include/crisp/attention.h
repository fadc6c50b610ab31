// crisp/attention.h — one object that plans once and runs as often as wanted, on either backend.
//
//   crisp::Options options;                 // backend, kernel, schedule, GQA packing, stream ...
//   options.cuda.kernel = crisp::Kernel::portable;
//   crisp::Attention attention(crisp::Config::from_preset("crisp"), options);
//   attention.plan(q, k, cu_seqlens);        // route, layout, density of every (sequence, head)
//   attention.run(q, k, v, out, lse);        // block-sparse attention following that plan
//   attention.run(q, k, v2, out2, lse2);     // again, with the same plan
//
// On the CPU the plan is a crisp::Plan; on CUDA it stays on the device (a crisp::cuda::DevicePlan,
// kept and refilled while the batch shape stays the same) and plan/run are enqueued on
// options.stream without synchronising the host. The free functions crisp::plan / attend /
// prefill (crisp/crisp.h) and crisp::cuda::plan_async / attend_async (crisp/cuda.h) remain for
// callers who hold a plan themselves.
// Threads: const calls (run, host_plan, ...) may run concurrently; plan() must not overlap any
// other call on the same object (it replaces the plan those read), as for a standard container.
// The Python wrapper (crisp.Attention) serialises its calls with a lock.
#pragma once
#include <memory>

#include "crisp/config.h"
#include "crisp/options.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"

namespace crisp {

class Attention {
 public:
  // Validates config and options; throws crisp::Error naming the offending field ("config.alpha",
  // "options.cuda.kernel", ...). Allocates nothing.
  explicit Attention(const Config& config, const Options& options = {});
  ~Attention();
  // A moved-from Attention may only be assigned or destroyed; its other calls throw crisp::Error.
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // Plans q [Hq, q_tokens, d] and k [Hkv, kv_tokens, d] for the batch (the same checks as
  // crisp::plan; a cu_seqlens list converts to a batch of whole prompts). The backend is
  // options.backend, or the views' device when automatic. Replaces any earlier plan. The batch,
  // its block table included, is kept for run(): a paged table must stay valid until the last run.
  void plan(const TensorView& q, const TensorView& k, const Batch& batch = {});

  // Attention of q/k/v following the last plan (the same checks as crisp::attend; q/k/v of the
  // shape that was planned, on the planned backend). Throws crisp::Error naming "plan" before
  // any plan() call.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse) const;

  bool planned() const;
  // The backend of the last plan (automatic before any).
  Backend backend() const;
  // The last plan as a host crisp::Plan (CUDA: copied back, synchronising options.stream).
  Plan host_plan() const;
  const Config& config() const;
  const Options& options() const;

  struct Impl;  // src/attention.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace crisp
