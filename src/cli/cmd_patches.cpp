// `plumb patches`: lists every registered speed patch, numerics mode and built-in fault.
#include "cli/commands.h"
#include "plumb/tools.h"

namespace plumb::cli {

void register_patches(CLI::App& app) {
  auto* cmd = app.add_subcommand("patches", "List speed patches, numerics modes and built-in faults with their tolerances");
  cmd->callback([] { tools::print_patches(); });
}

}  // namespace plumb::cli
