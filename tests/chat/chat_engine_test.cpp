// Unit tests of the template engine: expressions, whitespace control, scoping,
// filters/tests/methods, and every error message. Expected strings were checked
// against jinja2 3.1 under transformers' environment.
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

TEST(ChatEngine, LiteralsAndPrinting) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}"), "[1, 'a', None, True, 1.5, {'k': 'v'}]");
  EXPECT_EQ(render("{{ none }}|{{ undefined_x }}|{{ true }}|{{ False }}"), "None||True|False");
  EXPECT_EQ(render("{{ (1, 2) }} {{ (1,) }} {{ () }}"), "(1, 2) (1,) ()");
  EXPECT_EQ(render("{{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}"), "it's [\"it's\", 'q\"']");
  EXPECT_EQ(render("{{ 'a' 'b' }}"), "ab");
  EXPECT_EQ(render("{{ '\\u00e9\\x41\\n' }}"), "\xc3\xa9" "A\n");
}

TEST(ChatEngine, Arithmetic) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e20 }} {{ 0.1+0.2 }} {{ 1e-5 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4/2 }}"),
            "1.0 1e+20 0.30000000000000004 1e-05 3 -4 2 3.5 2.0");
  EXPECT_EQ(render("{{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -3 + 1 }} {{ 'ab' * 2 }} {{ true + 1 }}"),
            "1024 7 9 -2 abab 2");
  EXPECT_EQ(render("{{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ u }}"), "[1, 2] a1None");
  EXPECT_EQ(render("{{ 123456789.0 * 1000000000 }} {{ 0.5 }} {{ 100.0 }}"), "1.23456789e+17 0.5 100.0");
}

TEST(ChatEngine, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1] }} {{ (1,) == [1] }} {{ 'a' != 'b' }}"),
            "True True True False True");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'b' >= 'a' }}"), "True False True");
  EXPECT_EQ(render("{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}"),
            "True True True True");
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not none }} {{ '' or [] }}"), "x y True []");
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}|{{ 'a' if x }}|", R"({"x": 0})"), "b||");
  EXPECT_EQ(render("{{ 1 if true else 2 if false else 3 }}"), "1");
}

TEST(ChatEngine, SubscriptsAndSlices) {
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ 'h\xc3\xa9llo'[1:3] }} {{ [1,2,3][-1] }} {{ [1,2][5] }}|"),
            "cba \xc3\xa9l 3 |");
  EXPECT_EQ(render("{{ x[1:] }} {{ x[:-1] }} {{ x[::2] }} {{ x[-2:] }} {{ x[5:] }}", R"({"x": [1,2,3,4]})"),
            "[2, 3, 4] [1, 2, 3] [1, 3] [3, 4] []");
  EXPECT_EQ(render("{{ m.role }} {{ m['role'] }} {{ m.missing is defined }} {{ l.0 }}",
                   R"({"m": {"role": "user"}, "l": ["z"]})"),
            "user user False z");
}

TEST(ChatEngine, WhitespaceControl) {
  // trim_blocks eats the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {{- 'b' -}}\n  c"), "abc");
  EXPECT_EQ(render("x {{ 'y' }}\n z"), "x y\n z");         // variable tags never trim
  EXPECT_EQ(render("  {# c #}\nx"), "x");                  // comments strip like blocks
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");  // `+` keeps leading space
  EXPECT_EQ(render("line\r\n{% if true %}\r\nx\r\n{% endif %}\r\n"), "line\nx\n");  // newlines normalised, last dropped
}

