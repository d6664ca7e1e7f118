// The schema tree: built from the footer's flat, pre-order SchemaElement
// list, with each node's definition and repetition levels, and checked
// against every row group's column chunks.
#include <sys/mman.h>

#include "io/parquet/file_state.h"

namespace kestrel::io::parquet {

FileState::~FileState() {
  if (mapped) munmap(const_cast<uint8_t*>(data), size);
}

namespace {

constexpr int kMaxDepth = 64;

// Appends schema[idx] (and its subtree) under `parent`; returns the next index.
size_t add_node(FileState& st, size_t idx, int parent, int depth) {
  const auto& schema = st.md.schema;
  if (idx >= schema.size()) fail("schema: the elements end before every group got its children");
  if (depth > kMaxDepth) fail("schema: nested deeper than ", kMaxDepth, " levels");
  const SchemaElement& e = schema[idx];
  const int id = int(st.nodes.size());
  st.nodes.push_back(SchemaNode{});
  SchemaNode& n0 = st.nodes.back();
  n0.el = e;
  n0.parent = parent;
  if (parent >= 0) {
    const SchemaNode& p = st.nodes[size_t(parent)];
    if (e.repetition < 0 || e.repetition > 2) fail("schema: field '", e.name, "' has repetition ", e.repetition);
    n0.def = int16_t(p.def + (e.repetition != 0));
    n0.rep = int16_t(p.rep + (e.repetition == 2));
    n0.path = p.path.empty() ? e.name : p.path + "." + e.name;
    st.nodes[size_t(parent)].children.push_back(id);
  }
  st.nodes[size_t(id)].first_leaf = int(st.leaves.size());
  if (e.num_children < 0) fail("schema: field '", e.name, "' has ", e.num_children, " children");
  size_t next = idx + 1;
  if (e.num_children == 0 && parent >= 0) {
    if (e.type < 0 || e.type > 7) fail("schema: field '", e.name, "' has neither children nor a physical type");
    st.nodes[size_t(id)].leaf = int(st.leaves.size());
    st.leaves.push_back(id);
  } else {
    if (e.num_children == 0) fail("schema: the root has no columns");
    if (size_t(e.num_children) > schema.size() - next) fail("schema: field '", e.name, "' claims ", e.num_children, " children");
    for (int c = 0; c < e.num_children; ++c) next = add_node(st, next, id, depth + 1);
  }
  st.nodes[size_t(id)].end_leaf = int(st.leaves.size());
  return next;
}

}  // namespace

void build_schema(FileState& st) {
  if (st.md.schema.empty()) fail("footer: empty schema");
  const size_t used = add_node(st, 0, -1, 0);
  if (used != st.md.schema.size()) fail("schema: ", st.md.schema.size() - used, " elements after the root's subtree");
  int64_t rows = 0;
  for (size_t g = 0; g < st.md.row_groups.size(); ++g) {
    const RowGroup& rg = st.md.row_groups[g];
    if (rg.num_rows < 0) fail("row group ", g, " has ", rg.num_rows, " rows");
    rows += rg.num_rows;
    if (rg.columns.size() != st.leaves.size())
      fail("row group ", g, " has ", rg.columns.size(), " column chunks, the schema ", st.leaves.size(), " columns");
    for (size_t c = 0; c < rg.columns.size(); ++c) {
      const ColumnChunk& cc = rg.columns[c];
      const SchemaNode& leaf = st.nodes[size_t(st.leaves[c])];
      if (cc.encrypted) fail("not supported yet: encrypted column ", leaf.path);
      if (!cc.file_path.empty()) fail("not supported yet: column ", leaf.path, " stored in another file (", cc.file_path, ")");
      if (!cc.has_meta) fail("row group ", g, ", column ", leaf.path, ": no column metadata");
      std::string p;
      for (const auto& s : cc.meta.path) p += (p.empty() ? "" : ".") + s;
      if (p != leaf.path) fail("row group ", g, ": column chunk ", c, " is '", p, "', the schema says '", leaf.path, "'");
      if (cc.meta.type != leaf.el.type)
        fail("row group ", g, ", column ", leaf.path, ": chunk type ", phys_type_name(cc.meta.type), ", schema type ",
             phys_type_name(leaf.el.type));
    }
  }
  if (rows != st.md.num_rows) fail("footer: num_rows is ", st.md.num_rows, " but the row groups hold ", rows);
}

ValueKind leaf_kind(const SchemaNode& n) {
  const SchemaElement& e = n.el;
  const int ct = e.converted_type;
  auto unsupported = [&](const std::string& what) -> ValueKind { fail("not supported yet: ", what); };
  if (e.logical == Logical::Unknown) return ValueKind::Null;
  if (e.logical == Logical::Other) return unsupported(e.logical_name + " values");
  switch (PhysType(e.type)) {
    case PhysType::Boolean: return ValueKind::Bool;
    case PhysType::Int32: case PhysType::Int64:
      if (e.logical == Logical::Integer) return e.int_signed ? ValueKind::Int : ValueKind::UInt;
      if (ct == -1 || (ct >= 15 && ct <= 18)) return ValueKind::Int;  // INT_8..INT_64
      if (ct >= 11 && ct <= 14) return ValueKind::UInt;                // UINT_8..UINT_64
      return unsupported("converted type " + std::to_string(ct) + " (DATE/TIME/TIMESTAMP/DECIMAL) values");
    case PhysType::Float: case PhysType::Double: return ValueKind::Double;
    case PhysType::ByteArray:
      if (e.logical == Logical::String || e.logical == Logical::Enum || e.logical == Logical::Json || ct == 0 ||
          ct == 4 || ct == 19)
        return ValueKind::String;
      return unsupported("binary values (BYTE_ARRAY without a STRING annotation)");
    default: return unsupported(std::string(phys_type_name(e.type)) + " values");
  }
}

std::string describe_type(const SchemaNode& n) {
  static const char* reps[] = {"required", "optional", "repeated"};
  std::string s = reps[n.el.repetition];
  s += n.is_leaf() ? std::string(" ") + phys_type_name(n.el.type) : std::string(" group");
  std::string ann;
  if (!n.el.logical_name.empty()) {
    ann = n.el.logical_name;
    if (n.el.logical == Logical::Integer) ann += "(" + std::to_string(n.el.int_bits) + (n.el.int_signed ? ", signed)" : ", unsigned)");
  } else if (n.el.converted_type >= 0) {
    static const char* cts[] = {"UTF8", "MAP", "MAP_KEY_VALUE", "LIST", "ENUM", "DECIMAL", "DATE", "TIME_MILLIS",
                                "TIME_MICROS", "TIMESTAMP_MILLIS", "TIMESTAMP_MICROS", "UINT_8", "UINT_16", "UINT_32",
                                "UINT_64", "INT_8", "INT_16", "INT_32", "INT_64", "JSON", "BSON", "INTERVAL"};
    ann = n.el.converted_type < 22 ? cts[n.el.converted_type] : "?";
  }
  if (!ann.empty()) s += " (" + ann + ")";
  return s;
}

int list_element(const FileState& st, int list_node) {
  const SchemaNode& l = st.nodes[size_t(list_node)];
  if (l.children.size() != 1) fail("not supported yet: LIST group '", l.path, "' with ", l.children.size(), " children");
  const int c = l.children[0];
  const SchemaNode& rep = st.nodes[size_t(c)];
  if (rep.el.repetition != 2) fail("LIST group '", l.path, "': its child '", rep.el.name, "' is not repeated");
  // parquet-format LogicalTypes.md, backward-compatibility rules for lists.
  if (rep.is_leaf() || rep.children.size() > 1 || rep.el.name == "array" || rep.el.name == l.el.name + "_tuple") return c;
  return rep.children[0];
}

}  // namespace kestrel::io::parquet
