// tests/test_chunked.cpp — queries over a KV prefix (chunked prefill, decode steps) and paged K/V
// (docs/spec.md §11) on the CPU backend, against the independent float64 oracle (tests/oracle.h):
//  - attention: the dense plan against bottom-right causal dense attention, sparse plans against
//    the oracle's attention on the same plan, every output element written;
//  - plans: every preset's plan of a chunk equals the oracle's; the rows of a chunk that holds the
//    last >= B queries of a prompt are the prompt's own rows where §11 says so;
//  - paged K/V: shuffled, shared pages give bit-identical plans and outputs to contiguous K/V
//    (crisp::plan / attend / prefill and crisp::Attention);
//  - varlen batches mixing all of these, each sequence checked against its own reference.
// Inputs are the structured workload (sinks, local windows, slashes, needles) cut into chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "chunk_reference.h"
#include "chunk_util.h"
#include "common/kv_rows.h"
#include "crisp/crisp.h"
#include "oracle.h"
#include "test_util.h"

namespace {

using crisp_test::ChunkSeq;
using crisp_test::expect_outputs_match;
using crisp_test::name_of;
using crisp_test::options_of;
using crisp_test::output_tolerance;
using crisp_test::Reference;
using crisp_test::run_attend;
using crisp_test::Chunks;
using crisp_test::Outputs;
using crisp_test::seed_trace;
using crisp_test::test_seed;

// NOTE: prompt lengths of the single-sequence cases: 1300 is no multiple of 64 or 128 (a partial
// last block) and above every preset's min_budget (flexprefill's 1024), so all three presets plan
// sparse; 1280 is a whole number of blocks of both sizes.
constexpr int64_t kPrompt = 1300;
constexpr int64_t kAlignedPrompt = 1280;

// n_q of the single-sequence cases: a decode step, fewer than a block, one block, an unaligned
// chunk (its first row starts mid-block at both block sizes), the whole prompt.
std::vector<int64_t> query_counts(int block) { return {1, 50, block, 200, kPrompt}; }

// ---------------------------------------------------------------- plans against the oracle
// Tallies of one comparison, so a test can assert that it compared both routes.
struct Tally {
  int heads = 0, vs = 0, pe = 0, dense = 0, fragile_skipped = 0;
};

std::string join(const std::vector<int32_t>& x) {
  std::ostringstream os;
  os << "{";
  for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
  return os.str() + "}";
}

// The shape of each sequence (§11) and, head by head, the oracle's route, statistics, VS choices
// and CSR. float32 plans skip the heads the oracle marks fragile (within 1e-5 of flipping).
void expect_plan_matches_oracle(const crisp::Plan& plan, const Chunks& c, const crisp::Config& cfg,
                                crisp::Precision precision, Tally& tally, const std::string& context) {
  const bool f32 = precision == crisp::Precision::f32;
  // NOTE: the tolerances of tests/test_plan_oracle.cpp, for the same reasons: float32 logits
  // round at ~1e-6 relative; c_struct sums masses; jsd = sqrt(x) amplifies errors near 0.
  const double fragile_tol = f32 ? 1e-5 : 1e-12;
  const double c_tol = f32 ? 1e-5 : 1e-9, j_tol = f32 ? 1e-4 : 1e-9;
  oracle::Planner op(c.q, c.k, c.hq, c.hkv, c.q_tokens(), c.kv_tokens(), c.d, c.cu_q, c.cu_k);
  const auto ref = op.plan(cfg, fragile_tol);
  ASSERT_EQ(plan.sequences.size(), ref.size()) << context;
  for (size_t s = 0; s < ref.size(); ++s) {
    const crisp::SequencePlan& sp = plan.sequences[s];
    const ChunkSeq& seq = c.seqs[s];
    const int B = plan.block_size;
    EXPECT_EQ(sp.q_offset, c.cu_q[s]) << context;
    EXPECT_EQ(sp.n_q, seq.n_q) << context;
    EXPECT_EQ(sp.kv_offset, c.cu_k[s]) << context;
    EXPECT_EQ(sp.n_k, seq.n_k) << context;
    EXPECT_EQ(sp.num_blocks, (seq.n_k + B - 1) / B) << context;
    EXPECT_EQ(sp.first_row, (seq.n_k - seq.n_q) / B) << context;
    ASSERT_EQ(sp.heads.size(), ref[s].size()) << context;
    for (size_t h = 0; h < ref[s].size(); ++h) {
      const crisp::HeadPlan& got = sp.heads[h];
      const oracle::HeadResult& want = ref[s][h];
      std::ostringstream where;
      where << context << "\n  sequence " << s << " (n_q " << seq.n_q << " of n_k " << seq.n_k << ") head " << h;
      ++tally.heads;
      // Rows before first_row hold no query: empty, whatever the route.
      for (int32_t r = 0; r < sp.first_row && static_cast<size_t>(r + 1) < got.row_ptr.size(); ++r)
        EXPECT_EQ(got.row_ptr[r + 1], got.row_ptr[r]) << where.str() << " row " << r << " < first_row is not empty";
      if (f32 && !want.fragile.empty()) {
        ++tally.fragile_skipped;
        continue;
      }
      tally.vs += want.route == crisp::Route::vs;
      tally.pe += want.route == crisp::Route::pe;
      tally.dense += want.route == crisp::Route::dense;
      std::string fragile_note;
      for (const auto& f : want.fragile) fragile_note += "\n  oracle marks fragile: " + f;
      EXPECT_EQ(crisp::to_string(got.route), std::string(crisp::to_string(want.route)))
          << where.str() << " c_struct=" << want.c_struct << fragile_note;
      if (want.route != crisp::Route::dense) {
        EXPECT_NEAR(got.c_struct, want.c_struct, c_tol) << where.str();
        if (cfg.routing == crisp::Routing::jsd) EXPECT_NEAR(got.jsd, want.jsd, j_tol) << where.str();
      }
      EXPECT_EQ(join(got.vertical), join(want.vertical)) << where.str() << " (vertical)" << fragile_note;
      EXPECT_EQ(join(got.slash), join(want.slash)) << where.str() << " (slash)" << fragile_note;
      EXPECT_EQ(join(got.row_ptr), join(want.row_ptr)) << where.str() << " (row_ptr)" << fragile_note;
      EXPECT_EQ(join(got.col), join(want.col)) << where.str() << " (col)" << fragile_note;
      EXPECT_NEAR(got.density, want.density, 1e-12) << where.str();
      if (::testing::Test::HasFailure()) return;  // one detailed failure is enough
    }
  }
}

// The presets and the options that change what a chunk's PE rows read: PE forced (global
// coverage over the chunk's rows), the PE row floor, and JSD routing (the mean proxy query).
std::vector<std::pair<std::string, std::vector<std::string>>> plan_configs() {
  return {{"crisp", {}},
          {"flexprefill", {}},
          {"minference", {}},
          {"dense", {}},
          {"crisp", {"routing=cstruct", "tau_proxy=0.99", "pe_rule=coverage"}},
          {"crisp", {"routing=cstruct", "tau_proxy=0.99", "pe_rule=floor"}},
          {"crisp", {"routing=jsd", "vs_budget=cumulative"}}};
}

crisp::Config config_of(const std::pair<std::string, std::vector<std::string>>& entry, int block) {
  crisp::Config cfg = crisp::Config::from_preset(entry.first);
  for (const auto& kv : entry.second) cfg.set(kv);
  cfg.block_size = block;
  return cfg;
}

std::string describe(const crisp::Config& cfg) {
  std::ostringstream os;
  os << "preset=" << cfg.preset;
  for (const auto& kv : cfg.to_key_values()) os << " " << kv.first << "=" << kv.second;
  return os.str();
}

// ---------------------------------------------------------------- exact plan equality
bool same_double(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same_plan(const crisp::Plan& a, const crisp::Plan& b, const std::string& context) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size()) << context;
  EXPECT_EQ(a.block_size, b.block_size) << context;
  EXPECT_TRUE(same_double(a.softmax_scale, b.softmax_scale)) << context;
  for (size_t s = 0; s < a.sequences.size(); ++s) {
    const crisp::SequencePlan &x = a.sequences[s], &y = b.sequences[s];
    EXPECT_EQ(crisp_test::shape_of(x), crisp_test::shape_of(y)) << context << " sequence " << s;
    ASSERT_EQ(x.heads.size(), y.heads.size()) << context;
    for (size_t h = 0; h < x.heads.size(); ++h) {
      const crisp::HeadPlan &p = x.heads[h], &q = y.heads[h];
      const std::string where = context + " sequence " + std::to_string(s) + " head " + std::to_string(h);
      EXPECT_EQ(p.route, q.route) << where;
      EXPECT_TRUE(same_double(p.c_struct, q.c_struct)) << where << " c_struct " << p.c_struct << " vs " << q.c_struct;
      EXPECT_TRUE(same_double(p.jsd, q.jsd)) << where << " jsd " << p.jsd << " vs " << q.jsd;
      EXPECT_EQ(p.vertical, q.vertical) << where;
      EXPECT_EQ(p.slash, q.slash) << where;
      EXPECT_EQ(p.row_ptr, q.row_ptr) << where;
      EXPECT_EQ(p.col, q.col) << where;
      EXPECT_TRUE(same_double(p.density, q.density)) << where;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- attention

// The dense plan of a chunk is bottom-right causal attention: query i at position n_k - n_q + i
// sees keys 0 .. n_k - n_q + i.
TEST(ChunkedAttention, DensePlanMatchesBottomRightCausalReference) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  for (int block : {64, 128}) {
    for (int64_t n_q : query_counts(block)) {
      Chunks c = crisp_test::make_chunks(seed, {kPrompt}, {{0, kPrompt, n_q}});
      const Reference ref(c);
      const crisp::Plan plan = crisp::dense_plan(c.hq, c.hkv, c.d, c.batch(), block);
      const oracle::Attention want = ref.dense(block, plan.softmax_scale);
      for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32}) {
        const std::string context = std::string(name_of(precision)) + " B=" + std::to_string(block) +
                                    crisp_test::describe(c.seqs);
        expect_outputs_match(run_attend(c, plan, precision), want, output_tolerance(precision), context);
        // The dense preset through crisp::prefill is the same attention.
        Outputs o(crisp::DType::f64, c.hq, c.q_tokens(), c.d);
        crisp::Config dense = crisp::Config::from_preset("dense");
        dense.block_size = block;
        crisp::prefill(c.q_view(), c.k_view(), c.v_view(), dense, o.out(), o.lse(), c.batch(), options_of(precision));
        expect_outputs_match(o, want, output_tolerance(precision), context + " (prefill, dense preset)");
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Sparse plans of a chunk run exactly their layout: the oracle's attention restricted to the same
// plan's blocks, with the position mask on the diagonal block (mid-block in the first row).
TEST(ChunkedAttention, SparsePlansMatchOracleAttentionOnTheSamePlan) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  int sparse_heads = 0;
  for (int block : {64, 128}) {
    for (int64_t n_q : query_counts(block)) {
      Chunks c = crisp_test::make_chunks(seed, {kPrompt}, {{0, kPrompt, n_q}});
      const Reference ref(c);
      for (const char* preset : {"crisp", "flexprefill", "minference"}) {
        for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32}) {
          crisp::Config cfg = crisp::Config::from_preset(preset);
          cfg.block_size = block;
          const crisp::Plan plan = crisp::plan(c.q_view(), c.k_view(), cfg, c.batch(), options_of(precision));
          for (const auto& hp : plan.sequences[0].heads) sparse_heads += hp.density < 1.0;
          const std::string context = std::string(preset) + " " + name_of(precision) + " B=" + std::to_string(block) +
                                      crisp_test::describe(c.seqs);
          expect_outputs_match(run_attend(c, plan, precision), ref.on_plan(plan), output_tolerance(precision), context);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
  EXPECT_GT(sparse_heads, 0) << "no head was planned sparse: the test compared dense attention only";
}

// ---------------------------------------------------------------- plans

TEST(ChunkedPlan, MatchesOracleForEveryPreset) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Tally tally;
  for (int block : {64, 128}) {
    for (int64_t n_q : query_counts(block)) {
      Chunks c = crisp_test::make_chunks(seed, {kPrompt}, {{0, kPrompt, n_q}});
      for (const auto& entry : plan_configs()) {
        const crisp::Config cfg = config_of(entry, block);
        for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32}) {
          const crisp::Plan plan = crisp::plan(c.q_view(), c.k_view(), cfg, c.batch(), options_of(precision));
          EXPECT_NO_THROW(plan.check_well_formed());
          expect_plan_matches_oracle(plan, c, cfg, precision, tally,
                                     describe(cfg) + " " + name_of(precision) + crisp_test::describe(c.seqs));
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
  std::cout << "[ compared ] heads=" << tally.heads << " vs=" << tally.vs << " pe=" << tally.pe
            << " dense=" << tally.dense << " fragile_skipped=" << tally.fragile_skipped << "\n";
  EXPECT_GT(tally.vs, 0);
  EXPECT_GT(tally.pe, 0);
  EXPECT_GT(tally.dense, 0);
  EXPECT_LE(tally.fragile_skipped * 20, tally.heads) << "too many float32 knife edges skipped";
}

// §11: "For a chunk at the end of a prompt (n_q >= B) the plan's rows equal the rows first_row ..
// of the whole prompt's plan when the proxy rows are the same (the last B queries are in the
// chunk), except where PE's global coverage target differs". So, with n_q >= B:
//  - every head has the prompt's route and statistics (the same proxy rows and keys);
//  - VS and dense heads: the same verticals and slashes, and rows first_row .. N-1 equal;
//  - PE heads under the row floor (no global target): rows whose block means are the prompt's
//    (every row after first_row, and first_row itself when it starts at its block's start) equal.
// PE heads under global coverage may differ (another target) and are not compared.
// §11 states the promise for a full last block (n_k = 1280 here); a partial one (n_k = 1300) reads
// the same proxy positions n_k - B .. n_k - 1 by §1 and §11's rules, so it is held to it too.
TEST(ChunkedPlan, LastChunkOfAtLeastBQueriesKeepsThePromptsRows) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  int vs_rows = 0, pe_rows = 0;
  for (int64_t n_k : {kAlignedPrompt, kPrompt}) {
    for (int block : {64, 128}) {
      for (int64_t n_q : {static_cast<int64_t>(block), int64_t{200}, int64_t{704}}) {
        Chunks c = crisp_test::make_chunks(seed, {n_k}, {{0, n_k, n_q}, {0, n_k, n_k}});
        for (const auto& entry : plan_configs()) {
          const crisp::Config cfg = config_of(entry, block);
          const bool row_floor = cfg.pe_rule == crisp::PeRule::floor;
          const crisp::Plan plan = crisp::plan(c.q_view(), c.k_view(), cfg, c.batch(), options_of(crisp::Precision::f64));
          const crisp::SequencePlan &chunk = plan.sequences[0], &prompt = plan.sequences[1];
          const int32_t first = chunk.first_row;
          const bool aligned_first_row = (n_k - n_q) % block == 0;
          for (size_t h = 0; h < chunk.heads.size(); ++h) {
            const crisp::HeadPlan &a = chunk.heads[h], &b = prompt.heads[h];
            const std::string where = describe(cfg) + " n_k " + std::to_string(n_k) + " n_q " + std::to_string(n_q) +
                                      " head " + std::to_string(h);
            ASSERT_EQ(a.route, b.route) << where;
            if (a.route != crisp::Route::dense) {
              EXPECT_NEAR(a.c_struct, b.c_struct, 1e-12) << where;
              if (cfg.routing == crisp::Routing::jsd) EXPECT_NEAR(a.jsd, b.jsd, 1e-12) << where;
            }
            EXPECT_EQ(a.vertical, b.vertical) << where;
            EXPECT_EQ(a.slash, b.slash) << where;
            int32_t from = first;
            if (a.route == crisp::Route::pe) {
              if (!row_floor) continue;
              if (!aligned_first_row) from = first + 1;
            }
            for (int32_t r = from; r < chunk.num_blocks; ++r) {
              const std::vector<int32_t> ra(a.col.begin() + a.row_ptr[r], a.col.begin() + a.row_ptr[r + 1]);
              const std::vector<int32_t> rb(b.col.begin() + b.row_ptr[r], b.col.begin() + b.row_ptr[r + 1]);
              EXPECT_EQ(join(ra), join(rb)) << where << " row " << r << " (first_row " << first << ")";
              (a.route == crisp::Route::pe ? pe_rows : vs_rows) += 1;
            }
            if (::testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_GT(vs_rows, 0);
  EXPECT_GT(pe_rows, 0);
}

// ---------------------------------------------------------------- paged K/V

namespace {

// A varlen batch mixing every kind of sequence: a whole prompt, an unaligned chunk, decode steps,
// fewer than a block of queries, one block, and sequences shorter than a page (prompt 3). Prompts
// 0 to 3 each serve two sequences, whose pages are then shared.
std::vector<ChunkSeq> mixed_sequences() {
  return {{0, kPrompt, kPrompt}, {0, 1000, 200}, {1, 1100, 1}, {1, 700, 50}, {2, 1280, 128},
          {2, 300, 300},         {3, 40, 40},    {3, 9, 1}};
}
const std::vector<int64_t> kMixedPrompts = {kPrompt, 1100, 1280, 40};

}  // namespace

// The same keys in shuffled, shared pages of any size plan and attend bit-identically to
// contiguous K/V: crisp::plan + attend, crisp::prefill, crisp::Attention, and a plan made on one
// layout run on the other.
TEST(PagedKv, BitIdenticalToContiguousForEveryPageSize) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Chunks c = crisp_test::make_chunks(seed, kMixedPrompts, mixed_sequences());
  for (crisp::Precision precision : {crisp::Precision::f32, crisp::Precision::f64}) {
    const crisp::Options opt = options_of(precision);
    const crisp::DType out_dtype = precision == crisp::Precision::f64 ? crisp::DType::f64 : crisp::DType::f32;
    for (const char* preset : {"crisp", "flexprefill"}) {
      crisp::Config cfg = crisp::Config::from_preset(preset);
      cfg.block_size = 64;
      const crisp::Plan contiguous_plan = crisp::plan(c.q_view(), c.k_view(), cfg, c.batch(), opt);
      const Outputs contiguous = run_attend(c, contiguous_plan, precision);
      for (int64_t page_size : {16, 64, 128, 256}) {
        crisp_test::PagedPool pool = crisp_test::make_pool(c, page_size, seed + static_cast<uint64_t>(page_size));
        const crisp::BlockTable table = pool.block_table();
        const std::string context = std::string(preset) + " " + name_of(precision) + " page_size " +
                                    std::to_string(page_size);
        // plan + attend
        const crisp::Plan paged_plan = crisp::plan(c.q_view(), pool.k_view(), cfg, c.batch(table), opt);
        expect_same_plan(paged_plan, contiguous_plan, context + " (plan)");
        Outputs paged(out_dtype, c.hq, c.q_tokens(), c.d);
        crisp::attend(c.q_view(), pool.k_view(), pool.v_view(), paged_plan, paged.out(), paged.lse(), opt, table);
        EXPECT_TRUE(paged.same_bits(contiguous)) << context << " (attend)";
        // A plan made on contiguous K/V runs on the pages (the same positions, the same keys).
        Outputs crossed(out_dtype, c.hq, c.q_tokens(), c.d);
        crisp::attend(c.q_view(), pool.k_view(), pool.v_view(), contiguous_plan, crossed.out(), crossed.lse(), opt, table);
        EXPECT_TRUE(crossed.same_bits(contiguous)) << context << " (contiguous plan, paged attend)";
        // prefill
        Outputs prefilled(out_dtype, c.hq, c.q_tokens(), c.d);
        const crisp::Plan prefill_plan = crisp::prefill(c.q_view(), pool.k_view(), pool.v_view(), cfg, prefilled.out(),
                                                        prefilled.lse(), c.batch(table), opt);
        expect_same_plan(prefill_plan, contiguous_plan, context + " (prefill)");
        EXPECT_TRUE(prefilled.same_bits(contiguous)) << context << " (prefill)";
        // crisp::Attention keeps the table for run().
        crisp::Attention attention(cfg, opt);
        attention.plan(c.q_view(), pool.k_view(), c.batch(table));
        expect_same_plan(attention.host_plan(), contiguous_plan, context + " (Attention)");
        Outputs object(out_dtype, c.hq, c.q_tokens(), c.d);
        attention.run(c.q_view(), pool.k_view(), pool.v_view(), object.out(), object.lse());
        EXPECT_TRUE(object.same_bits(contiguous)) << context << " (Attention::run)";
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// The Hopper producer's page index and row (shift and mask for a power-of-two page, a division
// otherwise) are the rule's j / page_size and j % page_size for every multiple of 16 up to 4096.
TEST(PagedKv, PageOfAndRowInPageAreTheDivision) {
  EXPECT_EQ(crisp::kv_rows::page_shift(16), 4);
  EXPECT_EQ(crisp::kv_rows::page_shift(4096), 12);
  EXPECT_EQ(crisp::kv_rows::page_shift(48), -1);
  EXPECT_EQ(crisp::kv_rows::page_shift(0), -1);
  for (int32_t page_size = 16; page_size <= 4096; page_size += 16) {
    const int32_t shift = crisp::kv_rows::page_shift(page_size);
    EXPECT_EQ(shift >= 0, (page_size & (page_size - 1)) == 0) << page_size;
    for (const int32_t j : {0, 1, page_size - 1, page_size, page_size + 7, 3 * page_size + 15, 131071, 1 << 30,
                            std::numeric_limits<int32_t>::max()}) {
      ASSERT_EQ(crisp::kv_rows::page_of(j, page_size, shift), j / page_size) << page_size << " " << j;
      ASSERT_EQ(crisp::kv_rows::row_in_page(j, page_size, shift), j % page_size) << page_size << " " << j;
      ASSERT_EQ(crisp::kv_rows::paged_row(5, page_size, j),
                int64_t{5} * page_size + crisp::kv_rows::row_in_page(j, page_size, shift));
    }
  }
}

// ---------------------------------------------------------------- varlen batches

// A batch mixing whole prompts, chunks, a decode step and sequences sharing a prompt: the dense
// plan against each sequence's own bottom-right causal reference, and the crisp plan of each
// sequence against the oracle's plan and attention of that sequence alone.
TEST(ChunkedBatch, VarlenMixEachSequenceMatchesItsOwnReference) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Chunks batch = crisp_test::make_chunks(seed, kMixedPrompts, mixed_sequences());
  Tally tally;
  for (int block : {64, 128}) {
    for (crisp::Precision precision : {crisp::Precision::f64, crisp::Precision::f32}) {
      const crisp::Plan dense = crisp::dense_plan(batch.hq, batch.hkv, batch.d, batch.batch(), block);
      crisp::Config cfg = crisp::Config::from_preset("crisp");
      cfg.block_size = block;
      const crisp::Plan sparse = crisp::plan(batch.q_view(), batch.k_view(), cfg, batch.batch(), options_of(precision));
      const Outputs dense_out = run_attend(batch, dense, precision);
      const Outputs sparse_out = run_attend(batch, sparse, precision);
      for (size_t s = 0; s < batch.seqs.size(); ++s) {
        // The sequence alone, and the batch's outputs of its rows.
        Chunks one = crisp_test::make_chunks(seed, kMixedPrompts, {batch.seqs[s]});
        const Reference ref(one);
        crisp::Plan sparse_one = sparse;
        sparse_one.sequences = {sparse.sequences[s]};
        sparse_one.sequences[0].q_offset = 0;
        sparse_one.sequences[0].kv_offset = 0;
        const std::string context = std::string(name_of(precision)) + " B=" + std::to_string(block) + " sequence " +
                                    std::to_string(s) + crisp_test::describe(one.seqs);
        expect_plan_matches_oracle(sparse_one, one, cfg, precision, tally, context);
        auto rows_of = [&](const Outputs& all) {
          Outputs mine(all.dtype, one.hq, one.q_tokens(), one.d);
          for (int64_t h = 0; h < one.hq; ++h)
            for (int64_t i = 0; i < one.q_tokens(); ++i) {
              const size_t from = static_cast<size_t>(h * batch.q_tokens() + batch.cu_q[s] + i);
              const size_t to = static_cast<size_t>(h * one.q_tokens() + i);
              for (int64_t x = 0; x < one.d; ++x) {
                if (all.f64()) mine.out64[to * one.d + x] = all.out64[from * one.d + x];
                else mine.out32[to * one.d + x] = all.out32[from * one.d + x];
              }
              if (all.f64()) mine.lse64[to] = all.lse64[from];
              else mine.lse32[to] = all.lse32[from];
            }
          return mine;
        };
        expect_outputs_match(rows_of(dense_out), ref.dense(block, dense.softmax_scale), output_tolerance(precision),
                             context + " (dense)");
        expect_outputs_match(rows_of(sparse_out), ref.on_plan(sparse_one), output_tolerance(precision),
                             context + " (crisp)");
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  EXPECT_GT(tally.vs + tally.pe, 0) << "no sequence was planned sparse";
}

// A cache's pages that no sequence of the call reads (free pages, the tail of a sequence's last
// page) may hold anything, uninitialised memory reading as NaN included: they are not the call's
// input. Results stay bit-identical to contiguous K/V; a NaN in a key the call reads is refused,
// naming k or v and the pool row.
TEST(PagedKv, PagesNoSequenceReadsMayHoldAnything) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  Chunks c = crisp_test::make_chunks(seed, {300, 200}, {{0, 300, 100}, {1, 190, 64}, {1, 30, 1}});
  crisp_test::PagedPool pool = crisp_test::make_pool(c, 16, seed);
  // Pool rows read: rows j < n_k of each sequence's pages; everything else becomes NaN.
  std::vector<char> read(static_cast<size_t>(pool.num_pages * pool.page_size), 0);
  for (size_t s = 0; s < c.seqs.size(); ++s)
    for (int64_t j = 0; j < c.seqs[s].n_k; ++j)
      read[static_cast<size_t>(pool.table[s * pool.max_pages + j / pool.page_size] * pool.page_size +
                               j % pool.page_size)] = 1;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int64_t poisoned = 0;
  for (int64_t row = 0; row < pool.num_pages * pool.page_size; ++row) {
    if (read[static_cast<size_t>(row)]) continue;
    ++poisoned;
    for (int64_t x = 0; x < c.hkv * c.d; ++x) {
      pool.k[static_cast<size_t>(row * c.hkv * c.d + x)] = nan;
      pool.v[static_cast<size_t>(row * c.hkv * c.d + x)] = nan;
    }
  }
  ASSERT_GT(poisoned, pool.page_size * crisp_test::kSparePages);  // spare pages and page tails
  const crisp::BlockTable table = pool.block_table();
  const crisp::Config cfg = crisp::Config::from_preset("crisp");
  const crisp::Options opt = options_of(crisp::Precision::f32);
  const crisp::Plan contiguous_plan = crisp::plan(c.q_view(), c.k_view(), cfg, c.batch(), opt);
  const Outputs contiguous = run_attend(c, contiguous_plan, crisp::Precision::f32);

  Outputs paged(crisp::DType::f32, c.hq, c.q_tokens(), c.d);
  crisp::Plan paged_plan;
  ASSERT_NO_THROW(paged_plan = crisp::plan(c.q_view(), pool.k_view(), cfg, c.batch(table), opt));
  expect_same_plan(paged_plan, contiguous_plan, "plan");
  ASSERT_NO_THROW(
      crisp::attend(c.q_view(), pool.k_view(), pool.v_view(), paged_plan, paged.out(), paged.lse(), opt, table));
  EXPECT_TRUE(paged.same_bits(contiguous)) << "attend";
  Outputs prefilled(crisp::DType::f32, c.hq, c.q_tokens(), c.d);
  ASSERT_NO_THROW(crisp::prefill(c.q_view(), pool.k_view(), pool.v_view(), cfg, prefilled.out(), prefilled.lse(),
                                 c.batch(table), opt));
  EXPECT_TRUE(prefilled.same_bits(contiguous)) << "prefill";
  crisp::Attention attention(cfg, opt);
  ASSERT_NO_THROW(attention.plan(c.q_view(), pool.k_view(), c.batch(table)));
  Outputs object(crisp::DType::f32, c.hq, c.q_tokens(), c.d);
  ASSERT_NO_THROW(attention.run(c.q_view(), pool.k_view(), pool.v_view(), object.out(), object.lse()));
  EXPECT_TRUE(object.same_bits(contiguous)) << "Attention::run";

  // A NaN in a key that is read: the last key of sequence 1 (position 189), kv head 1, dim 3.
  const int64_t row = pool.table[1 * pool.max_pages + 189 / pool.page_size] * pool.page_size + 189 % pool.page_size;
  for (std::vector<float>* x : {&pool.k, &pool.v}) {
    const float kept = (*x)[static_cast<size_t>((row * c.hkv + 1) * c.d + 3)];
    (*x)[static_cast<size_t>((row * c.hkv + 1) * c.d + 3)] = nan;
    const std::string name = x == &pool.k ? "k" : "v";
    const std::string at = "head 1, token " + std::to_string(row) + ", dim 3";
    try {
      crisp::prefill(c.q_view(), pool.k_view(), pool.v_view(), cfg, prefilled.out(), prefilled.lse(), c.batch(table), opt);
      ADD_FAILURE() << "a NaN in a read key of " << name << " was accepted";
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), name) << e.what();
      EXPECT_NE(std::string(e.what()).find(at), std::string::npos) << e.what() << " (expected the pool row " << at << ")";
    }
    (*x)[static_cast<size_t>((row * c.hkv + 1) * c.d + 3)] = kept;
  }
}
