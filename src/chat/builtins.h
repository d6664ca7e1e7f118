// Internal: Python operators, jinja filters and tests, and the str/dict methods
// chat templates call. All of them throw ValueError with Python's wording.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace kestrel::chat::detail {

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Argument `idx` given positionally or as keyword `name`; nullptr when absent.
  const Value* get(size_t idx, const char* name) const;
};

[[noreturn]] void fail_undefined(const Value& v);  // jinja's UndefinedError for an Undefined operand

Value binary_op(const std::string& op, const Value& a, const Value& b);
Value py_slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step);
std::vector<Value> iterate(const Value& v);  // Python iteration: list items, dict keys, string characters
bool contains(const Value& container, const Value& item);  // `item in container`

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args);
bool apply_test(const std::string& name, const Value& v, const CallArgs& args);
Value call_method(const Value& obj, const std::string& name, const CallArgs& args);

}  // namespace kestrel::chat::detail
