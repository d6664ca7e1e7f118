// The sandbox limits of a render (issue 20): nesting, string size, loop
// iterations and work are bounded with a message naming the template
// position and the limit, instead of a stack overflow, gigabytes or a hang.
#include <gtest/gtest.h>

#include "chat/template.h"
#include "chat/value.h"

namespace kestrel::chat {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& src, const std::string& ctx = "{}") {
  auto t = Template::parse(src);
  if (!t.is_ok()) return "PARSE ERROR: " + t.status().message();
  auto r = t.value().render(ojson::parse(ctx));
  if (!r.is_ok()) return "ERROR: " + r.status().message();
  return r.value();
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

TEST(ChatLimits, NestingIsBoundedAtParse) {
  // 5000 nested blocks overflowed the stack.
  const std::string deep = repeat("{% if true %}", 5000) + "x" + repeat("{% endif %}", 5000);
  const std::string e = render(deep);
  EXPECT_NE(e.find("PARSE ERROR: chat template line 1, col"), std::string::npos) << e;
  EXPECT_NE(e.find("nested deeper than 500 levels (the chat template limit)"), std::string::npos) << e;
  EXPECT_NE(render("{{ " + repeat("(", 3000) + "1" + repeat(")", 3000) + " }}").find("nested deeper"), std::string::npos);
  EXPECT_NE(render("{{ 1" + repeat(" + 1", 20000) + " }}").find("nested deeper"), std::string::npos);
  EXPECT_NE(render("{{ x" + repeat("|trim", 5000) + " }}").find("nested deeper"), std::string::npos);
  // What real templates nest stays fine.
  EXPECT_EQ(render(repeat("{% if true %}", 30) + "ok" + repeat("{% endif %}", 30)), "ok");
  EXPECT_EQ(render("{{ " + repeat("(", 20) + "1" + repeat(")", 20) + " }}"), "1");
}

TEST(ChatLimits, StringSizeIsBounded) {
  // Reached 4.2 GB in 10 s.
  const std::string e = render("{{ \"x\" * 1000000000 }}");
  EXPECT_NE(e.find("ERROR: chat template line 1, col "), std::string::npos) << e;
  EXPECT_NE(e.find(": a string of 1000000000 bytes exceeds the chat template limit of 16 MiB"), std::string::npos) << e;
  EXPECT_NE(render("{{ 'ab' * 9223372036854775807 }}").find("exceeds the chat template limit"), std::string::npos);
  EXPECT_NE(render("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
                   "{% endfor %}").find("exceeds the chat template limit of 16 MiB"), std::string::npos);
  EXPECT_NE(render("{{ ('x' * 60000000) | replace('x', 'yy') }}").find("exceeds"), std::string::npos);
  EXPECT_EQ(render("{{ 'ab' * 3 }}{{ 'x' * -1 }}"), "ababab");
}

TEST(ChatLimits, LoopIterationsAreBounded) {
  // Nested loops ran forever.
  const std::string e = render("{% for a in range(100000) %}{% for b in range(100000) %}.{% endfor %}{% endfor %}");
  EXPECT_NE(e.find("ERROR: chat template line 1, col"), std::string::npos) << e.substr(0, 200);
  EXPECT_NE(e.find("loop iterations in one render (the chat template limit"), std::string::npos) << e.substr(0, 200);
}

TEST(ChatLimits, QuadraticGrowthIsBounded) {
  const std::string e = render("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i, i] %}"
                               "{% endfor %}{{ ns.l|length }}");
  EXPECT_NE(e.find("items and string chunks in one render (the chat template limit"), std::string::npos) << e;
}

TEST(ChatLimits, ValueDepthAndCycles) {
  const std::string e = render("{% set ns = namespace(l=[]) %}{% for i in range(2000) %}{% set ns.l = [ns.l] %}"
                               "{% endfor %}{{ ns.l }}");
  EXPECT_NE(e.find("nested deeper than 512 levels (the chat template limit)"), std::string::npos) << e;
  EXPECT_NE(render("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}")
                .find("not supported yet: storing a namespace() object inside a namespace"), std::string::npos);
  EXPECT_NE(render("{% set ns = namespace(a=1) %}{% set ns.a = [1, {'k': ns}] %}")
                .find("storing a namespace() object inside a namespace"), std::string::npos);
  // Context data deeper than the limit is refused, not recursed into.
  const std::string deep_ctx = "{\"m\": " + repeat("[", 600) + repeat("]", 600) + "}";
  auto t = Template::parse("{{ m }}");
  ASSERT_TRUE(t.is_ok());
  auto r = t.value().render(ojson::parse(deep_ctx));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("JSON data nested deeper than 512 levels"), std::string::npos);
}

TEST(ChatLimits, IntegerOverflowIsAnError) {
  EXPECT_NE(render("{{ 9223372036854775807 + 1 }}").find("integer overflow in '+'"), std::string::npos);
  EXPECT_NE(render("{{ 2 ** 1000000000000 }}").find("integer overflow in '**'"), std::string::npos);  // was a 10^12 loop
  EXPECT_EQ(render("{{ 1 ** 1000000000000 }} {{ (-1) ** 1000000000001 }} {{ 2 ** 10 }} {{ 3 ** 0 }}"), "1 -1 1024 1");
  EXPECT_NE(render("{{ (-9223372036854775807 - 1) // -1 }}").find("integer overflow in '//'"), std::string::npos);
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }} {{ -7 // 2 }} {{ -7 % 2 }}"), "0 -4 1");
  EXPECT_NE(render("{{ -(-9223372036854775807 - 1) }}").find("integer overflow in unary '-'"), std::string::npos);
  EXPECT_NE(render("{{ (10.0 ** 300) | int }}").find("integer overflow in 'int'"), std::string::npos);
  EXPECT_NE(render("{{ [1] | tojson(indent=100000000) }}").find("tojson indent 100000000 is above 1024"),
            std::string::npos);
}

}  // namespace
}  // namespace kestrel::chat
