/**
 * proto/csi.proto as source: parsed with protobufjs, and turned into the descriptor the plugin
 * loads at start (src/grpc/csi_descriptor.json). Parsing the .proto text took about 25 ms of
 * every start; the plugin now builds its types from the JSON instead (src/grpc/proto.ts), and
 * this module is only for the tests and for regenerating that file:
 *
 *   ./tools/deno run --allow-read --allow-write=src/grpc/csi_descriptor.json src/grpc/proto_source.ts
 *
 * src/grpc/proto_test.ts fails while the file does not match csi.proto.
 */

import protobuf from "protobufjs";
import descriptorJson from "protobufjs/google/protobuf/descriptor.json" with { type: "json" };
import csiProtoText from "../../proto/csi.proto" with { type: "text" };

/** Where the generated descriptor lives, relative to this module. */
export const DESCRIPTOR_URL = new URL("./csi_descriptor.json", import.meta.url);

function wellKnown(file: string): protobuf.INamespace {
  const json = protobuf.common.get(file);
  if (!json) throw new Error(`protobufjs lacks ${file}`);
  return json;
}

/** Parses csi.proto (with the Google types it imports) into resolved protobufjs types. */
export function loadCsiRoot(): protobuf.Root {
  const root = new protobuf.Root();
  root.addJSON((descriptorJson as protobuf.INamespace).nested ?? {});
  for (const f of ["google/protobuf/wrappers.proto", "google/protobuf/timestamp.proto"]) {
    root.addJSON(wellKnown(f).nested ?? {});
  }
  protobuf.parse(csiProtoText, root, { keepCase: true });
  root.resolveAll();
  return root;
}

/**
 * Options (`csi_secret`, `alpha_*`, `go_package`) and the extensions that declare them describe
 * fields; they change no byte on the wire and nothing here reads them. Leaving them out means
 * google/protobuf/descriptor.proto need not be loaded either.
 */
const OPTION_KEYS = new Set(["options", "parsedOptions", "valuesOptions"]);

function withoutOptions(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutOptions);
  if (value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value)) {
    if (OPTION_KEYS.has(key)) continue;
    // An `extend google.protobuf.FieldOptions { ... }` field.
    if (v !== null && typeof v === "object" && "extend" in v) continue;
    out[key] = withoutOptions(v);
  }
  return out;
}

/**
 * The descriptor the plugin loads: package csi.v1 and the Google types its messages use
 * (wrappers, Timestamp), as protobufjs JSON without options.
 * @throws {Error} when a message uses a google.protobuf type this does not carry
 */
export function csiDescriptor(root: protobuf.Root = loadCsiRoot()): protobuf.INamespace {
  const csi = root.lookup("csi");
  if (!(csi instanceof protobuf.Namespace)) throw new Error("csi.proto has no package csi");
  const google: Record<string, protobuf.AnyNestedObject> = {};
  const used = new Set<protobuf.Type>();
  const visit = (ns: protobuf.NamespaceBase) => {
    for (const nested of ns.nestedArray) {
      if (nested instanceof protobuf.Type) {
        for (const field of nested.fieldsArray) {
          if (field.resolvedType instanceof protobuf.Type) used.add(field.resolvedType);
        }
      }
      if (nested instanceof protobuf.Service) {
        for (const m of nested.methodsArray) {
          if (m.resolvedRequestType) used.add(m.resolvedRequestType);
          if (m.resolvedResponseType) used.add(m.resolvedResponseType);
        }
      }
      if (nested instanceof protobuf.Namespace) visit(nested);
    }
  };
  visit(csi);
  for (const type of used) {
    if (!type.fullName.startsWith(".google.protobuf.")) continue;
    if (type.nestedArray.length > 0) throw new Error(`${type.fullName} has nested types`);
    google[type.name] = type.toJSON();
  }
  const sorted = Object.fromEntries(Object.entries(google).sort(([a], [b]) => a.localeCompare(b)));
  return withoutOptions({
    nested: {
      google: { nested: { protobuf: { nested: sorted } } },
      csi: csi.toJSON(),
    },
  }) as protobuf.INamespace;
}

/** The file's text: indented JSON, as `deno fmt` leaves it. */
export function descriptorText(descriptor: protobuf.INamespace = csiDescriptor()): string {
  return JSON.stringify(descriptor, null, 2) + "\n";
}

if (import.meta.main) {
  Deno.writeTextFileSync(DESCRIPTOR_URL, descriptorText());
}
