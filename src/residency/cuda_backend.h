// The CUDA mapping of residency, written against a small table of runtime calls so that it needs
// no CUDA header (those live in src/backends/cuda only) and is tested on the CPU with a fake table:
//
//   host buffers (staging, offloaded snapshots)  join: cudaHostRegister   leave: cudaHostUnregister
//   device buffers                               nothing to lock (device memory is not evicted);
//                                                counted against the device budget by the owner
//   tick                                         a 16-byte device-to-device copy inside the set's
//   own
//                                                32-byte scratch buffer on the engine's stream,
//                                                synchronised, so the command path reaches the
//                                                device
//
// The CUDA backend binds the table, e.g. host_register = [](void* p, size_t n) { return
// int(cudaHostRegister(p, n, cudaHostRegisterDefault)); }, copy_sync = cudaMemcpyAsync(dst, src, n,
// cudaMemcpyDeviceToDevice, stream) followed by cudaStreamSynchronize(stream). Host buffers must
// not share pages with each other (allocate them page-aligned): the driver registers whole pages.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "residency/backend.h"

namespace tf::residency {

struct CudaApi {
  // Each returns 0 on success or the runtime's error code (cudaError_t).
  std::function<int(void* p, size_t bytes)> host_register;
  std::function<int(void* p)> host_unregister;
  std::function<int(void** p, size_t bytes)> device_alloc;  // cudaMalloc
  std::function<int(void* p)> device_free;                  // cudaFree
  // Copies `bytes` device-to-device on the engine's stream and waits for it.
  std::function<int(void* dst, const void* src, size_t bytes)> copy_sync;
  std::function<std::string(int code)> error_string;  // cudaGetErrorString
};

class CudaBackend final : public Backend {
 public:
  // Allocates the set's scratch buffer (32 bytes of device memory).
  static Result<std::unique_ptr<CudaBackend>> create(CudaApi api, Faults* faults = nullptr);
  ~CudaBackend() override;  // frees the scratch buffer

  const char* name() const override { return "cuda"; }
  size_t granularity() const override { return 1; }
  bool supports(Memory) const override { return true; }
  Status prepare(size_t) override { return Status::ok(); }
  Status add(const Range& r) override;                                         // cudaHostRegister
  void remove(const Range& member, const Range& exclusive) noexcept override;  // cudaHostUnregister
  // Pinned and device memory are not evicted: nothing is ever found out.
  Result<CheckResult> check(const Range&) override { return CheckResult{}; }
  Status keepalive() override;  // the 16-byte scratch copy
  const void* scratch() const { return scratch_; }

 private:
  CudaBackend(CudaApi api, Faults* faults) : api_(std::move(api)), faults_(faults) {}
  // Calls the runtime unless the fault hook fails the call first.
  int call(const char* name, const std::function<int()>& f);
  Status error(const char* call, int code, const Range* r) const;

  CudaApi api_;
  Faults* faults_;
  void* scratch_ = nullptr;
};

}  // namespace tf::residency
