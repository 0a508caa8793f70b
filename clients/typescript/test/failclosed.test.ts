// The client against local Node servers that misbehave: slow, malformed, lying, and one that
// asks for a TLS client certificate. Every one of them fails closed.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import * as http from "node:http";
import * as https from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import { promisify } from "node:util";

import {
  AuthzGateError,
  createAuthzClient,
  effectiveSandboxCapabilities,
  openDuplexChannelGate,
  runnerIngressGate,
  type AuthzClientOptions,
  type SandboxCapabilities,
} from "../src/index.js";

const DUPLEX_DENIED = "Sandbox lease does not grant the duplex command stream capability.";
const req = { environment: { id: "env-1" }, lease: { id: "lease-1" }, command: ["true"] };

const allFalse = {
  reusableLeases: false, nativeSyncIn: false, nativeSyncOut: false, persistentProcessSessions: false,
  independentControlCommands: false, incrementalSessionOutput: false, concurrentSyncOperations: false,
  duplexCommandStream: false, runnerWebSocketIngress: false,
};
const grant = {
  allow: true, code: "", message: "", reasons: [], capabilities: { ...allFalse, duplexCommandStream: true },
  decision_id: "00000000-0000-0000-0000-000000000001", revision: "sha256:test",
};
const deny = {
  allow: false, code: "DUPLEX_CHANNEL_CAPABILITY_DENIED", message: DUPLEX_DENIED, reasons: ["plugin_not_found"],
  capabilities: allFalse, decision_id: "00000000-0000-0000-0000-000000000002", revision: "sha256:test",
};

interface Seen { method?: string; url?: string; headers?: http.IncomingHttpHeaders; body?: string }

