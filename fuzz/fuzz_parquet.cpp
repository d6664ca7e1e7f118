// A Parquet dataset file: footer, schema, every row group decoded to JSON rows.
#include "fuzz_common.h"
#include "io/parquet/parquet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kestrel::io::parquet;
  auto f = ParquetFile::open_bytes("fuzz.parquet", kestrel::fuzz::as_string(data, size));
  if (!f) return 0;
  const ParquetFile& p = *f.value();
  (void)p.columns();
  (void)p.schema_text();
  (void)p.has_field({"reward_model", "ground_truth"});
  if (!p.check_supported()) return 0;
  for (int g = 0; g < p.num_row_groups(); ++g) {
    (void)p.row_group_info(g);
    auto rows = p.read_row_group(g);
    if (!rows) break;
    for (const auto& r : rows.value()) (void)r.dump();
  }
  return 0;
}
