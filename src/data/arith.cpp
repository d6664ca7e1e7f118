#include "data/arith.h"

#include <filesystem>
#include <sstream>

#include "core/files.h"
#include "core/rng.h"

namespace kestrel::data {

namespace {

struct Person {
  const char* name;
  const char* subj;  // he / she
  const char* obj;   // him / her
};
constexpr Person kPeople[] = {
    {"Tom", "he", "him"},     {"Anna", "she", "her"},   {"Ben", "he", "him"},    {"Mia", "she", "her"},
    {"Sam", "he", "him"},     {"Lily", "she", "her"},   {"Jack", "he", "him"},   {"Emma", "she", "her"},
    {"Leo", "he", "him"},     {"Sara", "she", "her"},   {"Max", "he", "him"},    {"Nora", "she", "her"},
    {"Luke", "he", "him"},    {"Zoe", "she", "her"},    {"Omar", "he", "him"},   {"Ruth", "she", "her"},
};
constexpr const char* kFriends[] = {"a friend", "his sister", "her brother", "a neighbor", "the teacher", "a classmate"};
constexpr const char* kObjects[] = {"apples", "marbles", "stickers", "pencils", "books", "cookies", "stamps",
                                    "coins",  "shells",  "cards",    "balloons", "candies", "toys", "eggs"};
constexpr const char* kBoxes[] = {"boxes", "bags", "packs", "jars"};

template <class T, size_t N>
constexpr size_t count_of(const T (&)[N]) { return N; }

// Draws from one problem's own Philox stream: (seed, split, index) -> numbers.
class Draw {
 public:
  Draw(uint64_t seed, ArithSplit split, uint64_t index)
      : rng_{seed, (uint64_t(split) << 48) ^ index} {}
  // Uniform integer in [lo, hi].
  int64_t range(int64_t lo, int64_t hi) {
    const double u = rng_.uniform_double(counter_++);
    return lo + std::min<int64_t>(hi - lo, int64_t(u * double(hi - lo + 1)));
  }

