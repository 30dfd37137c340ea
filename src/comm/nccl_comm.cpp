#include "comm/nccl_comm.h"

#include <cstdlib>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/nccl_sum.h"

namespace tf {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int size)
      : comm_(comm), stream_(stream), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

  // Gather into [size, n] device scratch, then one kernel adds in rank order: unlike
  // ncclAllReduce (ring or tree order, chosen by size and topology), the same bits every run.
  Status all_reduce_sum(float* x, int64_t n) override {
    if (size_ == 1 || n == 0) return Status::ok();
    const size_t need = static_cast<size_t>(size_) * n * sizeof(float);
    if (need > scratch_bytes_) {
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      if (cudaError_t e = cudaMalloc(&scratch_, need); e != cudaSuccess)
        return cuda_error("cudaMalloc", e);
      scratch_bytes_ = need;
    }
    if (Status s = all_gather(x, n, scratch_); !s.is_ok()) return s;
    launch_sum_in_rank_order(scratch_, n, size_, x, stream_);
    return sync("sum_in_rank_order");
  }

  Status all_gather(const float* send, int64_t n, float* recv) override {
    if (ncclResult_t r = ncclAllGather(send, recv, n, ncclFloat32, comm_, stream_);
        r != ncclSuccess)
      return nccl_error("ncclAllGather", r);
    return sync("ncclAllGather");
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    if (ncclResult_t r = ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_);
        r != ncclSuccess)
      return nccl_error("ncclBroadcast", r);
    return sync("ncclBroadcast");
  }

  // A 1-float all-reduce on the stream, then a wait: no rank leaves before all have entered.
  Status barrier() override {
    if (scratch_ == nullptr) {
      if (cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess)
        return cuda_error("cudaMalloc", e);
      scratch_bytes_ = sizeof(float);
    }
    if (ncclResult_t r = ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
        r != ncclSuccess)
      return nccl_error("ncclAllReduce", r);
    return sync("barrier");
  }

 private:
  Status sync(const char* what) {
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
      return cuda_error(what, e);
    return Status::ok();
  }
  Status nccl_error(const char* what, ncclResult_t r) const {
    return Status(StatusCode::kUnavailable, fmt::format("{} failed on rank {} of {}: {}", what,
                                                        rank_, size_, ncclGetErrorString(r)));
  }
  Status cuda_error(const char* what, cudaError_t e) const {
    return Status(StatusCode::kUnavailable, fmt::format("{} failed on rank {} of {}: {}", what,
                                                        rank_, size_, cudaGetErrorString(e)));
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, size_;
  float* scratch_ = nullptr;  // [size, n] device floats, grown on demand
  size_t scratch_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, int device) {
  // Before NCCL reads its environment (at the first communicator): no NVLink multicast.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return Status(StatusCode::kUnavailable,
                  fmt::format("cudaSetDevice({}): {}", device, cudaGetErrorString(e)));
  ncclUniqueId id;
  if (bootstrap.rank() == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return Status(StatusCode::kUnavailable,
                    fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
  }
  TF_RETURN_IF_ERROR(bootstrap.broadcast(&id, sizeof(id), 0));
  ncclComm_t comm;
  if (ncclResult_t r = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank());
      r != ncclSuccess)
    return Status(StatusCode::kUnavailable,
                  fmt::format("ncclCommInitRank (rank {} of {}): {}", bootstrap.rank(),
                              bootstrap.size(), ncclGetErrorString(r)));
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    ncclCommDestroy(comm);
    return Status(StatusCode::kUnavailable,
                  fmt::format("cudaStreamCreate: {}", cudaGetErrorString(e)));
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(comm, stream, bootstrap.rank(), bootstrap.size()));
}

}  // namespace tf
