/** The CSI Identity service: who we are, what we offer, and whether we are ready. */

import { CSI_SPEC_VERSION, PLUGIN_NAME, PLUGIN_VERSION } from "../version.ts";
import type { HealthChecker } from "./health.ts";

/** Identity handlers. */
export class IdentityService {
  readonly #health: HealthChecker;
  readonly #controller: boolean;

  constructor(health: HealthChecker, opts: { controller: boolean }) {
    this.#health = health;
    this.#controller = opts.controller;
  }

  GetPluginInfo(): Promise<unknown> {
    return Promise.resolve({
      name: PLUGIN_NAME,
      vendor_version: PLUGIN_VERSION,
      manifest: { "csi-spec": CSI_SPEC_VERSION },
    });
  }

  GetPluginCapabilities(): Promise<unknown> {
    const services = [
      ...(this.#controller ? ["CONTROLLER_SERVICE"] : []),
      // Every volume is pinned to its node through the node topology segment.
      "VOLUME_ACCESSIBILITY_CONSTRAINTS",
    ];
    return Promise.resolve({ capabilities: services.map((type) => ({ service: { type } })) });
  }

  async Probe(): Promise<unknown> {
    const status = await this.#health.status();
    return { ready: { value: status.ready } };
  }
}
