// `plumb patches`: lists every registered speed patch, numerics mode and built-in fault.
#include <fmt/format.h>

#include "cli/commands.h"
#include "patches/registry.h"

namespace plumb::cli {

void register_patches(CLI::App& app) {
  auto* cmd = app.add_subcommand("patches", "List speed patches, numerics modes and built-in faults with their tolerances");
  cmd->callback([] {
    fmt::print("{:<30} {:>9} {:>9}  {}\n", "name", "tol fp32", "tol bf16", "replaces / description / risk");
    for (const auto& p : patch_registry()) {
      if (p.fault) continue;
      fmt::print("{:<30} {:>9.0e} {:>9.0e}  replaces {}\n{:<50}  {}\n{:<50}  risk: {}\n", p.name, p.tol.fp32, p.tol.bf16, p.replaces, "",
                 p.description, "", p.risk);
    }
    fmt::print("\nbuilt-in faults (deliberate bugs for testing the toolkit; enabled only when named):\n");
    for (const auto& p : patch_registry())
      if (p.fault) fmt::print("{:<30}  {}: {}\n", p.name, p.replaces, p.description);
    fmt::print("\ntolerance: |err| <= tol x max(1, max|ref|) per tensor; with several patches the loosest applies.\n");
  });
}

}  // namespace plumb::cli
