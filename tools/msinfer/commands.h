// Subcommands of the msinfer CLI, one file each. Each returns the process exit
// code: 0 on success, 1 on a runtime failure, 2 on bad input (flags, files).
#pragma once

namespace msinfer::cli {

int run_plan(int argc, char** argv);
int run_simulate(int argc, char** argv);
int run_make_model(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_profile(int argc, char** argv);

}  // namespace msinfer::cli
