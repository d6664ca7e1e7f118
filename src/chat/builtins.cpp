#include "chat/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "chat/ast.h"

namespace kestrel::chat::detail {

const Value* CallArgs::get(size_t idx, const char* name) const {
  if (idx < pos.size()) return &pos[idx];
  for (const auto& kv : kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void fail_undefined(const Value& v) { throw ValueError{v.s.empty() ? std::string("value is undefined") : v.s}; }

namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  throw ValueError{"unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'"};
}

int64_t floordiv(int64_t a, int64_t b) {
  if (b == -1) {  // the one quotient that overflows: INT64_MIN // -1
    if (a == INT64_MIN) throw ValueError{"integer overflow in '//' (chat template integers are 64-bit)"};
    return -a;
  }
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::string repeat(const std::string& s, int64_t n) {
  if (n <= 0 || s.empty()) return {};
  size_t total;  // checked before anything is allocated
  if (__builtin_mul_overflow(s.size(), size_t(n), &total)) total = SIZE_MAX;
  check_string_size(total);
  // By doubling: appending a one-byte string 10^7 times took seconds under ASan.
  std::string out;
  out.reserve(total);
  out = s;
  while (out.size() * 2 <= total) out += out;
  out.append(out, 0, total - out.size());
  return out;
}

// Python integers are unbounded; the template's are 64-bit, so an overflow
// is an error instead of undefined behaviour or a wrapped number.
[[noreturn]] void int_overflow(const std::string& op) {
  throw ValueError{"integer overflow in '" + op + "' (chat template integers are 64-bit)"};
}
int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) int_overflow("+");
  return r;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) int_overflow("-");
  return r;
}
int64_t checked_mul(int64_t a, int64_t b, const char* op = "*") {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) int_overflow(op);
  return r;
}
// a ** b for b >= 0 by squaring (a loop of b multiplications hangs on 2 ** 10**12).
int64_t checked_pow(int64_t a, int64_t b) {
  if (a == 0) return b == 0 ? 1 : 0;
  if (a == 1) return 1;
  if (a == -1) return (b % 2) ? -1 : 1;
  int64_t r = 1;
  while (b > 0) {
    if (b & 1) r = checked_mul(r, a, "**");
    b >>= 1;
    if (b) a = checked_mul(a, a, "**");
  }
  return r;
}

std::string str_arg(const Value& v, const char* what) {
  if (!v.is_string()) throw ValueError{std::string(what) + " must be str, not " + type_name(v)};
  return v.s;
}

// ---- Python str helpers ----

