// plumb chat's transcript file (chat_transcript.h).
#include "cli/chat_transcript.h"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/input_options.h"

namespace plumb::cli {

std::string write_transcript(const std::string& path, const Transcript& t) {
  if (path.empty()) return "a file name is needed: /save FILE";
  if (std::string why = output_file_problem(path); !why.empty()) return why;
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const auto& m : t.messages) {
    nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
    if (!m.reasoning.empty()) j["reasoning_content"] = m.reasoning;
    msgs.push_back(j);
  }
  const nlohmann::ordered_json doc = {{"model", t.model}, {"thinking", t.thinking}, {"seed", t.seed}, {"messages", msgs}};
  std::ofstream out(path);
  // (replace: a reply cut inside a UTF-8 sequence still saves)
  if (!out || !(out << doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n"))
    return fmt::format("cannot write {}", path);
  return "";
}

std::string read_transcript(const std::string& path, bool thinking, std::vector<ChatMessage>& out) {
  if (path.empty()) return "a file name is needed: /load FILE";
  std::ifstream in(path);
  if (!in) return fmt::format("cannot read {}", path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return fmt::format("{} is not valid JSON: {}", path, e.what());
  }
  if (!doc.is_object() || !doc.contains("messages") || !doc["messages"].is_array())
    return fmt::format("{} has no \"messages\" array (a file /save wrote has one)", path);
  if (doc.contains("thinking") && doc["thinking"].is_boolean() && doc["thinking"].get<bool>() != thinking)
    return fmt::format("{} was saved in {} mode and this chat is in {} mode ({})", path, thinking ? "chat" : "thinking",
                       thinking ? "thinking" : "chat", thinking ? "start plumb chat without --think" : "start plumb chat --think");
  const auto& ms = doc["messages"];
  for (size_t i = 0; i < ms.size(); ++i) {
    const auto& m = ms[i];
    auto text = [&](const char* key) -> const nlohmann::json* {
      return m.is_object() && m.contains(key) && m[key].is_string() ? &m[key] : nullptr;
    };
    if (!text("role") || !text("content")) return fmt::format("{}: message {} needs \"role\" and \"content\" strings", path, i + 1);
    ChatMessage c{m["role"].get<std::string>(), m["content"].get<std::string>(), ""};
    if (const auto* r = text("reasoning_content")) c.reasoning = r->get<std::string>();
    // The order the turns make: [system] user assistant user assistant ...
    const size_t k = i - (!out.empty() && out[0].role == "system" ? 1 : 0);
    const char* want = i == 0 && c.role == "system" ? "system" : k % 2 == 0 ? "user" : "assistant";
    if (c.role != want) return fmt::format("{}: message {} is a \"{}\" message where the turns need \"{}\"", path, i + 1, c.role, want);
    out.push_back(std::move(c));
  }
  if (out.empty() || out.back().role != "assistant")
    return fmt::format("{}: the conversation must end with a reply (an \"assistant\" message)", path);
  return "";
}

}  // namespace plumb::cli
