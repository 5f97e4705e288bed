/**
 * The few XML documents S3 exchanges with the store (src/store/s3_store.ts): a small reader
 * for their plain element trees (no attributes needed, namespaces ignored) and the typed
 * results read from them. Pure.
 */

/** One element: its local name, child elements and the text directly inside it. */
export interface XmlElement {
  readonly name: string;
  readonly children: XmlElement[];
  text: string;
}

const ENTITIES: Readonly<Record<string, string>> = {
  amp: "&",
  lt: "<",
  gt: ">",
  quot: '"',
  apos: "'",
};

function decodeEntities(text: string): string {
  return text.replace(/&(#x[0-9a-fA-F]+|#[0-9]+|[a-z]+);/g, (whole, ref: string) => {
    if (ref.startsWith("#x")) return String.fromCodePoint(parseInt(ref.slice(2), 16));
    if (ref.startsWith("#")) return String.fromCodePoint(parseInt(ref.slice(1), 10));
    return ENTITIES[ref] ?? whole;
  });
}

function localName(tag: string): string {
  const name = tag.split(/[\s/>]/, 1)[0] ?? "";
  return name.slice(name.indexOf(":") + 1);
}

/**
 * Reads an XML document into its root element.
 * @throws {SyntaxError} when the text is not well-formed enough to read
 */
