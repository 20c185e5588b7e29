// Checks an AsyncAPI 3.0.0 document (a JSON file) against the AsyncAPI specification's own
// JSON Schema, as @asyncapi/specs ships it, plus two rules that schema cannot express: every
// `$ref` (those in payload schemas too) is a pointer into the document that resolves, and a
// channel's parameters are exactly the `{name}`s of its address. Then it parses the document
// with @asyncapi/parser, as AsyncAPI's own tools read it (references resolved, payload schemas
// checked by their schemaFormat): any diagnostic of severity error is a problem.
//
//   node check.mjs <document.json>
//
// Prints every problem and exits 1 when there is one, 2 on a usage error, 0 when valid.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve as resolvePath } from "node:path";

import { DiagnosticSeverity, Parser } from "@asyncapi/parser";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const require = createRequire(import.meta.url);
// The variant without `$id`s: one self-contained document, refs as `#/definitions/…`.
const specSchema = require("@asyncapi/specs/schemas/3.0.0-without-$id.json");

const file = process.argv[2];
if (!file) {
  console.error("usage: node check.mjs <asyncapi-document.json>");
  process.exit(2);
}

let document;
try {
  document = JSON.parse(readFileSync(file, "utf8"));
} catch (error) {
  console.error(`${file}: not a JSON document: ${error.message}`);
  process.exit(2);
}

// strict: false because the specification's schema uses annotations (`examples` beside
// `$ref`, …) that Ajv's strict mode refuses; they do not change what it accepts.
const ajv = new Ajv({ allErrors: true, strict: false });
addFormats(ajv);
const validate = ajv.compile(specSchema);

const problems = [];
if (!validate(document)) {
  for (const error of validate.errors) {
    problems.push(`schema: ${error.instancePath || "/"} ${error.message} ${JSON.stringify(error.params)}`);
  }
}

/** The value a local JSON Pointer reference (`#/a/b`) names, or undefined. */
function resolve(ref) {
  let node = document;
  if (ref === "#") {
    return node;
  }
  for (const raw of ref.slice(2).split("/")) {
    const key = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    if (node === null || typeof node !== "object" || !Object.hasOwn(node, key)) {
      return undefined;
    }
    node = node[key];
  }
  return node;
}

function checkRefs(node, path) {
  if (Array.isArray(node)) {
    node.forEach((item, i) => checkRefs(item, `${path}/${i}`));
  } else if (node !== null && typeof node === "object") {
    for (const [key, value] of Object.entries(node)) {
      if (key === "$ref" && typeof value === "string") {
        // AsyncAPI tools resolve a `$ref` as a JSON Reference (a payload schema's `$id`s
        // aside): anything but a pointer into this document would be looked for elsewhere.
        if (!value.startsWith("#/") && value !== "#") {
          problems.push(`reference: ${path}/$ref: ${value} is not a pointer into the document`);
        } else if (resolve(value) === undefined) {
          problems.push(`reference: ${path}/$ref: ${value} names nothing in the document`);
        }
      } else {
        checkRefs(value, `${path}/${key}`);
      }
    }
  }
}
checkRefs(document, "");

for (const [id, channel] of Object.entries(document.channels ?? {})) {
  if (typeof channel?.address !== "string") {
    continue;
  }
  const inAddress = [...channel.address.matchAll(/\{([^}]*)\}/g)].map((m) => m[1]).sort();
  const declared = Object.keys(channel.parameters ?? {}).sort();
  if (JSON.stringify(inAddress) !== JSON.stringify(declared)) {
    problems.push(
      `parameters: channel ${id}: address ${channel.address} has {${inAddress.join("}, {")}} but parameters are ${JSON.stringify(declared)}`,
    );
  }
}

// With the file's path as `source`, the parser looks for a `$ref` that is no pointer into the
// document beside the file (a temporary one in the tests, with no contract files there).
const parsed = await new Parser().parse(readFileSync(file, "utf8"), { source: resolvePath(file) });
for (const diagnostic of parsed.diagnostics) {
  if (diagnostic.severity === DiagnosticSeverity.Error) {
    problems.push(`parser: ${diagnostic.code}: /${diagnostic.path.join("/")}: ${diagnostic.message}`);
  }
}
if (parsed.document === undefined && !problems.some((p) => p.startsWith("parser: "))) {
  problems.push("parser: @asyncapi/parser returned no document");
}

if (problems.length > 0) {
  console.error(`${file}: not a valid AsyncAPI 3.0.0 document:`);
  for (const problem of problems) {
    console.error(`  ${problem}`);
  }
  process.exit(1);
}
console.log(`${file}: valid AsyncAPI 3.0.0`);
