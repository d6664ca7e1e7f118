// Page decompression: SNAPPY (pyarrow's default), ZSTD, GZIP, UNCOMPRESSED.
// The output size comes from the page header and must be met exactly: a
// mismatch (or any decoder error) means the page is corrupt.
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <memory>

#include "io/parquet/internal.h"

namespace kestrel::io::parquet {

bool codec_supported(int32_t codec) {
  return codec == kUncompressed || codec == kSnappy || codec == kGzip || codec == kZstd;
}

namespace {

void gunzip(const uint8_t* p, size_t n, std::vector<uint8_t>& out) {
  z_stream z{};
  // 15 + 32: the gzip or zlib header, detected.
  if (inflateInit2(&z, 15 + 32) != Z_OK) fail("gzip: cannot initialise zlib");
  z.next_in = const_cast<Bytef*>(p);
  z.avail_in = uInt(n);
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  int rc = Z_OK;
  for (;;) {
    rc = inflate(&z, Z_FINISH);
    // A page may hold several gzip members back to back.
    if (rc == Z_STREAM_END && z.avail_in > 0 && z.avail_out > 0) {
      inflateReset(&z);
      continue;
    }
    break;
  }
  const size_t got = out.size() - z.avail_out;
  const size_t left_in = z.avail_in;
  inflateEnd(&z);
  if (rc != Z_STREAM_END)
    fail("gzip: corrupt data (zlib: ", rc == Z_BUF_ERROR ? "output larger than the page header says or input truncated"
                                                         : "invalid stream", ")");
  if (got != out.size() || left_in != 0)
    fail("gzip: page decompresses to ", got, " bytes, the page header says ", out.size());
}

}  // namespace

std::vector<uint8_t> decompress(int32_t codec, const uint8_t* p, size_t n, size_t out_size) {
  // No valid page is this large; a corrupt size must not allocate gigabytes.
  // Sizes are checked before the output is allocated: against the codec's
  // own length header where it has one, else against the codec's largest
  // possible expansion (deflate ~1032:1, zstd below 2^16:1).
  if (out_size > (size_t(1) << 31)) fail("page claims ", out_size, " uncompressed bytes (more than 2 GiB)");
  auto bound = [&](size_t ratio) {
    if (out_size > n * ratio + 1024)
      fail(codec_name(codec), ": page header claims ", out_size, " uncompressed bytes from ", n,
           " compressed bytes, more than the codec can expand to");
  };
  std::vector<uint8_t> out;
  switch (codec) {
    case kUncompressed:
      if (n != out_size) fail("uncompressed page holds ", n, " bytes, the page header says ", out_size);
      out.assign(p, p + n);
      return out;
    case kSnappy: {
      size_t len = 0;
      if (snappy_uncompressed_length(reinterpret_cast<const char*>(p), n, &len) != SNAPPY_OK)
        fail("snappy: corrupt page (no valid length header)");
      if (len != out_size) fail("snappy: page decompresses to ", len, " bytes, the page header says ", out_size);
      out.resize(out_size);
      size_t got = out_size;
      // snappy_uncompress checks every copy against the input and output bounds.
      if (snappy_uncompress(reinterpret_cast<const char*>(p), n, reinterpret_cast<char*>(out.data()), &got) !=
              SNAPPY_OK ||
          got != out_size)
        fail("snappy: corrupt page data");
      return out;
    }
    case kZstd: {
      bound(size_t(1) << 16);
      const unsigned long long fs = ZSTD_getFrameContentSize(p, n);
      if (fs == ZSTD_CONTENTSIZE_ERROR) fail("zstd: corrupt page (not a zstd frame)");
      if (fs != ZSTD_CONTENTSIZE_UNKNOWN && fs > out_size)
        fail("zstd: page decompresses to ", fs, " bytes, the page header says ", out_size);
      out.resize(out_size);
      // One decompression context per thread: creating one per page costs
      // more than decompressing a small page.
      thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
      if (!dctx) fail("zstd: cannot create a decompression context");
      const size_t got = ZSTD_decompressDCtx(dctx.get(), out.data(), out.size(), p, n);
      if (ZSTD_isError(got)) fail("zstd: ", ZSTD_getErrorName(got));
      if (got != out_size) fail("zstd: page decompresses to ", got, " bytes, the page header says ", out_size);
      return out;
    }
    case kGzip:
      if (n > UINT32_MAX) fail("gzip: page larger than 4 GiB");
      bound(1032);
      out.resize(out_size);
      gunzip(p, n, out);
      return out;
    default: fail("not supported yet: ", codec_name(codec), " compression");
  }
}

}  // namespace kestrel::io::parquet
