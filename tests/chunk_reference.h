// tests/chunk_reference.h — the CPU suites' view of a Chunks (tests/chunk_util.h) through the
// independent float64 oracle (tests/oracle.h), shared by tests/test_chunked.cpp (§11) and
// tests/test_window.cpp (§12): the options of a run, the stated output tolerance, the oracle's
// attention of the same inputs (dense, or on a plan's layout and window), the check that every
// output element is written and within tolerance, and a crisp::attend run.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "chunk_util.h"
#include "crisp/crisp.h"
#include "oracle.h"

namespace crisp_test {

inline crisp::Options options_of(crisp::Precision precision) {
  crisp::Options o;
  o.precision = precision;
  // NOTE: one thread: ctest runs the test processes in parallel on a small machine.
  o.num_threads = 1;
  return o;
}

inline const char* name_of(crisp::Precision p) { return p == crisp::Precision::f64 ? "f64" : "f32"; }

// ---------------------------------------------------------------- the oracle's view of a Chunks
struct Reference {
  oracle::Tensor q, k, v;
  crisp::SeqLens cu_q, cu_k;
  explicit Reference(const Chunks& c)
      : q(oracle::Tensor::from_floats(c.q, c.hq, c.q_tokens(), c.d)),
        k(oracle::Tensor::from_floats(c.k, c.hkv, c.kv_tokens(), c.d)),
        v(oracle::Tensor::from_floats(c.v, c.hkv, c.kv_tokens(), c.d)),
        cu_q(c.cu_q),
        cu_k(c.cu_k) {}
  // Dense bottom-right causal attention, within a sliding window of `window` tokens (0: none).
  oracle::Attention dense(int block, double scale, int64_t window = 0) const {
    return oracle::attend_chunks(q, k, v, cu_q, cu_k, block, scale, nullptr, window);
  }
  // Attention restricted to the plan's layout and to its config's window (§12).
  oracle::Attention on_plan(const crisp::Plan& plan) const {
    oracle::Layouts layouts;
    for (const crisp::SequencePlan& sp : plan.sequences) {
      layouts.emplace_back();
      for (const crisp::HeadPlan& hp : sp.heads) layouts.back().emplace_back(hp.row_ptr, hp.col);
    }
    return oracle::attend_chunks(q, k, v, cu_q, cu_k, plan.block_size, plan.softmax_scale, &layouts, plan.config.window);
  }
};

// NOTE: output tolerances, |got - want| <= tol * max(1, |want|). float64: both sides compute the
// same sums in exact arithmetic, in different orders (an online softmax against a two-pass one):
// rounding of ~1e-16 per term over ~1e3 terms. float32: logits rounded to float (relative ~1e-7 on
// logits up to ~20, i.e. absolute ~2e-6 on exponents) and float partial sums: 1e-5.
inline double output_tolerance(crisp::Precision p) { return p == crisp::Precision::f64 ? 1e-11 : 1e-5; }

// Every element written (none NaN) and within tolerance of the reference.
inline void expect_outputs_match(const Outputs& got, const oracle::Attention& want, double tol, const std::string& context) {
  int64_t unwritten = 0, wrong = 0;
  std::string first;
  auto check = [&](double g, double w, const std::string& where) {
    if (std::isnan(g)) {
      ++unwritten;
      if (first.empty()) first = where + " is NaN (unwritten)";
    } else if (!(std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w)))) {
      ++wrong;
      if (first.empty()) first = where + ": " + std::to_string(g) + " vs reference " + std::to_string(w);
    }
  };
  for (size_t i = 0; i < got.out_size(); ++i) check(got.out_at(i), want.out.data[i], "out[" + std::to_string(i) + "]");
  for (size_t i = 0; i < got.lse_size(); ++i) check(got.lse_at(i), want.lse[i], "lse[" + std::to_string(i) + "]");
  EXPECT_EQ(unwritten, 0) << context << "\n  " << first;
  EXPECT_EQ(wrong, 0) << context << " (tolerance " << tol << ")\n  " << first;
}

inline Outputs run_attend(Chunks& c, const crisp::Plan& plan, crisp::Precision precision) {
  Outputs o(precision == crisp::Precision::f64 ? crisp::DType::f64 : crisp::DType::f32, c.hq, c.q_tokens(), c.d);
  crisp::attend(c.q_view(), c.k_view(), c.v_view(), plan, o.out(), o.lse(), options_of(precision));
  return o;
}

}  // namespace crisp_test
