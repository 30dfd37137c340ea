#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace tf {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "BF16")
    *out = DType::kBF16;
  else if (s == "F16")
    *out = DType::kF16;
  else
    return false;
  return true;
}

SafetensorsFile::~SafetensorsFile() {
  unmap();
}

void SafetensorsFile::unmap() {
  if (map_ != nullptr) munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const std::string fname = std::filesystem::path(path).filename().string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::io("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::io("{}: cannot stat: {}", path, std::strerror(errno));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Status::corrupt("{}: file is {} bytes, too short for a safetensors header", fname, size);
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Status::io("{}: mmap failed: {}", path, std::strerror(errno));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->size_ = size;

  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian host (x86-64, aarch64)
  if (header_len > size - 8) {
    return Status::corrupt("{}: header length {} exceeds the file size {} (truncated file?)", fname,
                           header_len, size);
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8),
                                   reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const nlohmann::json::exception& e) {
    return Status::corrupt("{}: header is not valid JSON: {}", fname, e.what());
  }
  if (!header.is_object()) return Status::corrupt("{}: header is not a JSON object", fname);

  const size_t data_begin = 8 + header_len;
  const size_t data_size = size - data_begin;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return Status::corrupt("{}: tensor {}: header entry needs dtype, shape and data_offsets[2]",
                             fname, name);
    }
    TensorView t;
    t.name = name;
    t.file = fname;
    int64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t{1} << 40)) {
        return Status::corrupt("{}: tensor {}: bad dimension {}", fname, name, d.dump());
      }
      t.shape.push_back(d.get<int64_t>());
      numel *= t.shape.back();
      if (numel > (int64_t{1} << 42))
        return Status::corrupt("{}: tensor {}: too large", fname, name);
    }
    const auto& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Status::corrupt("{}: tensor {}: data_offsets must be non-negative integers", fname,
                             name);
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Status::corrupt(
          "{}: tensor {}: data_offsets [{}, {}] outside the data region of {} bytes (truncated "
          "file?)",
          fname, name, begin, end, data_size);
    }
    const std::string dtype = info["dtype"].get<std::string>();
    if (!parse_dtype(dtype, &t.dtype)) {
      f->unsupported_[name] = dtype;
      continue;
    }
    t.nbytes = end - begin;
    if (t.nbytes != static_cast<uint64_t>(numel) * dtype_size(t.dtype)) {
      return Status::corrupt("{}: tensor {}: {} bytes for shape {} of {} (expected {})", fname,
                             name, t.nbytes, t.shape_string(), dtype, numel * dtype_size(t.dtype));
    }
    t.data = bytes + data_begin + begin;
    f->tensors_.emplace(name, std::move(t));
  }
  return f;
}

}  // namespace tf
