// src/model/tokenizer.cpp — GPT-2 byte-level BPE, as Hugging Face `tokenizers` runs it for
// SmolLM2, rebuilt from a GGUF file's tokenizer.ggml.* metadata.
//
// encode(text) does, in order (the same pipeline as SmolLM2's tokenizer.json):
//   1. Added tokens: the control / user-defined tokens (token_type 3 / 4, e.g. <|im_start|>) are
//      found in the raw text, leftmost match first and the longest one at a position, and emitted
//      whole; the text between them goes through steps 2-4 on its own.
//   2. Pre-tokenizer Digits(individual_digits) — only for tokenizer.ggml.pre "smollm" and its
//      family — every \p{N} code point becomes a piece of its own.
//   3. Pre-tokenizer ByteLevel(use_regex): each piece is split by the GPT-2 pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (matched by hand below, alternative by alternative, leftmost-first as a backtracking regex
//      engine does), and every byte of a word is spelled as the GPT-2 byte->unicode character.
//   4. BPE: the lowest-ranked adjacent pair of symbols is merged (leftmost on ties) until no
//      pair has a rank; the symbols are then looked up in the vocabulary.
// \p{L} / \p{N} come from generated tables (unicode_ranges.inc, Unicode general categories L*,
// N*); \s is the Unicode White_Space property. Invalid UTF-8 bytes are kept as single
// non-letter, non-number, non-space characters, so every input byte reaches the BPE.
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <functional>

#include "crisp/error.h"

namespace crisp {
namespace model {

namespace {

struct CodepointRange {
  uint32_t first, last;
};
#include "model/unicode_ranges.inc"

template <std::size_t N>
bool in_ranges(const CodepointRange (&ranges)[N], uint32_t cp) {
  const CodepointRange* end = ranges + N;
  const CodepointRange* it = std::upper_bound(
      ranges, end, cp, [](uint32_t c, const CodepointRange& r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

// NOTE: code points above 0x10FFFF cannot occur in valid UTF-8; kInvalidByte marks an undecodable
// byte, which the pre-tokenizer treats as "other" (neither letter, number nor space).
constexpr uint32_t kInvalidByte = 0xFFFFFFFFu;

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return cp != kInvalidByte && in_ranges(kLetterRanges, cp);
}
bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return cp != kInvalidByte && in_ranges(kNumberRanges, cp);
}
// The Unicode White_Space property (what \s matches in the regex engine of HF tokenizers).
bool is_space(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// One decoded character of the input: its code point and where its bytes are.
struct Char {
  uint32_t cp;
  std::size_t begin, end;  // byte range in the text
};

// Lenient UTF-8 decoding: a malformed or truncated sequence yields one kInvalidByte char per byte.
std::vector<Char> decode_utf8(const std::string& s, std::size_t begin, std::size_t end) {
  std::vector<Char> out;
  out.reserve(end - begin);
  std::size_t i = begin;
  while (i < end) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0, min_cp = 0;
    if (b0 < 0x80) { len = 1; cp = b0; }
    else if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min_cp = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min_cp = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min_cp = 0x10000; }
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= end;
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (ok && len > 1 && (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)))
      ok = false;
    if (!ok) {
      out.push_back({kInvalidByte, i, i + 1});
      ++i;
    } else {
      out.push_back({cp, i, i + static_cast<std::size_t>(len)});
      i += static_cast<std::size_t>(len);
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's byte <-> unicode spelling: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves; the other 68 bytes, in increasing order, get the code points 256, 257, ...
struct ByteSpelling {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;
  std::array<int, 324> cp_to_byte{};  // code points 0..323 cover the whole image; -1: none

  ByteSpelling() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = b;
      append_utf8(byte_to_utf8[b], byte_to_cp[b]);
    }
  }
};

const ByteSpelling& byte_spelling() {
  static const ByteSpelling spelling;
  return spelling;
}

// ---------------------------------------------------------------- pre-tokenizer
// Appends to `words` the [begin, end) char-index ranges of the GPT-2 pattern's matches in
// chars[from, to). Every char lands in exactly one match (the last alternative, \s+, and the
// [^\s\p{L}\p{N}]+ alternative together cover every char).
void gpt2_split(const std::vector<Char>& c, std::size_t from, std::size_t to,
                std::vector<std::pair<std::size_t, std::size_t>>& words) {
  auto cls_other = [&](std::size_t k) {
    return !is_space(c[k].cp) && !is_letter(c[k].cp) && !is_number(c[k].cp);
  };
  std::size_t i = from;
  while (i < to) {
    const uint32_t cp = c[i].cp;
    std::size_t j = i;
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in the pattern)
    if (cp == '\'' && i + 1 < to) {
      const uint32_t n1 = c[i + 1].cp;
      const uint32_t n2 = i + 2 < to ? c[i + 2].cp : 0;
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') j = i + 2;
      else if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l'))
        j = i + 3;
    }
    if (j == i) {
      // ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional single ' ' and a run of X.
      const std::size_t start = (cp == ' ' && i + 1 < to) ? i + 1 : i;
      const uint32_t first = c[start].cp;
      bool (*same)(uint32_t) = nullptr;
      if (is_letter(first)) same = is_letter;
      else if (is_number(first)) same = is_number;
      if (same) {
        j = start + 1;
        while (j < to && same(c[j].cp)) ++j;
      } else if (cls_other(start)) {
        j = start + 1;
        while (j < to && cls_other(j)) ++j;
      }
    }
    if (j == i) {
      // \s+(?!\S) | \s+ : a whitespace run; when a non-space follows, the run gives back its last
      // char (which then prefixes the next word) unless that would leave it empty.
      std::size_t run_end = i;
      while (run_end < to && is_space(c[run_end].cp)) ++run_end;
      j = run_end;
      if (run_end < to && run_end - i > 1) j = run_end - 1;
    }
    words.emplace_back(i, j);
    i = j;
  }
}

}  // namespace

// ---------------------------------------------------------------- construction

Tokenizer::Tokenizer(const GgufFile& file) {
  const std::string model = file.get_string_or("tokenizer.ggml.model", "");
  if (model != "gpt2")
    throw Error("tokenizer.ggml.model",
                model.empty() ? "missing" : "'" + model + "' is not supported",
                "\"gpt2\" (byte-level BPE)");
  // The pre-tokenizer family: the ones crisp implements exactly.
  const std::string pre = file.get_string_or("tokenizer.ggml.pre", "default");
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell") {
    split_digits_ = true;   // Digits(individual_digits=true), then the GPT-2 pattern
  } else if (pre == "gpt2" || pre == "default") {
    split_digits_ = false;  // the GPT-2 pattern alone
  } else {
    throw Error("tokenizer.ggml.pre", "pre-tokenizer '" + pre + "' is not implemented",
                "smollm, starcoder, refact, codeshell, gpt2 or default");
  }

