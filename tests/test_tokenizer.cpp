// tests/test_tokenizer.cpp — the byte-level BPE tokenizer: a tiny synthetic vocabulary whose merges
// can be checked by hand (rank order, pre-tokenizer boundaries, digits, byte fallback, added
// tokens, round trips, chat template, bad metadata), then the real SmolLM2 vocabulary against ids
// from Hugging Face `tokenizers` (tests/data/tokenizer_expected.json, made by
// scripts/ref_tokenize.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "crisp/error.h"
#include "gguf_writer.h"
#include "model/tokenizer.h"
#include "model_fixture.h"
#include "test_util.h"

using crisp::model::ChatMessage;
using crisp::model::GgufFile;
using crisp::model::Tokenizer;
using namespace crisp_test;

namespace {

std::string spell(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) out += gpt2_spell_byte(b);
  return out;
}

const char* kChatML =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a test.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// A synthetic vocabulary: 3 control tokens, 1 user-defined token, the 256 byte tokens, then the
// results of `merges` (given in byte-spelled form, "a b"), in rank order.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "smollm";
  std::string model = "gpt2";
  std::string chat_template = kChatML;

  explicit Vocab(const std::vector<std::string>& merge_list) {
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
      tokens.push_back(s);
      types.push_back(3);
    }
    tokens.push_back("<|im");  // user-defined: a prefix of <|im_start|>, to test longest match
    types.push_back(4);
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(gpt2_spell_byte(static_cast<unsigned char>(b)));
      types.push_back(1);
    }
    for (const std::string& m : merge_list) {
      const std::size_t sp = m.find(' ');
      const std::string merged = m.substr(0, sp) + m.substr(sp + 1);
      if (std::find(tokens.begin(), tokens.end(), merged) == tokens.end()) {
        tokens.push_back(merged);
        types.push_back(1);
      }
      merges.push_back(m);
    }
  }

  std::string write() const {
    GgufWriter w;
    w.string("general.architecture", "llama");
    w.string("tokenizer.ggml.model", model);
    w.string("tokenizer.ggml.pre", pre);
    w.string_array("tokenizer.ggml.tokens", tokens);
    w.i32_array("tokenizer.ggml.token_type", types);
    w.string_array("tokenizer.ggml.merges", merges);
    w.u32("tokenizer.ggml.bos_token_id", 1);
    w.u32("tokenizer.ggml.eos_token_id", 0);
    if (!chat_template.empty()) w.string("tokenizer.chat_template", chat_template);
    const std::string path = (temp_dir() / "vocab.gguf").string();
    write_file(path, w.bytes());
    return path;
  }

  // Ids of tokens given in byte-spelled form.
  std::vector<int32_t> ids(const std::vector<std::string>& spelled) const {
    std::vector<int32_t> out;
    for (const std::string& s : spelled) {
      auto it = std::find(tokens.begin(), tokens.end(), s);
      if (it == tokens.end()) throw std::runtime_error("test vocab lacks '" + s + "'");
      out.push_back(static_cast<int32_t>(it - tokens.begin()));
    }
    return out;
  }
};

std::vector<int32_t> encode_with(const Vocab& v, const std::string& text) {
  GgufFile f(v.write());
  return Tokenizer(f).encode(text);
}

}  // namespace

// ---------------------------------------------------------------- synthetic vocabulary

TEST(Tokenizer, MergesApplyInRankOrder) {
  // "abc": with "b c" ranked first the result is a|bc; with "a b" first it is ab|c.
  Vocab bc_first({"b c", "a b"});
  EXPECT_EQ(encode_with(bc_first, "abc"), bc_first.ids({"a", "bc"}));
  Vocab ab_first({"a b", "b c"});
  EXPECT_EQ(encode_with(ab_first, "abc"), ab_first.ids({"ab", "c"}));
  // Ties between equal pairs go to the leftmost: "aaa" -> aa|a.
  Vocab aa({"a a"});
  EXPECT_EQ(encode_with(aa, "aaa"), aa.ids({"aa", "a"}));
  EXPECT_EQ(encode_with(aa, "aaaa"), aa.ids({"aa", "aa"}));
  // Multi-step merges: h e -> he, l l -> ll, he ll -> hell, hell o -> hello.
  Vocab hello({"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"});
  EXPECT_EQ(encode_with(hello, "hello world"), hello.ids({"hello", "Ġwor", "l", "d"}));
  EXPECT_EQ(encode_with(hello, "hellhole"), hello.ids({"hell", "h", "o", "l", "e"}));
}

