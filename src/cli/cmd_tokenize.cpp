// `plumb tokenize -t tokenizer.json [--decode] [--add-special] [--skip-special]`: line-based encode/decode of
// stdin with the escaped one-line text form of plumb/text.h (ids space-separated, one output line per input).
#include <charconv>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "plumb/check.h"
#include "plumb/text.h"

namespace plumb::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool decode = false;
  bool add_special = false;
  bool skip_special = false;
};


int run_tokenize(const TokenizeOptions& opt) {
  const auto tok = Tokenizer::load(opt.tokenizer);
  std::string line, out;
  size_t lineno = 0;
  while (std::getline(std::cin, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF file's line end (a \r to encode is written \r)
    try {
      out.clear();
      if (opt.decode) {
        const auto ids = parse_token_ids(line, "--decode");
        // tokenizers' decode skips an id it does not know; a user decoding ids by hand wants to hear of it.
        for (size_t k = 0; k < ids.size(); ++k)
          PLUMB_CHECK(ids[k] < tok.vocab_size(), "--decode: id {} (number {} on the line) is outside the tokenizer's "
                      "vocabulary [0, {})", ids[k], k + 1, tok.vocab_size());
        out = escape_line(tok.decode(ids, opt.skip_special));
      } else {
        const auto ids = tok.encode(unescape_line(line), opt.add_special);
        for (size_t k = 0; k < ids.size(); ++k) {
          if (k) out += ' ';
          out += std::to_string(ids[k]);
        }
      }
    } catch (const Error& e) {
      fail("stdin line {}: {}", lineno, e.what());
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto opt = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize", "Encode stdin lines to token ids (or --decode ids back to text); \\n \\t \\r \\\\ \\xHH escapes");
  cmd->add_option("-t,--tokenizer", opt->tokenizer, "path to tokenizer.json")->required();
  auto* decode = cmd->add_flag("--decode", opt->decode, "read ids per line (separated by spaces or single commas), print the escaped text (decoded "
                               "as the tokenizers library does: bytes that are not UTF-8 become U+FFFD)");
  cmd->add_flag("--add-special", opt->add_special, "add the post-processor's special tokens (e.g. BOS) when encoding")
      ->excludes(decode);
  cmd->add_flag("--skip-special", opt->skip_special, "drop special tokens when decoding (with --decode)")->needs(decode);
  cmd->callback([opt] { set_exit_code(run_tokenize(*opt)); });
}

}  // namespace plumb::cli
