// llama-attn-time: how much of llama.cpp's prompt processing is attention.
//
// Runs prompt-processing passes of random tokens (as llama-bench does) with a ggml scheduler eval
// callback (llama_context_params.cb_eval) that has every computing node of the graph run on its
// own, followed by a device synchronisation, and times each: the flash-attention nodes
// (GGML_OP_FLASH_ATTN_EXT, where crisp's hook sits) against every other node, and against the
// wall time of the pass (the rest, "outside the nodes", is llama.cpp's host work between graph
// computations: building the graph, filling its inputs such as the KQ mask, copies).
//
// The per-node synchronisation is the method's overhead: it exposes each kernel's launch latency
// and stops ggml's backends from fusing neighbouring nodes, so the other nodes' time (never the
// attention's: each attention node runs alone either way) is somewhat larger than in llama-bench.
// The JSON has the pass's wall time so that overhead can be stated against llama-bench's time of
// the same configuration.
//
// Usage: llama-attn-time --tokens N[,N...] [--reps R] [--seed S] [--warmup-tokens W] [--json FILE]
//                        <llama.cpp's common flags: -m, -b, -ub, -fa, -ngl, -t, --sparse-prefill, ...>
// Prints one JSON object (stdout, or FILE). Exits 1 when a pass fails or its last logits are not
// finite, 2 on a bad argument.
//
// Density comes from crisp's statistics ("ggml_backend_get_sparse_prefill_stats" and
// "ggml_backend_reset_sparse_prefill_stats", looked up through ggml's backend registry in every
// registered backend); a llama.cpp without them gives null.
// Built by scripts/llama_cpp.sh against the patched llama.cpp (libllama, libcommon, ggml).

#include "arg.h"
#include "common.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// Nodes that compute nothing (views of other tensors): no synchronisation after them.
bool is_view(const ggml_tensor * t) {
  switch (t->op) {
    case GGML_OP_NONE:
    case GGML_OP_VIEW:
    case GGML_OP_PERMUTE:
    case GGML_OP_RESHAPE:
    case GGML_OP_TRANSPOSE:
      return true;
    default:
      return false;
  }
}

struct NodeTimer {
  bool enabled = false;
  Clock::time_point range_start;
  double attention_ms = 0, other_ms = 0;
  int64_t attention_nodes = 0, other_nodes = 0;
  std::map<std::string, double> ms_by_op;

  void reset() {
    attention_ms = other_ms = 0;
    attention_nodes = other_nodes = 0;
    ms_by_op.clear();
  }
};

// The scheduler asks (ask == true) about nodes j0..j1 just before computing them together, then
// synchronises and calls again (ask == false) for the last one: so the time from the last ask to
// the answer is the range's compute, and every range is one computing node (plus views before it).
bool eval_callback(ggml_tensor * t, bool ask, void * user_data) {
  auto * timer = static_cast<NodeTimer *>(user_data);
  if (!timer->enabled) {
    return false;
  }
  if (ask) {
    timer->range_start = Clock::now();
    return !is_view(t);
  }
  const double ms = ms_since(timer->range_start, Clock::now());
  if (t->op == GGML_OP_FLASH_ATTN_EXT) {
    timer->attention_ms += ms;
    timer->attention_nodes++;
  } else {
    timer->other_ms += ms;
    timer->other_nodes++;
  }
  timer->ms_by_op[ggml_op_desc(t)] += ms;
  return true;
}

// crisp's statistics through the registry (LLAMA_IFACE: any backend with crisp's hook has them).
struct SparseStats {
  using Get = void (*)(int64_t *, int64_t *, int64_t *, int64_t *);
  using Reset = void (*)(void);
  std::vector<Get> getters;
  std::vector<Reset> resetters;

  SparseStats() {
    for (size_t i = 0; i < ggml_backend_reg_count(); i++) {
      ggml_backend_reg_t reg = ggml_backend_reg_get(i);
      auto get = reinterpret_cast<Get>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_sparse_prefill_stats"));
      auto reset = reinterpret_cast<Reset>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_reset_sparse_prefill_stats"));
      if (get != nullptr && reset != nullptr) {
        getters.push_back(get);
        resetters.push_back(reset);
      }
    }
  }
  bool available() const { return !getters.empty(); }
  void reset() const {
    for (auto reset : resetters) reset();
  }
  // handled, declined, kept, causal summed over the backends
  std::vector<int64_t> read() const {
    std::vector<int64_t> sum(4, 0);
    for (auto get : getters) {
      int64_t v[4] = {0, 0, 0, 0};
      get(&v[0], &v[1], &v[2], &v[3]);
      for (int k = 0; k < 4; k++) sum[k] += v[k];
    }
    return sum;
  }
};

struct Pass {
  bool ok = false;
  double wall_ms = 0;
  bool logits_finite = false;
  double max_abs_logit = 0;
  std::vector<float> logits;  // of the last token
};

