/**
 * Continuous re-authorization: `POST /v1/authorize/watch` holds a grant open as a stream of
 * server-sent events, and the grant ends the moment the service revokes it, the stream is lost,
 * or the service stops answering. Every way a stream can end is an end of the grant: a watch is
 * never reconnected, since a new watch is a new decision.
 *
 * The client (index.ts) hands a watch its connection and its gate's reading of an answer
 * ({@link WatchParts}); this file holds the stream: the event-stream parser, the liveness
 * deadline and the one call of `onRevoke`.
 */
import type * as http from "node:http";

import type { AuthzClientOptions, AuthzGateError, Decision, GateRequest, NoDecisionCode } from "./contract.js";

/** What a watch is told of its grant. */
export interface WatchHandlers {
  /**
   * Called once when the grant ends for any reason but your own ({@link DuplexGrant.close} or
   * `signal`): with the service's deny document when it revoked the grant (an `AuthzGateError`
   * instead when that document breaks the contract), or with an `AuthzGateError` when the
   * stream was lost: `AUTHZ_UNREACHABLE` (closed without a revoke, connection cut),
   * `AUTHZ_TIMEOUT` (no event or ping within twice the service's ping interval),
   * `AUTHZ_MALFORMED_ANSWER` (an event that is not the protocol's). Close what the grant
   * allowed here. What it throws is ignored.
   */
  onRevoke: (end: Decision | AuthzGateError) => void;
  /** Called with each new allowing decision (changed capabilities or revision). What it throws is ignored. */
  onUpdate?: ((decision: Decision) => void) | undefined;
  /**
   * Ends the watch: before the first decision the call throws `AUTHZ_ABORTED`; after it the
   * stream is closed and `onRevoke` is not called (the end is yours).
   */
  signal?: AbortSignal | undefined;
}

/** The options of the module-level `watchDuplexGrant`: the client's options and the handlers. */
export type WatchOptions = AuthzClientOptions & WatchHandlers;

/** A grant being watched: the first decision, and the means to end the watch. */
export interface DuplexGrant extends Decision {
  /** The service's id of this watch (`X-Authz-Watch-Id`), for its logs. */
  readonly watchId: string;
  /** True once the grant has ended: revoked, lost, or closed by you. */
  readonly ended: boolean;
  /** Closes the stream; `onRevoke` is not called. Idempotent. */
  close(): void;
  /** Same as {@link close}, for `await using`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** An HTTP answer as the gate reads it. */
export interface WatchAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** What a watch needs from the client that starts it. */
export interface WatchParts {
  /** Sends POST `path` with `payload` as JSON, on a connection of its own; the caller reads the response. */
  send(path: string, payload: unknown): http.ClientRequest;
  /** The gate's reading of an answer: the allowing decision, or throws the gate's `AuthzGateError`. */
  judge(answer: WatchAnswer): Decision;
  /** A well-formed decision document, or null. */
  readDecision(v: unknown): Decision | null;
  /** The error of a watch that got no decision, already told to the client's `onError`. */
  fail(code: NoDecisionCode, detail: string, extra?: { status?: number; cause?: unknown }): AuthzGateError;
  /** Bound on the start of the watch: connection, answer and first decision. */
  timeoutMs: number;
  /** The client's own signal, if any. */
  signal: AbortSignal | undefined;
}

const WATCH_PATH = "/v1/authorize/watch";
/** The service's ping interval when it does not say (`X-Authz-Ping-Interval`). */
export const DEFAULT_PING_INTERVAL_MS = 15_000;
/** A longest ping interval: twice it must still fit setTimeout. */
const MAX_PING_INTERVAL_MS = 1_073_741_823;
/** Bound on one line of the stream, one event's data and an error answer: a decision is far smaller. */
export const MAX_EVENT_BYTES = 1 << 20;

/** An event of the stream: its `event:` name ("message" when none) and its data (undefined when no `data:` line). */
export interface StreamEvent {
  event: string;
  data: string | undefined;
}

/** A stream that breaks the event-stream format or its bounds. */
export class StreamFormatError extends Error {}

const LF = 0x0a;
const CR = 0x0d;

/**
 * The text/event-stream format (WHATWG HTML, "Server-sent events"), read from bytes arriving in
 * chunks of any size: lines end with CRLF, LF or CR; `:` starts a comment; a field's value loses
 * one leading space; `data:` lines join with "\n"; a blank line ends an event; `id` and `retry`
 * are read and ignored (a watch never reconnects). A line or an event's data over
 * {@link MAX_EVENT_BYTES}, or bytes that are not UTF-8, throw a {@link StreamFormatError}.
 */
export class EventStreamParser {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private afterCR = false;
  private atStart = true;
  private eventName = "";
  private data: string[] = [];
  private dataBytes = 0;
  private readonly decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

