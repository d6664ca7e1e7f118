// The Thrift compact protocol and the Parquet footer / page-header structs
// (parquet.thrift of parquet-format). Only the fields the reader uses are
// kept; every other field is skipped by its wire type, so newer writers'
// additions (statistics, size statistics, page indexes, ...) are ignored.
#include <cstring>

#include "io/parquet/internal.h"

namespace kestrel::io::parquet {

// ---- ThriftReader ----------------------------------------------------------

uint8_t ThriftReader::byte() {
  if (p_ >= end_) bad("truncated Thrift data");
  return *p_++;
}

uint64_t ThriftReader::varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const uint8_t b = byte();
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  bad("Thrift varint longer than 10 bytes");
}

void ThriftReader::expect(uint8_t type, uint8_t want) const {
  if (type != want) bad("Thrift field has wire type " + std::to_string(type) + ", expected " + std::to_string(want));
}

bool ThriftReader::boolean(uint8_t type) {
  if (type != kBoolTrue && type != kBoolFalse) expect(type, kBoolTrue);
  return type == kBoolTrue;
}

int32_t ThriftReader::i32(uint8_t type) {
  if (type != kI32 && type != kI16 && type != kByte) expect(type, kI32);
  if (type == kByte) return int8_t(byte());
  const int64_t v = zigzag();
  if (v < INT32_MIN || v > INT32_MAX) bad("Thrift i32 out of range");
  return int32_t(v);
}

int64_t ThriftReader::i64(uint8_t type) {
  if (type != kI64 && type != kI32) expect(type, kI64);
  return zigzag();
}

std::string ThriftReader::binary(uint8_t type) {
  expect(type, kBinary);
  const uint64_t n = varint();
  if (n > uint64_t(end_ - p_)) bad("Thrift string of " + std::to_string(n) + " bytes runs past the end");
  std::string s(reinterpret_cast<const char*>(p_), size_t(n));
  p_ += n;
  return s;
}

size_t ThriftReader::list(uint8_t type, uint8_t* elem_type) {
  if (type != kList && type != kSet) expect(type, kList);
  const uint8_t h = byte();
  uint64_t n = h >> 4;
  if (n == 15) n = varint();
  *elem_type = h & 0x0f;
  // Every element takes at least one byte (bools in lists too), so a count
  // above the bytes left is corrupt; this also bounds any reserve().
  if (n > uint64_t(end_ - p_)) bad("Thrift list of " + std::to_string(n) + " elements runs past the end");
  return size_t(n);
}

void ThriftReader::skip(uint8_t type) {
  switch (type) {
    case kBoolTrue: case kBoolFalse: return;  // the value is in the type nibble
    case kByte: byte(); return;
    case kI16: case kI32: case kI64: varint(); return;
    case kDouble:
      if (end_ - p_ < 8) bad("truncated Thrift double");
      p_ += 8;
      return;
    case kBinary: {
      const uint64_t n = varint();
      if (n > uint64_t(end_ - p_)) bad("Thrift binary runs past the end");
      p_ += n;
      return;
    }
    case kList: case kSet: {
      uint8_t et;
      const size_t n = list(type, &et);
      enter();
      for (size_t i = 0; i < n; ++i) {
        if (et == kBoolTrue || et == kBoolFalse) byte();  // list bools take one byte each
        else skip(et);
      }
      --depth_;
      return;
    }
    case kMap: {
      const uint64_t n = varint();
      if (n == 0) return;
      if (n > uint64_t(end_ - p_)) bad("Thrift map runs past the end");
      const uint8_t kv = byte();
      enter();
      for (uint64_t i = 0; i < n; ++i) {
        for (uint8_t t : {uint8_t(kv >> 4), uint8_t(kv & 0x0f)}) {
          if (t == kBoolTrue || t == kBoolFalse) byte();
          else skip(t);
        }
      }
      --depth_;
      return;
    }
    case kStruct: fields([&](int16_t, uint8_t t) { skip(t); }); return;
    default: bad("unknown Thrift wire type " + std::to_string(type));
  }
}

