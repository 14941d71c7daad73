// The DeepSeek-V4 chat format's special strings (the model repository's encoding/encoding_dsv4.py); the
// encoder itself is plumb::encode_chat in plumb/text.h, implemented in chat.cpp.
#pragma once
#include <string_view>

namespace plumb::chat {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// The strings a tokenizer must hold as single tokens for the chat format to reach the model intact.
inline constexpr std::string_view kRequiredTokens[] = {kBos, kEos, kUser, kAssistant, kThinkStart, kThinkEnd};

}  // namespace plumb::chat
