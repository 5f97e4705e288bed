import assert from "node:assert/strict";
import * as protoLoader from "@grpc/proto-loader";
import type * as grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";
import { DECODE_OPTIONS, loadCsiRoot, loadCsiServices, serviceDefinition } from "./proto.ts";
import {
  csiDescriptor,
  DESCRIPTOR_URL,
  descriptorText,
  loadCsiRoot as parseCsiProto,
} from "./proto_source.ts";

/** What the plugin used before: @grpc/proto-loader over csi.proto itself, parsed. */
function protoLoaderServices(): Record<string, grpc.ServiceDefinition> {
  const pkg = protoLoader.fromJSON(parseCsiProto().toJSON(), { keepCase: true, ...DECODE_OPTIONS });
  return {
    Identity: pkg["csi.v1.Identity"] as grpc.ServiceDefinition,
    Node: pkg["csi.v1.Node"] as grpc.ServiceDefinition,
    Controller: pkg["csi.v1.Controller"] as grpc.ServiceDefinition,
  };
}

Deno.test("the descriptor the plugin loads is the one csi.proto gives (else regenerate it)", () => {
  const committed = JSON.parse(Deno.readTextFileSync(DESCRIPTOR_URL));
  assert.deepEqual(
    committed,
    csiDescriptor(parseCsiProto()),
    "src/grpc/csi_descriptor.json is stale: run the command at the top of proto_source.ts",
  );
  // Byte for byte too, so regenerating leaves no diff behind.
  assert.equal(Deno.readTextFileSync(DESCRIPTOR_URL), descriptorText());
});

/** What a field is on the wire: name, number, type, repeated or map key, oneof. */
function shape(f: protobuf.Field): unknown[] {
  const key = f instanceof protobuf.MapField ? f.keyType : undefined;
  return [f.name, f.id, f.type, f.repeated, key, f.partOf?.name];
}

Deno.test("the descriptor carries every csi.v1 message, field and method, and no options", () => {
  const parsed = parseCsiProto();
  const loaded = loadCsiRoot();
  let types = 0;
  const visit = (ns: protobuf.NamespaceBase) => {
    for (const nested of ns.nestedArray) {
      if (nested instanceof protobuf.Type) {
        types++;
        const mine = loaded.lookupType(nested.fullName);
        assert.deepEqual(
          mine.fieldsArray.map(shape),
          nested.fieldsArray.map(shape),
          nested.fullName,
        );
        for (const f of mine.fieldsArray) assert.equal(f.options, undefined, f.fullName);
      }
      if (nested instanceof protobuf.Service) {
        const mine = loaded.lookupService(nested.fullName);
        assert.deepEqual(
          mine.methodsArray.map((m) => [m.name, m.requestType, m.responseType, m.responseStream]),
          nested.methodsArray.map((m) => [m.name, m.requestType, m.responseType, m.responseStream]),
        );
      }
      if (nested instanceof protobuf.Namespace) visit(nested);
    }
  };
  visit(parsed.lookup("csi.v1") as protobuf.Namespace);
  // Every `message` of the file was compared (nested ones too).
  const text = Deno.readTextFileSync(new URL("../../proto/csi.proto", import.meta.url));
  assert.equal(types, text.match(/^\s*message \w+/gm)?.length);
  // The descriptor types of the option extensions are not loaded at all.
  assert.equal(loaded.lookup("google.protobuf.FieldOptions"), null);
});

Deno.test("the services are built once per process", () => {
  assert.equal(loadCsiServices(), loadCsiServices());
});

const STAGE = {
  volume_id: "vol-1",
  staging_target_path: "/csi/staging/vol-1",
  volume_capability: {
    mount: { fs_type: "", mount_flags: ["noatime"], volume_mount_group: "" },
    access_mode: { mode: "SINGLE_NODE_WRITER" },
  },
  secrets: { key: "s3cret" },
  volume_context: { dataset: "tank/nomad/vol-1" },
};