TEST(ChatEngine, LoopsAndScoping) {
  EXPECT_EQ(render("{% for i in [5,6,7] %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }};"
                   "{% endfor %}"),
            "01TrueFalse3;12FalseFalse3;23FalseTrue3;");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{k}}={{v}};{% endfor %}{% for k, v in d|items %}{{k}}{% endfor %}",
                   R"({"d": {"z": 1, "a": 2}})"),
            "z=1;a=2;za");
  EXPECT_EQ(render("{% for i in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for i in [1,2,3,4] if i is even %}{{ i }}{{ loop.length }}{% endfor %}"), "2242");
  // set inside a loop is per iteration and does not leak; namespaces carry state out.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1,2] %}{{x}}{% set x = x + 10 %}{{x}};{% endfor %}{{x}}"), "111;111;1");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
                   "{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% set a, b = 1, 'two' %}{{ b }}{{ a }}"), "two1");
  EXPECT_EQ(render("{% set blk %}x{{ 1 + 1 }}{% endset %}[{{ blk }}]"), "[x2]");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(ChatEngine, Tests) {
  EXPECT_EQ(render("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ x is not none }}",
                   R"({"x": 1, "n": null})"),
            "True False True True True");
  EXPECT_EQ(render("{{ 's' is string }} {{ d is mapping }} {{ l is iterable }} {{ 's' is sequence }} {{ 1 is iterable }}",
                   R"({"d": {}, "l": []})"),
            "True True True True False");
  EXPECT_EQ(render("{{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ '1' is number }}"),
            "True True True False");
  EXPECT_EQ(render("{{ false is false }} {{ 0 is false }} {{ true is true }} {{ 1 is true }}"), "True False True False");
  EXPECT_EQ(render("{{ u is iterable }} {{ u is sequence }} {{ u is mapping }}"), "True True False");  // jinja's Undefined
  EXPECT_EQ(render("{{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 2 is in [1, 2] }} {{ 'a' is eq('a') }}"),
            "True True True True");
}

TEST(ChatEngine, Filters) {
  EXPECT_EQ(render("{{ 'h\xc3\xa9' | length }} {{ [1,2] | count }} {{ u | length }} {{ {'a': 1} | length }}"), "2 2 0 1");
  EXPECT_EQ(render("[{{ '  x \n' | trim }}] [{{ 'xxaxx' | trim('x') }}]"), "[x] [a]");
  EXPECT_EQ(render("{{ 'Hello World' | upper }} {{ 'ABC' | lower }} {{ 'they\\'re bill-o' | title }} {{ 'hI' | capitalize }}"),
            "HELLO WORLD abc They're Bill-O Hi");
  EXPECT_EQ(render("{{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ [1, 'a'] | join(', ') }} {{ 'abc' | list }}"),
            "1 3 1, a ['a', 'b', 'c']");
  EXPECT_EQ(render("{{ u | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('x') }}"),
            "d  d None");
  EXPECT_EQ(render("{{ 'aaa' | replace('a', 'b', 2) }} {{ 5 | string ~ '!' }} {{ '42' | int + 1 }} {{ -3 | abs }}"),
            "bba 5! 43 3");
  EXPECT_EQ(render("{{ ['a', 'b', 'c'] | reject('equalto', 'b') | join(',') }} {{ [1,2,3] | select('odd') | list }}"),
            "a,c [1, 3]");
}

TEST(ChatEngine, ToJsonMatchesPythonJsonDumps) {
  const std::string ctx = R"({"x": {"a": [1, 2.5, "\u00e9\n\"", null, true], "b": {}, "c": []}})";
  EXPECT_EQ(render("{{ x | tojson }}", ctx), "{\"a\": [1, 2.5, \"\xc3\xa9\\n\\\"\", null, true], \"b\": {}, \"c\": []}");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", R"({"x": {"a": [1, {"c": []}], "b": {}}})"),
            "{\n  \"a\": [\n    1,\n    {\n      \"c\": []\n    }\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ x | tojson(ensure_ascii=true) }}", R"({"x": "\u00e9\ud83d\ude80"})"), "\"\\u00e9\\ud83d\\ude80\"");
  EXPECT_EQ(render("{{ x | tojson(sort_keys=true) }}", R"({"x": {"b": 1, "a": 2}})"), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(render("{{ x | tojson(separators=(',', ':')) }}", R"({"x": {"a": [1, 2]}})"), "{\"a\":[1,2]}");
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": [1e20, 1e-7, 0.1, 3.0, -0.0]})"), "[1e+20, 1e-07, 0.1, 3.0, -0.0]");
}

