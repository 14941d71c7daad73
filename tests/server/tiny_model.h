// The bundled tiny model and its tokenizer, loaded once for the server tests; a server's defaults and a tool
// conversation for them.
#pragma once
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "plumb/engine.h"
#include "plumb/text.h"
#include "server/openai.h"

namespace plumb::server::testing {

inline std::shared_ptr<Engine> tiny_engine() {
  static const std::shared_ptr<Engine> e = Engine::load(PLUMB_TINY_MODEL);
  return e;
}
inline const Tokenizer& tiny_tok() {
  static const Tokenizer t = Tokenizer::load(PLUMB_TINY_MODEL);
  return t;
}

// A server's defaults for the tiny model (plumb serve's command line: sampling at 0.8, 40 tokens, EOS stops).
inline Defaults tiny_model_defaults() {
  const ModelInfo& info = tiny_engine()->info();
  Defaults d;
  d.sampling.temperature = 0.8f;
  d.max_tokens = 40;
  d.stop_tokens = {info.eos_token};
  d.model_id = "tiny";
  d.config_bos = info.bos_token;
  d.context = info.max_positions;
  d.vocab = info.vocab_size;
  d.eos_token = info.eos_token;
  d.tokenizer_eos = tiny_tok().eos_id();
  return d;
}

// A conversation in which the assistant called a tool ("now", answered "12:00"): the request's tools and messages,
// and the same as encode_chat's messages and options.
struct ToolTurns {
  nlohmann::ordered_json tools, messages;
  std::vector<ChatMessage> chat;
  ChatOptions options;
};
inline ToolTurns tool_turns() {
  ToolTurns t;
  t.tools = nlohmann::ordered_json::array({{{"type", "function"}, {"function", {{"name", "now"}, {"description", "The time."},
                                            {"parameters", {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}}}}}}});
  const nlohmann::ordered_json call = {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "now"}, {"arguments", "{}"}}}};
  t.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Time?"}},
                                              {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}},
                                              {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "12:00"}}});
  ChatMessage a("assistant", "");
  a.tool_calls = {{"c1", "now", "{}"}};
  ChatMessage r("tool", "12:00");
  r.tool_call_id = "c1";
  t.chat = {{"user", "Time?"}, a, r};
  t.options.tools = t.tools.dump();
  return t;
}

}  // namespace plumb::server::testing