// Pearson correlation of two passes' last logits: near 0 for different random prompts through a
// working network, near 1 when the network maps every prompt alike (degenerate weights).
double correlation(const std::vector<float> & a, const std::vector<float> & b) {
  const size_t n = std::min(a.size(), b.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; i++) ma += a[i], mb += b[i];
  ma /= n > 0 ? n : 1;
  mb /= n > 0 ? n : 1;
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; i++) {
    ab += (a[i] - ma) * (b[i] - mb);
    aa += (a[i] - ma) * (a[i] - ma);
    bb += (b[i] - mb) * (b[i] - mb);
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

// One prompt of n random tokens from an empty cache, in batches of n_batch (llama_decode splits
// each into ubatches), as llama-bench's test_prompt.
Pass run_pass(llama_context * ctx, int n, int n_batch, std::mt19937 & rng) {
  const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  std::uniform_int_distribution<int32_t> token(0, n_vocab - 1);
  std::vector<llama_token> tokens(n);
  for (auto & id : tokens) id = token(rng);
  if (llama_vocab_get_add_bos(vocab) && llama_vocab_bos(vocab) != LLAMA_TOKEN_NULL) tokens[0] = llama_vocab_bos(vocab);

  Pass pass;
  llama_memory_clear(llama_get_memory(ctx), true);
  llama_synchronize(ctx);
  const auto t0 = Clock::now();
  for (int done = 0; done < n;) {
    const int count = std::min(n - done, n_batch);
    if (llama_decode(ctx, llama_batch_get_one(tokens.data() + done, count)) != 0) {
      fprintf(stderr, "llama-attn-time: llama_decode failed at token %d of %d\n", done, n);
      return pass;
    }
    done += count;
  }
  llama_synchronize(ctx);
  pass.wall_ms = ms_since(t0, Clock::now());
  pass.ok = true;
  const float * logits = llama_get_logits_ith(ctx, -1);
  pass.logits_finite = logits != nullptr;
  for (int32_t i = 0; logits != nullptr && i < n_vocab; i++) {
    if (!std::isfinite(logits[i])) pass.logits_finite = false;
    else pass.max_abs_logit = std::max(pass.max_abs_logit, (double) std::fabs(logits[i]));
  }
  if (logits != nullptr) pass.logits.assign(logits, logits + n_vocab);
  return pass;
}

std::string json_string(const std::string & s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

int usage_error(const std::string & message) {
  fprintf(stderr, "llama-attn-time: error: %s\n", message.c_str());
  return 2;
}

bool parse_positive(const std::string & text, long & value) {
  char * end = nullptr;
  value = std::strtol(text.c_str(), &end, 10);
  return !text.empty() && *end == '\0' && value > 0 && value <= (1L << 30);
}

}  // namespace

int main(int argc, char ** argv) {
  std::vector<int> lengths;
  long reps = 1, seed = 42, warmup_tokens = 512;
  std::string json_path;
  std::vector<char *> rest = {argv[0]};
  for (int i = 1; i < argc; i++) {
    const std::string arg = argv[i];
    const bool ours = arg == "--tokens" || arg == "--reps" || arg == "--seed" || arg == "--warmup-tokens" || arg == "--json";
    if (!ours) {
      rest.push_back(argv[i]);
      continue;
    }
    if (i + 1 >= argc) return usage_error(arg + " needs a value");
    const std::string value = argv[++i];
    long v = 0;
    if (arg == "--tokens") {
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        if (!parse_positive(value.substr(start, comma - start), v)) {
          return usage_error("--tokens '" + value + "': expected positive integers separated by commas");
        }
        lengths.push_back((int) v);
        start = comma + 1;
      }
    } else if (arg == "--json") {
      json_path = value;
    } else if (arg == "--seed" && value == "0") {
      seed = 0;
    } else if (!parse_positive(value, v)) {
      return usage_error(arg + " '" + value + "': expected a positive integer");
    } else {
      (arg == "--reps" ? reps : arg == "--seed" ? seed : warmup_tokens) = v;
    }
  }
  if (lengths.empty()) return usage_error("--tokens is required (the prompt lengths to time)");

  common_params params;
  if (!common_params_parse((int) rest.size(), rest.data(), params, LLAMA_EXAMPLE_COMMON)) return 2;
  const int max_len = *std::max_element(lengths.begin(), lengths.end());
  // The cache holds the longest prompt (a longer -c is kept).
  params.n_ctx = std::max<int>(params.n_ctx, GGML_PAD(std::max<long>(max_len, warmup_tokens), 256));
  NodeTimer timer;
  params.cb_eval = eval_callback;
  params.cb_eval_user_data = &timer;

  common_init();
  llama_backend_init();
  llama_numa_init(params.numa);
  common_init_result init = common_init_from_params(params);
  llama_context * ctx = init.context.get();
  if (init.model == nullptr || ctx == nullptr) {
    fprintf(stderr, "llama-attn-time: could not load the model or create the context\n");
    return 1;
  }
  const int n_batch = (int) llama_n_batch(ctx);
  const SparseStats stats;
  std::mt19937 rng((uint32_t) seed);

  // One untimed pass: the device's kernels and buffers are loaded once before the timed passes.
  const Pass warmup = run_pass(ctx, (int) warmup_tokens, n_batch, rng);
  if (!warmup.ok) return 1;
  std::vector<float> previous_logits = warmup.logits;

  std::string runs;
  bool all_ok = true;
  for (int n : lengths) {
    for (long rep = 0; rep < reps; rep++) {
      timer.reset();
      timer.enabled = true;
      if (stats.available()) stats.reset();
      const Pass pass = run_pass(ctx, n, n_batch, rng);
      timer.enabled = false;
      if (!pass.ok) return 1;
      all_ok = all_ok && pass.logits_finite;
      std::string density = "null", handled = "null", declined = "null";
      if (stats.available()) {
        const auto s = stats.read();
        handled = std::to_string(s[0]);
        declined = std::to_string(s[1]);
        if (s[3] > 0) density = std::to_string((double) s[2] / (double) s[3]);
      }
      std::string ops;
      for (const auto & [op, ms] : timer.ms_by_op) {
        ops += (ops.empty() ? "" : ", ") + json_string(op) + ": " + std::to_string(ms);
      }
      const double nodes_ms = timer.attention_ms + timer.other_ms;
      char row[1024];
      snprintf(row, sizeof(row),
               "    {\"n_prompt\": %d, \"rep\": %ld, \"wall_ms\": %.3f, \"attention_ms\": %.3f, \"other_nodes_ms\": %.3f, "
               "\"outside_nodes_ms\": %.3f, \"attention_share\": %.4f, \"attention_nodes\": %lld, \"other_nodes\": %lld, "
               "\"logits_finite\": %s, \"max_abs_logit\": %.4g, \"logit_correlation_to_previous\": %.4f, \"sparse_ops_handled\": %s, \"sparse_ops_declined\": %s, "
               "\"density\": %s, ",
               n, rep, pass.wall_ms, timer.attention_ms, timer.other_ms, std::max(0.0, pass.wall_ms - nodes_ms),
               pass.wall_ms > 0 ? timer.attention_ms / pass.wall_ms : 0.0, (long long) timer.attention_nodes,
               (long long) timer.other_nodes, pass.logits_finite ? "true" : "false", pass.max_abs_logit, correlation(pass.logits, previous_logits), handled.c_str(),
               declined.c_str(), density.c_str());
      previous_logits = pass.logits;
      runs += (runs.empty() ? "" : ",\n") + std::string(row) + "\"ms_by_op\": {" + ops + "}}";
      fprintf(stderr, "llama-attn-time: n=%d rep %ld: wall %.1f ms, attention %.1f ms (%.1f%%), other nodes %.1f ms, density %s%s\n",
              n, rep, pass.wall_ms, timer.attention_ms, pass.wall_ms > 0 ? 100.0 * timer.attention_ms / pass.wall_ms : 0.0,
              timer.other_ms, density.c_str(), pass.logits_finite ? "" : ", LOGITS NOT FINITE");
    }
  }

  std::string settings;
  for (const auto & s : params.sparse_prefill_set) settings += (settings.empty() ? "" : ", ") + json_string(s);
  std::string out = "{\n  \"tool\": \"llama-attn-time\",\n  \"model\": " + json_string(params.model.path) +
                    ",\n  \"flash_attn\": " + (params.flash_attn ? "true" : "false") +
                    ",\n  \"sparse_prefill\": " + json_string(params.sparse_prefill.empty() ? "off" : params.sparse_prefill) +
                    ",\n  \"sparse_prefill_set\": [" + settings + "]" +
                    ",\n  \"n_batch\": " + std::to_string(n_batch) + ",\n  \"n_ubatch\": " + std::to_string(llama_n_ubatch(ctx)) +
                    ",\n  \"n_ctx\": " + std::to_string(llama_n_ctx(ctx)) + ",\n  \"n_gpu_layers\": " + std::to_string(params.n_gpu_layers) +
                    ",\n  \"stats_available\": " + (stats.available() ? "true" : "false") +
                    ",\n  \"runs\": [\n" + runs + "\n  ]\n}\n";
  FILE * f = json_path.empty() ? stdout : fopen(json_path.c_str(), "w");
  if (f == nullptr) {
    fprintf(stderr, "llama-attn-time: error: --json %s: cannot write it\n", json_path.c_str());
    return 2;
  }
  fputs(out.c_str(), f);
  if (f != stdout) fclose(f);
  llama_backend_free();
  return all_ok ? 0 : 1;
}
