/**
 * The README and docs/ link into each other and into nomad/README.md by file and heading; a
 * heading renamed or a section moved must not leave a link pointing at nothing. And the README
 * stays what a Nomad operator reads first: short, with the reference in docs/.
 */

import assert from "node:assert/strict";
import { dirname, join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** The documents operators read, relative to the repository root. */
async function documents(): Promise<string[]> {
  const docs: string[] = [];
  for await (const entry of Deno.readDir(join(ROOT, "docs"))) {
    if (entry.isFile && entry.name.endsWith(".md")) docs.push(`docs/${entry.name}`);
  }
  return ["README.md", "nomad/README.md", ...docs.sort()];
}

/** Lines outside fenced code blocks, with their numbers. */
function prose(text: string): Array<[number, string]> {
  const out: Array<[number, string]> = [];
  let fenced = false;
  text.split("\n").forEach((line, i) => {
    if (line.startsWith("```")) fenced = !fenced;
    else if (!fenced) out.push([i + 1, line]);
  });
  return out;
}

/** A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens. */
export function anchorOf(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N}_\- ]/gu, "").replaceAll(" ", "-");
}

/** Every anchor of a Markdown text; a repeated heading gets -1, -2, ... as on GitHub. */
export function anchorsOf(text: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const [, line] of prose(text)) {
    const m = /^#{1,6} (.+)$/.exec(line);
    if (!m) continue;
    const base = anchorOf(m[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

Deno.test("anchorOf makes GitHub's anchors from headings", () => {
  assert.equal(
    anchorOf("Who may set what: the operator's policy"),
    "who-may-set-what-the-operators-policy",
  );
  assert.equal(
    anchorOf("Where it is: `nomad volume status -verbose`"),
    "where-it-is-nomad-volume-status--verbose",
  );
  assert.deepEqual([...anchorsOf("# A\n\n```\n# not a heading\n```\n## A\n")], ["a", "a-1"]);
});

Deno.test("every relative link of the README, docs/ and nomad/README.md reaches its file and heading", async () => {
  const broken: string[] = [];
  let links = 0;
  for (const doc of await documents()) {
    const text = await Deno.readTextFile(join(ROOT, doc));
    for (const [line, content] of prose(text)) {
      for (const m of content.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = m[1]!;
        if (/^[a-z]+:/.test(target)) continue;
        links++;
        const [path = "", anchor] = target.split("#", 2);
        const file = path === "" ? join(ROOT, doc) : normalize(join(ROOT, dirname(doc), path));
        let targetText: string;
        try {
          const info = await Deno.stat(file);
          if (!info.isFile || anchor === undefined) continue;
          targetText = await Deno.readTextFile(file);
        } catch (err) {
          if (!(err instanceof Deno.errors.NotFound)) throw err;
          broken.push(`${doc}:${line}: ${target} (no ${relative(ROOT, file)})`);
          continue;
        }
        if (!anchorsOf(targetText).has(anchor)) {
          broken.push(`${doc}:${line}: ${target} (no heading "#${anchor}")`);
        }
      }
    }
  }
  assert.ok(links > 50, `only ${links} links found: is the pattern right?`);
  assert.deepEqual(broken, []);
});

Deno.test("the README stays under 300 lines and links the reference in docs/", async () => {
  const readme = await Deno.readTextFile(join(ROOT, "README.md"));
  const lines = readme.split("\n").length - 1;
  assert.ok(lines < 300, `README.md has ${lines} lines; move reference material to docs/`);
  for (const doc of await documents()) {
    if (doc.startsWith("docs/") && doc !== "docs/README.md") {
      assert.ok(readme.includes(`](${doc})`), `README.md does not link ${doc}`);
    }
  }
});
