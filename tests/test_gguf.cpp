// tests/test_gguf.cpp — the GGUF reader: a small file written by the test (metadata of every
// value type, tensors of every dequantised type quantised by hand from the block definitions),
// corrupt and truncated files, and the real SmolLM2 file when it has been fetched.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "crisp/error.h"
#include "gguf_writer.h"
#include "model/gguf.h"
#include "model_fixture.h"
#include "test_util.h"

using crisp::model::GgmlType;
using crisp::model::GgufFile;
using crisp::model::GgufValue;
using namespace crisp_test;

namespace {

// f16 bit patterns of the exact scales used below.
constexpr uint16_t kF16Quarter = 0x3400;      // 0.25
constexpr uint16_t kF16Half = 0x3800;         // 0.5
constexpr uint16_t kF16MinusOneHalf = 0xBE00; // -1.5
constexpr uint16_t kF16Eighth = 0x3000;       // 0.125
constexpr uint16_t kF16Sixteenth = 0x2C00;    // 0.0625
constexpr uint16_t kF16ThirtySecond = 0x2800; // 0.03125

void put16(std::vector<uint8_t>& b, std::size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xff);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

// The quantisation code of element e of block b, in [0, range): a multiplicative hash, so that
// elements sharing a byte or a nibble position (e and e + 16, e + 32, e + 64, ...) get unrelated
// codes and a misplaced nibble or bit changes the value. (A linear formula such as 7e mod 16
// repeats with period 16 and would hide exactly those mistakes.)
int code_of(int e, int b, int range) {
  const uint32_t h = static_cast<uint32_t>(e + 1) * 2654435761u ^ static_cast<uint32_t>(b + 1) * 40503u;
  return static_cast<int>((h >> 11) % static_cast<uint32_t>(range));
}

// A hand-quantised tensor: its encoded bytes and the values the format definition gives them.
struct Quantised {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

// 32-element formats. Codes come from code_of; the block is packed per the definition:
// the low nibble of byte j is element j, the high nibble element j + 16.
Quantised make_q4_0(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(18, 0);
    put16(blk, 0, kF16Half);
    float vals[32];
    for (int e = 0; e < 32; ++e) {
      const int code = code_of(e, b, 16);
      blk[2 + e % 16] |= static_cast<uint8_t>(e < 16 ? code : code << 4);
      vals[e] = 0.5f * static_cast<float>(code - 8);
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
    q.values.insert(q.values.end(), vals, vals + 32);
  }
  return q;
}

Quantised make_q4_1(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(20, 0);
    put16(blk, 0, kF16Quarter);
    put16(blk, 2, kF16MinusOneHalf);
    float vals[32];
    for (int e = 0; e < 32; ++e) {
      const int code = code_of(e, b, 16);
      blk[4 + e % 16] |= static_cast<uint8_t>(e < 16 ? code : code << 4);
      vals[e] = 0.25f * static_cast<float>(code) - 1.5f;
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
    q.values.insert(q.values.end(), vals, vals + 32);
  }
  return q;
}

// Q5_0 / Q5_1: the fifth bit of element e is bit e of a little-endian 32-bit word.
Quantised make_q5(int blocks, bool with_min) {
  Quantised q;
  const std::size_t head = with_min ? 4 : 2;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(head + 4 + 16, 0);
    put16(blk, 0, kF16Half);
    if (with_min) put16(blk, 2, kF16MinusOneHalf);
    uint32_t high = 0;
    float vals[32];
    for (int e = 0; e < 32; ++e) {
      const int code = code_of(e, b, 32);
      high |= static_cast<uint32_t>(code >> 4) << e;
      const int low = code & 15;
      blk[head + 4 + e % 16] |= static_cast<uint8_t>(e < 16 ? low : low << 4);
      vals[e] = with_min ? 0.5f * static_cast<float>(code) - 1.5f
                         : 0.5f * static_cast<float>(code - 16);
    }
    for (int k = 0; k < 4; ++k) blk[head + k] = static_cast<uint8_t>(high >> (8 * k));
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
    q.values.insert(q.values.end(), vals, vals + 32);
  }
  return q;
}

Quantised make_q8_0(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(34, 0);
    put16(blk, 0, kF16Quarter);
    for (int e = 0; e < 32; ++e) {
      const int code = code_of(e, b, 255) - 127;  // -127 .. 127
      blk[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(code));
      q.values.push_back(0.25f * static_cast<float>(code));
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
  }
  return q;
}

// Q4_K / Q5_K: 256 elements in 8 sub-blocks of 32, each with a 6-bit scale s and 6-bit min m;
// x = d*s*code - dmin*m. Scale/min packing (12 bytes): sub-block j < 4 keeps s in the low 6 bits
// of byte j and m in the low 6 bits of byte j+4; sub-block j >= 4 keeps the low 4 bits of s and m
// in byte j+4 (s low nibble, m high nibble) and their top 2 bits in the top 2 bits of byte j-4
// (s) and byte j (m). Codes: group g = j/2 of 64 elements uses bytes 32g..32g+31, sub-block 2g in
// the low nibbles, 2g+1 in the high nibbles; Q5_K's fifth bit of element l of sub-block j is bit j
// of qh[l].
Quantised make_qk(int blocks, bool five_bit) {
  Quantised q;
  const std::size_t size = five_bit ? 176 : 144;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(size, 0);
    put16(blk, 0, kF16Sixteenth);
    put16(blk, 2, kF16Eighth);
    uint8_t* packed = blk.data() + 4;
    uint8_t* qh = five_bit ? blk.data() + 16 : nullptr;
    uint8_t* qs = blk.data() + (five_bit ? 48 : 16);
    int s[8], m[8];
    for (int j = 0; j < 8; ++j) {
      s[j] = (j * 23 + b * 7 + 9) % 64;
      m[j] = (j * 41 + b * 3 + 17) % 64;
      if (j < 4) {
        packed[j] |= static_cast<uint8_t>(s[j]);
        packed[j + 4] |= static_cast<uint8_t>(m[j]);
      } else {
        packed[j + 4] = static_cast<uint8_t>((s[j] & 15) | ((m[j] & 15) << 4));
        packed[j - 4] |= static_cast<uint8_t>((s[j] >> 4) << 6);
        packed[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
      }
    }
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, l = e % 32, g = j / 2;
      const int code = code_of(e, b, five_bit ? 32 : 16);
      qs[32 * g + l] |= static_cast<uint8_t>(j % 2 == 0 ? (code & 15) : (code & 15) << 4);
      if (five_bit) qh[l] |= static_cast<uint8_t>((code >> 4) << j);
      q.values.push_back(0.0625f * static_cast<float>(s[j] * code) - 0.125f * static_cast<float>(m[j]));
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
  }
  return q;
}

// Q6_K: {ql[128], qh[64], int8 scales[16], f16 d}; x = d * scales[e/16] * (code - 32), 6-bit code.
// Element e: half h = e/128, r = e%128, quarter = r/32, l = r%32; its low 4 bits are in
// ql[64h + l + 32*(quarter&1)] (low nibble for quarters 0-1, high nibble for 2-3), its top 2 bits
// in bits 2*quarter.. of qh[32h + l].
Quantised make_q6_k(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(210, 0);
    int8_t scales[16];
    for (int k = 0; k < 16; ++k) {
      scales[k] = static_cast<int8_t>((k * 37 + b * 11) % 255 - 127);
      blk[192 + k] = static_cast<uint8_t>(scales[k]);
    }
    put16(blk, 208, kF16ThirtySecond);
    for (int e = 0; e < 256; ++e) {
      const int code = code_of(e, b, 64);
      const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
      uint8_t& low = blk[64 * h + l + 32 * (quarter & 1)];
      low |= static_cast<uint8_t>(quarter < 2 ? (code & 15) : (code & 15) << 4);
      blk[128 + 32 * h + l] |= static_cast<uint8_t>((code >> 4) << (2 * quarter));
      q.values.push_back(0.03125f * static_cast<float>(scales[e / 16] * (code - 32)));
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
  }
  return q;
}

// Q2_K: {scales[16], qs[64], f16 d, f16 dmin}; x = d * (scales[s] & 15) * code - dmin *
// (scales[s] >> 4) for the 2-bit code of element e in sub-block s = e / 16. Element e: half
// h = e/128, r = e%128, step = r/32, l = r%32; its code is bits 2*step.. of qs[32h + l].
Quantised make_q2_k(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(84, 0);
    for (int k = 0; k < 16; ++k) blk[k] = static_cast<uint8_t>(code_of(k, b + 7, 256));
    put16(blk, 80, kF16Eighth);
    put16(blk, 82, kF16Quarter);
    for (int e = 0; e < 256; ++e) {
      const int code = code_of(e, b, 4);
      const int h = e / 128, r = e % 128, step = r / 32, l = r % 32;
      blk[16 + 32 * h + l] |= static_cast<uint8_t>(code << (2 * step));
      const int sc = blk[e / 16];
      q.values.push_back(0.125f * static_cast<float>((sc & 15) * code) - 0.25f * static_cast<float>(sc >> 4));
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
  }
  return q;
}

// Q3_K: {hmask[32], qs[64], scales[12], f16 d}; x = d * (s - 32) * (code - 4) for the 3-bit
// code of element e and the 6-bit scale s of its sub-block e / 16. The low 2 bits of the code sit
// as in Q2_K; its bit 2 is bit 4h + step of hmask[l]. Scale k: low 4 bits in nibble k/8 of byte
// k%8, top 2 bits in bits 2*(k/4).. of byte 8 + k%4 of the 12 scale bytes.
Quantised make_q3_k(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(110, 0);
    int scale[16];
    for (int k = 0; k < 16; ++k) {
      scale[k] = code_of(k, b + 3, 64);
      blk[96 + k % 8] |= static_cast<uint8_t>((scale[k] & 15) << (4 * (k / 8)));
      blk[104 + k % 4] |= static_cast<uint8_t>((scale[k] >> 4) << (2 * (k / 4)));
    }
    put16(blk, 108, kF16Sixteenth);
    for (int e = 0; e < 256; ++e) {
      const int code = code_of(e, b, 8);
      const int h = e / 128, r = e % 128, step = r / 32, l = r % 32;
      blk[32 + 32 * h + l] |= static_cast<uint8_t>((code & 3) << (2 * step));
      blk[l] |= static_cast<uint8_t>((code >> 2) << (4 * h + step));
      q.values.push_back(0.0625f * static_cast<float>((scale[e / 16] - 32) * (code - 4)));
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
  }
  return q;
}

// Q8_K: {float32 d, int8 qs[256], int16 bsums[16]}; x = d * code.
Quantised make_q8_k(int blocks) {
  Quantised q;
  for (int b = 0; b < blocks; ++b) {
    std::vector<uint8_t> blk(292, 0);
    const float d = -0.375f;
    std::memcpy(blk.data(), &d, 4);
    for (int e = 0; e < 256; ++e) {
      const int code = code_of(e, b, 256) - 128;  // -128 .. 127
      blk[4 + e] = static_cast<uint8_t>(static_cast<int8_t>(code));
      q.values.push_back(d * static_cast<float>(code));
    }
    for (int k = 0; k < 16; ++k) {  // bsums: the sum of each group of 16 codes
      int sum = 0;
      for (int e = 16 * k; e < 16 * k + 16; ++e) sum += static_cast<int8_t>(blk[4 + e]);
      const auto v = static_cast<uint16_t>(static_cast<int16_t>(sum));
      put16(blk, 260 + 2 * static_cast<std::size_t>(k), v);
    }
    q.bytes.insert(q.bytes.end(), blk.begin(), blk.end());
  }
  return q;
}

Quantised make_f32(int count) {
  Quantised q;
  for (int i = 0; i < count; ++i) {
    const float v = std::ldexp(static_cast<float>(i * 3 - 11), -3) + 1e-7f * static_cast<float>(i);
    uint8_t raw[4];
    std::memcpy(raw, &v, 4);
    q.bytes.insert(q.bytes.end(), raw, raw + 4);
    q.values.push_back(v);
  }
  return q;
}

Quantised make_f16(int count) {  // values k/4 - 3: exact in f16
  Quantised q;
  for (int i = 0; i < count; ++i) {
    const int k = (i * 7) % 40;
    // f16 of k/4 - 3 built from sign, exponent and mantissa by hand (0 encodes as 0).
    const double v = k / 4.0 - 3.0;
    uint16_t bits = 0;
    if (v != 0) {
      int exp2 = 0;
      const double frac = std::frexp(std::fabs(v), &exp2);  // |v| = frac * 2^exp2, frac in [0.5, 1)
      const auto mant = static_cast<uint16_t>(std::lround((frac * 2 - 1) * 1024));
      bits = static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((exp2 - 1 + 15) << 10) | mant);
    }
    q.bytes.push_back(static_cast<uint8_t>(bits & 0xff));
    q.bytes.push_back(static_cast<uint8_t>(bits >> 8));
    q.values.push_back(static_cast<float>(v));
  }
  return q;
}

