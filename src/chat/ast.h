// Internal: tokens and syntax tree of the chat-template engine. Every token and
// node keeps its byte offset in the (newline-normalised) source so errors can
// name the template line and column.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace kestrel::chat::detail {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Text data, name, operator, or the decoded string literal
  size_t pos = 0;
  int64_t ival = 0;
  double fval = 0;
};

// Syntax or lexing error at a source offset; Template::parse turns it into a Status.
struct SourceError {
  size_t pos;
  std::string msg;
};

// Jinja's lexer with transformers' settings (trim_blocks, lstrip_blocks, no
// trailing-newline keeping). `source` must already have its newlines normalised.
std::vector<Token> lex(const std::string& source);

enum class EK {
  Const, Name, GetAttr, GetItem, Slice, Call, Filter, Test, Neg, Pos, Binary, Compare, And, Or, Not, Concat,
  Cond, ListLit, TupleLit, DictLit
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  EK kind;
  size_t pos = 0;
  Value value;                // Const
  std::string name;           // Name, GetAttr attribute, Filter/Test name, Binary operator
  std::vector<ExprPtr> args;  // operands; Slice: obj,start,stop,step (nullptr = omitted); DictLit: k0,v0,k1,v1..
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call/Filter/Test keyword arguments
  std::vector<std::string> ops;  // Compare: operator per extra operand
  bool negated = false;          // Test: `is not`
};

enum class SK { Text, Output, If, For, Set, SetBlock, Break, Continue, Generation };

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  SK kind;
  size_t pos = 0;
  std::string text;                   // Text
  ExprPtr expr;                       // Output, For iterable, Set value
  std::vector<std::string> targets;   // For loop variables, Set/SetBlock names
  std::string ns_attr;                // Set: `{% set ns.attr = ... %}` when non-empty (targets[0] is ns)
  ExprPtr filter;                     // For: `for x in xs if cond`
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body); else body has a null condition
  Body body, else_body;               // For, SetBlock, Generation
};

Body parse(const std::vector<Token>& tokens);

// Names the parser accepts; anything else is a "not supported yet" error at parse time.
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace kestrel::chat::detail
