#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/file.h"
#include "core/status.h"
#include "unit/test_util.h"

namespace tf {
namespace {

// Every reader of a whole file goes through read_file: bytes as they are (a NUL, no newline
// added), and a named error for a file that is missing or that is a directory (which opens on
// Linux and reads as empty: before the check it came back as "" and ok).
TEST(ReadFile, BytesOrANamedError) {
  testing::TempDir dir;
  const std::string bytes("{\"a\":\0 1}", 9);
  testing::write_file(dir.path("f.json"), bytes);
  Result<std::string> ok = read_file(dir.path("f.json"));
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, bytes);
  Result<std::string> missing = read_file(dir.path("none.json"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);
  Result<std::string> folder = read_file(dir.path());
  ASSERT_FALSE(folder.is_ok());
  EXPECT_EQ(folder.status().code(), StatusCode::kIo);
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> ok = 5;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 5);
  Result<int> bad = Status::invalid("x {}", 3);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "x 3");
  EXPECT_EQ(bad.status().to_string(), "invalid argument: x 3");
}

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 0x1p-100f, 65536.0f}) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f) << f;  // exactly representable values
  }
  // 1 + 2^-8 is halfway between two bf16 values: round to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
}

// Records live ranges; a release of a range it does not hold, or a leak, fails the test.
struct CountingObserver : BufferObserver {
  std::map<const void*, size_t> live;
  size_t creates = 0, bad_releases = 0;
  void on_create(const void* p, size_t bytes, BufferKind kind) noexcept override {
    if (kind != BufferKind::kHost) ++bad_releases;  // TrackedAllocator makes host memory only
    live[p] = bytes;
    ++creates;
  }
  void on_release(const void* p, size_t bytes) noexcept override {
    auto it = live.find(p);
    if (it == live.end() || it->second != bytes) {
      ++bad_releases;
      return;
    }
    live.erase(it);
  }
};

TEST(TrackedAllocator, FollowsGrowthCopiesAndMoves) {
  CountingObserver obs;
  {
    FloatBuf a{TrackedAllocator<float>(&obs)};
    for (int i = 0; i < 1000; ++i) a.push_back(static_cast<float>(i));  // reallocations
    EXPECT_EQ(obs.live.size(), 1u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
    FloatBuf b = a;  // a snapshot is followed too
    EXPECT_EQ(obs.live.size(), 2u);
    EXPECT_EQ(b.get_allocator().observer(), &obs);
    FloatBuf c;
    c = std::move(b);  // the observer moves with the buffer
    EXPECT_EQ(c.get_allocator().observer(), &obs);
    EXPECT_EQ(obs.live.size(), 2u);
  }
  EXPECT_TRUE(obs.live.empty());
  EXPECT_GT(obs.creates, 2u);
  EXPECT_EQ(obs.bad_releases, 0u);
}

}  // namespace
}  // namespace tf
