// One column chunk: its pages (an optional dictionary page, then data pages
// v1 or v2) decoded into definition levels, repetition levels and values.
//
// Page layout (parquet-format): a Thrift PageHeader, then compressed_size
// bytes. Data page v1: the whole body is compressed and holds
// [rep levels: u32 length + RLE hybrid][def levels: u32 length + RLE hybrid]
// [values]. Data page v2: [rep levels][def levels] uncompressed with their
// byte lengths in the header (no length prefix), then the values, compressed
// unless is_compressed = false.
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "io/parquet/internal.h"

namespace kestrel::io::parquet {

namespace {

// Column chunks above this many entries are refused rather than allocated
// (2^27 levels: far above any row group a writer makes for text datasets).
constexpr int64_t kMaxChunkEntries = int64_t(1) << 27;

void append_levels(Span body, int max_level, size_t n, std::vector<uint16_t>& out, const char* what) {
  std::vector<uint32_t> tmp;
  tmp.reserve(n);
  decode_rle_hybrid(body, bit_width_of(uint32_t(max_level)), n, uint32_t(max_level), tmp, what);
  out.insert(out.end(), tmp.begin(), tmp.end());
}

// v1 levels: a u32 byte length, then the RLE hybrid; s advances past them.
void levels_v1(Span& s, int32_t encoding, int max_level, size_t n, std::vector<uint16_t>& out, const char* what) {
  if (encoding != kRle) fail("not supported yet: ", encoding_name(encoding), " encoding of ", what);
  if (s.n < 4) fail(what, ": missing the 4-byte length");
  uint32_t len;
  std::memcpy(&len, s.p, 4);
  s.p += 4;
  s.n -= 4;
  if (len > s.n) fail(what, ": ", len, " bytes run past the page (", s.n, " left)");
  append_levels(Span{s.p, len}, max_level, n, out, what);
  s.p += len;
  s.n -= len;
}

struct ChunkDecoder {
  const ColumnMeta& meta;
  const LeafSpec& spec;
  LeafData d;
  Values dict;
  bool has_dict = false;

  // Values of one data page: `count` non-null values in `encoding`.
  void values(Span s, int32_t encoding, size_t count) {
    const size_t before = d.values.size();
    if (spec.kind == ValueKind::Null) {
      if (count) fail("a column of logical type UNKNOWN (always null) holds ", count, " values");
      return;
    }
    if (encoding == kPlainDictionary || encoding == kRleDictionary) {
      if (!has_dict) fail("a dictionary-encoded page comes without a dictionary page");
      if (count == 0) return;
      if (dict.size() == 0) fail("dictionary indices into an empty dictionary");
      if (s.n < 1) fail("dictionary indices: missing the bit-width byte");
      const int bw = s.p[0];
      ++s.p;
      --s.n;
      std::vector<uint32_t> idx;
      idx.reserve(count);
      decode_rle_hybrid(s, bw, count, uint32_t(dict.size() - 1), idx, "dictionary indices");
      for (uint32_t i : idx) d.values.append_from(dict, i);
    } else {
      decode_values(s, encoding, spec.phys, spec.type_length, count, d.values);
    }
    if (d.values.size() - before != count) fail("a page decoded ", d.values.size() - before, " values, expected ", count);
  }

  size_t non_null(size_t first_entry, size_t n) const {
    if (spec.max_def == 0) return n;
    return size_t(std::count(d.def.begin() + ptrdiff_t(first_entry), d.def.end(), uint16_t(spec.max_def)));
  }

  void dictionary_page(const PageHeader& h, const uint8_t* page) {
    if (has_dict) fail("a second dictionary page");
    if (d.entries) fail("a dictionary page after data pages");
    if (h.encoding != kPlain && h.encoding != kPlainDictionary)
      fail("not supported yet: dictionary page in ", encoding_name(h.encoding), " encoding");
    if (h.num_values < 0) fail("dictionary page with ", h.num_values, " values");
    const auto buf = decompress(meta.codec, page, size_t(h.compressed_size), size_t(h.uncompressed_size));
    dict.kind = spec.kind;
    if (spec.kind != ValueKind::Null) decode_values(Span{buf.data(), buf.size()}, kPlain, spec.phys, spec.type_length,
                                                     size_t(h.num_values), dict);
    has_dict = true;
  }

  void data_page_v1(const PageHeader& h, const uint8_t* page, size_t n) {
    const auto buf = decompress(meta.codec, page, size_t(h.compressed_size), size_t(h.uncompressed_size));
    Span s{buf.data(), buf.size()};
    const size_t first = d.entries;
    if (spec.max_rep > 0) levels_v1(s, h.rep_encoding, spec.max_rep, n, d.rep, "repetition levels");
    if (spec.max_def > 0) levels_v1(s, h.def_encoding, spec.max_def, n, d.def, "definition levels");
    d.entries += n;
    values(s, h.encoding, non_null(first, n));
  }

