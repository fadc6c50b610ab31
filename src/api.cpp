// src/api.cpp — the public entry points of crisp/crisp.h: input validation (every bad input is a
// crisp::Error naming the argument) and dispatch to the backend of the views' device.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "common/shape_rules.h"
#include "backend.h"
#include "cpu/cpu_common.h"
#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "plan/rules.h"

namespace crisp {
namespace detail {
namespace {

bool valid_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f64;
}
bool valid_device(Device device) { return device == Device::cpu || device == Device::cuda; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
  }
  return "an invalid dtype";
}
const char* device_name(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "an invalid device";
}

// The first `rank` entries of a view's shape or strides, between `open` and `close`.
std::string extents_string(const std::array<int64_t, 3>& values, int rank, char open, char close) {
  std::ostringstream s;
  s << open;
  for (int i = 0; i < rank && i < 3; ++i) s << (i ? ", " : "") << values[i];
  s << close;
  return s.str();
}
std::string shape_string(const TensorView& t) { return extents_string(t.shape, t.rank, '[', ']'); }
// "shape [a, b, c] and strides {x, y, z}", for the errors about a view's memory.
std::string shape_and_strides(const TensorView& t) {
  return "shape " + shape_string(t) + " and strides " + extents_string(t.stride, t.rank, '{', '}');
}
std::string str(int64_t x) { return std::to_string(x); }
using shape_rules::kMaxTokens;
std::string num(double x) {
  std::ostringstream s;
  s.precision(3);
  s << x;
  return s.str();
}

// Rank, non-null data, dtype and device of one view, and every extent >= 1.
}  // namespace

void check_view_reach(const TensorView& t, const std::string& name) {
  // Unsigned 128-bit: each term is below 2^126, the sum of three below 2^128.
  unsigned __int128 reach = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 1) continue;  // an empty extent is check_view's error
    const uint64_t stride = t.stride[i] < 0 ? 0 - static_cast<uint64_t>(t.stride[i]) : static_cast<uint64_t>(t.stride[i]);
    reach += static_cast<unsigned __int128>(static_cast<uint64_t>(t.shape[i] - 1)) * stride;
  }
  if (reach >= (static_cast<unsigned __int128>(1) << 62) / dtype_size(t.dtype))
    throw Error(name, "has " + shape_and_strides(t) + " reaching beyond any memory",
                "strides whose farthest element lies within 2^62 bytes of the data pointer");
}

namespace {

void check_view(const TensorView& t, const std::string& name, int rank, const std::string& shape_names) {
  if (t.rank != rank)
    throw Error(name, "has rank " + str(t.rank), "rank " + str(rank) + " " + shape_names);
  // Extents first: an empty tensor (n = 0) often has no data pointer, and its problem is the length.
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 1) {
      const std::string what = i == 0 ? "heads" : i == 1 ? "tokens (n = 0)" : "head dim (d = 0)";
      throw Error(name, "has shape " + shape_string(t) + " with " + (t.shape[i] == 0 ? "zero " : "negative ") + what,
                  shape_names + " with every extent >= 1");
    }
  }
  // Element counts are int64 products everywhere (a stride-0 view spans no memory whatever its
  // extents): refuse a count beyond 2^62 before anything multiplies the extents.
  int64_t elements = 1;
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(elements, t.shape[i], &elements) || elements > (int64_t{1} << 62))
      throw Error(name, "has shape " + shape_string(t) + ", more than 2^62 elements", shape_names + " of fewer elements");
  if (t.data == nullptr) throw Error(name, "data pointer is null", "a pointer to the tensor's elements");
  if (!valid_dtype(t.dtype)) throw Error(name, "has an invalid dtype", "f32, f16, bf16 or f64");
  if (!valid_device(t.device)) throw Error(name, "has an invalid device", "Device::cpu or Device::cuda");
  check_view_reach(t, name);
}

// The bytes [first, last] a view's elements span (a superset of what it touches).
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& t) {
  int64_t low = 0, high = 0;
  for (int i = 0; i < t.rank; ++i) (t.stride[i] < 0 ? low : high) += (t.shape[i] - 1) * t.stride[i];
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype));
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  return {base + static_cast<uintptr_t>(low * size), base + static_cast<uintptr_t>(high * size + size - 1)};
}

// A view with a zero stride over an extent > 1 (an expanded tensor): one element stands at
// several indices.
bool expanded(const TensorView& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.stride[i] == 0 && t.shape[i] > 1) return true;
  return false;
}

// Whether two views share a byte, decided where it can be cheaply: both views dense (their
// elements fill their spans, as any contiguous tensor's do). Strided views may interleave without
// sharing an element (q, k and v as views of one fused QKV buffer, out written into q): those are
// not judged.
bool views_overlap(const TensorView& a, const TensorView& b) {
  const auto [a_first, a_last] = byte_span(a);
  const auto [b_first, b_last] = byte_span(b);
  // Dense: no zero stride over an extent > 1 (a hole could hide behind a repeated element) and
  // as many element bytes as the span holds (numel in checked arithmetic: strides may alias).
  const auto dense = [](const TensorView& t, uintptr_t first, uintptr_t last) {
    if (expanded(t)) return false;
    uint64_t bytes = dtype_size(t.dtype);
    for (int i = 0; i < t.rank; ++i)
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(t.shape[i]), &bytes)) return false;
    return bytes == last - first + 1;
  };
  return a.device == b.device && a_first <= b_last && b_first <= a_last && dense(a, a_first, a_last) &&
         dense(b, b_first, b_last);
}

