/**
 * Assertions on what a call throws, shared by the unit tests: a {@linkcode CsiError} with a
 * gRPC code and message, or a {@linkcode ZfsError} of a kind. Each fails when nothing is thrown.
 */

import assert from "node:assert/strict";
import { CsiError, type GrpcCode, ZfsError, type ZfsErrorKind } from "../../src/errors.ts";

/** What a message must be: all of it (a string), a pattern it matches, or a part of it. */
export type MessageMatcher = string | RegExp | { readonly includes: string };

const prefix = (label: string | undefined) => label === undefined ? "" : `${label}: `;

/** What `fn` throws; fails when it returns. */
export function thrown(fn: () => unknown, label?: string): unknown {
  try {
    fn();
  } catch (err) {
    return err;
  }
  assert.fail(`${prefix(label)}expected an error, but nothing was thrown`);
}

/** What `p` rejects with; fails when it resolves. */
export async function rejected(p: Promise<unknown>, label?: string): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  assert.fail(`${prefix(label)}expected an error, but the promise resolved`);
}

/** Asserts that `message` is what `expected` says it must be (anything, when undefined). */
export function assertMessage(message: string, expected?: MessageMatcher, label?: string): void {
  if (expected === undefined) return;
  if (typeof expected === "string") {
    // Without a label, assert.equal shows the two messages side by side.
    if (label === undefined) assert.equal(message, expected);
    else assert.equal(message, expected, label);
  } else if (expected instanceof RegExp) {
    assert.match(message, expected, `${prefix(label)}${JSON.stringify(message)} ~ ${expected}`);
  } else {
    assert.ok(
      message.includes(expected.includes),
      `${prefix(label)}${JSON.stringify(message)} lacks ${JSON.stringify(expected.includes)}`,
    );
  }
}

/** Asserts that `err` is a CsiError with `code` and, when given, `message`; returns it. */
export function assertCsiError(
  err: unknown,
  code: GrpcCode,
  message?: MessageMatcher,
  label?: string,
): CsiError {
  assert.ok(err instanceof CsiError, `${prefix(label)}expected a CsiError, got ${String(err)}`);
  assert.equal(err.code, code, `${prefix(label)}${err.message}`);
  assertMessage(err.message, message, label);
  return err;
}

/** Asserts that `fn` throws a CsiError with `code` and, when given, `message`; returns it. */
export function assertThrowsCsi(
  fn: () => unknown,
  code: GrpcCode,
  message?: MessageMatcher,
  label?: string,
): CsiError {
  return assertCsiError(thrown(fn, label), code, message, label);
}

/** Asserts that `p` rejects with a CsiError with `code` and, when given, `message`; returns it. */
export async function assertRejectsCsi(
  p: Promise<unknown>,
  code: GrpcCode,
  message?: MessageMatcher,
  label?: string,
): Promise<CsiError> {
  return assertCsiError(await rejected(p, label), code, message, label);
}

/** Asserts that `p` rejects with a ZfsError of `kind`; returns it. */
export async function assertRejectsZfs(
  p: Promise<unknown>,
  kind: ZfsErrorKind,
  label?: string,
): Promise<ZfsError> {
  const err = await rejected(p, label);
  assert.ok(err instanceof ZfsError, `${prefix(label)}expected a ZfsError, got ${String(err)}`);
  assert.equal(err.kind, kind, `${prefix(label)}${err.message}`);
  return err;
}