Quantised make_bf16(int count) {  // bf16 = the top 16 bits of a float
  Quantised q;
  for (int i = 0; i < count; ++i) {
    const float v = static_cast<float>(i * 5 - 17) * 0.5f;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    q.bytes.push_back(static_cast<uint8_t>((u >> 16) & 0xff));
    q.bytes.push_back(static_cast<uint8_t>(u >> 24));
    q.values.push_back(v);
  }
  return q;
}

struct TensorCase {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  Quantised q;
};

std::vector<TensorCase> tensor_cases() {
  return {
      {"t.f32", GgmlType::F32, {8, 3}, make_f32(24)},
      {"t.f16", GgmlType::F16, {8, 3}, make_f16(24)},
      {"t.bf16", GgmlType::BF16, {4, 2, 3}, make_bf16(24)},
      {"t.q4_0", GgmlType::Q4_0, {64, 2}, make_q4_0(4)},
      {"t.q4_1", GgmlType::Q4_1, {64, 2}, make_q4_1(4)},
      {"t.q5_0", GgmlType::Q5_0, {32, 3}, make_q5(3, false)},
      {"t.q5_1", GgmlType::Q5_1, {32, 3}, make_q5(3, true)},
      {"t.q8_0", GgmlType::Q8_0, {96}, make_q8_0(3)},
      {"t.q4_k", GgmlType::Q4_K, {256, 2}, make_qk(2, false)},
      {"t.q5_k", GgmlType::Q5_K, {256, 2}, make_qk(2, true)},
      {"t.q6_k", GgmlType::Q6_K, {512}, make_q6_k(2)},
      {"t.q2_k", GgmlType::Q2_K, {256, 2}, make_q2_k(2)},
      {"t.q3_k", GgmlType::Q3_K, {256, 2}, make_q3_k(2)},
      {"t.q8_k", GgmlType::Q8_K, {512}, make_q8_k(2)},
  };
}

