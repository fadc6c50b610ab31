// tests/fuzz/fuzz_npy.cpp — the .npy reader (src/io/npy.cpp) on arbitrary bytes: it returns an
// array whose data is exactly product(shape) * itemsize bytes, or throws crisp::Error.
#include <cstdint>
#include <cstdlib>

#include "crisp/npy.h"
#include "fuzz_util.h"

extern const char* const kFuzzHarnessName = "npy";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string& path = crisp_fuzz::scratch_path(".npy");
  static crisp_fuzz::ScratchCleanup cleanup{path};
  crisp_fuzz::write_scratch(path, data, size);
  try {
    crisp::NpyArray array = crisp::read_npy(path);
    try {
      const crisp::TensorView v = array.view("Q.npy");
      // The view covers the bytes read: its last element lies inside them (ASan checks the read).
      if (v.numel() > 0) {
        const size_t last = static_cast<size_t>(v.offset(v.heads() - 1, v.tokens() - 1, v.dim() - 1));
        const size_t item = crisp::dtype_size(v.dtype);
        volatile unsigned char sink = static_cast<const unsigned char*>(v.data)[last * item + item - 1];
        (void)sink;
      }
    } catch (const crisp::Error& e) {
      crisp_fuzz::check_error(e);
    }
  } catch (const crisp::Error& e) {
    crisp_fuzz::check_error(e);
  }
  return 0;
}
