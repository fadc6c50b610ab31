// tools/io_util.h — small file helpers of the `crisp` command.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace crisp_cli {

// The whole content of `path`; throws crisp::Error naming `argument` (e.g. "--prompt-file") if the
// file cannot be opened.
std::string read_text_file(const std::string& argument, const std::string& path);

// Writes `text` to `path` ("-": standard output); throws crisp::Error naming `argument` (e.g.
// "--json") if the file cannot be written completely.
void write_text_file(const std::string& argument, const std::string& path, const std::string& text);

// True when `path` names standard output ("-" or /dev/stdout): a command then prints its human
// summary on stderr, so the output stays one JSON document.
bool is_stdout_path(const std::string& path);

// Checks, before any work, that `path` can be written: its directory exists and is writable, and
// an existing file is writable. Throws crisp::Error naming `argument`. "-" always passes.
void require_writable(const std::string& argument, const std::string& path);

// Refuses two output options that name the same file (one would overwrite the other); empty
// paths are ignored. Each pair is {argument, path}.
void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace crisp_cli
