// ParquetFile: the footer (file layout: "PAR1", column chunks, the Thrift
// FileMetaData, its u32 length, "PAR1"), and rows assembled from the leaf
// columns' definition and repetition levels (the Dremel record assembly).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/parquet/file_state.h"
#include "io/parquet/parquet.h"

namespace kestrel::io::parquet {

using oj = nlohmann::ordered_json;

namespace {

// A leaf column of one row group, ready for assembly.
struct Leaf {
  LeafData d;
  std::vector<uint32_t> value_index;  // [entries]: values before each entry (when max_def > 0)
  std::vector<size_t> row_start;      // [rows + 1]: first entry of each row
  int16_t max_def = 0;
  uint16_t def_at(size_t k) const { return d.def.empty() ? uint16_t(max_def) : d.def[k]; }
  uint16_t rep_at(size_t k) const { return d.rep.empty() ? 0 : d.rep[k]; }
};

// Entry ranges [b, e) of the leaves under one node instance (index: leaf -
// node.first_leaf). Never empty: every instance owns at least one entry.
struct Range {
  size_t b, e;
};
using Ranges = std::vector<Range>;

class Assembler {
 public:
  Assembler(const FileState& st, const std::vector<Leaf>& leaves) : st_(st), leaves_(leaves) {}

  oj row(size_t r) {
    const SchemaNode& root = st_.nodes[0];
    Ranges rs;
    for (int l = root.first_leaf; l < root.end_leaf; ++l)
      rs.push_back({leaves_[size_t(l)].row_start[r], leaves_[size_t(l)].row_start[r + 1]});
    return object(0, rs);
  }

 private:
  const SchemaNode& node(int i) const { return st_.nodes[size_t(i)]; }

  // The ranges of child c's leaves out of its parent's.
  Ranges sub(const SchemaNode& parent, const SchemaNode& c, const Ranges& rs) const {
    return Ranges(rs.begin() + (c.first_leaf - parent.first_leaf), rs.begin() + (c.end_leaf - parent.first_leaf));
  }

  oj object(int id, const Ranges& rs) {
    const SchemaNode& n = node(id);
    oj o = oj::object();
    for (int c : n.children) o[node(c).el.name] = value(c, sub(n, node(c), rs), false);
    return o;
  }

  // The instances of repeated node `id` within rs: one Ranges per element.
  std::vector<Ranges> split(int id, const Ranges& rs) const {
    const SchemaNode& n = node(id);
    std::vector<Ranges> out;
    const Leaf& l0 = leaves_[size_t(n.first_leaf)];
    if (l0.def_at(rs[0].b) < n.def) return out;  // an empty list
    for (size_t i = 0; i < rs.size(); ++i) {
      const Leaf& l = leaves_[size_t(n.first_leaf) + i];
      size_t k = rs[i].b, m = 0;
      while (k < rs[i].e) {
        size_t e = k + 1;
        while (e < rs[i].e && l.rep_at(e) > uint16_t(n.rep)) ++e;
        if (i == 0) out.push_back(Ranges(rs.size()));
        else if (m >= out.size()) fail("the columns under '", n.path, "' disagree on the number of list elements");
        out[m++][i] = {k, e};
        k = e;
      }
      if (m != out.size()) fail("the columns under '", n.path, "' disagree on the number of list elements");
    }
    return out;
  }

  oj leaf_value(const SchemaNode& n, const Range& r) const {
    const Leaf& l = leaves_[size_t(n.leaf)];
    if (l.def_at(r.b) < n.def) return nullptr;
    const size_t i = l.value_index.empty() ? r.b : l.value_index[r.b];
    const Values& v = l.d.values;
    switch (v.kind) {
      case ValueKind::Bool: return v.ints[i] != 0;
      case ValueKind::Int: return v.ints[i];
      case ValueKind::UInt: return uint64_t(v.ints[i]);
      case ValueKind::Double: return v.dbls[i];
      case ValueKind::String: return v.strs[i];
      case ValueKind::Null: return nullptr;
    }
    return nullptr;
  }