TEST(ChatEngine, StringMethods) {
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }}"),
            "True True ABC abc");
  EXPECT_EQ(render("[{{ '\n x \n'.strip() }}][{{ '\nx\n'.lstrip('\n') }}][{{ 'x\n\n'.rstrip('\n') }}]"), "[x][x\n][x]");
  EXPECT_EQ(render("{{ ' a b  '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a b c'.split(none, 1) }}"),
            "['a', 'b'] ['a', 'b', '', 'c'] ['a,b', 'c'] ['a', 'b c']");
  EXPECT_EQ(render("{{ 'x</think>y'.split('</think>')[-1] }} {{ 'aXbX'.replace('X', '-') }} {{ 'hello world'.title() }}"),
            "y a-b- Hello World");
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys() | list }} {{ d.values() | list }}", R"({"d": {"a": 1}})"),
            "1 0 ['a'] [1]");
  EXPECT_EQ(render("{{ ', '.join(['a', 'b']) }} {{ 'banana'.count('a') }} {{ 'banana'.find('n') }}"), "a, b 3 2");
}

TEST(ChatEngine, GlobalsAndUndefinedSemantics) {
  EXPECT_EQ(render("{{ strftime_now is defined }} {{ namespace(a=1).a }} {{ dict(a=1, b=2) }} {{ range(3) | list }}"),
            "True 1 {'a': 1, 'b': 2} [0, 1, 2]");
  EXPECT_EQ(render("{% for x in u %}no{% endfor %}{{ u | trim }}{{ 'x' if not u }}{{ u == u }}"), "xTrue");
  auto t = Template::parse("{{ strftime_now('%d %b %Y %H:%M') }}");
  ASSERT_TRUE(t.is_ok());
  RenderOptions opt;
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 9;
  tm.tm_min = 5;
  opt.now = tm;
  EXPECT_EQ(t.value().render(nlohmann::json::object(), opt).value(), "26 Jul 2024 09:05");
}

TEST(ChatEngine, PlainJsonContextSortsKeys) {
  auto t = Template::parse("{{ x | tojson }}");
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t.value().render(nlohmann::json::parse(R"({"x": {"b": 1, "a": 2}})")).value(), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(t.value().render(ojson::parse(R"({"x": {"b": 1, "a": 2}})")).value(), "{\"b\": 1, \"a\": 2}");
}