 private:
  Philox rng_;
  uint64_t counter_ = 0;
};

std::string cap(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = char(s[0] - 'a' + 'A');
  return s;
}

}  // namespace

ArithProblem arith_problem(const ArithOptions& opt, ArithSplit split, uint64_t index) {
  KS_CHECK(opt.min_steps >= 1 && opt.max_steps >= opt.min_steps, "arith: steps must satisfy 1 <= min <= max");
  KS_CHECK(opt.max_operand >= 2 && opt.max_mul_operand >= 2, "arith: operand ranges too small");
  Draw d(opt.seed, split, index);
  const Person& p = kPeople[d.range(0, count_of(kPeople) - 1)];
  const std::string obj = kObjects[d.range(0, count_of(kObjects) - 1)];
  const std::string name = p.name;
  const int steps = int(d.range(opt.min_steps, opt.max_steps));
  int64_t x = d.range(1, opt.max_operand);

  std::ostringstream q, s;
  q << name << " has " << x << " " << obj << ".";
  s << name << " starts with " << x << " " << obj << ".\n";
  for (int i = 0; i < steps; ++i) {
    // Subtraction only when something can be taken away; multiplication optional.
    const int kinds = opt.allow_mul ? 3 : 2;
    int kind = int(d.range(0, kinds - 1));
    if (kind == 1 && x < 2) kind = 0;
    if (kind == 0) {
      const int64_t b = d.range(1, opt.max_operand);
      const int64_t y = x + b;
      switch (d.range(0, 2)) {
        case 0: q << " " << cap(p.subj) << " buys " << b << " more " << obj << "."; break;
        case 1: q << " " << cap(kFriends[d.range(0, count_of(kFriends) - 1)]) << " gives " << p.obj << " " << b << " " << obj << "."; break;
        default: q << " " << cap(p.subj) << " finds " << b << " more " << obj << "."; break;
      }
      s << "After getting " << b << " more, " << name << " has " << x << " + " << b << " = " << y << " " << obj << ".\n";
      x = y;
    } else if (kind == 1) {
      const int64_t b = d.range(1, std::min<int64_t>(x, opt.max_operand));
      const int64_t y = x - b;
      switch (d.range(0, 2)) {
        case 0: q << " " << cap(p.subj) << " gives " << b << " " << obj << " to " << kFriends[d.range(0, count_of(kFriends) - 1)] << "."; break;
        case 1: q << " " << cap(p.subj) << " loses " << b << " " << obj << "."; break;
        default: q << " " << cap(p.subj) << " sells " << b << " " << obj << "."; break;
      }
      s << "After losing " << b << ", " << name << " has " << x << " - " << b << " = " << y << " " << obj << ".\n";
      x = y;
    } else {
      const std::string box = kBoxes[d.range(0, count_of(kBoxes) - 1)];
      const int64_t b = d.range(2, opt.max_mul_operand), c = d.range(2, opt.max_mul_operand);
      const int64_t prod = b * c, y = x + prod;
      q << " " << cap(p.subj) << " gets " << b << " " << box << " with " << c << " " << obj << " in each.";
      s << b << " " << box << " with " << c << " each hold " << b << " * " << c << " = " << prod << " " << obj << ".\n";
      s << "So " << name << " has " << x << " + " << prod << " = " << y << " " << obj << ".\n";
      x = y;
    }
  }
  q << " How many " << obj << " does " << name << " have now?";
  s << "#### " << x;
  return ArithProblem{q.str(), s.str(), x, steps};
}

std::string arith_user_prompt(const ArithProblem& p) {
  return p.question + " Let's think step by step and output the final answer after \"####\".";
}

nlohmann::ordered_json arith_rl_row(const ArithProblem& p, ArithSplit split, uint64_t index) {
  nlohmann::ordered_json row;
  row["data_source"] = "arith";
  row["prompt"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", arith_user_prompt(p)}}});
  row["ability"] = "math";
  row["reward_model"] = {{"style", "rule"}, {"ground_truth", std::to_string(p.answer)}};
  row["extra_info"] = {{"split", split == ArithSplit::Train ? "train" : "test"},
                       {"index", index},
                       {"answer", p.solution},
                       {"question", p.question}};
  return row;
}

nlohmann::ordered_json arith_sft_row(const ArithProblem& p) {
  nlohmann::ordered_json row;
  row["data_source"] = "arith";
  row["prompt"] = arith_user_prompt(p);
  row["response"] = p.solution;
  row["reward_model"] = {{"style", "rule"}, {"ground_truth", std::to_string(p.answer)}};
  return row;
}

Status write_arith_dataset(const std::string& dir, int64_t n_train, int64_t n_test, const ArithOptions& opt) {
  // Each split is built in memory and written atomically (~600 bytes a
  // problem for its two files): 10^10 problems grew ~70 MB/s until memory ran out.
  constexpr int64_t kMaxProblems = 1'000'000;
  for (auto [n, key] : {std::pair{n_train, "num_train"}, std::pair{n_test, "num_test"}})
    if (n < 0 || n > kMaxProblems)
      return KS_ERR("builtin arith: ", key, " = ", n, " is out of range [0, ", kMaxProblems, "] (data.arith.", key,
                    ", or --", key == std::string("num_train") ? "num-train" : "num-test", " of kestrel builtin arith)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return KS_ERR(dir, ": cannot create the folder: ", ec.message());
  for (ArithSplit split : {ArithSplit::Train, ArithSplit::Test}) {
    const int64_t n = split == ArithSplit::Train ? n_train : n_test;
    std::string rl, sft;
    for (int64_t i = 0; i < n; ++i) {
      const ArithProblem p = arith_problem(opt, split, uint64_t(i));
      rl += arith_rl_row(p, split, uint64_t(i)).dump() + "\n";
      sft += arith_sft_row(p).dump() + "\n";
    }
    const std::string base = split == ArithSplit::Train ? "train.jsonl" : "test.jsonl";
    KS_TRY(write_file_atomic(dir + "/" + base, rl));
    KS_TRY(write_file_atomic(dir + "/sft_" + base, sft));
  }
  return Status::ok();
}

}  // namespace kestrel::data
