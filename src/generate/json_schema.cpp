// Structured outputs: a JSON Schema's supported subset compiled to SchemaNodes, and the recognizer that holds the
// bytes of one value to it (json_schema.h).
#include "generate/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace plumb::gen {

using json = nlohmann::json;

// Containers open in one alternative; a change makes a new frame (the old one may be another alternative's).
struct SchemaRecognizer::Frame {
  const SchemaNode* node;
  bool object;
  uint64_t seen = 0;   // objects: the properties written
  int64_t count = 0;   // arrays: the items begun
  std::shared_ptr<const Frame> parent;
};

namespace {

// Keywords that constrain values (JSON Schema 2020-12's and draft 7's, OpenAPI's nullable) that plumb does not hold
// the output to: refused. Any other keyword not read below is an annotation (2020-12: unknown keywords are).
const std::set<std::string> kRefused = {
    "pattern",          "multipleOf",        "minProperties",     "maxProperties",
    "patternProperties", "propertyNames",   "dependentRequired", "dependentSchemas",  "dependencies",
    "if",               "then",             "else",              "not",               "contains",
    "minContains",      "maxContains",      "uniqueItems",       "prefixItems",       "additionalItems",
    "unevaluatedItems", "unevaluatedProperties", "nullable",     "$dynamicRef",       "$dynamicAnchor",
    "$recursiveRef",    "$recursiveAnchor", "$anchor",           "contentSchema"};

uint8_t type_bits(const std::string& t, const std::string& where) {
  if (t == "object") return SchemaNode::Obj;
  if (t == "array") return SchemaNode::Arr;
  if (t == "string") return SchemaNode::Str;
  if (t == "integer") return SchemaNode::Int;
  if (t == "number") return SchemaNode::Int | SchemaNode::Num;
  if (t == "boolean") return SchemaNode::Bool;
  if (t == "null") return SchemaNode::Null;
  fail("JSON schema: type \"{}\" at {} is not a JSON Schema type", t, where);
}

uint8_t value_type(const json& v) {
  if (v.is_string()) return SchemaNode::Str;
  if (v.is_number_integer() || v.is_number_unsigned()) return SchemaNode::Int | SchemaNode::Num;
  if (v.is_number()) return SchemaNode::Num;
  if (v.is_boolean()) return SchemaNode::Bool;
  return SchemaNode::Null;
}

// The nodes a value of `n` may match, with $ref followed and unions spread out, each once, those without a finite
// instance left out (compile() refuses cycles of $ref and unions, so the walk ends).
void resolve(const SchemaNode* n, const SchemaNode* any, std::vector<const SchemaNode*>& out,
             std::vector<const SchemaNode*>* seen = nullptr) {
  std::vector<const SchemaNode*> own;
  if (!seen) seen = &own;
  if (!n) n = any;
  if (std::find(seen->begin(), seen->end(), n) != seen->end()) return;
  seen->push_back(n);
  if (n->ref) return resolve(n->ref, any, out, seen);
  if (!n->any_of.empty()) {
    for (const SchemaNode* a : n->any_of) resolve(a, any, out, seen);
    return;
  }
  if (n->sat) out.push_back(n);
}

// A key as nlohmann writes it (its escaping), without the quotes: how the schema's property names are matched.
std::string spelled(const std::string& name) {
  const std::string text = json(name).dump();
  return text.substr(1, text.size() - 2);
}

// A UTF-8 string's length in code points (minLength / maxLength): its bytes less the continuation bytes.
int64_t code_points(std::string_view s) {
  return int64_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

// Integers in JSON's spelling ("-12", "0"; never "-0"), compared exactly at any length.
int compare_int(std::string_view a, std::string_view b) {
  const bool na = a[0] == '-', nb = b[0] == '-';
  if (na != nb) return na ? -1 : 1;
  const std::string_view da = a.substr(na), db = b.substr(nb);
  const int mag = da.size() != db.size() ? (da.size() < db.size() ? -1 : 1) : da.compare(db) < 0 ? -1 : da.compare(db) > 0;
  return na ? -mag : mag;
}

// x + delta (delta 1 or -1) for an integer in JSON's spelling.
std::string int_step(const std::string& x, int delta) {
  const bool neg = x[0] == '-';
  std::string d = x.substr(neg);
  // |x| grows when the step moves away from zero (or x is 0), else shrinks
  if (x == "0") return delta > 0 ? "1" : "-1";
  if ((delta > 0) != neg) {
    size_t i = d.size();
    while (i > 0 && d[i - 1] == '9') d[--i] = '0';
    if (i == 0) d.insert(d.begin(), '1');
    else ++d[i - 1];
  } else {
    size_t i = d.size();
    while (d[i - 1] == '0') d[--i] = '9';
    --d[i - 1];
    if (d.size() > 1 && d[0] == '0') d.erase(0, 1);
  }
  return d == "0" ? d : (neg ? "-" : "") + d;
}

// Whether an integer's text lies within n's bounds ("-0" is 0).
bool in_bounds(const SchemaNode* n, std::string_view t) {
  if (t == "-0") t = "0";
  return (n->int_lo.empty() || compare_int(t, n->int_lo) >= 0) && (n->int_hi.empty() || compare_int(t, n->int_hi) <= 0);
}

// A number bound as an integer bound: for an integer x, x >= m is x >= ceil(m) and x > m is x > floor(m) (the double's
// exact value, as Python's jsonschema compares an int with a float); `up` ceil, else floor.
std::string int_bound(const json& v, bool up, const std::string& where) {
  PLUMB_CHECK(v.is_number(), "JSON schema: {} must be a number", where);
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  const double x = v.get<double>();
  PLUMB_CHECK(std::isfinite(x), "JSON schema: {} must be a finite number", where);
  // (a literal past 64 bits reaches here as a double, rounded: Python's jsonschema would compare its exact digits)
  PLUMB_CHECK(std::fabs(x) < 9007199254740992.0, "JSON schema: {} is {}, a bound beyond 2^53 not written as a 64-bit "
              "integer, which plumb cannot read exactly", where, v.dump());
  std::string t = fmt::format("{:.0f}", up ? std::ceil(x) : std::floor(x));
  return t == "-0" ? "0" : t;
}

int64_t count_field(const json& v, const std::string& where) {
  PLUMB_CHECK(v.is_number_integer() || v.is_number_unsigned(), "JSON schema: {} must be a non-negative integer", where);
  PLUMB_CHECK(v.get<int64_t>() >= 0, "JSON schema: {} must be a non-negative integer, got {}", where, v.dump());
  return v.get<int64_t>();
}

}  // namespace

struct JsonSchema::Compiler {
  JsonSchema& s;
  const json& doc;
  std::map<std::string, SchemaNode*> refs;  // "#/$defs/X" -> its node (made before it is filled: recursion)
  std::vector<std::pair<const SchemaNode*, std::string>> one_ofs;  // checked once every node is filled

