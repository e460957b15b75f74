// msinfer: one binary, one subcommand per file (tools/msinfer/*.cc).
#include <cstdio>
#include <cstring>
#include <string>

#include "cli_common.h"
#include "commands.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: msinfer <command> [flags]   (msinfer <command> --help for its flags)\n\n"
               "commands:\n"
               "  plan       search the deployment (tp, attention nodes, micro-batches, batch)\n"
               "             with the best throughput per cost under a TBT SLO\n"
               "  simulate   play a plan forward event by event; Gantt chart; sweeps\n"
               "  make-model write a test model (HF layout, seeded random weights)\n"
               "  generate   generate text with the engine, streaming\n"
               "  serve      OpenAI-compatible HTTP server (completions, chat, streaming)\n"
               "  bench      benchmarks: kernels (against this machine's rooflines)\n"
               "  profile    measure T_a and T_e of a model here, fit k1..k4 for plan --profile\n"
               "  balance    place experts (replicas of the hot ones) on expert workers from\n"
               "             routing statistics\n"
               "  worker     one attention or expert worker (started by generate's router)\n"
               "  version    print the version\n\n"
               "docs: README.md, docs/ARCHITECTURE.md, docs/PLANNER.md\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything opens a file: a closed stdout or stderr must not become
  // the number of an eventfd, a socket or a lock file.
  msinfer::cli::open_closed_standard_fds();
  // OpenMP threads that sleep soon when idle (cli_common.h).
  msinfer::cli::exec_again_with_bounded_openmp_spin(argc, argv);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  // Errors are JSON on stdout too as soon as --json is on the command line, even
  // when the flags that follow it are bad (cli_common.h).
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 || std::strcmp(argv[i], "--json=true") == 0) {
      msinfer::cli::set_json_errors(true);
    }
  }
  // SIGINT / SIGTERM remove this process's shared-memory objects before it dies.
  msinfer::cli::install_shm_cleanup_on_signals();
  std::string cmd = argv[1];
  if (cmd == "plan") return msinfer::cli::run_plan(argc, argv);
  if (cmd == "simulate") return msinfer::cli::run_simulate(argc, argv);
  if (cmd == "make-model") return msinfer::cli::run_make_model(argc, argv);
  if (cmd == "generate") return msinfer::cli::run_generate(argc, argv);
  if (cmd == "bench") return msinfer::cli::run_bench(argc, argv);
  if (cmd == "profile") return msinfer::cli::run_profile(argc, argv);
  if (cmd == "worker") return msinfer::cli::run_worker(argc, argv);
  if (cmd == "serve") return msinfer::cli::run_serve(argc, argv);
  if (cmd == "balance") return msinfer::cli::run_balance(argc, argv);
  if (cmd == "version" || cmd == "--version") {
    std::printf("msinfer %s\n", MSINFER_VERSION);
    return 0;
  }
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  return msinfer::cli::report_error(
      "", msinfer::invalid_argument("unknown command '" + msinfer::cli::printable(cmd) +
                                    "' (msinfer --help lists them)"));
}
