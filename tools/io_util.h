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

// Refuses an output option that names the file of an input option (writing it would overwrite the
// input, or truncate it before it is read). Empty paths and standard output are ignored. Each pair
// is {argument, path}; the error names the output's argument.
void require_outputs_not_inputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                                const std::vector<std::pair<std::string, std::string>>& inputs);

// Refuses an output option whose file lies inside one of the input directories (e.g. --captures,
// whose meta.json and .npy files it could overwrite). Each directory is {argument, path}.
void require_outside_directories(const std::string& argument, const std::string& path,
                                 const std::vector<std::pair<std::string, std::string>>& directories);

// True when `a` and `b` name one file: std::filesystem::equivalent when both exist, else the same
// absolute path in lexical normal form.
bool same_file(const std::string& a, const std::string& b);

// Refuses standard output ("-" or /dev/stdout) for a binary output such as a .npy file (`what`
// says which), which is written to a named file only. Throws crisp::Error naming `argument`.
void require_file_output(const std::string& argument, const std::string& path, const std::string& what);

// Removes the files of a command's outputs that were written before a later one failed, so a
// failed command leaves no partial set of outputs. Only regular files are removed (not devices,
// pipes or standard output); errors are ignored (the command is already failing).
void remove_written_files(const std::vector<std::string>& paths);

}  // namespace crisp_cli
