// Collectives between the ranks of a tensor-parallel group: one rank per process (MPI, CPU) or per
// GPU (NCCL). The model calls them at its few reduction points (after each block's row-parallel
// output projection, after each MoE, the vocab-parallel embedding and lm_head); the runtime uses
// broadcast to send rank 0's schedule to the other ranks.
//
// Determinism: all_reduce_sum gathers every rank's addend and sums them in rank order 0..size-1 on
// every rank, so the result is the same bits on every rank and in every run, whatever the order in
// which the messages arrive (an MPI_Allreduce may pick its algorithm, and so its order of
// additions, by message size and timing). With size 1 it returns x unchanged.
//
// Errors: a failed collective (a peer died, the transport broke) is a Status; the model treats it
// as fatal (tp_fatal) because a step half done on some ranks cannot be resumed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace tf {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single", "mpi" or "nccl" (logs, errors).
  virtual const char* name() const = 0;

  // x: [n] floats, this rank's addend; afterwards every rank holds sum_{r = 0..size-1} x_r, added
  // in rank order ((x_0 + x_1) + x_2) + ... For NCCL, x is device memory.
  [[nodiscard]] virtual Status all_reduce_sum(float* x, int64_t n) = 0;
  // send: [n] floats from each rank; recv: [size, n], rank-major (rank r's block at r * n).
  [[nodiscard]] virtual Status all_gather(const float* send, int64_t n, float* recv) = 0;
  // Copies `bytes` bytes at data on rank `root` to data on every other rank.
  [[nodiscard]] virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  [[nodiscard]] virtual Status barrier() = 0;
};

// The group of one: every collective is a copy or nothing.
std::unique_ptr<Communicator> make_single_communicator();

// Prints "tensorfold: tensor parallel: <msg>" and ends the process with exit code 3, without
// unwinding: a rank that cannot finish a collective cannot finish the step either, and the other
// ranks are killed by mpirun when one exits non-zero.
[[noreturn]] void tp_fatal(const std::string& msg);

// tp_fatal unless s is ok.
inline void tp_check(const Status& s) {
  if (!s.is_ok()) [[unlikely]]
    tp_fatal(s.to_string());
}

}  // namespace tf