/** A loopback server whose answer the test sets; it records the last request. */
class FakeService {
  answer: (res: http.ServerResponse) => void = (res) => json(res, 200, grant);
  seen: Seen = {};
  readonly server: http.Server;
  constructor(server?: http.Server) {
    this.server = server ?? http.createServer();
    this.server.on("request", (rq: http.IncomingMessage, res: http.ServerResponse) => {
      let body = "";
      rq.on("data", (c) => (body += c));
      rq.on("end", () => {
        this.seen = { method: rq.method ?? "", url: rq.url ?? "", headers: rq.headers, body };
        this.answer(res);
      });
    });
  }
  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", r));
    const scheme = this.server instanceof https.Server ? "https" : "http";
    return `${scheme}://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
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

async function gateError(fn: () => Promise<unknown>): Promise<AuthzGateError> {
  try {
    await fn();
  } catch (err) {
    assert.ok(err instanceof AuthzGateError, `expected an AuthzGateError, got ${String(err)}`);
    return err;
  }
  assert.fail("the gate resolved; it must throw");
}

let fake: FakeService;
let baseUrl: string;
before(async () => {
  fake = new FakeService();
  baseUrl = await fake.listen();
});
after(() => fake.close());

describe("answers that are not a well-formed decision", () => {
  // caps: what effectiveSandboxCapabilities reads from the same answer (it needs only status 200
  // and nine booleans under "capabilities").
  const cases: Array<{ name: string; answer: (res: http.ServerResponse) => void; code: string; status?: number | undefined; caps?: SandboxCapabilities }> = [
    { name: "not JSON", answer: (res) => json(res, 200, "<html>ok</html>"), code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "empty body", answer: (res) => json(res, 200, ""), code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "a JSON array", answer: (res) => json(res, 200, [grant]), code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "allow is the string \"true\"", answer: (res) => json(res, 200, { ...grant, allow: "true" }), code: "AUTHZ_MALFORMED_ANSWER", caps: grant.capabilities },
    { name: "allow is 1", answer: (res) => json(res, 200, { ...grant, allow: 1 }), code: "AUTHZ_MALFORMED_ANSWER", caps: grant.capabilities },
    { name: "only {\"allow\": true}", answer: (res) => json(res, 200, { allow: true }), code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "a capability that is not a boolean", answer: (res) => json(res, 200, { ...grant, capabilities: { ...grant.capabilities, nativeSyncIn: "false" } }), code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "eight capabilities", answer: (res) => { const { runnerWebSocketIngress: _, ...eight } = grant.capabilities; json(res, 200, { ...grant, capabilities: eight }); }, code: "AUTHZ_MALFORMED_ANSWER" },
    { name: "a grant without the duplex capability", answer: (res) => json(res, 200, { ...grant, capabilities: allFalse }), code: "AUTHZ_MALFORMED_ANSWER", caps: allFalse },
    { name: "a grant with a code", answer: (res) => json(res, 200, { ...grant, code: "DUPLEX_CHANNEL_CAPABILITY_DENIED" }), code: "AUTHZ_MALFORMED_ANSWER", caps: grant.capabilities },
    { name: "a deny with a code outside the contract", answer: (res) => json(res, 200, { ...deny, code: "NOPE" }), code: "AUTHZ_MALFORMED_ANSWER", caps: allFalse },
    { name: "a deny with the runner ingress code on the duplex gate", answer: (res) => json(res, 200, { ...deny, code: "RUNNER_INGRESS_CAPABILITY_DENIED", message: "Sandbox lease does not grant runner WebSocket ingress." }), code: "AUTHZ_MALFORMED_ANSWER", caps: allFalse },
    { name: "a deny whose message is not the contract's", answer: (res) => json(res, 200, { ...deny, message: "no" }), code: "AUTHZ_MALFORMED_ANSWER", caps: allFalse },
    { name: "a deny without a code", answer: (res) => json(res, 200, { ...deny, code: "" }), code: "AUTHZ_MALFORMED_ANSWER", caps: allFalse },
    { name: "reasons that are not strings", answer: (res) => json(res, 200, { ...deny, reasons: [1] }), code: "AUTHZ_MALFORMED_ANSWER", caps: allFalse },
    { name: "an answer over 1 MiB", answer: (res) => json(res, 200, { ...grant, pad: "x".repeat(2 << 20) }), code: "AUTHZ_MALFORMED_ANSWER", status: undefined },
    { name: "a grant with status 201", answer: (res) => json(res, 201, grant), code: "AUTHZ_BAD_STATUS", status: 201 },
    { name: "a grant with status 500", answer: (res) => json(res, 500, grant), code: "AUTHZ_BAD_STATUS", status: 500 },
    { name: "a 404 error", answer: (res) => json(res, 404, { code: "NOT_FOUND", message: "no such endpoint" }), code: "AUTHZ_BAD_STATUS", status: 404 },
    { name: "a 503 with allow false", answer: (res) => json(res, 503, { code: "DECISION_LOG_UNAVAILABLE", message: "log", allow: false }), code: "AUTHZ_BAD_STATUS", status: 503 },
    { name: "the connection is cut before an answer", answer: (res) => res.socket?.destroy(), code: "AUTHZ_UNREACHABLE", status: undefined },
  ];
  for (const c of cases) {
    test(c.name, async () => {
      fake.answer = c.answer;
      const err = await gateError(() => openDuplexChannelGate(req, { baseUrl }));
      assert.equal(err.code, c.code);
      assert.equal(err.message, DUPLEX_DENIED);
      assert.equal(err.status, "status" in c ? c.status : 200);
      assert.deepEqual(await effectiveSandboxCapabilities(req, { baseUrl }), c.caps ?? null);
    });
  }

  test("an evaluation failure (500 with the fail-closed deny) keeps the service's reasons, id and failure code", async () => {
    fake.answer = (res) => json(res, 500, { ...deny, reasons: ["evaluation_failed"] }, { "X-Authz-Error": "EVAL_TIMEOUT" });
    const err = await gateError(() => openDuplexChannelGate(req, { baseUrl }));
    assert.equal(err.code, "AUTHZ_BAD_STATUS");
    assert.equal(err.message, DUPLEX_DENIED);
    assert.equal(err.status, 500);
    assert.equal(err.authzError, "EVAL_TIMEOUT");
    assert.deepEqual(err.reasons, ["evaluation_failed"]);
    assert.equal(err.decisionId, deny.decision_id);
    assert.equal(await effectiveSandboxCapabilities(req, { baseUrl }), null);
  });
});

describe("what the client sends", () => {
  test("POST /v1/authorize with the operation and the request as JSON, no Authorization without a token", async () => {
    fake.answer = (res) => json(res, 200, grant);
    await openDuplexChannelGate(req, { baseUrl });
    assert.equal(fake.seen.method, "POST");
    assert.equal(fake.seen.url, "/v1/authorize");
    assert.equal(fake.seen.headers?.["content-type"], "application/json");
    assert.equal(fake.seen.headers?.["authorization"], undefined);
    assert.deepEqual(JSON.parse(fake.seen.body ?? ""), { ...req, operation: "openDuplexChannel" });
  });

  test("runnerIngressGate sends getRunnerIngressEndpoint; effectiveSandboxCapabilities asks /v1/capabilities", async () => {
    fake.answer = (res) => json(res, 200, { ...grant, capabilities: { ...allFalse, runnerWebSocketIngress: true } });
    await runnerIngressGate(req, { baseUrl });
    assert.equal(JSON.parse(fake.seen.body ?? "").operation, "getRunnerIngressEndpoint");
    fake.answer = (res) => json(res, 200, { capabilities: { ...allFalse, nativeSyncIn: true }, decision_id: "x", revision: "y" });
    assert.deepEqual(await effectiveSandboxCapabilities(req, { baseUrl }), { ...allFalse, nativeSyncIn: true });
    assert.equal(fake.seen.url, "/v1/capabilities");
  });

  test("a bearer token is sent as Authorization: Bearer; a path prefix in the base URL is kept", async () => {
    fake.answer = (res) => json(res, 200, grant);
    const client = createAuthzClient({ baseUrl: `${baseUrl}/authz/`, token: "s3cret" });
    await client.openDuplexChannelGate(req);
    assert.equal(fake.seen.headers?.["authorization"], "Bearer s3cret");
    assert.equal(fake.seen.url, "/authz/v1/authorize");
  });

});

describe("options", () => {
  test("options that can never work are a TypeError: at creation, and at the call of every function", async () => {
    const bad: Array<[string, AuthzClientOptions]> = [
      ["scheme-less address", { baseUrl: "127.0.0.1:8181" }],
      ["ftp scheme", { baseUrl: "ftp://127.0.0.1" }],
      ["relative unix socket", { baseUrl: "unix://relative.sock" }],
      ["query in the base URL", { baseUrl: "http://127.0.0.1:8181/?x=1" }],
      ["time-out 0", { timeoutMs: 0 }],
      ["negative time-out", { timeoutMs: -1 }],
      ["NaN time-out", { timeoutMs: Number.NaN }],
      ["infinite time-out", { timeoutMs: Number.POSITIVE_INFINITY }],
      ["time-out as a string", { timeoutMs: "5000" as unknown as number }],
      ["onError not a function", { onError: "log" as unknown as () => void }],
    ];
    for (const [name, opts] of bad) {
      assert.throws(() => createAuthzClient(opts), TypeError, name);
      await assert.rejects(openDuplexChannelGate(req, opts), TypeError, name);
      await assert.rejects(runnerIngressGate(req, opts), TypeError, name);
      await assert.rejects(effectiveSandboxCapabilities(req, opts), TypeError, name);
    }
  });

  test("a property set to undefined is its default", async () => {
    fake.answer = (res) => json(res, 200, grant);
    const fromEnv: AuthzClientOptions = { baseUrl: undefined, token: undefined, timeoutMs: undefined, signal: undefined, tls: undefined };
    // The default base URL is port 8181; only baseUrl is set to reach the fake.
    const doc = await openDuplexChannelGate(req, { ...fromEnv, baseUrl });
    assert.equal(doc.allow, true);
    assert.equal(fake.seen.headers?.["authorization"], undefined);
  });
});

describe("onError", () => {
  test("is told once of every call that got no decision, gates and capabilities alike, and not of a deny", async () => {
    const seen: AuthzGateError[] = [];
    const client = createAuthzClient({ baseUrl, onError: (e) => seen.push(e) });
    try {
      fake.answer = (res) => json(res, 503, { code: "SERVICE_OVERLOADED", message: "busy", allow: false });
      const err = await gateError(() => client.openDuplexChannelGate(req));
      assert.equal(seen.length, 1);
      assert.equal(seen[0], err);
      assert.equal(await client.effectiveSandboxCapabilities(req), null);
      assert.equal(seen.length, 2);
      assert.equal(seen[1]?.code, "AUTHZ_BAD_STATUS");
      assert.equal(seen[1]?.status, 503);
      assert.equal(seen[1]?.message, DUPLEX_DENIED);

      fake.answer = (res) => json(res, 200, { capabilities: { nativeSyncIn: true } });
      assert.equal(await client.effectiveSandboxCapabilities(req), null);
      assert.equal(seen[2]?.code, "AUTHZ_MALFORMED_ANSWER");

      fake.answer = (res) => json(res, 200, deny);
      const denied = await gateError(() => client.openDuplexChannelGate(req));
      assert.equal(denied.code, "DUPLEX_CHANNEL_CAPABILITY_DENIED");
      assert.equal(seen.length, 3, "a deny is a decision, not an error");
    } finally {
      client.close();
    }
  });

  test("what the hook throws does not change the answer", async () => {
    fake.answer = (res) => res.socket?.destroy();
    const onError = () => {
      throw new Error("hook failed");
    };
    const err = await gateError(() => openDuplexChannelGate(req, { baseUrl, onError }));
    assert.equal(err.code, "AUTHZ_UNREACHABLE");
    assert.ok(err.cause instanceof Error, "the cause is kept");
    assert.equal(await effectiveSandboxCapabilities(req, { baseUrl, onError }), null);
  });
});

describe("connections", () => {
  let counted: FakeService;
  let countedUrl: string;
  let connections = 0;
  before(async () => {
    counted = new FakeService();
    counted.server.on("connection", () => connections++);
    countedUrl = await counted.listen();
  });
  after(() => counted.close());

  test("calls reuse kept-alive connections; keepAlive: false opens one per call", async () => {
    connections = 0;
    const client = createAuthzClient({ baseUrl: countedUrl });
    try {
      for (let i = 0; i < 50; i++) await client.openDuplexChannelGate(req);
      assert.equal(connections, 1);
    } finally {
      client.close();
    }
    connections = 0;
    for (let i = 0; i < 20; i++) await openDuplexChannelGate(req, { baseUrl: countedUrl, keepAlive: false });
    assert.equal(connections, 20);
  });

  test("a kept-alive connection the service closed under a request is retried once on a new one", async () => {
    connections = 0;
    const client = createAuthzClient({ baseUrl: countedUrl });
    try {
      await client.openDuplexChannelGate(req);
      // The next request on that connection finds it cut before any answer.
      const used = new WeakSet<object>();
      counted.answer = (res) => {
        const sock = res.socket;
        if (sock !== null && !used.has(sock) && connections === 1) {
          used.add(sock);
          sock.destroy();
          return;
        }
        json(res, 200, grant);
      };
      const doc = await client.openDuplexChannelGate(req);
      assert.equal(doc.allow, true);
      assert.equal(connections, 2);
      // A new connection cut under its first request is not retried.
      counted.answer = (res) => res.socket?.destroy();
      const err = await gateError(() => client.openDuplexChannelGate(req));
      assert.equal(err.code, "AUTHZ_UNREACHABLE");
    } finally {
      counted.answer = (res) => json(res, 200, grant);
      client.close();
    }
  });
});

describe("module formats", () => {
  test("the package loads by name with import and with require, with the same API", async () => {
    const esm = (await import("@authz-dev/authz-client")) as Record<string, unknown>;
    const cjs = createRequire(import.meta.url)("@authz-dev/authz-client") as Record<string, unknown>;
    assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
    assert.deepEqual(cjs["CAPABILITY_KEYS"], esm["CAPABILITY_KEYS"]);
    fake.answer = (res) => json(res, 200, deny);
    const gateFn = cjs["openDuplexChannelGate"] as typeof openDuplexChannelGate;
    const ErrorClass = cjs["AuthzGateError"] as typeof AuthzGateError;
    await assert.rejects(gateFn(req, { baseUrl }), (e: unknown) => e instanceof ErrorClass && (e as AuthzGateError).code === "DUPLEX_CHANNEL_CAPABILITY_DENIED");
  });
});

describe("a slow service", () => {
  let stalled: http.ServerResponse[] = [];
  before(() => {
    fake.answer = (res) => { stalled.push(res); }; // never answers
  });
  after(() => {
    for (const r of stalled) r.destroy();
    stalled = [];
  });

  test("the time-out fails closed with AUTHZ_TIMEOUT, and capabilities are null", async () => {
    fake.answer = (res) => { stalled.push(res); };
    const start = Date.now();
    const err = await gateError(() => openDuplexChannelGate(req, { baseUrl, timeoutMs: 200 }));
    const took = Date.now() - start;
    assert.equal(err.code, "AUTHZ_TIMEOUT");
    assert.equal(err.message, DUPLEX_DENIED);
    assert.ok(took >= 190 && took < 5000, `took ${took} ms`);
    assert.equal(await effectiveSandboxCapabilities(req, { baseUrl, timeoutMs: 200 }), null);
  });

  test("an AbortSignal fails closed with AUTHZ_ABORTED, before and during the call", async () => {
    fake.answer = (res) => { stalled.push(res); };
    const err = await gateError(() => openDuplexChannelGate(req, { baseUrl, signal: AbortSignal.abort() }));
    assert.equal(err.code, "AUTHZ_ABORTED");
    const ctl = new AbortController();
    setTimeout(() => ctl.abort(), 100);
    const during = await gateError(() => openDuplexChannelGate(req, { baseUrl, signal: ctl.signal, timeoutMs: 10_000 }));
    assert.equal(during.code, "AUTHZ_ABORTED");
    assert.equal(during.message, DUPLEX_DENIED);
    assert.equal(await effectiveSandboxCapabilities(req, { baseUrl, signal: AbortSignal.timeout(100) }), null);
  });
});

describe("TLS with a client certificate", () => {
  let dir: string;
  let tlsFake: FakeService;
  let tlsUrl: string;
  let peerCN = "";
  const pem: Record<string, string> = {};

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "authz-client-tls-"));
    const sh = (cmd: string) => promisify(execFile)("sh", ["-c", cmd], { cwd: dir, timeout: 60_000 });
    await sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=test-ca -keyout ca.key -out ca.crt");
    for (const [name, ext] of [["server", "subjectAltName=IP:127.0.0.1"], ["client", "extendedKeyUsage=clientAuth"]] as const) {
      await sh(`openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=${name} -keyout ${name}.key -out ${name}.csr`);
      await sh(`printf '%s\\n' '${ext}' > ${name}.ext && openssl x509 -req -in ${name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile ${name}.ext -out ${name}.crt`);
    }
    for (const f of ["ca.crt", "server.crt", "server.key", "client.crt", "client.key"]) pem[f] = await readFile(join(dir, f), "utf8");
    tlsFake = new FakeService(https.createServer({ key: pem["server.key"], cert: pem["server.crt"], ca: pem["ca.crt"], requestCert: true, rejectUnauthorized: true }));
    tlsFake.answer = (res) => {
      peerCN = String((res.req.socket as TLSSocket).getPeerCertificate().subject?.CN ?? "");
      json(res, 200, grant);
    };
    tlsUrl = await tlsFake.listen();
  });
  after(async () => {
    await tlsFake?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test("with the client certificate the call is answered; the server saw the certificate", async () => {
    const opts: AuthzClientOptions = { baseUrl: tlsUrl, tls: { cert: pem["client.crt"]!, key: pem["client.key"]!, ca: pem["ca.crt"]! } };
    const doc = await openDuplexChannelGate(req, opts);
    assert.equal(doc.allow, true);
    assert.equal(peerCN, "client");
  });

  test("without it, or without trusting the service's CA, the call fails closed", async () => {
    const noCert = await gateError(() => openDuplexChannelGate(req, { baseUrl: tlsUrl, tls: { ca: pem["ca.crt"]! } }));
    assert.equal(noCert.code, "AUTHZ_UNREACHABLE");
    const untrusted = await gateError(() => openDuplexChannelGate(req, { baseUrl: tlsUrl, tls: { cert: pem["client.crt"]!, key: pem["client.key"]! } }));
    assert.equal(untrusted.code, "AUTHZ_UNREACHABLE");
    assert.match(untrusted.detail, /certificate/);
  });
});