TEST(ChatEngine, ApplyChatTemplateNormalisesMessages) {
  auto t = Template::parse("{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ tools }}|{{ add_generation_prompt }}|{{ bos_token }}");
  ASSERT_TRUE(t.is_ok());
  ojson msgs = ojson::parse(R"([{"role": "assistant", "content": "c", "name": null, "reasoning": "r"}])");
  auto r = apply_chat_template(t.value(), msgs, true, ojson::parse(R"({"bos_token": "<s>"})"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value(),
            "{\"thinking\": \"r\", \"role\": \"assistant\", \"content\": \"c\", \"reasoning\": \"r\", "
            "\"reasoning_content\": \"r\"}\nNone|True|<s>");
  EXPECT_FALSE(apply_chat_template(t.value(), ojson::array(), false).is_ok());
  EXPECT_FALSE(apply_chat_template(t.value(), ojson::parse("[1]"), false).is_ok());
}

// ---- error messages ----

TEST(ChatEngineErrors, UnsupportedConstructsNameTheConstructAndPosition) {
  EXPECT_EQ(render("hello\n{{ x |\n wordwrap }}"), "PARSE ERROR: chat template line 3, col 2: not supported yet: filter 'wordwrap'");
  EXPECT_EQ(render("{% if x is divisible %}{% endif %}"), "PARSE ERROR: chat template line 1, col 12: not supported yet: test 'divisible'");
  EXPECT_EQ(render("a\n  {% macro m() %}{% endmacro %}"), "PARSE ERROR: chat template line 2, col 6: not supported yet: tag 'macro'");
  EXPECT_EQ(render("{% include 'x' %}"), "PARSE ERROR: chat template line 1, col 4: not supported yet: tag 'include'");
  EXPECT_EQ(render("{% for x in y recursive %}{% endfor %}"), "PARSE ERROR: chat template line 1, col 15: not supported yet: recursive for loops");
  EXPECT_EQ(render("{{ f(*a) }}"), "PARSE ERROR: chat template line 1, col 6: not supported yet: *args / **kwargs in calls");
  EXPECT_EQ(render("{{ 'abc'.zfill(5) }}"), "ERROR: chat template line 1, col 9: not supported yet: str method 'zfill'");
  EXPECT_EQ(render("{{ foo() }}"), "ERROR: chat template line 1, col 4: 'foo' is undefined");
}

TEST(ChatEngineErrors, SyntaxErrors) {
  EXPECT_EQ(render("{% if x %}a"), "PARSE ERROR: chat template line 1, col 12: unexpected end of template, expected '{% endif %}'");
  EXPECT_EQ(render("{% endfor %}"), "PARSE ERROR: chat template line 1, col 4: unknown tag 'endfor'");
  EXPECT_EQ(render("{{ x"), "PARSE ERROR: chat template line 1, col 1: unexpected end of template, expected '}}'");
  EXPECT_EQ(render("{# x"), "PARSE ERROR: chat template line 1, col 1: missing end of comment tag '#}'");
  EXPECT_EQ(render("{{ 'x }}"), "PARSE ERROR: chat template line 1, col 4: unterminated string literal");
  EXPECT_EQ(render("{{ a ? b }}"), "PARSE ERROR: chat template line 1, col 6: unexpected character '?' inside a tag");
  EXPECT_EQ(render("{{ [1, 2 }}"), "PARSE ERROR: chat template line 1, col 1: unexpected end of template, expected '}}'");
  EXPECT_EQ(render("{% set %}"), "PARSE ERROR: chat template line 1, col 8: expected a name, got end of statement block '%}'");
}

TEST(ChatEngineErrors, MalformedTemplatesFailCleanly) {
  for (const char* src : {"{{", "{%", "{#", "{{ x[", "{{ x.", "{% for %}", "{% for x in %}", "{% if %}", "{{ (1, }}",
                          "{{ {1: }}", "{{ x | }}", "{{ x is }}", "{% set x = %}", "{% else %}", "{{ 'a\\' }}", "{{ f(a=) }}"}) {
    auto t = Template::parse(src);
    if (t.is_ok()) {
      auto r = t.value().render(ojson::object());
      EXPECT_FALSE(r.is_ok()) << src;
    } else {
      EXPECT_EQ(t.status().message().rfind("chat template line ", 0), 0u) << src << ": " << t.status().message();
    }
  }
}

TEST(ChatEngineErrors, RuntimeErrorsFollowJinja) {
  EXPECT_EQ(render("{{ foo.bar }}"), "ERROR: chat template line 1, col 7: 'foo' is undefined");
  EXPECT_EQ(render("{{ d.bar.baz }}", R"({"d": {}})"), "ERROR: chat template line 1, col 9: 'dict object' has no attribute 'bar'");
  EXPECT_EQ(render("{{ 'a' + u }}"), "ERROR: chat template line 1, col 8: 'u' is undefined");
  EXPECT_EQ(render("\n  {{ 'a' + 1 }}"), "ERROR: chat template line 2, col 10: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(render("{{ 1 // 0 }}"), "ERROR: chat template line 1, col 6: integer division or modulo by zero");
  EXPECT_EQ(render("{{ 1 < 'a' }}"), "ERROR: chat template line 1, col 4: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(render("{{ u | tojson }}"), "ERROR: chat template line 1, col 8: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(render("{{ 5 | length }}"), "ERROR: chat template line 1, col 8: object of type 'int' has no len()");
  EXPECT_EQ(render("{% for a, b in [[1]] %}{% endfor %}"), "ERROR: chat template line 1, col 4: not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(render("{% set x.y = 1 %}", R"({"x": {}})"),
            "ERROR: chat template line 1, col 4: cannot assign attribute 'y' on 'x': it is not a namespace() object");
  EXPECT_EQ(render("{{ raise_exception('bad roles') }}"), "ERROR: chat template line 1, col 4: the template raised an exception: bad roles");
  EXPECT_EQ(render("{{ none.strip() }}"), "ERROR: chat template line 1, col 8: 'None' has no attribute 'strip'");
}

TEST(ChatValue, PythonFloatRepr) {
  EXPECT_EQ(py_float_repr(1.0), "1.0");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(123456789012345.6), "123456789012345.6");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(0.00001), "1e-05");
  EXPECT_EQ(py_float_repr(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(py_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
}

}  // namespace
}  // namespace kestrel::chat
