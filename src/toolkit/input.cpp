// Run inputs: fixture steps, token files and tokenized text, each checked with messages naming the file.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "model/config.h"
#include "plumb/text.h"
#include "toolkit/trace.h"

namespace plumb::toolkit {

namespace {

void add_step(RunInput& in, std::vector<int32_t> tokens) {
  GoldenStep s;
  s.name = fmt::format("s{}", in.steps.size());
  s.start_pos = in.steps.empty() ? 0 : in.steps.back().start_pos + int64_t(in.steps.back().tokens.size());
  s.kind = (!in.steps.empty() && tokens.size() == 1) ? "decode" : "prefill";
  s.tokens = std::move(tokens);
  in.steps.push_back(std::move(s));
}

}  // namespace

RunInput input_from_fixture(const std::string& dir) {
  const auto fx = GoldenFixture::load(dir);
  RunInput in{dir, "fixture " + dir, fx.steps};
  for (size_t i = 1; i < in.steps.size(); ++i)
    PLUMB_CHECK(in.steps[i].start_pos == in.steps[i - 1].start_pos + int64_t(in.steps[i - 1].tokens.size()),
                "{}: step {} starts at {}, not where step {} ends (steps must be contiguous)", dir, in.steps[i].name,
                in.steps[i].start_pos, in.steps[i - 1].name);
  return in;
}

RunInput input_from_tokens(const std::string& model_dir, const std::string& file) {
  std::istringstream f(read_text_file(file, "token file"));
  RunInput in{model_dir, "tokens " + file, {}};
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::vector<int32_t> toks = parse_token_ids(line, fmt::format("{}:{}", file, lineno));
    if (!toks.empty()) add_step(in, std::move(toks));
  }
  PLUMB_CHECK(!in.steps.empty(), "token file {} holds no token ids", file);
  return in;
}

RunInput input_from_text(const std::string& model_dir, const std::string& text_file, const std::string& tokenizer,
                         int64_t chunk) {
  const std::string text = read_text_file(text_file, "text file");
  // The tokenizer (and its tokenizer_config.json) after the file: a missing file is the likelier mistake.
  const Tokenizer tok = Tokenizer::load(tokenizer.empty() ? model_dir : tokenizer);
  const int32_t config_bos = ModelConfig::load((std::filesystem::path(model_dir) / "config.json").string()).bos_token;
  const auto ids = encode_prompt(tok, text, config_bos);  // BOS as `plumb run` adds it
  PLUMB_CHECK(!ids.empty(), "text file {} tokenizes to nothing", text_file);
  RunInput in{model_dir, "text " + text_file, {}};
  const size_t n = chunk > 0 ? size_t(chunk) : ids.size();
  for (size_t i = 0; i < ids.size(); i += n)
    add_step(in, std::vector<int32_t>(ids.begin() + int64_t(i), ids.begin() + int64_t(std::min(ids.size(), i + n))));
  // A chunk of one token after the first is a decode step by construction, which is what it is.
  return in;
}

}  // namespace plumb::toolkit