// A 200 kB word of one letter with the merges a+a, aa+aa, ... (2^17 letters): the lowest rank
// merges first, leftmost on ties, so every level pairs up its tokens from the left and the word
// ends as the binary digits of its length, largest token first. A BPE that rescans the word per
// merge needs ~10^10 steps here and runs into the test's TIMEOUT (tests/CMakeLists.txt); the heap
// BPE takes well under a second.
TEST(Tokenizer, LongWordTokenizesInQuasiLinearTime) {
  constexpr int kLevels = 17;
  constexpr std::size_t kLength = 200000;
  std::vector<std::string> merges;
  std::string piece = "a";
  for (int level = 0; level < kLevels; ++level) {
    merges.push_back(piece + " " + piece);
    piece += piece;
  }
  const Vocab v(merges);
  std::vector<std::string> expected;
  for (int level = kLevels; level >= 0; --level)
    if (kLength & (std::size_t{1} << level)) expected.push_back(std::string(std::size_t{1} << level, 'a'));
  EXPECT_EQ(encode_with(v, std::string(kLength, 'a')), v.ids(expected));
}

TEST(Tokenizer, ByteFallbackSpellsEveryByte) {
  Vocab v({"h e"});
  // No merge covers é (bytes C3 A9): two byte tokens, spelled Ã and ©.
  EXPECT_EQ(encode_with(v, "hé"), v.ids({"h", "Ã", "©"}));
  // Control bytes and invalid UTF-8 still reach the vocabulary byte by byte.
  EXPECT_EQ(encode_with(v, std::string("\x01\xff\xfe", 3)), v.ids({"ā", "ÿ", "þ"}));
  EXPECT_EQ(encode_with(v, "\t"), v.ids({"ĉ"}));
}

TEST(Tokenizer, PreTokenizerKeepsMergesInsideWords) {
  // Merges that would cross a word boundary must never apply.
  Vocab v({"a Ġ", "t '", "i t", "' s", "' S", "Ġ Ġ", "Ġ b", "Ċ Ċ", "Ã ¯", "a Ã¯", "x 1"});
  EXPECT_EQ(encode_with(v, "a b"), v.ids({"a", "Ġb"}));
  // Contractions (case-sensitive): it|'s, but it|'|S.
  EXPECT_EQ(encode_with(v, "it's"), v.ids({"it", "'s"}));
  EXPECT_EQ(encode_with(v, "it'S"), v.ids({"it", "'", "S"}));
  // A whitespace run before a word gives its last space to the word: a|Ġ|Ġb, though "Ġ Ġ" ranks
  // before "Ġ b"; at the end of the text the whole run is one word.
  EXPECT_EQ(encode_with(v, "a  b"), v.ids({"a", "Ġ", "Ġb"}));
  EXPECT_EQ(encode_with(v, "a  "), v.ids({"a", "ĠĠ"}));
  // Newlines: "\n\nb" -> \n | \n | b (only a space joins the next word); at the end, \n\n is one.
  EXPECT_EQ(encode_with(v, "\n\nb"), v.ids({"Ċ", "Ċ", "b"}));
  EXPECT_EQ(encode_with(v, "b\n\n"), v.ids({"b", "ĊĊ"}));
  // ï is a letter (Unicode Ll), so "naïve" is one word and a+ï merge.
  EXPECT_EQ(encode_with(v, "naïve"), v.ids({"n", "aÃ¯", "v", "e"}));
  // A letter run and a number run are different words: x|1 stays apart under the GPT-2 pattern.
  Vocab gpt2 = v;
  gpt2.pre = "gpt2";
  EXPECT_EQ(encode_with(gpt2, "x1"), gpt2.ids({"x", "1"}));
}

