// Chat encoding tests: DeepSeek-V4 prompts written out by hand from the rules of the model repository's
// encoding/encoding_dsv4.py (docs/generation.md), compared with plumb::encode_chat; prompts and parsed replies that
// encoder itself rendered (tests/data/chat/cases.json: tools, tool calls and results); the incremental pieces
// `plumb chat` feeds; reply parsing; the tokens the bundled model's tokenizer makes of a rendered prompt; a plain
// prompt's BOS.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "plumb/text.h"

namespace {

using plumb::ChatMessage;
using plumb::ChatOptions;
using plumb::encode_chat;

// Spelled out here (not taken from the code under test).
const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string U = "<｜User｜>";
const std::string A = "<｜Assistant｜>";

ChatOptions chat_mode() { return ChatOptions{false, true, true, "", {}}; }
ChatOptions thinking(bool drop = true) { return ChatOptions{true, drop, true, "", {}}; }

TEST(ChatEncoding, SingleUserTurnChatMode) {
  // Non-thinking mode: the assistant turn opens with </think> (an empty, closed reasoning block).
  EXPECT_EQ(encode_chat({{"user", "Hi", ""}}, chat_mode()), BOS + U + "Hi" + A + "</think>");
}

TEST(ChatEncoding, SystemAndUserThinkingMode) {
  // The official README's quick-start example.
  EXPECT_EQ(encode_chat({{"system", "You are a helpful assistant.", ""}, {"user", "What is 2+2?", ""}}, thinking()),
            BOS + "You are a helpful assistant." + U + "What is 2+2?" + A + "<think>");
}

TEST(ChatEncoding, MultiTurnChatMode) {
  const std::vector<ChatMessage> ms = {{"system", "S", ""}, {"user", "u1", ""}, {"assistant", "a1", ""},
                                       {"user", "u2", ""}};
  EXPECT_EQ(encode_chat(ms, chat_mode()), BOS + "S" + U + "u1" + A + "</think>a1" + EOS + U + "u2" + A + "</think>");
}

TEST(ChatEncoding, MultiTurnThinkingDropsEarlierReasoning) {
  // drop_thinking (the default): turns before the last user message lose their reasoning and their assistant
  // opening becomes </think>; only the new turn opens with <think>.
  const std::vector<ChatMessage> ms = {{"user", "u1", ""}, {"assistant", "a1", "r1"}, {"user", "u2", ""}};
  EXPECT_EQ(encode_chat(ms, thinking()), BOS + U + "u1" + A + "</think>a1" + EOS + U + "u2" + A + "<think>");
}

TEST(ChatEncoding, MultiTurnThinkingKeepsReasoningWithoutDrop) {
  const std::vector<ChatMessage> ms = {{"user", "u1", ""}, {"assistant", "a1", "r1"}, {"user", "u2", ""}};
  EXPECT_EQ(encode_chat(ms, thinking(false)),
            BOS + U + "u1" + A + "<think>r1</think>a1" + EOS + U + "u2" + A + "<think>");
}

TEST(ChatEncoding, ConversationEndingWithAnAssistantTurn) {
  // The reply after the last user message keeps its reasoning even with drop_thinking; no generation prompt
  // follows an assistant turn.
  const std::vector<ChatMessage> ms = {{"user", "q", ""}, {"assistant", "a", "r"}};
  EXPECT_EQ(encode_chat(ms, thinking()), BOS + U + "q" + A + "<think>r</think>a" + EOS);
  EXPECT_EQ(encode_chat(ms, chat_mode()), BOS + U + "q" + A + "</think>a" + EOS);
}

TEST(ChatEncoding, ReasoningIgnoredInChatMode) {
  const std::vector<ChatMessage> ms = {{"user", "u1", ""}, {"assistant", "a1", "secret"}, {"user", "u2", ""}};
  EXPECT_EQ(encode_chat(ms, chat_mode()), BOS + U + "u1" + A + "</think>a1" + EOS + U + "u2" + A + "</think>");
}

TEST(ChatEncoding, ConsecutiveUserMessagesAndDeveloper) {
  // Consecutive user messages are one user turn, their texts a blank line apart (the encoder merges user and tool
  // messages into one turn's blocks). Only a user turn followed by an assistant turn (or ending the conversation)
  // opens the assistant's turn. A developer message renders like a user message, unmerged; with drop_thinking, one
  // before the last user is dropped.
  EXPECT_EQ(encode_chat({{"user", "a", ""}, {"user", "b", ""}}, chat_mode()), BOS + U + "a\n\nb" + A + "</think>");
  EXPECT_EQ(encode_chat({{"developer", "d", ""}, {"user", "b", ""}}, chat_mode()),
            BOS + U + "d" + U + "b" + A + "</think>");
  EXPECT_EQ(encode_chat({{"developer", "d", ""}, {"user", "b", ""}}, thinking()), BOS + U + "b" + A + "<think>");
}

TEST(ChatEncoding, NoBosAndSystemOnly) {
  ChatOptions o = chat_mode();
  o.add_bos = false;
  EXPECT_EQ(encode_chat({{"user", "x", ""}}, o), U + "x" + A + "</think>");
  EXPECT_EQ(encode_chat({{"system", "only", ""}}, chat_mode()), BOS + "only");
}

TEST(ChatEncoding, ReasoningEffortMax) {
  const std::string effort =
      "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking "
      "and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic "
      "against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire "
      "deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis "
      "to ensure absolutely no assumption is left unchecked.\n\n";
  ChatOptions o = thinking();
  o.reasoning_effort = "max";
  EXPECT_EQ(encode_chat({{"system", "S", ""}, {"user", "q", ""}}, o), BOS + effort + "S" + U + "q" + A + "<think>");
  o.reasoning_effort = "high";  // renders nothing
  EXPECT_EQ(encode_chat({{"user", "q", ""}}, o), BOS + U + "q" + A + "<think>");
  ChatOptions c = chat_mode();
  c.reasoning_effort = "max";  // thinking mode only
  EXPECT_EQ(encode_chat({{"user", "q", ""}}, c), BOS + U + "q" + A + "</think>");
  c.reasoning_effort = "low";
  EXPECT_THROW(encode_chat({{"user", "q", ""}}, c), plumb::Error);
}

TEST(ChatEncoding, UnknownRoleIsAnError) {
  try {
    encode_chat({{"function", "x", ""}}, chat_mode());
    FAIL() << "no error";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"function\""), std::string::npos) << e.what();
  }
}

