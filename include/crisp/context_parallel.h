// crisp/context_parallel.h — context-parallel prefill of one long sequence over several GPUs
// (query sharding, NCCL). No CUDA or NCCL type appears here: every `void* stream` is a
// cudaStream_t and every `void* nccl_comm` an ncclComm_t.
//
// Flow of crisp::cuda::cp_prefill on rank i of R (one GPU each, one NCCL communicator):
//  1. the sequence's N = ceil(n/B) query blocks are partitioned over the ranks (contiguous or
//     zig-zag, CpPartition); rank i holds its slice of Q, K and V: the tokens of its query blocks,
//     in local order (CpShard::ranges), as [H, local_tokens, d];
//  2. Q, K and V are all-gathered with NCCL into full-length device buffers. Q is gathered whole
//     (not only the last query block and the block means of Q that the planner reads): it keeps
//     the planner unchanged and bitwise identical to the single-GPU run, at the price of moving
//     Q (Hq/Hkv times the size of K) once more;
//  3. every rank runs the same deterministic device planner (crisp::cuda::plan_async) on the full
//     Q and K, so all ranks hold the same plan as a single GPU would (the proxy map reads the
//     global last query block, owned by the last rank under either partition);
//  4. each rank runs the block-sparse attention for its own query blocks only and writes its
//     slice of O [Hq, local_tokens, d] and LSE [Hq, local_tokens].
// The result is the single-GPU result: the same kernel computes every row from the same data.
//
//   crisp::cuda::ContextParallelPrefill cp(Hq, Hkv, d, n, DType::bf16, cfg,
//                                          CpPartition::zigzag, rank, world, comm);
//   cp.run(q_local, k_local, v_local, out_local, lse_local, stream);   // any number of times
//
// Memory per rank: the gathered Q, K, V twice over (NCCL receive buffers, then the full-length
// [H, n, d] tensors) plus one DevicePlan (crisp/cuda.h) and the planner's workspace.
// One sequence per call (no varlen batch): run a batch sequence by sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crisp/config.h"
#include "crisp/cuda.h"
#include "crisp/error.h"
#include "crisp/plan.h"
#include "crisp/tensor.h"

namespace crisp {

// How query blocks are assigned to ranks (src/plan/partition.h has the exact rules).
enum class CpPartition {
  contiguous,  // R chunks; rank i owns chunk i (simple; the last rank has the most causal work)
  zigzag,      // 2R chunks; rank i owns chunks i and 2R-1-i (balanced causal work)
};
const char* to_string(CpPartition partition);
// "contiguous" or "zigzag"; throws crisp::Error naming "partition" otherwise.
CpPartition cp_partition_from_string(const std::string& name);

// One chunk of a rank: query blocks [first_block, end_block), tokens [token_begin, token_end) of
// the sequence, stored from local_token on in the rank's slice.
struct CpRange {
  int32_t chunk = 0;
  int32_t first_block = 0;
  int32_t end_block = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  int64_t local_token = 0;
};

// The share of one rank.
struct CpShard {
  CpPartition partition = CpPartition::contiguous;
  int rank = 0;
  int world = 1;
  int64_t n = 0;           // sequence length
  int block_size = 128;    // B
  int32_t num_blocks = 0;  // N
  std::vector<CpRange> ranges;  // in local order
  int64_t local_tokens = 0;     // sum of the ranges' tokens

