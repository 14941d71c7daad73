// DeepSeek-V4 chat encoding (plumb/text.h): a C++ rendering of the rules of the model repository's
// encoding/encoding_dsv4.py for system / user / developer / assistant turns, thinking and chat modes, reasoning
// dropped from earlier turns, the "max" reasoning-effort prompt, tools (the DSML markup: dsml.cpp), tool calls and
// tool results. Tasks, latest_reminder and response_format are not supported (an unknown role is an error rather
// than a silently different prompt). docs/generation.md.
#include <algorithm>

#include "core/error.h"
#include "plumb/text.h"
#include "text/chat.h"
#include "text/dsml.h"

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

std::string effort_prefix(const ChatOptions& opt) {
  PLUMB_CHECK(opt.reasoning_effort.empty() || opt.reasoning_effort == "high" || opt.reasoning_effort == "max",
              "reasoning effort \"{}\" is not one of high, max", opt.reasoning_effort);
  return opt.thinking && opt.reasoning_effort == "max" ? std::string(kEffortMax) : std::string();
}

// A user turn's piece: its text, or a tool's result (consecutive user and tool messages are one user turn).
struct Block {
  bool tool_result = false;
  std::string text;
  std::string call_id;
};

// A message as the encoder renders it: user turns merged from user and tool messages; the system message that
// carries the tools block.
struct Turn {
  ChatMessage m;
  std::vector<Block> blocks;  // user
  bool tools = false;
  size_t source = 0;  // the index of the message it came from (errors name it)
};

// Tool results in the order of the calls they answer (the last assistant turn's calls before them, by id; results
// with an id it did not name go first, in their own order), where a user turn holds more than one.
void order_tool_results(std::vector<Turn>& ts) {
  std::vector<std::pair<std::string, int>> order;  // (call id, its place)
  for (Turn& t : ts) {
    if (t.m.role == "assistant" && !t.m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < t.m.tool_calls.size(); ++i)
        if (!t.m.tool_calls[i].id.empty()) order.emplace_back(t.m.tool_calls[i].id, int(i));
      continue;
    }
    std::vector<Block> results;
    for (const Block& b : t.blocks)
      if (b.tool_result) results.push_back(b);
    if (results.size() < 2 || order.empty()) continue;
    auto place = [&](const Block& b) {
      for (const auto& [id, i] : order)
        if (id == b.call_id) return i;
      return 0;
    };
    std::stable_sort(results.begin(), results.end(), [&](const Block& x, const Block& y) { return place(x) < place(y); });
    size_t next = 0;
    for (Block& b : t.blocks)
      if (b.tool_result) b = results[next++];
  }
}

int last_user_turn(const std::vector<Turn>& ts) {
  for (int i = int(ts.size()) - 1; i >= 0; --i)
    if (is_user(ts[size_t(i)].m)) return i;
  return -1;
}

}  // namespace

std::string encode_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const auto& r = m.role;
    PLUMB_CHECK(r == "system" || r == "user" || r == "assistant" || r == "developer" || r == "tool",
                "chat message {}: role \"{}\" is not supported (system, user, assistant, developer, tool)", i, r);
    PLUMB_CHECK(r != "developer" || !m.content.empty(), "chat message {}: a developer message needs content", i);
    PLUMB_CHECK(r == "assistant" || m.tool_calls.empty(), "chat message {}: only an assistant message has tool calls", i);
  }
  const std::string tools = opt.tools.empty() ? std::string() : dsml::render_tools(opt.tools);
  // Consecutive user and tool messages become one user turn of blocks; the tools block follows the first system
  // message's content, or an empty system message put first.
  std::vector<Turn> ts;
  const bool has_system = std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == "system"; });
  if (!tools.empty() && !has_system) ts.push_back(Turn{ChatMessage("system", ""), {}, true, 0});
  bool attached = !ts.empty();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || m.role == "tool") {
      Block b{m.role == "tool", m.content, m.tool_call_id};
      if (!ts.empty() && ts.back().m.role == "user") {
        ts.back().blocks.push_back(std::move(b));
      } else {
        ts.push_back(Turn{ChatMessage("user", ""), {std::move(b)}, false, i});
      }
      continue;
    }
    const bool carries = !attached && !tools.empty() && m.role == "system";
    attached = attached || carries;
    ts.push_back(Turn{m, {}, carries, i});
  }
  order_tool_results(ts);
  // With tools the model keeps every turn's reasoning (it needs to see why it made earlier calls): no dropping.
  const bool drop = opt.drop_thinking && tools.empty();
  // With drop in thinking mode, turns before the last user turn lose their reasoning, and developer messages there
  // are dropped altogether.
  if (opt.thinking && drop) {
    const int lu = last_user_turn(ts);
    std::vector<Turn> kept;
    for (int i = 0; i < int(ts.size()); ++i) {
      Turn t = std::move(ts[size_t(i)]);
      if (i < lu && t.m.role == "developer") continue;
      if (i < lu && t.m.role == "assistant") t.m.reasoning.clear();
      kept.push_back(std::move(t));
    }
    ts = std::move(kept);
  }
  const int last_user = last_user_turn(ts);
  // Reasoning survives in thinking mode for turns after the last user turn, or everywhere without dropping.
  auto keeps_thinking = [&](int i) { return opt.thinking && (!drop || i >= last_user); };

  std::string out = opt.add_bos ? std::string(chat::kBos) : std::string();
  for (int i = 0; i < int(ts.size()); ++i) {
    const Turn& t = ts[size_t(i)];
    const ChatMessage& m = t.m;
    if (i == 0) out += effort_prefix(opt);
    if (m.role == "system") {
      out += m.content;
      if (t.tools) out += "\n\n" + tools;
    } else if (m.role == "developer") {
      out += chat::kUser;
      out += m.content;
    } else if (m.role == "user") {
      out += chat::kUser;
      for (size_t b = 0; b < t.blocks.size(); ++b) {
        if (b) out += "\n\n";
        out += t.blocks[b].tool_result ? "<tool_result>" + t.blocks[b].text + "</tool_result>" : t.blocks[b].text;
      }
    } else {  // assistant: [reasoning </think>] content [tool calls] EOS; its <think> came with the user turn before
      if (opt.thinking && (!drop || i > last_user)) {
        out += m.reasoning;
        out += chat::kThinkEnd;
      }
      out += m.content;
      out += dsml::render_calls(m.tool_calls, fmt::format("chat message {}", t.source));
      out += chat::kEos;
    }
    // A user turn followed by an assistant turn, or ending the conversation, opens the assistant's turn.
    const bool next_is_reply = i + 1 == int(ts.size()) || ts[size_t(i) + 1].m.role == "assistant";
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
  ChatMessage m("assistant", "");
  const size_t end = thinking ? text.find(chat::kThinkEnd) : 0;
  if (thinking && end == std::string_view::npos) {
    m.reasoning = std::string(text);
    return m;
  }
  if (thinking) m.reasoning = std::string(text.substr(0, end));
  m.content = std::string(thinking ? text.substr(end + chat::kThinkEnd.size()) : text);
  // A complete tool-call block ending the content: the calls, and the content before its blank line.
  const size_t at = m.content.find(dsml::kCallsOpen);
  if (at == std::string::npos) return m;
  if (auto calls = dsml::parse_calls(std::string_view(m.content).substr(at))) {
    m.tool_calls = std::move(*calls);
    const bool blank = at >= 2 && m.content.compare(at - 2, 2, "\n\n") == 0;
    m.content.resize(blank ? at - 2 : at);
  }
  return m;
}

}  // namespace plumb