  // Node `id` over rs; as_element: a repeated node already split into one element.
  oj value(int id, const Ranges& rs, bool as_element) {
    const SchemaNode& n = node(id);
    const Leaf& l0 = leaves_[size_t(n.first_leaf)];
    if (n.el.repetition == 2 && !as_element) {
      oj a = oj::array();
      for (const auto& e : split(id, rs)) a.push_back(value(id, e, true));
      return a;
    }
    // Absent: an optional node, or a required one under a null parent.
    if (n.el.repetition == 1 && l0.def_at(rs[0].b) < n.def) return nullptr;
    if (n.is_leaf()) return leaf_value(n, rs[0]);
    if (n.is_list()) {
      const int rep = n.children.at(0);
      const int elem = list_element(st_, id);
      oj a = oj::array();
      for (const auto& e : split(rep, sub(n, node(rep), rs)))
        a.push_back(elem == rep ? value(rep, e, true) : value(elem, sub(node(rep), node(elem), e), false));
      return a;
    }
    if (n.is_map()) return map(id, rs);
    return object(id, rs);
  }

  // MAP: a repeated key_value group of a string key and an optional value.
  oj map(int id, const Ranges& rs) {
    const SchemaNode& n = node(id);
    if (n.children.size() != 1 || node(n.children[0]).el.repetition != 2 || node(n.children[0]).is_leaf())
      fail("not supported yet: MAP group '", n.path, "' without one repeated key_value group");
    const SchemaNode& kv = node(n.children[0]);
    if (kv.children.empty() || kv.children.size() > 2) fail("not supported yet: MAP '", n.path, "' whose entries have ", kv.children.size(), " fields");
    const SchemaNode& key = node(kv.children[0]);
    if (!key.is_leaf() || leaf_kind(key) != ValueKind::String)
      fail("not supported yet: MAP '", n.path, "' with non-string keys");
    oj o = oj::object();
    for (const auto& e : split(n.children[0], sub(n, kv, rs))) {
      const oj k = value(kv.children[0], sub(kv, key, e), false);
      if (!k.is_string()) fail("MAP '", n.path, "': a null key");
      o[k.get<std::string>()] = kv.children.size() == 2 ? value(kv.children[1], sub(kv, node(kv.children[1]), e), false)
                                                        : oj(nullptr);
    }
    return o;
  }

