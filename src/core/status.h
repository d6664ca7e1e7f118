// Error handling: Status/Result for expected failures (bad files, bad config),
// kestrel::Error exceptions for broken invariants and at API boundaries.
// Library code never exits; main() decides.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace kestrel {

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// The one exception type the library throws. what() is a complete sentence for the user.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string msg) { Status s; s.ok_ = false; s.msg_ = std::move(msg); return s; }
  bool is_ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const std::string& message() const { return msg_; }
  // Prefix the message with where it happened ("model/config.json: ...").
  Status with_context(const std::string& ctx) const {
    return ok_ ? *this : error(ctx + ": " + msg_);
  }
  void throw_if_error() const { if (!ok_) throw Error(msg_); }

 private:
  bool ok_ = true;
  std::string msg_;
};

template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}                   // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {             // NOLINT
    if (std::get<Status>(v_).is_ok()) throw Error("Result constructed from an OK status without a value");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  void check() const { if (!is_ok()) throw Error(std::get<Status>(v_).message()); }
  std::variant<T, Status> v_;
};

}  // namespace kestrel

// KS_CHECK(cond, parts...): throws kestrel::Error("file:line: parts...") when cond is false.
#define KS_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      throw ::kestrel::Error(::kestrel::detail::concat(__FILE__, ":", __LINE__, ": check `", \
                                                       #cond, "` failed: " __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// KS_FAIL(parts...): user-facing error without source location noise.
#define KS_FAIL(...) throw ::kestrel::Error(::kestrel::detail::concat(__VA_ARGS__))

// KS_ERR(parts...): builds an error Status.
#define KS_ERR(...) ::kestrel::Status::error(::kestrel::detail::concat(__VA_ARGS__))

// KS_TRY(expr): returns the Status of expr from the enclosing function when it failed.
#define KS_TRY(expr)                                   \
  do {                                                 \
    ::kestrel::Status _ks_st = (expr);                 \
    if (!_ks_st.is_ok()) return _ks_st;                \
  } while (0)

// KS_ASSIGN(lhs, result_expr): unwraps a Result or returns its Status.
#define KS_CONCAT_INNER(a, b) a##b
#define KS_CONCAT(a, b) KS_CONCAT_INNER(a, b)
#define KS_ASSIGN(lhs, rexpr) KS_ASSIGN_IMPL(KS_CONCAT(_ks_r_, __LINE__), lhs, rexpr)
#define KS_ASSIGN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                   \
  if (!tmp.is_ok()) return tmp.status(); \
  lhs = std::move(tmp).value()

#ifdef KESTREL_CHECKS
#define KS_DCHECK(cond, ...) KS_CHECK(cond __VA_OPT__(, ) __VA_ARGS__)
#else
#define KS_DCHECK(cond, ...) do { } while (0)
#endif
