// DeepSeek-V4 chat encoding (plumb/text.h): a C++ rendering of the rules of the model repository's
// encoding/encoding_dsv4.py for system / user / developer / assistant turns, thinking and chat modes, reasoning
// dropped from earlier turns, and the "max" reasoning-effort prompt. Tools, tasks and latest_reminder are not
// supported (an unknown role is an error rather than a silently different prompt). docs/generation.md.
#include <algorithm>

#include "core/error.h"
#include "plumb/text.h"
#include "text/chat.h"

namespace plumb {

namespace {

// Prepended to the first message in thinking mode with reasoning_effort "max" (verbatim from the official
// encoder: the model was trained on exactly this text).
constexpr std::string_view kEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

bool is_user(const ChatMessage& m) { return m.role == "user" || m.role == "developer"; }

int last_user_index(const std::vector<ChatMessage>& ms) {
  for (int i = int(ms.size()) - 1; i >= 0; --i)
    if (is_user(ms[size_t(i)])) return i;
  return -1;
}

std::string effort_prefix(const ChatOptions& opt) {
  PLUMB_CHECK(opt.reasoning_effort.empty() || opt.reasoning_effort == "high" || opt.reasoning_effort == "max",
              "reasoning effort \"{}\" is not one of high, max", opt.reasoning_effort);
  return opt.thinking && opt.reasoning_effort == "max" ? std::string(kEffortMax) : std::string();
}

}  // namespace

std::string encode_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    PLUMB_CHECK(r == "system" || r == "user" || r == "assistant" || r == "developer",
                "chat message {}: role \"{}\" is not supported (system, user, assistant, developer)", i, r);
    PLUMB_CHECK(r != "developer" || !messages[i].content.empty(), "chat message {}: a developer message needs content", i);
  }
  // With drop_thinking in thinking mode, turns before the last user message lose their reasoning, and developer
  // messages there are dropped altogether.
  std::vector<ChatMessage> ms;
  if (opt.thinking && opt.drop_thinking) {
    const int lu = last_user_index(messages);
    for (int i = 0; i < int(messages.size()); ++i) {
      ChatMessage m = messages[size_t(i)];
      if (i < lu && m.role == "developer") continue;
      if (i < lu && m.role == "assistant") m.reasoning.clear();
      ms.push_back(std::move(m));
    }
  } else {
    ms = messages;
  }
  const int last_user = last_user_index(ms);
  // Reasoning survives in thinking mode for turns after the last user message, or everywhere without dropping.
  auto keeps_thinking = [&](int i) { return opt.thinking && (!opt.drop_thinking || i >= last_user); };

  std::string out = opt.add_bos ? std::string(chat::kBos) : std::string();
  for (int i = 0; i < int(ms.size()); ++i) {
    const ChatMessage& m = ms[size_t(i)];
    if (i == 0) out += effort_prefix(opt);
    if (m.role == "system") {
      out += m.content;
    } else if (is_user(m)) {
      out += chat::kUser;
      out += m.content;
    } else {  // assistant: [reasoning </think>] content EOS; its <think> came with the preceding user turn
      if (opt.thinking && (!opt.drop_thinking || i > last_user)) {
        out += m.reasoning;
        out += chat::kThinkEnd;
      }
      out += m.content;
      out += chat::kEos;
    }
    // A user turn followed by an assistant turn, or ending the conversation, opens the assistant's turn.
    const bool next_is_reply = i + 1 == int(ms.size()) || ms[size_t(i) + 1].role == "assistant";
    if (is_user(m) && next_is_reply) {
      out += chat::kAssistant;
      out += keeps_thinking(i) ? chat::kThinkStart : chat::kThinkEnd;
    }
  }
  return out;
}

std::string chat_prefix(const std::string& system, const ChatOptions& opt) {
  std::string out = opt.add_bos ? std::string(chat::kBos) : std::string();
  out += effort_prefix(opt);
  return out + system;
}

std::string chat_user_turn(const std::string& content, bool thinking) {
  std::string out(chat::kUser);
  out += content;
  out += chat::kAssistant;
  out += thinking ? chat::kThinkStart : chat::kThinkEnd;
  return out;
}

std::string chat_turn_end() { return std::string(chat::kEos); }

void require_chat_tokens(const Tokenizer& tok) {
  for (const auto t : chat::kRequiredTokens)
    PLUMB_CHECK(tok.token_id(t) >= 0, "{} has no token \"{}\": this model cannot be prompted in the DeepSeek chat "
                "format (use raw prompts)", tok.path(), t);
}

ChatMessage parse_reply(std::string_view text, bool thinking) {
  ChatMessage m{"assistant", "", ""};
  if (!thinking) {
    m.content = std::string(text);
    return m;
  }
  const size_t end = text.find(chat::kThinkEnd);
  if (end == std::string_view::npos) {
    m.reasoning = std::string(text);
  } else {
    m.reasoning = std::string(text.substr(0, end));
    m.content = std::string(text.substr(end + chat::kThinkEnd.size()));
  }
  return m;
}

}  // namespace plumb
