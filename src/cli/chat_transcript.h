// plumb chat's transcript file (/save, /load, --load): JSON {"model", "thinking", "seed", "messages": [{"role",
// "content", "reasoning_content"?}]}, written and read in one place so that the two cannot drift apart.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plumb/text.h"

namespace plumb::cli {

struct Transcript {
  std::string model;  // the model folder it was made with (informational)
  bool thinking = false;
  uint64_t seed = 0;
  std::vector<ChatMessage> messages;
};

// Writes `t` to `path`; returns "" or why it could not (the caller's error line names the command).
std::string write_transcript(const std::string& path, const Transcript& t);

// Reads a transcript a chat in `thinking` mode can go on with: a system message first if any, then user and
// assistant turns by turns, ending with a reply; a file saved in the other mode is refused. Returns "" or why not
// (naming the file and the message at fault).
std::string read_transcript(const std::string& path, bool thinking, std::vector<ChatMessage>& out);

}  // namespace plumb::cli
