// src/attention.cpp — crisp::Attention (crisp/attention.h): the checks of crisp::plan / attend,
// made once per call, and the backend's PlannedAttention that keeps the plan between runs.
#include <string>
#include <utility>

#include "backend.h"
#include "common/shape_rules.h"
#include "crisp/attention.h"
#include "crisp/error.h"

namespace crisp {
namespace detail {
namespace {

// The CPU half: the host plan itself.
class CpuPlannedAttention final : public PlannedAttention {
 public:
  CpuPlannedAttention(const Config& config, const Options& options) : config_(config), options_(options) {}

  void plan(const TensorView& q, const TensorView& k, const Batch& normalized_batch) override {
    plan_ = cpu_plan(q, k, config_, normalized_batch, options_);
    block_table_ = normalized_batch.block_table;
  }
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse) const override {
    validate_plan_for(q, k, plan_, block_table_);
    cpu_attend(q, k, v, plan_, block_table_, out, lse, options_);
  }
  Plan host_plan() const override { return plan_; }

 private:
  Config config_;
  Options options_;
  Plan plan_;
  BlockTable block_table_;
};

// A moved-from Attention has no state: every call but assignment and destruction is refused.
void require_state(bool has_state) {
  if (!has_state)
    throw Error("Attention", "has been moved from (it holds no configuration)", "an Attention constructed or assigned");
}

void require_plan(bool planned) {
  if (!planned) throw Error("plan", "has not been made (no Attention::plan call has succeeded)", "plan(q, k) first");
}

}  // namespace
}  // namespace detail

struct Attention::Impl {
  Config config;
  Options options;
  Backend backend = Backend::automatic;  // of the last plan
  Batch batch;                           // of the last plan, normalized (its key offsets and table)
  std::unique_ptr<detail::PlannedAttention> planned;
};

Attention::Attention(const Config& config, const Options& options) : impl_(std::make_unique<Impl>()) {
  config.validate();
  detail::check_options(options);
  impl_->config = config;
  impl_->options = options;
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

void Attention::plan(const TensorView& q, const TensorView& k, const Batch& batch) {
  detail::within_memory([&] {
    detail::require_state(impl_ != nullptr);
    detail::validate_qkv(q, k, nullptr);
    detail::check_backend(impl_->options, q);
    const Batch normalized = detail::normalize_batch(batch, q, k, nullptr);
    detail::check_input_values(q, k, nullptr, impl_->options,
                               shape_rules::resolve_softmax_scale(impl_->config.softmax_scale, q.dim()),
                               normalized.block_table, normalized.cu_seqlens_k);
    const Backend backend = q.device == Device::cuda ? Backend::cuda : Backend::cpu;
    // A backend's state (the CUDA device plan's buffers) is kept while the backend stays the same.
    if (!impl_->planned || impl_->backend != backend) {
      impl_->planned.reset();
      impl_->backend = Backend::automatic;
      if (backend == Backend::cuda) {
        impl_->planned = detail::make_cuda_planned_attention(impl_->config, impl_->options);
      } else {
        impl_->planned = std::make_unique<detail::CpuPlannedAttention>(impl_->config, impl_->options);
      }
    }
    impl_->backend = Backend::automatic;  // not planned unless the backend's plan succeeds
    impl_->planned->plan(q, k, normalized);
    impl_->batch = normalized;
    impl_->backend = backend;
  });
}

void Attention::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& lse) const {
  detail::within_memory([&] {
    detail::require_plan(planned());
    detail::validate_qkv(q, k, &v);
    detail::validate_outputs(q, out, lse);
    detail::check_output_memory(q, k, v, out, lse);
    if (v.tokens() != k.tokens())
      throw Error("v", "has " + std::to_string(v.tokens()) + " tokens but k has " + std::to_string(k.tokens()),
                  "the same token count as k");
    const Device planned_device = impl_->backend == Backend::cuda ? Device::cuda : Device::cpu;
    if (q.device != planned_device)
      throw Error("q", std::string("is on ") + to_string(q.device) + " but the plan was made on " +
                           to_string(planned_device),
                  "the views of the backend that planned");
    detail::check_input_values(q, k, &v, impl_->options,
                               shape_rules::resolve_softmax_scale(impl_->config.softmax_scale, q.dim()),
                               impl_->batch.block_table, impl_->batch.cu_seqlens_k, &out, &lse);
    impl_->planned->run(q, k, v, out, lse);
  });
}

bool Attention::planned() const { return impl_ && impl_->backend != Backend::automatic; }
Backend Attention::backend() const { return impl_ ? impl_->backend : Backend::automatic; }

Plan Attention::host_plan() const {
  detail::require_plan(planned());
  Plan plan = impl_->planned->host_plan();
  plan.page_size = impl_->batch.block_table.page_size;  // the backends' plans do not carry it
  return plan;
}

const Config& Attention::config() const {
  detail::require_state(impl_ != nullptr);
  return impl_->config;
}
const Options& Attention::options() const {
  detail::require_state(impl_ != nullptr);
  return impl_->options;
}

}  // namespace crisp
