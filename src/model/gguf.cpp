// src/model/gguf.cpp — GGUF reader (versions 2 and 3) and dequantisation.
//
// The file layout (little endian throughout), from the GGUF format description:
//   header     : magic "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_kv_count
//   metadata   : kv_count x { string key, uint32 value_type, value }
//                string = uint64 length + bytes (not NUL-terminated);
//                array  = uint32 element_type, uint64 count, count x element (arrays may nest)
//   tensors    : tensor_count x { string name, uint32 n_dims, uint64 ne[n_dims], uint32 ggml_type,
//                uint64 offset }   (offset is relative to the data section)
//   padding    : to a multiple of `general.alignment` (default 32)
//   data       : the tensor bytes, each tensor starting at an aligned offset
//
// Every read goes through ByteReader, which checks the remaining length first, so a truncated or
// corrupt file ends in a crisp::Error naming the path and the byte offset, never in a read past
// the file's bytes. Counts read from the file are checked against the bytes that remain before
// anything is allocated for them, so a corrupt count cannot trigger a huge allocation.
#include "model/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "common/half.h"
#include "crisp/error.h"
#include "io/printable.h"

namespace crisp {
namespace model {

namespace {

// NOTE: GGML_MAX_DIMS in the format is 4; a tensor with more dimensions is a corrupt file.
constexpr uint32_t kMaxTensorDims = 4;
// NOTE: nesting depth of metadata arrays we accept. Real files use depth 1 (arrays of scalars or
// strings); the limit only stops a corrupt file from recursing without bound.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kDefaultAlignment = 32;  // the format's default for general.alignment

// GGUF metadata value types (numeric values are the file format's).
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

// Smallest encoded size of one value of a type: bounds an array's count before allocating.
std::size_t min_encoded_size(uint32_t type) {
  switch (static_cast<ValueType>(type)) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;   // the length prefix
    case ValueType::ARRAY: return 12;   // element type + count
  }
  return 0;  // unknown type: the caller reports it
}

struct TypeTraits {
  int64_t block_size;     // elements per block
  std::size_t block_bytes;  // bytes per block
};

// Block geometry of each ggml type (from the format's block definitions). {0, 0}: unknown.
TypeTraits traits_of(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return {1, 4};
    case GgmlType::F16: return {1, 2};
    case GgmlType::BF16: return {1, 2};
    case GgmlType::Q4_0: return {32, 2 + 16};           // f16 d, 16 bytes of nibbles
    case GgmlType::Q4_1: return {32, 2 + 2 + 16};       // f16 d, f16 m, nibbles
    case GgmlType::Q5_0: return {32, 2 + 4 + 16};       // f16 d, 32 high bits, nibbles
    case GgmlType::Q5_1: return {32, 2 + 2 + 4 + 16};   // f16 d, f16 m, high bits, nibbles
    case GgmlType::Q8_0: return {32, 2 + 32};           // f16 d, int8 q[32]
    case GgmlType::Q2_K: return {256, 16 + 64 + 2 + 2};
    case GgmlType::Q3_K: return {256, 32 + 64 + 12 + 2};
    case GgmlType::Q4_K: return {256, 2 + 2 + 12 + 128};
    case GgmlType::Q5_K: return {256, 2 + 2 + 12 + 32 + 128};
    case GgmlType::Q6_K: return {256, 128 + 64 + 16 + 2};
    case GgmlType::Q8_K: return {256, 4 + 256 + 2 * 16};
  }
  return {0, 0};
}

bool is_known_type(uint32_t raw) {
  return traits_of(static_cast<GgmlType>(raw)).block_size != 0;
}

uint16_t load_u16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
float load_f16(const unsigned char* p) { return half::f16_to_float(load_u16(p)); }

// Bounds-checked little-endian cursor over the file's bytes.
class ByteReader {
 public:
  ByteReader(const unsigned char* data, std::size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  std::size_t position() const { return pos_; }
  std::size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& problem, const std::string& expected = "") const {
    // Names quoted in `problem` come from the file: escaped, so NUL cannot cut the message short
    // and escape sequences cannot act on a terminal.
    throw Error(path_, printable(problem) + " (at byte " + std::to_string(pos_) + ")", expected);
  }

