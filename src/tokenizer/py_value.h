// Values of the chat-template interpreter, with Python's semantics where a template can see them:
// str() and repr() of every type, json.dumps (what transformers' `tojson` filter calls),
// truthiness, equality and ordering. Strings are UTF-8; lists and dicts have reference semantics
// (shared), as in Python; dicts keep insertion order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tf::tok::jinja {

// Raised inside the interpreter for template errors; Template::render turns it into a Status.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;
using List = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(std::vector<Value>& args, KwArgs& kwargs)>;

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // keys: strings, ints, bools or None
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(__int128 i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(List items = {});
  static Value tuple(List items);  // a list that prints as (a, b) and never equals a list
  static Value dict(Dict d = {});
  static Value ns(Dict d = {});  // namespace(): a dict whose attributes can be set
  static Value function(std::string name, Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const {
    return kind_ == Kind::kInt || kind_ == Kind::kBool;
  }  // Python: bool is int
  bool is_number() const { return is_int() || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kFunction; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }

  bool as_bool() const { return b_; }
  __int128 as_int() const { return kind_ == Kind::kBool ? __int128{b_} : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return s_; }   // kString
  List& items() const { return *list_; }          // kList
  Dict& mapping() const { return *dict_; }        // kDict, kNamespace
  const Function& fn() const { return *fn_; }     // kFunction
  const std::string& name() const { return s_; }  // kFunction name; kUndefined hint

  bool truthy() const;
  std::string type_name() const;  // Python's type name, for error messages
  std::string to_str() const;     // str(x); undefined renders as ""
  std::string repr() const;       // repr(x)

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  __int128 i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

bool py_equal(const Value& a, const Value& b);
// Python's a < b; throws TemplateError for unorderable types.
bool py_less(const Value& a, const Value& b);

std::string py_int_str(__int128 v);
std::string py_float_repr(double v);  // repr(float): shortest round trip, Python's layout
std::string py_str_repr(std::string_view s);

struct JsonDumpOptions {
  bool ensure_ascii = false;  // transformers' tojson passes ensure_ascii=False
  int indent = -1;            // < 0: None
  bool sort_keys = false;
  std::string item_sep;  // empty: ", " (or "," with indent), as json.dumps's default
  std::string key_sep = ": ";
};
// json.dumps(v, ...). Throws TemplateError for values JSON cannot hold (undefined, functions).
std::string py_json_dumps(const Value& v, const JsonDumpOptions& opt = {});

// Unicode helpers with Python's definitions (str.isspace, str.upper/lower, str.isprintable).
bool py_isspace(char32_t c);
bool py_isprintable(char32_t c);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);

}  // namespace tf::tok::jinja
