/**
 * The metrics endpoint's listen address, `host:port`: what Deno.serve binds and what the
 * build's --allow-net must name (src/permissions.ts).
 */

/** A parsed listen address. */
export interface ListenAddress {
  /** For Deno.serve: an IPv4 address, a name, or an IPv6 address without brackets. */
  readonly hostname: string;
  readonly port: number;
  /** As --allow-net and permission queries write it: `127.0.0.1:9474`, `[::1]:9474`. */
  readonly hostPort: string;
}

const LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const NAME = new RegExp(`^${LABEL}(\\.${LABEL})*$`);

/**
 * Parses `host:port`; the port is required (1-65535), the host is an IPv4 address, a DNS name
 * or a bracketed IPv6 address (`[::]:9474`).
 * @throws {TypeError} saying what is wrong
 */
export function parseListenAddress(text: string): ListenAddress {
  const value = text.toLowerCase();
  const m = /^(\[[0-9a-f:.]+\]|[^:\[\]]+):(\d{1,5})$/.exec(value);
  const port = m ? Number(m[2]) : NaN;
  if (!m || !(port >= 1 && port <= 65535)) {
    throw new TypeError(
      `"${text}" is not host:port with a port from 1 to 65535, e.g. 127.0.0.1:9474 or [::1]:9474`,
    );
  }
  const host = m[1]!;
  if (host.startsWith("[")) {
    return { hostname: host.slice(1, -1), port, hostPort: `${host}:${port}` };
  }
  if (!NAME.test(host)) {
    throw new TypeError(`"${text}": "${host}" is not an IPv4 address or host name`);
  }
  return { hostname: host, port, hostPort: `${host}:${port}` };
}
