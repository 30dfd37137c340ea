// The CUDA mapping of residency, written against a small table of runtime calls so that it needs
// no CUDA header (those live in src/backends/cuda and src/model/cuda_model.cpp, which binds the
// table: CudaModel::residency_api) and is tested on the CPU with a fake table:
//
//   host buffers    the program text, and the staging the device copies through, which the
//                   engine allocates pinned (cudaHostAlloc: the first of the design's two ways);
//                   held by a host backend (CpuBackend: mlock, mincore, touch), so the launch
//                   path and the staging stay in RAM like the CPU engine's buffers
//   device buffers  nothing to lock (device memory is not evicted); counted against the device
//                   budget by the owner
//   tick            the host backend's checks, then a 16-byte device-to-device copy inside the
//                   set's own 32-byte scratch buffer on the engine's stream, synchronised, so the
//                   command path reaches the device
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "residency/backend.h"

namespace tf::residency {

struct CudaApi {
  // Each returns 0 on success or the runtime's error code (cudaError_t).
  std::function<int(void** p, size_t bytes)> device_alloc;  // cudaMalloc
  std::function<int(void* p)> device_free;                  // cudaFree
  // Copies `bytes` device-to-device on the engine's stream and waits for it.
  std::function<int(void* dst, const void* src, size_t bytes)> copy_sync;
  std::function<std::string(int code)> error_string;  // cudaGetErrorString
};

class CudaBackend final : public Backend {
 public:
  // Allocates the set's scratch buffer (32 bytes of device memory). `host` holds the host
  // ranges (a CpuBackend in production).
  static Result<std::unique_ptr<CudaBackend>> create(CudaApi api, std::unique_ptr<Backend> host,
                                                     Faults* faults = nullptr);
  ~CudaBackend() override;  // frees the scratch buffer

  const char* name() const override { return "cuda"; }
  // The host backend's unit (a page); device ranges never share memory with host ones (the
  // runtime's unified addresses keep them apart).
  size_t granularity() const override { return host_->granularity(); }
  bool supports(Memory m) const override { return m == Memory::kDevice || host_->supports(m); }
  Status prepare(size_t host_bytes) override { return host_->prepare(host_bytes); }
  Status add(const Range& r) override;                                         // host: host_
  void remove(const Range& member, const Range& exclusive) noexcept override;  // host: host_
  // Device memory is not evicted: nothing is ever found out there.
  Result<CheckResult> check(const Range& r) override;
  Result<TouchResult> touch(const Range& r) override;
  Status keepalive() override;  // the host backend's, then the 16-byte scratch copy
  const void* scratch() const { return scratch_; }

 private:
  CudaBackend(CudaApi api, std::unique_ptr<Backend> host, Faults* faults)
      : api_(std::move(api)), host_(std::move(host)), faults_(faults) {}
  // Calls the runtime unless the fault hook fails the call first.
  int call(const char* name, const std::function<int()>& f);
  Status error(const char* call, int code) const;

  CudaApi api_;
  std::unique_ptr<Backend> host_;
  Faults* faults_;
  void* scratch_ = nullptr;
};

}  // namespace tf::residency
