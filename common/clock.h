// Time sources. Leases and timeouts use the monotonic clock; timestamps shown to users and
// stored in the database use wall time. Tests inject FakeClock.
#pragma once

#include <atomic>
#include <cstdint>

namespace stemma {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch.
  virtual int64_t WallMs() const = 0;
  // Milliseconds on a clock that never jumps.
  virtual int64_t MonoMs() const = 0;
};

// The system clocks. Thread-safe.
class RealClock final : public Clock {
 public:
  int64_t WallMs() const override;
  int64_t MonoMs() const override;
  static RealClock* Get();
};

// A clock moved by hand. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t wall_ms = 1'700'000'000'000, int64_t mono_ms = 1'000)
      : wall_(wall_ms), mono_(mono_ms) {}
  int64_t WallMs() const override { return wall_.load(); }
  int64_t MonoMs() const override { return mono_.load(); }
  void Advance(int64_t ms) {
    wall_ += ms;
    mono_ += ms;
  }

 private:
  std::atomic<int64_t> wall_;
  std::atomic<int64_t> mono_;
};

}  // namespace stemma