  // oneOf is followed as anyOf, which is exact where no value can match two branches: refused otherwise. Two branches
  // cannot overlap when their types differ, when both are enums of different values, or when both are objects that
  // require a property (a discriminator) whose values are enums of different values.
  void check_one_of(const SchemaNode* n, const std::string& where) const {
    auto nodes = [&](const SchemaNode* b) {
      std::vector<const SchemaNode*> out;
      resolve(b, s.any_, out);
      return out;
    };
    auto texts = [](const std::vector<const SchemaNode*>& ns, std::set<std::string>& out) {
      for (const SchemaNode* x : ns) {
        if (x->enum_texts.empty()) return false;
        out.insert(x->enum_texts.begin(), x->enum_texts.end());
      }
      return true;
    };
    // (as JSON values: 1 and 1.0 are one number to JSON Schema, though their texts differ)
    auto disjoint_texts = [](const std::set<std::string>& a, const std::set<std::string>& b) {
      for (const auto& t : a)
        for (const auto& u : b)
          if (json::parse(t) == json::parse(u)) return false;
      return true;
    };
    auto apart = [&](const SchemaNode* a, const SchemaNode* b) {
      const auto na = nodes(a), nb = nodes(b);
      uint8_t ta = 0, tb = 0;
      for (const SchemaNode* x : na) ta |= x->types;
      for (const SchemaNode* x : nb) tb |= x->types;
      if (!(ta & tb)) return true;
      std::set<std::string> ea, eb;
      if (texts(na, ea) && texts(nb, eb) && disjoint_texts(ea, eb)) return true;
      if (ta != SchemaNode::Obj || tb != SchemaNode::Obj || na.empty() || nb.empty()) return false;
      for (size_t i = 0; i < na[0]->props.size(); ++i) {  // a discriminator: required in every object of both
        const std::string& key = na[0]->props[i].first;
        std::set<std::string> va, vb;
        bool ok = true;
        for (const auto* side : {&na, &nb})
          for (const SchemaNode* x : *side) {
            const size_t j = x->prop(key);
            ok = ok && j < x->props.size() && ((x->required >> j) & 1) && texts(nodes(x->props[j].second), side == &na ? va : vb);
          }
        if (ok && disjoint_texts(va, vb)) return true;
      }
      return false;
    };
    for (size_t i = 0; i < n->any_of.size(); ++i)
      for (size_t j = i + 1; j < n->any_of.size(); ++j)
        PLUMB_CHECK(apart(n->any_of[i], n->any_of[j]), "JSON schema: {} has branches {} and {} that a value could match "
                    "both of (plumb holds oneOf only where the branches' types, enum values or a required "
                    "discriminator's values differ; anyOf takes any overlap)", where, i, j);
  }