  tokens_ = file.get_string_array("tokenizer.ggml.tokens");
  if (tokens_.empty() || tokens_.size() > static_cast<std::size_t>(INT32_MAX))
    throw Error("tokenizer.ggml.tokens", "has " + std::to_string(tokens_.size()) + " entries",
                "a non-empty vocabulary");
  const auto n_vocab = static_cast<int32_t>(tokens_.size());
  token_to_id_.reserve(tokens_.size());
  for (int32_t id = 0; id < n_vocab; ++id) token_to_id_.emplace(tokens_[id], id);

  std::vector<int64_t> types;
  if (file.has("tokenizer.ggml.token_type")) {
    types = file.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != tokens_.size())
      throw Error("tokenizer.ggml.token_type",
                  std::to_string(types.size()) + " entries for " +
                      std::to_string(tokens_.size()) + " tokens",
                  "one type per token");
  }
  // NOTE: 3 = CONTROL and 4 = USER_DEFINED in llama.cpp's token types: the added tokens that
  // are matched whole in the text and written back verbatim.
  is_special_.assign(tokens_.size(), 0);
  for (int32_t id = 0; id < static_cast<int32_t>(types.size()); ++id) {
    if ((types[id] == 3 || types[id] == 4) && !tokens_[id].empty()) {
      is_special_[id] = 1;
      special_tokens_.emplace_back(tokens_[id], id);
    }
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  const std::vector<std::string> merges = file.get_string_array("tokenizer.ggml.merges");
  merge_rank_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    const std::size_t space = m.find(' ');
    const bool well_formed = space != std::string::npos && space > 0 && space + 1 < m.size() &&
                             m.find(' ', space + 1) == std::string::npos;
    if (!well_formed)
      throw Error("tokenizer.ggml.merges", "entry " + std::to_string(rank) + " '" + m + "'",
                  "two tokens separated by one space");
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    if (!token_to_id_.count(left) || !token_to_id_.count(right) ||
        !token_to_id_.count(left + right))
      throw Error("tokenizer.ggml.merges",
                  "entry " + std::to_string(rank) + " '" + m + "' uses or makes a token " +
                      "missing from tokenizer.ggml.tokens",
                  "merges of vocabulary tokens into vocabulary tokens");
    // A repeated merge keeps its first (best) rank, as a rank table built in order would.
    merge_rank_.emplace(m, static_cast<int32_t>(rank));
  }

  auto id_or = [&](const char* key) -> int32_t {
    const int64_t id = file.get_int_or(key, -1);
    if (id < -1 || id >= n_vocab)
      throw Error(key, "token id " + std::to_string(id) + " is outside the vocabulary",
                  "an id below " + std::to_string(n_vocab));
    return static_cast<int32_t>(id);
  };
  bos_ = id_or("tokenizer.ggml.bos_token_id");
  eos_ = id_or("tokenizer.ggml.eos_token_id");
  unk_ = id_or("tokenizer.ggml.unknown_token_id");
  if (auto it = token_to_id_.find("<|im_end|>"); it != token_to_id_.end()) im_end_ = it->second;

  chat_template_ = file.get_string_or("tokenizer.chat_template", "");
  // The ChatML family may open with a fixed system turn when the conversation has none, written
  // as `{% if loop.first and messages[0]['role'] != 'system' %}{{ '<literal>' }}{% endif %}`.
  // Read that literal so apply_chat_template can reproduce it.
  const std::size_t cond = chat_template_.find("messages[0]['role'] != 'system'");
  if (cond != std::string::npos) {
    const std::size_t open = chat_template_.find("{{", cond);
    const std::size_t endif = chat_template_.find("{% endif %}", cond);
    std::size_t q = open == std::string::npos ? open : chat_template_.find_first_of("'\"", open);
    if (q == std::string::npos || endif == std::string::npos || q > endif)
      throw Error("tokenizer.chat_template", "default system turn not understood",
                  "{{ '<literal>' }} inside the messages[0]['role'] != 'system' branch");
    const char quote = chat_template_[q];
    std::string literal;
    bool closed = false;
    for (std::size_t k = q + 1; k < chat_template_.size(); ++k) {
      const char ch = chat_template_[k];
      if (ch == quote) { closed = true; break; }
      if (ch == '\\' && k + 1 < chat_template_.size()) {
        const char e = chat_template_[++k];
        literal += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        literal += ch;
      }
    }
    if (!closed)
      throw Error("tokenizer.chat_template", "unterminated string literal", "a valid template");
    default_system_ = literal;
  }
}

