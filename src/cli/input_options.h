// The input options shared by trace, bisect and kld: a golden fixture, a token file or a text file.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "toolkit/diff.h"

namespace plumb::cli {

struct InputOptions {
  std::string fixture, model, tokens, text, tokenizer;
  int64_t chunk = 0;

  bool given() const { return !fixture.empty() || !tokens.empty() || !text.empty(); }
  toolkit::RunInput resolve() const { return toolkit::resolve_input(fixture, model, tokens, text, tokenizer, chunk); }
};

// Adds --fixture, -m/--model, --tokens, --text, --tokenizer and --chunk to `cmd`.
void add_input_options(CLI::App* cmd, InputOptions& in);

}  // namespace plumb::cli
