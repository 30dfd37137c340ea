#include "io/safetensors_writer.h"

#include <cstring>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

namespace tf {

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

Status write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                         const std::function<void(const TensorSpec&, void*)>& fill) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  size_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data region 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  if (!out) return Status::io("{}: cannot create", path);
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::unique_ptr<char[]> buf;
  size_t cap = 0;
  for (const auto& t : tensors) {
    if (t.nbytes() > cap) {
      cap = t.nbytes();
      buf.reset(new char[cap]);
    }
    fill(t, buf.get());
    out.write(buf.get(), static_cast<std::streamsize>(t.nbytes()));
  }
  if (!out) return Status::io("{}: write failed", path);
  return Status::ok();
}

}  // namespace tf