  void need(std::size_t n, const char* what) const {
    if (n > remaining())
      fail(std::string("file is truncated: ") + what + " needs " + std::to_string(n) +
               " bytes but only " + std::to_string(remaining()) + " remain",
           "a complete GGUF file");
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // the format is little endian, as are our hosts
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t length = read<uint64_t>(what);
    if (length > remaining())
      fail(std::string("file is truncated or corrupt: ") + what + " claims " +
               std::to_string(length) + " bytes but only " + std::to_string(remaining()) +
               " remain",
           "a complete GGUF file");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(length));
    pos_ += static_cast<std::size_t>(length);
    return s;
  }

  void seek(std::size_t pos) {
    if (pos > size_) fail("file is truncated: seek past the end", "a complete GGUF file");
    pos_ = pos;
  }

 private:
  const unsigned char* data_;
  std::size_t size_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

GgufValue read_value(ByteReader& r, uint32_t type, const std::string& key, int depth) {
  GgufValue out;
  switch (static_cast<ValueType>(type)) {
    case ValueType::U8: out.value = static_cast<uint64_t>(r.read<uint8_t>("u8 value")); break;
    case ValueType::I8: out.value = static_cast<int64_t>(r.read<int8_t>("i8 value")); break;
    case ValueType::U16: out.value = static_cast<uint64_t>(r.read<uint16_t>("u16 value")); break;
    case ValueType::I16: out.value = static_cast<int64_t>(r.read<int16_t>("i16 value")); break;
    case ValueType::U32: out.value = static_cast<uint64_t>(r.read<uint32_t>("u32 value")); break;
    case ValueType::I32: out.value = static_cast<int64_t>(r.read<int32_t>("i32 value")); break;
    case ValueType::U64: out.value = r.read<uint64_t>("u64 value"); break;
    case ValueType::I64: out.value = r.read<int64_t>("i64 value"); break;
    case ValueType::F32: out.value = static_cast<double>(r.read<float>("f32 value")); break;
    case ValueType::F64: out.value = r.read<double>("f64 value"); break;
    case ValueType::BOOL: {
      const uint8_t b = r.read<uint8_t>("bool value");
      if (b > 1) r.fail("metadata '" + key + "': bool value " + std::to_string(b), "0 or 1");
      out.value = (b != 0);
      break;
    }
    case ValueType::STRING: out.value = r.read_string("string value"); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        r.fail("metadata '" + key + "': arrays nested deeper than " +
                   std::to_string(kMaxArrayDepth),
               "shallower arrays");
      const uint32_t element_type = r.read<uint32_t>("array element type");
      const std::size_t element_min = min_encoded_size(element_type);
      if (element_min == 0)
        r.fail("metadata '" + key + "': unknown array element type " +
                   std::to_string(element_type),
               "a GGUF value type 0..12");
      const uint64_t count = r.read<uint64_t>("array count");
      if (count > r.remaining() / element_min)
        r.fail("file is truncated or corrupt: metadata '" + key + "' array claims " +
                   std::to_string(count) + " elements but only " +
                   std::to_string(r.remaining()) + " bytes remain",
               "a complete GGUF file");
      auto array = std::make_shared<GgufValue::Array>();
      array->reserve(static_cast<std::size_t>(count));
      for (uint64_t i = 0; i < count; ++i)
        array->push_back(read_value(r, element_type, key, depth + 1));
      out.value = std::move(array);
      break;
    }
    default:
      r.fail("metadata '" + key + "': unknown value type " + std::to_string(type),
             "a GGUF value type 0..12");
  }
  return out;
}

const char* value_kind(const GgufValue& v) {
  switch (v.value.index()) {
    case 0: return "unsigned integer";
    case 1: return "signed integer";
    case 2: return "float";
    case 3: return "bool";
    case 4: return "string";
    default: return "array";
  }
}

bool as_int(const GgufValue& v, int64_t& out) {
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(*u);
    return true;
  }
  if (const auto* i = std::get_if<int64_t>(&v.value)) {
    out = *i;
    return true;
  }
  return false;
}