const CREATE_RESPONSE = {
  volume: {
    capacity_bytes: "68719476736",
    volume_id: "vol-1",
    volume_context: { dataset: "tank/nomad/vol-1" },
    accessible_topology: [{ segments: { zone: "eu1" } }],
  },
};

Deno.test("every CSI method has the path and shape proto-loader gave it", () => {
  const ours = loadCsiServices();
  const theirs = protoLoaderServices();
  for (const name of ["Identity", "Node", "Controller"] as const) {
    const mine = ours[name].service;
    const ref = theirs[name]!;
    assert.deepEqual(Object.keys(mine).sort(), Object.keys(ref).sort(), name);
    for (const [method, def] of Object.entries(ref)) {
      const m = mine[method]!;
      assert.equal(m.path, def.path);
      assert.equal(m.requestStream, def.requestStream);
      assert.equal(m.responseStream, def.responseStream);
      assert.equal(m.originalName, def.originalName);
    }
  }
});

Deno.test("requests and responses encode and decode exactly as with proto-loader", () => {
  const ours = loadCsiServices();
  const theirs = protoLoaderServices();
  const cases: [keyof typeof ours, string, "request" | "response", object][] = [
    ["Node", "NodeStageVolume", "request", STAGE],
    ["Controller", "CreateVolume", "response", CREATE_RESPONSE],
    ["Identity", "Probe", "response", { ready: { value: true } }],
    ["Identity", "Probe", "response", {}],
    ["Node", "NodeGetVolumeStats", "response", {
      usage: [{ available: "1", total: "2", used: "1", unit: "BYTES" }],
      volume_condition: { abnormal: false, message: "" },
    }],
    ["Controller", "ListSnapshots", "request", { max_entries: 5, starting_token: "x" }],
  ];
  for (const [service, method, side, value] of cases) {
    const mine = ours[service].service[method]!;
    const ref = theirs[service]![method]!;
    const ser = side === "request" ? "requestSerialize" : "responseSerialize";
    const de = side === "request" ? "requestDeserialize" : "responseDeserialize";
    const bytes = mine[ser](value);
    assert.deepEqual(new Uint8Array(bytes), new Uint8Array(ref[ser](value)), `${method} bytes`);
    assert.deepEqual(mine[de](bytes), ref[de](bytes), `${method} decoded`);
  }
});

Deno.test("decoding gives proto field names, string enums and int64, defaults and oneofs", () => {
  const node = loadCsiServices().Node.service;
  const bytes = node.NodeStageVolume!.requestSerialize(STAGE);
  const req = node.NodeStageVolume!.requestDeserialize(bytes) as Record<string, unknown> & {
    volume_capability: Record<string, unknown> & { access_mode: { mode: string } };
  };
  assert.equal(req.staging_target_path, "/csi/staging/vol-1");
  assert.equal(req.volume_capability.access_mode.mode, "SINGLE_NODE_WRITER");
  assert.equal(req.volume_capability.access_type, "mount");
  assert.deepEqual(req.publish_context, {});
  const ctl = loadCsiServices().Controller.service;
  const res = ctl.CreateVolume!.responseDeserialize(
    ctl.CreateVolume!.responseSerialize(CREATE_RESPONSE),
  ) as { volume: { capacity_bytes: unknown; content_source: unknown } };
  assert.equal(res.volume.capacity_bytes, "68719476736");
  assert.equal(res.volume.content_source, null);
});

Deno.test("an array is refused, not sent as an empty message", () => {
  const probe = loadCsiServices().Identity.service.Probe!;
  assert.throws(() => probe.requestSerialize([]), TypeError);
});

Deno.test("serviceDefinition covers each method of a service once", () => {
  const root = loadCsiRoot();
  const identity = root.lookupService("csi.v1.Identity");
  assert.deepEqual(
    Object.keys(serviceDefinition(identity)).sort(),
    identity.methodsArray.map((m) => m.name).sort(),
  );
});
