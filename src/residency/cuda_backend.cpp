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

Status CudaBackend::error(const char* call, int code) const {
  const std::string what = api_.error_string ? api_.error_string(code) : std::to_string(code);
  return Status(StatusCode::kUnavailable, fmt::format("{}: {}", call, what));
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(CudaApi api, std::unique_ptr<Backend> host,
                                                         Faults* faults) {
  TF_CHECK(host != nullptr, "CudaBackend::create: no host backend");
  std::unique_ptr<CudaBackend> b(new CudaBackend(std::move(api), std::move(host), faults));
  void* p = nullptr;
  if (int e = b->call("cudaMalloc", [&] { return b->api_.device_alloc(&p, kScratchBytes); }))
    return b->error("cudaMalloc of the residency scratch buffer", e);
  b->scratch_ = p;
  return b;
}

CudaBackend::~CudaBackend() {
  if (scratch_ != nullptr) (void)call("cudaFree", [&] { return api_.device_free(scratch_); });
}

Status CudaBackend::add(const Range& r) {
  if (r.memory == Memory::kDevice) return Status::ok();  // counted by the owner; never evicted
  return host_->add(r);
}

void CudaBackend::remove(const Range& member, const Range& exclusive) noexcept {
  if (member.memory == Memory::kDevice) return;
  host_->remove(member, exclusive);
}

Result<CheckResult> CudaBackend::check(const Range& r) {
  if (r.memory == Memory::kDevice) return CheckResult{};
  return host_->check(r);
}

Result<TouchResult> CudaBackend::touch(const Range& r) {
  if (r.memory == Memory::kDevice) return TouchResult{};  // not readable from the host
  return host_->touch(r);
}

Status CudaBackend::keepalive() {
  TF_RETURN_IF_ERROR(host_->keepalive());
  char* s = static_cast<char*>(scratch_);
  if (int e =
          call("cudaMemcpyAsync", [&] { return api_.copy_sync(s + kTickBytes, s, kTickBytes); }))
    return error("the residency tick's scratch copy", e);
  return Status::ok();
}

}  // namespace tf::residency
