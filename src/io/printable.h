// src/io/printable.h — text quoted from input files, made safe to print on a terminal.
#pragma once
#include <cstdint>
#include <string>

namespace crisp {

// `text` with every byte that could act on a terminal written as \xNN: control bytes (escape
// sequences, NUL), DEL, C1 controls and bytes that are not valid UTF-8 (messages quote names read
// from files, e.g. GGUF keys). Valid UTF-8 text stays as it is.
inline std::string printable(const std::string& text) {
  std::string out;
  auto escape = [&](unsigned char b) {
    static const char* kHex = "0123456789abcdef";
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 15];
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b >= 0x20 && b < 0x7f) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    // A valid multi-byte UTF-8 sequence (shortest form) of a code point >= U+00A0 stays.
    const int length = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    bool valid = length > 0 && i + static_cast<std::size_t>(length) <= text.size();
    uint32_t cp = length == 2 ? b & 0x1fu : length == 3 ? b & 0x0fu : b & 0x07u;
    for (int k = 1; valid && k < length; ++k) {
      const auto c = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      valid = (c & 0xc0) == 0x80;
      cp = (cp << 6) | (c & 0x3fu);
    }
    valid = valid && cp >= 0xa0 && !(length == 3 && cp < 0x800) && !(length == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
            !(cp >= 0xd800 && cp <= 0xdfff);
    if (valid) {
      out.append(text, i, static_cast<std::size_t>(length));
      i += static_cast<std::size_t>(length);
    } else {
      escape(b);
      ++i;
    }
  }
  return out;
}

}  // namespace crisp
