// The NCCL communicator: one rank per GPU, for the CUDA model (GPUs of one host). Every pointer
// given to its collectives is device memory on the rank's GPU; each call is synchronous (it waits
// for its stream), so the caller may read the result at once.
//
// NVLink SHARP (multicast) stays off: NCCL_NVLS_ENABLE=0 is set in the environment before the
// communicator is made (and we never call cuMulticastCreate), since the lent machines do not give
// multicast objects to unprivileged containers.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace tf {

// A communicator over the GPUs of `bootstrap`'s ranks (one per process): rank 0 makes the NCCL
// unique id and broadcasts it over bootstrap (MPI). `device`: the CUDA device of this rank.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, int device);

}  // namespace tf