// ---------------------------------------------------------------- encode

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  const ByteSpelling& spelling = byte_spelling();
  std::vector<int32_t> ids;
  std::vector<std::pair<std::size_t, std::size_t>> words;
  std::string key;

  auto lookup = [&](const std::string& symbol) -> int32_t {
    auto it = token_to_id_.find(symbol);
    if (it != token_to_id_.end()) return it->second;
    if (unk_ >= 0) return unk_;
    throw Error("text", "symbol '" + symbol + "' has no token and the vocabulary has no unknown token",
                "a byte-level vocabulary that spells every byte");
  };

  // BPE of one word (its bytes text[begin, end)), in O(m log m) for m bytes: the symbols form a
  // linked list over one spelled string (a symbol is a range of it; merging two neighbours joins
  // their ranges), and a min-heap holds every adjacent pair that has a rank, ordered by (rank,
  // position of its left symbol) — the lowest rank, leftmost on ties, exactly as a full scan of
  // the pairs before every merge would pick. Entries whose symbols have changed since they were
  // pushed are skipped when popped.
  struct Symbol {
    std::size_t start, size;  // range of `spelled`
    std::ptrdiff_t prev, next;  // neighbours (-1: none); size 0 marks a symbol merged away
  };
  struct Candidate {
    int32_t rank;
    std::ptrdiff_t left, right;
    std::size_t size;  // the two symbols' combined size when pushed (detects a stale entry)
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::string spelled;
  std::vector<Symbol> word;
  std::vector<Candidate> heap;
  auto push_pair = [&](std::ptrdiff_t left, std::ptrdiff_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = word[static_cast<std::size_t>(left)];
    const Symbol& b = word[static_cast<std::size_t>(right)];
    key.assign(spelled, a.start, a.size).append(1, ' ').append(spelled, b.start, b.size);
    auto it = merge_rank_.find(key);
    if (it == merge_rank_.end()) return;
    heap.push_back({it->second, left, right, a.size + b.size});
    std::push_heap(heap.begin(), heap.end(), std::greater<Candidate>());
  };
  auto encode_word = [&](std::size_t begin, std::size_t end) {
    spelled.clear();
    word.clear();
    heap.clear();
    for (std::size_t k = begin; k < end; ++k) {
      const std::string& s = spelling.byte_to_utf8[static_cast<unsigned char>(text[k])];
      const auto index = static_cast<std::ptrdiff_t>(word.size());
      word.push_back({spelled.size(), s.size(), index - 1, k + 1 < end ? index + 1 : -1});
      spelled += s;
    }
    for (std::size_t k = 0; k + 1 < word.size(); ++k)
      push_pair(static_cast<std::ptrdiff_t>(k), static_cast<std::ptrdiff_t>(k + 1));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<Candidate>());
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& a = word[static_cast<std::size_t>(c.left)];
      Symbol& b = word[static_cast<std::size_t>(c.right)];
      if (a.size == 0 || b.size == 0 || a.next != c.right || a.size + b.size != c.size) continue;
      a.size += b.size;  // neighbours are adjacent ranges of `spelled`
      b.size = 0;
      a.next = b.next;
      if (b.next >= 0) word[static_cast<std::size_t>(b.next)].prev = c.left;
      push_pair(a.prev, c.left);
      push_pair(c.left, a.next);
    }
    for (std::ptrdiff_t k = word.empty() ? -1 : 0; k >= 0; k = word[static_cast<std::size_t>(k)].next) {
      const Symbol& sym = word[static_cast<std::size_t>(k)];
      ids.push_back(lookup(spelled.substr(sym.start, sym.size)));
    }
  };

  // Steps 2-4 for the plain text text[begin, end) between added tokens.
  auto encode_segment = [&](std::size_t begin, std::size_t end) {
    if (begin == end) return;
    const std::vector<Char> chars = decode_utf8(text, begin, end);
    words.clear();
    std::size_t piece = 0;
    for (std::size_t k = 0; k <= chars.size(); ++k) {
      const bool digit_piece = split_digits_ && k < chars.size() && is_number(chars[k].cp);
      if (k == chars.size() || digit_piece) {
        gpt2_split(chars, piece, k, words);
        if (digit_piece) words.emplace_back(k, k + 1);
        piece = k + 1;
      }
    }
    for (const auto& w : words) encode_word(chars[w.first].begin, chars[w.second - 1].end);
  };

  // Step 1: added tokens, leftmost first, longest at a position (special_tokens_ is sorted
  // longest first).
  std::size_t plain_start = 0, pos = 0;
  while (pos < text.size()) {
    int32_t match = -1;
    std::size_t match_len = 0;
    for (const auto& st : special_tokens_) {
      if (text.compare(pos, st.first.size(), st.first) == 0) {
        match = st.second;
        match_len = st.first.size();
        break;
      }
    }
    if (match < 0) {
      ++pos;
      continue;
    }
    encode_segment(plain_start, pos);
    ids.push_back(match);
    pos += match_len;
    plain_start = pos;
  }
  encode_segment(plain_start, text.size());
  return ids;
}

