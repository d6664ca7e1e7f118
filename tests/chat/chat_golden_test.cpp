// Byte-exact comparison with transformers' apply_chat_template for every case in
// tests/golden/chat/golden.json (written by tests/golden/chat/make_chat_golden.py).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "chat/template.h"
#include "common/testing.h"

namespace kestrel::chat {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Position of the first differing byte, with some context, for readable failures.
std::string first_diff(const std::string& got, const std::string& want) {
  size_t k = 0;
  while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
  const size_t b = k > 40 ? k - 40 : 0;
  return "first difference at byte " + std::to_string(k) + "\n  got:  ..." + got.substr(b, 80) +
         "\n  want: ..." + want.substr(b, 80);
}

TEST(ChatGolden, MatchesTransformersByteForByte) {
  const ojson golden = ojson::parse(read_file(testing::source_path("tests/golden/chat/golden.json")));
  const auto& now_v = golden["now"];
  std::tm now{};
  now.tm_year = now_v[0].get<int>() - 1900;
  now.tm_mon = now_v[1].get<int>() - 1;
  now.tm_mday = now_v[2].get<int>();
  now.tm_hour = now_v[3].get<int>();
  now.tm_min = now_v[4].get<int>();
  now.tm_sec = now_v[5].get<int>();
  std::mktime(&now);  // fills tm_wday / tm_yday for %a / %j
  RenderOptions opt;
  opt.now = now;

  std::map<std::string, Template> templates;
  for (auto it = golden["template_family"].begin(); it != golden["template_family"].end(); ++it) {
    auto t = Template::parse(read_file(testing::source_path("tests/golden/chat/templates/" + it.key() + ".jinja")));
    ASSERT_TRUE(t.is_ok()) << it.key() << ": " << t.status().message();
    templates.emplace(it.key(), std::move(t).value());
  }

  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const std::string tname = c["template"].get<std::string>();
    ojson extra = golden["special_tokens"][golden["template_family"][tname].get<std::string>()];
    for (auto it = c["extra"].begin(); it != c["extra"].end(); ++it) extra[it.key()] = it.value();
    auto got = apply_chat_template(templates.at(tname), c["messages"], c["add_generation_prompt"].get<bool>(), extra, opt);
    if (c.contains("error")) {
      EXPECT_FALSE(got.is_ok()) << name << ": transformers failed with " << c["error"] << " but we rendered:\n"
                                << (got.is_ok() ? got.value() : "");
      if (!got.is_ok()) {
        EXPECT_NE(got.status().message().find("chat template line"), std::string::npos) << got.status().message();
      }
    } else {
      ASSERT_TRUE(got.is_ok()) << name << ": " << got.status().message();
      const std::string want = c["expected"].get<std::string>();
      EXPECT_EQ(got.value(), want) << name << "\n" << first_diff(got.value(), want);
    }
    ++checked;
  }
  EXPECT_GE(checked, 100);
}

TEST(ChatGolden, RaiseExceptionMessageReachesTheCaller) {
  auto t = Template::parse(read_file(testing::source_path("tests/golden/chat/templates/llama3_3.jinja")));
  ASSERT_TRUE(t.is_ok());
  ojson msgs = ojson::parse(R"([{"role":"system","content":"s"}])");
  ojson extra = ojson::parse(R"({"tools":[{"type":"function","function":{"name":"f"}}],"bos_token":"<s>"})");
  auto r = apply_chat_template(t.value(), msgs, false, extra);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "chat template line 52, col 13: the template raised an exception: Cannot put tools in the first user "
            "message when there's no first user message!");
}

}  // namespace
}  // namespace kestrel::chat
