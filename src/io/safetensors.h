// Read-only, memory-mapped safetensors files.
//
// File layout: u64 little-endian N, then N bytes of JSON header
//   {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ..., "__metadata__":
//   {}}
// then the data region; offsets are relative to the start of the data region. Tensors are views
// into the mapping (zero copy); the mapping lives as long as the SafetensorsFile, or until unmap().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tf {

struct TensorView {
  std::string name;
  std::string file;  // file name (no directory), for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // PyTorch order: [out, in] for linear weights
  const void* data = nullptr;  // points into the mapping
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_string() const;  // "[12288, 2048]"
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header: JSON, dtypes, shapes, offsets inside the file, sizes that
  // match shape x dtype. Tensors of dtypes we do not compute with (I64, F8, ...) are recorded as
  // unsupported and refused only when looked up.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Names of tensors whose dtype is not F32/BF16/F16, with that dtype.
  const std::map<std::string, std::string>& unsupported() const { return unsupported_; }
  // The mapped bytes (for the residency owner to hold); null after unmap().
  const void* mapping() const { return map_; }
  size_t mapping_size() const { return size_; }
  // Drops the mapping (once every tensor the caller needs was copied out): tensors() keep their
  // names, shapes and dtypes, and their data pointers must no longer be read.
  void unmap();

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> unsupported_;
};

}  // namespace tf
