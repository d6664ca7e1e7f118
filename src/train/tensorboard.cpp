#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace kestrel::train {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> r{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
      r[i] = c;
    }
    return r;
  }();
  return t;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_tag(std::string& out, int field, int wire) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire)); }
template <class T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& s) {
  put_tag(out, field, 2);
  put_varint(out, s.size());
  out += s;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = crc_table();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_file_version_event(double wall_time, const std::string& version) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_bytes(e, 3, version);
  return e;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string val;
  put_bytes(val, 1, tag);
  put_tag(val, 2, 5);
  put_fixed(val, value);
  std::string summary;
  put_bytes(summary, 1, val);
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, uint64_t(step));
  put_bytes(e, 5, summary);
  return e;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  put_fixed(r, len);
  put_fixed(r, masked_crc32c(&len, sizeof(len)));
  r += data;
  put_fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

Result<EventWriter> EventWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return KS_ERR(dir, ": cannot create the TensorBoard folder: ", ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double t = now_seconds();
  EventWriter w;
  w.path_ = dir + "/events.out.tfevents." + std::to_string(int64_t(t)) + "." + host + "." + std::to_string(::getpid());
  w.f_ = std::fopen(w.path_.c_str(), "wb");
  if (!w.f_) return KS_ERR(w.path_, ": cannot create the event file");
  const std::string rec = tfrecord(encode_file_version_event(t));
  std::fwrite(rec.data(), 1, rec.size(), w.f_);
  std::fflush(w.f_);
  return w;
}

EventWriter::~EventWriter() {
  if (f_) std::fclose(f_);
}

void EventWriter::add_scalar(const std::string& tag, float value, int64_t step, double wall_time) {
  if (!f_) return;
  const std::string rec = tfrecord(encode_scalar_event(wall_time < 0 ? now_seconds() : wall_time, step, tag, value));
  std::fwrite(rec.data(), 1, rec.size(), f_);
}

void EventWriter::flush() {
  if (f_) std::fflush(f_);
}

}  // namespace kestrel::train