  SchemaNode* make() {
    s.nodes_.push_back(std::make_unique<SchemaNode>());
    return s.nodes_.back().get();
  }
  SchemaNode* node(const json& j, const std::string& where) {
    SchemaNode* n = make();
    fill(n, j, where);
    return n;
  }
  const SchemaNode* ref(const std::string& r, const std::string& where) {
    if (r == "#") return s.root_;
    if (auto it = refs.find(r); it != refs.end()) return it->second;
    std::string section, name;
    if (r.rfind("#/$defs/", 0) == 0) section = "$defs", name = r.substr(8);
    else if (r.rfind("#/definitions/", 0) == 0) section = "definitions", name = r.substr(14);
    PLUMB_CHECK(!section.empty() && name.find('/') == std::string::npos && name.find('~') == std::string::npos,
                "JSON schema: $ref \"{}\" at {}: only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported", r, where);
    PLUMB_CHECK(doc.is_object() && doc.contains(section) && doc[section].is_object() && doc[section].contains(name),
                "JSON schema: $ref \"{}\" at {} names no schema of the document", r, where);
    SchemaNode* n = make();
    refs[r] = n;
    fill(n, doc[section][name], r.substr(1));
    return n;
  }

  // minimum, maximum and their exclusive forms: on integers only (a fraction's bounds would need the decimal
  // arithmetic of the value as Python reads it, a double), as inclusive integer bounds.
  void bounds(SchemaNode* n, const json& j, const std::string& where) {
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      const auto it = j.find(k);
      if (it == j.end()) continue;
      const std::string at = where + "/" + k;
      PLUMB_CHECK(!(n->types & SchemaNode::Num), "JSON schema: keyword \"{}\" at {} is supported on integers only (\"type\": "
                  "\"integer\"), not on numbers that may have a fraction", k, where);
      const std::string name = k;
      const bool lower = name.find("inimum") != std::string::npos, strict = name[0] == 'e';
      // x >= m: x >= ceil(m); x > m: x >= floor(m) + 1; x <= m: x <= floor(m); x < m: x <= ceil(m) - 1
      std::string b = int_bound(*it, lower != strict, at);
      if (strict) b = int_step(b, lower ? 1 : -1);
      std::string& have = lower ? n->int_lo : n->int_hi;
      if (have.empty() || (lower ? compare_int(b, have) > 0 : compare_int(b, have) < 0)) have = std::move(b);
    }
    PLUMB_CHECK(n->int_lo.empty() || n->int_hi.empty() || compare_int(n->int_lo, n->int_hi) <= 0,
                "JSON schema: no integer lies within the bounds at {} ({} to {})", where, n->int_lo, n->int_hi);
    // (numbers are at most JsonRecognizer::kMaxNumber bytes: 64 digits, or a sign and 63)
    const std::string most(size_t(JsonRecognizer::kMaxNumber), '9'), least = "-" + most.substr(1);
    PLUMB_CHECK((n->int_lo.empty() || compare_int(n->int_lo, most) <= 0) && (n->int_hi.empty() || compare_int(n->int_hi, least) >= 0),
                "JSON schema: no integer within the bounds at {} fits in {} bytes", where, JsonRecognizer::kMaxNumber);
  }