// An output view writes each element once: a zero stride over an extent > 1 would make several
// results race for one element (an expanded tensor), and so would strides under which two indices
// meet (e.g. shape [4, 48, 32] with strides {1536, 1, 1}). The rule checked: taken by increasing
// |stride|, each stride of an extent > 1 exceeds the farthest offset the smaller ones reach, as in
// any permutation of a dense or padded tensor; such strides give every index its own element.
void check_distinct_elements(const TensorView& t, const std::string& name) {
  if (expanded(t))
    throw Error(name, "has " + shape_and_strides(t) +
                          ": a stride 0 over an extent > 1 (several results would share one element)",
                "an output view whose elements are distinct (not expanded)");
  const int rank = t.rank == 2 ? 2 : 3;  // check_view has checked the rank
  // In uint64: an extent-1 dimension may carry any stride, INT64_MIN included.
  const auto magnitude = [&](int i) {
    return t.stride[i] < 0 ? 0 - static_cast<uint64_t>(t.stride[i]) : static_cast<uint64_t>(t.stride[i]);
  };
  int order[3] = {0, 1, 2};  // the dimensions by increasing |stride| (an insertion sort of at most 3)
  for (int i = 1; i < rank; ++i)
    for (int j = i; j > 0 && magnitude(order[j]) < magnitude(order[j - 1]); --j) std::swap(order[j], order[j - 1]);
  uint64_t reach = 0;  // bounded by check_view_reach (below 2^62 elements)
  for (int i = 0; i < rank; ++i) {
    const int d = order[i];
    if (t.shape[d] < 2) continue;
    if (magnitude(d) <= reach)
      throw Error(name, "has " + shape_and_strides(t) + ": strides that are not nested (two indices may meet)",
                  "an output view whose strides keep every element apart (each stride larger than the farthest "
                  "offset of the smaller ones, as in a dense, padded or permuted tensor)");
    reach += static_cast<uint64_t>(t.shape[d] - 1) * magnitude(d);
  }
}

// Rows [first, first + count) of every head of a view, as a view of its own.
TensorView row_range(const TensorView& t, int64_t first, int64_t count) {
  TensorView rows = t;
  rows.data = static_cast<char*>(t.data) + first * t.stride[1] * static_cast<int64_t>(dtype_size(t.dtype));
  rows.shape[1] = count;
  return rows;
}

// The parts of a K/V view a batch reads, as (first row, row count): the whole view, or with paged
// K/V the rows of each page the batch reads (each page once). Page ids outside the pool are left
// to check_block_table.
std::vector<std::pair<int64_t, int64_t>> rows_read(const TensorView& t, const BlockTable& table, const SeqLens& cu_k) {
  if (table.empty()) return {{0, t.tokens()}};
  std::map<int64_t, int64_t> rows_of_page;
  for (size_t s = 0; s + 1 < cu_k.size(); ++s) {
    const int64_t n = cu_k[s + 1] - cu_k[s];
    for (int64_t p = 0; p * table.page_size < n; ++p) {
      const int64_t page = table.data[static_cast<int64_t>(s) * table.max_pages_per_sequence + p];
      if (page < 0 || (page + 1) * table.page_size > t.tokens()) continue;
      int64_t& rows = rows_of_page[page];
      rows = std::max(rows, std::min(table.page_size, n - p * table.page_size));
    }
  }
  std::vector<std::pair<int64_t, int64_t>> parts;
  for (const auto& [page, rows] : rows_of_page) parts.emplace_back(page * table.page_size, rows);
  return parts;
}

// Rejects NaN/Inf in the rows of a CPU view that the batch reads (rows_read), naming the first bad
// element, and values that the f32 precision cannot hold (f64 inputs are converted). Returns the
// largest |value| (0 for a device view).
double check_values(const TensorView& t, const std::string& name, const Options& options, const BlockTable& table,
                    const SeqLens& cu_k) {
  if (t.device != Device::cpu) return 0.0;  // device memory: the CUDA backend's responsibility
  double max_abs = 0.0;
  for (const auto& [first, count] : rows_read(t, table, cu_k)) {
    const CpuValueScan scan = cpu_scan_values(row_range(t, first, count), options.num_threads);
    if (scan.first_nonfinite >= 0) {
      const int64_t bad = scan.first_nonfinite;
      const int64_t dim = t.dim();
      const int64_t h = bad / (count * dim), tt = first + (bad / dim) % count, x = bad % dim;
      // Named by head, token and dim: a Python caller's layout ("bshd", a batch) orders them differently.
      throw Error(name,
                  "contains a non-finite value (NaN or Inf) at head " + str(h) + ", token " + str(tt) + ", dim " +
                      str(x) + " (tokens counted over the whole batch, or the page pool)",
                  "finite values only");
    }
    max_abs = std::max(max_abs, scan.max_abs);
  }
  if (options.precision == Precision::f32 && max_abs > std::numeric_limits<float>::max())
    throw Error(name, "holds a value of magnitude " + num(max_abs) + ", beyond float32's range",
                "|values| below " + num(std::numeric_limits<float>::max()) + " (or Precision::f64)");
  return max_abs;
}

// The largest finite value of an output dtype.
double largest_finite(DType dtype) {
  switch (dtype) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f32: return static_cast<double>(std::numeric_limits<float>::max());
    case DType::f64: return std::numeric_limits<double>::max();
  }
  return 0.0;
}

