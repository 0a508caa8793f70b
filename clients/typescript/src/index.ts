/**
 * Client of the authz service (`authz serve`): the sandbox capability gate of an
 * agent-orchestration server as a call that fails closed.
 *
 * - {@link effectiveSandboxCapabilities}: the nine capability booleans a lease is entitled to
 *   now, or `null` when the service cannot be reached or answers anything but a well-formed
 *   decision.
 * - {@link openDuplexChannelGate} and {@link runnerIngressGate}: resolve on a grant; otherwise
 *   throw an {@link AuthzGateError} whose `message` is exactly the contract's message
 *   (docs/contract.md, "Codes and messages").
 * - {@link watchDuplexGrant}: the duplex grant held open; `onRevoke` is told when it ends.
 *
 * No runtime dependencies: it speaks HTTP with node:http and node:https, so a unix socket and a
 * TLS client certificate need nothing else. Connections are kept alive and reused. Published as
 * ES module and CommonJS both (`import` or `require`).
 */
import * as http from "node:http";
import * as https from "node:https";

import { watchGrant, type DuplexGrant, type WatchHandlers, type WatchOptions, type WatchParts } from "./watch.js";

export type { DuplexGrant, WatchHandlers, WatchOptions } from "./watch.js";
import {
  AUTHZ_ABORTED,
  AUTHZ_BAD_STATUS,
  AUTHZ_MALFORMED_ANSWER,
  AUTHZ_TIMEOUT,
  AUTHZ_UNREACHABLE,
  AuthzGateError,
  CAPABILITY_KEYS,
  DUPLEX_CHANNEL_CAPABILITY_DENIED,
  DUPLEX_CHANNEL_UNSUPPORTED,
  ENVIRONMENT_DRIVER_NOT_REGISTERED,
  RUNNER_INGRESS_CAPABILITY_DENIED,
  RUNNER_INGRESS_UNSUPPORTED,
  type AuthzClientOptions,
  type CapabilityKey,
  type Decision,
  type DenyCode,
  type GateRequest,
  type NoDecisionCode,
  type Operation,
  type SandboxCapabilities,
} from "./contract.js";

export * from "./contract.js";

/** The exact messages of the contract, by code; `<driver>` stands for the driver name. */
const MESSAGES: Record<DenyCode, RegExp> = {
  [DUPLEX_CHANNEL_CAPABILITY_DENIED]: /^Sandbox lease does not grant the duplex command stream capability\.$/,
  [DUPLEX_CHANNEL_UNSUPPORTED]: /^Environment driver ".*" does not support duplex channels\.$/s,
  [ENVIRONMENT_DRIVER_NOT_REGISTERED]: /^Environment driver ".*" is not registered in the environment runtime yet\.$/s,
  [RUNNER_INGRESS_CAPABILITY_DENIED]: /^Sandbox lease does not grant runner WebSocket ingress\.$/,
  [RUNNER_INGRESS_UNSUPPORTED]: /^Environment driver ".*" does not support runner ingress\.$/s,
};