// Metadata of every value type, a string array and a nested array.
GgufWriter metadata_writer() {
  GgufWriter w;
  w.string("general.architecture", "llama");
  w.scalar<uint8_t>("v.u8", kU8, 200);
  w.scalar<int8_t>("v.i8", kI8, -100);
  w.scalar<uint16_t>("v.u16", kU16, 60000);
  w.scalar<int16_t>("v.i16", kI16, -30000);
  w.scalar<uint32_t>("v.u32", kU32, 4000000000u);
  w.scalar<int32_t>("v.i32", kI32, -2000000000);
  w.scalar<uint64_t>("v.u64", kU64, 1ull << 40);
  w.scalar<uint64_t>("v.u64_huge", kU64, ~0ull);
  w.scalar<int64_t>("v.i64", kI64, -(1ll << 40));
  w.scalar<float>("v.f32", kF32, 0.15625f);
  w.scalar<double>("v.f64", kF64, 1e100);
  w.scalar<uint8_t>("v.bool", kBool, 1);
  w.string("v.string", std::string("h\xc3\xa9llo\0world", 12));
  w.string_array("v.strings", {"a", "", "ccc"});
  w.i32_array("v.ints", {3, -1, 7});
  Bytes floats;
  floats.put<uint32_t>(kF32);
  floats.put<uint64_t>(2);
  floats.put<float>(0.5f);
  floats.put<float>(-2.0f);
  w.raw_kv("v.floats", kArray, floats);
  // [[1, 2], [3]] as an array of arrays of u16
  Bytes nested;
  nested.put<uint32_t>(kArray);
  nested.put<uint64_t>(2);
  nested.put<uint32_t>(kU16);
  nested.put<uint64_t>(2);
  nested.put<uint16_t>(1);
  nested.put<uint16_t>(2);
  nested.put<uint32_t>(kU16);
  nested.put<uint64_t>(1);
  nested.put<uint16_t>(3);
  w.raw_kv("v.nested", kArray, nested);
  return w;
}

