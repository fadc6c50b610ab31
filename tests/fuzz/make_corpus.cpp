// tests/fuzz/make_corpus.cpp — writes the committed seed corpus of the fuzz harnesses:
//   cmake --build build --target crisp_fuzz_make_corpus && build/tests/fuzz/crisp_fuzz_make_corpus tests/fuzz/corpus
// Small valid files that reach every branch worth mutating: .npy of each dtype, version and rank;
// GGUF files with a tokenizer, every metadata type and one tensor of every ggml type; texts.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "model/gguf.h"
#include "tiny_llama_model.h"

namespace {

namespace fs = std::filesystem;
using crisp_test::write_file;

std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A .npy file: magic, version, header length (2 bytes for 1.0, 4 for 2.0/3.0), the header dict
// padded with spaces to a multiple of 64 and ended by '\n', then `data_bytes` bytes of data.
std::vector<uint8_t> npy(int major, const std::string& dict, size_t data_bytes) {
  const size_t prefix = 6 + 2 + (major == 1 ? 2 : 4);
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  const size_t len = header.size();
  for (size_t b = 0; b < (major == 1 ? 2u : 4u); ++b) out.push_back(static_cast<uint8_t>(len >> (8 * b)));
  out.insert(out.end(), header.begin(), header.end());
  std::mt19937 rng(static_cast<unsigned>(data_bytes));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(rng() & 0x3F));  // finite values
  return out;
}

void write_npy_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  write_file(dir / "f4_rank3_v1.npy", npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }", 2 * 3 * 4 * 4));
  write_file(dir / "f2_rank2_v2.npy", npy(2, "{'descr': '<f2', 'fortran_order': False, 'shape': (3, 5), }", 3 * 5 * 2));
  write_file(dir / "f8_rank3_v3.npy", npy(3, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 2), }", 1 * 2 * 2 * 8));
  write_file(dir / "f4_rank1.npy", npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }", 7 * 4));
  write_file(dir / "f4_empty.npy", npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0, 4), }", 0));
  write_file(dir / "fortran.npy", npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2, 2), }", 32));
}

void write_gguf_corpus(const fs::path& dir) {
  using namespace crisp_test;
  fs::create_directories(dir);
  // A whole (tiny) model: a tokenizer, llama metadata and F32 tensors; the tokenizer harness's.
  TinyLlamaSpec spec;
  spec.layers = 1;
  spec.embd = 16;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.ff = 32;
  write_tiny_llama((dir / "tiny_llama.gguf").string(), spec);

  // Every metadata value type and one small tensor of every ggml type the parser knows.
  GgufWriter w;
  w.scalar<uint8_t>("v.u8", kU8, 7);
  w.scalar<int8_t>("v.i8", kI8, -7);
  w.scalar<uint16_t>("v.u16", kU16, 700);
  w.scalar<int16_t>("v.i16", kI16, -700);
  w.u32("v.u32", 70000);
  w.scalar<int32_t>("v.i32", kI32, -70000);
  w.f32("v.f32", 1.5f);
  w.scalar<uint8_t>("v.bool", kBool, 1);
  w.string("v.str", "text");
  w.scalar<uint64_t>("v.u64", kU64, 1ull << 40);
  w.scalar<int64_t>("v.i64", kI64, -(1ll << 40));
  w.scalar<double>("v.f64", kF64, 2.5);
  w.i32_array("v.arr_i32", {1, -2, 3});
  w.string_array("v.arr_str", {"a", "bc"});
  {
    Bytes nested;  // an array of two arrays of u8
    nested.put<uint32_t>(kArray);
    nested.put<uint64_t>(2);
    for (int a = 0; a < 2; ++a) {
      nested.put<uint32_t>(kU8);
      nested.put<uint64_t>(2);
      nested.put<uint8_t>(1);
      nested.put<uint8_t>(2);
    }
    w.raw_kv("v.nested", kArray, nested);
  }
  using crisp::model::GgmlType;
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                            GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K};
  std::mt19937 rng(3);
  for (GgmlType t : types) {
    const bool k_quant = t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_K ||
                         t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_K;
    const uint64_t row = k_quant ? 256 : 32;
    std::vector<uint8_t> bytes(crisp::model::ggml_row_bytes(t, static_cast<int64_t>(row)) * 2);
    // NOTE: small bytes keep the f16 scales of the quantised blocks finite (exponent bits low).
    for (auto& b : bytes) b = static_cast<uint8_t>(rng() & 0x3B);
    w.tensor(std::string("t.") + crisp::model::to_string(t), static_cast<uint32_t>(t), {row, 2}, bytes);
  }
  write_file(dir / "all_types.gguf", w.bytes());
  GgufWriter v2;
  v2.string("general.architecture", "llama");
  v2.tensor("t", 0, {4}, std::vector<uint8_t>(16, 0));
  write_file(dir / "version2.gguf", v2.bytes(2, 64));
}

void write_tokenizer_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  const std::pair<const char*, std::string> texts[] = {
      {"english.txt", "The theatre in the town: another one, then the end."},
      {"digits.txt", "In 2024 there were 1234567 tokens and 3.14159 pies."},
      {"chat.txt", "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"},
      {"unicode.txt", "naïve café — 日本語のテキスト 🙂 Ελληνικά"},
      {"whitespace.txt", "  lead\t\ttabs\n\n\r\nand   runs   of  spaces  "},
      {"contractions.txt", "I'm sure you'll say it's 'quoted' and we've DONE it"},
      {"invalid_utf8.txt", std::string("ok \xff\xfe bad \xc3( cut \xe2\x82 end \xf0\x9f")},
      {"specials_partial.txt", "<|im_sta <|im_end|<|endoftext|><|im_end|>x"},
  };
  for (const auto& [name, text] : texts) write_file(dir / name, to_bytes(text));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  write_npy_corpus(root / "npy");
  write_gguf_corpus(root / "gguf");
  write_tokenizer_corpus(root / "tokenizer");
  std::printf("corpus written to %s\n", root.string().c_str());
  return 0;
}