interface OperationContract {
  capability: CapabilityKey;
  deniedCode: DenyCode;
  deniedMessage: string;
  codes: readonly DenyCode[];
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


const DEFAULT_BASE_URL = "http://127.0.0.1:8181";
const DEFAULT_TIMEOUT_MS = 8000;
const MAX_TIMEOUT_MS = 2_147_483_647; // setTimeout's bound
const MAX_ANSWER_BYTES = 1 << 20;
// Idle kept-alive connections are closed by the client after this long, before the service's
// own idle time-out (30 s) closes them under a request.
const IDLE_CONNECTION_MS = 15_000;

/** The connection pools of one client: plain and TLS. */
interface Agents {
  http: http.Agent;
  https: https.Agent;
}

function newAgents(): Agents {
  const o = { keepAlive: true, timeout: IDLE_CONNECTION_MS };
  return { http: new http.Agent(o), https: new https.Agent(o) };
}

/** The pools of the module's functions; their idle connections do not keep the process alive. */
const sharedAgents = newAgents();

/** Options checked once, with their defaults filled in. */
interface Resolved {
  url: URL;
  socketPath: string | undefined;
  tls: NonNullable<AuthzClientOptions["tls"]> | undefined;
  token: string | undefined;
  timeoutMs: number;
  signal: AbortSignal | undefined;
  agents: Agents | undefined; // undefined: a new connection for every call
  onError: ((error: AuthzGateError) => void) | undefined;
}

/** Checks options and fills in defaults; a `TypeError` for options that can never work. */
function resolveOptions(options: AuthzClientOptions | undefined, agents: Agents): Resolved {
  const o: AuthzClientOptions = options ?? {};
  if (typeof o !== "object" || o === null) throw new TypeError("authz client: options must be an object");
  const baseUrl = o.baseUrl ?? DEFAULT_BASE_URL;
  if (typeof baseUrl !== "string") throw new TypeError("authz client: baseUrl must be a string");
  const { url, socketPath } = target(baseUrl);
  const timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (typeof timeoutMs !== "number" || !Number.isFinite(timeoutMs) || timeoutMs <= 0 || timeoutMs > MAX_TIMEOUT_MS) {
    throw new TypeError(`authz client: timeoutMs must be a number of milliseconds above 0 and at most ${MAX_TIMEOUT_MS}, not ${String(timeoutMs)}`);
  }
  if (o.token !== undefined && typeof o.token !== "string") throw new TypeError("authz client: token must be a string");
  if (o.keepAlive !== undefined && typeof o.keepAlive !== "boolean") throw new TypeError("authz client: keepAlive must be a boolean");
  if (o.onError !== undefined && typeof o.onError !== "function") throw new TypeError("authz client: onError must be a function");
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw new TypeError("authz client: signal must be an AbortSignal");
  if (o.tls !== undefined && (typeof o.tls !== "object" || o.tls === null)) throw new TypeError("authz client: tls must be an object");
  return {
    url,
    socketPath,
    tls: o.tls,
    token: o.token,
    timeoutMs,
    signal: o.signal,
    agents: o.keepAlive === false ? undefined : agents,
    onError: o.onError,
  };
}

/** The request target: a URL, or a unix socket and a path prefix. */
function target(baseUrl: string): { url: URL; socketPath: string | undefined } {
  if (baseUrl.startsWith("unix://")) {
    const socketPath = baseUrl.slice("unix://".length);
    if (!socketPath.startsWith("/")) {
      throw new TypeError(`authz client: baseUrl ${JSON.stringify(baseUrl)}: a unix socket is written unix:///absolute/path.sock`);
    }
    return { url: new URL("http://authz/"), socketPath };
  }
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new TypeError(`authz client: baseUrl ${JSON.stringify(baseUrl)} is not a URL: use http://host:port, https://host:port or unix:///path.sock`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`authz client: baseUrl ${JSON.stringify(baseUrl)}: the scheme must be http, https or unix (http://host:port)`);
  }
  if (url.search !== "" || url.hash !== "") {
    throw new TypeError(`authz client: baseUrl ${JSON.stringify(baseUrl)}: no query or fragment`);
  }
  return { url, socketPath: undefined };
}

/** Hands a no-decision error to the caller's onError hook, and returns it. */
function reported(r: Resolved, err: AuthzGateError): AuthzGateError {
  if (r.onError !== undefined) {
    try {
      r.onError(err);
    } catch {
      // The hook is the caller's: what it throws must not change the gate's answer.
    }
  }
  return err;
}

/**
 * The nine capabilities the lease is entitled to now (`POST /v1/capabilities`), or `null` when
 * the service cannot be reached, does not answer in time, the call is aborted, or the answer is
 * anything but status 200 with all nine booleans; `onError` is told why. It throws nothing for
 * anything the service does: treat `null` as "nothing". Options that can never work reject
 * with a `TypeError`.
 */
export async function effectiveSandboxCapabilities(
  request: GateRequest,
  options: AuthzClientOptions = {},
): Promise<SandboxCapabilities | null> {
  return capabilitiesOf(request, resolveOptions(options, sharedAgents));
}

/**
 * Resolves with the decision when the service grants the duplex command stream for this lease
 * (`openDuplexChannel`); throws an {@link AuthzGateError} otherwise, with the contract's code
 * and message (`DUPLEX_CHANNEL_CAPABILITY_DENIED`, `DUPLEX_CHANNEL_UNSUPPORTED`,
 * `ENVIRONMENT_DRIVER_NOT_REGISTERED`) or, when no decision was obtained, an `AUTHZ_*` code
 * with the capability-denied message.
 */
export async function openDuplexChannelGate(request: GateRequest, options: AuthzClientOptions = {}): Promise<Decision> {
  return gate("openDuplexChannel", request, resolveOptions(options, sharedAgents));
}

/**
 * Resolves with the decision when the service grants runner WebSocket ingress for this lease
 * (`getRunnerIngressEndpoint`); throws an {@link AuthzGateError} otherwise
 * (`RUNNER_INGRESS_CAPABILITY_DENIED`, `RUNNER_INGRESS_UNSUPPORTED`,
 * `ENVIRONMENT_DRIVER_NOT_REGISTERED`, or an `AUTHZ_*` code).
 */
