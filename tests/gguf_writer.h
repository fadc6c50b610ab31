// tests/gguf_writer.h — writes small GGUF files for the tests, straight from the format
// description (header, metadata key/values, tensor directory, aligned data section), so the
// reader is tested against bytes it did not produce itself.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace crisp_test {

// A little-endian byte buffer.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  void put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void append(const Bytes& o) { b.insert(b.end(), o.b.begin(), o.b.end()); }
};

// GGUF metadata value type ids (the format's).
enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8,
  kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

class GgufWriter {
 public:
  // A key with an already-encoded value (type id + payload).
  void raw_kv(const std::string& key, uint32_t type, const Bytes& payload) {
    kv_.str(key);
    kv_.put<uint32_t>(type);
    kv_.append(payload);
    ++kv_count_;
  }
  template <typename T>
  void scalar(const std::string& key, uint32_t type, T v) {
    Bytes p;
    p.put<T>(v);
    raw_kv(key, type, p);
  }
  void u32(const std::string& key, uint32_t v) { scalar(key, kU32, v); }
  void f32(const std::string& key, float v) { scalar(key, kF32, v); }
  void string(const std::string& key, const std::string& v) {
    Bytes p;
    p.str(v);
    raw_kv(key, kString, p);
  }
  void string_array(const std::string& key, const std::vector<std::string>& v) {
    Bytes p;
    p.put<uint32_t>(kString);
    p.put<uint64_t>(v.size());
    for (const auto& s : v) p.str(s);
    raw_kv(key, kArray, p);
  }
  void i32_array(const std::string& key, const std::vector<int32_t>& v) {
    Bytes p;
    p.put<uint32_t>(kI32);
    p.put<uint64_t>(v.size());
    for (int32_t x : v) p.put<int32_t>(x);
    raw_kv(key, kArray, p);
  }

  // A tensor: ggml type id, shape in ggml order (ne[0] fastest), its encoded bytes. Offsets are
  // assigned in order, each aligned to `alignment`.
  void tensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& ne,
              const std::vector<uint8_t>& data) {
    tensors_.push_back({name, ggml_type, ne, data});
  }

  std::vector<uint8_t> bytes(uint32_t version = 3, uint64_t alignment = 32) const {
    Bytes out;
    out.put<uint32_t>(0x46554747u);  // "GGUF"
    out.put<uint32_t>(version);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kv_count_);
    out.append(kv_);
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      offset = (offset + alignment - 1) / alignment * alignment;
      offsets.push_back(offset);
      out.str(t.name);
      out.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) out.put<uint64_t>(d);
      out.put<uint32_t>(t.type);
      out.put<uint64_t>(offset);
      offset += t.data.size();
    }
    while (out.b.size() % alignment) out.b.push_back(0);
    const std::size_t data_start = out.b.size();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      out.b.resize(data_start + offsets[i], 0);
      out.b.insert(out.b.end(), tensors_[i].data.begin(), tensors_[i].data.end());
    }
    return out.b;
  }

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  Bytes kv_;
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// GPT-2's byte spelling, the form of byte tokens in a byte-level BPE vocabulary
// (tokenizer.ggml.tokens), written from its definition: the printable bytes '!'..'~', 0xA1..0xAC
// and 0xAE..0xFF stand for themselves; the others, in increasing order, become U+0100, U+0101, ...
inline std::string gpt2_spell_byte(unsigned char b) {
  auto printable = [](int x) { return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE; };
  uint32_t cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++cp;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

}  // namespace crisp_test