bool in_set(uint32_t cp, const std::vector<uint32_t>* chars) {
  if (!chars) return py_isspace(cp);
  return std::find(chars->begin(), chars->end(), cp) != chars->end();
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  const std::vector<uint32_t>* cs = nullptr;
  if (chars && chars->kind != Kind::None) {
    set = utf8_decode(str_arg(*chars, "strip arg"));
    cs = &set;
  }
  const auto cps = utf8_decode(s);
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in_set(cps[b], cs)) ++b;
  if (right)
    while (e > b && in_set(cps[e - 1], cs)) --e;
  return utf8_encode(cps, b, e);
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (!sep || sep->kind == Kind::None) {
    const auto cps = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && py_isspace(cps[k])) ++k;
      if (k == cps.size()) break;
      size_t b = k;
      while (k < cps.size() && !py_isspace(cps[k])) ++k;
      words.emplace_back(b, k);
    }
    if (maxsplit < 0 || size_t(maxsplit) >= words.size()) {
      for (auto [b, e] : words) parts.push_back(utf8_encode(cps, b, e));
      return parts;
    }
    // Limited splits keep the unsplit remainder verbatim (minus the outer whitespace).
    if (!from_right) {
      for (int64_t w = 0; w < maxsplit; ++w) parts.push_back(utf8_encode(cps, words[w].first, words[w].second));
      size_t rest = words[size_t(maxsplit)].first;
      size_t end = cps.size();
      while (end > rest && py_isspace(cps[end - 1])) --end;
      parts.push_back(utf8_encode(cps, rest, end));
    } else {
      const size_t keep = words.size() - size_t(maxsplit);
      size_t b = 0;
      while (b < cps.size() && py_isspace(cps[b])) ++b;
      parts.push_back(utf8_encode(cps, b, words[keep - 1].second));
      for (size_t w = keep; w < words.size(); ++w) parts.push_back(utf8_encode(cps, words[w].first, words[w].second));
    }
    return parts;
  }
  const std::string d = str_arg(*sep, "separator");
  if (d.empty()) throw ValueError{"empty separator"};
  std::vector<size_t> cuts;
  for (size_t p = s.find(d); p != std::string::npos; p = s.find(d, p + d.size())) cuts.push_back(p);
  if (maxsplit >= 0 && size_t(maxsplit) < cuts.size()) {
    if (from_right) cuts.erase(cuts.begin(), cuts.end() - maxsplit);
    else cuts.resize(size_t(maxsplit));
  }
  size_t b = 0;
  for (size_t c : cuts) {
    parts.push_back(s.substr(b, c - b));
    b = c + d.size();
  }
  parts.push_back(s.substr(b));
  return parts;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  size_t b = 0;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` around every character
    const auto cps = utf8_decode(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) { out += to; ++done; }
      if (k < cps.size()) utf8_append(out, cps[k]);
      check_string_size(out.size());
    }
    return out;
  }
  for (size_t p = s.find(from); p != std::string::npos && (count < 0 || done < count); p = s.find(from, b)) {
    out += s.substr(b, p - b) + to;
    check_string_size(out.size());
    b = p + from.size();
    ++done;
  }
  return out + s.substr(b);
}

// Case mapping covers ASCII only; other characters pass through unchanged.
std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    if (upper ? (c >= 'a' && c <= 'z') : (c >= 'A' && c <= 'Z')) c = char(c ^ 0x20);
  return s;
}
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
std::string py_title(std::string s) {
  bool prev_cased = false;
  for (char& c : s) {
    if (ascii_alpha(c)) {
      c = prev_cased ? char(std::tolower(c)) : char(std::toupper(c));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return s;
}
// jinja's `title` filter (not str.title): words start after whitespace or one of -({[<.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (uint32_t cp : utf8_decode(s)) {
    const bool sep = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (!sep && cp < 0x80 && ascii_alpha(char(cp))) cp = word_start ? uint32_t(std::toupper(int(cp))) : uint32_t(std::tolower(int(cp)));
    word_start = sep;
    utf8_append(out, cp);
  }
  return out;
}
std::string py_capitalize(const std::string& s) {
  std::string out = ascii_case(s, false);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = char(out[0] ^ 0x20);
  return out;
}

bool affix_match(const std::string& s, const Value& arg, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.kind == Kind::List && arg.is_tuple) {
    for (const Value& a : *arg.list)
      if (one(str_arg(a, prefix ? "startswith first arg" : "endswith first arg"))) return true;
    return false;
  }
  return one(str_arg(arg, prefix ? "startswith first arg" : "endswith first arg"));
}

Value str_list(const std::vector<std::string>& parts) {
  List l;
  for (const auto& p : parts) l.push_back(Value::string(p));
  return Value::make_list(std::move(l));
}

int64_t int_arg(const Value* v, int64_t dflt) {
  if (!v || v->kind == Kind::None) return dflt;
  if (v->kind != Kind::Int && v->kind != Kind::Bool) throw ValueError{std::string("expected an integer, got ") + type_name(*v)};
  return v->as_int();
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool num = a.is_numeric() && b.is_numeric();
  const bool ints = num && a.kind != Kind::Float && b.kind != Kind::Float;
  if (op == "+") {
    if (ints) return Value::integer(checked_add(a.as_int(), b.as_int()));
    if (num) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_string_size(a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.kind == Kind::List && b.kind == Kind::List && a.is_tuple == b.is_tuple) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l), a.is_tuple);
    }
    if (a.is_string() || b.is_string())
      throw ValueError{std::string("can only concatenate str (not \"") + type_name(a.is_string() ? b : a) + "\") to str"};
    type_error("+", a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(checked_sub(a.as_int(), b.as_int()));
    if (num) return Value::number(a.as_double() - b.as_double());
    type_error("-", a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(checked_mul(a.as_int(), b.as_int()));
    if (num) return Value::number(a.as_double() * b.as_double());
    if (a.is_string() && (b.kind == Kind::Int || b.kind == Kind::Bool)) return Value::string(repeat(a.s, b.as_int()));
    if (b.is_string() && (a.kind == Kind::Int || a.kind == Kind::Bool)) return Value::string(repeat(b.s, a.as_int()));
    type_error("*", a, b);
  }
  if (!num) type_error(op, a, b);
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      return Value::integer(checked_pow(a.as_int(), b.as_int()));
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  if (b.as_double() == 0) throw ValueError{op == "/" ? "division by zero" : "integer division or modulo by zero"};
  if (op == "/") return Value::number(a.as_double() / b.as_double());
  if (op == "//") {
    if (ints) return Value::integer(floordiv(a.as_int(), b.as_int()));
    return Value::number(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (ints) return Value::integer(b.as_int() == -1 ? 0 : a.as_int() - b.as_int() * floordiv(a.as_int(), b.as_int()));
    const double m = std::fmod(a.as_double(), b.as_double());
    return Value::number((m != 0 && ((m < 0) != (b.as_double() < 0))) ? m + b.as_double() : m);
  }
  throw ValueError{"unknown operator " + op};
}

Value py_slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step_o) {
  if (v.is_undefined()) fail_undefined(v);
  const int64_t step = step_o.value_or(1);
  if (step == 0) throw ValueError{"slice step cannot be zero"};
  std::vector<uint32_t> cps;
  int64_t n = 0;
  if (v.is_string()) { cps = utf8_decode(v.s); n = int64_t(cps.size()); }
  else if (v.kind == Kind::List) n = int64_t(v.list->size());
  else throw ValueError{std::string("'") + type_name(v) + "' object is not subscriptable"};
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t i = *x;
    if (i < 0) { i += n; if (i < 0) i = step < 0 ? -1 : 0; }
    else if (i >= n) i = step < 0 ? n - 1 : n;
    return i;
  };
  const int64_t b = adjust(start, step < 0 ? n - 1 : 0), e = adjust(stop, step < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) idx.push_back(k);
  if (v.is_string()) {
    std::string out;
    for (int64_t k : idx) utf8_append(out, cps[size_t(k)]);
    return Value::string(out);
  }
  List out;
  for (int64_t k : idx) out.push_back((*v.list)[size_t(k)]);
  return Value::make_list(std::move(out), v.is_tuple);
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (uint32_t cp : utf8_decode(v.s)) {
        std::string c;
        utf8_append(c, cp);
        chars.push_back(Value::string(c));
      }
      return chars;
    }
    default: throw ValueError{std::string("'") + type_name(v) + "' object is not iterable"};
  }
}

bool contains(const Value& c, const Value& item) {
  if (c.is_string()) {
    if (!item.is_string())
      throw ValueError{std::string("'in <string>' requires string as left operand, not ") + type_name(item)};
    return c.s.find(item.s) != std::string::npos;
  }
  if (c.kind == Kind::Dict) return item.is_string() && c.dict->find(item.s) != nullptr;
  for (const Value& x : iterate(c))
    if (py_equal(x, item)) return true;
  return false;
}

bool apply_test(const std::string& n, const Value& v, const CallArgs& a) {
  auto arg = [&](size_t k) -> const Value& {
    if (k >= a.pos.size()) throw ValueError{"test '" + n + "' needs an argument"};
    return a.pos[k];
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.kind == Kind::None;
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.kind == Kind::Dict;
  if (n == "iterable" || n == "sequence")
    return v.is_string() || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
  if (n == "number") return v.is_numeric();
  if (n == "integer") return v.kind == Kind::Int;
  if (n == "float") return v.kind == Kind::Float;
  if (n == "boolean") return v.kind == Kind::Bool;
  if (n == "true") return v.kind == Kind::Bool && v.b;
  if (n == "false") return v.kind == Kind::Bool && !v.b;
  if (n == "callable") return v.kind == Kind::Function;
  if (n == "eq" || n == "equalto" || n == "==") return py_equal(v, arg(0));
  if (n == "ne" || n == "!=") return !py_equal(v, arg(0));
  if (n == "lt" || n == "<") return py_less(v, arg(0));
  if (n == "le" || n == "<=") return !py_less(arg(0), v);
  if (n == "gt" || n == ">") return py_less(arg(0), v);
  if (n == "ge" || n == ">=") return !py_less(v, arg(0));
  if (n == "in") return contains(arg(0), v);
  if (n == "sameas") {
    const Value& o = arg(0);
    if (v.kind != o.kind) return false;
    if (v.kind == Kind::List) return v.list == o.list;
    if (v.kind == Kind::Dict || v.kind == Kind::Namespace) return v.dict == o.dict;
    return py_equal(v, o);
  }
  if (n == "odd" || n == "even" || n == "divisibleby") {
    if (v.kind != Kind::Int && v.kind != Kind::Bool) throw ValueError{"test '" + n + "' needs an integer"};
    const int64_t d = n == "divisibleby" ? int_arg(&arg(0), 1) : 2;
    if (d == 0) throw ValueError{"integer division or modulo by zero"};
    const bool div = v.as_int() % d == 0;
    return n == "odd" ? !div : div;
  }
  if (n == "lower" || n == "upper") {
    const std::string s = py_str(v);
    bool cased = false;
    for (char c : s) {
      if (ascii_alpha(c)) {
        cased = true;
        if ((n == "lower") != (c >= 'a' && c <= 'z')) return false;
      }
    }
    return cased;
  }
  throw ValueError{"not supported yet: test '" + n + "'"};
}

Value apply_filter(const std::string& n, const Value& v, const CallArgs& a) {
  if (n == "length" || n == "count") {
    switch (v.kind) {
      case Kind::Undefined: return Value::integer(0);
      case Kind::String: return Value::integer(int64_t(utf8_decode(v.s).size()));
      case Kind::List: return Value::integer(int64_t(v.list->size()));
      case Kind::Dict: return Value::integer(int64_t(v.dict->items.size()));
      default: throw ValueError{std::string("object of type '") + type_name(v) + "' has no len()"};
    }
  }
  if (n == "default" || n == "d") {
    const Value* d = a.get(0, "default_value");
    const Value* boolean = a.get(1, "boolean");
    if (v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v))) return d ? *d : Value::string("");
    return v;
  }
  if (n == "tojson") {
    // transformers' override: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    JsonDumpOptions o;
    if (const Value* x = a.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*x);
    if (const Value* x = a.get(1, "indent"); x && x->kind != Kind::None) {
      const int64_t ind = int_arg(x, 0);
      if (ind > 1024) throw ValueError{"tojson indent " + std::to_string(ind) + " is above 1024 (the chat template limit)"};
      o.indent = int(ind);
    }
    if (const Value* x = a.get(2, "separators"); x && x->kind != Kind::None) {
      if (x->kind != Kind::List || x->list->size() != 2) throw ValueError{"tojson separators must be a pair"};
      o.item_sep = str_arg((*x->list)[0], "separator");
      o.key_sep = str_arg((*x->list)[1], "separator");
    }
    if (const Value* x = a.get(3, "sort_keys")) o.sort_keys = truthy(*x);
    return Value::string(to_json(v, o));
  }
  if (n == "trim") return Value::string(py_strip(py_str(v), a.get(0, "chars"), true, true));
  if (n == "string") return Value::string(py_str(v));
  if (n == "upper") return Value::string(ascii_case(py_str(v), true));
  if (n == "lower") return Value::string(ascii_case(py_str(v), false));
  if (n == "title") return Value::string(jinja_title(py_str(v)));
  if (n == "capitalize") return Value::string(py_capitalize(py_str(v)));
  if (n == "replace") {
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (!from || !to) throw ValueError{"replace filter needs two arguments"};
    return Value::string(py_replace(py_str(v), py_str(*from), py_str(*to), int_arg(a.get(2, "count"), -1)));
  }
  if (n == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (v.kind != Kind::Dict) throw ValueError{"Can only get item pairs from a mapping."};
    List out;
    for (const auto& kv : v.dict->items) out.push_back(Value::make_list({Value::string(kv.first), kv.second}, true));
    return Value::make_list(std::move(out));
  }
  if (n == "list") return Value::make_list(iterate(v));
  if (n == "first") {
    if (v.is_undefined()) fail_undefined(v);
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (n == "last") {
    if (v.is_undefined()) fail_undefined(v);
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (n == "join") {
    const Value* sep = a.get(0, "d");
    if (a.get(1, "attribute")) throw ValueError{"not supported yet: join(attribute=...)"};
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first && sep) out += py_str(*sep);
      first = false;
      out += py_str(x);
      check_string_size(out.size());
    }
    return Value::string(out);
  }
  if (n == "select" || n == "reject") {
    if (a.pos.empty()) throw ValueError{n + " filter needs a test name"};
    const std::string test = str_arg(a.pos[0], "test name");
    if (!is_known_test(test)) throw ValueError{"not supported yet: test '" + test + "'"};
    CallArgs targs;
    targs.pos.assign(a.pos.begin() + 1, a.pos.end());
    List out;
    for (const Value& x : iterate(v))
      if (apply_test(test, x, targs) == (n == "select")) out.push_back(x);
    return Value::make_list(std::move(out));
  }
  if (n == "int") {
    if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::integer(v.as_int());
    if (v.kind == Kind::Float) {
      if (std::isnan(v.f)) throw ValueError{"cannot convert float NaN to integer"};
      if (!(v.f > -9.2233720368547758e18 && v.f < 9.2233720368547758e18)) int_overflow("int");
      return Value::integer(int64_t(v.f));
    }
    try {
      return Value::integer(std::stoll(py_strip(py_str(v), nullptr, true, true)));
    } catch (...) {
      const Value* d = a.get(0, "default");
      return d ? *d : Value::integer(0);
    }
  }
  if (n == "float") {
    if (v.is_numeric()) return Value::number(v.as_double());
    try {
      return Value::number(std::stod(py_strip(py_str(v), nullptr, true, true)));
    } catch (...) {
      const Value* d = a.get(0, "default");
      return d ? *d : Value::number(0.0);
    }
  }
  if (n == "abs") {
    if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
    if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::integer(std::llabs(v.as_int()));
    throw ValueError{std::string("bad operand type for abs(): '") + type_name(v) + "'"};
  }
  throw ValueError{"not supported yet: filter '" + n + "'"};
}

Value call_method(const Value& obj, const std::string& m, const CallArgs& a) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_string()) {
    const std::string& s = obj.s;
    if (m == "startswith" || m == "endswith") {
      if (a.pos.empty()) throw ValueError{m + "() takes at least 1 argument (0 given)"};
      return Value::boolean(affix_match(s, a.pos[0], m == "startswith"));
    }
    if (m == "strip") return Value::string(py_strip(s, a.get(0, "chars"), true, true));
    if (m == "lstrip") return Value::string(py_strip(s, a.get(0, "chars"), true, false));
    if (m == "rstrip") return Value::string(py_strip(s, a.get(0, "chars"), false, true));
    if (m == "split" || m == "rsplit")
      return str_list(py_split(s, a.get(0, "sep"), int_arg(a.get(1, "maxsplit"), -1), m == "rsplit"));
    if (m == "replace") {
      if (a.pos.size() < 2) throw ValueError{"replace() takes at least 2 arguments"};
      return Value::string(py_replace(s, str_arg(a.pos[0], "replace() argument 1"),
                                      str_arg(a.pos[1], "replace() argument 2"), int_arg(a.get(2, "count"), -1)));
    }
    if (m == "upper") return Value::string(ascii_case(s, true));
    if (m == "lower") return Value::string(ascii_case(s, false));
    if (m == "title") return Value::string(py_title(s));
    if (m == "capitalize") return Value::string(py_capitalize(s));
    if (m == "find" || m == "count") {
      if (a.pos.empty()) throw ValueError{m + "() takes at least 1 argument (0 given)"};
      const std::string sub = str_arg(a.pos[0], "substring");
      if (m == "find") {
        const size_t p = s.find(sub);
        return Value::integer(p == std::string::npos ? -1 : int64_t(utf8_decode(s.substr(0, p)).size()));
      }
      if (sub.empty()) return Value::integer(int64_t(utf8_decode(s).size()) + 1);
      int64_t c = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
      return Value::integer(c);
    }
    if (m == "join") {
      if (a.pos.empty()) throw ValueError{"join() takes exactly one argument (0 given)"};
      std::string out;
      bool first = true;
      for (const Value& x : iterate(a.pos[0])) {
        if (!first) out += s;
        first = false;
        out += str_arg(x, "sequence item");
        check_string_size(out.size());
      }
      return Value::string(out);
    }
    throw ValueError{"not supported yet: str method '" + m + "'"};
  }
  if (obj.kind == Kind::Dict) {
    if (m == "items") return apply_filter("items", obj, {});
    if (m == "keys") return Value::make_list(iterate(obj));
    if (m == "values") {
      List out;
      for (const auto& kv : obj.dict->items) out.push_back(kv.second);
      return Value::make_list(std::move(out));
    }
    if (m == "get") {
      if (a.pos.empty()) throw ValueError{"get expected at least 1 argument, got 0"};
      const Value* hit = a.pos[0].is_string() ? obj.dict->find(a.pos[0].s) : nullptr;
      return hit ? *hit : (a.pos.size() > 1 ? a.pos[1] : Value::none());
    }
    throw ValueError{"not supported yet: dict method '" + m + "'"};
  }
  if (obj.kind == Kind::None) throw ValueError{"'None' has no attribute '" + m + "'"};
  throw ValueError{std::string("not supported yet: ") + type_name(obj) + " method '" + m + "'"};
}

}  // namespace kestrel::chat::detail
