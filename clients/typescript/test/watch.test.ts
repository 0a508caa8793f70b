// watchDuplexGrant against a fake event-stream service on loopback: a first decision that allows
// or denies, updates, revokes, a stream that closes, is cut, goes silent or sends garbage, bytes
// split anywhere, and the caller's own end. onRevoke is called exactly once whenever the grant
// ends by anything but the caller.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";

import {
  AuthzGateError,
  createAuthzClient,
  openDuplexChannelGate,
  watchDuplexGrant,
  type Decision,
  type DuplexGrant,
  type WatchOptions,
} from "../src/index.js";
import { EventStreamParser, MAX_EVENT_BYTES, StreamFormatError, type StreamEvent } from "../src/watch.js";

const DUPLEX_DENIED = "Sandbox lease does not grant the duplex command stream capability.";
const WATCH_ID = "6f1c2a9e-0000-4000-8000-000000000001";
const req = { environment: { id: "env-1" }, lease: { id: "lease-1" }, command: ["true"] };

const allFalse = {
  reusableLeases: false, nativeSyncIn: false, nativeSyncOut: false, persistentProcessSessions: false,
  independentControlCommands: false, incrementalSessionOutput: false, concurrentSyncOperations: false,
  duplexCommandStream: false, runnerWebSocketIngress: false,
};
const grant = {
  allow: true, code: "", message: "", reasons: [] as string[], capabilities: { ...allFalse, duplexCommandStream: true },
  decision_id: "00000000-0000-0000-0000-000000000001", revision: "sha256:one", watch_id: WATCH_ID,
};
const update = { ...grant, capabilities: { ...grant.capabilities, nativeSyncIn: true }, decision_id: "00000000-0000-0000-0000-000000000003", revision: "sha256:two" };
function deny(reasons: string[]) {
  return {
    allow: false, code: "DUPLEX_CHANNEL_CAPABILITY_DENIED", message: DUPLEX_DENIED, reasons, capabilities: allFalse,
    decision_id: "00000000-0000-0000-0000-000000000002", revision: "sha256:one", watch_id: WATCH_ID,
  };
}
/** A decision document as the client gives it: without the watch's id. */
function asDecision(doc: Record<string, unknown>): Decision {
  const { watch_id: _, ...d } = doc;
  return d as unknown as Decision;
}

const event = (name: string, doc: unknown) => `event: ${name}\ndata: ${typeof doc === "string" ? doc : JSON.stringify(doc)}\n\n`;

/** One watch request as the fake saw it; `closed` resolves when its connection is gone. */
interface Watch {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  body: string;
  closed: Promise<void>;
  /** Answers 200 with the event-stream headers. */
  open(headers?: Record<string, string>): void;
}

/** A loopback service: /v1/authorize answers with `authorize`, /v1/authorize/watch runs `watch`. */
class FakeService {
  authorize: (res: http.ServerResponse) => void = (res) => json(res, 200, grant);
  watch: (w: Watch) => void = (w) => {
    w.open();
    w.res.write(event("decision", grant));
  };
  readonly watches: Watch[] = [];
  readonly server = http.createServer((rq, res) => {
    let body = "";
    rq.on("data", (c) => (body += c));
    rq.on("end", () => {
      if (rq.url?.endsWith("/v1/authorize/watch")) {
        res.on("error", () => {}); // writes after the client left
        const closed = new Promise<void>((r) => res.on("close", () => r()));
        const w: Watch = {
          req: rq, res, body, closed,
          open: (headers = {}) => {
            res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store", "x-authz-watch-id": WATCH_ID, "x-authz-ping-interval": "15000", ...headers });
            res.flushHeaders();
          },
        };
        this.watches.push(w);
        this.watch(w);
      } else {
        this.authorize(res);
      }
    });
  });
  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }
  /** The last watch request. */
  last(): Watch {
    const w = this.watches.at(-1);
    assert.ok(w !== undefined, "no watch request arrived");
    return w;
  }
  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }
}