  constructor(
    private readonly onEvent: (e: StreamEvent) => void,
    /** Called for every complete line: fields, comments and blank lines alike. */
    private readonly onLine: () => void = () => {},
  ) {}

  push(chunk: Buffer): void {
    let start = 0;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i];
      if (this.afterCR) {
        this.afterCR = false;
        if (b === LF) {
          start = i + 1;
          continue;
        }
      }
      if (b === LF || b === CR) {
        this.take(chunk.subarray(start, i));
        this.line();
        this.afterCR = b === CR;
        start = i + 1;
      }
    }
    this.take(chunk.subarray(start));
  }

  private take(part: Buffer): void {
    if (part.length === 0) return;
    this.pendingBytes += part.length;
    if (this.pendingBytes > MAX_EVENT_BYTES) throw new StreamFormatError(`a line of the event stream is over ${MAX_EVENT_BYTES} bytes`);
    this.pending.push(part);
  }

  private line(): void {
    const bytes = this.pending.length === 1 ? this.pending[0]! : Buffer.concat(this.pending, this.pendingBytes);
    this.pending = [];
    this.pendingBytes = 0;
    let text: string;
    try {
      text = this.decoder.decode(bytes);
    } catch (cause) {
      throw new StreamFormatError("the event stream is not UTF-8", { cause });
    }
    if (this.atStart) {
      this.atStart = false;
      if (text.startsWith("\uFEFF")) text = text.slice(1);
    }
    if (text === "") {
      this.onLine();
      this.dispatch();
      return;
    }
    this.onLine();
    if (text.startsWith(":")) return;
    const colon = text.indexOf(":");
    const name = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") {
      this.eventName = value;
    } else if (name === "data") {
      this.dataBytes += bytes.length + 1;
      if (this.dataBytes > MAX_EVENT_BYTES) throw new StreamFormatError(`an event's data is over ${MAX_EVENT_BYTES} bytes`);
      this.data.push(value);
    }
    // id, retry and unknown fields: nothing to do.
  }

  private dispatch(): void {
    const hasData = this.data.length > 0;
    if (this.eventName === "" && !hasData) return;
    const e: StreamEvent = { event: this.eventName === "" ? "message" : this.eventName, data: hasData ? this.data.join("\n") : undefined };
    this.eventName = "";
    this.data = [];
    this.dataBytes = 0;
    this.onEvent(e);
  }
}

/** The ping interval the service announced, in milliseconds, or null when the header is not one. */
function pingInterval(v: string | string[] | undefined): number | null {
  if (v === undefined) return DEFAULT_PING_INTERVAL_MS;
  if (typeof v !== "string" || !/^[0-9]{1,10}$/.test(v)) return null;
  const ms = Number(v);
  return ms > 0 && ms <= MAX_PING_INTERVAL_MS ? ms : null;
}

function isEventStream(contentType: string | undefined): boolean {
  return (contentType ?? "").split(";")[0]!.trim().toLowerCase() === "text/event-stream";
}

function checkHandlers(h: WatchHandlers): void {
  if (typeof h !== "object" || h === null) throw new TypeError("authz client: watchDuplexGrant needs { onRevoke }");
  if (typeof h.onRevoke !== "function") throw new TypeError("authz client: onRevoke must be a function");
  if (h.onUpdate !== undefined && typeof h.onUpdate !== "function") throw new TypeError("authz client: onUpdate must be a function");
  if (h.signal !== undefined && !(h.signal instanceof AbortSignal)) throw new TypeError("authz client: signal must be an AbortSignal");
}

/** Calls a handler of the caller: what it throws must not change the watch. */
function tell<T>(fn: ((v: T) => void) | undefined, v: T): void {
  if (fn === undefined) return;
  try {
    fn(v);
  } catch {
    // The handler is the caller's.
  }
}

/**
 * Starts a watch of the duplex grant for `request`: resolves with the first decision when it
 * allows, throws the gate's `AuthzGateError` otherwise (see `watchDuplexGrant` in index.ts).
 */