  const FileState& st_;
  const std::vector<Leaf>& leaves_;
};

// "not supported yet: X" -> "not supported yet: X in FILE, column C"; else "FILE: WHERE: message".
Status column_error(const std::string& file, const std::string& where, const std::string& column, const std::string& msg) {
  const std::string ns = "not supported yet: ";
  if (msg.rfind(ns, 0) == 0) return KS_ERR(msg, " in ", file, ", column ", column);
  return KS_ERR(file, ": ", where, "column ", column, ": ", msg);
}

}  // namespace

ParquetFile::~ParquetFile() = default;

Result<std::unique_ptr<ParquetFile>> ParquetFile::open(const std::string& path) {
  auto st = std::make_unique<FileState>();
  st->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return KS_ERR(path, ": cannot open: ", std::strerror(errno), " (check data.train_files / data.val_files)");
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    return KS_ERR(path, ": not a regular file");
  }
  st->size = size_t(sb.st_size);
  if (st->size > 0) {
    void* m = mmap(nullptr, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int merr = errno;
    if (m == MAP_FAILED) {
      ::close(fd);
      return KS_ERR(path, ": mmap failed: ", std::strerror(merr));
    }
    st->data = static_cast<const uint8_t*>(m);
    st->mapped = true;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return parse(std::move(st));
}

Result<std::unique_ptr<ParquetFile>> ParquetFile::open_bytes(const std::string& name, std::string bytes) {
  auto st = std::make_unique<FileState>();
  st->path = name;
  st->owned = std::move(bytes);
  st->data = reinterpret_cast<const uint8_t*>(st->owned.data());
  st->size = st->owned.size();
  return parse(std::move(st));
}

Result<std::unique_ptr<ParquetFile>> ParquetFile::parse(std::unique_ptr<FileState> st) {
  const std::string& path = st->path;
  if (st->size < 12)
    return KS_ERR(path, ": ", st->size, " bytes, too short to be a Parquet file (magic + footer + magic need 12)");
  const uint8_t* d = st->data;
  if (std::memcmp(d, "PAR1", 4) != 0) return KS_ERR(path, ": not a Parquet file (no PAR1 magic at the start)");
  if (std::memcmp(d + st->size - 4, "PARE", 4) == 0)
    return KS_ERR("not supported yet: encrypted Parquet footer in ", path);
  if (std::memcmp(d + st->size - 4, "PAR1", 4) != 0)
    return KS_ERR(path, ": truncated or corrupt Parquet file (no PAR1 magic at the end)");
  uint32_t flen;
  std::memcpy(&flen, d + st->size - 8, 4);
  if (flen > st->size - 12)
    return KS_ERR(path, ": truncated or corrupt Parquet file: footer length ", flen, " runs past the start of the file (",
                  st->size, " bytes)");
  st->footer_start = st->size - 8 - flen;
  try {
    st->md = decode_file_metadata(d + st->footer_start, flen);
    build_schema(*st);
  } catch (const ParquetError& e) {
    return KS_ERR(path, ": corrupt or unsupported Parquet footer: ", e.what());
  }
  std::unique_ptr<ParquetFile> f(new ParquetFile());
  f->st_ = std::move(st);
  return f;
}

const std::string& ParquetFile::path() const { return st_->path; }
int64_t ParquetFile::num_rows() const { return st_->md.num_rows; }
int ParquetFile::num_row_groups() const { return int(st_->md.row_groups.size()); }
const std::string& ParquetFile::created_by() const { return st_->md.created_by; }

RowGroupInfo ParquetFile::row_group_info(int i) const {
  const RowGroup& rg = st_->md.row_groups.at(size_t(i));
  RowGroupInfo info{rg.num_rows, rg.total_byte_size, {}};
  for (size_t c = 0; c < rg.columns.size(); ++c) {
    const ColumnMeta& m = rg.columns[c].meta;
    ColumnChunkInfo ci{st_->nodes[size_t(st_->leaves[c])].path, phys_type_name(m.type), codec_name(m.codec), {},
                       m.num_values, m.total_compressed_size, m.total_uncompressed_size};
    for (int32_t e : m.encodings) ci.encodings.push_back(encoding_name(e));
    info.columns.push_back(std::move(ci));
  }
  return info;
}

std::vector<std::string> ParquetFile::columns() const {
  std::vector<std::string> out;
  for (int c : st_->nodes[0].children) out.push_back(st_->nodes[size_t(c)].el.name);
  return out;
}

bool ParquetFile::has_field(const std::vector<std::string>& path) const {
  int cur = 0;
  for (const auto& name : path) {
    int found = -1;
    // Look through LIST wrappers to the element's fields.
    for (int hops = 0; hops < 4 && found < 0; ++hops) {
      const SchemaNode& n = st_->nodes[size_t(cur)];
      for (int c : n.children)
        if (st_->nodes[size_t(c)].el.name == name) found = c;
      if (found >= 0 || !n.is_list()) break;
      try {
        cur = list_element(*st_, cur);
      } catch (const ParquetError&) {
        return false;
      }
    }
    if (found < 0) return false;
    cur = found;
  }
  return true;
}

std::string ParquetFile::schema_text() const {
  std::string s;
  const auto walk = [&](auto&& self, int id, int depth) -> void {
    const SchemaNode& n = st_->nodes[size_t(id)];
    s += std::string(size_t(2 * depth), ' ') + n.el.name + ": " + describe_type(n) + "\n";
    for (int c : n.children) self(self, c, depth + 1);
  };
  for (int c : st_->nodes[0].children) walk(walk, c, 0);
  return s;
}

Status ParquetFile::check_supported() const {
  const FileState& st = *st_;
  for (const SchemaNode& n : st.nodes) {
    try {
      if (n.is_leaf()) (void)leaf_kind(n);
      else if (n.is_list() && n.parent >= 0) (void)list_element(st, int(&n - st.nodes.data()));
    } catch (const ParquetError& e) {
      return column_error(st.path, "", n.path, e.what());
    }
  }
  for (const RowGroup& rg : st.md.row_groups)
    for (size_t c = 0; c < rg.columns.size(); ++c)
      if (!codec_supported(rg.columns[c].meta.codec))
        return KS_ERR("not supported yet: ", codec_name(rg.columns[c].meta.codec), " compression in ", st.path,
                      ", column ", st.nodes[size_t(st.leaves[c])].path);
  return Status::ok();
}

Result<std::vector<oj>> ParquetFile::read_row_group(int g) const {
  const FileState& st = *st_;
  if (g < 0 || g >= num_row_groups()) return KS_ERR(st.path, ": no row group ", g, " (the file has ", num_row_groups(), ")");
  const RowGroup& rg = st.md.row_groups[size_t(g)];
  const std::string where = "row group " + std::to_string(g) + ", ";
  std::vector<Leaf> leaves(st.leaves.size());
  for (size_t c = 0; c < st.leaves.size(); ++c) {
    const SchemaNode& n = st.nodes[size_t(st.leaves[c])];
    try {
      LeafSpec spec{PhysType(n.el.type), n.el.type_length, n.def, n.rep, leaf_kind(n), n.path};
      Leaf& l = leaves[c];
      l.max_def = n.def;
      l.d = read_column_chunk(st.data, st.footer_start, rg.columns[c].meta, spec, rg.num_rows);
      if (!l.d.def.empty()) {
        l.value_index.resize(l.d.entries);
        uint32_t k = 0;
        for (size_t e = 0; e < l.d.entries; ++e) {
          l.value_index[e] = k;
          k += l.d.def[e] == uint16_t(n.def);
        }
      }
      l.row_start.reserve(size_t(rg.num_rows) + 1);
      for (size_t e = 0; e < l.d.entries; ++e)
        if (l.rep_at(e) == 0) l.row_start.push_back(e);
      l.row_start.push_back(l.d.entries);
      if (l.row_start.size() != size_t(rg.num_rows) + 1)
        fail("holds ", l.row_start.size() - 1, " rows, the row group ", rg.num_rows);
    } catch (const ParquetError& e) {
      return column_error(st.path, where, n.path, e.what());
    }
  }
  std::vector<oj> rows;
  rows.reserve(size_t(rg.num_rows));
  try {
    Assembler a(st, leaves);
    for (int64_t r = 0; r < rg.num_rows; ++r) rows.push_back(a.row(size_t(r)));
  } catch (const ParquetError& e) {
    const std::string msg = e.what();
    if (msg.rfind("not supported yet: ", 0) == 0) return KS_ERR(msg, " in ", st.path);
    return KS_ERR(st.path, ": ", where, msg);
  }
  return rows;
}

Status ParquetFile::for_each_row(const std::function<Status(oj&, int64_t)>& fn, int64_t max_rows) const {
  int64_t index = 0;
  for (int g = 0; g < num_row_groups(); ++g) {
    if (max_rows >= 0 && index >= max_rows) break;
    KS_ASSIGN(auto rows, read_row_group(g));
    for (auto& r : rows) {
      if (max_rows >= 0 && index >= max_rows) break;
      KS_TRY(fn(r, index));
      ++index;
    }
  }
  return Status::ok();
}

}  // namespace kestrel::io::parquet