  void fill(SchemaNode* n, const json& j, const std::string& where) {
    if (j.is_boolean()) {
      PLUMB_CHECK(j.get<bool>(), "JSON schema: the schema false at {} allows no value (only additionalProperties may be "
                  "false)", where);
      n->additional = s.any_;
      return;
    }
    PLUMB_CHECK(j.is_object(), "JSON schema: the schema at {} must be an object or true, got {}", where, j.type_name());
    n->additional = s.any_;  // (JSON Schema's default: other keys allowed, any value)
    bool combined = false, constrained = false;
    for (const auto& [k, v] : j.items()) {
      const std::string at = where + "/" + k;
      PLUMB_CHECK(!kRefused.count(k), "JSON schema: keyword \"{}\" at {} is not supported (plumb would not hold the "
                  "output to it)", k, where);
      // ($id would change what "#" means below it: only the root's, which names the document itself)
      PLUMB_CHECK(k != "$id" || where == "#", "JSON schema: $id at {} is not supported (only the root's)", where);
      if (k == "anyOf" || k == "oneOf" || k == "allOf") {
        PLUMB_CHECK(v.is_array() && !v.empty(), "JSON schema: {} must be a non-empty array", at);
        PLUMB_CHECK(!combined, "JSON schema: {} beside another of anyOf, oneOf, allOf, $ref is not supported", at);
        combined = true;
        PLUMB_CHECK(v.size() <= 8, "JSON schema: {} has {} branches, more than the 8 supported", at, v.size());
        if (k == "allOf") {
          PLUMB_CHECK(v.size() == 1, "JSON schema: allOf of {} schemas at {} is not supported (one is)", v.size(), where);
          n->any_of.push_back(node(v[0], at + "/0"));
        } else {
          for (size_t i = 0; i < v.size(); ++i) n->any_of.push_back(node(v[i], at + "/" + std::to_string(i)));
          if (k == "oneOf") one_ofs.emplace_back(n, at);
        }
      } else if (k == "$ref") {
        PLUMB_CHECK(v.is_string(), "JSON schema: {} must be a string", at);
        PLUMB_CHECK(!combined, "JSON schema: $ref beside anyOf, oneOf or allOf at {} is not supported", where);
        combined = true;
        n->ref = ref(v.get<std::string>(), at);
      } else if (k == "type") {
        constrained = true;
        n->types = 0;
        if (v.is_string()) {
          n->types = type_bits(v.get<std::string>(), at);
        } else {
          PLUMB_CHECK(v.is_array() && !v.empty(), "JSON schema: {} must be a type name or an array of them", at);
          for (const auto& t : v) {
            PLUMB_CHECK(t.is_string(), "JSON schema: {} must hold type names", at);
            n->types |= type_bits(t.get<std::string>(), at);
          }
        }
      } else if (k == "enum" || k == "const") {
        constrained = true;
        const json values = k == "const" ? json::array({v}) : v;
        PLUMB_CHECK(values.is_array() && !values.empty(), "JSON schema: {} must be a non-empty array", at);
        for (const auto& e : values) {
          PLUMB_CHECK(!e.is_object() && !e.is_array(), "JSON schema: {} holds an object or array value: only strings, "
                      "numbers, booleans and null are supported there", at);
          // (an integer past 2^53 read as a double is not the value written: its text would match another number)
          PLUMB_CHECK(!e.is_number_float() || std::fabs(e.get<double>()) < 9007199254740992.0,
                      "JSON schema: {} holds {}, a number beyond 2^53 that plumb cannot match exactly", at, e.dump());
          n->enum_texts.push_back(e.dump());
        }
      } else if (k == "properties") {
        constrained = true;
        PLUMB_CHECK(v.is_object(), "JSON schema: {} must be an object", at);
        PLUMB_CHECK(v.size() <= 64, "JSON schema: {} has {} properties, more than the 64 supported", at, v.size());
        for (const auto& [name, sub] : v.items()) n->props.emplace_back(spelled(name), node(sub, at + "/" + name));
      } else if (k == "required" || k == "additionalProperties" || k == "items" || k == "minItems" || k == "maxItems" ||
                 k == "minLength" || k == "maxLength" || k == "minimum" || k == "maximum" || k == "exclusiveMinimum" ||
                 k == "exclusiveMaximum") {
        constrained = true;  // (read below, once properties are known)
      }
    }
    PLUMB_CHECK(!(combined && constrained), "JSON schema: anyOf, oneOf, allOf or $ref beside other constraints at {} is "
                "not supported", where);
    if (const auto r = j.find("required"); r != j.end()) {
      PLUMB_CHECK(r->is_array(), "JSON schema: {}/required must be an array", where);
      for (const auto& name : *r) {
        PLUMB_CHECK(name.is_string(), "JSON schema: {}/required must hold property names", where);
        const size_t i = n->prop(spelled(name.get<std::string>()));
        PLUMB_CHECK(i < n->props.size(), "JSON schema: {}/required names \"{}\", which properties does not define",
                    where, name.get<std::string>());
        n->required |= uint64_t(1) << i;
      }
    }
    if (const auto a = j.find("additionalProperties"); a != j.end()) {
      if (a->is_boolean()) n->additional = a->get<bool>() ? s.any_ : nullptr;
      else n->additional = node(*a, where + "/additionalProperties");
    }
    if (const auto it = j.find("items"); it != j.end()) {
      PLUMB_CHECK(!it->is_array(), "JSON schema: {}/items as an array (tuples) is not supported", where);
      n->items = node(*it, where + "/items");
    }
    if (const auto mn = j.find("minItems"); mn != j.end()) n->min_items = count_field(*mn, where + "/minItems");
    if (const auto mx = j.find("maxItems"); mx != j.end()) n->max_items = count_field(*mx, where + "/maxItems");
    PLUMB_CHECK(n->max_items < 0 || n->max_items >= n->min_items, "JSON schema: maxItems below minItems at {}", where);
    if (const auto mn = j.find("minLength"); mn != j.end()) n->min_length = count_field(*mn, where + "/minLength");
    if (const auto mx = j.find("maxLength"); mx != j.end()) n->max_length = count_field(*mx, where + "/maxLength");
    PLUMB_CHECK(n->max_length < 0 || n->max_length >= n->min_length, "JSON schema: maxLength below minLength at {}", where);
    bounds(n, j, where);
    if (!n->enum_texts.empty()) {  // (the values of other types than `type` allows, or strings of another length, or
                                   // numbers out of bounds, can never be written)
      auto length_ok = [&](const json& v) {
        if (v.is_number() && n->int_bounded()) return (v.is_number_integer() || v.is_number_unsigned()) && in_bounds(n, v.dump());
        if (!v.is_string()) return true;
        const int64_t len = code_points(v.get<std::string>());
        return len >= n->min_length && (n->max_length < 0 || len <= n->max_length);
      };
      std::erase_if(n->enum_texts, [&](const std::string& t) {
        const json v = json::parse(t);
        return !(value_type(v) & n->types) || !length_ok(v);
      });
      PLUMB_CHECK(!n->enum_texts.empty(), "JSON schema: no value of the enum at {} has a type (and a length) the schema "
                  "allows", where);
      uint8_t kinds = 0;
      for (const auto& t : n->enum_texts) kinds |= value_type(json::parse(t));
      n->types &= kinds;
    }
  }
};

