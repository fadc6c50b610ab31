// tests/test_window.cpp — the sliding window (docs/spec.md §12: query p sees the keys (p - W, p]) on
// the CPU backend, against the independent float64 oracle (tests/oracle.h, whose window rule and
// band are written from the spec, not from src/plan/rules.h):
//  - the dense preset with a window plans exactly the oracle's band (every block that holds a key
//    some query of the row sees) and computes the oracle's windowed attention;
//  - a sparse preset's plan with a window is its plan without one, minus the blocks wholly outside
//    the window, and computes the oracle's windowed attention on that plan;
//  - paged K/V laid out as a ring (llama.cpp's sliding-window cache: position p in slot p mod S, so
//    the pages before the window hold later positions) gives the contiguous result bit for bit;
//  - a plan that lists a block outside its window, and a negative window, are refused by name.
// Whole prompts, chunks (n_q < n_k, unaligned) and decode steps; windows of 1 token to wider than
// the prompt; every output element written (NaN-poisoned before the run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "chunk_reference.h"
#include "chunk_util.h"
#include "crisp/crisp.h"
#include "oracle.h"
#include "test_util.h"

namespace {

using namespace crisp_test;  // Chunks, Outputs, Reference and the checks of chunk_reference.h

// NOTE: the prompts of tests/test_chunked.cpp (1300: a partial last block at both block sizes, above
// flexprefill's min_budget so every preset plans sparse), cut as a whole prompt, an unaligned chunk, a
// block of queries and a decode step, in one varlen batch.
const std::vector<int64_t> kPrompts = {1300, 1100};
std::vector<ChunkSeq> window_sequences(int block) {
  return {{0, 1300, 1300}, {0, 1000, 200}, {1, 1100, 1}, {1, 1100, block}};
}
// NOTE: windows: one token (each query sees itself), under a block, one block, unaligned across
// blocks, most of a prompt, and wider than every prompt (the window then changes nothing).
const std::vector<int64_t> kWindows = {1, 37, 64, 300, 1299, 5000};

crisp::Config config_of(const char* preset, int block, int64_t window) {
  crisp::Config cfg = crisp::Config::from_preset(preset);
  cfg.block_size = block;
  cfg.window = window;
  return cfg;
}

// The columns of row r of a head.
std::vector<int32_t> row_of(const crisp::HeadPlan& hp, int32_t r) {
  return {hp.col.begin() + hp.row_ptr[r], hp.col.begin() + hp.row_ptr[r + 1]};
}

TEST(SlidingWindow, DensePresetPlansTheOraclesBandAndComputesWindowedAttention) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  for (int block : {64, 128}) {
    Chunks c = crisp_test::make_chunks(seed, kPrompts, window_sequences(block));
    const Reference ref(c);
    for (int64_t window : kWindows) {
      const std::string context = "B=" + std::to_string(block) + " window " + std::to_string(window);
      const crisp::Config cfg = config_of("dense", block, window);
      const crisp::Plan plan = crisp::plan(c.q_view(), c.k_view(), cfg, c.batch(), options_of(crisp::Precision::f64));
      ASSERT_NO_THROW(plan.check_well_formed()) << context;
      int64_t listed = 0, band = 0;
      for (size_t s = 0; s < plan.sequences.size(); ++s) {
        const crisp::SequencePlan& sp = plan.sequences[s];
        for (const crisp::HeadPlan& hp : sp.heads)
          for (int32_t r = sp.first_row; r < sp.num_blocks; ++r) {
            std::vector<int32_t> want;
            for (int32_t col = 0; col <= r; ++col)
              if (oracle::window_band_has(sp.n_k, sp.n_q, block, window, r, col)) want.push_back(col);
            ASSERT_EQ(row_of(hp, r), want) << context << ": sequence " << s << ", row " << r;
            listed += static_cast<int64_t>(want.size());
            band += r + 1;
          }
      }
      // A window narrower than the prompts must drop blocks, or the test compared causal attention.
      if (window < 300) EXPECT_LT(listed, band) << context;
      for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32}) {
        expect_outputs_match(run_attend(c, plan, precision), ref.dense(block, plan.softmax_scale, window),
                             output_tolerance(precision), context);
        // The same through crisp::prefill.
        Outputs o(crisp::DType::f64, c.hq, c.q_tokens(), c.d);
        crisp::prefill(c.q_view(), c.k_view(), c.v_view(), cfg, o.out(), o.lse(), c.batch(), options_of(precision));
        expect_outputs_match(o, ref.dense(block, plan.softmax_scale, window), output_tolerance(precision),
                             context + " (prefill)");
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(SlidingWindow, SparsePlanIsTheUnwindowedPlanClippedToTheWindow) {
  const uint64_t seed = test_seed(1);
  SCOPED_TRACE(seed_trace(seed));
  int clipped_rows = 0;
  for (int block : {64, 128}) {
    Chunks c = crisp_test::make_chunks(seed, kPrompts, window_sequences(block));
    const Reference ref(c);
    for (const char* preset : {"crisp", "flexprefill", "minference"}) {
      const crisp::Plan free =
          crisp::plan(c.q_view(), c.k_view(), config_of(preset, block, 0), c.batch(), options_of(crisp::Precision::f64));
      for (int64_t window : {int64_t{37}, int64_t{300}}) {
        const std::string context = std::string(preset) + " B=" + std::to_string(block) + " window " + std::to_string(window);
        const crisp::Plan plan = crisp::plan(c.q_view(), c.k_view(), config_of(preset, block, window), c.batch(),
                                             options_of(crisp::Precision::f64));
        ASSERT_NO_THROW(plan.check_well_formed()) << context;
        for (size_t s = 0; s < plan.sequences.size(); ++s) {
          const crisp::SequencePlan &sp = plan.sequences[s], &fp = free.sequences[s];
          for (size_t h = 0; h < sp.heads.size(); ++h) {
            EXPECT_EQ(sp.heads[h].route, fp.heads[h].route) << context;
            EXPECT_EQ(sp.heads[h].vertical, fp.heads[h].vertical) << context;
            EXPECT_EQ(sp.heads[h].slash, fp.heads[h].slash) << context;
            for (int32_t r = sp.first_row; r < sp.num_blocks; ++r) {
              std::vector<int32_t> want;
              for (int32_t col : row_of(fp.heads[h], r))
                if (oracle::window_band_has(sp.n_k, sp.n_q, block, window, r, col)) want.push_back(col);
              clipped_rows += want.size() < row_of(fp.heads[h], r).size();
              ASSERT_EQ(row_of(sp.heads[h], r), want) << context << ": sequence " << s << ", head " << h << ", row " << r;
            }
          }
        }
        for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32})
          expect_outputs_match(run_attend(c, plan, precision), ref.on_plan(plan), output_tolerance(precision),
                               context);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  EXPECT_GT(clipped_rows, 0) << "no row lost a block to the window: the test compared unwindowed plans only";
}

// llama.cpp's sliding-window cache keeps position p in slot p mod S (S >= window + n_q): as pages,
// logical page i is physical page i mod (S / page). Pages before the window then hold later
// positions; a plan that read them would differ from the contiguous run.
TEST(SlidingWindow, RingOfPagesGivesTheContiguousResult) {
  const uint64_t seed = test_seed(2);
  SCOPED_TRACE(seed_trace(seed));
  const int64_t n_k = 1300, n_q = 200, window = 300, page = 16;
  for (int block : {64, 128}) {
    Chunks c = crisp_test::make_chunks(seed, {n_k}, {{0, n_k, n_q}});
    const int64_t ring_pages = (window + n_q + page - 1) / page + 1;
    const int64_t slots = ring_pages * page;
    std::vector<float> pool_k(static_cast<size_t>(c.hkv * slots * c.d), 0.f), pool_v(pool_k.size(), 0.f);
    for (int64_t p = 0; p < n_k; ++p)  // in position order: a later position overwrites its slot
      for (int64_t h = 0; h < c.hkv; ++h) {
        const size_t at = static_cast<size_t>(((p % slots) * c.hkv + h) * c.d);
        std::copy_n(c.k.data() + (h * n_k + p) * c.d, c.d, pool_k.data() + at);
        std::copy_n(c.v.data() + (h * n_k + p) * c.d, c.d, pool_v.data() + at);
      }
    const int64_t pages = (n_k + page - 1) / page;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i % ring_pages);
    crisp::BlockTable bt;
    bt.data = table.data();
    bt.max_pages_per_sequence = pages;
    bt.page_size = page;
    auto view = [&](std::vector<float>& x) {
      return crisp::TensorView{x.data(), crisp::DType::f32, crisp::Device::cpu, 3, {c.hkv, slots, c.d}, {c.d, c.hkv * c.d, 1}};
    };
    const crisp::Config cfg = config_of("dense", block, window);
    for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32}) {
      const crisp::DType dt = precision == crisp::Precision::f64 ? crisp::DType::f64 : crisp::DType::f32;
      Outputs contiguous(dt, c.hq, n_q, c.d), ring(dt, c.hq, n_q, c.d);
      crisp::prefill(c.q_view(), c.k_view(), c.v_view(), cfg, contiguous.out(), contiguous.lse(), c.batch(),
                     options_of(precision));
      crisp::prefill(c.q_view(), view(pool_k), view(pool_v), cfg, ring.out(), ring.lse(), c.batch(bt),
                     options_of(precision));
      int64_t differ = 0;
      for (size_t i = 0; i < contiguous.out_size(); ++i) {
        const double a = contiguous.out_at(i), b = ring.out_at(i);
        differ += std::memcmp(&a, &b, sizeof a) != 0;
      }
      for (size_t i = 0; i < contiguous.lse_size(); ++i) {
        const double a = contiguous.lse_at(i), b = ring.lse_at(i);
        differ += std::memcmp(&a, &b, sizeof a) != 0;
      }
      EXPECT_EQ(differ, 0) << "B=" << block << " precision " << (dt == crisp::DType::f64 ? "f64" : "f32");
    }
  }
}

TEST(SlidingWindow, RefusesANegativeWindowAndAPlanOutsideItsWindow) {
  crisp::Config cfg = crisp::Config::from_preset("dense");
  try {
    cfg.set("window", "-1");
    ADD_FAILURE() << "window -1 was accepted";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
  }
  // A plan made with a wide window, then narrowed: its rows now list blocks outside the window.
  Chunks c = crisp_test::make_chunks(test_seed(3), {1300}, {{0, 1300, 1300}});
  crisp::Plan plan = crisp::plan(c.q_view(), c.k_view(), config_of("dense", 64, 1000), c.batch());
  plan.config.window = 100;
  try {
    plan.check_well_formed();
    ADD_FAILURE() << "a plan listing blocks outside its window passed check_well_formed";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the window"), std::string::npos) << e.what();
  }
  Outputs o(crisp::DType::f32, c.hq, c.q_tokens(), c.d);
  EXPECT_THROW(crisp::attend(c.q_view(), c.k_view(), c.v_view(), plan, o.out(), o.lse()), crisp::Error);
}

}  // namespace