export async function watchGrant(parts: WatchParts, request: GateRequest, handlers: WatchHandlers): Promise<DuplexGrant> {
  checkHandlers(handlers);
  const signals = [...new Set([parts.signal, handlers.signal].filter((s): s is AbortSignal => s !== undefined))];

  return new Promise<DuplexGrant>((resolve, reject) => {
    const aborted = signals.find((s) => s.aborted);
    if (aborted !== undefined) {
      reject(parts.fail("AUTHZ_ABORTED", "the watch was aborted before it started", { cause: aborted.reason }));
      return;
    }
    let req: http.ClientRequest;
    try {
      req = parts.send(WATCH_PATH, { ...request, operation: "openDuplexChannel" });
    } catch (cause) {
      reject(parts.fail("AUTHZ_UNREACHABLE", `authz watch could not be sent: ${String(cause)}`, { cause }));
      return;
    }

    // starting: until the first decision; granted: the caller holds a grant; ended: nothing more happens.
    let state: "starting" | "granted" | "ended" = "starting";
    let res: http.IncomingMessage | undefined;
    let watchId = "";
    let livenessMs = DEFAULT_PING_INTERVAL_MS * 2;
    let liveness: NodeJS.Timeout | undefined;

    /** Ends the watch once: rejects a start, or tells onRevoke of a grant's end (undefined: the caller's own end). */
    const end = (why: Decision | AuthzGateError | undefined) => {
      if (state === "ended") return;
      const was = state;
      state = "ended";
      clearTimeout(startTimer);
      clearTimeout(liveness);
      for (const s of signals) s.removeEventListener("abort", onAbort);
      req.destroy();
      res?.destroy();
      if (was === "starting") reject(why);
      else if (why !== undefined) tell(handlers.onRevoke, why);
    };
    /** Ends a watch that is still on with a no-decision error (told to onError only then). */
    const lose = (code: NoDecisionCode, detail: string, extra: { status?: number; cause?: unknown } = {}) => {
      if (state !== "ended") end(parts.fail(code, detail, extra));
    };
    const malformed = (detail: string, cause?: unknown) => lose("AUTHZ_MALFORMED_ANSWER", detail, cause === undefined ? { status: 200 } : { status: 200, cause });
    const onAbort = () => {
      if (state === "starting") {
        lose("AUTHZ_ABORTED", "the watch was aborted", { cause: signals.find((s) => s.aborted)?.reason });
      } else {
        end(undefined);
      }
    };
    const startTimer = setTimeout(() => lose("AUTHZ_TIMEOUT", `authz did not answer the watch with a first decision within ${parts.timeoutMs} ms`), parts.timeoutMs);
    for (const s of signals) s.addEventListener("abort", onAbort, { once: true });

    /** A decision or update event's data as the gate reads it, checked against the watch's id. */
    const judged = (data: string): Decision => {
      const doc = parts.judge({ status: 200, headers: res?.headers ?? {}, body: data });
      const id = watchIdOf(data);
      if (id !== undefined && watchId !== "" && id !== watchId) {
        throw parts.fail("AUTHZ_MALFORMED_ANSWER", `authz sent an event of watch ${JSON.stringify(id)} on watch ${JSON.stringify(watchId)}`, { status: 200 });
      }
      return doc;
    };

    /** The end a denying event carries: its document when the contract's deny, the gate's error otherwise. */
    const revokedBy = (err: AuthzGateError, data: string): Decision | AuthzGateError => {
      // The gate's error for a contract deny carries the decision's code; the AUTHZ_* codes say there was none.
      if (err.code.startsWith("AUTHZ_")) return err;
      return parts.readDecision(parseJSON(data)) ?? err;
    };

    const onEvent = (e: StreamEvent) => {
      if (state === "ended") return;
      if (e.data === undefined) return malformed(`authz sent a ${JSON.stringify(e.event)} event without data`);
      if (state === "starting") {
        if (e.event !== "decision") return malformed(`authz began the watch with a ${JSON.stringify(e.event)} event, not a decision`);
        let doc: Decision;
        try {
          doc = judged(e.data);
        } catch (err) {
          return end(err as AuthzGateError);
        }
        state = "granted";
        clearTimeout(startTimer);
        liveness = setTimeout(() => lose("AUTHZ_TIMEOUT", `authz sent no event or ping on watch ${watchId} within ${livenessMs} ms`), livenessMs);
        resolve(grantOf(doc));
        return;
      }
      if (e.event !== "update" && e.event !== "revoke") return malformed(`authz sent a ${JSON.stringify(e.event)} event after the first decision`);
      let doc: Decision;
      try {
        doc = judged(e.data);
      } catch (err) {
        return end(revokedBy(err as AuthzGateError, e.data));
      }
      if (e.event === "revoke") return malformed(`authz sent a revoke that allows (decision ${doc.decision_id})`);
      tell(handlers.onUpdate, doc);
    };

    // Every complete line (an event's, a ping) shows the service is there.
    const parser = new EventStreamParser(onEvent, () => {
      if (state === "granted") liveness?.refresh();
    });

    const grantOf = (doc: Decision): DuplexGrant => {
      const close = () => end(undefined);
      const grant = {
        ...doc,
        watchId,
        get ended() {
          return state === "ended";
        },
        close,
      } as DuplexGrant;
      if (typeof Symbol.asyncDispose === "symbol") {
        Object.defineProperty(grant, Symbol.asyncDispose, { value: async () => close() });
      }
      return grant;
    };

    /** An answer that is not an event stream: read it (bounded) and let the gate say why it is no grant. */
    const readRefusal = (r: http.IncomingMessage, status: number) => {
      const chunks: Buffer[] = [];
      let size = 0;
      r.on("data", (c: Buffer) => {
        size += c.length;
        if (size > MAX_EVENT_BYTES) return lose("AUTHZ_MALFORMED_ANSWER", `authz answered the watch with more than ${MAX_EVENT_BYTES} bytes`, { status });
        chunks.push(c);
      });
      r.on("end", () => {
        if (state === "ended") return;
        if (status === 200) {
          // Whatever it says, it is no watch, and a grant needs one.
          return lose("AUTHZ_MALFORMED_ANSWER", `authz answered the watch with ${JSON.stringify(r.headers["content-type"] ?? "")}, not text/event-stream`, { status });
        }
        try {
          parts.judge({ status, headers: r.headers, body: Buffer.concat(chunks).toString("utf8") });
          lose("AUTHZ_BAD_STATUS", `authz answered the watch with status ${status}`, { status });
        } catch (err) {
          end(err as AuthzGateError);
        }
      });
      r.on("error", (cause: Error) => lose("AUTHZ_UNREACHABLE", `authz: reading the answer to the watch: ${cause.message}`, { cause }));
      r.on("close", () => lose("AUTHZ_UNREACHABLE", "authz: the answer to the watch was cut"));
    };

    req.on("error", (cause: Error) => {
      const what = state === "starting" ? "authz could not be reached for the watch" : `authz watch ${watchId} was cut`;
      lose("AUTHZ_UNREACHABLE", `${what}: ${cause.message}`, { cause });
    });
    req.on("response", (r: http.IncomingMessage) => {
      res = r;
      if (state === "ended") {
        r.destroy();
        return;
      }
      const status = r.statusCode ?? 0;
      if (status !== 200 || !isEventStream(r.headers["content-type"])) return readRefusal(r, status);
      const interval = pingInterval(r.headers["x-authz-ping-interval"]);
      if (interval === null) {
        return malformed(`authz announced a ping interval that is not a positive number of milliseconds: ${JSON.stringify(r.headers["x-authz-ping-interval"])}`);
      }
      livenessMs = interval * 2;
      const id = r.headers["x-authz-watch-id"];
      watchId = typeof id === "string" ? id : "";
      r.on("data", (chunk: Buffer) => {
        if (state === "ended") return;
        try {
          parser.push(chunk);
        } catch (err) {
          malformed(`authz watch ${watchId}: ${err instanceof Error ? err.message : String(err)}`, err);
        }
      });
      r.on("end", () => {
        if (state === "starting") malformed("authz ended the watch before its first decision");
        else lose("AUTHZ_UNREACHABLE", `authz closed watch ${watchId} without revoking it`);
      });
      r.on("error", (cause: Error) => lose("AUTHZ_UNREACHABLE", `authz watch ${watchId} was cut: ${cause.message}`, { cause }));
      r.on("close", () => lose("AUTHZ_UNREACHABLE", `authz watch ${watchId} was cut`));
    });
  });
}

function parseJSON(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The `watch_id` of an event's data, when it has a string one. */
function watchIdOf(data: string): string | undefined {
  const v = parseJSON(data);
  if (typeof v !== "object" || v === null) return undefined;
  const id = (v as Record<string, unknown>)["watch_id"];
  return typeof id === "string" ? id : undefined;
}