// Rejects inputs whose scores, output sums or results could overflow the arithmetic or the
// outputs: a scaled score is at most d * max|q| * max|k| * max(scale, 1) (the dot product is
// formed before the scale), an output row sums, before the normalisation, at most `tokens` terms
// of weight <= 1 times max|v|, and O is a weighted average of v's rows. Such inputs gave Inf or
// all-NaN outputs (Inf - Inf in the softmax) with no error. `out` / `lse` may be null (planning).
void check_magnitudes(const TensorView& q, int64_t k_tokens, double q_max, double k_max, const double* v_max,
                      double softmax_scale, const Options& options, const TensorView* out, const TensorView* lse) {
  // Every kernel but the CPU's f64 path scales in float32 (a device view's values are not scanned).
  if ((options.precision == Precision::f32 || q.device != Device::cpu) &&
      softmax_scale > static_cast<double>(std::numeric_limits<float>::max()))
    throw Error("softmax_scale", "is " + num(softmax_scale) + ", beyond float32's range",
                "a scale below " + num(std::numeric_limits<float>::max()) + " (or Precision::f64 on the CPU)");
  if (q.device != Device::cpu) return;
  // NOTE: a factor 2 below the largest finite value covers the rounding of the partial sums.
  const double limit = 0.5 * (options.precision == Precision::f64 ? std::numeric_limits<double>::max()
                                                                  : static_cast<double>(std::numeric_limits<float>::max()));
  const std::string arithmetic = options.precision == Precision::f64 ? "float64" : "float32";
  const double scale_factor = std::max(softmax_scale, 1.0);
  if (q_max > 0 && k_max > limit / static_cast<double>(q.dim()) / q_max / scale_factor)
    throw Error("q", "holds values up to " + num(q_max) + " and k up to " + num(k_max) + ": their dot products over d = " +
                         str(q.dim()) + (softmax_scale > 1.0 ? " times the softmax scale " + num(softmax_scale) : "") +
                         " overflow " + arithmetic,
                "d * max|q| * max|k| * max(scale, 1) below " + num(limit) + " (scale q and k down)");
  // The log-sum-exp is at most the largest scaled score plus log(keys): it must fit lse's dtype.
  if (lse != nullptr && q_max > 0 && k_max > 0.5 * largest_finite(lse->dtype) / static_cast<double>(q.dim()) / q_max / scale_factor)
    throw Error("lse", std::string("is ") + to_string(lse->dtype) + ", but q and k hold values up to " + num(q_max) +
                           " and " + num(k_max) + ": scaled scores over d = " + str(q.dim()) + " may exceed its range",
                "an f64 lse, or q and k scaled down");
  const int64_t keys = std::max(q.tokens(), k_tokens);  // a bound on any sequence's keys
  if (v_max && *v_max > limit / static_cast<double>(keys))
    throw Error("v", "holds values up to " + num(*v_max) + ": sums over " + str(keys) + " tokens overflow " +
                         arithmetic,
                "tokens * max|v| below " + num(limit) + " (scale v down)");
  if (v_max && out != nullptr && *v_max > largest_finite(out->dtype))
    throw Error("out", std::string("is ") + to_string(out->dtype) + ", but v holds values up to " + num(*v_max) +
                           ": O's rows (weighted averages of v's) may exceed its largest value " +
                           num(largest_finite(out->dtype)),
                "a wider out dtype, or v scaled down");
}

Plan plan_validated(const TensorView& q, const TensorView& k, const Config& config, const Batch& batch,
                    const Options& options) {
  Plan result = q.device == Device::cuda ? cuda_plan(q, k, config, batch, options) : cpu_plan(q, k, config, batch, options);
  result.page_size = batch.block_table.page_size;
  return result;
}

void attend_validated(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
                      const BlockTable& block_table, const TensorView& out, const TensorView& lse,
                      const Options& options) {
  if (q.device == Device::cuda) {
    cuda_attend(q, k, v, plan, block_table, out, lse, options);
  } else {
    cpu_attend(q, k, v, plan, block_table, out, lse, options);
  }
}

}  // namespace

void check_input_values(const TensorView& q, const TensorView& k, const TensorView* v, const Options& options,
                        double softmax_scale, const BlockTable& block_table, const SeqLens& cu_k,
                        const TensorView* out, const TensorView* lse) {
  const double q_max = check_values(q, "q", options, {}, {});
  const double k_max = check_values(k, "k", options, block_table, cu_k);
  // Paged K/V: a sequence's keys may outnumber the pool's rows (pages repeated), never cu_k's total.
  const int64_t keys = block_table.empty() || cu_k.empty() ? k.tokens() : std::max(k.tokens(), cu_k.back());
  if (v == nullptr) {
    check_magnitudes(q, keys, q_max, k_max, nullptr, softmax_scale, options, out, lse);
  } else {
    const double v_max = check_values(*v, "v", options, block_table, cu_k);
    check_magnitudes(q, keys, q_max, k_max, &v_max, softmax_scale, options, out, lse);
  }
}

void check_offsets(const SeqLens& cu_seqlens, const char* name) {
  if (cu_seqlens.size() < 2)
    throw Error(name, "has " + str(static_cast<int64_t>(cu_seqlens.size())) + " entries",
                "an empty list (one sequence) or {0, ..., tokens} with >= 2 entries");
  if (cu_seqlens.front() != 0)
    throw Error(name, "starts at " + str(cu_seqlens.front()), "the first offset to be 0");
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    if (cu_seqlens[s + 1] < cu_seqlens[s])
      throw Error(name, "decreases at entry " + str(static_cast<int64_t>(s + 1)) + " (" + str(cu_seqlens[s]) +
                                    " -> " + str(cu_seqlens[s + 1]) + ")",
                  "non-decreasing offsets");
    if (cu_seqlens[s + 1] == cu_seqlens[s])
      throw Error(name, "sequence " + str(static_cast<int64_t>(s)) + " is empty (offset " +
                                    str(cu_seqlens[s]) + " repeated)",
                  "every sequence to have at least one token");
  }
  if (cu_seqlens.back() > kMaxTokens)
    throw Error(name, "ends at " + str(cu_seqlens.back()), std::string(shape_rules::kMaxTokensExpected) + " in all");
}

SeqLens normalize_seqlens(const SeqLens& cu_seqlens, int64_t tokens, const char* name) {
  if (cu_seqlens.empty()) return SeqLens{0, tokens};
  check_offsets(cu_seqlens, name);
  if (cu_seqlens.back() != tokens)
    throw Error(name, "ends at " + str(cu_seqlens.back()) + " but the tensors hold " + str(tokens) + " tokens",
                "the last offset to equal the token count");
  return cu_seqlens;
}