export async function runnerIngressGate(request: GateRequest, options: AuthzClientOptions = {}): Promise<Decision> {
  return gate("getRunnerIngressEndpoint", request, resolveOptions(options, sharedAgents));
}

/**
 * Holds the duplex command stream grant open (`POST /v1/authorize/watch`): resolves with the
 * first decision when it allows, and throws exactly what {@link openDuplexChannelGate} throws
 * when it does not or when the watch cannot start (`timeoutMs` bounds the start). Afterwards
 * `onRevoke` is called once when the grant ends: revoked by the service, the stream closed or
 * cut, a malformed event, or no event or ping within twice the service's ping interval. Ending
 * it yourself (`signal`, `close()`) calls no `onRevoke`. A watch is never reconnected: watch
 * again for a new decision.
 */
export async function watchDuplexGrant(request: GateRequest, options: WatchOptions): Promise<DuplexGrant> {
  return watchGrant(watchParts(resolveOptions(options, sharedAgents)), request, options);
}

/** What a watch uses of the client: a connection of its own, and the duplex gate's reading of an answer. */
function watchParts(r: Resolved): WatchParts {
  return {
    send: (path, payload) => send(path, payload, "text/event-stream", r, false),
    judge: (answer) => judge("openDuplexChannel", answer, r),
    readDecision,
    fail: (code, detail, extra = {}) => reported(r, new AuthzGateError(OPERATIONS.openDuplexChannel.deniedMessage, { code, detail, ...extra })),
    timeoutMs: r.timeoutMs,
    signal: r.signal,
  };
}

/** A client with its options bound, for callers that make many calls. */
export interface AuthzClient {
  effectiveSandboxCapabilities(request: GateRequest): Promise<SandboxCapabilities | null>;
  openDuplexChannelGate(request: GateRequest): Promise<Decision>;
  runnerIngressGate(request: GateRequest): Promise<Decision>;
  /** {@link watchDuplexGrant} with the client's options. */
  watchDuplexGrant(request: GateRequest, handlers: WatchHandlers): Promise<DuplexGrant>;
  /** Closes the client's idle connections; later calls open new ones. */
  close(): void;
}

/**
 * Binds options once, checking them now (a `TypeError` for options that can never work); a
 * `signal` given here applies to every call. The client keeps its own pool of connections.
 */
export function createAuthzClient(options: AuthzClientOptions = {}): AuthzClient {
  const agents = newAgents();
  const r = resolveOptions(options, agents);
  return {
    effectiveSandboxCapabilities: (req) => capabilitiesOf(req, r),
    openDuplexChannelGate: (req) => gate("openDuplexChannel", req, r),
    runnerIngressGate: (req) => gate("getRunnerIngressEndpoint", req, r),
    watchDuplexGrant: (req, handlers) => watchGrant(watchParts(r), req, handlers),
    close: () => {
      agents.http.destroy();
      agents.https.destroy();
    },
  };
}

async function capabilitiesOf(request: GateRequest, r: Resolved): Promise<SandboxCapabilities | null> {
  const fail = (code: NoDecisionCode, detail: string, extra: { status?: number; cause?: unknown } = {}) => {
    reported(r, new AuthzGateError(OPERATIONS.openDuplexChannel.deniedMessage, { code, detail, ...extra }));
    return null;
  };
  let answer: Answer;
  try {
    answer = await post("/v1/capabilities", { ...request, operation: "openDuplexChannel" }, r);
  } catch (err) {
    const e = err instanceof CallError ? err : new CallError(AUTHZ_UNREACHABLE, `authz: ${String(err)}`, { cause: err });
    return fail(e.code, e.message, { cause: e.cause });
  }
  if (answer.status !== 200) return fail(AUTHZ_BAD_STATUS, `authz answered status ${answer.status} to /v1/capabilities`, { status: answer.status });
  const body = parseJSON(answer.body);
  const caps = isObject(body) ? readCapabilities(body["capabilities"]) : null;
  if (caps === null) return fail(AUTHZ_MALFORMED_ANSWER, "authz answered 200 without nine capability booleans", { status: 200 });
  return caps;
}

async function gate(operation: Operation, request: GateRequest, r: Resolved): Promise<Decision> {
  const noDecision = (code: NoDecisionCode, detail: string, cause: unknown) =>
    reported(r, new AuthzGateError(OPERATIONS[operation].deniedMessage, { code, detail, cause }));

  let answer: Answer;
  try {
    answer = await post("/v1/authorize", { ...request, operation }, r);
  } catch (err) {
    if (err instanceof CallError) throw noDecision(err.code, err.message, err.cause);
    throw noDecision(AUTHZ_UNREACHABLE, `authz: ${String(err)}`, err);
  }
  return judge(operation, answer, r);
}