std::vector<uint8_t> full_file(uint32_t version = 3, uint64_t alignment = 32) {
  GgufWriter w = metadata_writer();
  if (alignment != 32) w.scalar<uint32_t>("general.alignment", kU32, static_cast<uint32_t>(alignment));
  for (const auto& c : tensor_cases())
    w.tensor(c.name, static_cast<uint32_t>(c.type), c.ne, c.q.bytes);
  return w.bytes(version, alignment);
}

std::string write_temp(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = (temp_dir() / name).string();
  write_file(path, bytes);
  return path;
}

// Expects constructing a GgufFile on `bytes` to throw crisp::Error naming the file.
void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& what,
                     const std::string& needle = "") {
  const std::string path = write_temp("bad.gguf", bytes);
  try {
    GgufFile f(path);
    ADD_FAILURE() << what << ": accepted";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << what << ": " << e.what();
    if (!needle.empty()) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  }
}

// Byte offset of the first occurrence of `needle` in `hay`.
std::size_t find_bytes(const std::vector<uint8_t>& hay, const std::string& needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end());
  if (it == hay.end()) throw std::runtime_error("needle not found: " + needle);
  return static_cast<std::size_t>(it - hay.begin());
}

template <typename T>
void poke(std::vector<uint8_t>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

}  // namespace

// ---------------------------------------------------------------- synthetic file

TEST(Gguf, MetadataOfEveryType) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    const std::string path = write_temp("meta.gguf", full_file(version));
    GgufFile f(path);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_int("v.u8"), 200);
    EXPECT_EQ(f.get_int("v.i8"), -100);
    EXPECT_EQ(f.get_int("v.u16"), 60000);
    EXPECT_EQ(f.get_int("v.i16"), -30000);
    EXPECT_EQ(f.get_int("v.u32"), 4000000000ll);
    EXPECT_EQ(f.get_int("v.i32"), -2000000000);
    EXPECT_EQ(f.get_int("v.u64"), 1ll << 40);
    EXPECT_EQ(f.get_int("v.i64"), -(1ll << 40));
    EXPECT_EQ(f.get_float("v.f32"), 0.15625);
    EXPECT_EQ(f.get_float("v.f64"), 1e100);
    EXPECT_EQ(f.get_float("v.u32"), 4e9);  // integers read as floats too
    EXPECT_EQ(std::get<bool>(f.metadata().at("v.bool").value), true);
    EXPECT_EQ(f.get_string("v.string"), std::string("h\xc3\xa9llo\0world", 12));
    EXPECT_EQ(f.get_string_array("v.strings"), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(f.get_int_array("v.ints"), (std::vector<int64_t>{3, -1, 7}));
    EXPECT_EQ(f.get_float_array("v.floats"), (std::vector<double>{0.5, -2.0}));
    const auto& nested = *std::get<std::shared_ptr<GgufValue::Array>>(f.metadata().at("v.nested").value);
    ASSERT_EQ(nested.size(), 2u);
    const auto& first = *std::get<std::shared_ptr<GgufValue::Array>>(nested[0].value);
    const auto& second = *std::get<std::shared_ptr<GgufValue::Array>>(nested[1].value);
    ASSERT_EQ(first.size(), 2u);
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(std::get<uint64_t>(first[1].value), 2u);
    EXPECT_EQ(std::get<uint64_t>(second[0].value), 3u);
    // Optional forms and missing / mistyped keys.
    EXPECT_EQ(f.get_int_or("absent", 7), 7);
    EXPECT_EQ(f.get_float_or("absent", 2.5), 2.5);
    EXPECT_EQ(f.get_string_or("absent", "x"), "x");
    EXPECT_EQ(f.get_int_or("v.u8", 7), 200);
    EXPECT_TRUE(f.has("v.nested"));
    EXPECT_FALSE(f.has("absent"));
  }
}

TEST(Gguf, AccessorsNameTheKeyOnError) {
  const std::string path = write_temp("meta.gguf", full_file());
  GgufFile f(path);
  auto expect_key_error = [](const std::function<void()>& fn, const std::string& key) {
    try {
      fn();
      ADD_FAILURE() << key << ": no error";
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), key) << e.what();
    }
  };
  expect_key_error([&] { f.get_int("missing.key"); }, "missing.key");
  expect_key_error([&] { f.get_int("v.string"); }, "v.string");
  expect_key_error([&] { f.get_int("v.u64_huge"); }, "v.u64_huge");  // does not fit int64
  expect_key_error([&] { f.get_string("v.u8"); }, "v.u8");
  expect_key_error([&] { f.get_float("v.strings"); }, "v.strings");
  expect_key_error([&] { f.get_string_array("v.ints"); }, "v.ints");
  expect_key_error([&] { f.get_int_array("v.strings"); }, "v.strings");
  expect_key_error([&] { f.get_int_array("v.nested"); }, "v.nested");
  expect_key_error([&] { f.get_float_array("v.u8"); }, "v.u8");
  expect_key_error([&] { f.get_int_or("v.string", 1); }, "v.string");  // present, wrong type
  expect_key_error([&] { f.tensor("no.such.tensor"); }, "no.such.tensor");
  EXPECT_EQ(f.find_tensor("no.such.tensor"), nullptr);
}

