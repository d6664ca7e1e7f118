// The opened file behind ParquetFile: the mapping, the decoded footer and
// the schema as a tree with each node's definition/repetition levels.
#pragma once
#include <string>
#include <vector>

#include "io/parquet/internal.h"

namespace kestrel::io::parquet {

struct SchemaNode {
  SchemaElement el;
  int parent = -1;
  std::vector<int> children;
  // Levels at this node: optional/repeated nodes on the path from the root
  // (exclusive) to here (inclusive), and the repeated ones among them.
  int16_t def = 0, rep = 0;
  int leaf = -1;                     // the column index, for leaves
  int first_leaf = 0, end_leaf = 0;  // the leaf columns under this node: [first_leaf, end_leaf)
  std::string path;                  // dotted, from the root's children
  bool is_leaf() const { return leaf >= 0; }
  bool is_list() const { return el.logical == Logical::List || el.converted_type == 3; }
  bool is_map() const { return el.logical == Logical::Map || el.converted_type == 1; }
};

struct FileState {
  std::string path;
  const uint8_t* data = nullptr;  // the whole file: mapped read-only, or `owned`
  size_t size = 0;
  bool mapped = false;
  std::string owned;
  size_t footer_start = 0;  // column data lies in [4, footer_start)
  FileMetaData md;
  std::vector<SchemaNode> nodes;  // nodes[0] is the root
  std::vector<int> leaves;        // node index of each column, in column order
  ~FileState();
};

// Builds st.nodes / st.leaves from st.md.schema (pre-order with child
// counts) and checks every row group's column chunks against the leaves.
void build_schema(FileState& st);
// The JSON kind of a leaf's values, or a "not supported yet" error.
ValueKind leaf_kind(const SchemaNode& n);
// "optional BYTE_ARRAY (STRING)", "repeated group", "optional group (LIST)".
std::string describe_type(const SchemaNode& n);
// The element node of a LIST node (3-level or a legacy 2-level form); also
// checks the list's shape.
int list_element(const FileState& st, int list_node);

}  // namespace kestrel::io::parquet