void check_queries_within_keys(const Batch& batch) {
  if (batch.cu_seqlens_k.size() != batch.cu_seqlens_q.size())
    throw Error("batch.cu_seqlens_k",
                "lists " + str(static_cast<int64_t>(batch.cu_seqlens_k.size()) - 1) + " sequences but cu_seqlens_q lists " +
                    str(static_cast<int64_t>(batch.cu_seqlens_q.size()) - 1),
                "one entry per sequence in both lists");
  for (size_t s = 0; s + 1 < batch.cu_seqlens_q.size(); ++s) {
    const int64_t n_q = batch.cu_seqlens_q[s + 1] - batch.cu_seqlens_q[s];
    const int64_t n_k = batch.cu_seqlens_k[s + 1] - batch.cu_seqlens_k[s];
    if (n_q > n_k)
      throw Error("batch.cu_seqlens_q", "sequence " + str(static_cast<int64_t>(s)) + " has " + str(n_q) +
                                            " queries but only " + str(n_k) + " keys",
                  "n_q <= n_k (the queries are the last n_q of the sequence's n_k positions)");
  }
}

void validate_qkv(const TensorView& q, const TensorView& k, const TensorView* v) {
  check_view(q, "q", 3, "[Hq, tokens, d]");
  check_view(k, "k", 3, "[Hkv, tokens, d]");
  if (v) check_view(*v, "v", 3, "[Hkv, tokens, d]");
  if (q.dim() > kMaxHeadDim)
    throw Error("q", "head dim d = " + str(q.dim()) + " is too large", "1 <= d <= " + str(kMaxHeadDim));
  // Before any scan of the values: a stride-0 view can claim 2^40 tokens without the memory, and
  // scanning it would run for hours.
  if (q.tokens() > kMaxTokens) throw Error("q", "has " + str(q.tokens()) + " tokens", shape_rules::kMaxTokensExpected);
  if (k.tokens() > kMaxTokens) throw Error("k", "has " + str(k.tokens()) + " tokens", shape_rules::kMaxTokensExpected);
  if (k.device != q.device)
    throw Error("k", std::string("is on ") + device_name(k.device) + " but q is on " + device_name(q.device),
                "every tensor of a call on one device");
  if (v && v->device != q.device)
    throw Error("v", std::string("is on ") + device_name(v->device) + " but q is on " + device_name(q.device),
                "every tensor of a call on one device");
  if (k.dim() != q.dim())
    throw Error("k", "has head dim " + str(k.dim()) + " but q has " + str(q.dim()), "the same head dim as q");
  if (q.heads() % k.heads() != 0)
    throw Error("k", "has " + str(k.heads()) + " heads, which does not divide q's " + str(q.heads()),
                "Hq to be a multiple of Hkv (GQA)");
  if (v) {
    if (v->heads() != k.heads())
      throw Error("v", "has " + str(v->heads()) + " heads but k has " + str(k.heads()), "the same head count as k");
    if (v->tokens() != k.tokens())
      throw Error("v", "has " + str(v->tokens()) + " tokens but k has " + str(k.tokens()), "the same token count as k");
    if (v->dim() != q.dim())
      throw Error("v", "has head dim " + str(v->dim()) + " but q has " + str(q.dim()), "the same head dim as q");
  }
}

// Paged K/V: the table's shape against the batch and the pool; its page ids when it is readable.
void check_block_table(const BlockTable& table, const SeqLens& cu_k, const TensorView& q, const TensorView& k) {
  if (table.page_size < 16 || table.page_size % 16 != 0)
    throw Error("batch.block_table.page_size", "is " + str(table.page_size), "a multiple of 16 (0: no table)");
  if (table.data == nullptr)
    throw Error("batch.block_table.data", "is null", "[num_sequences, max_pages_per_sequence] page ids");
  if (!valid_device(table.device) || table.device != q.device)
    throw Error("batch.block_table.device", std::string("is ") + device_name(table.device) + " but q is on " +
                                                device_name(q.device),
                "the device of the tensors");
  if (k.tokens() % table.page_size != 0)
    throw Error("k", "holds " + str(k.tokens()) + " pool tokens, not a whole number of pages of " + str(table.page_size),
                "the page pool [Hkv, num_pages * page_size, d]");
  // A row stride beyond the most tokens of a call is no real table's (a sequence needs at most
  // kMaxTokens / 16 pages), and it would overflow the row offsets s * stride.
  if (table.max_pages_per_sequence > kMaxTokens)
    throw Error("batch.block_table.max_pages_per_sequence", "is " + str(table.max_pages_per_sequence),
                "at most " + str(kMaxTokens) + " (the row stride of the table, in page ids)");
  int64_t longest = 0;
  for (size_t s = 0; s + 1 < cu_k.size(); ++s) longest = std::max(longest, cu_k[s + 1] - cu_k[s]);
  const int64_t pages_needed = (longest + table.page_size - 1) / table.page_size;
  if (table.max_pages_per_sequence < pages_needed)
    throw Error("batch.block_table.max_pages_per_sequence", "is " + str(table.max_pages_per_sequence),
                "at least " + str(pages_needed) + " (the pages of the longest sequence, " + str(longest) + " keys)");
  if (table.device != Device::cpu) return;  // device memory: the CUDA backend checks or guards it
  const int64_t num_pages = k.tokens() / table.page_size;
  for (size_t s = 0; s + 1 < cu_k.size(); ++s) {
    const int64_t used = (cu_k[s + 1] - cu_k[s] + table.page_size - 1) / table.page_size;
    for (int64_t p = 0; p < used; ++p) {
      const int32_t page = table.data[static_cast<int64_t>(s) * table.max_pages_per_sequence + p];
      if (page < 0 || page >= num_pages)
        throw Error("batch.block_table",
                    "sequence " + str(static_cast<int64_t>(s)) + " page " + str(p) + " is page id " + str(page),
                    "page ids in [0, " + str(num_pages) + ") (the pool holds " + str(num_pages) + " pages)");
    }
  }
}

// A table whose page size is 0 is "no table": one that still has page ids would have its pool read
// as contiguous K/V without a word.
void check_table_is_set_or_empty(const BlockTable& table, const char* name) {
  if (table.page_size == 0 && (table.data != nullptr || table.max_pages_per_sequence != 0))
    throw Error(std::string(name) + ".page_size", "is 0 (no table) but the table is set (data or max_pages_per_sequence)",
                "the page size of the table (a multiple of 16), or an empty BlockTable{} for contiguous K/V");
}

