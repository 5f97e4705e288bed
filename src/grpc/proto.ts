/**
 * Loads proto/csi.proto. The file is imported as text, so it is part of the module graph and
 * lands inside the compiled binary without any file read at run time.
 */

import * as grpc from "@grpc/grpc-js";
import { Buffer } from "node:buffer";
import protobuf from "protobufjs";
import descriptorJson from "protobufjs/google/protobuf/descriptor.json" with { type: "json" };
import csiProtoText from "../../proto/csi.proto" with { type: "text" };

/**
 * How messages are decoded for the handlers (see csi/types.ts): field names as in the proto,
 * 64-bit integers and enums as strings, defaults filled in, the name of each oneof's set field.
 * The same conversion @grpc/proto-loader makes with these options.
 */
export const DECODE_OPTIONS: protobuf.IConversionOptions = {
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

/** The csi.v1 services, ready to register on a server or to build clients from. */
export interface CsiServices {
  readonly Identity: grpc.ServiceClientConstructor;
  readonly Node: grpc.ServiceClientConstructor;
  readonly Controller: grpc.ServiceClientConstructor;
}

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

function serializer(type: protobuf.Type): grpc.serialize<unknown> {
  return (value) => {
    if (Array.isArray(value)) throw new TypeError(`Cannot send an array as ${type.name}`);
    const bytes = type.encode(type.fromObject(value as Record<string, unknown>)).finish();
    // protobufjs hands out a Buffer where it finds one; grpc-js needs one. A view, not a copy.
    return Buffer.isBuffer(bytes)
      ? bytes
      : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  };
}

function deserializer(type: protobuf.Type): grpc.deserialize<unknown> {
  return (bytes) => type.toObject(type.decode(bytes), DECODE_OPTIONS);
}

/**
 * A grpc-js service definition straight from the protobufjs service. Not through
 * @grpc/proto-loader: besides the same encoders it builds reflection descriptors of every
 * message (the Google descriptor types included), which nothing here uses and which took
 * 40-90 ms of every start-up (bench/startup_breakdown.ts).
 */
export function serviceDefinition(service: protobuf.Service): grpc.ServiceDefinition {
  const def: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const method of service.methodsArray) {
    const request = method.resolvedRequestType!;
    const response = method.resolvedResponseType!;
    def[method.name] = {
      path: `/${service.fullName.slice(1)}/${method.name}`,
      requestStream: method.requestStream === true,
      responseStream: method.responseStream === true,
      requestSerialize: serializer(request),
      requestDeserialize: deserializer(request),
      responseSerialize: serializer(response),
      responseDeserialize: deserializer(response),
      originalName: method.name.charAt(0).toLowerCase() + method.name.slice(1),
    };
  }
  return def;
}

/** The csi.v1 services. */
export function loadCsiServices(): CsiServices {
  const root = loadCsiRoot();
  const client = (name: string) =>
    grpc.makeClientConstructor(serviceDefinition(root.lookupService(`csi.v1.${name}`)), name);
  return { Identity: client("Identity"), Node: client("Node"), Controller: client("Controller") };
}
