// tests/fuzz/fuzz_gguf.cpp — the GGUF parser (src/model/gguf.cpp) on arbitrary bytes: the file is
// refused with crisp::Error, or it opens and then every metadata accessor, every (small) tensor's
// dequantisation and the tokenizer built from its metadata either work or throw crisp::Error.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

extern const char* const kFuzzHarnessName = "gguf";

namespace {

template <typename F>
void expect_ok_or_error(F&& f) {
  try {
    f();
  } catch (const crisp::Error& e) {
    crisp_fuzz::check_error(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace crisp::model;
  static const std::string& path = crisp_fuzz::scratch_path(".gguf");
  static crisp_fuzz::ScratchCleanup cleanup{path};
  crisp_fuzz::write_scratch(path, data, size);
  expect_ok_or_error([&] {
    GgufFile file(path);
    for (const auto& kv : file.metadata()) {
      const std::string& key = kv.first;
      expect_ok_or_error([&] { (void)file.get_string(key); });
      expect_ok_or_error([&] { (void)file.get_int(key); });
      expect_ok_or_error([&] { (void)file.get_float(key); });
      expect_ok_or_error([&] { (void)file.get_string_array(key); });
      expect_ok_or_error([&] { (void)file.get_int_array(key); });
      expect_ok_or_error([&] { (void)file.get_float_array(key); });
    }
    for (const GgufTensor& t : file.tensors()) {
      // NOTE: a bound on the elements dequantised per tensor keeps one input at milliseconds;
      // the corpus's tensors are all below it, so every type is decoded.
      constexpr int64_t kMaxElements = int64_t{1} << 16;
      if (t.numel() > kMaxElements) continue;
      expect_ok_or_error([&] {
        const std::vector<float> values = dequantize_tensor(file, t);
        if (values.size() != static_cast<size_t>(t.numel())) std::abort();
      });
    }
    expect_ok_or_error([&] {
      const Tokenizer tokenizer(file);
      const std::vector<int32_t> ids = tokenizer.encode("Hello <|im_start|>world 123 naïve");
      (void)tokenizer.decode(ids);
      (void)tokenizer.apply_chat_template({{"user", "hi"}});
    });
  });
  return 0;
}
