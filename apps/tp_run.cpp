// --tp N of generate, bench and serve: under `mpirun -np N`, rank 0 runs the command and the other
// ranks follow it (model/tp.h).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <thread>

#include "apps/commands.h"
#include "comm/mpi_comm.h"
#include "model/tp.h"

namespace tf::app {

void add_tp_option(CLI::App* cmd, int* tp) {
  cmd->add_option("--tp", *tp,
                  "Tensor-parallel ranks; run as `mpirun -np N tensorfold ... --tp N` (each rank "
                  "holds 1/N of the heads, experts and vocabulary)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
}

int run_with_tp(int tp, const std::string& model, int* threads, const LoadOptions& follow,
                const std::function<int()>& lead) {
  const int launched = mpi_launch_size();
  if (tp == 1 && launched == 1) return lead();
  if (tp != launched && launched > 1) {
    std::fprintf(
        stderr,
        "error: this is one of %d processes started by mpirun, but --tp is %d: pass --tp %d\n",
        launched, tp, launched);
    return 2;
  }
  if (tp != launched) {
    std::fprintf(stderr,
                 "error: --tp %d needs exactly %d processes, one per rank: run `mpirun -np %d "
                 "tensorfold ... --tp %d`\n",
                 tp, tp, tp, tp);
    return 2;
  }
  // MPI and the watchdog start threads of their own: they must not take SIGINT/SIGTERM, which
  // belong to the command (the server's sigwait thread stops it cleanly). Blocked while they are
  // made, so they inherit the mask; this thread's mask is restored after.
  sigset_t signals, old;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, &old);
  auto comm = make_mpi_communicator();
  if (!comm) {
    std::fprintf(stderr, "error: --tp %d: %s\n", tp, comm.status().to_string().c_str());
    return 2;
  }
  const int rank = (*comm)->rank();
  tp_install(std::move(*comm));
  tp_start_watchdog();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  // Ranks share the cores of a host: by default each takes its share.
  if (*threads == 0)
    *threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / tp);
  const int code = rank == 0 ? lead() : tp_follow(model, *threads, follow);
  if (rank == 0) tp_stop_followers();
  tp_uninstall();
  return code;
}

}  // namespace tf::app
