// tests/test_util.h — shared helpers of the CPU test suite: deterministic per-test seeds, random
// and converted inputs, an independent CSR check, temporary files.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/workload.h"

namespace crisp_test {

// ---------------------------------------------------------------- seeds
// Every test draws fresh random inputs from a seed derived from its own name (FNV-1a of
// "Suite.Name" plus a salt), so the inputs differ between tests but a failure reproduces exactly.
// Wrap the test body's checks in SCOPED_TRACE(seed_trace(seed)) so failures print the seed.
// The crisp preset with the spec's v1 VS budget (the mean noise floor, no min_budget) and the
// routing and PE knobs the crafted tests were written against (rho 2.2, gamma_pe 0.95, uniform
// floor 0.5). The crafted rule tests check a rule on hand-made inputs whatever the preset's current
// choice is; the preset itself is checked by the oracle and property tests.
inline crisp::Config crisp_v1_config() {
  crisp::Config c = crisp::Config::from_preset("crisp");
  c.vs_floor = crisp::VsFloor::mean;
  c.min_budget = 0;
  c.rho = 2.2;
  c.pe_rule = crisp::PeRule::coverage;  // the global walk (the preset's rule until session 26)
  c.pe_gamma = 0.95;
  c.uniform_alpha = 0.5;
  c.proxy_last_rows = 0;       // session 11's short-prompt knobs, off in v1
  c.uniform_floor_blocks = 0;
  return c;
}

inline uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t test_seed(uint64_t salt = 0) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  return fnv1a(name) ^ (salt * 0x9E3779B97F4A7C15ull);
}

inline std::string seed_trace(uint64_t seed) {
  std::ostringstream os;
  os << "seed=" << seed;
  return os.str();
}

// Gaussian values N(0, sigma^2), [count] floats.
inline std::vector<float> gaussian(uint64_t seed, std::size_t count, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<float> out(count);
  for (auto& x : out) x = static_cast<float>(dist(rng));
  return out;
}

// ---------------------------------------------------------------- environment
// Sets (value != nullptr) or unsets an environment variable for the lifetime of the object and
// restores the previous value (CRISP_KERNEL, the one override of the kernel options).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    if (value == nullptr) unsetenv(name);
    else setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_old_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_old_ = false;
  std::string old_;
};

// ---------------------------------------------------------------- the structured workload
// Its spec with the shape and seed of a test (other knobs at their defaults).
inline crisp::WorkloadSpec workload_spec(int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                                         std::vector<int64_t> seq_lens, uint64_t seed) {
  crisp::WorkloadSpec spec;
  spec.num_q_heads = num_q_heads;
  spec.num_kv_heads = num_kv_heads;
  spec.head_dim = head_dim;
  spec.seq_lens = std::move(seq_lens);
  spec.seed = seed;
  return spec;
}

// ---------------------------------------------------------------- a contiguous [H, T, d] input
struct Tensor3 {
  int64_t heads = 0, tokens = 0, dim = 0;
  std::vector<float> data;
  Tensor3() = default;
  Tensor3(int64_t h, int64_t t, int64_t d, float fill = 0.0f)
      : heads(h), tokens(t), dim(d), data(static_cast<std::size_t>(h * t * d), fill) {}
  float& at(int64_t h, int64_t t, int64_t x) { return data[static_cast<std::size_t>((h * tokens + t) * dim + x)]; }
  float at(int64_t h, int64_t t, int64_t x) const { return data[static_cast<std::size_t>((h * tokens + t) * dim + x)]; }
  crisp::TensorView view() {
    return crisp::TensorView::contiguous(data.data(), crisp::DType::f32, heads, tokens, dim);
  }
};

inline Tensor3 random_tensor(uint64_t seed, int64_t h, int64_t t, int64_t d, double sigma = 1.0) {
  Tensor3 x(h, t, d);
  x.data = gaussian(seed, x.data.size(), sigma);
  return x;
}

// ---------------------------------------------------------------- f16 / bf16 (written here, not
// taken from the library, so conversions in the library are checked against an independent one)
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFFu;
  if (((x >> 23) & 0xFF) == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (exp <= 0) {                                                 // subnormal or zero
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // round to nearest even (may carry into exp)
  return static_cast<uint16_t>(h);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -f : f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7FFFu + lsb;  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// ---------------------------------------------------------------- CSR check written independently
// of Plan::check_well_formed: returns "" if the head's layout is well formed, else the first problem.
inline std::string csr_problem(const crisp::HeadPlan& hp, int32_t N) {
  std::ostringstream os;
  if (static_cast<int64_t>(hp.row_ptr.size()) != N + 1) {
    os << "row_ptr has " << hp.row_ptr.size() << " entries, expected " << N + 1;
    return os.str();
  }
  if (hp.row_ptr[0] != 0) return "row_ptr[0] != 0";
  if (hp.row_ptr[N] != static_cast<int32_t>(hp.col.size())) return "row_ptr[N] != col.size()";
  for (int32_t r = 0; r < N; ++r) {
    const int32_t b = hp.row_ptr[r], e = hp.row_ptr[r + 1];
    if (e < b) return "row_ptr decreases at row " + std::to_string(r);
    if (e == b) return "row " + std::to_string(r) + " is empty";
    if (hp.col[b] != 0) return "row " + std::to_string(r) + " lacks the sink block 0";
    if (hp.col[e - 1] != r) return "row " + std::to_string(r) + " lacks its diagonal block";
    for (int32_t i = b + 1; i < e; ++i)
      if (hp.col[i] <= hp.col[i - 1]) return "row " + std::to_string(r) + " columns not strictly ascending";
  }
  const double causal = static_cast<double>(N) * (N + 1) / 2.0;
  if (std::fabs(hp.density - static_cast<double>(hp.col.size()) / causal) > 1e-12)
    return "density != nnz / (N(N+1)/2)";
  auto check_set = [&](const std::vector<int32_t>& s, const char* name) -> std::string {
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] < 0 || s[i] >= N) return std::string(name) + " index out of range";
      if (i > 0 && s[i] <= s[i - 1]) return std::string(name) + " not strictly ascending";
    }
    return "";
  };
  std::string p = check_set(hp.vertical, "vertical");
  if (!p.empty()) return p;
  p = check_set(hp.slash, "slash");
  if (!p.empty()) return p;
  if (hp.route == crisp::Route::dense) {
    if (static_cast<double>(hp.col.size()) != causal) return "dense head is not fully causal";
  } else {
    if (hp.vertical.empty() || hp.vertical[0] != 0) return "vertical lacks anchor 0";
    if (hp.slash.empty() || hp.slash[0] != 0) return "slash lacks anchor 0";
  }
  return "";
}

// ---------------------------------------------------------------- temporary files
inline std::filesystem::path temp_dir() {
#ifdef CRISP_TEST_TMPDIR
  std::filesystem::path base = CRISP_TEST_TMPDIR;
#else
  std::filesystem::path base = std::filesystem::temp_directory_path() / "crisp_tests";
#endif
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = base / (info ? std::string(info->test_suite_name()) + "." + info->name() : "x");
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A .npy v1.0 file with the given header dict text and payload (header padded to 64 bytes, as numpy).
inline std::string npy_bytes(const std::string& dict, const std::string& payload, char major = 1) {
  std::string header = dict;
  const std::size_t preamble = 10;
  std::size_t total = preamble + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(major);
  out.push_back(0);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.push_back(static_cast<char>(len & 0xFF));
  out.push_back(static_cast<char>(len >> 8));
  return out + header + payload;
}

inline std::string float_payload(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// The message of the crisp::Error `f` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const crisp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace crisp_test