Batch normalize_batch(const Batch& batch, const TensorView& q, const TensorView& k, const TensorView* v) {
  check_table_is_set_or_empty(batch.block_table, "batch.block_table");
  if (v && v->tokens() != k.tokens())
    throw Error("v", "has " + str(v->tokens()) + " tokens but k has " + str(k.tokens()), "the same token count as k");
  Batch out;
  out.block_table = batch.block_table;
  const bool paged = !batch.block_table.empty();
  // The whole-prompt form keeps the name users know ("cu_seqlens").
  const bool prompts = batch.cu_seqlens_k.empty() && !paged;
  out.cu_seqlens_q = normalize_seqlens(batch.cu_seqlens_q, q.tokens(), prompts ? "cu_seqlens" : "batch.cu_seqlens_q");
  if (batch.cu_seqlens_k.empty()) {
    out.cu_seqlens_k = out.cu_seqlens_q;
    if (!paged && k.tokens() != q.tokens())
      throw Error("k", "has " + str(k.tokens()) + " tokens but q has " + str(q.tokens()),
                  "the same token count as q, or a batch whose cu_seqlens_k lists the keys (queries over a KV prefix)");
  } else {
    const SeqLens& cu_k = batch.cu_seqlens_k;
    if (paged) {
      // The keys are logical positions; the pool's size says nothing about their count.
      out.cu_seqlens_k = normalize_seqlens(cu_k, cu_k.empty() ? 0 : cu_k.back(), "batch.cu_seqlens_k");
    } else {
      out.cu_seqlens_k = normalize_seqlens(cu_k, k.tokens(), "batch.cu_seqlens_k");
    }
  }
  check_queries_within_keys(out);
  if (paged) check_block_table(batch.block_table, out.cu_seqlens_k, q, k);
  return out;
}

std::vector<SequencePlan> sequence_shapes(const Batch& batch, int block_size, const char* keys_argument) {
  std::vector<SequencePlan> shapes(batch.cu_seqlens_q.size() - 1);
  for (size_t s = 0; s < shapes.size(); ++s) {
    SequencePlan& sp = shapes[s];
    sp.q_offset = batch.cu_seqlens_q[s];
    sp.n_q = batch.cu_seqlens_q[s + 1] - sp.q_offset;
    sp.kv_offset = batch.cu_seqlens_k[s];
    sp.n_k = batch.cu_seqlens_k[s + 1] - sp.kv_offset;
    sp.num_blocks = rules::num_blocks(sp.n_k, block_size);
    sp.first_row = rules::first_query_block(sp.n_k, sp.n_q, block_size);
    // A head's CSR indexes the causal blocks of its rows with int32 (row_ptr, col).
    const int64_t causal = rules::causal_blocks_of_rows(sp.first_row, sp.num_blocks);
    if (causal > std::numeric_limits<int32_t>::max())
      throw Error(keys_argument,
                  "sequence " + str(static_cast<int64_t>(s)) + " has " + str(sp.n_k) + " keys and " + str(sp.n_q) +
                      " queries: " + str(causal) + " causal blocks of " + str(block_size) +
                      " tokens, beyond a plan's int32 block indices",
                  "at most " + str(std::numeric_limits<int32_t>::max()) + " causal blocks a sequence (a whole prompt: " +
                      str(shape_rules::kMaxPromptBlocks) + " blocks, " +
                      str(shape_rules::kMaxPromptBlocks * block_size) + " tokens at B = " + str(block_size) + ")");
  }
  return shapes;
}

void validate_outputs(const TensorView& q, const TensorView& out, const TensorView& lse) {
  check_view(out, "out", 3, "[Hq, tokens, d]");
  check_view(lse, "lse", 2, "[Hq, tokens]");
  if (out.device != q.device)
    throw Error("out", std::string("is on ") + device_name(out.device) + " but q is on " + device_name(q.device),
                "every tensor of a call on one device");
  if (lse.device != q.device)
    throw Error("lse", std::string("is on ") + device_name(lse.device) + " but q is on " + device_name(q.device),
                "every tensor of a call on one device");
  if (out.heads() != q.heads() || out.tokens() != q.tokens() || out.dim() != q.dim())
    throw Error("out", "has shape " + shape_string(out) + " but q has " + shape_string(q), "the shape of q");
  if (lse.heads() != q.heads() || lse.tokens() != q.tokens())
    throw Error("lse", "has shape " + shape_string(lse), "[" + str(q.heads()) + ", " + str(q.tokens()) + "]");
  if (lse.dtype != DType::f32 && lse.dtype != DType::f64)
    throw Error("lse", std::string("has dtype ") + dtype_name(lse.dtype), "f32 or f64");
}

void check_output_memory(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         const TensorView& lse) {
  check_distinct_elements(out, "out");
  check_distinct_elements(lse, "lse");
  // Every query block reads keys and values, and lse is written while out's rows are and q's read:
  // a shared byte would let one result overwrite another's input. out may be q itself (a block
  // reads its own query rows before it writes them).
  for (const auto& [input, input_name] : {std::pair<const TensorView*, const char*>{&k, "k"}, {&v, "v"}})
    if (views_overlap(out, *input))
      throw Error("out", std::string("overlaps ") + input_name + "'s memory", "separate memory for out (or q itself)");
  // out = q in place, element for element, or apart from q: a block's query tile is read once,
  // before its rows are written, so any other overlap writes rows another block still reads.
  const bool same_as_q = out.data == q.data && out.dtype == q.dtype && out.stride == q.stride;
  if (!same_as_q && views_overlap(out, q))
    throw Error("out", "overlaps q's memory without being q itself (the same pointer, dtype and strides)",
                "separate memory for out, or q itself");
  for (const auto& [other, other_name] :
       {std::pair<const TensorView*, const char*>{&out, "out"}, {&q, "q"}, {&k, "k"}, {&v, "v"}})
    if (views_overlap(lse, *other))
      throw Error("lse", std::string("overlaps ") + other_name + "'s memory", "separate memory for lse");
  // The two outputs, dense or not: no layout has a reason to interleave them, and strided ones
  // that did share an element were written wrong without a word. Their spans must be apart.
  if (lse.device == out.device) {
    const auto [out_first, out_last] = byte_span(out);
    const auto [lse_first, lse_last] = byte_span(lse);
    if (out_first <= lse_last && lse_first <= out_last)
      throw Error("lse", "lies within the bytes out spans (" + shape_and_strides(out) + ")",
                  "separate memory for lse, outside out's span");
  }
}