JsonSchema::~JsonSchema() = default;

std::shared_ptr<const JsonSchema> JsonSchema::compile(std::string_view text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    fail("JSON schema: not valid JSON: {}", e.what());
  }
  std::shared_ptr<JsonSchema> s(new JsonSchema());
  s->nodes_.push_back(std::make_unique<SchemaNode>());
  SchemaNode* any = s->nodes_.back().get();
  any->additional = any;
  s->any_ = any;
  s->nodes_.push_back(std::make_unique<SchemaNode>());
  SchemaNode* root = s->nodes_.back().get();
  s->root_ = root;
  Compiler c{*s, doc, {}, {}};
  c.fill(root, doc, "#");
  // No cycle of $ref and unions that reads no byte ({"anyOf": [{"$ref": "#"}, ...]}): following one would never end.
  std::map<const SchemaNode*, int> color;  // 1 on the walk, 2 done
  std::function<void(const SchemaNode*)> walk = [&](const SchemaNode* n) {
    int& k = color[n];
    PLUMB_CHECK(k != 1, "JSON schema: a cycle of $ref and anyOf / oneOf that never reads a value is not supported");
    if (k == 2) return;
    k = 1;
    if (n->ref) walk(n->ref);
    for (const SchemaNode* a : n->any_of) walk(a);
    color[n] = 2;
  };
  for (const auto& n : s->nodes_) walk(n.get());
  // Which nodes have a finite instance (a least fixpoint): a scalar type or an enum always; an object when its required
  // properties do; an array when it may be empty or its items do; a union when a branch does. A value is never
  // begun on a node without one (resolve() leaves them out), so a required property of such a schema is no dead end.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& up : s->nodes_) {
      SchemaNode* n = up.get();
      if (n->sat) continue;
      bool sat = false;
      if (n->ref) {
        sat = n->ref->sat;
      } else if (!n->any_of.empty()) {
        for (const SchemaNode* a : n->any_of) sat = sat || a->sat;
      } else if (!n->enum_texts.empty() || (n->types & ~(SchemaNode::Obj | SchemaNode::Arr))) {
        sat = true;
      } else {
        if (n->types & SchemaNode::Arr) sat = n->min_items == 0 || !n->items || n->items->sat;
        if (n->types & SchemaNode::Obj) {
          bool all = true;
          for (size_t i = 0; i < n->props.size(); ++i)
            if ((n->required >> i) & 1) all = all && n->props[i].second->sat;
          sat = sat || all;
        }
      }
      if (sat) n->sat = true, changed = true;
    }
  }
  std::vector<const SchemaNode*> roots;
  resolve(root, s->any_, roots);
  PLUMB_CHECK(std::any_of(roots.begin(), roots.end(), [](const SchemaNode* n) {
                return (n->types & SchemaNode::Obj) && n->enum_texts.empty();
              }),
              "JSON schema: the root must allow an object with a finite instance (structured outputs' root is one)");
  for (const auto& [n, at] : c.one_ofs) c.check_one_of(n, at);
  return s;
}

