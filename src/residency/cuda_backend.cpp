#include "residency/cuda_backend.h"

namespace tf::residency {

// The scratch buffer: the tick copies its first 16 bytes onto its second 16.
constexpr size_t kScratchBytes = 32, kTickBytes = 16;

int CudaBackend::call(const char* name, const std::function<int()>& f) {
  if (faults_ != nullptr) {
    if (const int e = faults_->before_call(name); e != 0) return e;
  }
  return f();
}

Status CudaBackend::error(const char* call, int code, const Range* r) const {
  const std::string what = api_.error_string ? api_.error_string(code) : std::to_string(code);
  if (r == nullptr) return Status(StatusCode::kUnavailable, fmt::format("{}: {}", call, what));
  return Status(
      StatusCode::kResourceExhausted,
      fmt::format("{} of {} ({:.1f} MiB) failed: {}", call, r->what, r->bytes / 1048576.0, what));
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(CudaApi api, Faults* faults) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(api), faults));
  void* p = nullptr;
  if (int e = b->call("cudaMalloc", [&] { return b->api_.device_alloc(&p, kScratchBytes); }))
    return b->error("cudaMalloc of the residency scratch buffer", e, nullptr);
  b->scratch_ = p;
  return b;
}

CudaBackend::~CudaBackend() {
  if (scratch_ != nullptr) (void)call("cudaFree", [&] { return api_.device_free(scratch_); });
}

Status CudaBackend::add(const Range& r) {
  if (r.memory == Memory::kDevice) return Status::ok();  // counted by the owner; never evicted
  void* p = const_cast<void*>(r.data);
  if (int e = call("cudaHostRegister", [&] { return api_.host_register(p, r.bytes); }))
    return error("cudaHostRegister", e, &r);
  return Status::ok();
}

void CudaBackend::remove(const Range& member, const Range&) noexcept {
  if (member.memory == Memory::kDevice) return;
  void* p = const_cast<void*>(member.data);
  (void)call("cudaHostUnregister", [&] { return api_.host_unregister(p); });
}

Status CudaBackend::keepalive() {
  char* s = static_cast<char*>(scratch_);
  if (int e =
          call("cudaMemcpyAsync", [&] { return api_.copy_sync(s + kTickBytes, s, kTickBytes); }))
    return error("the residency tick's scratch copy", e, nullptr);
  return Status::ok();
}

}  // namespace tf::residency
