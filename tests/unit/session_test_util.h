// Shared by the session tests of both backends (test_session_rewind.cpp, tests/cuda/test_cuda_forward.cpp): token runs
// and an engine over csa-long, whose CSA and HCA windows of 4 and 8 and sliding window of 8 put every kind of cache
// boundary inside a call of a few dozen tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plumb/engine.h"

namespace plumb_test {

// n token ids of csa-long's 256-token vocabulary, a different run for each salt.
inline std::vector<int32_t> csa_long_ids(size_t n, int salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + 11 + size_t(salt) * 101) % 256);
  return t;
}

// csa-long on `backend` with `patches`, in passes of 7 tokens (a 60-token call: 9 passes).
inline std::shared_ptr<plumb::Engine> csa_long_engine(const std::string& backend, const std::string& patches = "") {
  plumb::EngineOptions o;
  o.backend = backend, o.patches = patches, o.prefill_chunk = 7;
  return plumb::Engine::load(std::string(PLUMB_TEST_DATA) + "/golden/csa-long", o);
}

}  // namespace plumb_test
