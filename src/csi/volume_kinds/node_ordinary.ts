/**
 * NodeStage and NodeUnstage of an ordinary volume: its dataset is on this node already, so a
 * stage only mounts it and an unstage leaves nothing to do.
 */

import type { NodeKind, StageRequest } from "./node_kind.ts";

/** The node's side of ordinary volumes. */
export class OrdinaryStaging implements NodeKind {
  stage(_v: StageRequest, mount: () => Promise<unknown>): Promise<unknown> {
    return mount();
  }

  unstaged(_dataset: string): Promise<undefined> {
    return Promise.resolve(undefined);
  }
}
