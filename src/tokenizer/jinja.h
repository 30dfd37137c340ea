// A small Jinja2 interpreter for chat templates, matching Jinja2 as transformers configures it for
// apply_chat_template: trim_blocks, lstrip_blocks, loop controls, an immutable sandbox (lists and
// dicts cannot be modified; namespace() attributes can), `tojson` = json.dumps(ensure_ascii=False).
//
// Covered: {{ }}, {% if/elif/else %}, {% for %} (tuple targets, `if` filter, else, loop.index0/
// index/first/last/length/revindex/previtem/nextitem), {% set %} (names, ns.attr, tuples, blocks),
// {% break %}/{% continue %}, {% generation %}, comments, whitespace control (- and +); expressions
// with Python semantics (literals, lists, dicts, tuples, attribute/item access, slicing, calls,
// `a if c else b`, and/or/not, comparisons, in/not in, + - * / // % ** ~); string methods
// (startswith, endswith, split, rsplit, strip, lstrip, rstrip, upper, lower, title, capitalize,
// replace, find, rfind, count, join, isdigit, isalpha, isspace...), dict items/keys/values/get,
// common filters (tojson, length, trim, string, default, join, first, last, list, items, ...) and
// tests (defined, none, string, number, mapping, sequence, true, false, ...), and the globals
// range, namespace, dict, raise_exception and strftime_now. Macros, includes and template
// inheritance are not supported: parse() rejects them with a clear error.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/py_value.h"

namespace tf::tok::jinja {

class Template {
 public:
  [[nodiscard]] static Result<Template> parse(std::string_view source);
  // Renders with `vars` as the template's global variables. Template errors (undefined attribute
  // access, type errors, raise_exception(...)) come back as an InvalidArgument status.
  [[nodiscard]] Result<std::string> render(const Dict& vars) const;

  struct Program;

 private:
  explicit Template(std::shared_ptr<const Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace tf::tok::jinja