bool as_float(const GgufValue& v, double& out) {
  if (const auto* d = std::get_if<double>(&v.value)) {
    out = *d;
    return true;
  }
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    out = static_cast<double>(*u);
    return true;
  }
  if (const auto* i = std::get_if<int64_t>(&v.value)) {
    out = static_cast<double>(*i);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- dequantisation, per block
// Each function turns one block into block_size floats. Layouts from the ggml block
// definitions; in the 32-element formats the low nibble of byte j is element j and the high
// nibble element j + 16.

void dequant_q4_0(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const unsigned char* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void dequant_q4_1(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const unsigned char* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0 / Q5_1: a 32-bit little-endian word of fifth bits; bit i belongs to element i.
uint32_t load_high_bits(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

void dequant_q5_0(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const uint32_t high = load_high_bits(b + 2);
  const unsigned char* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | (((high >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | (((high >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void dequant_q5_1(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t high = load_high_bits(b + 4);
  const unsigned char* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | (((high >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | (((high >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void dequant_q8_0(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(qs[j]);
}

// Q4_K / Q5_K: eight sub-blocks of 32 with a 6-bit scale and a 6-bit min each, packed in 12 bytes:
// bytes 0..3 hold the low 6 bits of scales 0..3 (top 2 bits: high bits of scales 4..7),
// bytes 4..7 the low 6 bits of mins 0..3 (top 2 bits: high bits of mins 4..7),
// bytes 8..11 the low 4 bits of scale 4+i (low nibble) and min 4+i (high nibble).
void k_scale_min(const unsigned char* packed, int sub, int& scale, int& min) {
  if (sub < 4) {
    scale = packed[sub] & 63;
    min = packed[sub + 4] & 63;
  } else {
    scale = (packed[sub + 4] & 0x0f) | ((packed[sub - 4] >> 6) << 4);
    min = (packed[sub + 4] >> 4) | ((packed[sub] >> 6) << 4);
  }
}

// Q4_K: {f16 d, f16 dmin, scales[12], qs[128]}. Elements come in 4 groups of 64; group g uses
// bytes qs[32g .. 32g+31]: low nibbles are sub-block 2g, high nibbles sub-block 2g+1.
// x = d * scale * q - dmin * min.
void dequant_q4_k(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const unsigned char* scales = b + 4;
  const unsigned char* qs = b + 16;
  for (int g = 0; g < 4; ++g) {
    int sc_lo, m_lo, sc_hi, m_hi;
    k_scale_min(scales, 2 * g, sc_lo, m_lo);
    k_scale_min(scales, 2 * g + 1, sc_hi, m_hi);
    const unsigned char* q = qs + 32 * g;
    float* out = y + 64 * g;
    for (int l = 0; l < 32; ++l) {
      out[l] = d * static_cast<float>(sc_lo) * static_cast<float>(q[l] & 0x0f) - dmin * static_cast<float>(m_lo);
      out[l + 32] = d * static_cast<float>(sc_hi) * static_cast<float>(q[l] >> 4) - dmin * static_cast<float>(m_hi);
    }
  }
}

// Q5_K: {f16 d, f16 dmin, scales[12], qh[32], qs[128]}: as Q4_K, with the fifth bit of element
// l of sub-block s in bit s of qh[l].
void dequant_q5_k(const unsigned char* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const unsigned char* scales = b + 4;
  const unsigned char* qh = b + 16;
  const unsigned char* qs = b + 48;
  for (int g = 0; g < 4; ++g) {
    int sc_lo, m_lo, sc_hi, m_hi;
    k_scale_min(scales, 2 * g, sc_lo, m_lo);
    k_scale_min(scales, 2 * g + 1, sc_hi, m_hi);
    const unsigned char* q = qs + 32 * g;
    float* out = y + 64 * g;
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0x0f) | (((qh[l] >> (2 * g)) & 1) << 4);
      const int hi = (q[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4);
      out[l] = d * static_cast<float>(sc_lo) * static_cast<float>(lo) - dmin * static_cast<float>(m_lo);
      out[l + 32] = d * static_cast<float>(sc_hi) * static_cast<float>(hi) - dmin * static_cast<float>(m_hi);
    }
  }
}

// Q6_K: {ql[128], qh[64], int8 scales[16], f16 d}; 16 sub-blocks of 16 elements,
// x = d * scale[sub] * (q - 32) with 6-bit q. Two halves of 128 elements; in half h,
// element e = 32 * quarter + l (quarter 0..3, l 0..31) takes its low 4 bits from
// ql[64h + l + 32 * (quarter & 1)] (low nibble for quarters 0/1, high nibble for 2/3) and its top
// 2 bits from bits 2*quarter..2*quarter+1 of qh[32h + l]; its scale is scales[8h + 2*quarter + l/16].
void dequant_q6_k(const unsigned char* b, float* y) {
  const unsigned char* ql = b;
  const unsigned char* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int quarter = 0; quarter < 4; ++quarter) {
      for (int l = 0; l < 32; ++l) {
        const unsigned char low_byte = ql[64 * h + l + 32 * (quarter & 1)];
        const int low = quarter < 2 ? (low_byte & 0x0f) : (low_byte >> 4);
        const int top = (qh[32 * h + l] >> (2 * quarter)) & 3;
        const int q = (low | (top << 4)) - 32;
        const int scale = scales[8 * h + 2 * quarter + l / 16];
        y[128 * h + 32 * quarter + l] = d * static_cast<float>(scale) * static_cast<float>(q);
      }
    }
  }
}

// Q2_K: {scales[16], qs[64], f16 d, f16 dmin}; 16 sub-blocks of 16 elements with a 4-bit scale
// (low nibble of scales[sub]) and a 4-bit min (high nibble); x = d * scale * q - dmin * min with
// 2-bit q. Two halves of 128 elements; in half h, element 32 * shift_step + l (shift_step 0..3,
// l 0..31) takes bits 2*shift_step.. of qs[32h + l]; its sub-block is 8h + 2*shift_step + l/16.
void dequant_q2_k(const unsigned char* b, float* y) {
  const unsigned char* scales = b;
  const unsigned char* qs = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  for (int h = 0; h < 2; ++h) {
    for (int step = 0; step < 4; ++step) {
      for (int l = 0; l < 32; ++l) {
        const unsigned char sc = scales[8 * h + 2 * step + l / 16];
        const int q = (qs[32 * h + l] >> (2 * step)) & 3;
        y[128 * h + 32 * step + l] = d * static_cast<float>(sc & 0x0f) * static_cast<float>(q) -
                                     dmin * static_cast<float>(sc >> 4);
      }
    }
  }
}

// Q3_K: {hmask[32], qs[64], scales[12], f16 d}; 16 sub-blocks of 16 elements with a 6-bit scale
// s (x = d * (s - 32) * (q - 4 * !high_bit), 2-bit q). Scale k: low 4 bits from the nibble
// k / 8 of scales[k % 8], top 2 bits from bits 2*(k/4).. of scales[8 + k % 4]. Element layout as
// Q2_K; its high bit is bit 4h + step of hmask[l].
void dequant_q3_k(const unsigned char* b, float* y) {
  const unsigned char* hmask = b;
  const unsigned char* qs = b + 32;
  const unsigned char* packed = b + 96;
  const float d = load_f16(b + 108);
  int scale[16];
  for (int k = 0; k < 16; ++k) {
    const int low = (packed[k % 8] >> (4 * (k / 8))) & 0x0f;
    const int top = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
    scale[k] = (low | (top << 4)) - 32;
  }
  for (int h = 0; h < 2; ++h) {
    for (int step = 0; step < 4; ++step) {
      for (int l = 0; l < 32; ++l) {
        const int low = (qs[32 * h + l] >> (2 * step)) & 3;
        const bool high = (hmask[l] >> (4 * h + step)) & 1;
        const int q = low - (high ? 0 : 4);
        y[128 * h + 32 * step + l] =
            d * static_cast<float>(scale[8 * h + 2 * step + l / 16]) * static_cast<float>(q);
      }
    }
  }
}

// Q8_K: {float32 d, int8 qs[256], int16 bsums[16]}; x = d * q (bsums only speed up dot products).
void dequant_q8_k(const unsigned char* b, float* y) {
  float d;
  std::memcpy(&d, b, sizeof d);  // little endian, as the whole reader assumes
  const auto* qs = reinterpret_cast<const int8_t*>(b + 4);
  for (int j = 0; j < 256; ++j) y[j] = d * static_cast<float>(qs[j]);
}

}  // namespace

// ---------------------------------------------------------------- public helpers

const char* to_string(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::Q4_0: return "Q4_0";
    case GgmlType::Q4_1: return "Q4_1";
    case GgmlType::Q5_0: return "Q5_0";
    case GgmlType::Q5_1: return "Q5_1";
    case GgmlType::Q8_0: return "Q8_0";
    case GgmlType::Q2_K: return "Q2_K";
    case GgmlType::Q3_K: return "Q3_K";
    case GgmlType::Q4_K: return "Q4_K";
    case GgmlType::Q5_K: return "Q5_K";
    case GgmlType::Q6_K: return "Q6_K";
    case GgmlType::Q8_K: return "Q8_K";
    case GgmlType::BF16: return "BF16";
  }
  return "unknown";
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::size_t ggml_row_bytes(GgmlType type, int64_t count) {
  const TypeTraits tr = traits_of(type);
  if (tr.block_size == 0)
    throw Error("ggml type", "unknown type id " + std::to_string(static_cast<uint32_t>(type)),
                "a ggml tensor type");
  if (count < 0 || count % tr.block_size != 0)
    throw Error("count", std::to_string(count) + " elements of " + to_string(type),
                "a non-negative multiple of the block size " + std::to_string(tr.block_size));
  return static_cast<std::size_t>(count / tr.block_size) * tr.block_bytes;
}

void dequantize(GgmlType type, const void* src, float* dst, int64_t count) {
  const TypeTraits tr = traits_of(type);
  ggml_row_bytes(type, count);  // validates type and count
  const auto* in = static_cast<const unsigned char*>(src);
  const int64_t blocks = count / tr.block_size;
  void (*block_fn)(const unsigned char*, float*) = nullptr;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, in, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < count; ++i) dst[i] = load_f16(in + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = half::bf16_to_float(load_u16(in + 2 * i));
      return;
    case GgmlType::Q4_0: block_fn = dequant_q4_0; break;
    case GgmlType::Q4_1: block_fn = dequant_q4_1; break;
    case GgmlType::Q5_0: block_fn = dequant_q5_0; break;
    case GgmlType::Q5_1: block_fn = dequant_q5_1; break;
    case GgmlType::Q8_0: block_fn = dequant_q8_0; break;
    case GgmlType::Q4_K: block_fn = dequant_q4_k; break;
    case GgmlType::Q5_K: block_fn = dequant_q5_k; break;
    case GgmlType::Q6_K: block_fn = dequant_q6_k; break;
    case GgmlType::Q2_K: block_fn = dequant_q2_k; break;
    case GgmlType::Q3_K: block_fn = dequant_q3_k; break;
    case GgmlType::Q8_K: block_fn = dequant_q8_k; break;
  }
  if (!block_fn)  // unreachable: ggml_row_bytes above refused every type without a case here
    throw Error("ggml type", std::string("dequantisation of ") + to_string(type) + " is not implemented",
                "a ggml tensor type the reader knows");
  for (int64_t blk = 0; blk < blocks; ++blk)
    block_fn(in + static_cast<std::size_t>(blk) * tr.block_bytes, dst + blk * tr.block_size);
}

std::vector<float> dequantize_tensor(const GgufFile& file, const GgufTensor& t) {
  const int64_t row = t.ne.empty() ? 1 : t.ne[0];
  const int64_t rows = row == 0 ? 0 : t.numel() / row;
  const std::size_t row_bytes = ggml_row_bytes(t.type, row);
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  dequantize_rows(t.type, file.data(t), row_bytes, out.data(), rows, row);
  return out;
}

void dequantize_rows(GgmlType type, const unsigned char* src, std::size_t row_bytes, float* dst,
                     int64_t rows, int64_t row) {
  ggml_row_bytes(type, row);  // validates type and row length before the parallel region
  // An exception must not leave an OpenMP region (that aborts the process): the first one is
  // kept and rethrown after the loop.
  std::exception_ptr failure;
  // Rows are independent; 28M-element embedding tables are worth the threads.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    try {
      dequantize(type, src + static_cast<std::size_t>(r) * row_bytes,
                 dst + static_cast<std::size_t>(r) * static_cast<std::size_t>(row), row);
    } catch (...) {
#pragma omp critical(crisp_dequantize_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// ---------------------------------------------------------------- GgufFile

struct GgufFile::Impl {
  std::string path;
  std::vector<unsigned char> bytes;  // the whole file
  uint32_t version = 0;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;
  std::map<std::string, std::size_t> tensor_index;
  std::size_t data_offset = 0;  // start of the data section in the file

  const GgufValue& get(const std::string& key) const {
    auto it = metadata.find(key);
    if (it == metadata.end())
      throw Error(printable(key), "metadata key missing from " + path, "a GGUF file that defines it");
    return it->second;
  }
  [[noreturn]] void wrong_kind(const std::string& key, const GgufValue& v,
                               const char* wanted) const {
    // Keys come from the file (a caller may iterate metadata()): escaped, so a leading NUL cannot
    // make the message print as empty.
    throw Error(printable(key), std::string("metadata value in ") + path + " is a " + value_kind(v), wanted);
  }

  void parse();
};

void GgufFile::Impl::parse() {
  ByteReader r(bytes.data(), bytes.size(), path);
  const uint32_t magic = r.read<uint32_t>("magic");
  if (magic != 0x46554747u)  // "GGUF" read as a little-endian uint32
    throw Error(path, "not a GGUF file (bad magic)", "a file starting with the bytes \"GGUF\"");
  version = r.read<uint32_t>("version");
  if (version != 2 && version != 3)
    throw Error(path, "GGUF version " + std::to_string(version) + " is not supported",
                "version 2 or 3");
  const uint64_t tensor_count = r.read<uint64_t>("tensor count");
  const uint64_t kv_count = r.read<uint64_t>("metadata count");
  // NOTE: 12 = smallest encoded key/value (8-byte key length + 4-byte type); 24 = smallest
  // tensor info. Both bound the counts before anything is allocated for them.
  if (kv_count > r.remaining() / 12 || tensor_count > r.remaining() / 24)
    r.fail("file is truncated or corrupt: header claims " + std::to_string(kv_count) +
               " metadata entries and " + std::to_string(tensor_count) + " tensors",
           "a complete GGUF file");

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = r.read_string("metadata key");
    const uint32_t type = r.read<uint32_t>("metadata value type");
    GgufValue value = read_value(r, type, key, 0);
    if (!metadata.emplace(key, std::move(value)).second)
      r.fail("metadata key '" + key + "' appears twice", "unique keys");
  }

  uint64_t alignment = kDefaultAlignment;
  if (auto it = metadata.find("general.alignment"); it != metadata.end()) {
    int64_t a = 0;
    if (!as_int(it->second, a) || a <= 0 || (a & (a - 1)) != 0)
      throw Error(path, "general.alignment is not a positive power of two",
                  "a power of two such as 32");
    alignment = static_cast<uint64_t>(a);
  }

  tensors.reserve(static_cast<std::size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    t.name = r.read_string("tensor name");
    const uint32_t n_dims = r.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxTensorDims)
      r.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions",
             "1 to " + std::to_string(kMaxTensorDims));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t extent = r.read<uint64_t>("tensor dimension");
      // NOTE: 2^62 bounds every extent and the product, so numel fits int64 without overflow.
      constexpr uint64_t kMaxElements = uint64_t{1} << 62;
      if (extent == 0 || extent > kMaxElements || numel > kMaxElements / extent)
        r.fail("tensor '" + t.name + "' has an invalid shape", "positive extents");
      numel *= extent;
      t.ne.push_back(static_cast<int64_t>(extent));
    }
    const uint32_t raw_type = r.read<uint32_t>("tensor type");
    if (!is_known_type(raw_type))
      r.fail("tensor '" + t.name + "' has unknown ggml type " + std::to_string(raw_type),
             "a ggml tensor type");
    t.type = static_cast<GgmlType>(raw_type);
    t.offset = r.read<uint64_t>("tensor offset");
    const TypeTraits tr = traits_of(t.type);
    if (t.ne[0] % tr.block_size != 0)
      r.fail("tensor '" + t.name + "': row of " + std::to_string(t.ne[0]) + " elements",
             std::string("a multiple of the ") + to_string(t.type) + " block size " +
                 std::to_string(tr.block_size));
    t.nbytes = static_cast<std::size_t>(numel / static_cast<uint64_t>(tr.block_size)) *
               tr.block_bytes;
    if (t.offset % alignment != 0)
      r.fail("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not aligned",
             "a multiple of " + std::to_string(alignment));
    if (!tensor_index.emplace(t.name, tensors.size()).second)
      r.fail("tensor name '" + t.name + "' appears twice", "unique tensor names");
    tensors.push_back(std::move(t));
  }

  const uint64_t pos = r.position();
  data_offset = static_cast<std::size_t>((pos + alignment - 1) / alignment * alignment);
  if (data_offset > bytes.size() && !tensors.empty())
    throw Error(path, "file is truncated: no data section after the tensor directory",
                "a complete GGUF file");
  const std::size_t data_size = bytes.size() > data_offset ? bytes.size() - data_offset : 0;
  for (const GgufTensor& t : tensors) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      throw Error(path,
                  "file is truncated: tensor '" + printable(t.name) + "' (" + std::to_string(t.nbytes) +
                      " bytes at data offset " + std::to_string(t.offset) +
                      ") ends past the end of the file (data section " +
                      std::to_string(data_size) + " bytes)",
                  "a complete GGUF file");
  }
}

GgufFile::GgufFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(path, std::string("cannot open: ") + std::strerror(errno),
                "a readable GGUF file (scripts/fetch_model.sh fetches the model)");
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(path, "not a regular file", "a GGUF file");
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 24)  // magic + version + two counts
    throw Error(path, "file is truncated: " + std::to_string(size) + " bytes", "a GGUF file of at least 24 bytes");
  // The file is read, not memory-mapped: a mapped file that another process truncates or rewrites
  // kills this one with SIGBUS on the next access, while a copy stays valid whatever happens to
  // the file. A file that changes size while it is read is refused.
  impl_->bytes.resize(size);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, impl_->bytes.data() + done, size - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(path, std::string("read failed: ") + std::strerror(errno), "a readable GGUF file");
    if (got == 0)
      throw Error(path, "file shrank to " + std::to_string(done) + " bytes while it was read (it had " +
                            std::to_string(size) + ")",
                  "a GGUF file that is not being rewritten");
    done += static_cast<std::size_t>(got);
  }
  impl_->parse();
}

GgufFile::~GgufFile() = default;

uint32_t GgufFile::version() const { return impl_->version; }
const std::map<std::string, GgufValue>& GgufFile::metadata() const { return impl_->metadata; }
bool GgufFile::has(const std::string& key) const { return impl_->metadata.count(key) != 0; }

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (const auto* s = std::get_if<std::string>(&v.value)) return *s;
  impl_->wrong_kind(key, v, "a string");
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  int64_t out = 0;
  if (!as_int(v, out)) impl_->wrong_kind(key, v, "an integer that fits int64");
  return out;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  double out = 0;
  if (!as_float(v, out)) impl_->wrong_kind(key, v, "a number");
  return out;
}

namespace {
const GgufValue::Array& array_of(const GgufValue& v) {
  return *std::get<std::shared_ptr<GgufValue::Array>>(v.value);
}
bool is_array(const GgufValue& v) {
  return std::holds_alternative<std::shared_ptr<GgufValue::Array>>(v.value);
}
}  // namespace

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (!is_array(v)) impl_->wrong_kind(key, v, "an array of strings");
  std::vector<std::string> out;
  out.reserve(array_of(v).size());
  for (const GgufValue& e : array_of(v)) {
    const auto* s = std::get_if<std::string>(&e.value);
    if (!s) impl_->wrong_kind(key, e, "an array of strings");
    out.push_back(*s);
  }
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (!is_array(v)) impl_->wrong_kind(key, v, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(array_of(v).size());
  for (const GgufValue& e : array_of(v)) {
    int64_t x = 0;
    if (!as_int(e, x)) impl_->wrong_kind(key, e, "an array of integers");
    out.push_back(x);
  }
  return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (!is_array(v)) impl_->wrong_kind(key, v, "an array of numbers");
  std::vector<double> out;
  out.reserve(array_of(v).size());
  for (const GgufValue& e : array_of(v)) {
    double x = 0;
    if (!as_float(e, x)) impl_->wrong_kind(key, e, "an array of numbers");
    out.push_back(x);
  }
  return out;
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float_or(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
std::string GgufFile::get_string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const std::vector<GgufTensor>& GgufFile::tensors() const { return impl_->tensors; }

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) throw Error(printable(name), "tensor missing from " + impl_->path, "a GGUF file that holds it");
  return *t;
}

const unsigned char* GgufFile::data(const GgufTensor& t) const {
  // Bounds were checked at parse time for this file's tensors; this re-check catches a tensor
  // record that belongs to another file.
  const std::size_t data_size = impl_->bytes.size() - std::min(impl_->bytes.size(), impl_->data_offset);
  if (t.offset > data_size || t.nbytes > data_size - t.offset)
    throw Error(printable(t.name), "tensor extends past the data section of " + impl_->path,
                "a tensor of this file");
  return impl_->bytes.data() + impl_->data_offset + t.offset;
}

}  // namespace model
}  // namespace crisp
