// The options shared by several commands: inputs, output files, finite numbers (input_options.h).
#include "cli/input_options.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>

namespace plumb::cli {

void add_input_options(CLI::App* cmd, tools::InputSpec& in) {
  cmd->add_option("--fixture", in.fixture, "run the steps of this golden fixture (its folder is the model unless -m)");
  cmd->add_option("-m,--model", in.model, "model folder (config.json + model.safetensors)");
  cmd->add_option("--tokens", in.tokens, "token file (ids; one step per line)");
  cmd->add_option("--text", in.text, "text file, tokenized as `plumb run` tokenizes a prompt (BOS first where the model wants it)");
  cmd->add_option("--tokenizer", in.tokenizer, "tokenizer.json (or its folder) for --text; default: the model folder's");
  cmd->add_option("--chunk", in.chunk, "split --text into prefill chunks of this many tokens (0: one chunk)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            int64_t x = 0;
            return CLI::detail::lexical_cast(v, x) && x >= 0 ? "" : "expected a whole number >= 0, got '" + v + "'";
          },
          "INT >= 0", "non-negative integer"));
}

std::string output_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return {};
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path + " is a folder: give a file name";
  const fs::path parent = fs::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(folder, ec)) return "folder " + folder + " (of " + path + ") does not exist";
  if (::access(folder.c_str(), W_OK) != 0) return "folder " + folder + " (of " + path + ") is not writable";
  return {};
}

CLI::Validator finite_number(bool positive) {
  return CLI::Validator(
      [positive](std::string& v) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(v, x) || !std::isfinite(x) || (positive ? !(x > 0) : !(x >= 0)))
          return std::string("expected a finite number ") + (positive ? "above 0" : ">= 0") + ", got '" + v + "'";
        return {};
      },
      positive ? "NUMBER > 0" : "NUMBER >= 0", "finite number");
}

CLI::Validator output_file() {
  return CLI::Validator([](std::string& path) { return output_file_problem(path); }, "", "output file");
}

}  // namespace plumb::cli
