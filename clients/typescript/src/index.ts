/**
 * Client of the authz service (`authz serve`): the sandbox capability gate of an
 * agent-orchestration server as a call that fails closed.
 *
 * - {@link effectiveSandboxCapabilities}: the nine capability booleans a lease is entitled to
 *   now, or `null` when the service cannot be reached or answers anything but a well-formed
 *   decision.
 * - {@link openDuplexChannelGate} and {@link runnerIngressGate}: resolve on a grant; otherwise
 *   throw an {@link AuthzGateError} whose `message` is exactly the contract's message
 *   (docs/contract.md section 7).
 *
 * No runtime dependencies: it speaks HTTP with node:http and node:https, so a unix socket and a
 * TLS client certificate need nothing else.
 */
import * as http from "node:http";
import * as https from "node:https";

/** The nine capability keys, in the contract's order (docs/contract.md section 2). */
export const CAPABILITY_KEYS = [
  "reusableLeases",
  "nativeSyncIn",
  "nativeSyncOut",
  "persistentProcessSessions",
  "independentControlCommands",
  "incrementalSessionOutput",
  "concurrentSyncOperations",
  "duplexCommandStream",
  "runnerWebSocketIngress",
] as const;

export type CapabilityKey = (typeof CAPABILITY_KEYS)[number];

/** The snapshot: each of the nine capabilities as a boolean. */
export type SandboxCapabilities = Record<CapabilityKey, boolean>;

/** The operations the service decides. */
export type Operation = "openDuplexChannel" | "getRunnerIngressEndpoint";

/** What the gate is asked about (docs/contract.md section 3). `operation` is set by the gate. */
export interface GateRequest {
  environment?: unknown;
  lease?: unknown;
  command?: unknown;
}

/** The decision document (docs/contract.md section 8). */
export interface Decision {
  allow: boolean;
  code: string;
  message: string;
  reasons: string[];
  capabilities: SandboxCapabilities;
  decision_id: string;
  revision: string;
}

/** Options of every call. All are optional. */
export interface AuthzClientOptions {
  /**
   * Where the service listens: `http://host:port`, `https://host:port`, or
   * `unix:///absolute/path.sock` (the same form as `authz serve --addr`). A path prefix
   * (`https://gw.example/authz`) is kept. Default: `http://127.0.0.1:8181`.
   */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <token>` when given. */
  token?: string;
  /**
   * TLS for `https://` URLs: a client certificate and key (PEM), and the CA that signed the
   * service's certificate when it is not a public one.
   */
  tls?: {
    cert?: string | Buffer;
    key?: string | Buffer;
    ca?: string | Buffer | Array<string | Buffer>;
    /** The name to check the service's certificate against, when it differs from the host. */
    servername?: string;
  };
  /** Bound on the whole call, in milliseconds. Default: 5000 (the service's own evalTimeout). */
  timeoutMs?: number;
  /** Cancels the call; a cancelled gate call throws with code `AUTHZ_ABORTED`. */
  signal?: AbortSignal;
}

/** Codes of the contract's denials (docs/contract.md section 7). */
export const DUPLEX_CHANNEL_CAPABILITY_DENIED = "DUPLEX_CHANNEL_CAPABILITY_DENIED";
export const DUPLEX_CHANNEL_UNSUPPORTED = "DUPLEX_CHANNEL_UNSUPPORTED";
export const ENVIRONMENT_DRIVER_NOT_REGISTERED = "ENVIRONMENT_DRIVER_NOT_REGISTERED";
export const RUNNER_INGRESS_CAPABILITY_DENIED = "RUNNER_INGRESS_CAPABILITY_DENIED";
export const RUNNER_INGRESS_UNSUPPORTED = "RUNNER_INGRESS_UNSUPPORTED";

/**
 * Codes of calls that got no decision. The gate fails closed on each of them: it throws, with
 * the operation's capability-denied message.
 */
export const AUTHZ_UNREACHABLE = "AUTHZ_UNREACHABLE"; // connection refused, DNS, TLS, reset
export const AUTHZ_TIMEOUT = "AUTHZ_TIMEOUT"; // timeoutMs elapsed
export const AUTHZ_ABORTED = "AUTHZ_ABORTED"; // the caller's AbortSignal fired
export const AUTHZ_BAD_STATUS = "AUTHZ_BAD_STATUS"; // any status but 200 (evaluation failure, bad request, …)
export const AUTHZ_MALFORMED_ANSWER = "AUTHZ_MALFORMED_ANSWER"; // 200, but not a well-formed decision

