// The one kernel of the NCCL communicator (nvcc-compiled; included by host C++ too).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tf {

// x[i] = sum_{r = 0..R-1} g[r * n + i], added in rank order (the MPI communicator's order), on
// `stream`. g: [R, n] device floats; x: [n] device floats.
void launch_sum_in_rank_order(const float* g, int64_t n, int R, float* x, cudaStream_t stream);

}  // namespace tf
