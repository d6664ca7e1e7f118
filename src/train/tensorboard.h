// TensorBoard event files written directly: TFRecord framing around
// hand-encoded tensorflow.Event protobufs, so no TensorFlow or protobuf
// library is needed.
//
// Record: u64 length (LE) | u32 masked CRC32C(length bytes) | data | u32 masked CRC32C(data)
// masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8
// Event: 1 wall_time (double), 2 step (int64), 3 file_version (string),
//        5 summary { 1 value { 1 tag (string), 2 simple_value (float) } }
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::train {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);

// Serialized Event protos (exposed for tests).
std::string encode_file_version_event(double wall_time, const std::string& version = "brain.Event:2");
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
// One TFRecord around `data`.
std::string tfrecord(const std::string& data);

class EventWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix time>.<hostname>.<pid> and writes the version event.
  static Result<EventWriter> open(const std::string& dir);
  EventWriter(EventWriter&& o) noexcept : f_(o.f_), path_(std::move(o.path_)) { o.f_ = nullptr; }
  EventWriter& operator=(EventWriter&&) = delete;
  ~EventWriter();

  void add_scalar(const std::string& tag, float value, int64_t step, double wall_time = -1);
  void flush();
  const std::string& path() const { return path_; }

 private:
  EventWriter() = default;
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace kestrel::train
