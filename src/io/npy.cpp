// src/io/npy.cpp — NumPy .npy reading and writing (format 1.0, 2.0, 3.0; little-endian; C order).
//
// The format (numpy.lib.format): the magic "\x93NUMPY", a major and minor version byte, the header
// length (uint16 little-endian for 1.0, uint32 for 2.0 and 3.0), then an ASCII (3.0: UTF-8)
// Python dict literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (8, 4096, 128), }
// padded with spaces and a newline, then the raw data. Files come from users, so every length is
// checked against the file size before it is used: a corrupt file gives a crisp::Error naming the
// path, never a crash or a huge allocation.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "crisp/error.h"
#include "crisp/npy.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "crisp's .npy reader/writer assumes a little-endian host"
#endif

namespace crisp {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// NOTE: numpy pads the header so the data starts at a multiple of 64 bytes (ARRAY_ALIGN); we do
// the same when writing. Reading accepts any padding.
constexpr size_t kAlign = 64;

[[noreturn]] void corrupt(const std::string& path, const std::string& problem, const std::string& expected) {
  throw Error(path, problem, expected);
}

// ---------------------------------------------------------------- header dict parser
// A small recursive-descent reader of the subset of Python literals numpy writes: a dict of
// string keys to a string, True/False, or a tuple of non-negative integers.
struct HeaderParser {
  const std::string& text;
  const std::string& path;
  size_t pos = 0;