namespace {

bool allows_kind(const SchemaNode* n, JsonEvent::Kind k) {
  switch (k) {
    case JsonEvent::Object: return (n->types & SchemaNode::Obj) && n->enum_texts.empty();
    case JsonEvent::Array: return (n->types & SchemaNode::Arr) && n->enum_texts.empty();
    case JsonEvent::String: return n->types & SchemaNode::Str;
    case JsonEvent::Number: return n->types & (SchemaNode::Int | SchemaNode::Num);
    case JsonEvent::True:
    case JsonEvent::False: return n->types & SchemaNode::Bool;
    case JsonEvent::Null: return n->types & SchemaNode::Null;
  }
  return false;
}

bool prefix_of_one(const std::vector<std::string>& texts, const std::string& t) {
  for (const auto& e : texts)
    if (e.compare(0, t.size(), t) == 0) return true;
  return false;
}

}  // namespace

namespace {

// Frames with the same content (alternatives reach equal frames through different copies: merged as equal).
bool same_frames(const SchemaRecognizer::Frame* a, const SchemaRecognizer::Frame* b);

}  // namespace

bool SchemaRecognizer::Alt::operator==(const Alt& o) const {
  return value == o.value && kind == o.kind && phase == o.phase && text == o.text && chars == o.chars && esc == o.esc &&
         u == o.u && high == o.high && pending == o.pending && same_frames(top.get(), o.top.get());
}

namespace {

bool same_frames(const SchemaRecognizer::Frame* a, const SchemaRecognizer::Frame* b) {
  for (; a != b; a = a->parent.get(), b = b->parent.get())
    if (!a || !b || a->node != b->node || a->object != b->object || a->seen != b->seen || a->count != b->count) return false;
  return true;
}

}  // namespace

SchemaRecognizer::SchemaRecognizer(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  alts_[0].value = schema_->root();
  n_ = 1;
}

bool SchemaRecognizer::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(uint8_t(c))) return false;
  return true;
}

bool SchemaRecognizer::feed(uint8_t c) {
  if (n_ == 0) return false;
  JsonRecognizer syntax = syntax_;
  if (!syntax.feed(c)) return false;
  Alts out{};
  int m = 0;
  for (int i = 0; i < n_; ++i) step(alts_[size_t(i)], c, syntax.event(), out, m);
  if (m == 0) return false;
  syntax_ = syntax;
  std::move(out.begin(), out.begin() + m, alts_.begin());
  for (int i = m; i < n_; ++i) alts_[size_t(i)] = Alt{};
  n_ = m;
  return true;
}

bool SchemaRecognizer::between_string_chars(int64_t longest_plain) const {
  if (!syntax_.between_string_chars()) return false;
  for (int i = 0; i < n_; ++i) {
    const Alt& a = alts_[size_t(i)];
    // (plain text may run past maxLength: free only while the longest plain token fits what is left; minLength only
    // holds the closing quote back, never in it)
    const bool room = a.value && (a.value->max_length < 0 || (!a.pending && a.value->max_length - a.chars >= longest_plain));
    const bool free_value = a.phase == Alt::InScalar && a.value->enum_texts.empty() && room;
    const bool free_key = a.phase == Alt::InKey && a.top->node->takes_other_keys();
    if (!free_value && !free_key) return false;
  }
  return true;
}

bool SchemaRecognizer::key_prefix_ok(const Alt& a) const {
  const SchemaNode* n = a.top->node;
  if (n->takes_other_keys()) return true;
  for (size_t i = 0; i < n->props.size(); ++i)
    if (n->takes_prop(i, a.top->seen) && n->props[i].first.compare(0, a.text.size(), a.text) == 0) return true;
  return false;
}

