// `plumb patches`: lists every registered speed patch, numerics mode and built-in fault.
#include <fmt/format.h>

#include "cli/commands.h"
#include "patches/registry.h"

namespace plumb::cli {

void register_patches(CLI::App& app) {
  auto* cmd = app.add_subcommand("patches", "List speed patches, numerics modes and built-in faults with their tolerances");
  cmd->callback([] {
    fmt::print("{:<24} {:>8} {:>8} {:>8}  {}\n", "name", "fp32", "local", "bf16", "replaces / description / risk");
    for (const auto& p : patch_registry()) {
      if (p.fault) continue;
      fmt::print("{:<24} {:>8.0e} {:>8.0e} {:>8.0e}  replaces {}{}\n{:<52}{}\n{:<52}risk: {}\n", p.name, p.tol.fp32, p.tol.local,
                 p.tol.bf16, p.replaces,
                 p.numerics_mode       ? " (a numerics mode: verified against its own goldens)"
                 : !p.backend.empty() ? fmt::format(" (backend {} only)", p.backend)
                                      : "",
                 "",
                 p.description, "", p.risk);
    }
    fmt::print("\nbuilt-in faults (deliberate bugs for testing the toolkit; enabled only when named):\n");
    for (const auto& p : patch_registry())
      if (p.fault) fmt::print("{:<30}  {}: {}\n", p.name, p.replaces, p.description);
    fmt::print("\ntolerances: |err| <= tol x max(1, max|ref|) per tensor; fp32: free-running on the CPU reference, local: with\n"
               "--teacher-forcing (each op fed the golden's inputs), bf16: on a bf16 backend. With several patches the loosest applies.\n");
  });
}

}  // namespace plumb::cli
