// src/plan/partition.cpp — the host side of context-parallel partitioning (crisp/context_parallel.h):
// shards, work balance, assembly of gathered slices and plans restricted to a rank's rows. Every
// rule comes from src/plan/partition.h, which the CUDA path uses too.
#include <algorithm>
#include <string>
#include <vector>

#include "common/shape_rules.h"
#include "crisp/context_parallel.h"
#include "crisp/error.h"
#include "plan/partition.h"
#include "plan/rules.h"

namespace crisp {

namespace {

int32_t code_of(CpPartition p) {
  return p == CpPartition::zigzag ? partition::kZigzag : partition::kContiguous;
}

void check_partition_args(int64_t n, int block_size, CpPartition partition, int world) {
  if (partition != CpPartition::contiguous && partition != CpPartition::zigzag)
    throw Error("partition", "is not a named choice", "CpPartition::contiguous or CpPartition::zigzag");
  if (world < 1) throw Error("world", "is " + std::to_string(world), "at least 1 rank");
  if (n < 1) throw Error("n", "is " + std::to_string(n), "at least 1 token");
  if (n > shape_rules::kMaxTokens) throw Error("n", "is " + std::to_string(n), shape_rules::kMaxTokensExpected);
  if (!shape_rules::valid_block_size(block_size))
    throw Error("block_size", "is " + std::to_string(block_size), shape_rules::kBlockSizeExpected);
  const int32_t N = rules::num_blocks(n, block_size);
  const int32_t chunks = partition::num_chunks(code_of(partition), world);
  if (N < chunks)
    throw Error("n", "has " + std::to_string(N) + " query blocks of " + std::to_string(block_size) + " tokens",
                "at least " + std::to_string(chunks) + " (one per chunk of the " + to_string(partition) +
                    " partition over " + std::to_string(world) + " ranks)");
}

// One sequence only: context parallelism splits a single long sequence.
const SequencePlan& single_sequence(const Plan& plan) {
  if (plan.sequences.size() != 1)
    throw Error("plan", "has " + std::to_string(plan.sequences.size()) + " sequences", "exactly one");
  if (plan.sequences[0].n_q != plan.sequences[0].n_k)
    throw Error("plan", "holds a chunk (queries over a KV prefix)", "a whole prompt (context parallelism splits one prompt)");
  return plan.sequences[0];
}

}  // namespace

const char* to_string(CpPartition partition) {
  return partition == CpPartition::zigzag ? "zigzag" : "contiguous";
}

CpPartition cp_partition_from_string(const std::string& name) {
  if (name == "contiguous") return CpPartition::contiguous;
  if (name == "zigzag") return CpPartition::zigzag;
  throw Error("partition", "is \"" + name + "\"", "\"contiguous\" or \"zigzag\"");
}

std::vector<int32_t> CpShard::query_blocks() const {
  std::vector<int32_t> blocks;
  for (const CpRange& r : ranges)
    for (int32_t b = r.first_block; b < r.end_block; ++b) blocks.push_back(b);
  return blocks;
}

CpShard cp_shard(int64_t n, int block_size, CpPartition partition, int rank, int world) {
  check_partition_args(n, block_size, partition, world);
  if (rank < 0 || rank >= world)
    throw Error("rank", "is " + std::to_string(rank), "in [0, " + std::to_string(world) + ")");
  const int32_t code = code_of(partition);
  const int32_t N = rules::num_blocks(n, block_size);
  const int32_t chunks = partition::num_chunks(code, world);
  CpShard shard;
  shard.partition = partition;
  shard.rank = rank;
  shard.world = world;
  shard.n = n;
  shard.block_size = block_size;
  shard.num_blocks = N;
  for (int32_t j = 0; j < partition::chunks_per_rank(code); ++j) {
    CpRange r;
    r.chunk = partition::rank_chunk(code, world, rank, j);
    r.first_block = partition::chunk_block_begin(r.chunk, N, chunks);
    r.end_block = partition::chunk_block_begin(r.chunk + 1, N, chunks);
    r.token_begin = partition::chunk_token_begin(r.chunk, N, chunks, block_size, n);
    r.token_end = partition::chunk_token_end(r.chunk, N, chunks, block_size, n);
    r.local_token = partition::chunk_local_token_offset(code, world, r.chunk, N, block_size, n);
    shard.ranges.push_back(r);
  }
  shard.local_tokens = partition::rank_tokens(code, world, rank, N, block_size, n);
  return shard;
}

int64_t cp_max_local_tokens(int64_t n, int block_size, CpPartition partition, int world) {
  check_partition_args(n, block_size, partition, world);
  const int32_t N = rules::num_blocks(n, block_size);
  int64_t most = 0;
  for (int rank = 0; rank < world; ++rank)
    most = std::max(most, partition::rank_tokens(code_of(partition), world, rank, N, block_size, n));
  return most;
}

std::vector<int64_t> cp_causal_blocks_per_rank(int64_t n, int block_size, CpPartition partition, int world) {
  check_partition_args(n, block_size, partition, world);
  const int32_t N = rules::num_blocks(n, block_size);
  std::vector<int64_t> work(static_cast<std::size_t>(world), 0);
  for (int32_t r = 0; r < N; ++r) work[partition::block_owner(code_of(partition), world, r, N)] += r + 1;
  return work;
}

std::vector<int64_t> cp_plan_nnz_per_rank(const Plan& plan, CpPartition partition, int world) {
  const SequencePlan& seq = single_sequence(plan);
  check_partition_args(seq.n_k, plan.block_size, partition, world);
  std::vector<int64_t> work(static_cast<std::size_t>(world), 0);
  for (const HeadPlan& head : seq.heads) {
    if (head.row_ptr.size() != static_cast<std::size_t>(seq.num_blocks) + 1)
      throw Error("plan", "has a head whose row_ptr does not hold N + 1 entries", "a well-formed plan");
    for (int32_t r = 0; r < seq.num_blocks; ++r)
      work[partition::block_owner(code_of(partition), world, r, seq.num_blocks)] += head.row_ptr[r + 1] - head.row_ptr[r];
  }
  return work;
}

Plan cp_rows_of_rank(const Plan& plan, CpPartition partition, int rank, int world) {
  const SequencePlan& seq = single_sequence(plan);
  check_partition_args(seq.n_k, plan.block_size, partition, world);
  if (rank < 0 || rank >= world)
    throw Error("rank", "is " + std::to_string(rank), "in [0, " + std::to_string(world) + ")");
  plan.check_well_formed();
  Plan out = plan;
  SequencePlan& os = out.sequences[0];
  const int32_t N = seq.num_blocks;
  const int32_t cover = rules::code_of(plan.config.slash_cover);
  const std::vector<char> no_pe(static_cast<std::size_t>(N), 0);
  for (HeadPlan& head : os.heads) {
    // Flags of the head's own sets: the least row they imply is what a well-formed plan must hold.
    std::vector<char> vflag(static_cast<std::size_t>(N), 0), sflag(static_cast<std::size_t>(N), 0);
    for (const int32_t b : head.vertical) vflag[static_cast<std::size_t>(b)] = 1;
    for (const int32_t c : head.slash) sflag[static_cast<std::size_t>(c)] = 1;
    std::vector<int32_t> row_ptr{0}, col;
    for (int32_t r = 0; r < N; ++r) {
      if (partition::block_owner(code_of(partition), world, r, N) == rank) {
        col.insert(col.end(), head.col.begin() + head.row_ptr[r], head.col.begin() + head.row_ptr[r + 1]);
      } else {  // the least row the head's sets imply, within the window (§12)
        const int32_t first_kb = rules::window_first_block(r, plan.block_size, seq.n_k, seq.n_q, plan.config.window);
        for (int32_t kb = first_kb; kb <= r; ++kb)
          if (head.route == Route::dense || rules::layout_has_block(r, kb, vflag, sflag, no_pe, cover))
            col.push_back(kb);
      }
      row_ptr.push_back(static_cast<int32_t>(col.size()));
    }
    head.row_ptr = std::move(row_ptr);
    head.col = std::move(col);
    head.density = rules::density(static_cast<int64_t>(head.col.size()), N);
  }
  return out;
}

std::vector<CpAssemblySegment> cp_assembly_segments(int64_t n, int block_size, CpPartition partition, int world) {
  check_partition_args(n, block_size, partition, world);
  const int32_t code = code_of(partition);
  const int32_t N = rules::num_blocks(n, block_size);
  const int32_t chunks = partition::num_chunks(code, world);
  std::vector<CpAssemblySegment> segments;
  for (int32_t c = 0; c < chunks; ++c) {
    CpAssemblySegment s;
    s.rank = partition::chunk_owner(code, world, c);
    s.local_token = partition::chunk_local_token_offset(code, world, c, N, block_size, n);
    s.token = partition::chunk_token_begin(c, N, chunks, block_size, n);
    s.tokens = partition::chunk_token_end(c, N, chunks, block_size, n) - s.token;
    segments.push_back(s);
  }
  return segments;
}

}  // namespace crisp