// ---- names -----------------------------------------------------------------

const char* phys_type_name(int32_t t) {
  static const char* n[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
                            "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? n[t] : "?";
}

const char* encoding_name(int32_t e) {
  static const char* n[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED", "DELTA_BINARY_PACKED",
                            "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return e >= 0 && e < 10 ? n[e] : "?";
}

const char* codec_name(int32_t c) {
  static const char* n[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? n[c] : "?";
}

// ---- footer ----------------------------------------------------------------

namespace {

// LogicalType is a union: exactly one member struct is set.
void decode_logical(ThriftReader& t, uint8_t type, SchemaElement& e) {
  static const char* names[] = {"?", "STRING", "MAP", "LIST", "ENUM", "DECIMAL", "DATE", "TIME", "TIMESTAMP",
                                "?", "INTEGER", "UNKNOWN", "JSON", "BSON", "UUID", "FLOAT16", "VARIANT",
                                "GEOMETRY", "GEOGRAPHY"};
  t.nested(type, [&](int16_t id, uint8_t ft) {
    e.logical_name = id > 0 && id < 19 ? names[id] : "logical type " + std::to_string(id);
    switch (id) {
      case 1: e.logical = Logical::String; t.skip(ft); break;
      case 2: e.logical = Logical::Map; t.skip(ft); break;
      case 3: e.logical = Logical::List; t.skip(ft); break;
      case 4: e.logical = Logical::Enum; t.skip(ft); break;
      case 11: e.logical = Logical::Unknown; t.skip(ft); break;
      case 12: e.logical = Logical::Json; t.skip(ft); break;
      case 10:
        e.logical = Logical::Integer;
        t.nested(ft, [&](int16_t iid, uint8_t it) {
          if (iid == 1) e.int_bits = t.i32(it);
          else if (iid == 2) e.int_signed = t.boolean(it);
          else t.skip(it);
        });
        break;
      default: e.logical = Logical::Other; t.skip(ft); break;
    }
  });
}

SchemaElement decode_schema_element(ThriftReader& t, uint8_t type) {
  SchemaElement e;
  t.nested(type, [&](int16_t id, uint8_t ft) {
    switch (id) {
      case 1: e.type = t.i32(ft); break;
      case 2: e.type_length = t.i32(ft); break;
      case 3: e.repetition = t.i32(ft); break;
      case 4: e.name = t.binary(ft); break;
      case 5: e.num_children = t.i32(ft); break;
      case 6: e.converted_type = t.i32(ft); break;
      case 10: decode_logical(t, ft, e); break;
      default: t.skip(ft);
    }
  });
  return e;
}

template <class F>
void each(ThriftReader& t, uint8_t type, F&& f) {
  uint8_t et;
  const size_t n = t.list(type, &et);
  for (size_t i = 0; i < n; ++i) f(et);
}

ColumnMeta decode_column_meta(ThriftReader& t, uint8_t type) {
  ColumnMeta m;
  t.nested(type, [&](int16_t id, uint8_t ft) {
    switch (id) {
      case 1: m.type = t.i32(ft); break;
      case 2: each(t, ft, [&](uint8_t et) { m.encodings.push_back(t.i32(et)); }); break;
      case 3: each(t, ft, [&](uint8_t et) { m.path.push_back(t.binary(et)); }); break;
      case 4: m.codec = t.i32(ft); break;
      case 5: m.num_values = t.i64(ft); break;
      case 6: m.total_uncompressed_size = t.i64(ft); break;
      case 7: m.total_compressed_size = t.i64(ft); break;
      case 9: m.data_page_offset = t.i64(ft); break;
      case 11: m.dictionary_page_offset = t.i64(ft); break;
      default: t.skip(ft);
    }
  });
  return m;
}

RowGroup decode_row_group(ThriftReader& t, uint8_t type) {
  RowGroup g;
  t.nested(type, [&](int16_t id, uint8_t ft) {
    switch (id) {
      case 1:
        each(t, ft, [&](uint8_t et) {
          ColumnChunk c;
          t.nested(et, [&](int16_t cid, uint8_t ct) {
            switch (cid) {
              case 1: c.file_path = t.binary(ct); break;
              case 3: c.meta = decode_column_meta(t, ct); c.has_meta = true; break;
              case 8: case 9: c.encrypted = true; t.skip(ct); break;
              default: t.skip(ct);
            }
          });
          g.columns.push_back(std::move(c));
        });
        break;
      case 2: g.total_byte_size = t.i64(ft); break;
      case 3: g.num_rows = t.i64(ft); break;
      default: t.skip(ft);
    }
  });
  return g;
}

}  // namespace

FileMetaData decode_file_metadata(const uint8_t* p, size_t n) {
  ThriftReader t(p, n, "footer (FileMetaData)");
  FileMetaData md;
  t.fields([&](int16_t id, uint8_t ft) {
    switch (id) {
      case 1: md.version = t.i32(ft); break;
      case 2: each(t, ft, [&](uint8_t et) { md.schema.push_back(decode_schema_element(t, et)); }); break;
      case 3: md.num_rows = t.i64(ft); break;
      case 4: each(t, ft, [&](uint8_t et) { md.row_groups.push_back(decode_row_group(t, et)); }); break;
      case 5:
        each(t, ft, [&](uint8_t et) {
          std::pair<std::string, std::string> kv;
          t.nested(et, [&](int16_t kid, uint8_t kt) {
            if (kid == 1) kv.first = t.binary(kt);
            else if (kid == 2) kv.second = t.binary(kt);
            else t.skip(kt);
          });
          md.key_value.push_back(std::move(kv));
        });
        break;
      case 6: md.created_by = t.binary(ft); break;
      default: t.skip(ft);
    }
  });
  return md;
}

PageHeader decode_page_header(const uint8_t* p, size_t n) {
  ThriftReader t(p, n, "page header");
  PageHeader h;
  t.fields([&](int16_t id, uint8_t ft) {
    switch (id) {
      case 1: h.type = t.i32(ft); break;
      case 2: h.uncompressed_size = t.i32(ft); break;
      case 3: h.compressed_size = t.i32(ft); break;
      case 4: h.has_crc = true; h.crc = uint32_t(t.i32(ft)); break;
      case 5:  // DataPageHeader
        h.has_sub_header = true;
        t.nested(ft, [&](int16_t s, uint8_t st) {
          switch (s) {
            case 1: h.num_values = t.i32(st); break;
            case 2: h.encoding = t.i32(st); break;
            case 3: h.def_encoding = t.i32(st); break;
            case 4: h.rep_encoding = t.i32(st); break;
            default: t.skip(st);
          }
        });
        break;
      case 7:  // DictionaryPageHeader
        h.has_sub_header = true;
        t.nested(ft, [&](int16_t s, uint8_t st) {
          if (s == 1) h.num_values = t.i32(st);
          else if (s == 2) h.encoding = t.i32(st);
          else t.skip(st);
        });
        break;
      case 8:  // DataPageHeaderV2
        h.has_sub_header = true;
        t.nested(ft, [&](int16_t s, uint8_t st) {
          switch (s) {
            case 1: h.num_values = t.i32(st); break;
            case 2: h.num_nulls = t.i32(st); break;
            case 3: h.num_rows = t.i32(st); break;
            case 4: h.encoding = t.i32(st); break;
            case 5: h.def_bytes = t.i32(st); break;
            case 6: h.rep_bytes = t.i32(st); break;
            case 7: h.is_compressed = t.boolean(st); break;
            default: t.skip(st);
          }
        });
        break;
      default: t.skip(ft);
    }
  });
  h.header_bytes = t.consumed();
  return h;
}

}  // namespace kestrel::io::parquet
