// Writes a safetensors file, streaming each tensor's bytes from a callback (so multi-GB random
// checkpoints never sit in memory). Used by `tensorfold make-checkpoint` and by the tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace tf {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

// fill(spec, buf) writes spec.nbytes() bytes into buf.
Status write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                         const std::function<void(const TensorSpec&, void*)>& fill);

}  // namespace tf
