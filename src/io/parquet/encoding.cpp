// Parquet value and level encodings: PLAIN, the RLE / bit-packed hybrid
// (levels, dictionary indices, RLE booleans), DELTA_BINARY_PACKED,
// DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY and BYTE_STREAM_SPLIT. Every
// read is checked against the span it decodes.
#include <cstring>

#include "io/parquet/internal.h"

namespace kestrel::io::parquet {

size_t Values::size() const {
  switch (kind) {
    case ValueKind::Bool: case ValueKind::Int: case ValueKind::UInt: return ints.size();
    case ValueKind::Double: return dbls.size();
    case ValueKind::String: return strs.size();
    case ValueKind::Null: return 0;
  }
  return 0;
}

void Values::reserve(size_t n) {
  if (kind == ValueKind::Double) dbls.reserve(n);
  else if (kind == ValueKind::String) strs.reserve(n);
  else if (kind != ValueKind::Null) ints.reserve(n);
}

void Values::append_from(const Values& dict, uint32_t i) {
  if (kind == ValueKind::Double) dbls.push_back(dict.dbls[i]);
  else if (kind == ValueKind::String) strs.push_back(dict.strs[i]);
  else if (kind != ValueKind::Null) ints.push_back(dict.ints[i]);
}

int bit_width_of(uint32_t v) {
  int w = 0;
  while (v) { ++w; v >>= 1; }
  return w;
}

// RFC 3629 well-formedness (Unicode Table 3-7): no overlong forms, no surrogates, nothing above
// U+10FFFF. Parquet's STRING is UTF-8 and rows become JSON, whose serialiser rejects exactly these.
void check_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xbf;  // bounds of the second byte
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) { len = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    if (!len || i + len > n) fail("a string value is not valid UTF-8 (byte ", i, ")");
    if (p[i + 1] < lo || p[i + 1] > hi) fail("a string value is not valid UTF-8 (byte ", i + 1, ")");
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xc0) != 0x80) fail("a string value is not valid UTF-8 (byte ", i + k, ")");
    i += len;
  }
}

namespace {

uint64_t uleb(Span& s, const char* what) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (!s.n) fail(what, ": truncated varint");
    const uint8_t b = *s.p++;
    --s.n;
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  fail(what, ": varint longer than 10 bytes");
}

int64_t zigzag(Span& s, const char* what) {
  const uint64_t v = uleb(s, what);
  return int64_t(v >> 1) ^ -int64_t(v & 1);
}

void take(Span& s, size_t n, const char* what) {
  if (n > s.n) fail(what, ": needs ", n, " more bytes, ", s.n, " left in the page");
  s.p += n;
  s.n -= n;
}

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // x86-64 and every Parquet file are little-endian
  return v;
}

// Unpacks `count` LSB-first values of `bw` (<= 64) bits from p (at least
// ceil(count * bw / 8) bytes, checked by the caller).
template <class F>
void unpack_bits(const uint8_t* p, int bw, size_t count, F&& emit) {
  if (bw == 0) {
    for (size_t i = 0; i < count; ++i) emit(uint64_t(0));
    return;
  }
  const uint64_t mask = bw == 64 ? ~uint64_t(0) : (uint64_t(1) << bw) - 1;
  size_t bit = 0;
  for (size_t i = 0; i < count; ++i, bit += size_t(bw)) {
    uint64_t v = 0;
    int got = 0;
    size_t byte = bit >> 3;
    int off = int(bit & 7);
    while (got < bw) {
      v |= uint64_t(p[byte] >> off) << got;
      got += 8 - off;
      off = 0;
      ++byte;
    }
    emit(v & mask);
  }
}

void push_string(Values& out, const uint8_t* p, size_t n) {
  out.strs.emplace_back(reinterpret_cast<const char*>(p), n);
  check_utf8(out.strs.back());
}

// One integer or floating-point value of `phys` from its little-endian bytes.
void push_fixed(Values& out, PhysType phys, const uint8_t* p) {
  switch (phys) {
    case PhysType::Int32:
      out.ints.push_back(out.kind == ValueKind::UInt ? int64_t(load_le<uint32_t>(p)) : int64_t(load_le<int32_t>(p)));
      break;
    case PhysType::Int64: out.ints.push_back(load_le<int64_t>(p)); break;
    case PhysType::Float: out.dbls.push_back(double(load_le<float>(p))); break;
    case PhysType::Double: out.dbls.push_back(load_le<double>(p)); break;
    default: fail("internal: push_fixed on ", phys_type_name(int32_t(phys)));
  }
}