// A fuzz finding (tests/fuzz/corpus/gguf/nul_key.gguf, seed 2): a key starting with NUL bytes made
// the accessors' error print as an empty message. The key is escaped in the message now.
TEST(Gguf, KeyStartingWithNulIsEscapedInErrors) {
  GgufFile f(std::string(CRISP_SOURCE_DIR) + "/tests/fuzz/corpus/gguf/nul_key.gguf");
  int checked = 0;
  for (const auto& kv : f.metadata()) {
    if (kv.first.empty() || kv.first[0] != '\0') continue;
    ++checked;
    try {
      (void)f.get_int(kv.first);
      ADD_FAILURE() << "a string value read as an int";
    } catch (const crisp::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\0'), std::string::npos);
      EXPECT_EQ(std::string(e.what()).rfind("\\x00", 0), 0u) << what;
    }
  }
  EXPECT_EQ(checked, 1);
}

// Every tensor type the parser accepts has a case in tensor_cases(), so the exact-value test below
// and the corruption test further down dequantise each of them.
TEST(Gguf, EveryAcceptedTypeHasATensorCase) {
  std::set<GgmlType> covered;
  for (const auto& c : tensor_cases()) covered.insert(c.type);
  for (uint32_t raw = 0; raw < 256; ++raw) {
    const auto type = static_cast<GgmlType>(raw);
    bool accepted = true;
    try {
      (void)crisp::model::ggml_row_bytes(type, 0);
    } catch (const crisp::Error&) {
      accepted = false;
    }
    if (accepted) EXPECT_EQ(covered.count(type), 1u) << "type " << raw << " (" << crisp::model::to_string(type) << ")";
  }
}

TEST(Gguf, TensorDirectoryAndExactDequantisation) {
  for (uint64_t alignment : {32ull, 64ull, 256ull}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    const std::string path = write_temp("tensors.gguf", full_file(3, alignment));
    GgufFile f(path);
    const auto cases = tensor_cases();
    ASSERT_EQ(f.tensors().size(), cases.size());
    const unsigned char* first_data = f.data(f.tensors()[0]);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const TensorCase& c = cases[i];
      SCOPED_TRACE(c.name);
      const auto& t = f.tensor(c.name);
      EXPECT_EQ(&t, &f.tensors()[i]);  // directory order is file order
      EXPECT_EQ(t.type, c.type);
      ASSERT_EQ(t.ne.size(), c.ne.size());
      for (std::size_t d = 0; d < c.ne.size(); ++d) EXPECT_EQ(static_cast<uint64_t>(t.ne[d]), c.ne[d]);
      EXPECT_EQ(static_cast<std::size_t>(t.numel()), c.q.values.size());
      EXPECT_EQ(t.nbytes, c.q.bytes.size());
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(static_cast<uint64_t>(f.data(t) - first_data), t.offset);
      EXPECT_EQ(std::memcmp(f.data(t), c.q.bytes.data(), c.q.bytes.size()), 0);
      EXPECT_EQ(crisp::model::ggml_row_bytes(t.type, t.ne[0]) * static_cast<std::size_t>(t.numel() / t.ne[0]),
                t.nbytes);
      const std::vector<float> values = crisp::model::dequantize_tensor(f, t);
      ASSERT_EQ(values.size(), c.q.values.size());
      // Every value is exact: count the differing elements and name the first.
      std::size_t wrong = 0, first_wrong = 0;
      for (std::size_t k = 0; k < values.size(); ++k)
        if (values[k] != c.q.values[k] && wrong++ == 0) first_wrong = k;
      EXPECT_EQ(wrong, 0u) << "first at element " << first_wrong << ": got " << values[first_wrong]
                           << ", expected " << c.q.values[first_wrong];
    }
  }
}

