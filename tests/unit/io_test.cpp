// Malformed checkpoints: each gets a Status naming the file, the tensor and expected vs actual;
// never a crash (this suite also runs under ASan/UBSan).
#include <gtest/gtest.h>

#include "core/file.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "unit/test_util.h"

namespace tf {
namespace {

using testing::write_file;

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_small_checkpoint(dir_.path());
    st_ = dir_.path("model.safetensors");
    bytes_ = read_file(st_).value();
    uint64_t n;
    std::memcpy(&n, bytes_.data(), 8);
    header_ = bytes_.substr(8, n);
  }
  // Replaces the header (keeping the data) and returns the load error.
  std::string load_error() {
    auto m = Model::load(dir_.path());
    EXPECT_FALSE(m.is_ok());
    return m.is_ok() ? "" : m.status().to_string();
  }
  void set_header(const std::string& h) {
    std::string out(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    write_file(st_, out + h + bytes_.substr(8 + header_.size()));
  }
  testing::TempDir dir_;
  std::string st_, bytes_, header_;
};

TEST_F(BadCheckpoint, GoodOneLoads) {
  EXPECT_TRUE(Model::load(dir_.path()).is_ok());
}

TEST_F(BadCheckpoint, Truncated) {
  write_file(st_, bytes_.substr(0, bytes_.size() / 2));
  const std::string e = load_error();
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("outside the data region"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, TinyFile) {
  write_file(st_, "abc");
  EXPECT_NE(load_error().find("too short"), std::string::npos);
}

TEST_F(BadCheckpoint, HeaderLengthPastEnd) {
  std::string b = bytes_;
  const uint64_t n = 1ull << 40;
  std::memcpy(b.data(), &n, 8);
  write_file(st_, b);
  EXPECT_NE(load_error().find("header length"), std::string::npos);
}

TEST_F(BadCheckpoint, HeaderNotJson) {
  std::string b = bytes_;
  b[8] = '[';
  b[9] = '}';
  write_file(st_, b);
  EXPECT_NE(load_error().find("not valid JSON"), std::string::npos);
}

TEST_F(BadCheckpoint, MissingTensor) {
  std::string h = header_;
  const std::string name = "model.layers.2.self_attn.k_norm.weight";
  const size_t at = h.find(name);
  ASSERT_NE(at, std::string::npos);
  h.replace(at, name.size(), "model.layers.2.self_attn.k_nrm.weight");
  set_header(h);
  const std::string e = load_error();
  EXPECT_NE(e.find("missing tensor model.layers.2.self_attn.k_norm.weight"), std::string::npos)
      << e;
  EXPECT_NE(e.find("[16]"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, WrongShape) {
  // model.norm.weight [32] as [2, 16]: same byte count, wrong shape.
  std::string h = header_;
  const size_t at = h.find("\"model.norm.weight\"");
  ASSERT_NE(at, std::string::npos);
  const size_t s = h.find("[32]", at);
  h.replace(s, 4, "[2,16]");
  set_header(h);
  const std::string e = load_error();
  EXPECT_NE(e.find("model.norm.weight: expected shape [32], got [2, 16]"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, UnsupportedDtype) {
  std::string h = header_;
  const size_t at = h.find("\"model.norm.weight\"");
  const size_t s = h.find("BF16", at);
  h.replace(s, 4, "I16\"");  // keeps the header length; dtype "I16"
  h.erase(s + 3, 1);
  h.insert(s + 4, " ");
  set_header(h);
  const std::string e = load_error();
  EXPECT_NE(e.find("model.norm.weight: dtype I16"), std::string::npos) << e;
}

TEST_F(BadCheckpoint, SizeDoesNotMatchShape) {
  std::string h = header_;
  const size_t at = h.find("\"model.norm.weight\"");
  const size_t s = h.find("[32]", at);
  h.replace(s, 4, "[31]");
  set_header(h);
  EXPECT_NE(load_error().find("model.norm.weight"), std::string::npos);
}

TEST_F(BadCheckpoint, BadConfig) {
  write_file(dir_.path("config.json"), "{\"model_type\": \"qwen3_next\", \"hidden_size\": ");
  EXPECT_NE(load_error().find("config.json: not valid JSON"), std::string::npos);
  std::string llama = testing::small_config_json();
  llama.replace(llama.find("qwen3_next"), 10, "llama");
  write_file(dir_.path("config.json"), llama);
  EXPECT_NE(load_error().find("is not supported"), std::string::npos);
  write_file(dir_.path("config.json"),
             "{\"model_type\": \"qwen3_next\", \"hidden_size\": \"big\"}");
  EXPECT_NE(load_error().find("hidden_size must be an integer"), std::string::npos);
}

TEST_F(BadCheckpoint, MissingFiles) {
  std::filesystem::remove(st_);
  EXPECT_NE(load_error().find("no .safetensors files"), std::string::npos);
  std::filesystem::remove(dir_.path("config.json"));
  EXPECT_NE(load_error().find("config.json: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace tf