function json(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(typeof body === "string" ? body : JSON.stringify(body));
}

/** Resolves with p, or rejects after ms: no test waits without a bound. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** Lets every callback already due run (I/O, timers at 0, immediates). */
async function settle(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
}

/** Handlers that record what they are told; `ended` resolves at the first onRevoke. */
function recorder() {
  const ends: Array<Decision | AuthzGateError> = [];
  const updates: Decision[] = [];
  let first: (e: Decision | AuthzGateError) => void = () => {};
  const ended = new Promise<Decision | AuthzGateError>((r) => (first = r));
  return {
    ends,
    updates,
    ended: () => within(ended, 5000, "onRevoke"),
    onRevoke: (e: Decision | AuthzGateError) => {
      ends.push(e);
      first(e);
    },
    onUpdate: (d: Decision) => void updates.push(d),
  };
}

async function gateError(fn: () => Promise<unknown>): Promise<AuthzGateError> {
  try {
    await fn();
  } catch (err) {
    assert.ok(err instanceof AuthzGateError, `expected an AuthzGateError, got ${String(err)}`);
    return err;
  }
  assert.fail("it resolved; it must throw");
}

/** The fields by which two gate errors are the same error. */
function shape(e: AuthzGateError) {
  return { name: e.name, code: e.code, message: e.message, reasons: e.reasons, decisionId: e.decisionId, status: e.status, authzError: e.authzError };
}

let fake: FakeService;
let baseUrl: string;
before(async () => {
  fake = new FakeService();
  baseUrl = await fake.listen();
});
after(() => fake.close());

/** Starts a watch whose first decision allows, with the recorder's handlers. */
async function granted(rec: ReturnType<typeof recorder>, options: Partial<WatchOptions> = {}): Promise<{ grant: DuplexGrant; w: Watch }> {
  const g = await within(watchDuplexGrant(req, { baseUrl, onRevoke: rec.onRevoke, onUpdate: rec.onUpdate, ...options }), 5000, "the grant");
  return { grant: g, w: fake.last() };
}

/** The grant ended once with an AuthzGateError of code; the client closed the stream. */
async function endedOnceWith(rec: ReturnType<typeof recorder>, w: Watch, code: string): Promise<AuthzGateError> {
  const e = await rec.ended();
  assert.ok(e instanceof AuthzGateError, `onRevoke got ${JSON.stringify(e)}, not an AuthzGateError`);
  assert.equal(e.code, code, e.detail);
  assert.equal(e.message, DUPLEX_DENIED);
  await within(w.closed, 5000, "the stream closed");
  await settle();
  assert.equal(rec.ends.length, 1, "onRevoke is called exactly once");
  return e;
}

