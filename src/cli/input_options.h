// The options shared by several commands: the inputs of trace, diff, bisect and kld (a golden fixture, a token
// file or a text file), the check every output file option takes, and a finite-number check.
#pragma once
#include <CLI/CLI.hpp>

#include "plumb/tools.h"

namespace plumb::cli {

// Adds --fixture, -m/--model, --tokens, --text, --tokenizer and --chunk to `cmd`.
void add_input_options(CLI::App* cmd, tools::InputSpec& in);

// For an option naming a file the command writes at its end (a report, a trace, a saved reference): checked when
// the options are parsed, so a long run does not end in "cannot write". Its folder must exist and be writable and
// the name must not be a folder; the file itself is created or replaced only when written.
CLI::Validator output_file();

// For a number option whose value must be finite and above 0 (positive) or at least 0 (non-negative): CLI11's
// PositiveNumber lets NaN through, which compares false with everything and so reads as "not given" downstream.
CLI::Validator finite_number(bool positive);

// output_file()'s check on its own, for a file named later (chat's /save): "" when `path` can be written, else why not.
std::string output_file_problem(const std::string& path);

}  // namespace plumb::cli
