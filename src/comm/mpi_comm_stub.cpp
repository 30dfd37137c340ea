// mpi_comm.h where this build has no MPI (TF_MPI off or MPI not found): --tp N > 1 is refused.
#include <algorithm>
#include <cstdlib>

#include "comm/mpi_comm.h"

namespace tf {

int mpi_launch_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  }
  return 1;
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  return Status::unsupported(
      "this tensorfold was built without MPI (install libopenmpi-dev and rebuild with TF_MPI=ON)");
}

void mpi_finalize() {}

}  // namespace tf