TEST(ChatEncoding, IncrementalPiecesEqualTheWholeWithoutDrop) {
  // `plumb chat` feeds prefix + per turn (user turn, reply, EOS): exactly encode_chat with drop_thinking off.
  for (bool think : {false, true}) {
    ChatOptions o{think, false, true, "", {}};
    std::vector<ChatMessage> ms = {{"system", "sys", ""}};
    std::string inc = plumb::chat_prefix("sys", o);
    const char* turns[][3] = {{"u1", "r1", "a1"}, {"u2", "r2", "a2"}, {"u3", "r3", "a3"}};
    for (const auto& t : turns) {
      ms.push_back({"user", t[0], ""});
      inc += plumb::chat_user_turn(t[0], think);
      EXPECT_EQ(inc, encode_chat(ms, o));
      const std::string reply = think ? std::string(t[1]) + "</think>" + t[2] : std::string(t[2]);
      inc += reply + plumb::chat_turn_end();
      ms.push_back({"assistant", t[2], think ? t[1] : ""});
      EXPECT_EQ(inc, encode_chat(ms, o));
    }
  }
}

TEST(ChatEncoding, ParseReply) {
  auto m = plumb::parse_reply("let me see</think>It is 4.", true);
  EXPECT_EQ(m.role, "assistant");
  EXPECT_EQ(m.reasoning, "let me see");
  EXPECT_EQ(m.content, "It is 4.");
  m = plumb::parse_reply("still thinking", true);
  EXPECT_EQ(m.reasoning, "still thinking");
  EXPECT_EQ(m.content, "");
  m = plumb::parse_reply("a</think>b", false);
  EXPECT_EQ(m.content, "a</think>b");
}