void validate_plan_for(const TensorView& q, const TensorView& k, const Plan& plan, const BlockTable& block_table) {
  if (plan.num_q_heads != q.heads())
    throw Error("plan", "was made for " + str(plan.num_q_heads) + " query heads but q has " + str(q.heads()),
                "the plan of these tensors");
  if (plan.num_kv_heads != k.heads())
    throw Error("plan", "was made for " + str(plan.num_kv_heads) + " kv heads but k has " + str(k.heads()),
                "the plan of these tensors");
  if (plan.head_dim != q.dim())
    throw Error("plan", "was made for head dim " + str(plan.head_dim) + " but q has " + str(q.dim()),
                "the plan of these tensors");
  if (!shape_rules::valid_block_size(plan.block_size))
    throw Error("plan", "has block size " + str(plan.block_size), shape_rules::kBlockSizeExpected);
  if (!(plan.softmax_scale > 0.0) || !std::isfinite(plan.softmax_scale))
    throw Error("plan", "has softmax scale " + std::to_string(plan.softmax_scale), "a finite scale > 0");
  if (plan.sequences.empty()) throw Error("plan", "has no sequences", "one entry per sequence");
  check_table_is_set_or_empty(block_table, "block_table");
  if (plan.page_size != 0 && block_table.empty())
    throw Error("block_table", "is empty but the plan was made over paged K/V (pages of " + str(plan.page_size) + ")",
                "the block table of the page pool k and v are (a pool read as contiguous K/V gives other keys)");
  // The sequences, as a batch, must be one these tensors (and this table) can hold.
  Batch batch;
  batch.cu_seqlens_q.push_back(0);
  batch.cu_seqlens_k.push_back(0);
  for (size_t s = 0; s < plan.sequences.size(); ++s) {
    const SequencePlan& sp = plan.sequences[s];
    const std::string which = "sequence " + str(static_cast<int64_t>(s));
    // Bounded first: the checks below add offsets and counts (the offsets are compared before any
    // sum with them is formed).
    if (sp.n_q < 1 || sp.n_q > kMaxTokens || sp.n_k < 1 || sp.n_k > kMaxTokens)
      throw Error("plan", which + " has " + str(sp.n_q) + " queries and " + str(sp.n_k) + " keys",
                  "1 to " + str(kMaxTokens) + " of each");
    if (sp.q_offset != batch.cu_seqlens_q.back())
      throw Error("plan", which + " has " + str(sp.n_q) + " queries from row " + str(sp.q_offset),
                  "sequences covering the query rows in order, the next starting at " + str(batch.cu_seqlens_q.back()));
    if (sp.kv_offset != batch.cu_seqlens_k.back() || sp.n_k < sp.n_q)
      throw Error("plan", which + " has " + str(sp.n_k) + " keys from position " + str(sp.kv_offset) + " for " +
                              str(sp.n_q) + " queries",
                  "n_k >= n_q keys covering the key positions in order, the next starting at " +
                      str(batch.cu_seqlens_k.back()));
    if (sp.num_blocks != rules::num_blocks(sp.n_k, plan.block_size) ||
        sp.first_row != rules::first_query_block(sp.n_k, sp.n_q, plan.block_size))
      throw Error("plan", which + " has " + str(sp.num_blocks) + " blocks, first row " + str(sp.first_row),
                  "ceil(n_k / B) = " + str(rules::num_blocks(sp.n_k, plan.block_size)) + " blocks, first row (n_k - n_q) / B = " +
                      str(rules::first_query_block(sp.n_k, sp.n_q, plan.block_size)));
    if (static_cast<int64_t>(sp.heads.size()) != q.heads())
      throw Error("plan", which + " has " + str(static_cast<int64_t>(sp.heads.size())) + " head plans",
                  "one per query head (" + str(q.heads()) + ")");
    batch.cu_seqlens_q.push_back(sp.q_offset + sp.n_q);
    batch.cu_seqlens_k.push_back(sp.kv_offset + sp.n_k);
  }
  if (batch.cu_seqlens_q.back() != q.tokens())
    throw Error("plan", "covers " + str(batch.cu_seqlens_q.back()) + " query rows but q has " + str(q.tokens()),
                "the plan of these tensors");
  if (block_table.empty()) {
    if (batch.cu_seqlens_k.back() != k.tokens())
      throw Error("plan", "covers " + str(batch.cu_seqlens_k.back()) + " keys but k has " + str(k.tokens()),
                  "the plan of these tensors (or the block table of a paged K/V)");
  } else {
    check_block_table(block_table, batch.cu_seqlens_k, q, k);
  }
  plan.check_well_formed();
  // The backends index K/V blocks with the columns directly: re-check the bounds that make that
  // memory-safe, independently of check_well_formed.
  for (size_t s = 0; s < plan.sequences.size(); ++s) {
    const SequencePlan& sp = plan.sequences[s];
    for (size_t h = 0; h < sp.heads.size(); ++h) {
      const HeadPlan& head = sp.heads[h];
      const std::string which = "sequence " + str(static_cast<int64_t>(s)) + ", head " + str(static_cast<int64_t>(h));
      if (head.row_ptr.size() != static_cast<size_t>(sp.num_blocks) + 1 || head.row_ptr[0] != 0 ||
          head.row_ptr.back() != static_cast<int32_t>(head.col.size()))
        throw Error("plan", which + " has a malformed row_ptr", "N + 1 offsets from 0 to nnz");
      for (int32_t r = 0; r < sp.num_blocks; ++r) {
        if (r < sp.first_row) {
          if (head.row_ptr[r + 1] != head.row_ptr[r])
            throw Error("plan", which + " row " + str(r) + " lists blocks but holds no query",
                        "rows before first_row = " + str(sp.first_row) + " empty");
          continue;
        }
        if (head.row_ptr[r + 1] <= head.row_ptr[r])
          throw Error("plan", which + " row " + str(r) + " is empty", "every row to list its diagonal block");
        bool has_diagonal = false;
        for (int32_t e = head.row_ptr[r]; e < head.row_ptr[r + 1]; ++e) {
          const int32_t c = head.col[e];
          if (c < 0 || c > r || (e > head.row_ptr[r] && c <= head.col[e - 1]))
            throw Error("plan", which + " row " + str(r) + " has column " + str(c),
                        "ascending unique columns in [0, row]");
          has_diagonal |= c == r;
        }
        if (!has_diagonal)
          throw Error("plan", which + " row " + str(r) + " lacks its diagonal block", "every row to contain block r");
      }
    }
  }
}

}  // namespace detail