// Fixed blocks (byte k of block b = (37k + 11b + 5) mod 256, f16 scales overwritten) checked
// against values printed by an independent implementation: gguf-py 0.19 (the `gguf` package of
// llama.cpp), gguf.quants.dequantize. Guards the reading of the K-quant layouts, which the
// hand-quantised test above shares with the reader. (gguf-py does not dequantise Q8_K, whose
// layout is one float and 256 plain int8 codes.)
TEST(Gguf, KQuantsMatchIndependentImplementation) {
  struct Golden {
    GgmlType type;
    std::vector<std::pair<std::size_t, uint16_t>> f16_fields;
    double sum;
    std::vector<std::pair<int, float>> elements;
  };
  const std::vector<Golden> goldens = {
      {GgmlType::Q4_K, {{0, 0x2C00}, {2, 0x3000}}, 6036.5,
       {{0, 2.1875f}, {17, 10.0f}, {63, 48.125f}, {100, 0.5f}, {129, 19.125f}, {200, 45.9375f},
        {255, -4.375f}, {256, -7.0f}, {300, -3.0625f}, {511, 3.1875f}}},
      {GgmlType::Q5_K, {{0, 0x2C00}, {2, 0x3000}}, 14562.5,
       {{0, 27.1875f}, {17, 10.0f}, {63, 24.875f}, {100, 5.5f}, {129, 52.125f}, {200, 104.9375f},
        {255, -4.375f}, {256, -7.0f}, {300, 2.5625f}, {511, 10.0625f}}},
      {GgmlType::Q6_K, {{208, 0x2800}}, -91.375,
       {{0, 20.28125f}, {17, -6.875f}, {63, -52.0f}, {100, 84.28125f}, {129, -5.9375f},
        {200, 103.1875f}, {255, -3.0f}, {256, 48.0f}, {300, 22.75f}, {511, -0.9375f}}},
      {GgmlType::Q2_K, {{80, 0x3000}, {82, 0x2C00}}, 508.375,
       {{0, 0.625f}, {17, 2.375f}, {63, -0.4375f}, {100, 0.25f}, {129, 3.125f}, {200, -0.625f},
        {255, -0.1875f}, {256, -0.0625f}, {300, 3.4375f}, {511, 1.1875f}}},
      {GgmlType::Q3_K, {{108, 0x2C00}}, 44.0,
       {{0, -0.6875f}, {17, -1.25f}, {63, 7.0f}, {100, 0.0f}, {129, 2.25f}, {200, 3.125f},
        {255, -0.375f}, {256, 8.0f}, {300, -0.625f}, {511, 2.8125f}}},
  };
  for (const Golden& g : goldens) {
    SCOPED_TRACE(crisp::model::to_string(g.type));
    const std::size_t block_bytes = crisp::model::ggml_row_bytes(g.type, 256);
    std::vector<uint8_t> raw(2 * block_bytes);
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::size_t k = 0; k < block_bytes; ++k)
        raw[b * block_bytes + k] = static_cast<uint8_t>((k * 37 + b * 11 + 5) & 0xff);
      for (const auto& field : g.f16_fields) put16(raw, b * block_bytes + field.first, field.second);
    }
    std::vector<float> y(512);
    crisp::model::dequantize(g.type, raw.data(), y.data(), 512);
    double sum = 0;
    for (float v : y) sum += v;
    EXPECT_EQ(sum, g.sum);
    for (const auto& e : g.elements) EXPECT_EQ(y[e.first], e.second) << "element " << e.first;
  }
}

TEST(Gguf, RowBytesAndBadCounts) {
  using crisp::model::ggml_row_bytes;
  EXPECT_EQ(ggml_row_bytes(GgmlType::F32, 10), 40u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_1, 64), 40u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_0, 576), 18u * 34u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q6_K, 512), 420u);
  EXPECT_THROW(ggml_row_bytes(GgmlType::Q4_1, 33), crisp::Error);
  EXPECT_THROW(ggml_row_bytes(GgmlType::Q6_K, 128), crisp::Error);
  EXPECT_THROW(ggml_row_bytes(static_cast<GgmlType>(99), 32), crisp::Error);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q2_K, 256), 84u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q3_K, 256), 110u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_K, 256), 292u);
  // A type id the reader does not know: a clear error, not garbage.
  std::vector<uint8_t> block(64);
  std::vector<float> out(32);
  EXPECT_THROW(crisp::model::dequantize(static_cast<GgmlType>(99), block.data(), out.data(), 32), crisp::Error);
}

// ---------------------------------------------------------------- bad files

