// tests/fuzz/fuzz_driver.cpp — a seeded mutation loop around a harness's LLVMFuzzerTestOneInput,
// so the fuzz harnesses run (under ASan/UBSan in scripts/test.sh) without clang's libFuzzer:
//
//   crisp_fuzz_npy --seed 1 --iterations 20000 --max-seconds 20 --max-len 4096 CORPUS_DIR...
//
// Every corpus file runs as is first; then each iteration mutates one corpus entry (bit flips,
// byte sets, "interesting" integers of 1/2/4/8 bytes, inserts, deletes, duplicated chunks,
// splices with another entry, truncation). Iteration i's input depends only on (seed, corpus, i),
// so a finding is reproduced by rerunning with the same seed. On a crash (a sanitizer report, a
// signal, an uncaught exception) the input is written to crisp-fuzz-crash-<harness>.bin in the
// working directory; `crisp_fuzz_<harness> --run FILE` runs one file. Built with clang and
// -DCRISP_LIBFUZZER=ON, the same harnesses link against libFuzzer instead of this driver.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

// Under ASan (gcc defines __SANITIZE_ADDRESS__, clang has __has_feature) a sanitizer report ends
// the process without a signal; its death callback saves the input.
#if defined(__SANITIZE_ADDRESS__)
#define CRISP_FUZZ_HAVE_SANITIZER_INTERFACE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CRISP_FUZZ_HAVE_SANITIZER_INTERFACE 1
#endif
#endif
#ifdef CRISP_FUZZ_HAVE_SANITIZER_INTERFACE
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern const char* const kFuzzHarnessName;  // defined by each harness

