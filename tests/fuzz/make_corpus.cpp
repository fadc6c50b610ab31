// tests/fuzz/make_corpus.cpp — writes the committed seed corpus of the fuzz harnesses:
//   cmake --build build --target crisp_fuzz_make_corpus && build/tests/fuzz/crisp_fuzz_make_corpus tests/fuzz/corpus
// Small valid files that reach every branch worth mutating: .npy of each dtype, version and rank.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "make_corpus: cannot write %s\n", path.string().c_str());
    std::exit(1);
  }
}

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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  write_npy_corpus(root / "npy");
  std::printf("corpus written to %s\n", root.string().c_str());
  return 0;
}
