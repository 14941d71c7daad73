// What the library derives from a tokenizer once and keeps with it, shared by its copies (JSON mode's token tables:
// 20-30 ms at a 129K vocabulary, which each generation would otherwise build again).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "plumb/text.h"

namespace plumb {

struct TokenizerCache {
  // The object kept under `key` with this tokenizer, made by `make` at the first call (under a lock: a second caller
  // waits for it rather than making it again). Thread-safe.
  static std::shared_ptr<const void> get(const Tokenizer& tok, const std::string& key,
                                         const std::function<std::shared_ptr<const void>()>& make);
  template <class T, class Make>
  static std::shared_ptr<const T> get_as(const Tokenizer& tok, const std::string& key, Make&& make) {
    return std::static_pointer_cast<const T>(get(tok, key, [&]() -> std::shared_ptr<const void> { return make(); }));
  }
};

}  // namespace plumb
