/** The CSI Identity service: who we are, what we offer, and whether we are ready. */

import { CSI_SPEC_VERSION, PLUGIN_NAME, PLUGIN_VERSION } from "../version.ts";
import type { HealthChecker } from "./health.ts";

/** Identity handlers. */
export class IdentityService {
  readonly #health: HealthChecker;
  readonly #controller: boolean;
  #probed = false;
  #resolveFirstProbe: () => void = () => {};
  readonly #firstProbe = new Promise<void>((resolve) => this.#resolveFirstProbe = resolve);

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

  /**
   * Resolves once the first Probe has been answered, whatever it said: the plugin starts its
   * housekeeping then, not while the orchestrator waits for that answer (src/plugin.ts).
   */
  get firstProbeAnswered(): Promise<void> {
    return this.#firstProbe;
  }

  async Probe(): Promise<unknown> {
    const status = await this.#health.status();
    if (!this.#probed) {
      this.#probed = true;
      // On the next turn of the event loop: by then the answer has been written to the socket.
      setTimeout(this.#resolveFirstProbe, 0);
    }
    return { ready: { value: status.ready } };
  }
}
