// `plumb run [-m DIR] -p TEXT`: one prompt in, the continuation streamed to stdout token by token, then a
// one-line summary on stderr (prompt / generated tokens, prefill and decode tokens per second).
#include <charconv>
#include <cstdio>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "plumb/check.h"

namespace plumb::cli {

namespace {

struct RunOptions {
  ModelArgs model;
  GenArgs gen;
  std::string prompt;
  std::string file; // -f: the prompt's text from a file ("-": stdin)
  std::string ids;  // --ids: raw token ids instead of text
  bool ids_given = false, prompt_given = false;  // (--ids "" / -p "": given, and empty)
  bool chat = false, raw = false;
  JsonArgs json;
  ChatModeArgs mode;
};

// The prompt text of -f FILE ("-": all of stdin), byte for byte: a long prompt or one with quotes and newlines
// does not fit a shell argument well.
std::string read_prompt_file(const std::string& file) {
  if (file != "-") return read_text_file(file, "prompt file");
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  PLUMB_CHECK(!std::cin.bad(), "-f -: reading the prompt from stdin failed");
  return ss.str();
}

int run(const RunOptions& o) {
  // Every chat-mode option implies --chat (--no-think too: it names chat's non-thinking mode).
  const bool chat = o.chat || o.mode.system_given || o.mode.think || o.mode.no_think || !o.mode.effort.empty();
  PLUMB_CHECK(!(o.raw && chat), "--raw cannot be combined with --chat, --system, --think, --no-think or --reasoning-effort");
  PLUMB_CHECK(o.ids.empty() || !chat, "--ids is a raw prompt: it cannot be combined with the chat options");
  const JsonFormat json = json_format(o.json, o.mode.think);
  // Checked before the model loads (as are the sampling options below): an empty prompt is a usage error, not
  // something to load 100 GB for.
  const std::string text = o.file.empty() ? o.prompt : read_prompt_file(o.file);
  PLUMB_CHECK(o.file.empty() || !text.empty(), "empty prompt: {} holds no text", o.file == "-" ? "stdin" : o.file);
  PLUMB_CHECK(!o.prompt_given || !text.empty(), "empty prompt: -p gives no text");
  const std::vector<int32_t> given_ids = parse_token_ids(o.ids, "--ids");
  PLUMB_CHECK(!o.ids_given || !given_ids.empty(), "empty prompt: --ids lists no token ids");
  PLUMB_CHECK(!text.empty() || !given_ids.empty(), "empty prompt: give the text to continue with -p TEXT or -f FILE");
  check_generate_options(o.gen.gen);

  const LoadedModel m = load_model(o.model);
  const Tokenizer& tok = *m.tok;
  const ModelInfo& info = m.engine->info();
  std::vector<int32_t> prompt;
  if (!given_ids.empty()) {
    prompt = given_ids;
  } else if (chat) {
    require_chat_tokens(tok);
    std::vector<ChatMessage> msgs;
    if (!o.mode.system.empty()) msgs.push_back({"system", o.mode.system, ""});
    msgs.push_back({"user", text, ""});
    prompt = tok.encode(encode_chat(msgs, ChatOptions{o.mode.think, true, true, o.mode.effort, {}}));
  } else {
    prompt = encode_prompt(tok, text, info.bos_token);  // BOS as transformers adds it for DeepSeek
  }

  uint64_t seed = 0;
  GenerateOptions gopt = generate_options(o.gen, m, seed);
  json.apply(gopt);
  auto session = m.engine->new_session();
  PrefillLine prefill(*session, o.model.quiet);  // (a long prompt's passes, on a terminal)
  bool newline = true;
  GenerateResult r;
  try {
    r = generate(*session, tok, prompt, gopt, [&](std::string_view s) {
      prefill.done();
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);  // stream: every piece as soon as it is final
      newline = s.back() == '\n';
    });
  } catch (const Error&) {
    prefill.done();
    if (!newline) std::fputc('\n', stdout);  // (a reply cut by the error: the error line on a line of its own)
    std::fflush(stdout);
    throw;
  }
  prefill.done();  // (a reply with no text)
  if (!newline) std::fputc('\n', stdout);
  std::fflush(stdout);
  const int64_t n = int64_t(r.tokens.size());
  fmt::print(stderr, "{}, {} ({}), {}{}\n", count_text(r.prompt_tokens, "prompt token"), count_text(n, "generated token"),
             stop_reason_name(r.stop), rates_text(r.prompt_tokens, r.prefill_seconds, n, r.decode_seconds),
             gopt.sampling.temperature > 0 ? fmt::format(", seed {}", seed) : std::string(", greedy"));
  return 0;
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt, streamed to stdout (default model: the bundled "
                                        "models/tiny)");
  add_model_options(cmd, o->model);
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "the prompt text")->each([o](const std::string&) { o->prompt_given = true; });
  auto* f = cmd->add_option("-f,--file", o->file, "read the prompt text from this file (-: from stdin), as it is")
                ->excludes(p);
  cmd->add_option("--ids", o->ids, "the prompt as token ids (\"0 15 27\"), fed as they are")
      ->each([o](const std::string&) { o->ids_given = true; })
      ->excludes(p)
      ->excludes(f);
  auto* c = cmd->add_flag("--chat", o->chat, "wrap the prompt as a user turn in the DeepSeek-V4 chat format");
  cmd->add_flag("--raw", o->raw, "use the prompt as it is, after BOS (the default)")->excludes(c);
  add_chat_mode_options(cmd, o->mode, "system prompt (implies --chat)",
                        "thinking mode: the reply opens with <think> (implies --chat)");
  add_sampling_options(cmd, o->gen);
  add_json_options(cmd, o->json, "the reply is");
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace plumb::cli