describe("starting a watch", { timeout: 60_000 }, () => {
  test("a first decision that allows resolves with it; the request is the gate's, sent to /v1/authorize/watch", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant));
    };
    const rec = recorder();
    const client = createAuthzClient({ baseUrl, token: "s3cret" });
    const g = await client.watchDuplexGrant(req, { onRevoke: rec.onRevoke });
    const w = fake.last();
    assert.deepEqual({ ...g }, { ...asDecision(grant), watchId: WATCH_ID, ended: false, close: g.close });
    assert.equal(w.req.method, "POST");
    assert.equal(w.req.url, "/v1/authorize/watch");
    assert.equal(w.req.headers["content-type"], "application/json");
    assert.equal(w.req.headers["accept"], "text/event-stream");
    assert.equal(w.req.headers["authorization"], "Bearer s3cret");
    assert.deepEqual(JSON.parse(w.body), { ...req, operation: "openDuplexChannel" });
    g.close();
    await within(w.closed, 5000, "the stream closed");
    await settle();
    assert.equal(g.ended, true);
    assert.equal(rec.ends.length, 0, "close() is the caller's own end: no onRevoke");
    client.close();
  });

  const firstDecisions: Array<{ name: string; doc: unknown }> = [
    { name: "DUPLEX_CHANNEL_CAPABILITY_DENIED", doc: deny(["plugin_not_found"]) },
    { name: "DUPLEX_CHANNEL_UNSUPPORTED", doc: { ...deny(["operation_unsupported_by_driver"]), code: "DUPLEX_CHANNEL_UNSUPPORTED", message: 'Environment driver "local" does not support duplex channels.' } },
    { name: "a deny with a code outside the contract", doc: { ...deny([]), code: "NOPE" } },
    { name: "allow is the string \"true\"", doc: { ...grant, allow: "true" } },
    { name: "a grant without the duplex capability", doc: { ...grant, capabilities: allFalse } },
    { name: "data that is not JSON", doc: "{allow: true}" },
  ];
  for (const c of firstDecisions) {
    test(`a first decision that does not allow throws what openDuplexChannelGate throws: ${c.name}`, async () => {
      fake.authorize = (res) => json(res, 200, c.doc);
      const expected = await gateError(() => openDuplexChannelGate(req, { baseUrl }));
      fake.watch = (w) => {
        w.open();
        w.res.write(event("decision", c.doc)); // and the stream stays open: the client must close it
      };
      const rec = recorder();
      const got = await gateError(() => watchDuplexGrant(req, { baseUrl, onRevoke: rec.onRevoke }));
      assert.deepEqual(shape(got), shape(expected));
      await within(fake.last().closed, 5000, "the stream closed");
      await settle();
      assert.equal(rec.ends.length, 0, "no grant, nothing to revoke");
    });
  }

  const refusals: Array<{ name: string; answer: (res: http.ServerResponse) => void; detail?: RegExp }> = [
    { name: "503 SERVICE_OVERLOADED", answer: (res) => json(res, 503, { code: "SERVICE_OVERLOADED", message: "no free slot", allow: false }, { "retry-after": "1" }) },
    { name: "503 WATCH_LIMIT", answer: (res) => json(res, 503, { code: "WATCH_LIMIT", message: "too many watches are open", allow: false }), detail: /too many watches/ },
    { name: "400 BAD_REQUEST", answer: (res) => json(res, 400, { code: "BAD_REQUEST", message: "lease must be an object" }) },
    { name: "401 UNAUTHORIZED", answer: (res) => json(res, 401, { code: "UNAUTHORIZED", message: "no token", allow: false }) },
    { name: "404 NOT_FOUND (a service without watches)", answer: (res) => json(res, 404, { code: "NOT_FOUND", message: "no such endpoint" }) },
    { name: "500 evaluation failure", answer: (res) => json(res, 500, deny(["evaluation_failed"]), { "x-authz-error": "EVAL_TIMEOUT" }) },
  ];
  for (const c of refusals) {
    test(`an error answer before any stream is the gate's: ${c.name}`, async () => {
      fake.authorize = c.answer;
      const expected = await gateError(() => openDuplexChannelGate(req, { baseUrl }));
      fake.watch = (w) => c.answer(w.res);
      const rec = recorder();
      const told: AuthzGateError[] = [];
      const got = await gateError(() => watchDuplexGrant(req, { baseUrl, onRevoke: rec.onRevoke, onError: (e) => told.push(e) }));
      assert.deepEqual(shape(got), shape(expected));
      assert.equal(got.code, "AUTHZ_BAD_STATUS");
      if (c.detail) assert.match(got.detail, c.detail);
      assert.deepEqual(told, [got], "onError is told once");
      assert.equal(rec.ends.length, 0);
    });
  }

  const cannotStart: Array<{ name: string; watch: (w: Watch) => void; code: string; timeoutMs?: number }> = [
    { name: "the connection is cut before an answer", watch: (w) => w.res.socket?.destroy(), code: "AUTHZ_UNREACHABLE" },
    { name: "a 200 JSON grant instead of an event stream", watch: (w) => json(w.res, 200, grant), code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "the stream begins with an update", watch: (w) => { w.open(); w.res.write(event("update", grant)); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "the stream begins with a revoke", watch: (w) => { w.open(); w.res.write(event("revoke", deny(["worker_not_running"]))); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "the stream ends before a first decision", watch: (w) => { w.open(); w.res.end(": ping\n\n"); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "the stream is cut before a first decision", watch: (w) => { w.open(); w.res.write(": ping\n\n", () => w.res.socket?.destroy()); }, code: "AUTHZ_UNREACHABLE" },
    { name: "the stream ends in the middle of the first decision", watch: (w) => { w.open(); w.res.end(`event: decision\ndata: ${JSON.stringify(grant)}\n`); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "no first decision within timeoutMs", watch: (w) => { w.open(); w.res.write(": ping\n\n"); }, code: "AUTHZ_TIMEOUT", timeoutMs: 300 },
    { name: "no answer at all within timeoutMs", watch: () => {}, code: "AUTHZ_TIMEOUT", timeoutMs: 300 },
    { name: "a ping interval that is not a number", watch: (w) => { w.open({ "x-authz-ping-interval": "soon" }); w.res.write(event("decision", grant)); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "a ping interval of 0", watch: (w) => { w.open({ "x-authz-ping-interval": "0" }); w.res.write(event("decision", grant)); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "a first decision of another watch", watch: (w) => { w.open(); w.res.write(event("decision", { ...grant, watch_id: "another" })); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "a decision event without data", watch: (w) => { w.open(); w.res.write("event: decision\n\n"); }, code: "AUTHZ_MALFORMED_ANSWER" },
  ];
  for (const c of cannotStart) {
    test(`a watch that cannot start fails closed: ${c.name}`, async () => {
      fake.watch = c.watch;
      const rec = recorder();
      const told: AuthzGateError[] = [];
      const got = await gateError(() => watchDuplexGrant(req, { baseUrl, timeoutMs: c.timeoutMs ?? 5000, onRevoke: rec.onRevoke, onError: (e) => told.push(e) }));
      assert.equal(got.code, c.code, got.detail);
      assert.equal(got.message, DUPLEX_DENIED);
      await within(fake.last().closed, 5000, "the stream closed");
      await settle();
      assert.deepEqual(told, [got], "onError is told once");
      assert.equal(rec.ends.length, 0);
    });
  }

  test("a service that is not listening: AUTHZ_UNREACHABLE", async () => {
    const gone = http.createServer();
    await new Promise<void>((r) => gone.listen(0, "127.0.0.1", r));
    const port = (gone.address() as AddressInfo).port;
    await new Promise((r) => gone.close(r));
    const rec = recorder();
    const got = await gateError(() => watchDuplexGrant(req, { baseUrl: `http://127.0.0.1:${port}`, onRevoke: rec.onRevoke }));
    assert.equal(got.code, "AUTHZ_UNREACHABLE");
    assert.equal(got.message, DUPLEX_DENIED);
  });

  test("a request that cannot be sent (a token that is no header value): AUTHZ_UNREACHABLE, no crash", async () => {
    const rec = recorder();
    const got = await gateError(() => watchDuplexGrant(req, { baseUrl, token: "a\nb", onRevoke: rec.onRevoke }));
    assert.equal(got.code, "AUTHZ_UNREACHABLE");
    assert.equal(got.message, DUPLEX_DENIED);
    // The gate fails the same way, and leaves no time-out behind.
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
    const before = timers();
    const gateErr = await gateError(() => openDuplexChannelGate(req, { baseUrl, token: "a\nb", timeoutMs: 60_000 }));
    assert.equal(gateErr.code, "AUTHZ_UNREACHABLE");
    assert.equal(timers(), before, "the call's time-out is cleared");
  });

  test("handlers that can never work are a TypeError", async () => {
    await assert.rejects(watchDuplexGrant(req, { baseUrl } as unknown as WatchOptions), TypeError);
    await assert.rejects(watchDuplexGrant(req, { baseUrl, onRevoke: "close" } as unknown as WatchOptions), TypeError);
    await assert.rejects(watchDuplexGrant(req, { baseUrl, onRevoke: () => {}, onUpdate: 1 } as unknown as WatchOptions), TypeError);
    await assert.rejects(watchDuplexGrant(req, { baseUrl: "ftp://x", onRevoke: () => {} }), TypeError);
    const client = createAuthzClient({ baseUrl });
    await assert.rejects(client.watchDuplexGrant(req, {} as unknown as WatchOptions), TypeError, "a rejection, as every call of the client");
  });
});

describe("a grant being watched", { timeout: 60_000 }, () => {
  test("update events go to onUpdate and the grant goes on; a revoke then ends it", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant));
    };
    const rec = recorder();
    const { grant: g, w } = await granted(rec);
    const second = { ...update, revision: "sha256:three" };
    w.res.write(event("update", update) + ": ping\n\n" + event("update", second));
    for (const deadline = Date.now() + 5000; rec.updates.length < 2 && Date.now() < deadline; ) await new Promise((r) => setTimeout(r, 5));
    assert.deepEqual(rec.updates, [asDecision(update), asDecision(second)]);
    assert.equal(rec.ends.length, 0);
    assert.equal(g.ended, false);
    w.res.write(event("revoke", deny(["worker_not_running"])));
    assert.deepEqual(await rec.ended(), asDecision(deny(["worker_not_running"])));
    await within(w.closed, 5000, "the stream closed");
    await settle();
    assert.equal(rec.ends.length, 1);
    assert.equal(g.ended, true);
  });

  for (const reason of ["worker_not_running", "plugin_not_ready", "capability_not_declared", "service_stopping", "evaluation_failed"]) {
    test(`a revoke (${reason}) calls onRevoke once with the deny document, and the client closes the stream`, async () => {
      const doc = deny([reason]);
      fake.watch = (w) => {
        w.open();
        w.res.write(event("decision", grant));
        // The revoke, and then what a server must not send: the client has already let go.
        setImmediate(() => w.res.write(event("revoke", doc) + event("update", update) + event("revoke", deny(["x"]))));
      };
      const rec = recorder();
      const { grant: g, w } = await granted(rec);
      assert.deepEqual(await rec.ended(), asDecision(doc));
      await within(w.closed, 5000, "the stream closed by the client");
      w.res.end();
      await settle();
      assert.equal(rec.ends.length, 1, "onRevoke exactly once");
      assert.equal(rec.updates.length, 0, "nothing after a revoke");
      assert.equal(g.ended, true);
    });
  }

  test("an update that denies ends the grant like a revoke", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant));
      setImmediate(() => w.res.write(event("update", deny(["plugin_not_ready"]))));
    };
    const rec = recorder();
    const { w } = await granted(rec);
    assert.deepEqual(await rec.ended(), asDecision(deny(["plugin_not_ready"])));
    await within(w.closed, 5000, "the stream closed");
    await settle();
    assert.equal(rec.ends.length, 1);
  });

  test("the stream closed without a revoke ends the grant: AUTHZ_UNREACHABLE", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant));
      setImmediate(() => w.res.end(": ping\n\n"));
    };
    const rec = recorder();
    const told: AuthzGateError[] = [];
    const { grant: g, w } = await granted(rec, { onError: (e) => told.push(e) });
    const e = await endedOnceWith(rec, w, "AUTHZ_UNREACHABLE");
    assert.deepEqual(told, [e], "onError is told of the lost grant");
    assert.equal(g.ended, true);
  });

  test("the service killed (its socket destroyed) ends the grant: AUTHZ_UNREACHABLE", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant) + "event: update\ndata: {\"allow\"", () => w.res.socket?.destroy());
    };
    const rec = recorder();
    const { w } = await granted(rec);
    await endedOnceWith(rec, w, "AUTHZ_UNREACHABLE");
    assert.equal(rec.updates.length, 0, "the half-sent update is not one");
  });

  test("no event or ping within twice the ping interval ends the grant: AUTHZ_TIMEOUT", async () => {
    fake.watch = (w) => {
      w.open({ "x-authz-ping-interval": "100" });
      w.res.write(event("decision", grant));
    };
    const rec = recorder();
    const { w } = await granted(rec);
    const e = await endedOnceWith(rec, w, "AUTHZ_TIMEOUT");
    assert.match(e.detail, /200 ms/);
  });

  test("pings keep the grant for longer than twice the interval; when they stop, it ends", async () => {
    // Interval 500 ms: the grant must survive 30 pings 50 ms apart (1.5 s, three deadlines).
    const PINGS = 30;
    let sent = 0;
    fake.watch = (w) => {
      w.open({ "x-authz-ping-interval": "500" });
      w.res.write(event("decision", grant));
      const t = setInterval(() => {
        w.res.write(": ping\n\n");
        if (++sent === PINGS) clearInterval(t);
      }, 50);
      w.closed.then(() => clearInterval(t));
    };
    const rec = recorder();
    const { w } = await granted(rec);
    const e = await endedOnceWith(rec, w, "AUTHZ_TIMEOUT");
    assert.equal(sent, PINGS, `the grant ended after ${sent} of ${PINGS} pings: ${e.detail}`);
  });

  test("bytes that never complete a line do not keep the grant: AUTHZ_TIMEOUT", async () => {
    // Interval 100 ms: one byte every 20 ms, 200 bytes, no line end.
    const BYTES = 200;
    let sent = 0;
    fake.watch = (w) => {
      w.open({ "x-authz-ping-interval": "100" });
      w.res.write(event("decision", grant));
      const t = setInterval(() => {
        w.res.write("x");
        if (++sent === BYTES) clearInterval(t);
      }, 20);
      w.closed.then(() => clearInterval(t));
    };
    const rec = recorder();
    const { w } = await granted(rec);
    await endedOnceWith(rec, w, "AUTHZ_TIMEOUT");
    assert.ok(sent < BYTES, `the grant outlived the drip of ${sent} bytes`);
  });

  const bad: Array<{ name: string; send: string | Buffer }> = [
    { name: "an update that is not JSON", send: event("update", "{\"allow\": tru") },
    { name: "an update whose allow is the string \"true\"", send: event("update", { ...update, allow: "true" }) },
    { name: "an update without the duplex capability", send: event("update", { ...update, capabilities: allFalse }) },
    { name: "an update of another watch", send: event("update", { ...update, watch_id: "another" }) },
    { name: "an update that denies with a code outside the contract", send: event("update", { ...deny(["x"]), code: "NOPE" }) },
    { name: "a revoke that allows", send: event("revoke", update) },
    { name: "a revoke that is not a decision", send: event("revoke", { code: "SERVICE_STOPPING" }) },
    { name: "a second decision event", send: event("decision", update) },
    { name: "an event the protocol does not know", send: event("suspend", update) },
    { name: "data without an event name", send: `data: ${JSON.stringify(update)}\n\n` },
    { name: "an update without data", send: "event: update\n\n" },
    { name: "bytes that are not UTF-8", send: Buffer.concat([Buffer.from("event: update\ndata: "), Buffer.from([0xc3, 0x28]), Buffer.from("\n\n")]) },
    { name: "a line over the bound, never ended", send: "data: " + "x".repeat(MAX_EVENT_BYTES + 1) },
    { name: "data lines over the bound in one event", send: `data: ${"x".repeat(MAX_EVENT_BYTES / 2)}\n`.repeat(3) },
  ];
  for (const c of bad) {
    test(`a malformed event ends the grant: ${c.name}`, async () => {
      fake.watch = (w) => {
        w.open();
        w.res.write(event("decision", grant));
        setImmediate(() => w.res.write(c.send));
      };
      const rec = recorder();
      const { grant: g, w } = await granted(rec);
      await endedOnceWith(rec, w, "AUTHZ_MALFORMED_ANSWER");
      assert.equal(rec.updates.length, 0);
      assert.equal(g.ended, true);
    });
  }

  test("a stream sent one byte at a time, with CRLF, CR, comments, fields and multi-line data, reads the same", async () => {
    const script =
      "\uFEFF: hello\r\n\r\n" +
      `event: decision\r\ndata: ${JSON.stringify(grant)}\r\n\r\n` +
      `: ping\rid: 7\rretry: 10\revent:update\rdata:${JSON.stringify(update, null, 1).replaceAll("\n", "\rdata: ")}\r\r` +
      `event: update\ndata: ${JSON.stringify({ ...update, revision: "sha256:é✓🙂" })}\n\n` +
      event("revoke", deny(["capability_not_declared"]));
    const bytes = Buffer.from(script);
    let written = 0;
    fake.watch = (w) => {
      w.res.socket?.setNoDelay(true);
      w.open();
      const next = () => {
        if (written === bytes.length) return;
        w.res.write(bytes.subarray(written, written + 1), () => setImmediate(next));
        written++;
      };
      next();
    };
    const rec = recorder();
    const { grant: g, w } = await granted(rec);
    assert.equal(g.decision_id, grant.decision_id);
    assert.deepEqual(await rec.ended(), asDecision(deny(["capability_not_declared"])));
    assert.deepEqual(rec.updates, [asDecision(update), asDecision({ ...update, revision: "sha256:é✓🙂" })]);
    await within(w.closed, 5000, "the stream closed");
    await settle();
    assert.equal(rec.ends.length, 1);
    assert.equal(written, bytes.length);
  });
});