// A string's character is counted at its first byte (a lead byte, an ASCII byte or an escape's backslash); the byte
// that would begin one past maxLength is refused, so the string can always still close. At maxLength an escaped high
// surrogate may still take its low half (the same code point): the backslash after it is let through uncounted
// (`pending`), and then only "u" and the hex digits of a low surrogate.
bool SchemaRecognizer::string_byte(Alt& a, uint8_t c) {
  if (a.esc == Alt::kAfterBackslash) {
    if (c != 'u') {
      if (a.pending) return false;
      a.esc = 0, a.high = false;
      return true;
    }
    a.esc = 4, a.u = 0;
    return true;
  }
  if (a.esc > 0) {  // (a hex digit: the syntax checked it)
    a.u = uint16_t(a.u * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10));
    --a.esc;
    if (a.pending && ((a.esc == 3 && a.u != 0xD) || (a.esc == 2 && (a.u < 0xDC || a.u > 0xDF)))) return false;
    if (a.esc == 0) {
      const bool low = a.u >= 0xDC00 && a.u <= 0xDFFF;
      if (a.high && low && !a.pending) --a.chars;  // (a pair's second half: the same code point)
      a.high = a.u >= 0xD800 && a.u <= 0xDBFF;
      a.pending = false;
    }
    return true;
  }
  if ((c & 0xC0) == 0x80) return true;  // (a continuation byte)
  if (a.value->max_length >= 0 && a.chars >= a.value->max_length) {
    if (c != '\\' || !a.high) return false;
    a.pending = true, a.esc = Alt::kAfterBackslash;
    return true;
  }
  ++a.chars;
  if (c == '\\') a.esc = Alt::kAfterBackslash;
  else a.high = false;
  return true;
}

// A byte of a scalar (its enum text so far a prefix of one of the values; an integer has no fraction or exponent).
bool SchemaRecognizer::scalar_byte(Alt& a, uint8_t c) const {
  if (a.kind == JsonEvent::Number && !(a.value->types & SchemaNode::Num) && (c == '.' || c == 'e' || c == 'E'))
    return false;
  if (a.value->enum_texts.empty()) {
    if (a.kind != JsonEvent::Number || !a.value->int_bounded()) return true;
    a.text += char(c);
    return number_may_go_on(a.value, a.text);
  }
  a.text += char(c);
  return prefix_of_one(a.value->enum_texts, a.text);
}

// An integer's text so far can still become one within the node's bounds: "-" one at most 0; "0" or "-0" is whole;
// digits D (|x| begins with them) any of D followed by j more digits, [D0..0, D9..9], within the number's byte bound.
bool SchemaRecognizer::number_may_go_on(const SchemaNode* n, std::string_view t) {
  if (!n->int_bounded()) return true;
  const bool neg = t[0] == '-';
  const std::string_view d = t.substr(neg);
  if (d.empty()) return n->int_lo.empty() || compare_int(n->int_lo, "0") <= 0;
  if (d == "0") return in_bounds(n, "0");
  for (size_t j = 0; size_t(neg) + d.size() + j <= size_t(JsonRecognizer::kMaxNumber); ++j) {
    const std::string a = std::string(d) + std::string(j, '0'), b = std::string(d) + std::string(j, '9');
    const std::string lo = neg ? "-" + b : a, hi = neg ? "-" + a : b;  // the values with j more digits
    const bool below_hi = n->int_hi.empty() || compare_int(lo, n->int_hi) <= 0;
    const bool above_lo = n->int_lo.empty() || compare_int(hi, n->int_lo) >= 0;
    if (below_hi && above_lo) return true;
    if (!below_hi && !neg) return false;  // (more digits only go further up; for negatives, further down)
    if (!above_lo && neg) return false;
  }
  return false;
}

bool SchemaRecognizer::end_scalar(const Alt& a) {
  if (a.value->enum_texts.empty()) return a.kind != JsonEvent::Number || in_bounds(a.value, a.text);
  for (const auto& e : a.value->enum_texts)
    if (e == a.text) return true;
  return false;
}