size_t fixed_width(PhysType phys) {
  switch (phys) {
    case PhysType::Int32: case PhysType::Float: return 4;
    case PhysType::Int64: case PhysType::Double: return 8;
    default: return 0;
  }
}

void decode_plain(Span s, PhysType phys, size_t count, Values& out) {
  const char* what = "PLAIN values";
  if (phys == PhysType::Boolean) {
    if ((count + 7) / 8 > s.n) fail(what, ": ", count, " booleans need ", (count + 7) / 8, " bytes, the page has ", s.n);
    unpack_bits(s.p, 1, count, [&](uint64_t v) { out.ints.push_back(int64_t(v)); });
    return;
  }
  if (phys == PhysType::ByteArray) {
    for (size_t i = 0; i < count; ++i) {
      if (s.n < 4) fail(what, ": value ", i, " of ", count, " is truncated");
      const uint32_t len = load_le<uint32_t>(s.p);
      take(s, 4, what);
      const uint8_t* p = s.p;
      take(s, len, what);
      push_string(out, p, len);
    }
    return;
  }
  const size_t w = fixed_width(phys);
  if (!w) fail("not supported yet: ", phys_type_name(int32_t(phys)), " values");
  if (count > s.n / w) fail(what, ": ", count, " values need ", count * w, " bytes, the page has ", s.n);
  for (size_t i = 0; i < count; ++i) push_fixed(out, phys, s.p + i * w);
}

// DELTA_BINARY_PACKED (parquet-format Encodings.md): a header (block size,
// miniblocks per block, value count, first value), then blocks of a min
// delta and one bit width per miniblock followed by the packed miniblocks.
// Returns the bytes consumed; appends `count` values.
size_t decode_delta_binary(Span s, size_t count, std::vector<int64_t>& out) {
  const char* what = "DELTA_BINARY_PACKED values";
  const uint8_t* start = s.p;
  const uint64_t block = uleb(s, what), minis = uleb(s, what), total = uleb(s, what);
  int64_t value = zigzag(s, what);
  if (block == 0 || block % 128 || minis == 0 || block % minis || (block / minis) % 32)
    fail(what, ": invalid block size ", block, " with ", minis, " miniblocks");
  if (total < count) fail(what, ": holds ", total, " values, the page needs ", count);
  const size_t per_mini = size_t(block / minis);
  if (count == 0) return size_t(s.p - start);
  out.push_back(value);
  size_t left = count - 1;
  while (left > 0) {
    const int64_t min_delta = zigzag(s, what);
    if (minis > s.n) fail(what, ": truncated block header");
    const uint8_t* widths = s.p;
    take(s, size_t(minis), what);
    for (uint64_t m = 0; m < minis && left > 0; ++m) {
      const int bw = widths[m];
      if (bw > 64) fail(what, ": miniblock bit width ", bw, " above 64");
      const size_t bytes = per_mini * size_t(bw) / 8;
      if (bytes > s.n) fail(what, ": miniblock of ", bytes, " bytes runs past the page");
      const size_t n = std::min(left, per_mini);
      unpack_bits(s.p, bw, n, [&](uint64_t d) {
        // Wrapping arithmetic, as the spec requires (int32 columns truncate later).
        value = int64_t(uint64_t(value) + uint64_t(min_delta) + d);
        out.push_back(value);
      });
      take(s, bytes, what);
      left -= n;
    }
  }
  return size_t(s.p - start);
}

void decode_byte_stream_split(Span s, PhysType phys, size_t count, Values& out) {
  const size_t w = fixed_width(phys);
  if (!w) fail("not supported yet: BYTE_STREAM_SPLIT for ", phys_type_name(int32_t(phys)));
  if (count > s.n / w) fail("BYTE_STREAM_SPLIT values: ", count, " values need ", count * w, " bytes, the page has ", s.n);
  // Byte j of value i is at j * count + i.
  uint8_t buf[8];
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = 0; j < w; ++j) buf[j] = s.p[j * count + i];
    push_fixed(out, phys, buf);
  }
}

}  // namespace