TEST(Gguf, MissingFileNamesThePath) {
  const std::string path = (temp_dir() / "does_not_exist.gguf").string();
  try {
    GgufFile f(path);
    FAIL() << "no error";
  } catch (const crisp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Gguf, EveryTruncationIsRejected) {
  const std::vector<uint8_t> bytes = full_file();
  // The last tensor ends exactly at the end of the file, so every proper prefix lacks bytes the
  // header promises: each must be refused with an error naming the file. One file is cut shorter
  // in place (cheaper than rewriting thousands of files).
  const std::string path = write_temp("truncated.gguf", bytes);
  for (std::size_t len = bytes.size(); len-- > 0;) {
    std::filesystem::resize_file(path, len);
    try {
      GgufFile f(path);
      ADD_FAILURE() << "truncated to " << len << " bytes: accepted";
    } catch (const crisp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    if (HasFailure()) break;
  }
}

TEST(Gguf, CorruptHeadersAreRejected) {
  const std::vector<uint8_t> good = full_file();
  {
    auto b = good;
    b[0] = 'X';
    expect_rejected(b, "bad magic", "magic");
  }
  for (uint32_t version : {0u, 1u, 4u, 0xffffffffu}) {
    auto b = good;
    poke<uint32_t>(b, 4, version);
    expect_rejected(b, "version " + std::to_string(version), "version");
  }
  {
    auto b = good;
    poke<uint64_t>(b, 8, 1ull << 60);  // tensor count
    expect_rejected(b, "huge tensor count");
  }
  {
    auto b = good;
    poke<uint64_t>(b, 16, 1ull << 60);  // metadata count
    expect_rejected(b, "huge metadata count");
  }
  {
    auto b = good;
    poke<uint64_t>(b, 24, 1ull << 62);  // length of the first key
    expect_rejected(b, "huge key length", "truncated");
  }
  {
    // The value type of the first key ("general.architecture") set to 13 (unknown).
    auto b = good;
    const std::size_t at = find_bytes(b, "general.architecture") + 20;
    poke<uint32_t>(b, at, 13);
    expect_rejected(b, "unknown value type", "unknown value type");
  }
  {
    auto b = good;  // bool value 2
    const std::size_t at = find_bytes(b, "v.bool") + 6 + 4;
    b[at] = 2;
    expect_rejected(b, "bool 2", "bool");
  }
  {
    auto b = good;  // the string array's count made huge
    const std::size_t at = find_bytes(b, "v.strings") + 9 + 4 + 4;
    poke<uint64_t>(b, at, 1ull << 61);
    expect_rejected(b, "huge array count", "array");
  }
  {
    auto b = good;  // unknown array element type
    const std::size_t at = find_bytes(b, "v.ints") + 6 + 4;
    poke<uint32_t>(b, at, 77);
    expect_rejected(b, "unknown array element type", "element type");
  }
  {
    auto b = good;  // "v.u8" renamed to "v.i8": a duplicate key
    const std::size_t at = find_bytes(b, "v.u8");
    b[at + 2] = 'i';
    expect_rejected(b, "duplicate key", "twice");
  }
}

TEST(Gguf, CorruptTensorDirectoryIsRejected) {
  const std::vector<uint8_t> good = full_file();
  // Tensor info of "t.q4_1": name (8 + 6 bytes), n_dims, ne[2], type, offset.
  const std::size_t name_at = find_bytes(good, "t.q4_1");
  const std::size_t dims_at = name_at + 6;
  const std::size_t ne0_at = dims_at + 4;
  const std::size_t type_at = ne0_at + 16;
  const std::size_t offset_at = type_at + 4;
  auto corrupt = [&](const std::function<void(std::vector<uint8_t>&)>& edit, const std::string& what,
                     const std::string& needle) {
    auto b = good;
    edit(b);
    expect_rejected(b, what, needle);
  };
  corrupt([&](auto& b) { poke<uint32_t>(b, dims_at, 0); }, "0 dims", "dimensions");
  corrupt([&](auto& b) { poke<uint32_t>(b, dims_at, 5); }, "5 dims", "dimensions");
  corrupt([&](auto& b) { poke<uint64_t>(b, ne0_at, 0); }, "zero extent", "shape");
  corrupt([&](auto& b) { poke<uint64_t>(b, ne0_at + 8, 1ull << 40); }, "huge extent", "truncated");
  corrupt([&](auto& b) { poke<uint64_t>(b, ne0_at + 8, ~0ull); }, "overflowing extent", "shape");
  corrupt([&](auto& b) { poke<uint64_t>(b, ne0_at, 48); }, "row not a block multiple", "block size");
  corrupt([&](auto& b) { poke<uint32_t>(b, type_at, 4); }, "removed type 4", "unknown ggml type");
  corrupt([&](auto& b) { poke<uint32_t>(b, type_at, 1000); }, "type 1000", "unknown ggml type");
  corrupt([&](auto& b) { poke<uint64_t>(b, offset_at, 8); }, "misaligned offset", "aligned");
  corrupt([&](auto& b) { poke<uint64_t>(b, offset_at, 1ull << 50); }, "offset past the end", "truncated");
  corrupt([&](auto& b) { b[name_at + 5] = '0'; }, "duplicate tensor name", "twice");  // t.q4_0
  {
    GgufWriter w;
    w.scalar<uint32_t>("general.alignment", kU32, 24);
    expect_rejected(w.bytes(3, 32), "alignment 24", "alignment");
  }
}

// Random byte corruptions of the header, metadata and directory: each file either opens (and
// then its tensors are readable) or is refused with crisp::Error naming it; nothing crashes.
TEST(Gguf, RandomCorruptionsNeverCrash) {
  const std::vector<uint8_t> good = full_file();
  // The directory ends after the last tensor's record: name, n_dims, ne[0..1], type, offset.
  const std::size_t directory_end = find_bytes(good, "t.q8_k") + 6 + 4 + 8 + 4 + 8;
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  int opened = 0, refused = 0;
  // The mutated bytes are written over one file of constant size (rewriting a fresh file per
  // trial is IO-bound on a busy disk).
  const std::string path = write_temp("fuzz.gguf", good);
  // NOTE: 600 mutated files keep the test around a second on 2 cores while hitting every field.
  for (int trial = 0; trial < 600; ++trial) {
    auto b = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) b[rng() % directory_end] = static_cast<uint8_t>(rng());
    {
      std::FILE* out = std::fopen(path.c_str(), "r+b");
      ASSERT_NE(out, nullptr);
      ASSERT_EQ(std::fwrite(b.data(), 1, directory_end, out), directory_end);
      std::fclose(out);
    }
    try {
      GgufFile f(path);
      // Every type the parser accepts is dequantised (a corruption can turn any tensor into any
      // of them).
      for (const auto& t : f.tensors()) {
        if (t.numel() > (1 << 20)) continue;
        (void)crisp::model::dequantize_tensor(f, t);
      }
      ++opened;
    } catch (const crisp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(opened, 0);  // e.g. edits inside string values or float payloads are harmless
}

// A file truncated (or rewritten) by another process after it was opened: the reader works on
// its own copy, so every tensor stays readable (a memory-mapped file died of SIGBUS here).
TEST(Gguf, FileTruncatedAfterOpeningStaysReadable) {
  const std::string path = write_temp("truncated_later.gguf", full_file());
  GgufFile f(path);
  std::filesystem::resize_file(path, 0);
  const auto cases = tensor_cases();
  for (const TensorCase& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(crisp::model::dequantize_tensor(f, f.tensor(c.name)), c.q.values);
  }
}

TEST(Gguf, NestingDepthIsBounded) {
  // 100 nested single-element arrays: refused (bounded recursion), not a stack overflow.
  Bytes v;
  for (int d = 0; d < 100; ++d) {
    v.put<uint32_t>(kArray);
    v.put<uint64_t>(1);
  }
  v.put<uint32_t>(kU8);
  v.put<uint64_t>(1);
  v.put<uint8_t>(1);
  GgufWriter w;
  w.raw_kv("deep", kArray, v);
  expect_rejected(w.bytes(), "deep nesting", "nested");
}

// ---------------------------------------------------------------- the real model

TEST(GgufRealModel, Metadata) {
  CRISP_REQUIRE_REAL_MODEL(path);
  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 64);
  EXPECT_EQ(f.get_int("llama.context_length"), 8192);
  EXPECT_EQ(f.get_int("llama.vocab_size"), 49152);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
}

TEST(GgufRealModel, TensorDirectory) {
  CRISP_REQUIRE_REAL_MODEL(path);
  GgufFile f(path);
  // 30 layers x 9 tensors + token_embd + output_norm (the output head is tied to token_embd).
  EXPECT_EQ(f.tensors().size(), 272u);
  std::map<std::string, int> types;
  for (const auto& t : f.tensors()) types[crisp::model::to_string(t.type)]++;
  EXPECT_EQ(types, (std::map<std::string, int>{{"F32", 61}, {"Q4_1", 210}, {"Q8_0", 1}}));
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  const auto& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.ne, (std::vector<int64_t>{576, 49152}));
  for (int layer = 0; layer < 30; ++layer) {
    const std::string p = "blk." + std::to_string(layer) + ".";
    EXPECT_EQ(f.tensor(p + "attn_q.weight").ne, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(f.tensor(p + "attn_k.weight").ne, (std::vector<int64_t>{576, 192}));
    EXPECT_EQ(f.tensor(p + "attn_v.weight").ne, (std::vector<int64_t>{576, 192}));
    EXPECT_EQ(f.tensor(p + "attn_output.weight").ne, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(f.tensor(p + "ffn_gate.weight").ne, (std::vector<int64_t>{576, 1536}));
    EXPECT_EQ(f.tensor(p + "ffn_up.weight").ne, (std::vector<int64_t>{576, 1536}));
    EXPECT_EQ(f.tensor(p + "ffn_down.weight").ne, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(f.tensor(p + "attn_norm.weight").type, GgmlType::F32);
    EXPECT_EQ(f.tensor(p + "ffn_norm.weight").type, GgmlType::F32);
  }
}

TEST(GgufRealModel, DequantisationSanity) {
  CRISP_REQUIRE_REAL_MODEL(path);
  GgufFile f(path);
  // Every tensor: finite values, and a spread typical of trained weights (not all zero, no
  // absurd magnitudes).
  for (const auto& t : f.tensors()) {
    SCOPED_TRACE(t.name);
    const std::vector<float> v = crisp::model::dequantize_tensor(f, t);
    ASSERT_EQ(v.size(), static_cast<std::size_t>(t.numel()));
    double sum = 0, sq = 0, max_abs = 0;
    bool finite = true;
    for (float x : v) {
      finite = finite && std::isfinite(x);
      sum += x;
      sq += static_cast<double>(x) * x;
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
    }
    ASSERT_TRUE(finite);
    const double rms = std::sqrt(sq / static_cast<double>(v.size()));
    EXPECT_GT(rms, 1e-3);
    EXPECT_LT(max_abs, 100.0);
    if (t.name.find("norm") != std::string::npos) {
      EXPECT_GT(sum, 0.0);  // RMSNorm gains are positive on the whole
    }
  }
  // Values printed by an independent implementation, gguf-py 0.19 (gguf.quants.dequantize), for
  // this file: a few elements of the Q8_0 embedding and of two Q4_1 matrices (flat ggml order).
  struct Golden {
    const char* tensor;
    std::vector<std::pair<int64_t, float>> elements;
  };
  const std::vector<Golden> goldens = {
      {"token_embd.weight",
       {{0, -0.10654449462890625f}, {1, 0.032978057861328125f}, {575, 0.029754638671875f},
        {576, -0.0238037109375f}, {12345, 0.031005859375f}, {28311551, -0.0417022705078125f}}},
      {"blk.0.attn_q.weight",
       {{0, -0.0963134765625f}, {1, 0.1573486328125f}, {575, 0.12353515625f},
        {576, -0.1173095703125f}, {12345, 0.12109375f}, {331775, -0.255859375f}}},
      {"blk.29.ffn_down.weight",
       {{0, -0.2733154296875f}, {1, 0.186279296875f}, {575, -0.068359375f},
        {576, -0.194580078125f}, {12345, -0.04498291015625f}, {884735, 0.056640625f}}},
  };
  for (const Golden& g : goldens) {
    SCOPED_TRACE(g.tensor);
    const auto& t = f.tensor(g.tensor);
    const std::vector<float> all = crisp::model::dequantize_tensor(f, t);
    for (const auto& e : g.elements) EXPECT_EQ(all[static_cast<std::size_t>(e.first)], e.second) << e.first;
    // One row through the row-level entry point agrees with the whole-tensor path.
    std::vector<float> row(static_cast<std::size_t>(t.ne[0]));
    crisp::model::dequantize(t.type, f.data(t), row.data(), t.ne[0]);
    for (std::size_t k = 0; k < row.size(); ++k) ASSERT_EQ(row[k], all[k]);
  }
}