void SchemaRecognizer::step(const Alt& a, uint8_t c, const JsonEvent& ev, Alts& out, int& m) const {
  auto add = [&](Alt&& x) { push(out, m, std::move(x)); };
  Alt b = a;
  if (ev.number_end) {  // (the number this byte ended; the byte itself is what follows it)
    if (!end_scalar(b)) return;
    b.after_value();
  }
  switch (ev.what) {
    case JsonEvent::None:
      if (b.phase == Alt::InKey) {
        b.text += char(c);
        if (!key_prefix_ok(b)) return;
      } else if (b.phase == Alt::InScalar && (!scalar_byte(b, c) || (b.kind == JsonEvent::String && !string_byte(b, c)))) {
        return;
      }
      return add(std::move(b));
    case JsonEvent::ScalarStart:
    case JsonEvent::Open: return begin_value(std::move(b), c, ev, out, m);
    case JsonEvent::ScalarEnd:
      if (!scalar_byte(b, c) || !end_scalar(b)) return;
      if (b.kind == JsonEvent::String && b.chars < b.value->min_length) return;  // (the closing quote, too soon)
      b.after_value();
      return add(std::move(b));
    case JsonEvent::Close: {
      const Frame& f = *b.top;
      if (f.object && (f.seen & f.node->required) != f.node->required) return;  // a required property is missing
      if (!f.object && f.count < f.node->min_items) return;
      b.top = f.parent;
      b.after_value();
      return add(std::move(b));
    }
    case JsonEvent::Comma: {
      const Frame& f = *b.top;
      if (f.object) {  // (a key must be able to follow)
        bool more = f.node->takes_other_keys();
        for (size_t i = 0; i < f.node->props.size() && !more; ++i) more = f.node->takes_prop(i, f.seen);
        if (!more) return;
        b.phase = Alt::Key;
      } else {
        if (f.node->max_items >= 0 && f.count >= f.node->max_items) return;
        b.phase = Alt::Value, b.value = f.node->items;
      }
      return add(std::move(b));
    }
    case JsonEvent::KeyStart:  // (after '{' a key may be impossible: no property, none other allowed)
      b.phase = Alt::InKey, b.text.clear();
      if (!key_prefix_ok(b)) return;
      return add(std::move(b));
    case JsonEvent::KeyEnd: {
      const SchemaNode* n = b.top->node;
      // A key written with escapes ("\u0061", "\/") is the property it spells: matched in nlohmann's spelling, so
      // that it takes that property's schema and counts as it (written twice otherwise).
      if (b.text.find('\\') != std::string::npos) {
        try {
          b.text = spelled(json::parse("\"" + b.text + "\"").get<std::string>());
        } catch (const json::exception&) {  // (a lone surrogate escape: no property's name, which is UTF-8)
        }
      }
      const size_t i = n->prop(b.text);
      auto f = std::make_shared<Frame>(*b.top);
      if (i < n->props.size()) {
        if (!n->takes_prop(i, f->seen)) return;  // (a property written twice, or one whose value could not be)
        f->seen |= uint64_t(1) << i;
        b.value = n->props[i].second;
      } else {
        if (!n->takes_other_keys()) return;
        b.value = n->additional;
      }
      b.top = std::move(f), b.phase = Alt::Value, b.text.clear();
      return add(std::move(b));
    }
  }
}

// A value begins (its first byte: '{', '[', or a scalar's): each node it may match that allows its kind is one
// alternative; in an array it counts as an item.
void SchemaRecognizer::begin_value(Alt b, uint8_t c, const JsonEvent& ev, Alts& out, int& m) const {
  if (b.top && !b.top->object) {
    if (b.top->node->max_items >= 0 && b.top->count >= b.top->node->max_items) return;
    auto f = std::make_shared<Frame>(*b.top);
    ++f->count;
    b.top = std::move(f);
  }
  std::vector<const SchemaNode*> nodes;
  resolve(b.value, schema_->any(), nodes);
  for (const SchemaNode* n : nodes) {
    if (!allows_kind(n, ev.kind)) continue;
    Alt x = b;
    if (ev.what == JsonEvent::Open) {
      const bool object = ev.kind == JsonEvent::Object;
      x.top = std::make_shared<Frame>(Frame{n, object, 0, 0, b.top});
      x.phase = object ? Alt::Key : Alt::Value;
      x.value = object ? nullptr : n->items;
    } else {
      x.phase = Alt::InScalar, x.value = n, x.kind = ev.kind;
      x.clear_scalar();
      if (!scalar_byte(x, c)) continue;  // (its first byte: an enum's text, an integer's bounds)
    }
    push(out, m, std::move(x));
  }
}

void SchemaRecognizer::push(Alts& out, int& m, Alt&& x) {
  for (int i = 0; i < m; ++i)
    if (out[size_t(i)] == x) return;
  if (m < kMaxAlternatives) out[size_t(m++)] = std::move(x);  // (past the cap: dropped, the output stays valid)
}

}  // namespace plumb::gen
