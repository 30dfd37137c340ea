#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/file.h"

namespace tf {

namespace fs = std::filesystem;

static std::string shape_str(const std::vector<int64_t>& s) {
  TensorView v;
  v.shape = s;
  return v.shape_string();
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::not_found("{}: not a directory", dir);
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  TF_ASSIGN_OR_RETURN(ckpt->config_, load_model_config((fs::path(dir) / "config.json").string()));

  // Which files: the index's weight_map values, else model.safetensors, else every *.safetensors.
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    TF_ASSIGN_OR_RETURN(std::string text, read_file(index.string()));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return Status::corrupt("{}: not valid JSON: {}", index.string(), e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return Status::corrupt("{}: expected an object with a \"weight_map\" object", index.string());
    }
    std::set<std::string> unique;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        return Status::corrupt("{}: weight_map[{}] is not a file name", index.string(), name);
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        return Status::corrupt("{}: weight_map[{}] = \"{}\" is not a file in the directory",
                               index.string(), name, f);
      }
      unique.insert(f);
    }
    files.assign(unique.begin(), unique.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) return Status::not_found("{}: no .safetensors files", dir);
  for (const auto& f : files) {
    TF_ASSIGN_OR_RETURN(auto st, SafetensorsFile::open((fs::path(dir) / f).string()));
    ckpt->files_.push_back(std::move(st));
  }
  return ckpt;
}

bool Checkpoint::has(const std::string& name) const {
  for (const auto& f : files_) {
    if (f->tensors().count(name) || f->unsupported().count(name)) return true;
  }
  return false;
}

Result<TensorView> Checkpoint::get(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  for (const auto& f : files_) {
    auto it = f->tensors().find(name);
    if (it == f->tensors().end()) {
      auto u = f->unsupported().find(name);
      if (u != f->unsupported().end()) {
        return Status::unsupported("{}: tensor {}: dtype {} (expected F32, BF16 or F16)",
                                   fs::path(f->path()).filename().string(), name, u->second);
      }
      continue;
    }
    const TensorView& t = it->second;
    if (t.shape != shape) {
      return Status::corrupt("{}: tensor {}: expected shape {}, got {}", t.file, name,
                             shape_str(shape), t.shape_string());
    }
    return t;
  }
  return Status::not_found("{}: missing tensor {} (expected shape {})", dir_, name,
                           shape_str(shape));
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& f : files_) {
    for (const auto& [n, t] : f->tensors()) out.push_back(n);
    for (const auto& [n, t] : f->unsupported()) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tf
