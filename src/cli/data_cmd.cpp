// kestrel data inspect FILE [--rows N]: what a dataset file holds, as the
// loaders (data/dataset.h) will see it. Parquet: the schema (nested, with
// repetition and types), row count, row groups, per-column compression and
// encodings, and the first rows as JSON. JSONL: the row count, the keys of
// the first row and the first rows.
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "data/dataset.h"
#include "io/parquet/parquet.h"

namespace kestrel::cli {

int cmd_data(const Args& args);

namespace {

using oj = nlohmann::ordered_json;

const char* kUsage =
    "usage: kestrel data inspect FILE [--rows N]\n\n"
    "Shows what a dataset file holds, as data.train_files / data.val_files would load it.\n"
    "FILE ending in .parquet: the schema (nested fields with repetition and type), the row count,\n"
    "the row groups, each column's compression and encodings, and the first N rows as JSON\n"
    "(one object a line, the shape the JSONL form of the file has).\n"
    "Any other FILE is read as JSONL: the row count, the keys of the first row and the first N rows.\n\n"
    "options:\n"
    "  --rows N   rows to print (default 3; 0 prints none)\n";

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

int inspect_parquet(const std::string& path, int64_t nrows) {
  auto f = io::parquet::ParquetFile::open(path);
  if (!f) KS_FAIL(f.status().message());
  const auto& pf = **f;
  std::printf("file: %s\nformat: Parquet%s%s\n", path.c_str(), pf.created_by().empty() ? "" : ", written by ",
              pf.created_by().c_str());
  std::vector<std::string> sizes;
  for (int g = 0; g < pf.num_row_groups() && g < 20; ++g) sizes.push_back(std::to_string(pf.row_group_info(g).num_rows));
  if (pf.num_row_groups() > 20) sizes.push_back("...");
  std::printf("rows: %lld in %d row group%s (%s)\n", (long long)pf.num_rows(), pf.num_row_groups(),
              pf.num_row_groups() == 1 ? "" : "s", join(sizes).c_str());
  std::printf("schema:\n");
  std::string schema = pf.schema_text();
  for (size_t b = 0; b < schema.size();) {
    const size_t e = schema.find('\n', b);
    std::printf("  %s\n", schema.substr(b, e - b).c_str());
    b = e + 1;
  }
  // Per leaf column, over all row groups: codecs, encodings, bytes.
  struct Agg {
    std::set<std::string> codecs, encodings;
    std::string type;
    int64_t values = 0, comp = 0, uncomp = 0;
  };
  std::vector<std::string> order;
  std::map<std::string, Agg> cols;
  for (int g = 0; g < pf.num_row_groups(); ++g) {
    for (const auto& c : pf.row_group_info(g).columns) {
      if (!cols.count(c.path)) order.push_back(c.path);
      Agg& a = cols[c.path];
      a.type = c.physical_type;
      a.codecs.insert(c.codec);
      a.encodings.insert(c.encodings.begin(), c.encodings.end());
      a.values += c.num_values;
      a.comp += c.compressed_bytes;
      a.uncomp += c.uncompressed_bytes;
    }
  }
  std::printf("columns (over all row groups: physical type, compression, encodings, values, bytes compressed/uncompressed):\n");
  for (const auto& p : order) {
    const Agg& a = cols[p];
    std::printf("  %s: %s, %s, %s, %lld values, %lld/%lld bytes\n", p.c_str(), a.type.c_str(),
                join({a.codecs.begin(), a.codecs.end()}, "+").c_str(), join({a.encodings.begin(), a.encodings.end()}).c_str(),
                (long long)a.values, (long long)a.comp, (long long)a.uncomp);
  }
  if (nrows > 0) std::printf("first %lld rows:\n", (long long)std::min<int64_t>(nrows, pf.num_rows()));
  Status s = pf.for_each_row(
      [](oj& row, int64_t) {
        std::printf("%s\n", row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        return Status::ok();
      },
      nrows);
  if (!s) KS_FAIL(s.message());
  return 0;
}

int inspect_jsonl(const std::string& path, int64_t nrows) {
  std::ifstream probe(path);
  if (!probe) KS_FAIL(path, ": cannot open (does the file exist and is it readable?)");
  int64_t count = 0;
  std::vector<std::string> keys;
  std::vector<std::string> first;
  Status s = data::read_jsonl_rows(path, [&](oj& row, int64_t) -> Status {
    if (count == 0)
      for (const auto& [k, v] : row.items()) keys.push_back(k);
    if (count < nrows) first.push_back(row.dump());
    ++count;
    return Status::ok();
  });
  if (!s) KS_FAIL(s.message());
  std::printf("file: %s\nformat: JSONL\nrows: %lld\nkeys of the first row: %s\n", path.c_str(), (long long)count,
              join(keys).c_str());
  if (nrows > 0) std::printf("first %lld rows:\n", (long long)first.size());
  for (const auto& r : first) std::printf("%s\n", r.c_str());
  return 0;
}

}  // namespace

int cmd_data(const Args& argv) {
  ParsedArgs args("data", {{"rows", "rows to print", true, "3"}}, argv);
  const auto& pos = args.positional();
  if (args.help() || pos.empty()) {
    std::fputs(kUsage, args.help() ? stdout : stderr);
    return args.help() ? 0 : 2;
  }
  if (pos[0] != "inspect" || pos.size() != 2) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const int64_t n = args.get_int("rows");
  if (n < 0) KS_FAIL("kestrel data inspect: --rows must be >= 0, got ", n);
  return data::is_parquet_path(pos[1]) ? inspect_parquet(pos[1], n) : inspect_jsonl(pos[1], n);
}

}  // namespace kestrel::cli