TEST(ChatEncoding, SpecialStringsAreSingleTokensOfTheBundledTokenizer) {
  const auto tok = plumb::Tokenizer::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
  plumb::require_chat_tokens(tok);
  const auto ids = tok.encode(encode_chat({{"user", "Hi", ""}}, chat_mode()));
  ASSERT_GE(ids.size(), 5u);
  EXPECT_EQ(ids[0], tok.token_id(BOS));
  EXPECT_EQ(ids[1], tok.token_id(U));
  EXPECT_EQ(ids[ids.size() - 2], tok.token_id(A));
  EXPECT_EQ(ids.back(), tok.token_id("</think>"));
  EXPECT_EQ(tok.bos_id(), 0);  // tokenizer_config.json
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.decode(ids), encode_chat({{"user", "Hi", ""}}, chat_mode()));
}

// A plain prompt's BOS, as transformers' tokenizer(text) adds it for DeepSeek: tokenizer_config.json decides where
// it names a BOS (add_bos_token, default true), else config.json's bos_token_id; tokenizer.json's own post-processor
// (tests/data/tokenizer/tiny.json: a template adding BOS 270) never adds a second one.
TEST(PromptEncoding, BosAsTransformersAddsIt) {
  namespace fs = std::filesystem;
  using Ids = std::vector<int32_t>;
  const auto cat = [](Ids a, const Ids& b) { return a.insert(a.end(), b.begin(), b.end()), a; };
  const auto bundled = plumb::Tokenizer::load(std::string(PLUMB_TEST_DATA) + "/../../models/tiny");
  const Ids once = bundled.encode("Once upon a time");
  EXPECT_EQ(plumb::encode_prompt(bundled, "Once upon a time", -1), cat({0}, once));  // its tokenizer_config: BOS 0
  EXPECT_EQ(plumb::encode_prompt(bundled, "Once upon a time", 5), cat({0}, once));   // tokenizer_config wins

  const std::string tiny_json = std::string(PLUMB_TEST_DATA) + "/tokenizer/tiny.json";
  const auto bare = plumb::Tokenizer::load(tiny_json);  // no tokenizer_config.json beside it
  const Ids hi = bare.encode("hi");
  ASSERT_EQ(bare.encode("hi", true), cat({270}, hi));  // the post-processor's BOS (what the rule must not double)
  EXPECT_EQ(plumb::encode_prompt(bare, "hi", -1), hi);
  EXPECT_EQ(plumb::encode_prompt(bare, "hi", 270), cat({270}, hi));

  const fs::path dir = fs::temp_directory_path() / "plumb_prompt_bos";
  fs::create_directories(dir);
  fs::copy_file(tiny_json, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  const auto with_config = [&](const std::string& json) {
    std::ofstream(dir / "tokenizer_config.json") << json;
    return plumb::Tokenizer::load(dir.string());
  };
  EXPECT_EQ(plumb::encode_prompt(with_config("{\"bos_token\": \"" + BOS + "\"}"), "hi", -1), cat({270}, hi));
  EXPECT_EQ(plumb::encode_prompt(with_config("{\"bos_token\": \"" + BOS + "\", \"add_bos_token\": false}"), "hi", 270), hi);
  EXPECT_EQ(plumb::encode_prompt(with_config("{\"bos_token\": {\"content\": \"" + BOS + "\"}, \"add_bos_token\": true}"), "hi", -1),
            cat({270}, hi));
  EXPECT_EQ(plumb::encode_prompt(with_config("{}"), "hi", 270), cat({270}, hi));  // no BOS named there: config.json's
  fs::remove_all(dir);
}

TEST(ChatEncoding, TokenizerWithoutChatTokensIsRejected) {
  // tests/data/tokenizer/tiny.json has <｜User｜> and <think> but no <｜Assistant｜>.
  const auto tok = plumb::Tokenizer::load(std::string(PLUMB_TEST_DATA) + "/tokenizer/tiny.json");
  EXPECT_THROW(plumb::require_chat_tokens(tok), plumb::Error);
}

// DeepSeek's own encoder's renderings (tools/chat/make_chat_cases.py ran encoding_dsv4.py on
// tools/chat/chat_inputs.json): every prompt byte for byte, every reply's parse.
// (ordered_json: a schema's keys in the order written, as Python's json keeps them)
std::vector<ChatMessage> openai_messages(const nlohmann::ordered_json& ms) {
  std::vector<ChatMessage> out;
  for (const auto& m : ms) {
    ChatMessage c(m.at("role"), m.value("content", std::string()), m.value("reasoning_content", std::string()));
    c.tool_call_id = m.value("tool_call_id", std::string());
    for (const auto& t : m.value("tool_calls", nlohmann::ordered_json::array()))
      c.tool_calls.push_back({t.at("id"), t.at("function").at("name"), t.at("function").at("arguments")});
    out.push_back(std::move(c));
  }
  return out;
}

TEST(ChatEncoding, MatchesTheOfficialEncoderWithTools) {
  std::ifstream f(std::string(PLUMB_TEST_DATA) + "/chat/cases.json");
  ASSERT_TRUE(f) << "tests/data/chat/cases.json";
  const nlohmann::ordered_json data = nlohmann::ordered_json::parse(f);
  ASSERT_GE(data["cases"].size(), 7u);
  for (const auto& c : data["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ChatOptions o{c["thinking"], c.value("drop_thinking", true), true, c.value("reasoning_effort", std::string()), {}};
    if (c.contains("tools")) o.tools = c["tools"].dump();
    const std::string got = encode_chat(openai_messages(c["messages"]), o), want = c["prompt"];
    if (got != want) {
      size_t at = 0;
      while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
      ADD_FAILURE() << "first difference at byte " << at << ": got ..." << got.substr(at > 40 ? at - 40 : 0, 120)
                    << "\nwant ..." << want.substr(at > 40 ? at - 40 : 0, 120);
    }
  }
  for (const auto& r : data["replies"]) {
    SCOPED_TRACE(r["name"].get<std::string>());
    const ChatMessage m = plumb::parse_reply(r["text"].get<std::string>(), r["thinking"]);
    EXPECT_EQ(m.content, r["content"]);
    EXPECT_EQ(m.reasoning, r["reasoning_content"]);
    ASSERT_EQ(m.tool_calls.size(), r["tool_calls"].size());
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      EXPECT_EQ(m.tool_calls[i].name, r["tool_calls"][i]["name"]);
      EXPECT_EQ(nlohmann::ordered_json::parse(m.tool_calls[i].arguments), r["tool_calls"][i]["arguments"]) << m.tool_calls[i].arguments;
    }
  }
}

// Replies whose tool-call block is cut off or malformed keep it as text; an assistant turn's calls render back into
// what parse_reply reads (a round trip); bad inputs are refused naming the message.
TEST(ChatEncoding, ToolCallBlocksRoundTripAndBrokenOnesStayText) {
  const std::string block = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_EQ(plumb::parse_reply("a\n\n" + block, false).tool_calls.size(), 1u);
  for (const std::string& broken : {block.substr(0, block.size() - 5), "a\n\n" + block + "tail",
                                   std::string("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\nx</｜DSML｜invoke>\n</｜DSML｜tool_calls>")}) {
    const ChatMessage m = plumb::parse_reply(broken, false);
    EXPECT_TRUE(m.tool_calls.empty()) << broken;
    EXPECT_EQ(m.content, broken);
  }
  ChatMessage a("assistant", "Sure.");
  a.tool_calls = {{"c1", "f", R"({"x": 1, "s": "two words", "o": {"k": [true, null]}})"}, {"c2", "g", "{}"}};
  const std::string prompt = encode_chat({{"user", "go", ""}, a}, chat_mode());
  const std::string reply = prompt.substr(prompt.find("</think>") + 8, prompt.size() - prompt.find("</think>") - 8 - EOS.size());
  const ChatMessage back = plumb::parse_reply(reply, false);
  EXPECT_EQ(back.content, "Sure.");
  ASSERT_EQ(back.tool_calls.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(back.tool_calls[0].arguments), nlohmann::json::parse(a.tool_calls[0].arguments));
  EXPECT_EQ(back.tool_calls[1].name, "g");
  EXPECT_EQ(back.tool_calls[1].arguments, "{}");
  ChatMessage bad("assistant", "");
  bad.tool_calls = {{"c", "f", "[1, 2]"}};
  try {
    encode_chat({{"user", "go", ""}, bad}, chat_mode());
    ADD_FAILURE() << "accepted";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat message 1: tool_calls[0].arguments must be a JSON object"), std::string::npos) << e.what();
  }
  ChatOptions o = chat_mode();
  o.tools = R"([{"type": "function"}])";
  EXPECT_THROW(encode_chat({{"user", "go", ""}}, o), plumb::Error);
}

}  // namespace