void check_inputs(const TensorView& q, const TensorView& k, const TensorView* v, const Batch& batch) {
  detail::validate_qkv(q, k, v);
  (void)detail::normalize_batch(batch, q, k, v);
}

Plan plan(const TensorView& q, const TensorView& k, const Config& config, const Batch& batch, const Options& options) {
  return detail::within_memory([&] {
    detail::check_options(options);
    detail::validate_qkv(q, k, nullptr);
    detail::check_backend(options, q);
    config.validate();
    const Batch normalized = detail::normalize_batch(batch, q, k, nullptr);
    detail::check_input_values(q, k, nullptr, options, shape_rules::resolve_softmax_scale(config.softmax_scale, q.dim()),
                               normalized.block_table, normalized.cu_seqlens_k);
    return detail::plan_validated(q, k, config, normalized, options);
  });
}

void attend(const TensorView& q, const TensorView& k, const TensorView& v, const Plan& plan,
            const TensorView& out, const TensorView& lse, const Options& options, const BlockTable& block_table) {
  detail::within_memory([&] {
    detail::check_options(options);
    detail::validate_qkv(q, k, &v);
    detail::check_backend(options, q);
    detail::validate_outputs(q, out, lse);
    detail::check_output_memory(q, k, v, out, lse);
    if (v.tokens() != k.tokens())
      throw Error("v", "has " + std::to_string(v.tokens()) + " tokens but k has " + std::to_string(k.tokens()),
                  "the same token count as k");
    detail::validate_plan_for(q, k, plan, block_table);
    SeqLens cu_k{0};
    for (const SequencePlan& sp : plan.sequences) cu_k.push_back(sp.kv_offset + sp.n_k);
    detail::check_input_values(q, k, &v, options, plan.softmax_scale, block_table, cu_k, &out, &lse);
    detail::attend_validated(q, k, v, plan, block_table, out, lse, options);
  });
}

Plan prefill(const TensorView& q, const TensorView& k, const TensorView& v, const Config& config,
             const TensorView& out, const TensorView& lse, const Batch& batch, const Options& options) {
  // Everything is validated before the (expensive) plan, so a bad output view fails fast.
  return detail::within_memory([&] {
    detail::check_options(options);
    detail::validate_qkv(q, k, &v);
    detail::check_backend(options, q);
    detail::validate_outputs(q, out, lse);
    detail::check_output_memory(q, k, v, out, lse);
    config.validate();
    const Batch normalized = detail::normalize_batch(batch, q, k, &v);
    detail::check_input_values(q, k, &v, options, shape_rules::resolve_softmax_scale(config.softmax_scale, q.dim()),
                               normalized.block_table, normalized.cu_seqlens_k, &out, &lse);
    Plan result = detail::plan_validated(q, k, config, normalized, options);
    detail::validate_plan_for(q, k, result, normalized.block_table);  // cheap; guards the backend's own output
    detail::attend_validated(q, k, v, result, normalized.block_table, out, lse, options);
    return result;
  });
}

Plan dense_plan(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, const Batch& batch, int block_size,
                double softmax_scale) {
  if (num_q_heads < 1) throw Error("num_q_heads", "is " + std::to_string(num_q_heads), "at least 1");
  if (num_kv_heads < 1) throw Error("num_kv_heads", "is " + std::to_string(num_kv_heads), "at least 1");
  if (num_q_heads % num_kv_heads != 0)
    throw Error("num_kv_heads", std::to_string(num_kv_heads) + " does not divide num_q_heads = " +
                                    std::to_string(num_q_heads),
                "Hq to be a multiple of Hkv");
  if (head_dim < 1 || head_dim > crisp::kMaxHeadDim)
    throw Error("head_dim", "is " + std::to_string(head_dim), "1 <= d <= " + std::to_string(crisp::kMaxHeadDim));
  if (!shape_rules::valid_block_size(block_size))
    throw Error("block_size", "is " + std::to_string(block_size), shape_rules::kBlockSizeExpected);
  if (!(softmax_scale >= 0.0) || !std::isfinite(softmax_scale))
    throw Error("softmax_scale", "is " + std::to_string(softmax_scale), "0 (1/sqrt(d)) or a finite scale > 0");
  const bool prompts = batch.whole_prompts();
  const char* q_name = prompts ? "cu_seqlens" : "batch.cu_seqlens_q";
  if (batch.cu_seqlens_q.empty())
    throw Error(q_name, "is empty (dense_plan has no tensors to take the token count from)", "{0, ..., tokens}");
  Batch normalized;
  normalized.cu_seqlens_q = detail::normalize_seqlens(batch.cu_seqlens_q, batch.cu_seqlens_q.back(), q_name);
  normalized.cu_seqlens_k =
      batch.cu_seqlens_k.empty()
          ? normalized.cu_seqlens_q
          : detail::normalize_seqlens(batch.cu_seqlens_k, batch.cu_seqlens_k.back(), "batch.cu_seqlens_k");
  if (normalized.cu_seqlens_k.size() != normalized.cu_seqlens_q.size())
    throw Error("batch.cu_seqlens_k", "lists a different number of sequences than cu_seqlens_q",
                "one entry per sequence in both lists");
  std::vector<SequencePlan> shapes =
      detail::sequence_shapes(normalized, block_size, batch.cu_seqlens_k.empty() ? q_name : "batch.cu_seqlens_k");
  for (size_t s = 0; s < shapes.size(); ++s)
    if (shapes[s].n_q > shapes[s].n_k)
      throw Error("batch.cu_seqlens_q", "sequence " + std::to_string(s) + " has more queries than keys", "n_q <= n_k");

  Plan result;
  result.config = Config::from_preset("dense");
  result.config.block_size = block_size;
  result.config.softmax_scale = softmax_scale;
  result.block_size = block_size;
  result.num_q_heads = num_q_heads;
  result.num_kv_heads = num_kv_heads;
  result.head_dim = head_dim;
  result.softmax_scale = shape_rules::resolve_softmax_scale(softmax_scale, head_dim);
  result.page_size = batch.block_table.page_size;
  try {
    for (SequencePlan& sp : shapes) {
      sp.heads.assign(static_cast<size_t>(num_q_heads), detail::make_dense_head(sp, block_size, 0));
      result.sequences.push_back(std::move(sp));
    }
  } catch (const std::bad_alloc&) {
    throw Error("batch", "needs a dense plan of every causal block for " + std::to_string(num_q_heads) +
                             " heads, which does not fit in memory",
                "fewer tokens or heads per plan, or a larger block_size");
  } catch (const std::length_error&) {
    throw Error("batch", "needs a dense plan of every causal block for " + std::to_string(num_q_heads) +
                             " heads, more entries than a vector holds",
                "fewer tokens or heads per plan, or a larger block_size");
  }
  return result;
}

