// The MPI communicator: one rank per process, on one host or several (Open MPI from Debian).
// Built when CMake finds MPI (TF_MPI); tensorfold then runs as `mpirun -np N tensorfold ... --tp
// N`.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace tf {

// Ranks in the MPI job this process was started in, read from the launcher's environment
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE); 1 when not started by mpirun. Does not initialise MPI.
int mpi_launch_size();

// Initialises MPI (thread level SERIALIZED: one thread at a time calls it, not always the main
// one) on first use and returns a communicator over a duplicate of MPI_COMM_WORLD whose errors
// return instead of aborting. Errors: no MPI in this build, MPI_Init failed.
Result<std::unique_ptr<Communicator>> make_mpi_communicator();

// MPI_Finalize if make_mpi_communicator initialised MPI (every communicator must be gone).
void mpi_finalize();

}  // namespace tf