namespace {

using Input = std::vector<uint8_t>;

const Input* g_current = nullptr;  // the input being run, written out on a crash

void save_current_input() {
  if (!g_current) return;
  const std::string name = std::string("crisp-fuzz-crash-") + kFuzzHarnessName + ".bin";
  if (std::FILE* f = std::fopen(name.c_str(), "wb")) {
    if (!g_current->empty()) std::fwrite(g_current->data(), 1, g_current->size(), f);
    std::fclose(f);
    std::fprintf(stderr, "crisp-fuzz: the crashing input (%zu bytes) is in %s\n", g_current->size(), name.c_str());
  }
}

void on_signal(int sig) {
  save_current_input();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

Input read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Input(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One random edit of `x` (may leave it empty); `other` is another corpus entry to splice from.
void mutate_once(Input& x, const Input& other, std::mt19937_64& rng, std::size_t max_len) {
  auto pick = [&](std::size_t n) { return n == 0 ? std::size_t{0} : static_cast<std::size_t>(rng() % n); };
  static const uint64_t kInteresting[] = {0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF,
                                          0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x7FFFFFFFFFFFFFFF,
                                          0x8000000000000000, 0xFFFFFFFFFFFFFFFF, 16, 32, 64, 255, 256, 4096};
  switch (rng() % 9) {
    case 0:  // flip a bit
      if (!x.empty()) x[pick(x.size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1:  // set a byte
      if (!x.empty()) x[pick(x.size())] = static_cast<uint8_t>(rng());
      break;
    case 2: {  // write an interesting little-endian integer of 1, 2, 4 or 8 bytes
      const std::size_t width = std::size_t{1} << (rng() % 4);
      if (x.size() < width) break;
      uint64_t v = kInteresting[pick(sizeof(kInteresting) / sizeof(kInteresting[0]))];
      if (rng() % 4 == 0) v += static_cast<uint64_t>(static_cast<int64_t>(rng() % 5) - 2);
      const std::size_t at = pick(x.size() - width + 1);
      for (std::size_t b = 0; b < width; ++b) x[at + b] = static_cast<uint8_t>(v >> (8 * b));
      break;
    }
    case 3: {  // insert random bytes
      const std::size_t n = 1 + pick(16);
      const std::size_t at = pick(x.size() + 1);
      Input bytes(n);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin(), bytes.end());
      break;
    }
    case 4: {  // delete a run
      if (x.empty()) break;
      const std::size_t at = pick(x.size());
      const std::size_t n = 1 + pick(std::min<std::size_t>(x.size() - at, 64));
      x.erase(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    case 5: {  // duplicate a chunk at another position
      if (x.empty()) break;
      const std::size_t from = pick(x.size());
      const std::size_t n = 1 + pick(std::min<std::size_t>(x.size() - from, 64));
      const Input chunk(x.begin() + static_cast<std::ptrdiff_t>(from), x.begin() + static_cast<std::ptrdiff_t>(from + n));
      const std::size_t at = pick(x.size() + 1);
      x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), chunk.begin(), chunk.end());
      break;
    }
    case 6: {  // splice: x's head, other's tail
      if (other.empty()) break;
      const std::size_t cut = pick(x.size() + 1), from = pick(other.size());
      x.resize(cut);
      x.insert(x.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
      break;
    }
    case 7:  // truncate
      x.resize(pick(x.size() + 1));
      break;
    case 8: {  // copy bytes within the input (overwrite)
      if (x.size() < 2) break;
      const std::size_t from = pick(x.size()), to = pick(x.size());
      const std::size_t n = 1 + pick(std::min({x.size() - from, x.size() - to, std::size_t{32}}));
      std::memmove(x.data() + to, x.data() + from, n);
      break;
    }
  }
  if (x.size() > max_len) x.resize(max_len);
}

[[noreturn]] void usage(const char* argv0, const std::string& problem) {
  std::fprintf(stderr,
               "%s: error: %s\nusage: %s [--seed N] [--iterations N] [--max-seconds S] [--max-len BYTES] "
               "CORPUS_DIR_OR_FILE...\n       %s --run FILE\n",
               argv0, problem.c_str(), argv0, argv0);
  std::exit(2);
}

uint64_t parse_number(const char* argv0, const std::string& flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno || end == text || *end || text[0] == '-') usage(argv0, flag + ": '" + text + "' is not a non-negative integer");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1, iterations = 10000, max_seconds = 30, max_len = 1 << 16;
  std::vector<std::filesystem::path> corpus_paths;
  std::string run_one;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0], a + ": missing value");
      return argv[++i];
    };
    if (a == "--seed") seed = parse_number(argv[0], a, value());
    else if (a == "--iterations") iterations = parse_number(argv[0], a, value());
    else if (a == "--max-seconds") max_seconds = parse_number(argv[0], a, value());
    else if (a == "--max-len") max_len = parse_number(argv[0], a, value());
    else if (a == "--run") run_one = value();
    else if (!a.empty() && a[0] == '-') usage(argv[0], "unknown option " + a);
    else corpus_paths.emplace_back(a);
  }

#ifdef CRISP_FUZZ_HAVE_SANITIZER_INTERFACE
  __sanitizer_set_death_callback(save_current_input);
#endif
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) std::signal(sig, on_signal);
  std::set_terminate([] {
    std::fprintf(stderr, "crisp-fuzz: uncaught exception (a harness lets only expected errors through)\n");
    save_current_input();
    std::abort();
  });

  if (!run_one.empty()) {
    const Input x = read_file(run_one);
    g_current = &x;
    LLVMFuzzerTestOneInput(x.data(), x.size());
    std::printf("crisp-fuzz %s: ran %s (%zu bytes) without a finding\n", kFuzzHarnessName, run_one.c_str(), x.size());
    return 0;
  }

  std::vector<Input> corpus;
  for (const auto& p : corpus_paths) {
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // directory order is not deterministic
      for (const auto& f : files) corpus.push_back(read_file(f));
    } else if (std::filesystem::is_regular_file(p)) {
      corpus.push_back(read_file(p));
    } else {
      usage(argv[0], "corpus '" + p.string() + "' is neither a file nor a directory");
    }
  }
  if (corpus.empty()) usage(argv[0], "no corpus files (give a directory or files)");

  for (const Input& x : corpus) {
    g_current = &x;
    LLVMFuzzerTestOneInput(x.data(), x.size());
  }

  const auto start = std::chrono::steady_clock::now();
  uint64_t done = 0;
  for (; done < iterations; ++done) {
    // NOTE: the clock is read every 64 iterations; an iteration takes micro- to milliseconds.
    if (done % 64 == 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(max_seconds)) break;
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + done);
    Input x = corpus[rng() % corpus.size()];
    const Input& other = corpus[rng() % corpus.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) mutate_once(x, other, rng, max_len);
    g_current = &x;
    LLVMFuzzerTestOneInput(x.data(), x.size());
  }
  g_current = nullptr;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("crisp-fuzz %s: seed %llu, %zu corpus files, %llu of %llu mutated inputs in %.1f s, no finding\n",
              kFuzzHarnessName, static_cast<unsigned long long>(seed), corpus.size(),
              static_cast<unsigned long long>(done), static_cast<unsigned long long>(iterations), secs);
  return 0;
}
