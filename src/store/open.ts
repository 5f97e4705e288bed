/**
 * The store a config names. Its own module so that what imports it (the plugin's store parts,
 * `zfs-csi verify`, `zfs-csi takeover`, the host volume plugin) loads the store backends, and a
 * plugin started without `--store` does not.
 */

import type { StoreConfig } from "../config.ts";
import { FileStore } from "./file_store.ts";
import { S3Store } from "./s3_store.ts";
import type { Store } from "./store.ts";

/** The store a config names. */
export function openStore(config: StoreConfig): Store {
  if (config.kind === "file") return new FileStore(config.dir);
  const c = config.credentials;
  const token = c.sessionToken;
  return new S3Store({
    endpoint: new URL(config.endpoint),
    region: config.region,
    bucket: config.bucket,
    prefix: config.prefix,
    pathStyle: config.pathStyle,
    credentials: {
      accessKeyId: c.accessKeyId,
      secretAccessKey: c.secretAccessKey,
      ...(token === undefined ? {} : { sessionToken: token }),
    },
  });
}