describe("the caller's own end", { timeout: 60_000 }, () => {
  test("aborting the signal after the grant closes the stream and calls no onRevoke", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant));
    };
    const rec = recorder();
    const ctl = new AbortController();
    const { grant: g, w } = await granted(rec, { signal: ctl.signal });
    ctl.abort();
    await within(w.closed, 5000, "the stream closed");
    w.res.end(event("revoke", deny(["worker_not_running"])));
    await settle();
    assert.equal(g.ended, true);
    assert.equal(rec.ends.length, 0);
  });

  test("the client's own signal ends its watches too", async () => {
    const rec = recorder();
    const ctl = new AbortController();
    const client = createAuthzClient({ baseUrl, signal: ctl.signal });
    const g = await client.watchDuplexGrant(req, { onRevoke: rec.onRevoke });
    ctl.abort();
    await within(fake.last().closed, 5000, "the stream closed");
    await settle();
    assert.equal(g.ended, true);
    assert.equal(rec.ends.length, 0);
    client.close();
  });

  test("Symbol.asyncDispose closes the stream", async () => {
    const rec = recorder();
    const { grant: g, w } = await granted(rec);
    await g[Symbol.asyncDispose]();
    await within(w.closed, 5000, "the stream closed");
    await settle();
    assert.equal(rec.ends.length, 0);
  });

  test("a signal aborted before or during the start throws AUTHZ_ABORTED", async () => {
    const rec = recorder();
    const before = await gateError(() => watchDuplexGrant(req, { baseUrl, signal: AbortSignal.abort(), onRevoke: rec.onRevoke }));
    assert.equal(before.code, "AUTHZ_ABORTED");
    fake.watch = (w) => w.open(); // no first decision
    const ctl = new AbortController();
    const during = watchDuplexGrant(req, { baseUrl, signal: ctl.signal, onRevoke: rec.onRevoke });
    for (const deadline = Date.now() + 5000; fake.watches.length === 0 || fake.last().res.headersSent === false; ) {
      assert.ok(Date.now() < deadline, "the watch did not arrive");
      await new Promise((r) => setTimeout(r, 5));
    }
    ctl.abort();
    const err = await gateError(() => during);
    assert.equal(err.code, "AUTHZ_ABORTED");
    assert.equal(err.message, DUPLEX_DENIED);
    await within(fake.last().closed, 5000, "the stream closed");
    assert.equal(rec.ends.length, 0);
  });

  test("what onRevoke and onUpdate throw changes nothing", async () => {
    fake.watch = (w) => {
      w.open();
      w.res.write(event("decision", grant));
      setImmediate(() => w.res.write(event("update", update) + event("revoke", deny(["worker_not_running"]))));
    };
    let revokes = 0;
    let updates = 0;
    const g = await watchDuplexGrant(req, {
      baseUrl,
      onUpdate: () => {
        updates++;
        throw new Error("update handler failed");
      },
      onRevoke: () => {
        revokes++;
        throw new Error("revoke handler failed");
      },
    });
    await within(fake.last().closed, 5000, "the stream closed");
    await settle();
    assert.equal(updates, 1);
    assert.equal(revokes, 1);
    assert.equal(g.ended, true);
  });
});