export function parseXml(xml: string): XmlElement {
  const root: XmlElement = { name: "", children: [], text: "" };
  const stack: XmlElement[] = [root];
  const token = /<!--[\s\S]*?-->|<!\[CDATA\[([\s\S]*?)\]\]>|<\?[\s\S]*?\?>|<![^>]*>|<[^>]*>|[^<]+/g;
  for (const match of xml.matchAll(token)) {
    const t = match[0];
    const top = stack.at(-1);
    if (top === undefined) throw new SyntaxError("XML has content after its root element");
    if (t.startsWith("<!--") || t.startsWith("<?") || /^<![^[]/.test(t)) continue;
    if (t.startsWith("<![CDATA[")) {
      top.text += match[1] ?? "";
    } else if (t.startsWith("</")) {
      const name = localName(t.slice(2));
      if (stack.length < 2 || top.name !== name) {
        throw new SyntaxError(`XML closes <${name}> that is not open`);
      }
      stack.pop();
    } else if (t.startsWith("<")) {
      if (!t.endsWith(">")) throw new SyntaxError("XML has an unterminated tag");
      const element: XmlElement = { name: localName(t.slice(1)), children: [], text: "" };
      if (element.name === "") throw new SyntaxError("XML has a tag without a name");
      top.children.push(element);
      if (!t.endsWith("/>")) stack.push(element);
    } else {
      top.text += decodeEntities(t);
    }
  }
  const [first, ...rest] = root.children;
  if (stack.length !== 1 || first === undefined || rest.length > 0) {
    throw new SyntaxError("XML does not have exactly one complete root element");
  }
  return first;
}

/** The child elements named `name`. */
export function childrenNamed(element: XmlElement, name: string): XmlElement[] {
  return element.children.filter((c) => c.name === name);
}

/** The text of the first child named `name`, or undefined. */
export function childText(element: XmlElement, name: string): string | undefined {
  return element.children.find((c) => c.name === name)?.text;
}

/** An ETag without its surrounding quotes (S3 quotes them in headers and listings). */
export function unquoteEtag(etag: string): string {
  const t = etag.trim();
  return t.length >= 2 && t.startsWith('"') && t.endsWith('"') ? t.slice(1, -1) : t;
}

/** An `<Error>` document: S3's answer to a failed request. */
export interface S3ErrorBody {
  readonly code: string;
  readonly message: string;
}

/**
 * The code and message of an `<Error>` document; undefined for any other text (an empty body,
 * HTML from a proxy). Other fields (the string to sign, the key id) are left out on purpose.
 */
export function parseErrorBody(xml: string): S3ErrorBody | undefined {
  let root: XmlElement;
  try {
    root = parseXml(xml);
  } catch {
    return undefined;
  }
  if (root.name !== "Error") return undefined;
  return { code: childText(root, "Code") ?? "", message: childText(root, "Message") ?? "" };
}

/** One object of a listing, its key as S3 has it (with the store's prefix). */
export interface ListedObject {
  readonly key: string;
  readonly size: number;
  readonly etag: string;
  /** Its LastModified (the server's clock), when the listing gives a valid one. */
  readonly lastModifiedMs?: number;
}

/** One page of ListObjectsV2. */
export interface ListPage {
  readonly objects: ListedObject[];
  /** Set when there are more pages: pass it as continuation-token. */
  readonly nextContinuationToken?: string;
}

function requireRoot(xml: string, name: string): XmlElement {
  const root = parseXml(xml);
  if (root.name !== name) throw new SyntaxError(`Expected <${name}>, got <${root.name}>`);
  return root;
}

/** ISO 8601 as S3 writes LastModified (`2024-05-01T10:00:00.000Z`), with a zone. */
const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/;

/** A LastModified in ms since the epoch, or undefined when it is missing or not such a time. */
function lastModified(text: string | undefined): number | undefined {
  const t = text?.trim();
  if (t === undefined || !ISO_TIME.test(t)) return undefined;
  const ms = Date.parse(t);
  return Number.isFinite(ms) ? ms : undefined;
}

/**
 * Reads a ListObjectsV2 answer (`<ListBucketResult>`). A missing or unreadable LastModified
 * leaves `lastModifiedMs` out (what needs it then does nothing: src/replicate/prune.ts).
 * @throws {SyntaxError} when it is not one, or an entry lacks a key or a valid size
 */
export function parseListObjectsV2(xml: string): ListPage {
  const root = requireRoot(xml, "ListBucketResult");
  const objects = childrenNamed(root, "Contents").map((c): ListedObject => {
    const key = childText(c, "Key");
    const size = Number(childText(c, "Size"));
    if (!key || !Number.isSafeInteger(size) || size < 0) {
      throw new SyntaxError("A listed object has no key or no valid size");
    }
    const etag = unquoteEtag(childText(c, "ETag") ?? "");
    const lastModifiedMs = lastModified(childText(c, "LastModified"));
    return lastModifiedMs === undefined ? { key, size, etag } : { key, size, etag, lastModifiedMs };
  });
  const truncated = childText(root, "IsTruncated") === "true";
  const token = childText(root, "NextContinuationToken");
  if (truncated && !token) throw new SyntaxError("A truncated listing has no continuation token");
  return truncated && token ? { objects, nextContinuationToken: token } : { objects };
}

/**
 * The upload id of a CreateMultipartUpload answer (`<InitiateMultipartUploadResult>`).
 * @throws {SyntaxError} when it has none
 */
export function parseInitiateMultipartUpload(xml: string): string {
  const id = childText(requireRoot(xml, "InitiateMultipartUploadResult"), "UploadId");
  if (!id) throw new SyntaxError("CreateMultipartUpload answered without an upload id");
  return id;
}

/** What a CompleteMultipartUpload answer says: the etag, or an error sent with status 200. */
export type CompleteResult =
  | { readonly etag: string; readonly error?: undefined }
  | { readonly error: S3ErrorBody };

/**
 * Reads a CompleteMultipartUpload answer. S3 may answer 200 and still fail, with an `<Error>`
 * body (the status is sent before the parts are joined): that is returned as `error`.
 * @throws {SyntaxError} when it is neither document
 */
export function parseCompleteMultipartUpload(xml: string): CompleteResult {
  const root = parseXml(xml);
  if (root.name === "Error") {
    return {
      error: { code: childText(root, "Code") ?? "", message: childText(root, "Message") ?? "" },
    };
  }
  if (root.name !== "CompleteMultipartUploadResult") {
    throw new SyntaxError(`Expected <CompleteMultipartUploadResult>, got <${root.name}>`);
  }
  return { etag: unquoteEtag(childText(root, "ETag") ?? "") };
}

function escapeXml(text: string): string {
  return text.replace(
    /[&<>"']/g,
    (c) => `&${Object.keys(ENTITIES).find((k) => ENTITIES[k] === c)};`,
  );
}

/** The body of CompleteMultipartUpload: the parts in order, each etag quoted as S3 gave it. */
export function completeMultipartUploadXml(etags: readonly string[]): string {
  const parts = etags.map((etag, i) =>
    `<Part><PartNumber>${i + 1}</PartNumber><ETag>${escapeXml(`"${etag}"`)}</ETag></Part>`
  );
  return `<?xml version="1.0" encoding="UTF-8"?>\n` +
    `<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">` +
    `${parts.join("")}</CompleteMultipartUpload>`;
}
