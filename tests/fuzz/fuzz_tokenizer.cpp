// tests/fuzz/fuzz_tokenizer.cpp — the byte-level BPE tokenizer (src/model/tokenizer.cpp) on
// arbitrary text: encoding never fails, every id is in the vocabulary, and decoding gives the
// text back byte for byte (every byte has a token); the chat template takes the text as content.
// The tokenizer is the tiny test model's (the corpus file gguf/tiny_llama.gguf).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

extern const char* const kFuzzHarnessName = "tokenizer";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace crisp::model;
  static const GgufFile file(CRISP_FUZZ_TOKENIZER_MODEL);
  static const Tokenizer tokenizer(file);
  // NOTE: inputs are cut to 1 kB: the BPE merge loop is quadratic in a word's length (issue 18),
  // so longer words would measure that, not find crashes.
  constexpr size_t kMaxTextBytes = 1024;
  const std::string text(reinterpret_cast<const char*>(data), size < kMaxTextBytes ? size : kMaxTextBytes);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) {
      std::fprintf(stderr, "crisp-fuzz: token id %d outside the vocabulary of %d\n", id, tokenizer.vocab_size());
      std::abort();
    }
  }
  if (tokenizer.decode(ids) != text) {
    std::fprintf(stderr, "crisp-fuzz: decode(encode(text)) differs from the text (%zu bytes)\n", text.size());
    std::abort();
  }
  const std::string prompt = tokenizer.apply_chat_template({{"system", "s"}, {"user", text}});
  (void)tokenizer.encode(prompt);
  return 0;
}
