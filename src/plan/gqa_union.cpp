// src/plan/gqa_union.cpp — spec §10: a kernel that packs a GQA group into one tile runs the union of
// the group's layouts. gqa_union() gives that plan, so its density (what such a kernel computes)
// can be reported and its output checked against a reference of the same layout.
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/error.h"
#include "plan/rules.h"

namespace crisp {

Plan gqa_union(const Plan& plan) {
  if (plan.num_kv_heads < 1 || plan.num_q_heads % plan.num_kv_heads != 0)
    throw Error("plan", "has " + std::to_string(plan.num_q_heads) + " query heads and " +
                            std::to_string(plan.num_kv_heads) + " kv heads",
                "a number of kv heads that divides the number of query heads");
  plan.check_well_formed();  // CSR bounds, before any row is read
  const int64_t group = plan.num_q_heads / plan.num_kv_heads;
  Plan result = plan;
  for (std::size_t s = 0; s < plan.sequences.size(); ++s) {
    const SequencePlan& seq = plan.sequences[s];
    if (static_cast<int64_t>(seq.heads.size()) != plan.num_q_heads)
      throw Error("plan", "sequence " + std::to_string(s) + " has " + std::to_string(seq.heads.size()) + " heads",
                  std::to_string(plan.num_q_heads) + " (num_q_heads)");
    const int32_t N = seq.num_blocks;
    for (int64_t kv = 0; kv < plan.num_kv_heads; ++kv) {
      std::vector<int32_t> row_ptr(1, 0), col;
      std::vector<int32_t> row, merged;
      for (int32_t r = 0; r < N; ++r) {
        row.clear();
        for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
          const HeadPlan& head = seq.heads[static_cast<std::size_t>(h)];
          merged.clear();
          std::set_union(row.begin(), row.end(), head.col.begin() + head.row_ptr[r], head.col.begin() + head.row_ptr[r + 1],
                         std::back_inserter(merged));
          row.swap(merged);
        }
        col.insert(col.end(), row.begin(), row.end());
        row_ptr.push_back(static_cast<int32_t>(col.size()));
      }
      // Over the rows holding queries (a chunk's rows, spec §11), as every plan's density.
      const double density =
          N > 0 ? rules::density_of_rows(static_cast<int64_t>(col.size()), seq.first_row, N) : 1.0;
      for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
        HeadPlan& head = result.sequences[s].heads[static_cast<std::size_t>(h)];
        head.row_ptr = row_ptr;
        head.col = col;
        head.density = density;
      }
    }
  }
  return result;
}

}  // namespace crisp
