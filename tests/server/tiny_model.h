// The bundled tiny model and its tokenizer, loaded once for the server tests.
#pragma once
#include <memory>

#include "plumb/engine.h"
#include "plumb/text.h"

namespace plumb::server::testing {

inline std::shared_ptr<Engine> tiny_engine() {
  static const std::shared_ptr<Engine> e = Engine::load(PLUMB_TINY_MODEL);
  return e;
}
inline const Tokenizer& tiny_tok() {
  static const Tokenizer t = Tokenizer::load(PLUMB_TINY_MODEL);
  return t;
}

}  // namespace plumb::server::testing
