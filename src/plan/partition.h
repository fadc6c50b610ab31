// src/plan/partition.h — context-parallel partitioning of one sequence's query blocks over R
// ranks: small, pure functions usable from host and device code (like rules.h), so the sharding
// logic is written once and tested on the CPU.
//
// The N = ceil(n/B) query blocks are cut into C contiguous chunks of near-equal block counts
// (chunk c = blocks [floor(c N / C), floor((c+1) N / C))):
//  - contiguous: C = R, rank i owns chunk i;
//  - zigzag:     C = 2R, rank i owns chunks i and 2R-1-i (load balance under the causal mask: an
//    early chunk, with few key blocks per row, pairs with a late one, with many).
// A rank's local tokens are its chunks' tokens in chunk order (chunk i first, then 2R-1-i), so
// its slice of Q/K/V/O/LSE is [H, local_tokens, ...] with the chunks back to back. Only the last
// block of the sequence can be partial (n not a multiple of B); it belongs to the last chunk.
#pragma once
#include <cstdint>

#include "plan/rules.h"

namespace crisp {
namespace partition {

// Partition codes (match crisp::CpPartition).
enum PartitionCode : int32_t { kContiguous = 0, kZigzag = 1 };

// Chunks of a partition over `world` ranks.
CRISP_HD int32_t num_chunks(int32_t code, int32_t world) { return code == kZigzag ? 2 * world : world; }
// Chunks each rank owns.
CRISP_HD int32_t chunks_per_rank(int32_t code) { return code == kZigzag ? 2 : 1; }
// The j-th chunk of `rank` (j < chunks_per_rank), in local order.
CRISP_HD int32_t rank_chunk(int32_t code, int32_t world, int32_t rank, int32_t j) {
  return (code == kZigzag && j == 1) ? 2 * world - 1 - rank : rank;
}
// First query block of chunk c (c == num_chunks gives N).
CRISP_HD int32_t chunk_block_begin(int32_t c, int32_t num_blocks, int32_t chunks) {
  return static_cast<int32_t>(static_cast<int64_t>(c) * num_blocks / chunks);
}
// Chunk holding query block b (0 <= b < N): the largest c with chunk_block_begin(c) <= b.
CRISP_HD int32_t chunk_of_block(int32_t b, int32_t num_blocks, int32_t chunks) {
  // floor((b+1) C / N) overshoots by at most one chunk; step back until the chunk starts <= b.
  int32_t c = static_cast<int32_t>((static_cast<int64_t>(b) + 1) * chunks / num_blocks);
  if (c > chunks - 1) c = chunks - 1;
  while (c > 0 && chunk_block_begin(c, num_blocks, chunks) > b) --c;
  return c;
}
// Owner rank of chunk c.
CRISP_HD int32_t chunk_owner(int32_t code, int32_t world, int32_t c) {
  return (code == kZigzag && c >= world) ? 2 * world - 1 - c : c;
}
// Local position (0 or 1) of chunk c among its owner's chunks.
CRISP_HD int32_t chunk_local_index(int32_t code, int32_t world, int32_t c) {
  return (code == kZigzag && c >= world) ? 1 : 0;
}
// Tokens of chunk c: [begin, end) of the sequence.
CRISP_HD int64_t chunk_token_begin(int32_t c, int32_t num_blocks, int32_t chunks, int32_t block, int64_t n) {
  const int64_t t = rules::block_begin(chunk_block_begin(c, num_blocks, chunks), block);
  return t < n ? t : n;
}
CRISP_HD int64_t chunk_token_end(int32_t c, int32_t num_blocks, int32_t chunks, int32_t block, int64_t n) {
  return chunk_token_begin(c + 1, num_blocks, chunks, block, n);
}
// Local token offset, on its owner, of the first token of chunk c.
CRISP_HD int64_t chunk_local_token_offset(int32_t code, int32_t world, int32_t c, int32_t num_blocks,
                                          int32_t block, int64_t n) {
  const int32_t chunks = num_chunks(code, world);
  if (chunk_local_index(code, world, c) == 0) return 0;
  const int32_t first = rank_chunk(code, world, chunk_owner(code, world, c), 0);
  return chunk_token_end(first, num_blocks, chunks, block, n) - chunk_token_begin(first, num_blocks, chunks, block, n);
}
// Tokens owned by `rank`.
CRISP_HD int64_t rank_tokens(int32_t code, int32_t world, int32_t rank, int32_t num_blocks, int32_t block,
                             int64_t n) {
  const int32_t chunks = num_chunks(code, world);
  int64_t total = 0;
  for (int32_t j = 0; j < chunks_per_rank(code); ++j) {
    const int32_t c = rank_chunk(code, world, rank, j);
    total += chunk_token_end(c, num_blocks, chunks, block, n) - chunk_token_begin(c, num_blocks, chunks, block, n);
  }
  return total;
}
// Owner rank of query block b.
CRISP_HD int32_t block_owner(int32_t code, int32_t world, int32_t b, int32_t num_blocks) {
  return chunk_owner(code, world, chunk_of_block(b, num_blocks, num_chunks(code, world)));
}
// Local token, on its owner, of the first query of block b.
CRISP_HD int64_t block_local_token(int32_t code, int32_t world, int32_t b, int32_t num_blocks, int32_t block,
                                   int64_t n) {
  const int32_t chunks = num_chunks(code, world);
  const int32_t c = chunk_of_block(b, num_blocks, chunks);
  return chunk_local_token_offset(code, world, c, num_blocks, block, n) +
         (rules::block_begin(b, block) - chunk_token_begin(c, num_blocks, chunks, block, n));
}

}  // namespace partition
}  // namespace crisp
