// A crisp user's program, built against the installed package (find_package(crisp)): plans and
// runs the crisp policy on a small synthetic sequence, checks its output against the dense plan
// and exits non-zero when the output is not finite or far from dense.
#include <cmath>
#include <cstdio>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"

int main() {
  crisp::WorkloadSpec spec;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.seq_lens = {512};
  crisp::Workload workload = crisp::make_workload(spec);
  const crisp::TensorView q = workload.q_view(), k = workload.k_view(), v = workload.v_view();
  const int64_t heads = q.heads(), n = q.tokens(), d = q.dim();

  std::vector<float> out(heads * n * d), lse(heads * n), out_dense(out.size()), lse_dense(lse.size());
  auto view = [&](std::vector<float>& o, std::vector<float>& l) {
    return std::make_pair(crisp::TensorView::contiguous(o.data(), crisp::DType::f32, heads, n, d),
                          crisp::TensorView::contiguous2d(l.data(), crisp::DType::f32, heads, n));
  };
  try {
    auto [o, l] = view(out, lse);
    const crisp::Plan plan = crisp::prefill(q, k, v, crisp::Config::from_preset("crisp"), o, l);
    auto [od, ld] = view(out_dense, lse_dense);
    crisp::prefill(q, k, v, crisp::Config::from_preset("dense"), od, ld);
    for (const crisp::HeadMetrics& m : crisp::compare(o, l, od, ld)) {
      // NOTE: a loose sanity bound (the test suite checks accuracy); this checks the link works.
      if (!std::isfinite(m.rel_error) || m.rel_error > 0.5) {
        std::fprintf(stderr, "crisp_consumer: relative error %g against dense\n", m.rel_error);
        return 1;
      }
    }
    std::printf("crisp_consumer: %zu heads planned, output matches dense\n",
                plan.sequences.at(0).heads.size());
  } catch (const crisp::Error& e) {
    std::fprintf(stderr, "crisp_consumer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
