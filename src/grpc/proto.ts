/**
 * The csi.v1 services for grpc-js. Their types come from src/grpc/csi_descriptor.json, which
 * src/grpc/proto_source.ts generates from proto/csi.proto: a JSON module is part of the module
 * graph (so it lands inside the compiled binary), and building types from it takes half the time
 * parsing the .proto text took at every start.
 */

import * as grpc from "@grpc/grpc-js";
import { Buffer } from "node:buffer";
import protobuf from "protobufjs";
import csiDescriptor from "./csi_descriptor.json" with { type: "json" };

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

/** The csi.v1 types (with the Google types they use), built from the generated descriptor. */
export function loadCsiRoot(): protobuf.Root {
  const root = protobuf.Root.fromJSON(csiDescriptor as protobuf.INamespace);
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

let services: CsiServices | undefined;

/**
 * The csi.v1 services, built once per process: the server, the CLI and the tests' clients all
 * use the same immutable definitions.
 */
export function loadCsiServices(): CsiServices {
  if (services) return services;
  const root = loadCsiRoot();
  const client = (name: string) =>
    grpc.makeClientConstructor(serviceDefinition(root.lookupService(`csi.v1.${name}`)), name);
  services = {
    Identity: client("Identity"),
    Node: client("Node"),
    Controller: client("Controller"),
  };
  return services;
}