describe("the event-stream parser", () => {
  const script = Buffer.from(
    "\uFEFF: comment\r\n" +
      "event: decision\r\ndata: {\"a\":\r\ndata:  1}\r\n\r\n" +
      "id: 3\nretry: 5\nunknown: x\nevent:update\ndata\ndata: é✓🙂\n\n" +
      "event: revoke\rdata: {}\r\r" +
      "\n\n: only comments\n\n" +
      "data: last\r\n\r\n" +
      "event: cut\ndata: never dispatched",
  );
  const expected: StreamEvent[] = [
    { event: "decision", data: "{\"a\":\n 1}" },
    { event: "update", data: "\né✓🙂" },
    { event: "revoke", data: "{}" },
    { event: "message", data: "last" },
  ];
  function parse(chunks: Buffer[]): { events: StreamEvent[]; lines: number } {
    const events: StreamEvent[] = [];
    let lines = 0;
    const p = new EventStreamParser((e) => events.push(e), () => lines++);
    for (const c of chunks) p.push(c);
    return { events, lines };
  }

  test("reads events split at every byte, and at every single point", () => {
    const whole = parse([script]);
    assert.deepEqual(whole.events, expected);
    const bytes = [...script].map((b) => Buffer.from([b]));
    assert.deepEqual(parse(bytes), whole);
    for (let i = 1; i < script.length; i++) {
      assert.deepEqual(parse([script.subarray(0, i), script.subarray(i)]), whole, `split at byte ${i}`);
    }
  });

  test("a line or an event over the bound is an error, not memory", () => {
    const p = new EventStreamParser(() => {});
    const chunk = Buffer.alloc(64 * 1024, 0x78);
    assert.throws(() => {
      for (let i = 0; i < 17; i++) p.push(chunk);
    }, StreamFormatError);
    const q = new EventStreamParser(() => {});
    assert.throws(() => {
      for (let i = 0; i < 3; i++) q.push(Buffer.from(`data: ${"x".repeat(MAX_EVENT_BYTES / 2)}\n`));
    }, StreamFormatError);
    const ok = parse([Buffer.from(`data: ${"x".repeat(MAX_EVENT_BYTES - 10)}\n\n`)]);
    assert.equal(ok.events[0]?.data?.length, MAX_EVENT_BYTES - 10);
  });

  test("bytes that are not UTF-8 are an error", () => {
    const p = new EventStreamParser(() => {});
    assert.throws(() => p.push(Buffer.from([0x64, 0x61, 0x74, 0x61, 0x3a, 0xff, 0x0a])), StreamFormatError);
  });
});
