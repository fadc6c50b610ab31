// tools/io_util.cpp — see io_util.h.
#include "io_util.h"

#include <fstream>
#include <sstream>

#include "crisp/error.h"

namespace crisp_cli {

std::string read_text_file(const std::string& argument, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw crisp::Error(argument, "cannot open '" + path + "'", "a readable file");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_text_file(const std::string& argument, const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw crisp::Error(argument, "cannot open '" + path + "' for writing", "a writable path");
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.close();
  if (!file) throw crisp::Error(argument, "failed writing '" + path + "'", "a writable path with free space");
}

}  // namespace crisp_cli
