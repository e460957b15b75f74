// Flags shared by `msinfer plan` and `msinfer simulate` (docs/PLANNER.md section 4:
// simulate takes "the same flags as plan"), and turning them into SearchOptions.
#pragma once

#include <memory>
#include <string>

#include "cli_common.h"
#include "msinfer/core/flags.h"
#include "msinfer/planner/plan.h"

namespace msinfer::cli {

void add_search_flags(FlagSet& flags);

// Owns what SearchOptions points to (the profile).
struct SearchSetup {
  planner::SearchOptions options;
  std::unique_ptr<planner::Profile> profile;
  planner::Catalog catalog;
};
StatusOr<SearchSetup> search_setup_from_flags(const FlagSet& flags);
// --workload / --input-len / --output-len / --seq-len into o->workload,
// o->seq_len and o->max_context.
Status apply_workload_flags(const FlagSet& flags, planner::SearchOptions* o);

}  // namespace msinfer::cli