/** The gate's reading of an answer: the decision when it grants; otherwise throws what the gate throws. */
function judge(operation: Operation, answer: Answer, r: Resolved): Decision {
  const op = OPERATIONS[operation];
  const noDecision = (code: NoDecisionCode, detail: string, extra: { status?: number; authzError?: string; cause?: unknown; reasons?: string[]; decisionId?: string } = {}) =>
    reported(r, new AuthzGateError(op.deniedMessage, { code, detail, ...extra }));
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
  const code = op.codes.find((c) => c === doc.code);
  if (code === undefined || !MESSAGES[code].test(doc.message)) {
    throw noDecision(AUTHZ_MALFORMED_ANSWER, `authz denied with a code or message outside the contract: ${JSON.stringify(doc.code)} ${JSON.stringify(doc.message)}`, {
      status: 200,
      reasons: doc.reasons,
      decisionId: doc.decision_id,
    });
  }
  throw new AuthzGateError(doc.message, {
    code,
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
    readonly code: NoDecisionCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** A connection the service closed while it was idle in the pool: safe to send again. */
function isStaleConnection(req: http.ClientRequest, cause: NodeJS.ErrnoException): boolean {
  return req.reusedSocket && (cause.code === "ECONNRESET" || cause.code === "EPIPE");
}

/**
 * Sends POST `path` with `payload` as JSON to the service; the caller reads the response.
 * `pooled`: on a connection of the client's pool (when it keeps them alive), or on one of its own.
 */
function send(path: string, payload: unknown, accept: string, r: Resolved, pooled: boolean): http.ClientRequest {
  const body = Buffer.from(JSON.stringify(payload));
  const headers: http.OutgoingHttpHeaders = {
    "content-type": "application/json",
    accept,
    "content-length": body.length,
  };
  if (r.token !== undefined && r.token !== "") headers["authorization"] = `Bearer ${r.token}`;

  const base = r.url.pathname.endsWith("/") ? r.url.pathname.slice(0, -1) : r.url.pathname;
  const isTLS = r.socketPath === undefined && r.url.protocol === "https:";
  const agent = pooled && r.agents !== undefined ? (isTLS ? r.agents.https : r.agents.http) : false;
  const options: https.RequestOptions = { method: "POST", path: base + path, headers, agent };
  if (r.socketPath !== undefined) {
    options.socketPath = r.socketPath;
  } else {
    options.host = r.url.hostname.replace(/^\[(.*)\]$/, "$1");
    if (r.url.port !== "") options.port = Number(r.url.port);
  }
  if (isTLS && r.tls) {
    const { cert, key, ca, servername } = r.tls;
    if (cert !== undefined) options.cert = cert;
    if (key !== undefined) options.key = key;
    if (ca !== undefined) options.ca = ca;
    if (servername !== undefined) options.servername = servername;
  }
  const req = (isTLS ? https : http).request(options);
  req.end(body);
  return req;
}

function post(path: string, payload: unknown, r: Resolved): Promise<Answer> {
  return new Promise<Answer>((resolve, reject) => {
    const signal = r.signal;
    if (signal?.aborted) {
      reject(new CallError(AUTHZ_ABORTED, "the call was aborted before it started", { cause: signal.reason }));
      return;
    }

    let current: http.ClientRequest | undefined;
    let settled = false;
    const finish = (err: CallError | null, answer?: Answer) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (err !== null) {
        current?.destroy();
        reject(err);
      } else {
        resolve(answer as Answer);
      }
    };
    const onAbort = () => finish(new CallError(AUTHZ_ABORTED, "the call was aborted", { cause: signal?.reason }));
    const timer = setTimeout(() => finish(new CallError(AUTHZ_TIMEOUT, `authz did not answer within ${r.timeoutMs} ms`)), r.timeoutMs);
    signal?.addEventListener("abort", onAbort, { once: true });

    // pooled: false sends on a connection of its own (the retry after a stale pooled one).
    const attempt = (pooled: boolean) => {
      if (settled) return;
      let req: http.ClientRequest;
      try {
        req = send(path, payload, "application/json", r, pooled);
      } catch (cause) {
        finish(new CallError(AUTHZ_UNREACHABLE, `authz: ${String(cause)}`, { cause }));
        return;
      }
      req.on("response", (res) => {
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
      current = req;
      req.on("error", (cause: NodeJS.ErrnoException) => {
        if (pooled && r.agents !== undefined && isStaleConnection(req, cause)) {
          attempt(false);
          return;
        }
        finish(new CallError(AUTHZ_UNREACHABLE, `authz could not be reached at ${r.socketPath ?? r.url.origin}: ${cause.message}`, { cause }));
      });
    };
    attempt(true);
  });
}