  // The rank's query blocks in local order.
  std::vector<int32_t> query_blocks() const;
};

// The share of `rank`. Throws crisp::Error naming the argument when world < 1, rank outside
// [0, world), n < 1, block_size not 64/128, or the sequence has fewer query blocks than the
// partition has chunks (every chunk must hold at least one block).
CpShard cp_shard(int64_t n, int block_size, CpPartition partition, int rank, int world);
// The largest local token count over the ranks (the NCCL all-gather moves this many per rank).
int64_t cp_max_local_tokens(int64_t n, int block_size, CpPartition partition, int world);

// Work balance: per rank, the causal key blocks of its query blocks (sum of r + 1) ...
std::vector<int64_t> cp_causal_blocks_per_rank(int64_t n, int block_size, CpPartition partition, int world);
// ... or the computed blocks of a plan of one sequence (nnz of the rank's rows, summed over heads).
std::vector<int64_t> cp_plan_nnz_per_rank(const Plan& plan, CpPartition partition, int world);

// `plan` (one sequence) with the rows of `rank` kept exactly and every other row reduced to the
// least row the head's own sets imply (anchors {0, r}, its vertical blocks and slash cover, no PE
// entries; every causal block for a dense head), so the plan stays well formed. Running it
// computes the rank's rows as the full plan would (each row's attention depends on that row
// only). Used to run a rank's share on a backend without a row-subset launch (the CPU backend);
// densities are recomputed.
Plan cp_rows_of_rank(const Plan& plan, CpPartition partition, int rank, int world);

// How the all-gathered slices form the full sequence: `tokens` tokens of `rank`'s slice, from its
// local token `local_token` on, are the sequence's tokens from `token` on. The ranges of every
// rank, in chunk order; together they cover [0, n) exactly once.
struct CpAssemblySegment {
  int rank = 0;
  int64_t local_token = 0;
  int64_t token = 0;
  int64_t tokens = 0;
};
std::vector<CpAssemblySegment> cp_assembly_segments(int64_t n, int block_size, CpPartition partition, int world);

namespace cuda {

// True when the library was built with the CUDA backend and NCCL (CMake: CRISP_NCCL).
bool nccl_built();

// Context-parallel prefill of one sequence of n tokens on one rank (one GPU, the current CUDA
// device of the calling thread when constructed). Allocates its buffers once (cudaMalloc) for a
// shape; run() may then be called any number of times. Every rank of the communicator must
// construct it with the same shape, config and partition, and call run() the same number of
// times (NCCL collectives; a missing rank hangs the others, as with any collective).
class ContextParallelPrefill {
 public:
  // dtype: bf16 or f16; head_dim 64, 128 or 256; config validated; nccl_comm an ncclComm_t of `world`
  // ranks in which this one is `rank`. Throws crisp::Error naming the argument on bad input, or
  // "built without NCCL" when the library has no NCCL.
  ContextParallelPrefill(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, int64_t n, DType dtype,
                         const Config& config, CpPartition partition, int rank, int world, void* nccl_comm);
  ~ContextParallelPrefill();
  ContextParallelPrefill(ContextParallelPrefill&&) noexcept;
  ContextParallelPrefill& operator=(ContextParallelPrefill&&) noexcept;
  ContextParallelPrefill(const ContextParallelPrefill&) = delete;
  ContextParallelPrefill& operator=(const ContextParallelPrefill&) = delete;

  // q_local [Hq, local_tokens, d], k_local / v_local [Hkv, local_tokens, d] (the dtype given to
  // the constructor, on Device::cuda, rows packed: token stride = d, head stride >= local_tokens *
  // d); out_local [Hq, local_tokens, d] (same dtype, last dimension contiguous, 16-byte aligned
  // rows as for attend_async) and lse_local [Hq, local_tokens] f32. The current CUDA device must be
  // the one the object was made on. All enqueued on `stream`, no host synchronisation; throws
  // crisp::Error naming the argument before enqueuing anything when a view does not fit.
  void run(const TensorView& q_local, const TensorView& k_local, const TensorView& v_local,
           const TensorView& out_local, const TensorView& lse_local, void* stream = nullptr);

  const CpShard& shard() const;
  // The plan of the last run (the same on every rank, and the single-GPU plan).
  const DevicePlan& plan() const;
  // Full-length gathered tensors of the last run ([Hq, n, d] / [Hkv, n, d], on the device).
  TensorView gathered_q() const;
  TensorView gathered_k() const;
  TensorView gathered_v() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One-shot form: constructs a ContextParallelPrefill for these shapes, runs it, synchronises
// `stream` and frees its buffers. Prefer the class when calling repeatedly.
void cp_prefill(const TensorView& q_local, const TensorView& k_local, const TensorView& v_local,
                const Config& config, CpPartition partition, int rank, int world, void* nccl_comm,
                int64_t n, const TensorView& out_local, const TensorView& lse_local, void* stream = nullptr);

}  // namespace cuda
}  // namespace crisp
