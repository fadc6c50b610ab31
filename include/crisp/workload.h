// crisp/workload.h — the seeded structured synthetic workload: the common input of the tests,
// the demo and the benchmarks. docs/workload.md explains each knob and which real attention
// maps it imitates.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "crisp/limits.h"
#include "crisp/tensor.h"

namespace crisp {

struct WorkloadSpec {
  int64_t num_q_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 128;
  std::vector<int64_t> seq_lens = {8192};  // one entry per sequence of the batch
  uint64_t seed = 0;

  // Share of query heads that are diffuse (no sink/local/slash structure; broad, input-dependent
  // attention) so that both routes are exercised. Heads are chosen deterministically from the seed.
  double diffuse_head_share = 0.25;
  // Share of query heads (taken after the diffuse ones, from the same seeded permutation; the two
  // shares sum to at most 1) that are structured but WITHOUT local structure: their queries carry
  // the sink, the needles and the background noise, no local window and no slash lines. With a
  // heavy background this is the "sink + needles + noise" head whose tail is most of its mass.
  double no_local_head_share = 0.0;

  // Structured heads: logit strengths (in units of the softmax logit, after scaling).
  double sink_strength = 8.0;     // extra logit of the first sink_tokens keys
  int64_t sink_tokens = 4;
  double local_strength = 5.0;    // logit bonus decaying over local_width tokens (RoPE-like)
  int64_t local_width = 64;
  int64_t slash_lines = 2;        // extra relative-position diagonals per head
  double slash_strength = 4.0;
  int64_t needles = 4;            // vertical "needle" keys per sequence and KV head
  double needle_strength = 9.0;   // logit of queries after the needle on the needle key
  // Background: i.i.d. noise on every logit; larger = heavier, more uneven tail.
  double background_scale = 1.0;
};

struct Workload {
  WorkloadSpec spec;
  SeqLens cu_seqlens;          // offsets of the sequences (size = sequences + 1)
  int64_t total_tokens = 0;
  std::vector<float> q;        // [Hq, total_tokens, d] row-major
  std::vector<float> k;        // [Hkv, total_tokens, d]
  std::vector<float> v;        // [Hkv, total_tokens, d]
  // Needle key positions per (sequence, kv head), relative to the sequence start.
  std::vector<std::vector<int64_t>> needle_positions;  // index: seq * Hkv + kv_head
  std::vector<bool> head_is_diffuse;                    // per query head
  std::vector<bool> head_has_no_local;                  // per query head (no_local_head_share)

  TensorView q_view();
  TensorView k_view();
  TensorView v_view();
};

// Sets one field of `spec` from "field=value" (a field name of WorkloadSpec other than seq_lens and
// seed, e.g. "background_scale=2" or "no_local_head_share=0.5"). Throws crisp::Error naming
// `argument` for a missing '=', an unknown field or a value that is not a number of the field's
// type; ranges are checked by make_workload.
void set_workload_field(WorkloadSpec& spec, const std::string& field_equals_value,
                        const std::string& argument = "workload");

// The head dims a workload may have.
constexpr int64_t kWorkloadMinHeadDim = 8, kWorkloadMaxHeadDim = kMaxHeadDim;

// The checks of make_workload alone (cheap: nothing is generated): throws crisp::Error naming the
// field ("workload.head_dim", "workload.needles", ...) for a spec make_workload would refuse.
void check_workload(const WorkloadSpec& spec);

// Deterministic for a given spec (seed included). Throws crisp::Error on an invalid spec.
Workload make_workload(const WorkloadSpec& spec);

}  // namespace crisp
