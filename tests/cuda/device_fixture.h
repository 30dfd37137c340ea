// The fixture of the device tests on models/tiny-next: the checkpoint loaded twice, one Model on
// the CPU (cpu_) and one moved to CUDA device 0 (gpu_, Model::use_cuda); skips without a device.
// TF_REPO names the checkout to read (the device machine runs the binaries from another path).
#pragma once

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"

namespace tf::testing {

inline std::string repo() {
  const char* r = std::getenv("TF_REPO");
  return r ? r : TF_SOURCE_DIR;
}

class TinyNextOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    auto c = Model::load(repo() + "/models/tiny-next");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    cpu_ = std::move(*c);
    auto g = Model::load(repo() + "/models/tiny-next");
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    gpu_ = std::move(*g);
    const Status s = gpu_->use_cuda();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_TRUE(gpu_->on_device());
    ASSERT_TRUE(gpu_->has_mtp());  // the head moves to the device too
  }
  // Real text: the golden test's chat prompts (rendered and tokenized by transformers).
  static std::vector<std::vector<int32_t>> golden_prompts() {
    std::ifstream in(repo() + "/tests/golden/tiny_next/reference.json");
    const nlohmann::json ref = nlohmann::json::parse(in);
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : ref.at("prompts")) out.push_back(p.at("ids").get<std::vector<int32_t>>());
    return out;
  }

  std::unique_ptr<Model> cpu_, gpu_;
};

}  // namespace tf::testing
