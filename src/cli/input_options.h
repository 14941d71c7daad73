// The input options shared by trace, diff, bisect and kld: a golden fixture, a token file or a text file.
#pragma once
#include <CLI/CLI.hpp>

#include "plumb/tools.h"

namespace plumb::cli {

// Adds --fixture, -m/--model, --tokens, --text, --tokenizer and --chunk to `cmd`.
void add_input_options(CLI::App* cmd, tools::InputSpec& in);

}  // namespace plumb::cli
