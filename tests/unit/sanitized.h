// How much random repetition a test runs: all of it in the Release build, about a quarter under AddressSanitizer +
// UndefinedBehaviorSanitizer (scripts/test.sh's second build, where the CPU reference's products run ~10-30x slower).
// Each scaled loop still takes every path under the sanitizers (what they check: memory and undefined behaviour on
// every path); the Release run keeps today's counts. Used by tests/unit and tests/server.
#pragma once
#include <algorithm>

namespace plumb_test {

// PLUMB_TEST_SANITIZED: set on the test targets when PLUMB_SANITIZE is ON (tests/CMakeLists.txt).
#ifdef PLUMB_TEST_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// A loop's count of random walks (blocks, seeds, generations): n in Release, n / 4 (at least 1) under the sanitizers.
constexpr int walks(int n) { return kSanitized ? std::max(1, n / 4) : n; }

// A request's max_tokens where the assertion does not depend on the length (only that generations overlap, or that
// a response equals another's): n in Release, n / 4 (at least 1) under the sanitizers.
constexpr int tokens(int n) { return kSanitized ? std::max(1, n / 4) : n; }

}  // namespace plumb_test