void decode_rle_hybrid(Span& s, int bit_width, size_t count, uint32_t max_value, std::vector<uint32_t>& out,
                       const char* what) {
  if (bit_width < 0 || bit_width > 32) fail(what, ": bit width ", bit_width, " above 32");
  const size_t value_bytes = size_t(bit_width + 7) / 8;
  size_t produced = 0;
  auto put = [&](uint64_t v) {
    if (v > max_value) fail(what, ": value ", v, " exceeds the maximum ", max_value);
    out.push_back(uint32_t(v));
  };
  while (produced < count) {
    const uint64_t header = uleb(s, what);
    if (header & 1) {  // bit-packed: (header >> 1) groups of 8 values
      const uint64_t groups = header >> 1;
      if (groups > s.n) fail(what, ": bit-packed run of ", groups, " groups runs past the end");
      const size_t bytes = size_t(groups) * size_t(bit_width);
      if (bytes > s.n) fail(what, ": bit-packed run of ", bytes, " bytes runs past the end (", s.n, " left)");
      const size_t n = std::min(count - produced, size_t(groups) * 8);  // the rest is padding
      unpack_bits(s.p, bit_width, n, put);
      take(s, bytes, what);
      produced += n;
    } else {  // run: (header >> 1) repeats of one value
      const uint64_t run = header >> 1;
      if (value_bytes > s.n) fail(what, ": truncated run value");
      uint64_t v = 0;
      for (size_t b = 0; b < value_bytes; ++b) v |= uint64_t(s.p[b]) << (8 * b);
      take(s, value_bytes, what);
      if (v > max_value) fail(what, ": value ", v, " exceeds the maximum ", max_value);
      const size_t n = size_t(std::min<uint64_t>(run, count - produced));
      out.insert(out.end(), n, uint32_t(v));
      produced += n;
    }
  }
}

void decode_values(Span s, int32_t encoding, PhysType phys, int32_t type_length, size_t count, Values& out) {
  switch (encoding) {
    case kPlain: return decode_plain(s, phys, count, out);
    case kRle: {
      if (phys != PhysType::Boolean) break;
      if (s.n < 4) fail("RLE booleans: missing the 4-byte length");
      const uint32_t len = load_le<uint32_t>(s.p);
      take(s, 4, "RLE booleans");
      if (len > s.n) fail("RLE booleans: length ", len, " runs past the page (", s.n, " bytes left)");
      Span body{s.p, len};
      std::vector<uint32_t> bits;
      decode_rle_hybrid(body, 1, count, 1, bits, "RLE booleans");
      for (uint32_t b : bits) out.ints.push_back(b);
      return;
    }
    case kDeltaBinaryPacked: {
      if (phys != PhysType::Int32 && phys != PhysType::Int64) break;
      const size_t first = out.ints.size();
      decode_delta_binary(s, count, out.ints);
      if (phys == PhysType::Int32)
        for (size_t i = first; i < out.ints.size(); ++i)
          out.ints[i] = out.kind == ValueKind::UInt ? int64_t(uint32_t(out.ints[i])) : int64_t(int32_t(out.ints[i]));
      return;
    }
    case kDeltaLengthByteArray: case kDeltaByteArray: {
      if (phys != PhysType::ByteArray) break;
      std::vector<int64_t> prefix, lens;
      if (encoding == kDeltaByteArray) take(s, decode_delta_binary(s, count, prefix), "DELTA_BYTE_ARRAY");
      take(s, decode_delta_binary(s, count, lens), encoding_name(encoding));
      std::string prev;
      for (size_t i = 0; i < count; ++i) {
        const int64_t len = lens[i];
        if (len < 0 || uint64_t(len) > s.n) fail(encoding_name(encoding), ": value ", i, " runs past the page");
        std::string v;
        if (encoding == kDeltaByteArray) {
          if (prefix[i] < 0 || uint64_t(prefix[i]) > prev.size())
            fail("DELTA_BYTE_ARRAY: prefix ", prefix[i], " longer than the previous value (", prev.size(), ")");
          v.assign(prev, 0, size_t(prefix[i]));
        }
        v.append(reinterpret_cast<const char*>(s.p), size_t(len));
        take(s, size_t(len), encoding_name(encoding));
        out.strs.push_back(v);
        check_utf8(out.strs.back());
        prev = std::move(v);
      }
      return;
    }
    case kByteStreamSplit: return decode_byte_stream_split(s, phys, count, out);
    default: break;
  }
  (void)type_length;
  fail("not supported yet: ", encoding_name(encoding), " encoding (", encoding, ") for ",
       phys_type_name(int32_t(phys)), " values");
}

}  // namespace kestrel::io::parquet