std::vector<HeadMetrics> compare(const TensorView& out_sparse, const TensorView& lse_sparse,
                                 const TensorView& out_dense, const TensorView& lse_dense,
                                 const SeqLens& cu_seqlens) {
  detail::check_view(out_sparse, "out_sparse", 3, "[Hq, tokens, d]");
  detail::check_view(lse_sparse, "lse_sparse", 2, "[Hq, tokens]");
  detail::check_view(out_dense, "out_dense", 3, "[Hq, tokens, d]");
  detail::check_view(lse_dense, "lse_dense", 2, "[Hq, tokens]");
  const std::pair<const TensorView*, const char*> views[] = {
      {&out_sparse, "out_sparse"}, {&lse_sparse, "lse_sparse"}, {&out_dense, "out_dense"}, {&lse_dense, "lse_dense"}};
  for (const auto& [view, name] : views)
    if (view->device != Device::cpu)
      throw Error(name, "is on cuda", "CPU views (copy the outputs to the host before comparing)");
  if (out_dense.shape != out_sparse.shape)
    throw Error("out_dense", "has shape " + detail::shape_string(out_dense) + " but out_sparse has " +
                                 detail::shape_string(out_sparse),
                "the same shape");
  const int64_t H = out_sparse.heads(), tokens = out_sparse.tokens(), d = out_sparse.dim();
  for (const auto& [view, name] : {views[1], views[3]})
    if (view->heads() != H || view->tokens() != tokens)
      throw Error(name, "has shape " + detail::shape_string(*view), "[" + std::to_string(H) + ", " +
                                                                        std::to_string(tokens) + "]");
  const SeqLens cu = detail::normalize_seqlens(cu_seqlens, tokens);
  const int64_t sequences = static_cast<int64_t>(cu.size()) - 1;
  std::vector<HeadMetrics> metrics(static_cast<size_t>(sequences * H));
  cpu::parallel_for(sequences * H, cpu::thread_count(Options{}), [&](int64_t task) {
    const int64_t s = task / H, h = task % H;
    std::vector<double> o_sparse(static_cast<size_t>(d)), o_dense(static_cast<size_t>(d));
    double recall_sum = 0.0, recall_min = std::numeric_limits<double>::infinity();
    double diff_sq = 0.0, dense_sq = 0.0;
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
      double ls = 0.0, ld = 0.0;
      cpu::load_row(lse_sparse, h, t, 1, &ls);
      cpu::load_row(lse_dense, h, t, 1, &ld);
      const double recall = std::exp(ls - ld);
      recall_sum += recall;
      recall_min = std::min(recall_min, recall);
      cpu::load_row(out_sparse, h, t, d, o_sparse.data());
      cpu::load_row(out_dense, h, t, d, o_dense.data());
      for (int64_t x = 0; x < d; ++x) {
        const double diff = o_sparse[x] - o_dense[x];
        diff_sq += diff * diff;
        dense_sq += o_dense[x] * o_dense[x];
      }
    }
    HeadMetrics& m = metrics[task];
    m.recall_mean = recall_sum / static_cast<double>(cu[s + 1] - cu[s]);
    m.recall_min = recall_min;
    // A zero dense output: the error is 0 if the sparse one is zero too, else infinite.
    m.rel_error = dense_sq > 0.0 ? std::sqrt(diff_sq / dense_sq)
                                 : (diff_sq > 0.0 ? std::numeric_limits<double>::infinity() : 0.0);
  });
  return metrics;
}

namespace cuda {
// Here rather than in src/cuda: a pure shape rule that CPU-only builds answer too.
bool head_dim_supported(int64_t head_dim) { return shape_rules::cuda_head_dim_supported(head_dim); }
bool automatic_prefers_hopper(int64_t num_q_heads, const Batch& batch, int64_t head_dim) {
  const double pairs = shape_rules::causal_key_pairs(batch.cu_seqlens_q, batch.cu_seqlens_k);
  return shape_rules::automatic_prefers_hopper(static_cast<double>(std::max<int64_t>(0, num_q_heads)) * pairs *
                                               static_cast<double>(std::max<int64_t>(0, head_dim)));
}
}  // namespace cuda

}  // namespace crisp