// ---------------------------------------------------------------- decode

std::string Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    throw Error("id", "token id " + std::to_string(id) + " is outside the vocabulary",
                "0 <= id < " + std::to_string(vocab_size()));
  const std::string& token = tokens_[static_cast<std::size_t>(id)];
  if (is_special_[static_cast<std::size_t>(id)]) return token;
  // Undo the byte spelling; a char outside the spelling's image (possible only in a foreign
  // vocabulary) is kept as its own UTF-8.
  const ByteSpelling& spelling = byte_spelling();
  std::string out;
  for (const Char& ch : decode_utf8(token, 0, token.size())) {
    if (ch.cp < spelling.cp_to_byte.size() && spelling.cp_to_byte[ch.cp] >= 0)
      out += static_cast<char>(spelling.cp_to_byte[ch.cp]);
    else
      out.append(token, ch.begin, ch.end - ch.begin);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_text(id);
  return out;
}

// ---------------------------------------------------------------- chat template

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  const bool chatml = chat_template_.find("<|im_start|>") != std::string::npos &&
                      chat_template_.find("<|im_end|>") != std::string::npos &&
                      chat_template_.find("message['role']") != std::string::npos &&
                      chat_template_.find("message['content']") != std::string::npos;
  if (!chatml)
    throw Error("tokenizer.chat_template",
                chat_template_.empty() ? "missing" : "template family not recognised",
                "a ChatML template (<|im_start|>role\\ncontent<|im_end|>\\n)");
  std::string out;
  // Jinja emits it inside the message loop (loop.first), so an empty conversation has none.
  if (!default_system_.empty() && !messages.empty() && messages.front().role != "system")
    out += default_system_;
  for (const ChatMessage& m : messages)
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

int32_t Tokenizer::bos_id() const { return bos_; }
int32_t Tokenizer::eos_id() const { return eos_; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && (id == eos_ || id == im_end_);
}

}  // namespace model
}  // namespace crisp