  void data_page_v2(const PageHeader& h, const uint8_t* page, size_t n) {
    if (h.rep_bytes < 0 || h.def_bytes < 0 || int64_t(h.rep_bytes) + h.def_bytes > h.compressed_size ||
        int64_t(h.rep_bytes) + h.def_bytes > h.uncompressed_size)
      fail("data page v2: level lengths ", h.rep_bytes, " + ", h.def_bytes, " exceed the page (",
           h.compressed_size, " bytes)");
    const size_t first = d.entries;
    if (spec.max_rep > 0) append_levels(Span{page, size_t(h.rep_bytes)}, spec.max_rep, n, d.rep, "repetition levels");
    if (spec.max_def > 0)
      append_levels(Span{page + h.rep_bytes, size_t(h.def_bytes)}, spec.max_def, n, d.def, "definition levels");
    d.entries += n;
    const size_t lv = size_t(h.rep_bytes) + size_t(h.def_bytes);
    const uint8_t* body = page + lv;
    const size_t body_n = size_t(h.compressed_size) - lv, body_u = size_t(h.uncompressed_size) - lv;
    std::vector<uint8_t> buf;
    if (h.is_compressed && meta.codec != kUncompressed) buf = decompress(meta.codec, body, body_n, body_u);
    else if (body_n != body_u) fail("data page v2: uncompressed values of ", body_n, " bytes, the header says ", body_u);
    const Span s = buf.empty() && body_u ? Span{body, body_n} : Span{buf.data(), buf.size()};
    values(s, h.encoding, non_null(first, n));
  }
};

}  // namespace

LeafData read_column_chunk(const uint8_t* file, size_t data_end, const ColumnMeta& meta, const LeafSpec& spec,
                           int64_t row_group_rows) {
  int64_t start = meta.data_page_offset;
  if (meta.dictionary_page_offset > 0 && meta.dictionary_page_offset < start) start = meta.dictionary_page_offset;
  if (start < 4 || meta.total_compressed_size < 0 || uint64_t(start) > data_end ||
      uint64_t(meta.total_compressed_size) > data_end - uint64_t(start))
    fail("column chunk at bytes [", start, ", ", start + meta.total_compressed_size,
         ") lies outside the file's data section [4, ", data_end, ")");
  if (!codec_supported(meta.codec)) fail("not supported yet: ", codec_name(meta.codec), " compression");
  if (meta.num_values < 0 || meta.num_values > kMaxChunkEntries)
    fail("column chunk claims ", meta.num_values, " values (the reader takes at most ", kMaxChunkEntries, ")");
  if (spec.max_rep == 0 && meta.num_values != row_group_rows)
    fail("column chunk holds ", meta.num_values, " values for a row group of ", row_group_rows, " rows");
  const size_t total = size_t(meta.num_values);

  ChunkDecoder cd{meta, spec, {}, {}, false};
  cd.d.values.kind = spec.kind;
  size_t pos = size_t(start);
  const size_t end = size_t(start + meta.total_compressed_size);
  while (cd.d.entries < total) {
    if (pos >= end) fail("column chunk ends after ", cd.d.entries, " of its ", total, " values");
    const PageHeader h = decode_page_header(file + pos, end - pos);
    pos += h.header_bytes;
    if (h.compressed_size < 0 || size_t(h.compressed_size) > end - pos)
      fail("page of ", h.compressed_size, " bytes runs past the column chunk (", end - pos, " bytes left)");
    if (h.uncompressed_size < 0) fail("page with a negative uncompressed size");
    const uint8_t* page = file + pos;
    pos += size_t(h.compressed_size);
    if (h.has_crc && uint32_t(crc32(0L, page, uInt(h.compressed_size))) != h.crc)
      fail("page CRC mismatch (the page bytes are corrupt)");
    if (h.type == kIndexPage) continue;
    if (h.type != kDataPage && h.type != kDataPageV2 && h.type != kDictionaryPage)
      fail("unknown page type ", h.type);
    if (!h.has_sub_header) fail("page header without its ", h.type == kDictionaryPage ? "dictionary" : "data", " page header");
    if (h.type == kDictionaryPage) {
      cd.dictionary_page(h, page);
      continue;
    }
    if (h.num_values < 0 || size_t(h.num_values) > total - cd.d.entries)
      fail("page of ", h.num_values, " values overflows the column chunk (", total - cd.d.entries, " left of ", total, ")");
    if (h.type == kDataPage) cd.data_page_v1(h, page, size_t(h.num_values));
    else cd.data_page_v2(h, page, size_t(h.num_values));
  }
  if (spec.max_rep > 0) {
    const int64_t rows = std::count(cd.d.rep.begin(), cd.d.rep.end(), uint16_t(0));
    if (rows != row_group_rows || (total && cd.d.rep[0] != 0))
      fail("repetition levels start ", rows, " rows, the row group has ", row_group_rows);
  }
  return std::move(cd.d);
}

}  // namespace kestrel::io::parquet
