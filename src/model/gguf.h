// src/model/gguf.h — reader for GGUF model files (llama.cpp's format, versions 2 and 3):
// metadata, tensor directory, and dequantisation of every tensor type the parser accepts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace crisp {
namespace model {

// ggml tensor type ids (subset; the numeric values are the file format's).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};
const char* to_string(GgmlType t);

// A metadata value: scalars, strings, and arrays of them.
struct GgufValue {
  using Array = std::vector<GgufValue>;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<Array>> value;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;   // ggml order: ne[0] is the contiguous (fastest) dimension
  uint64_t offset = 0;       // from the start of the data section
  std::size_t nbytes = 0;
  int64_t numel() const;
};

class GgufFile {
 public:
  // Reads the whole file into memory (not a mapping: a mapped file truncated by another process
  // would kill this one with SIGBUS) and parses header, metadata and tensor directory.
  // Throws crisp::Error naming the path on a missing, truncated or corrupt file.
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const;
  const std::map<std::string, GgufValue>& metadata() const;
  bool has(const std::string& key) const;
  // Typed accessors; throw crisp::Error naming the key if missing or of another type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;       // any integer type
  double get_float(const std::string& key) const;      // float32/64 (or integer)
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  // Optional forms: the fallback when the key is missing.
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
  double get_float_or(const std::string& key, double fallback) const;
  std::string get_string_or(const std::string& key, const std::string& fallback) const;

  const std::vector<GgufTensor>& tensors() const;
  const GgufTensor& tensor(const std::string& name) const;   // throws crisp::Error if absent
  const GgufTensor* find_tensor(const std::string& name) const;  // nullptr if absent
  const unsigned char* data(const GgufTensor& t) const;       // raw (quantised) bytes

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Bytes of `count` elements (count must be a multiple of the type's block size).
std::size_t ggml_row_bytes(GgmlType type, int64_t count);
// Dequantises `count` consecutive elements starting at `src` (a row start) into float.
void dequantize(GgmlType type, const void* src, float* dst, int64_t count);
// `rows` rows of `row` elements, `row_bytes` apart in `src`, into `dst` (rows in parallel).
// Validates first and never lets an exception escape the parallel region: throws crisp::Error.
void dequantize_rows(GgmlType type, const unsigned char* src, std::size_t row_bytes, float* dst,
                     int64_t rows, int64_t row);
// Whole tensor to float32, in ggml order (ne[0] fastest).
std::vector<float> dequantize_tensor(const GgufFile& file, const GgufTensor& t);

}  // namespace model
}  // namespace crisp
