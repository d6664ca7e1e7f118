#include "config/schema.h"

#include <set>
#include <unordered_map>

#include "core/status.h"

namespace kestrel::config {

const char* type_name(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "string";
    case Type::IntList: return "list of int";
    case Type::FloatList: return "list of float";
    case Type::StringList: return "list of string";
    case Type::Map: return "map";
  }
  return "?";
}

namespace schema_detail {
KeyDecl& Builder::k(const std::string& rel, Type t, std::string def, Support s, std::string doc,
                    std::vector<std::string> allowed, std::vector<std::string> supported) {
  KeyDecl d{prefix_.empty() ? rel : prefix_ + "." + rel, t, std::move(def), s, std::move(doc), std::move(allowed),
            std::move(supported)};
  out_.push_back(std::move(d));
  return out_.back();
}
}  // namespace schema_detail

namespace {

struct Index {
  std::vector<KeyDecl> keys;
  std::unordered_map<std::string, size_t> by_path;
  std::set<std::string, std::less<>> sections;
  std::vector<std::string> paths;
};

const Index& index() {
  static const Index idx = [] {
    Index ix;
    schema_detail::Builder b(ix.keys);
    schema_detail::declare_data_and_model(b);
    schema_detail::declare_actor_ref_critic(b);
    schema_detail::declare_rollout(b);
    schema_detail::declare_reward_algorithm_trainer(b);
    for (size_t i = 0; i < ix.keys.size(); ++i) {
      const std::string& p = ix.keys[i].path;
      // A duplicate declaration is a bug in the table, caught on first use.
      KS_CHECK(ix.by_path.emplace(p, i).second, "config key declared twice: ", p);
      for (size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1))
        ix.sections.insert(p.substr(0, dot));
      const KeyDecl& d = ix.keys[i];
      for (const auto& s : d.supported) {
        bool ok = false;
        for (const auto& a : d.allowed) ok |= a == s;
        KS_CHECK(ok, "config key ", p, ": supported value '", s, "' is not in its allowed set");
      }
    }
    for (const auto& s : ix.sections) KS_CHECK(!ix.by_path.count(s), "config path is both key and section: ", s);
    for (const auto& d : ix.keys) ix.paths.push_back(d.path);
    for (const auto& s : ix.sections) ix.paths.push_back(s);
    return ix;
  }();
  return idx;
}

}  // namespace

const std::vector<KeyDecl>& schema() { return index().keys; }

const KeyDecl* find_key(std::string_view path) {
  const auto& ix = index();
  auto it = ix.by_path.find(std::string(path));
  return it == ix.by_path.end() ? nullptr : &ix.keys[it->second];
}

bool is_section(std::string_view path) { return index().sections.count(path) > 0; }

const KeyDecl* free_form_ancestor(std::string_view path) {
  for (std::string_view p = path;;) {
    if (const KeyDecl* d = find_key(p); d && d->type == Type::Map) return d;
    const size_t dot = p.rfind('.');
    if (dot == std::string_view::npos) return nullptr;
    p = p.substr(0, dot);
  }
}

const std::vector<std::string>& all_paths() { return index().paths; }

}  // namespace kestrel::config
