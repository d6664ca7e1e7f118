#include "config/schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/status.h"

namespace kestrel::config {

namespace {
std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}
}  // namespace

bool Range::contains(double x) const {
  if (std::find(also.begin(), also.end(), x) != also.end()) return true;
  if (!std::isfinite(x)) return false;  // nan/inf only as an `also` sentinel
  const bool lo_ok = min_inclusive ? x >= min : x > min;
  const bool hi_ok = max_inclusive ? x <= max : x < max;
  return lo_ok && hi_ok;
}

std::string Range::describe() const {
  std::string out;
  const bool lo = std::isfinite(min), hi = std::isfinite(max);
  if (lo && hi)
    out = std::string(min_inclusive ? "in [" : "in (") + num(min) + ", " + num(max) + (max_inclusive ? "]" : ")");
  else if (lo)
    out = std::string(min_inclusive ? ">= " : "> ") + num(min);
  else if (hi)
    out = std::string(max_inclusive ? "<= " : "< ") + num(max);
  else
    out = "any finite value";
  for (double a : also) out += " or " + num(a);
  return out;
}

KeyDecl& KeyDecl::in(double lo, double hi, bool lo_inclusive, bool hi_inclusive) {
  Range r;
  r.min = lo;
  r.max = hi;
  r.min_inclusive = lo_inclusive;
  r.max_inclusive = hi_inclusive;
  range = r;
  return *this;
}

KeyDecl& KeyDecl::or_value(double v) {
  KS_CHECK(range, "config key ", path, ": or_value() needs a range first");
  range->also.push_back(v);
  return *this;
}

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
  KeyDecl d;
  d.path = prefix_.empty() ? rel : prefix_ + "." + rel;
  d.type = t;
  d.default_yaml = std::move(def);
  d.status = s;
  d.doc = std::move(doc);
  d.allowed = std::move(allowed);
  d.supported = std::move(supported);
  out_.push_back(std::move(d));
  return out_.back();
}

KeyDecl& Builder::existing(const std::string& path) {
  for (auto& d : out_)
    if (d.path == path) return d;
  KS_FAIL("config table: no key ", path, " to amend");
}
}  // namespace schema_detail

const char* support_name(Support s) {
  switch (s) {
    case Support::Supported: return "supported";
    case Support::NotSupportedYet: return "not supported yet";
    case Support::NoEffect: return "no effect in Kestrel";
  }
  return "?";
}

Schema::Schema(std::string name, std::string command, std::vector<KeyDecl> keys, const Schema* parent)
    : name_(std::move(name)), command_(std::move(command)), keys_(std::move(keys)), parent_(parent) {
  for (size_t i = 0; i < keys_.size(); ++i) {
    const std::string& p = keys_[i].path;
    // A duplicate declaration is a bug in the table, caught on first use.
    KS_CHECK(by_path_.emplace(p, i).second, "config key declared twice in ", name_, ": ", p);
    for (size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1))
      sections_.insert(p.substr(0, dot));
    const KeyDecl& d = keys_[i];
    for (const auto& s : d.supported) {
      bool ok = false;
      for (const auto& a : d.allowed) ok |= a == s;
      KS_CHECK(ok, "config key ", p, ": supported value '", s, "' is not in its allowed set");
    }
    KS_CHECK(!d.doc.empty(), "config key ", p, " has no doc");
    if (d.addable && p.find('.') != std::string::npos) open_.insert(p.substr(0, p.rfind('.')));
  }
  for (const auto& s : sections_) KS_CHECK(!by_path_.count(s), "config path is both key and section: ", s);
  for (const auto& d : keys_) paths_.push_back(d.path);
  for (const auto& s : sections_) paths_.push_back(s);
}

const KeyDecl* Schema::find(std::string_view path) const {
  auto it = by_path_.find(std::string(path));
  return it == by_path_.end() ? nullptr : &keys_[it->second];
}

bool Schema::is_section(std::string_view path) const { return sections_.count(path) > 0; }

const KeyDecl* Schema::free_form_ancestor(std::string_view path) const {
  for (std::string_view p = path;;) {
    if (const KeyDecl* d = find(p); d && d->type == Type::Map) return d;
    const size_t dot = p.rfind('.');
    if (dot == std::string_view::npos) return nullptr;
    p = p.substr(0, dot);
  }
}

std::string Schema::open_ancestor(std::string_view path) const {
  for (std::string_view p = path;;) {
    const size_t dot = p.rfind('.');
    if (dot == std::string_view::npos) return "";
    p = p.substr(0, dot);
    if (open_.count(p)) return std::string(p);
  }
}

namespace {

using Declare = void (*)(schema_detail::Builder&);

std::vector<KeyDecl> build(std::initializer_list<Declare> parts) {
  std::vector<KeyDecl> keys;
  schema_detail::Builder b(keys);
  for (Declare d : parts) d(b);
  return keys;
}

// A view: copies of the parent's declarations, defaults and docs restated where given.
std::vector<KeyDecl> view(const Schema& parent, const std::vector<schema_detail::ViewKey>& keys) {
  std::vector<KeyDecl> out;
  for (const auto& k : keys) {
    const KeyDecl* d = parent.find(k.path);
    KS_CHECK(d, "config view: no key ", k.path, " in ", parent.name());
    out.push_back(*d);
    if (!k.default_yaml.empty()) out.back().default_yaml = k.default_yaml;
    if (!k.doc.empty()) out.back().doc = k.doc;
    if (k.status) out.back().status = *k.status;
  }
  return out;
}

}  // namespace

const Schema& ppo_schema() {
  static const Schema s("ppo_trainer", "kestrel train",
                        build({schema_detail::declare_data_and_model, schema_detail::declare_actor_ref_critic,
                               schema_detail::declare_rollout, schema_detail::declare_reward_algorithm_trainer,
                               schema_detail::declare_verl_fsdp, schema_detail::declare_verl_extra,
                               schema_detail::amend_for_verl}));
  return s;
}

const Schema& sft_schema() {
  static const Schema s("sft_trainer", "kestrel sft", build({schema_detail::declare_sft}));
  return s;
}

const Schema& generate_schema() {
  static const Schema s("generate", "kestrel generate", view(ppo_schema(), schema_detail::generate_view()),
                        &ppo_schema());
  return s;
}

const Schema& logprobs_schema() {
  static const Schema s("logprobs", "kestrel logprobs", view(ppo_schema(), schema_detail::logprobs_view()),
                        &ppo_schema());
  return s;
}

const std::vector<const Schema*>& all_schemas() {
  static const std::vector<const Schema*> v = {&ppo_schema(), &sft_schema(), &generate_schema(), &logprobs_schema()};
  return v;
}

const Schema* find_schema(std::string_view name) {
  if (name == "ppo" || name == "train") return &ppo_schema();
  if (name == "sft") return &sft_schema();
  for (const Schema* s : all_schemas())
    if (s->name() == name) return s;
  return nullptr;
}

const std::vector<KeyDecl>& schema() { return ppo_schema().keys(); }
const KeyDecl* find_key(std::string_view path) { return ppo_schema().find(path); }
bool is_section(std::string_view path) { return ppo_schema().is_section(path); }
const KeyDecl* free_form_ancestor(std::string_view path) { return ppo_schema().free_form_ancestor(path); }
const std::vector<std::string>& all_paths() { return ppo_schema().all_paths(); }

}  // namespace kestrel::config
