// A Hugging Face checkpoint directory: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json. All files stay memory-mapped for the life of the Checkpoint, or
// until unmap().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"

namespace tf {

class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  bool has(const std::string& name) const;
  // The tensor `name` with exactly `shape`; a missing, mis-shaped or unsupported-dtype tensor is an
  // error naming the file, the tensor and expected vs actual.
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& shape) const;
  // Every tensor name in the checkpoint.
  std::vector<std::string> names() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Unmaps every file (SafetensorsFile::unmap): get() must not be read from afterwards.
  void unmap() {
    for (auto& f : files_) f->unmap();
  }

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace tf