TEST(Tokenizer, DigitsAreIsolatedForSmolLM) {
  Vocab v({"1 2", "Ġ 1", "Ġ 12"});
  // smollm: Digits(individual_digits) first, so neither "12" nor "Ġ1" can form.
  EXPECT_EQ(encode_with(v, "x 12"), v.ids({"x", "Ġ", "1", "2"}));
  // ² (U+00B2, category No) is a number too: isolated from the letters around it.
  EXPECT_EQ(encode_with(v, "m²s"), v.ids({"m", "Â", "²", "s"}));
  // Plain GPT-2 pattern: " 12" is one word; "1 2" (rank 0) then "Ġ 12" (rank 2) merge.
  Vocab gpt2 = v;
  gpt2.pre = "gpt2";
  EXPECT_EQ(encode_with(gpt2, "x 12"), gpt2.ids({"x", "Ġ12"}));
}

TEST(Tokenizer, AddedTokensAreMatchedWhole) {
  Vocab v({"h i"});
  EXPECT_EQ(encode_with(v, "<|im_start|>user\nhi<|im_end|>"),
            v.ids({"<|im_start|>", "u", "s", "e", "r", "Ċ", "hi", "<|im_end|>"}));
  // Longest match at a position: "<|im_start|>" wins over the user-defined prefix "<|im".
  EXPECT_EQ(encode_with(v, "<|im_start|>"), v.ids({"<|im_start|>"}));
  EXPECT_EQ(encode_with(v, "<|imx"), v.ids({"<|im", "x"}));
  // Text around an added token is pre-tokenized on its own: the space before it stays a word.
  EXPECT_EQ(encode_with(v, "hi <|endoftext|>hi"), v.ids({"hi", "Ġ", "<|endoftext|>", "hi"}));
  // A broken special token is ordinary text.
  EXPECT_EQ(encode_with(v, "<|im_en"), v.ids({"<|im", "_", "e", "n"}));
}

TEST(Tokenizer, DecodeRoundTrips) {
  Vocab v({"h e", "l l", "he ll", "Ġ w", "Ã ©"});
  GgufFile f(v.write());
  Tokenizer tok(f);
  for (const std::string& text :
       {std::string("hello world"), std::string("  spaces\t\ttabs\n\nnewlines  "),
        std::string("café 日本語 😀 ½"), std::string("<|im_start|>user\nhi<|im_end|>\n"),
        std::string("\x01\x02\xff\xfe invalid \xc3", 14), std::string("")}) {
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
  EXPECT_EQ(tok.token_text(v.ids({"Ġw"})[0]), " w");
  EXPECT_EQ(tok.token_text(v.ids({"Ã©"})[0]), "é");
  EXPECT_EQ(tok.token_text(1), "<|im_start|>");
  EXPECT_THROW(tok.token_text(-1), crisp::Error);
  EXPECT_THROW(tok.token_text(tok.vocab_size()), crisp::Error);
  EXPECT_EQ(tok.vocab_size(), static_cast<int32_t>(v.tokens.size()));
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 0);
  EXPECT_TRUE(tok.is_end_of_generation(0));
  EXPECT_TRUE(tok.is_end_of_generation(2));  // <|im_end|>
  EXPECT_FALSE(tok.is_end_of_generation(1));
}

TEST(Tokenizer, ChatMLTemplate) {
  Vocab v({});
  GgufFile f(v.write());
  Tokenizer tok(f);
  // No system turn given: the template's own one comes first.
  EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}),
            "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(tok.apply_chat_template({}, true), "<|im_start|>assistant\n");
}

