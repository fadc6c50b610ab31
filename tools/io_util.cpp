// tools/io_util.cpp — see io_util.h.
#include "io_util.h"

#include <fstream>

#include "crisp/error.h"

namespace crisp_cli {

void write_text_file(const std::string& argument, const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw crisp::Error(argument, "cannot open '" + path + "' for writing", "a writable path");
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.close();
  if (!file) throw crisp::Error(argument, "failed writing '" + path + "'", "a writable path with free space");
}

}  // namespace crisp_cli
