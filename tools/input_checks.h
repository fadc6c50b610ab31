// tools/input_checks.h — the .npy inputs of `crisp plan` and `crisp attend` as one sequence,
// checked before any output is allocated and any work is done. The rules are the library's
// (crisp::check_inputs); only the names change: an error about "q" names the option and its file
// ("--q q.npy: ..."), as every other input error of the command line does.
#pragma once
#include <initializer_list>
#include <string>
#include <utility>

#include "crisp/crisp.h"
#include "crisp/error.h"
#include "crisp/npy.h"

namespace crisp_cli {

// `error` under the command line's names: a library argument in `names` ({"q", "--q q.npy"}, ...)
// becomes its option, and the C++ API's Precision::f64 the option that selects it. Other errors
// come back as they were.
inline crisp::Error renamed_error(const crisp::Error& error,
                                  std::initializer_list<std::pair<const char*, std::string>> names) {
  std::string text = error.reason();
  for (std::size_t at = text.find("Precision::f64"); at != std::string::npos; at = text.find("Precision::f64", at))
    text.replace(at, 14, "--precision f64");
  std::string option = error.argument();
  for (const auto& [name, cli_name] : names)
    if (error.argument() == name) option = cli_name;
  return crisp::Error(option, text);
}

// The .npy file of input option `option` (e.g. "--q"), its errors named "--q <path>" as the shape
// errors are.
inline crisp::NpyArray read_input(const std::string& option, const std::string& path) {
  try {
    return crisp::read_npy(path);
  } catch (const crisp::Error& e) {
    throw renamed_error(e, {{e.argument().c_str(), option + " " + path}});
  }
}

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
    if (name != "q" && name != "k" && name != "v") throw;
    throw renamed_error(e, {{"q", q_argument}, {"k", k_argument}, {"v", v_argument}});
  }
  return batch;
}

}  // namespace crisp_cli
