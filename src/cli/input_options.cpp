// The input options shared by trace, diff, bisect and kld.
#include "cli/input_options.h"

namespace plumb::cli {

void add_input_options(CLI::App* cmd, tools::InputSpec& in) {
  cmd->add_option("--fixture", in.fixture, "run the steps of this golden fixture (its folder is the model unless -m)");
  cmd->add_option("-m,--model", in.model, "model folder (config.json + model.safetensors)");
  cmd->add_option("--tokens", in.tokens, "token file (ids; one step per line)");
  cmd->add_option("--text", in.text, "text file, tokenized as `plumb run` tokenizes a prompt (BOS first where the model wants it)");
  cmd->add_option("--tokenizer", in.tokenizer, "tokenizer.json (or its folder) for --text; default: the model folder's");
  cmd->add_option("--chunk", in.chunk, "split --text into prefill chunks of this many tokens (0: one chunk)")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace plumb::cli