  void skip_space() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }
  [[noreturn]] void fail(const std::string& what) const {
    corrupt(path, "corrupt .npy header (" + what + " at character " + std::to_string(pos) + ")",
            "a header like {'descr': '<f4', 'fortran_order': False, 'shape': (8, 4096, 128), }");
  }
  bool accept(char c) {
    skip_space();
    if (pos < text.size() && text[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  std::string string_literal() {
    skip_space();
    if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) fail("expected a quoted string");
    const char quote = text[pos++];
    const size_t start = pos;
    while (pos < text.size() && text[pos] != quote) {
      if (text[pos] == '\\') fail("escape sequences are not supported");
      ++pos;
    }
    if (pos >= text.size()) fail("unterminated string");
    return text.substr(start, pos++ - start);
  }
  bool bool_literal() {
    skip_space();
    if (text.compare(pos, 4, "True") == 0) {
      pos += 4;
      return true;
    }
    if (text.compare(pos, 5, "False") == 0) {
      pos += 5;
      return false;
    }
    fail("expected True or False");
  }
  int64_t integer_literal() {
    skip_space();
    if (pos >= text.size() || text[pos] < '0' || text[pos] > '9') fail("expected a non-negative integer");
    int64_t value = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      const int digit = text[pos] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("integer too large");
      value = value * 10 + digit;
      ++pos;
    }
    if (pos < text.size() && text[pos] == 'L') ++pos;  // Python 2 long suffix, written by old numpy
    return value;
  }
  std::vector<int64_t> tuple_literal() {
    expect('(');
    std::vector<int64_t> values;
    if (accept(')')) return values;
    for (;;) {
      // NOTE: rank cap far above anything this library reads; only bounds a hostile header.
      if (values.size() >= 32) fail("more than 32 dimensions");
      values.push_back(integer_literal());
      if (accept(')')) return values;
      expect(',');
      if (accept(')')) return values;  // trailing comma, as in (5,)
    }
  }
};

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

Header parse_header(const std::string& text, const std::string& path) {
  HeaderParser p{text, path};
  Header h;
  bool have_descr = false, have_order = false, have_shape = false;
  p.expect('{');
  while (!p.accept('}')) {
    const std::string key = p.string_literal();
    p.expect(':');
    if (key == "descr" && !have_descr) {
      // A structured (record) dtype is written as a list of fields: a valid header, an unsupported type.
      p.skip_space();
      if (p.pos < text.size() && text[p.pos] == '[')
        corrupt(path, "structured (record) dtype",
                "'<f4' (float32), '<f2' (float16) or '<f8' (float64), little-endian: a plain array");
      h.descr = p.string_literal();
      have_descr = true;
    } else if (key == "fortran_order" && !have_order) {
      h.fortran_order = p.bool_literal();
      have_order = true;
    } else if (key == "shape" && !have_shape) {
      h.shape = p.tuple_literal();
      have_shape = true;
    } else {
      p.fail("unexpected or repeated key '" + key + "'");
    }
    if (!p.accept(',')) {
      p.expect('}');
      break;
    }
  }
  p.skip_space();
  if (p.pos != text.size()) p.fail("trailing characters after the dict");
  if (!have_descr || !have_order || !have_shape) p.fail("missing one of the keys descr, fortran_order, shape");
  return h;
}

DType dtype_from_descr(const std::string& descr, const std::string& path) {
  const std::string expected = "'<f4' (float32), '<f2' (float16) or '<f8' (float64), little-endian";
  // The type first: a bool or int8 array ('|b1', '|i1') is refused for its type, not for its byte
  // order mark ('|', numpy's mark of single-byte types).
  const std::string kind = descr.size() == 3 ? descr.substr(1) : "";
  if (kind != "f4" && kind != "f2" && kind != "f8") corrupt(path, "unsupported dtype '" + descr + "'", expected);
  const char order = descr[0];
  if (order == '>') corrupt(path, "big-endian dtype '" + descr + "'", expected);
  // '=' (native) is little-endian here (see the #error above), as numpy itself writes '<'.
  if (order != '<' && order != '=') corrupt(path, "unsupported byte order in dtype '" + descr + "'", expected);
  if (kind == "f4") return DType::f32;
  if (kind == "f2") return DType::f16;
  return DType::f64;
}

uint64_t read_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// ---------------------------------------------------------------- read
NpyArray read_npy(const std::string& path) {
  if (path.empty()) corrupt("(empty path)", "no file named", "the path of a .npy file");
  // Before opening: opening a FIFO without a writer would block forever, and a directory or a
  // device is no .npy file either (its size cannot be checked against the header).
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    corrupt(path, std::filesystem::is_directory(status) ? "is a directory" : "is not a regular file (a pipe or a device)",
            "a readable .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) corrupt(path, "cannot open file", "a readable .npy file");
  in.seekg(0, std::ios::end);
  const std::streamoff file_size_signed = in.tellg();
  if (!in || file_size_signed < 0) corrupt(path, "cannot read file (not a regular file?)", "a readable .npy file");
  const uint64_t file_size = static_cast<uint64_t>(file_size_signed);
  in.seekg(0, std::ios::beg);

  // Magic and version.
  unsigned char prefix[12] = {0};
  const size_t prefix_available = file_size < sizeof(prefix) ? static_cast<size_t>(file_size) : sizeof(prefix);
  if (!in.read(reinterpret_cast<char*>(prefix), static_cast<std::streamsize>(prefix_available)))
    corrupt(path, "cannot read file", "a readable .npy file");
  if (prefix_available < kMagicSize + 2 || std::memcmp(prefix, kMagic, kMagicSize) != 0)
    corrupt(path, "not a .npy file (bad magic)", "a file starting with \\x93NUMPY");
  const int major = prefix[6];
  const int minor = prefix[7];
  if (major < 1 || major > 3 || minor != 0)
    corrupt(path, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor),
            "version 1.0, 2.0 or 3.0");
  const int length_bytes = major == 1 ? 2 : 4;
  const uint64_t preamble = kMagicSize + 2 + static_cast<uint64_t>(length_bytes);
  if (file_size < preamble) corrupt(path, "truncated .npy header", "a complete .npy header");
  const uint64_t header_len = read_le(prefix + 8, length_bytes);
  if (header_len > file_size - preamble)
    corrupt(path,
            "truncated .npy header (header length " + std::to_string(header_len) + " exceeds the file size " +
                std::to_string(file_size) + ")",
            "a complete .npy header");

  std::string header_text(static_cast<size_t>(header_len), '\0');
  in.seekg(static_cast<std::streamoff>(preamble), std::ios::beg);
  if (header_len > 0 && !in.read(&header_text[0], static_cast<std::streamsize>(header_len)))
    corrupt(path, "cannot read the .npy header", "a readable .npy file");
  if (header_text.find('\0') != std::string::npos) corrupt(path, "corrupt .npy header (NUL byte)", "an ASCII header");

  const Header header = parse_header(header_text, path);
  if (header.fortran_order)
    corrupt(path, "Fortran-ordered array", "C order (fortran_order False; use numpy.ascontiguousarray)");

  NpyArray array;
  array.dtype = dtype_from_descr(header.descr, path);
  array.shape = header.shape;

  // Element count and byte size, checked against the data actually present before allocating.
  const uint64_t data_available = file_size - preamble - header_len;
  const uint64_t item = dtype_size(array.dtype);
  long double needed = static_cast<long double>(item);  // for the message only; cannot overflow
  bool empty = false;
  for (int64_t extent : array.shape) {
    needed *= static_cast<long double>(extent);
    empty = empty || extent == 0;
  }
  if (!empty && needed > static_cast<long double>(data_available)) {
    char needed_text[64];
    std::snprintf(needed_text, sizeof(needed_text), "%.0Lf", needed);
    corrupt(path,
            "truncated data: the shape needs " + std::string(needed_text) + " bytes of '" + header.descr +
                "', the file holds " + std::to_string(data_available),
            "a file holding every element of its shape");
  }
  // Now every partial product is <= data_available / item, so the integer product is exact.
  uint64_t count = 1;
  for (int64_t extent : array.shape) count *= static_cast<uint64_t>(extent);
  const uint64_t data_bytes = count * item;
  if (data_bytes != data_available)
    corrupt(path,
            "trailing data: " + std::to_string(data_available - data_bytes) + " bytes after the " +
                std::to_string(data_bytes) + " the shape needs",
            "a file holding exactly the elements of its shape");

  array.bytes.resize(static_cast<size_t>(data_bytes));
  if (data_bytes > 0 &&
      !in.read(reinterpret_cast<char*>(array.bytes.data()), static_cast<std::streamsize>(data_bytes)))
    corrupt(path, "cannot read the data", "a readable .npy file");
  return array;
}

// ---------------------------------------------------------------- view
TensorView NpyArray::view(const std::string& argument, int rank) {
  if (rank != 0 && rank != 2 && rank != 3)
    throw Error("rank", "is " + std::to_string(rank), "0 (2 or 3), 2 or 3");
  const std::string expected = rank == 3   ? "a rank-3 [heads, tokens, dim] array"
                               : rank == 2 ? "a rank-2 [heads, tokens] array"
                                           : "a rank-3 [heads, tokens, dim] or rank-2 [heads, tokens] array";
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
  shape_text += ")";
  const bool rank_ok = rank == 0 ? shape.size() == 2 || shape.size() == 3 : shape.size() == static_cast<size_t>(rank);
  if (!rank_ok) throw Error(argument, "has rank " + std::to_string(shape.size()) + " (shape " + shape_text + ")", expected);
  // Views index with int64 products of the extents: refuse shapes whose products could overflow.
  // An empty array holds nothing to index (its extents are the caller's to judge: a shape such as
  // (1, 0, 2^63 - 1) is refused for its zero tokens, not as too large).
  bool empty = false;
  long double product = 1.0L;
  for (int64_t e : shape) {
    empty = empty || e == 0;
    product *= static_cast<long double>(e);
  }
  if (empty) product = 0.0L;
  if (product > static_cast<long double>(int64_t{1} << 62))
    throw Error(argument, "extents too large to index", "a product of extents below 2^62");
  uint64_t count = 1;
  for (int64_t e : shape) count *= static_cast<uint64_t>(e);
  if (count * dtype_size(dtype) != bytes.size())
    throw Error(argument, "data size does not match the shape", "bytes = product(shape) * itemsize");
  void* data = bytes.empty() ? nullptr : bytes.data();
  if (shape.size() == 3) return TensorView::contiguous(data, dtype, shape[0], shape[1], shape[2]);
  return TensorView::contiguous2d(data, dtype, shape[0], shape[1]);
}

// ---------------------------------------------------------------- write
namespace {

// The writer of both element types: `descr` '<f4' or '<f8', `item` its size in bytes.
void write_npy_bytes(const std::string& path, const void* data, const char* descr, uint64_t item,
                     const std::vector<int64_t>& shape) {
  uint64_t count = 1;
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      throw Error(path, "negative extent " + std::to_string(shape[i]) + " in the shape to write", "extents >= 0");
    const uint64_t e = static_cast<uint64_t>(shape[i]);
    if (e != 0 && count > std::numeric_limits<uint64_t>::max() / item / e)
      throw Error(path, "shape too large to write", "a shape whose byte size fits in 64 bits");
    count *= e;
    shape_text += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  }
  shape_text += ")";
  if (count > 0 && data == nullptr) throw Error(path, "null data pointer for a non-empty array", "the data to write");

  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // Version 1.0 unless the header needs more than a uint16 length.
  size_t preamble = kMagicSize + 2 + 2;
  size_t total = preamble + header.size() + 1;  // + '\n'
  int major = 1;
  if (((total + kAlign - 1) / kAlign) * kAlign - preamble > 0xFFFF) {
    major = 2;
    preamble = kMagicSize + 2 + 4;
    total = preamble + header.size() + 1;
  }
  const size_t padded = ((total + kAlign - 1) / kAlign) * kAlign;
  header.append(padded - total, ' ');
  header.push_back('\n');
  const uint64_t header_len = header.size();

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path, "cannot open file for writing", "a writable path");
  std::string pre(kMagic, kMagicSize);
  pre.push_back(static_cast<char>(major));
  pre.push_back(0);
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) pre.push_back(static_cast<char>((header_len >> (8 * i)) & 0xFF));
  out.write(pre.data(), static_cast<std::streamsize>(pre.size()));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (count > 0) out.write(static_cast<const char*>(data), static_cast<std::streamsize>(count * item));
  out.flush();
  if (!out) throw Error(path, "write failed (disk full or I/O error?)", "a writable path");
}

}  // namespace

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy_bytes(path, data, "<f4", sizeof(float), shape);
}

void write_npy(const std::string& path, const double* data, const std::vector<int64_t>& shape) {
  write_npy_bytes(path, data, "<f8", sizeof(double), shape);
}

}  // namespace crisp