/** The exact messages of the contract, by code; `<driver>` stands for the driver name. */
const MESSAGES: Record<string, RegExp> = {
  [DUPLEX_CHANNEL_CAPABILITY_DENIED]: /^Sandbox lease does not grant the duplex command stream capability\.$/,
  [DUPLEX_CHANNEL_UNSUPPORTED]: /^Environment driver ".*" does not support duplex channels\.$/s,
  [ENVIRONMENT_DRIVER_NOT_REGISTERED]: /^Environment driver ".*" is not registered in the environment runtime yet\.$/s,
  [RUNNER_INGRESS_CAPABILITY_DENIED]: /^Sandbox lease does not grant runner WebSocket ingress\.$/,
  [RUNNER_INGRESS_UNSUPPORTED]: /^Environment driver ".*" does not support runner ingress\.$/s,
};

interface OperationContract {
  capability: CapabilityKey;
  deniedCode: string;
  deniedMessage: string;
  codes: readonly string[];
}

const OPERATIONS: Record<Operation, OperationContract> = {
  openDuplexChannel: {
    capability: "duplexCommandStream",
    deniedCode: DUPLEX_CHANNEL_CAPABILITY_DENIED,
    deniedMessage: "Sandbox lease does not grant the duplex command stream capability.",
    codes: [DUPLEX_CHANNEL_CAPABILITY_DENIED, DUPLEX_CHANNEL_UNSUPPORTED, ENVIRONMENT_DRIVER_NOT_REGISTERED],
  },
  getRunnerIngressEndpoint: {
    capability: "runnerWebSocketIngress",
    deniedCode: RUNNER_INGRESS_CAPABILITY_DENIED,
    deniedMessage: "Sandbox lease does not grant runner WebSocket ingress.",
    codes: [RUNNER_INGRESS_CAPABILITY_DENIED, RUNNER_INGRESS_UNSUPPORTED, ENVIRONMENT_DRIVER_NOT_REGISTERED],
  },
};

/**
 * The error of a gate that did not grant. `message` is the contract's message: the service's
 * own on a deny, the operation's capability-denied message when no decision was obtained.
 * `code` is the decision's code on a deny, one of the `AUTHZ_*` codes otherwise.
 */
export class AuthzGateError extends Error {
  override readonly name = "AuthzGateError";
  /** The contract's code (a deny) or an `AUTHZ_*` code (no decision). */
  readonly code: string;
  /** The decision's reasons (docs/contract.md section 11); `[]` when there was no decision. */
  readonly reasons: string[];
  /** The decision's id (the key of its decision log line); `""` when there was no decision. */
  readonly decisionId: string;
  /** The HTTP status of the answer, when there was one. */
  readonly status?: number;
  /** The service's `X-Authz-Error` header (why a decision could not be evaluated), when sent. */
  readonly authzError?: string;
  /** What went wrong, in words, for logs. Never shown as the message. */
  readonly detail: string;

  constructor(
    message: string,
    fields: {
      code: string;
      reasons?: string[];
      decisionId?: string;
      status?: number;
      authzError?: string;
      detail?: string;
      cause?: unknown;
    },
  ) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.code = fields.code;
    this.reasons = fields.reasons ?? [];
    this.decisionId = fields.decisionId ?? "";
    if (fields.status !== undefined) this.status = fields.status;
    if (fields.authzError !== undefined) this.authzError = fields.authzError;
    this.detail = fields.detail ?? message;
  }
}

const DEFAULT_BASE_URL = "http://127.0.0.1:8181";
const DEFAULT_TIMEOUT_MS = 5000;
const MAX_ANSWER_BYTES = 1 << 20;

/**
 * The nine capabilities the lease is entitled to now (`POST /v1/capabilities`), or `null` when
 * the service cannot be reached, does not answer in time, the call is aborted, or the answer is
 * anything but status 200 with all nine booleans. It never throws: treat `null` as "nothing".
 */
export async function effectiveSandboxCapabilities(
  request: GateRequest,
  options: AuthzClientOptions = {},
): Promise<SandboxCapabilities | null> {
  let answer: Answer;
  try {
    answer = await post("/v1/capabilities", { ...request, operation: "openDuplexChannel" }, options);
  } catch {
    return null;
  }
  if (answer.status !== 200) return null;
  const body = parseJSON(answer.body);
  if (!isObject(body)) return null;
  return readCapabilities(body["capabilities"]);
}

/**
 * Resolves with the decision when the service grants the duplex command stream for this lease
 * (`openDuplexChannel`); throws an {@link AuthzGateError} otherwise, with the contract's code
 * and message (`DUPLEX_CHANNEL_CAPABILITY_DENIED`, `DUPLEX_CHANNEL_UNSUPPORTED`,
 * `ENVIRONMENT_DRIVER_NOT_REGISTERED`) or, when no decision was obtained, an `AUTHZ_*` code
 * with the capability-denied message.
 */
