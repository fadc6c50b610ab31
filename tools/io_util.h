// tools/io_util.h — small file helpers of the `crisp` command.
#pragma once
#include <string>

namespace crisp_cli {

// The whole content of `path`; throws crisp::Error naming `argument` (e.g. "--prompt-file") if the
// file cannot be opened.
std::string read_text_file(const std::string& argument, const std::string& path);

// Writes `text` to `path`; throws crisp::Error naming `argument` (e.g. "--json") if the file
// cannot be written completely.
void write_text_file(const std::string& argument, const std::string& path, const std::string& text);

}  // namespace crisp_cli
