#include "comm/mpi_comm.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include <mpi.h>

namespace tf {
namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  // Gather every rank's addend ([size, n]), then add in rank order: the same bits on every rank.
  Status all_reduce_sum(float* x, int64_t n) override {
    if (size_ == 1 || n == 0) return Status::ok();
    gathered_.resize(static_cast<size_t>(size_) * n);
    if (Status s = all_gather(x, n, gathered_.data()); !s.is_ok()) return s;
    for (int64_t i = 0; i < n; ++i) {
      float acc = gathered_[i];
      for (int r = 1; r < size_; ++r) acc += gathered_[r * n + i];
      x[i] = acc;
    }
    return Status::ok();
  }

  Status all_gather(const float* send, int64_t n, float* recv) override {
    TF_CHECK(n <= INT32_MAX, "all_gather of {} floats: over MPI's int count", n);
    return check("MPI_Allgather", MPI_Allgather(send, static_cast<int>(n), MPI_FLOAT, recv,
                                                static_cast<int>(n), MPI_FLOAT, comm_));
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    TF_CHECK(bytes <= INT32_MAX, "broadcast of {} bytes: over MPI's int count", bytes);
    return check("MPI_Bcast", MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_));
  }

  Status barrier() override { return check("MPI_Barrier", MPI_Barrier(comm_)); }

 private:
  Status check(const char* what, int code) const {
    if (code == MPI_SUCCESS) return Status::ok();
    return Status(StatusCode::kUnavailable,
                  fmt::format("{} failed on rank {} of {}: {} (did another rank die?)", what, rank_,
                              size_, mpi_error(code)));
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<float> gathered_;  // [size, n] scratch of all_reduce_sum
};

bool g_initialised_here = false;

}  // namespace

int mpi_launch_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  }
  return 1;
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return Status(StatusCode::kUnavailable, "MPI_Init_thread failed");
    if (provided < MPI_THREAD_SERIALIZED) {
      return Status::unsupported("this MPI gives thread level {}, TensorFold needs SERIALIZED",
                                 provided);
    }
    g_initialised_here = true;
  }
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(comm));
}

void mpi_finalize() {
  if (!g_initialised_here) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  g_initialised_here = false;
}

}  // namespace tf
