// The client against local Node servers that misbehave: slow, malformed, lying, and one that
// asks for a TLS client certificate. Every one of them fails closed.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
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

  test("a base URL that is not http, https or unix fails closed", async () => {
    for (const bad of ["ftp://127.0.0.1", "127.0.0.1:8181", "unix://relative.sock"]) {
      const err = await gateError(() => openDuplexChannelGate(req, { baseUrl: bad }));
      assert.equal(err.code, "AUTHZ_UNREACHABLE", bad);
      assert.equal(await effectiveSandboxCapabilities(req, { baseUrl: bad }), null);
    }
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
