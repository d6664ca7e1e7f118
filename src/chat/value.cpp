#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace kestrel::chat {

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
Value* Dict::find(std::string_view key) {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
void Dict::set(const std::string& key, Value v) {
  if (Value* slot = find(key)) *slot = std::move(v);
  else items.emplace_back(key, std::move(v));
}

namespace {
thread_local int64_t g_work_left = 0;
thread_local bool g_budget_active = false;

int nested_depth(int deepest_child) {
  if (deepest_child + 1 > kMaxValueDepth)
    throw ValueError{"a list or dict nested deeper than " + std::to_string(kMaxValueDepth) +
                     " levels (the chat template limit)"};
  return deepest_child + 1;
}
}  // namespace

void charge_work(int64_t units) {
  if (!g_budget_active) return;
  g_work_left -= units;
  if (g_work_left < 0)
    throw ValueError{"the template built more than " + std::to_string(kMaxRenderWork) +
                     " items and string chunks in one render (the chat template limit; a loop that grows a value "
                     "each iteration?)"};
}

void check_string_size(size_t n) {
  if (n > kMaxStringBytes)
    throw ValueError{"a string of " + std::to_string(n) + " bytes exceeds the chat template limit of " +
                     std::to_string(kMaxStringBytes >> 20) + " MiB"};
}

RenderBudget::RenderBudget() : saved_(g_work_left), saved_active_(g_budget_active) {
  g_work_left = kMaxRenderWork;
  g_budget_active = true;
}
RenderBudget::~RenderBudget() {
  g_work_left = saved_;
  g_budget_active = saved_active_;
}

Value Value::make_list(List items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  int deepest = 0;
  for (const Value& e : items) deepest = std::max(deepest, e.depth);
  v.depth = nested_depth(deepest);
  charge_work(int64_t(items.size()) + 1);
  v.list = std::make_shared<List>(std::move(items));
  v.is_tuple = tuple;
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::Dict;
  int deepest = 0;
  for (const auto& kv : d.items) deepest = std::max(deepest, kv.second.depth);
  v.depth = nested_depth(deepest);
  charge_work(int64_t(d.items.size()) + 1);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::make_namespace(Dict d) {
  Value v = make_dict(std::move(d));
  v.kind = Kind::Namespace;
  return v;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.is_tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s.empty();
    case Kind::List: return !v.list->empty();
    case Kind::Dict: return !v.dict->items.empty();
    case Kind::Namespace:
    case Kind::Function: return true;
  }
  return false;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::Function: return a.s == b.s;
    case Kind::List: {
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !py_equal(kv.second, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.dict == b.dict;
    default: return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.kind == Kind::String && b.kind == Kind::String) return a.s < b.s;  // UTF-8 byte order == code point order
  if (a.kind == Kind::List && b.kind == Kind::List && a.is_tuple == b.is_tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      const Value &x = (*a.list)[k], &y = (*b.list)[k];
      if (!py_equal(x, y)) return py_less(x, y);
    }
    return a.list->size() < b.list->size();
  }
  throw ValueError{std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'"};
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout: positional for
  // exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string sign;
  if (mant[0] == '-') { sign = "-"; mant.erase(0, 1); }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + out + ebuf;
}

// ---- UTF-8 ------------------------------------------------------------------

std::vector<uint32_t> utf8_decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = s[k];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k + n > s.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int m = 1; m < n; ++m) cp = (cp << 6) | (static_cast<unsigned char>(s[k + m]) & 0x3F);
    out.push_back(cp);
    k += n;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) utf8_append(out, cps[k]);
  return out;
}

bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// ---- str / repr -------------------------------------------------------------

namespace {
// Python's str.isprintable() approximated: C0/C1 controls, separators other than
// space, and soft hyphen are escaped; every other code point prints as itself.
bool py_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x2028 || cp == 0x2029 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || cp == 0x202F ||
      cp == 0x205F || cp == 0x3000 || cp == 0xFEFF)
    return false;
  return true;
}

std::string repr_string(const std::string& s) {
  const bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  const char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == uint32_t(q) || cp == '\\') { out += '\\'; out += char(cp); }
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (!py_printable(cp)) {
      char buf[16];
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    } else {
      utf8_append(out, cp);
    }
  }
  out += q;
  return out;
}
}  // namespace

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Kind::String: return repr_string(v.s);
    case Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(kv.first) + ": " + py_repr(kv.second);
      }
      return out + "}";
    }
    case Kind::Namespace: {
      Value d = v;
      d.kind = Kind::Dict;
      return "<Namespace " + py_repr(d) + ">";
    }
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return py_float_repr(v.f);
    case Kind::String: return v.s;
    case Kind::Function: return "<function " + v.s + ">";
    default: return py_repr(v);
  }
}

// ---- json.dumps ---------------------------------------------------------------

namespace {
void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (uint32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E && cp < 0x10000)) {
          std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          out += buf;
        } else if (ensure_ascii && cp >= 0x10000) {
          const uint32_t u = cp - 0x10000;
          std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
          out += buf;
        } else {
          utf8_append(out, cp);
        }
      }
    }
  }
  out += '"';
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& opt, int depth) {
  const std::string& item_sep = opt.item_sep.empty() ? (opt.indent >= 0 ? std::string(",") : std::string(", ")) : opt.item_sep;
  const std::string& key_sep = opt.key_sep.empty() ? std::string(": ") : opt.key_sep;
  auto newline = [&](int d) {
    if (opt.indent >= 0) out += "\n" + std::string(size_t(opt.indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return;
    case Kind::String: json_string(out, v.s, opt.ensure_ascii); return;
    case Kind::List: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        dump(out, (*v.list)[k], opt, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        json_string(out, items[k]->first, opt.ensure_ascii);
        out += key_sep;
        dump(out, items[k]->second, opt, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: throw ValueError{std::string("Object of type ") + type_name(v) + " is not JSON serializable"};
  }
}
}  // namespace

std::string to_json(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(out, v, opt, 0);
  return out;
}

}  // namespace kestrel::chat
