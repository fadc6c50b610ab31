// src/model/tokenizer.h — the byte-level BPE tokenizer (GPT-2 style, as SmolLM2 uses) and the
// chat template, built from a GGUF file's metadata (tokenizer.ggml.*).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/gguf.h"

namespace crisp {
namespace model {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Throws crisp::Error if the file has no usable tokenizer (model "gpt2" BPE expected).
  explicit Tokenizer(const GgufFile& file);

  // Encodes text (special tokens such as <|im_start|> written in the text are recognised as
  // single tokens). No BOS is added.
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_text(int32_t id) const;  // decoded bytes of one token

  // The chat prompt for `messages` in the model's format (ChatML for SmolLM2:
  // "<|im_start|>role\ncontent<|im_end|>\n" ..., then "<|im_start|>assistant\n" when
  // add_generation_prompt). The template is read from tokenizer.chat_template; crisp implements
  // the ChatML family it describes and throws crisp::Error for templates it does not recognise.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = true) const;

  // Whether the file has a chat template (an instruct model): `crisp run` then uses it by default.
  bool has_chat_template() const { return !chat_template_.empty(); }

  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t vocab_size() const;
  bool is_end_of_generation(int32_t id) const;  // eos or <|im_end|>

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "a b" -> rank
  std::vector<std::pair<std::string, int32_t>> special_tokens_;  // longest first
  std::string chat_template_;
  int32_t bos_ = -1, eos_ = -1, im_end_ = -1;
  // Added for the implementation (tokenizer.cpp):
  bool split_digits_ = false;           // pre-tokenizer isolates each \p{N} (SmolLM2's "smollm")
  std::vector<uint8_t> is_special_;     // per id: 1 for control / user-defined (matched whole)
  int32_t unk_ = -1;                    // tokenizer.ggml.unknown_token_id, -1 if none
  std::string default_system_;          // the template's system turn when none is given
};

}  // namespace model
}  // namespace crisp
