// plumb selftest: the toolkit's own test. For every built-in fault, run diff against the reference on bundled
// fixtures and check that the first divergence and the diagnosis are the expected ones.
#pragma once
#include <functional>
#include <string>
#include <vector>


namespace plumb::toolkit {

struct SelftestCase {
  std::string fault;     // "fault.rsf_twice", or "reference" for the reference-vs-itself control
  std::string fixture;   // folder
  std::string b;         // the patches run as B
  std::string status;    // "ok", "FAIL", "skipped"
  std::string first, diagnosis, why;  // why: the failed expectation or the reason for a skip
};

struct SelftestResult {
  std::vector<SelftestCase> cases;
  int passed = 0, failed = 0, skipped = 0;
};

// `fixtures` empty: tests/data/golden/tiny (relative to the working directory; an Error if absent) for the
// routing-placement, hc and SwiGLU faults, and tests/data/golden/negative-router and router-underflow (those
// present) for the two router-score faults (skipped, with a line saying so, when neither is). Otherwise every fault on every given
// fixture, skipping those the fixture cannot exhibit (with the reason). `report` is called after each case.
// `backend` "cuda": reference and faults both run on the GPU.
SelftestResult run_selftest(const std::vector<std::string>& fixtures,
                            const std::function<void(const SelftestCase&)>& report = {}, const std::string& backend = "cpu");

std::string format_case(const SelftestCase& c);

}  // namespace plumb::toolkit
