/**
 * Loads proto/csi.proto. The file is imported as text, so it is part of the module graph and
 * lands inside the compiled binary without any file read at run time.
 */

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";
import descriptorJson from "protobufjs/google/protobuf/descriptor.json" with { type: "json" };
import csiProtoText from "../../proto/csi.proto" with { type: "text" };

/** How messages are decoded for the handlers (see csi/types.ts). */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
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

/** Parses csi.proto (with the Google types it imports) into a package definition. */
export function loadCsiPackageDefinition(): protoLoader.PackageDefinition {
  const root = new protobuf.Root();
  root.addJSON((descriptorJson as protobuf.INamespace).nested ?? {});
  for (const f of ["google/protobuf/wrappers.proto", "google/protobuf/timestamp.proto"]) {
    root.addJSON(wellKnown(f).nested ?? {});
  }
  protobuf.parse(csiProtoText, root, { keepCase: true });
  root.resolveAll();
  return protoLoader.fromJSON(root.toJSON(), LOADER_OPTIONS);
}

/** The csi.v1 services. */
export function loadCsiServices(): CsiServices {
  const pkg = grpc.loadPackageDefinition(loadCsiPackageDefinition());
  const v1 = (pkg.csi as grpc.GrpcObject).v1 as grpc.GrpcObject;
  return {
    Identity: v1.Identity as grpc.ServiceClientConstructor,
    Node: v1.Node as grpc.ServiceClientConstructor,
    Controller: v1.Controller as grpc.ServiceClientConstructor,
  };
}