export function openDuplexChannelGate(request: GateRequest, options: AuthzClientOptions = {}): Promise<Decision> {
  return gate("openDuplexChannel", request, options);
}

/**
 * Resolves with the decision when the service grants runner WebSocket ingress for this lease
 * (`getRunnerIngressEndpoint`); throws an {@link AuthzGateError} otherwise
 * (`RUNNER_INGRESS_CAPABILITY_DENIED`, `RUNNER_INGRESS_UNSUPPORTED`,
 * `ENVIRONMENT_DRIVER_NOT_REGISTERED`, or an `AUTHZ_*` code).
 */
export function runnerIngressGate(request: GateRequest, options: AuthzClientOptions = {}): Promise<Decision> {
  return gate("getRunnerIngressEndpoint", request, options);
}

/** A client with its options bound, for callers that make many calls. */
export interface AuthzClient {
  effectiveSandboxCapabilities(request: GateRequest): Promise<SandboxCapabilities | null>;
  openDuplexChannelGate(request: GateRequest): Promise<Decision>;
  runnerIngressGate(request: GateRequest): Promise<Decision>;
}

/** Binds options once; a `signal` given here applies to every call. */
export function createAuthzClient(options: AuthzClientOptions = {}): AuthzClient {
  const opts = { ...options };
  return {
    effectiveSandboxCapabilities: (r) => effectiveSandboxCapabilities(r, opts),
    openDuplexChannelGate: (r) => openDuplexChannelGate(r, opts),
    runnerIngressGate: (r) => runnerIngressGate(r, opts),
  };
}

async function gate(operation: Operation, request: GateRequest, options: AuthzClientOptions): Promise<Decision> {
  const op = OPERATIONS[operation];
  const noDecision = (code: string, detail: string, extra: { status?: number; authzError?: string; cause?: unknown; reasons?: string[]; decisionId?: string } = {}) =>
    new AuthzGateError(op.deniedMessage, { code, detail, ...extra });

  let answer: Answer;
  try {
    answer = await post("/v1/authorize", { ...request, operation }, options);
  } catch (err) {
    if (err instanceof CallError) throw noDecision(err.code, err.message, { cause: err.cause });
    throw noDecision(AUTHZ_UNREACHABLE, `authz: ${String(err)}`, { cause: err });
  }
  const authzError = answer.headers["x-authz-error"];
  const header = typeof authzError === "string" ? { authzError } : {};
  const body = parseJSON(answer.body);
  const doc = readDecision(body);

  if (answer.status !== 200) {
    // An evaluation failure (500) carries a fail-closed deny document: keep its reasons and id.
    const detail = isObject(body) && typeof body["message"] === "string" && body["message"] !== "" ? `: ${body["message"]}` : "";
    throw noDecision(AUTHZ_BAD_STATUS, `authz answered status ${answer.status}${authzError ? ` (${authzError})` : ""}${detail}`, {
      status: answer.status,
      ...header,
      reasons: doc?.reasons ?? [],
      decisionId: doc?.decision_id ?? "",
    });
  }
  if (doc === null) {
    throw noDecision(AUTHZ_MALFORMED_ANSWER, "authz answered 200 with a body that is not a decision document", { status: 200, ...header });
  }
  if (doc.allow) {
    if (doc.capabilities[op.capability] !== true) {
      throw noDecision(AUTHZ_MALFORMED_ANSWER, `authz granted ${operation} without the ${op.capability} capability: not trusted`, {
        status: 200,
        decisionId: doc.decision_id,
      });
    }
    return doc;
  }
  const pattern = MESSAGES[doc.code];
  if (!op.codes.includes(doc.code) || pattern === undefined || !pattern.test(doc.message)) {
    throw noDecision(AUTHZ_MALFORMED_ANSWER, `authz denied with a code or message outside the contract: ${JSON.stringify(doc.code)} ${JSON.stringify(doc.message)}`, {
      status: 200,
      reasons: doc.reasons,
      decisionId: doc.decision_id,
    });
  }
  throw new AuthzGateError(doc.message, {
    code: doc.code,
    reasons: doc.reasons,
    decisionId: doc.decision_id,
    status: 200,
    detail: `authz denied ${operation}: ${doc.code} (${doc.reasons.join(", ") || "no reasons"})`,
  });
}

