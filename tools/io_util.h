// tools/io_util.h — small file helpers of the `crisp` command.
#pragma once
#include <functional>
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

// Refuses an output option that names a file of the capture directories (their meta.json and the
// .npy files it lists), which the command reads: `eval fidelity --json` overwrote them. Other
// paths inside a capture directory are fine (a frontier kept beside its capture).
void require_not_capture_file(const std::string& argument, const std::string& path,
                              const std::vector<std::string>& captures);

// True when `a` and `b` name one file: std::filesystem::equivalent when both exist, else the same
// absolute path in lexical normal form.
bool same_file(const std::string& a, const std::string& b);

// Refuses standard output ("-" or /dev/stdout) for a binary output such as a .npy file (`what`
// says which), which is written to a named file only. Throws crisp::Error naming `argument`.
void require_file_output(const std::string& argument, const std::string& path, const std::string& what);

// A command's output files, written all or none: each regular-file output is written to a
// temporary file beside it ("<path>.crisp-partial") and renamed over it by commit(), once every
// output is written; if one fails, or commit() is never reached, the temporaries are removed and
// the outputs stay as they were. Outputs that are not regular files (/dev/null, a pipe) and whose
// directory cannot take a temporary are written in place.
class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  ~OutputFiles();
  // Calls write(target) with the file to write; its crisp::Error is renamed to `argument` `path`.
  void write(const std::string& argument, const std::string& path, const std::function<void(const std::string&)>& write);
  // Renames every temporary over its output (throws crisp::Error naming the output that failed).
  void commit();

 private:
  std::vector<std::pair<std::string, std::string>> pending_;  // {temporary, output}
};

}  // namespace crisp_cli
