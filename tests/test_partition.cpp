// tests/test_partition.cpp — context-parallel partitioning (crisp/context_parallel.h,
// src/plan/partition.h) on the CPU: every query block owned exactly once, local token layout,
// assembly of gathered slices, zig-zag balance, plans restricted to a rank's rows, and a
// multi-threaded simulation of the sharded prefill in which NCCL's all-gather is replaced by an
// in-memory test double (this file only) and the CPU backend does the planning and attention.
// The sharded output must equal the single-device output bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "crisp/context_parallel.h"
#include "crisp/crisp.h"
#include "crisp/workload.h"
#include "plan/partition.h"
#include "plan/shard_copy.h"
#include "plan/rules.h"
#include "test_util.h"

using crisp::partition::copy_shard_tokens;

namespace {

using crisp::CpPartition;

const CpPartition kPartitions[] = {CpPartition::contiguous, CpPartition::zigzag};

int32_t code_of(CpPartition p) {
  return p == CpPartition::zigzag ? crisp::partition::kZigzag : crisp::partition::kContiguous;
}

TEST(Partition, EveryQueryBlockIsOwnedExactlyOnceAndLocalTokensArePacked) {
  for (const CpPartition partition : kPartitions)
    for (const int block : {64, 128})
      for (const int world : {1, 2, 3, 4, 8})
        for (const int64_t n : {int64_t{2048} * 16, int64_t{40000}, int64_t{16 * 128 + 1}, int64_t{128 * 16 - 5}}) {
          const int32_t N = crisp::rules::num_blocks(n, block);
          const int32_t chunks = crisp::partition::num_chunks(code_of(partition), world);
          if (N < chunks) continue;
          SCOPED_TRACE(std::string(crisp::to_string(partition)) + " B=" + std::to_string(block) +
                       " world=" + std::to_string(world) + " n=" + std::to_string(n));
          std::vector<int> owner_count(static_cast<std::size_t>(N), 0);
          int64_t tokens = 0;
          for (int rank = 0; rank < world; ++rank) {
            const crisp::CpShard shard = crisp::cp_shard(n, block, partition, rank, world);
            ASSERT_EQ(shard.ranges.size(), partition == CpPartition::zigzag ? 2u : 1u);
            int64_t local = 0;
            for (const crisp::CpRange& r : shard.ranges) {
              EXPECT_LT(r.first_block, r.end_block) << "every chunk holds at least one block";
              EXPECT_EQ(r.local_token, local) << "chunks are back to back in local order";
              EXPECT_EQ(r.token_begin, int64_t{r.first_block} * block);
              EXPECT_EQ(r.token_end, std::min<int64_t>(int64_t{r.end_block} * block, n));
              for (int32_t b = r.first_block; b < r.end_block; ++b) {
                EXPECT_EQ(crisp::partition::block_owner(code_of(partition), world, b, N), rank);
                EXPECT_EQ(crisp::partition::block_local_token(code_of(partition), world, b, N, block, n),
                          local + (int64_t{b} * block - r.token_begin));
              }
              local += r.token_end - r.token_begin;
            }
            EXPECT_EQ(shard.local_tokens, local);
            EXPECT_LE(local, crisp::cp_max_local_tokens(n, block, partition, world));
            tokens += local;
            for (const int32_t b : shard.query_blocks()) ++owner_count[static_cast<std::size_t>(b)];
          }
          EXPECT_EQ(tokens, n);
          EXPECT_TRUE(std::all_of(owner_count.begin(), owner_count.end(), [](int c) { return c == 1; }));
          // The assembly segments cover [0, n) once, in order, and match the shards.
          int64_t next = 0;
          for (const crisp::CpAssemblySegment& s : crisp::cp_assembly_segments(n, block, partition, world)) {
            EXPECT_EQ(s.token, next);
            EXPECT_GT(s.tokens, 0);
            const crisp::CpShard shard = crisp::cp_shard(n, block, partition, s.rank, world);
            const bool found = std::any_of(shard.ranges.begin(), shard.ranges.end(), [&](const crisp::CpRange& r) {
              return r.token_begin == s.token && r.token_end == s.token + s.tokens && r.local_token == s.local_token;
            });
            EXPECT_TRUE(found) << "segment at token " << s.token << " is not a chunk of rank " << s.rank;
            next = s.token + s.tokens;
          }
          EXPECT_EQ(next, n);
        }
}

TEST(Partition, ZigzagBalancesCausalWorkAndContiguousDoesNot) {
  const int block = 128;
  for (const int world : {2, 4, 8}) {
    // N a multiple of 2R: the zig-zag pairs give every rank exactly the same causal block count.
    const int64_t n = int64_t{block} * 2 * world * 37;
    const auto zig = crisp::cp_causal_blocks_per_rank(n, block, CpPartition::zigzag, world);
    const auto con = crisp::cp_causal_blocks_per_rank(n, block, CpPartition::contiguous, world);
    const int32_t N = crisp::rules::num_blocks(n, block);
    EXPECT_EQ(std::accumulate(zig.begin(), zig.end(), int64_t{0}), crisp::rules::causal_blocks(N));
    EXPECT_EQ(std::accumulate(con.begin(), con.end(), int64_t{0}), crisp::rules::causal_blocks(N));
    EXPECT_EQ(*std::min_element(zig.begin(), zig.end()), *std::max_element(zig.begin(), zig.end()));
    // Contiguous, m = N / R blocks per rank: rank i's rows each hold i m more key blocks than
    // rank 0's, so the last rank does (R - 1) m^2 more work than the first (~2R - 1 times as much).
    const int64_t m = N / world;
    EXPECT_EQ(con.back() - con.front(), (world - 1) * m * m);
    // N not a multiple of 2R: chunk sizes differ by at most one block, and a block costs at most
    // N key blocks, so ranks (two chunks each) differ by at most 2N (contiguous: m^2).
    const int64_t odd = int64_t{block} * (2 * world * 37 + 3) - 17;
    const int32_t N_odd = crisp::rules::num_blocks(odd, block);
    const auto zig_odd = crisp::cp_causal_blocks_per_rank(odd, block, CpPartition::zigzag, world);
    const int64_t lo = *std::min_element(zig_odd.begin(), zig_odd.end());
    const int64_t hi = *std::max_element(zig_odd.begin(), zig_odd.end());
    EXPECT_LE(hi - lo, 2 * int64_t{N_odd}) << "world " << world;
  }
}

TEST(Partition, BadArgumentsNameTheArgument) {
  const auto expect_error = [](const char* argument, auto fn) {
    try {
      fn();
      ADD_FAILURE() << "no crisp::Error for " << argument;
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  expect_error("world", [] { crisp::cp_shard(4096, 128, CpPartition::contiguous, 0, 0); });
  expect_error("rank", [] { crisp::cp_shard(4096, 128, CpPartition::contiguous, 2, 2); });
  expect_error("rank", [] { crisp::cp_shard(4096, 128, CpPartition::zigzag, -1, 2); });
  expect_error("n", [] { crisp::cp_shard(0, 128, CpPartition::contiguous, 0, 1); });
  // 3 blocks cannot fill the 4 chunks of a zig-zag over 2 ranks.
  expect_error("n", [] { crisp::cp_shard(3 * 128, 128, CpPartition::zigzag, 0, 2); });
  expect_error("block_size", [] { crisp::cp_shard(4096, 100, CpPartition::contiguous, 0, 1); });
  expect_error("partition", [] { crisp::cp_partition_from_string("ring"); });
  EXPECT_EQ(crisp::cp_partition_from_string("zigzag"), CpPartition::zigzag);
  EXPECT_EQ(crisp::cp_partition_from_string("contiguous"), CpPartition::contiguous);
}

// A workload small enough for the CPU backend, with both routes present.
crisp::Workload small_workload(int64_t n, uint64_t seed) {
  crisp::WorkloadSpec spec = crisp_test::workload_spec(4, 2, 32, {n}, seed);
  return crisp::make_workload(spec);
}

crisp::Options serial_options() {
  crisp::Options o;
  o.num_threads = 1;  // several simulated ranks run at once
  return o;
}

TEST(Partition, PlanRestrictedToARanksRowsKeepsThoseRowsExactly) {
  const uint64_t seed = crisp_test::test_seed();
  SCOPED_TRACE(crisp_test::seed_trace(seed));
  crisp::Workload w = small_workload(64 * 37 + 11, seed);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = 64;
  const crisp::Plan plan = crisp::plan(w.q_view(), w.k_view(), cfg, {}, serial_options());
  const int32_t N = plan.sequences[0].num_blocks;
  for (const CpPartition partition : kPartitions)
    for (const int world : {2, 3}) {
      const auto nnz = crisp::cp_plan_nnz_per_rank(plan, partition, world);
      int64_t total = 0;
      for (const auto& h : plan.sequences[0].heads) total += static_cast<int64_t>(h.col.size());
      EXPECT_EQ(std::accumulate(nnz.begin(), nnz.end(), int64_t{0}), total);
      for (int rank = 0; rank < world; ++rank) {
        const crisp::Plan mine = crisp::cp_rows_of_rank(plan, partition, rank, world);
        EXPECT_NO_THROW(mine.check_well_formed());
        int64_t mine_nnz = 0;
        for (std::size_t h = 0; h < plan.sequences[0].heads.size(); ++h) {
          const crisp::HeadPlan& full = plan.sequences[0].heads[h];
          const crisp::HeadPlan& part = mine.sequences[0].heads[h];
          EXPECT_EQ(part.route, full.route);
          for (int32_t r = 0; r < N; ++r) {
            const std::vector<int32_t> want_row(full.col.begin() + full.row_ptr[r], full.col.begin() + full.row_ptr[r + 1]);
            const std::vector<int32_t> got_row(part.col.begin() + part.row_ptr[r], part.col.begin() + part.row_ptr[r + 1]);
            if (crisp::partition::block_owner(code_of(partition), world, r, N) == rank) {
              EXPECT_EQ(got_row, want_row) << "head " << h << " row " << r;
              mine_nnz += static_cast<int64_t>(got_row.size());
            } else {
              // The least row of the head's own sets: anchors, verticals, slash cover (all for dense).
              std::vector<int32_t> least;
              for (int32_t kb = 0; kb <= r; ++kb) {
                const bool vertical = std::count(full.vertical.begin(), full.vertical.end(), kb) > 0;
                const int32_t dist = r - kb;
                const bool slash = std::count(full.slash.begin(), full.slash.end(), dist) > 0 ||
                                   (dist >= 1 && std::count(full.slash.begin(), full.slash.end(), dist - 1) > 0);
                if (full.route == crisp::Route::dense || kb == 0 || kb == r || vertical || slash) least.push_back(kb);
              }
              EXPECT_EQ(got_row, least) << "head " << h << " row " << r;
              EXPECT_LE(got_row.size(), want_row.size()) << "head " << h << " row " << r;
            }
          }
        }
        EXPECT_EQ(mine_nnz, nnz[static_cast<std::size_t>(rank)]);
      }
    }
}

// With a sliding window (§12) a rank's plan stays well formed: the rows it does not own hold the
// least row of the head's sets within the window (no block wholly before the row's first query's
// window), the rows it owns are the plan's.
TEST(Partition, PlanRestrictedToARanksRowsKeepsTheWindow) {
  const uint64_t seed = crisp_test::test_seed(1);
  SCOPED_TRACE(crisp_test::seed_trace(seed));
  crisp::Workload w = small_workload(64 * 37 + 11, seed);
  crisp::Config cfg = crisp::Config::from_preset("crisp");
  cfg.block_size = 64;
  cfg.window = 300;
  const crisp::Plan plan = crisp::plan(w.q_view(), w.k_view(), cfg, {}, serial_options());
  const int32_t N = plan.sequences[0].num_blocks;
  for (const CpPartition partition : kPartitions)
    for (const int world : {2, 3})
      for (int rank = 0; rank < world; ++rank) {
        const crisp::Plan mine = crisp::cp_rows_of_rank(plan, partition, rank, world);
        EXPECT_NO_THROW(mine.check_well_formed());
        for (std::size_t h = 0; h < plan.sequences[0].heads.size(); ++h) {
          const crisp::HeadPlan& part = mine.sequences[0].heads[h];
          for (int32_t r = 0; r < N; ++r) {
            const int64_t first_key = std::max<int64_t>(0, int64_t{64} * r - (cfg.window - 1));
            ASSERT_LT(part.row_ptr[r], part.row_ptr[r + 1]) << "head " << h << " row " << r;
            EXPECT_GE(part.col[part.row_ptr[r]], first_key / 64) << "head " << h << " row " << r;
            EXPECT_EQ(part.col[part.row_ptr[r + 1] - 1], r) << "head " << h << " row " << r;
          }
        }
      }
}

// ---------------------------------------------------------------- the sharded flow, simulated
// The test double of NCCL's all-gather: `world` threads each contribute `bytes` and receive every
// rank's contribution in rank order, after all have arrived (a reusable barrier).
class InMemoryAllGather {
 public:
  explicit InMemoryAllGather(int world) : world_(world), slots_(static_cast<std::size_t>(world)) {}

  void all_gather(int rank, const void* send, std::size_t bytes, void* receive) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    slots_[static_cast<std::size_t>(rank)].assign(static_cast<const unsigned char*>(send),
                                                  static_cast<const unsigned char*>(send) + bytes);
    if (++arrived_ == world_) {
      arrived_ = 0;
      gathered_.clear();
      for (const auto& s : slots_) gathered_.insert(gathered_.end(), s.begin(), s.end());
      ++generation_;
      copied_ = 0;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
    EXPECT_EQ(gathered_.size(), bytes * static_cast<std::size_t>(world_)) << "ranks sent different counts";
    std::memcpy(receive, gathered_.data(), std::min(gathered_.size(), bytes * static_cast<std::size_t>(world_)));
    // Nobody may start the next collective (and overwrite gathered_) before all have copied.
    if (++copied_ == world_) {
      cv_.notify_all();
    } else {
      const uint64_t done = generation_;
      cv_.wait(lock, [&] { return copied_ == world_ || generation_ != done; });
    }
  }

 private:
  int world_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::vector<unsigned char>> slots_;
  std::vector<unsigned char> gathered_;
  int arrived_ = 0;
  int copied_ = 0;
  uint64_t generation_ = 0;
};

// The padded slot layout of the all-gather, then the assembly through cp_assembly_segments: the
// same two steps as src/cuda/context_parallel.cu (cudaMemcpy2DAsync there, memcpy here).
std::vector<float> gather_full(InMemoryAllGather& comm, const std::vector<float>& local, int64_t heads, int64_t d,
                               const crisp::CpShard& shard, int64_t max_local) {
  std::vector<float> slot(static_cast<std::size_t>(heads * max_local * d), 0.0f);
  for (int64_t h = 0; h < heads; ++h)
    std::memcpy(&slot[static_cast<std::size_t>(h * max_local * d)], &local[static_cast<std::size_t>(h * shard.local_tokens * d)],
                static_cast<std::size_t>(shard.local_tokens * d) * sizeof(float));
  std::vector<float> received(slot.size() * static_cast<std::size_t>(shard.world));
  comm.all_gather(shard.rank, slot.data(), slot.size() * sizeof(float), received.data());
  std::vector<float> full(static_cast<std::size_t>(heads * shard.n * d));
  for (const crisp::CpAssemblySegment& s :
       crisp::cp_assembly_segments(shard.n, shard.block_size, shard.partition, shard.world))
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(&full[static_cast<std::size_t>((h * shard.n + s.token) * d)],
                  &received[slot.size() * static_cast<std::size_t>(s.rank) +
                            static_cast<std::size_t>((h * max_local + s.local_token) * d)],
                  static_cast<std::size_t>(s.tokens * d) * sizeof(float));
  return full;
}

struct RankResult {
  crisp::Plan plan;
  std::vector<float> out;  // [Hq, local_tokens, d]
  std::vector<float> lse;  // [Hq, local_tokens]
};

void expect_same_plan(const crisp::Plan& a, const crisp::Plan& b) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (std::size_t h = 0; h < a.sequences[0].heads.size(); ++h) {
    EXPECT_EQ(a.sequences[0].heads[h].route, b.sequences[0].heads[h].route) << "head " << h;
    EXPECT_EQ(a.sequences[0].heads[h].row_ptr, b.sequences[0].heads[h].row_ptr) << "head " << h;
    EXPECT_EQ(a.sequences[0].heads[h].col, b.sequences[0].heads[h].col) << "head " << h;
  }
}

TEST(Partition, ShardedPrefillWithAnInMemoryAllGatherEqualsTheSingleDeviceRunExactly) {
  const uint64_t seed = crisp_test::test_seed();
  SCOPED_TRACE(crisp_test::seed_trace(seed));
  const int block = 64;
  const int64_t n = int64_t{block} * 29 + 23;  // a partial last block
  crisp::Workload w = small_workload(n, seed);
  const int64_t Hq = w.spec.num_q_heads, Hkv = w.spec.num_kv_heads, d = w.spec.head_dim;

  for (const char* preset : {"crisp", "flexprefill"}) {
    crisp::Config cfg = crisp::Config::from_preset(preset);
    cfg.block_size = block;
    // The single-device run.
    crisp_test::Tensor3 out_ref(Hq, n, d);
    std::vector<float> lse_ref(static_cast<std::size_t>(Hq * n));
    const crisp::Plan plan_ref = crisp::prefill(w.q_view(), w.k_view(), w.v_view(), cfg, out_ref.view(),
                                                crisp::TensorView::contiguous2d(lse_ref.data(), crisp::DType::f32, Hq, n),
                                                {}, serial_options());
    for (const CpPartition partition : kPartitions)
      for (const int world : {2, 3}) {
        SCOPED_TRACE(std::string(preset) + " " + crisp::to_string(partition) + " world=" + std::to_string(world));
        InMemoryAllGather comm(world);
        const int64_t max_local = crisp::cp_max_local_tokens(n, block, partition, world);
        std::vector<RankResult> results(static_cast<std::size_t>(world));
        std::vector<std::thread> ranks;
        for (int rank = 0; rank < world; ++rank)
          ranks.emplace_back([&, rank] {
            const crisp::CpShard shard = crisp::cp_shard(n, block, partition, rank, world);
            // What this rank holds: its slices only.
            const std::vector<float> q_local = copy_shard_tokens(w.q, Hq, n, d, shard);
            const std::vector<float> k_local = copy_shard_tokens(w.k, Hkv, n, d, shard);
            const std::vector<float> v_local = copy_shard_tokens(w.v, Hkv, n, d, shard);
            std::vector<float> q = gather_full(comm, q_local, Hq, d, shard, max_local);
            std::vector<float> k = gather_full(comm, k_local, Hkv, d, shard, max_local);
            std::vector<float> v = gather_full(comm, v_local, Hkv, d, shard, max_local);
            const auto qv = crisp::TensorView::contiguous(q.data(), crisp::DType::f32, Hq, n, d);
            const auto kv = crisp::TensorView::contiguous(k.data(), crisp::DType::f32, Hkv, n, d);
            const auto vv = crisp::TensorView::contiguous(v.data(), crisp::DType::f32, Hkv, n, d);
            RankResult& res = results[static_cast<std::size_t>(rank)];
            res.plan = crisp::plan(qv, kv, cfg, {}, serial_options());
            // This rank's rows only (the CPU stand-in for the row-subset launch).
            const crisp::Plan mine = crisp::cp_rows_of_rank(res.plan, partition, rank, world);
            crisp_test::Tensor3 out_full(Hq, n, d);
            std::vector<float> lse_full(static_cast<std::size_t>(Hq * n));
            crisp::attend(qv, kv, vv, mine, out_full.view(),
                          crisp::TensorView::contiguous2d(lse_full.data(), crisp::DType::f32, Hq, n), serial_options());
            res.out = copy_shard_tokens(out_full.data, Hq, n, d, shard);
            res.lse = copy_shard_tokens(lse_full, Hq, n, 1, shard);
          });
        for (auto& t : ranks) t.join();

        // Every rank planned exactly the single-device plan.
        for (const RankResult& r : results) expect_same_plan(r.plan, plan_ref);
        // The ranks' slices, put back in place, are the single-device output bit for bit.
        std::vector<float> out(out_ref.data.size(), std::nanf("")), lse(lse_ref.size(), std::nanf(""));
        for (int rank = 0; rank < world; ++rank) {
          const crisp::CpShard shard = crisp::cp_shard(n, block, partition, rank, world);
          const RankResult& r = results[static_cast<std::size_t>(rank)];
          for (int64_t h = 0; h < Hq; ++h)
            for (const crisp::CpRange& range : shard.ranges)
              for (int64_t t = range.token_begin; t < range.token_end; ++t) {
                const int64_t lt = range.local_token + (t - range.token_begin);
                lse[static_cast<std::size_t>(h * n + t)] = r.lse[static_cast<std::size_t>(h * shard.local_tokens + lt)];
                for (int64_t x = 0; x < d; ++x)
                  out[static_cast<std::size_t>((h * n + t) * d + x)] =
                      r.out[static_cast<std::size_t>((h * shard.local_tokens + lt) * d + x)];
              }
        }
        EXPECT_EQ(0, std::memcmp(out.data(), out_ref.data.data(), out.size() * sizeof(float))) << "O differs";
        EXPECT_EQ(0, std::memcmp(lse.data(), lse_ref.data(), lse.size() * sizeof(float))) << "LSE differs";
      }
  }
}

}  // namespace
