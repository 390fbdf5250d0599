// JSON Schema, the subset structured output takes (response_format json_schema, a tool's
// parameters), compiled into a model::JsonGrammar whose recognizer writes only valid instances.
// Everything outside the subset is refused with a 400 that names the keyword and its path: a
// constraint the client wrote is never silently dropped.
//
// The subset (docs/server.md, "Structured output"):
//   type (object, array, string, number, integer, boolean, null, or a list of them), properties,
//   required, additionalProperties (true or false), items, enum and const (of strings, numbers,
//   booleans, null), anyOf (branches that start with different bytes: a type and null, a string
//   and a number ...), and the annotations title, description, default, examples, $comment and
//   $schema, which constrain nothing.
// How instances are written: an object's properties in the schema's order, each at most once,
// optional ones possibly left out, never a property the schema does not name (whatever
// additionalProperties says: an object without additional properties validates either way); with
// `strict` every property is written (OpenAI's strict mode: all required). An object schema
// without properties is any object (with additionalProperties false: only {}); a schema without
// type, enum, const or anyOf is any JSON value.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/json_grammar.h"

namespace flashserve::server {

// Adds `schema`, found at `path` in the request (say "response_format.json_schema.schema"), to
// `grammar`; returns its node. Throws ApiError (400) naming the keyword and path of what is
// outside the subset or malformed.
int32_t compile_json_schema(const nlohmann::ordered_json& schema, const std::string& path,
                            bool strict, model::JsonGrammar& grammar);

// A grammar whose top level is `schema`, which must be an object schema.
std::shared_ptr<const model::JsonGrammar> json_schema_grammar(const nlohmann::ordered_json& schema,
                                                              const std::string& path, bool strict);

}  // namespace flashserve::server