TEST(Tokenizer, BadMetadataIsRefused) {
  auto expect_error = [](const Vocab& v, const std::string& argument) {
    GgufFile f(v.write());
    try {
      Tokenizer tok(f);
      ADD_FAILURE() << argument << ": accepted";
    } catch (const crisp::Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  Vocab llama({});
  llama.model = "llama";
  expect_error(llama, "tokenizer.ggml.model");
  Vocab qwen({});
  qwen.pre = "qwen2";
  expect_error(qwen, "tokenizer.ggml.pre");
  Vocab bad_merge({"a b"});
  bad_merge.merges.push_back("a zz");  // zz is not a token
  expect_error(bad_merge, "tokenizer.ggml.merges");
  Vocab malformed({});
  malformed.merges.push_back("abc");
  expect_error(malformed, "tokenizer.ggml.merges");
  Vocab short_types({});
  short_types.types.pop_back();
  expect_error(short_types, "tokenizer.ggml.token_type");
  // A template crisp does not implement is refused when used, not silently misapplied.
  Vocab other({});
  other.chat_template = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";
  GgufFile f(other.write());
  Tokenizer tok(f);
  try {
    tok.apply_chat_template({{"user", "x"}});
    ADD_FAILURE() << "unknown template accepted";
  } catch (const crisp::Error& e) {
    EXPECT_EQ(e.argument(), "tokenizer.chat_template");
  }
}

// ---------------------------------------------------------------- the real SmolLM2 vocabulary

TEST(TokenizerRealModel, MatchesHuggingFaceTokenizers) {
  CRISP_REQUIRE_REAL_MODEL(path);
  const std::string expected_path = (repo_root() / "tests/data/tokenizer_expected.json").string();
  std::ifstream in(expected_path);
  ASSERT_TRUE(in) << "cannot read " << expected_path;
  const nlohmann::json expected = nlohmann::json::parse(in);
  GgufFile f(path);
  Tokenizer tok(f);
  ASSERT_EQ(tok.vocab_size(), expected.at("vocab_size").get<int32_t>());
  int checked = 0;
  for (const auto& c : expected.at("cases")) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    const std::string text = c.at("text");
    if (c.contains("messages")) {
      std::vector<ChatMessage> messages;
      for (const auto& m : c.at("messages")) messages.push_back({m.at("role"), m.at("content")});
      EXPECT_EQ(tok.apply_chat_template(messages, c.at("add_generation_prompt").get<bool>()), text);
    }
    const std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(got, want);
    EXPECT_EQ(tok.decode(got), text);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(TokenizerRealModel, SpecialIdsAndTemplate) {
  CRISP_REQUIRE_REAL_MODEL(path);
  GgufFile f(path);
  Tokenizer tok(f);
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.token_text(tok.bos_id()), "<|im_start|>");
  EXPECT_EQ(tok.token_text(tok.eos_id()), "<|im_end|>");
  EXPECT_TRUE(tok.is_end_of_generation(tok.encode("<|im_end|>").at(0)));
  EXPECT_EQ(tok.encode("<|im_start|><|im_end|><|endoftext|>"), (std::vector<int32_t>{1, 2, 0}));
}

TEST(TokenizerRealModel, LongPromptRoundTrip) {
  CRISP_REQUIRE_REAL_MODEL(path);
  const char* data_dir = std::getenv("CRISP_DATA_DIR");
  const std::filesystem::path prompts =
      data_dir ? std::filesystem::path(data_dir) / "long_qa_prompts.json"
               : repo_root().parent_path() / "shared/data/long_qa_prompts.json";
  std::ifstream in(prompts);
  if (!in) GTEST_SKIP() << prompts << " not found (set CRISP_DATA_DIR)";
  const nlohmann::json all = nlohmann::json::parse(in);
  GgufFile f(path);
  Tokenizer tok(f);
  const std::string text = all.at(0).at("prompt");
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  // The data README calls this prompt "about 4k tokens".
  EXPECT_GT(ids.size(), 3000u);
  EXPECT_LT(ids.size(), 5000u);
}
