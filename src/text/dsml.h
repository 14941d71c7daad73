// DeepSeek-V4's DSML tool markup (the model repository's encoding/encoding_dsv4.py): the "## Tools" block of the
// system prompt, an assistant turn's tool calls, and a reply's calls read back. JSON is written as Python's
// json.dumps writes it (", " and ": " between items, non-ASCII kept): the model was trained on that text.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "plumb/text.h"

namespace plumb::dsml {

inline constexpr std::string_view kCallsOpen = kToolCallsOpen;
inline constexpr std::string_view kCallsClose = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kParamOpen = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

// `j` as Python's json.dumps(j, ensure_ascii=False) writes it (key order kept).
std::string python_json(const nlohmann::ordered_json& j);

// The "## Tools" block for `tools_json`, an array of OpenAI tool objects ({"type": "function", "function": {...}}):
// each function's object on a line. Throws plumb::Error naming the tool at fault.
std::string render_tools(const std::string& tools_json);

// An assistant turn's calls as the encoder appends them after its content: "\n\n<｜DSML｜tool_calls>\n" + one invoke
// per call + "\n</｜DSML｜tool_calls>"; "" for none. Each call's arguments must be a JSON object (text that is not
// JSON becomes one string parameter named "arguments", as the official encoder does). Throws plumb::Error naming
// `what` and the call at fault.
std::string render_calls(const std::vector<ToolCall>& calls, const std::string& what);

// What an assistant turn whose content is empty begins with when it calls `name` first: the block's opening and the
// first invoke's, up to the first parameter (render_calls' first bytes; the tool-call mask's fixed text,
// tool_call_mask.h).
std::string call_opening(std::string_view name);

// The calls of `block`, which must be exactly one complete "<｜DSML｜tool_calls>...</｜DSML｜tool_calls>" block;
// nullopt if it is cut off or malformed. Each call's arguments come back as the JSON object the encoder's parser
// builds: string="true" values as JSON strings, string="false" values as written (a value that is not valid JSON
// becomes a string).
std::optional<std::vector<ToolCall>> parse_calls(std::string_view block);

}  // namespace plumb::dsml
