// tools/input_checks.h — the .npy inputs of `crisp plan` and `crisp attend` as one sequence,
// checked before any output is allocated and any work is done. The rules are the library's
// (crisp::check_inputs); only the names change: an error about "q" names the option and its file
// ("--q q.npy: ..."), as every other input error of the command line does.
#pragma once
#include <string>

#include "crisp/crisp.h"
#include "crisp/error.h"

namespace crisp_cli {

// The batch of one sequence read from --q / --k (and --v) files: q's n_q queries are the last n_q
// of k's n_k positions (a whole prompt when n_q == n_k), checked with the library's shape rules.
// `*_argument` name each input as the command line does ("--q q.npy").
inline crisp::Batch one_sequence(const crisp::TensorView& q, const std::string& q_argument, const crisp::TensorView& k,
                                 const std::string& k_argument, const crisp::TensorView* v = nullptr,
                                 const std::string& v_argument = "") {
  const crisp::Batch batch =
      q.tokens() == k.tokens() ? crisp::Batch{} : crisp::Batch(crisp::SeqLens{0, q.tokens()}, crisp::SeqLens{0, k.tokens()});
  try {
    crisp::check_inputs(q, k, v, batch);
  } catch (const crisp::Error& e) {
    const std::string& name = e.argument();
    if (name == "batch.cu_seqlens_q")  // the one sequence's n_q > n_k
      throw crisp::Error(q_argument,
                         "holds " + std::to_string(q.tokens()) + " positions but --k only " +
                             std::to_string(k.tokens()),
                         "n_q <= n_k: the queries are the last n_q of the keys' positions");
    const std::string option = name == "q" ? q_argument : name == "k" ? k_argument : name == "v" ? v_argument : "";
    if (option.empty()) throw;
    // what() is "<argument>: <problem>; expected ...": the same text under the option's name.
    throw crisp::Error(option, std::string(e.what()).substr(name.size() + 2));
  }
  return batch;
}

}  // namespace crisp_cli
