/**
 * The contract's words as the client speaks them: the capability keys, the request and the
 * decision, the codes and messages, the options of every call and the error a gate throws.
 * Both the one-shot calls (index.ts) and the watch (watch.ts) import them from here.
 */

/**
 * The capability keys, in the contract's order (docs/contract.md, "The nine capabilities").
 * Written from the server's list by `go generate ./internal/decision`; a Go test fails when they differ.
 */
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

/** What the gate is asked about (docs/contract.md, "The request"). `operation` is set by the gate. */
export interface GateRequest {
  environment?: unknown;
  lease?: unknown;
  command?: unknown;
}

/** The decision document (docs/contract.md, "The decision document"). */
export interface Decision {
  allow: boolean;
  code: string;
  message: string;
  reasons: string[];
  capabilities: SandboxCapabilities;
  decision_id: string;
  revision: string;
}

/**
 * Options of every call. All are optional; a property set to `undefined` means its default, so
 * `{ baseUrl: process.env.AUTHZ_URL }` is fine. Options that can never work (a `baseUrl` that is
 * not an http, https or absolute unix URL, a time-out that is not a positive number of
 * milliseconds) are a `TypeError`: at creation with {@link createAuthzClient}, at the call
 * otherwise.
 */
export interface AuthzClientOptions {
  /**
   * Where the service listens: `http://host:port`, `https://host:port`, or
   * `unix:///absolute/path.sock` (the same form as `authz serve --addr`). A path prefix
   * (`https://gw.example/authz`) is kept. Default: `http://127.0.0.1:8181`.
   */
  baseUrl?: string | undefined;
  /** Sent as `Authorization: Bearer <token>` when given. */
  token?: string | undefined;
  /**
   * TLS for `https://` URLs: a client certificate and key (PEM), and the CA that signed the
   * service's certificate when it is not a public one.
   */
  tls?:
    | {
        cert?: string | Buffer | undefined;
        key?: string | Buffer | undefined;
        ca?: string | Buffer | Array<string | Buffer> | undefined;
        /** The name to check the service's certificate against, when it differs from the host. */
        servername?: string | undefined;
      }
    | undefined;
  /**
   * Bound on the whole call, in milliseconds. Default: 8000, above the service's own
   * `evalTimeout` (5 s), so that a time-out inside the service reaches you as its answer
   * (`AUTHZ_BAD_STATUS` with `authzError` `EVAL_TIMEOUT`) rather than as `AUTHZ_TIMEOUT`.
   */
  timeoutMs?: number | undefined;
  /** Cancels the call; a cancelled gate call throws with code `AUTHZ_ABORTED`. */
  signal?: AbortSignal | undefined;
  /**
   * Keep connections open and reuse them (default `true`). A request that finds a reused
   * connection closed by the service before any answer is sent once more on a new connection
   * (a decision has no side effect).
   */
  keepAlive?: boolean | undefined;
  /**
   * Called once for every call that got no decision (the `AUTHZ_*` codes), with the error the
   * gate throws, including calls of {@link effectiveSandboxCapabilities}, which return `null`:
   * this is where to log or count outages. What it throws is ignored.
   */
  onError?: ((error: AuthzGateError) => void) | undefined;
}

/** Codes of the contract's denials (docs/contract.md, "Codes and messages"). */
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

/** The codes of the contract's denials. */
export type DenyCode =
  | typeof DUPLEX_CHANNEL_CAPABILITY_DENIED
  | typeof DUPLEX_CHANNEL_UNSUPPORTED
  | typeof ENVIRONMENT_DRIVER_NOT_REGISTERED
  | typeof RUNNER_INGRESS_CAPABILITY_DENIED
  | typeof RUNNER_INGRESS_UNSUPPORTED;

/** The codes of calls that got no decision. */
export type NoDecisionCode =
  | typeof AUTHZ_UNREACHABLE
  | typeof AUTHZ_TIMEOUT
  | typeof AUTHZ_ABORTED
  | typeof AUTHZ_BAD_STATUS
  | typeof AUTHZ_MALFORMED_ANSWER;

/** Every code an {@link AuthzGateError} carries. */
export type GateErrorCode = DenyCode | NoDecisionCode;

/**
 * The error of a gate that did not grant. `message` is the contract's message: the service's
 * own on a deny, the operation's capability-denied message when no decision was obtained.
 * `code` is the decision's code on a deny, one of the `AUTHZ_*` codes otherwise.
 */
export class AuthzGateError extends Error {
  override readonly name = "AuthzGateError";
  /** The contract's code (a deny) or an `AUTHZ_*` code (no decision). */
  readonly code: GateErrorCode;
  /** The decision's reasons (docs/contract.md, "Precise rules"); `[]` when there was no decision. */
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
      code: GateErrorCode;
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