/** A well-formed decision document, or null. Only the boolean `true` is true. */
function readDecision(v: unknown): Decision | null {
  if (!isObject(v)) return null;
  const { allow, code, message, reasons, decision_id, revision } = v;
  if (typeof allow !== "boolean" || typeof code !== "string" || typeof message !== "string") return null;
  if (typeof decision_id !== "string" || typeof revision !== "string") return null;
  if (!Array.isArray(reasons) || !reasons.every((r): r is string => typeof r === "string")) return null;
  const capabilities = readCapabilities(v["capabilities"]);
  if (capabilities === null) return null;
  if (allow && (code !== "" || message !== "" || reasons.length > 0)) return null;
  if (!allow && code === "") return null;
  return { allow, code, message, reasons: [...reasons], capabilities, decision_id, revision };
}

function readCapabilities(v: unknown): SandboxCapabilities | null {
  if (!isObject(v)) return null;
  const out = {} as SandboxCapabilities;
  for (const k of CAPABILITY_KEYS) {
    const b = v[k];
    if (typeof b !== "boolean") return null;
    out[k] = b;
  }
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function parseJSON(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** An HTTP call that got no answer, with the code the gate throws. */
class CallError extends Error {
  constructor(
    readonly code: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** The request target: a URL, or a unix socket and a path prefix. */
function target(baseUrl: string): { url: URL; socketPath?: string } {
  if (baseUrl.startsWith("unix://")) {
    const socketPath = baseUrl.slice("unix://".length);
    if (!socketPath.startsWith("/")) {
      throw new CallError(AUTHZ_UNREACHABLE, `baseUrl ${baseUrl}: a unix socket is written unix:///absolute/path`);
    }
    return { url: new URL("http://authz/"), socketPath };
  }
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch (cause) {
    throw new CallError(AUTHZ_UNREACHABLE, `baseUrl ${JSON.stringify(baseUrl)} is not a URL: use http://host:port, https://host:port or unix:///path`, { cause });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new CallError(AUTHZ_UNREACHABLE, `baseUrl ${baseUrl}: the scheme must be http, https or unix`);
  }
  return { url };
}

function post(path: string, payload: unknown, options: AuthzClientOptions): Promise<Answer> {
  return new Promise<Answer>((resolve, reject) => {
    const { url, socketPath } = target(options.baseUrl ?? DEFAULT_BASE_URL);
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const signal = options.signal;
    if (signal?.aborted) {
      reject(new CallError(AUTHZ_ABORTED, "the call was aborted before it started", { cause: signal.reason }));
      return;
    }
    const body = Buffer.from(JSON.stringify(payload));
    const headers: http.OutgoingHttpHeaders = {
      "content-type": "application/json",
      accept: "application/json",
      "content-length": body.length,
    };
    if (options.token !== undefined && options.token !== "") headers["authorization"] = `Bearer ${options.token}`;

    const base = url.pathname.endsWith("/") ? url.pathname.slice(0, -1) : url.pathname;
    const common: https.RequestOptions = {
      method: "POST",
      path: base + path,
      headers,
      agent: false,
    };
    if (socketPath !== undefined) {
      common.socketPath = socketPath;
    } else {
      common.host = url.hostname.replace(/^\[(.*)\]$/, "$1");
      if (url.port !== "") common.port = Number(url.port);
    }
    const isTLS = socketPath === undefined && url.protocol === "https:";
    if (isTLS && options.tls) {
      const { cert, key, ca, servername } = options.tls;
      if (cert !== undefined) common.cert = cert;
      if (key !== undefined) common.key = key;
      if (ca !== undefined) common.ca = ca;
      if (servername !== undefined) common.servername = servername;
    }

    let settled = false;
    const finish = (err: CallError | null, answer?: Answer) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (err !== null) {
        req.destroy();
        reject(err);
      } else {
        resolve(answer as Answer);
      }
    };
    const onAbort = () => finish(new CallError(AUTHZ_ABORTED, "the call was aborted", { cause: signal?.reason }));
    const timer = setTimeout(() => finish(new CallError(AUTHZ_TIMEOUT, `authz did not answer within ${timeoutMs} ms`)), timeoutMs);
    signal?.addEventListener("abort", onAbort, { once: true });

    const req = (isTLS ? https : http).request(common, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        size += c.length;
        if (size > MAX_ANSWER_BYTES) {
          finish(new CallError(AUTHZ_MALFORMED_ANSWER, `authz answered more than ${MAX_ANSWER_BYTES} bytes`));
          return;
        }
        chunks.push(c);
      });
      res.on("end", () => finish(null, { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString("utf8") }));
      res.on("error", (cause) => finish(new CallError(AUTHZ_UNREACHABLE, `authz: reading the answer: ${cause.message}`, { cause })));
    });
    req.on("error", (cause) => finish(new CallError(AUTHZ_UNREACHABLE, `authz could not be reached at ${socketPath ?? url.origin}: ${cause.message}`, { cause })));
    req.end(body);
  });
}
