// The client against a live `authz serve` built from this repository: one service on a free
// loopback port with a facts file (every decision code), one on a unix socket with the real
// example driver plugin.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  AuthzGateError,
  CAPABILITY_KEYS,
  effectiveSandboxCapabilities,
  openDuplexChannelGate,
  runnerIngressGate,
  type GateRequest,
} from "../src/index.js";
import { buildAuthz, repoRoot, startServe, waitReady, type Service } from "./service.js";

// Fixture F of docs/contract.md (sections 3 and 4), plus a plugin that offers runner ingress.
const facts = {
  plugins: [
    {
      id: "test.plugin", key: "acme.daytona", status: "ready",
      manifest: { environmentDrivers: [{ driverKey: "daytona", kind: "sandbox_provider", sandboxCapabilities: { duplexCommandStream: true } }] },
    },
    {
      id: "runner.plugin", key: "acme.runner", status: "ready",
      manifest: { environmentDrivers: [{ driverKey: "runner", kind: "sandbox_provider", sandboxCapabilities: { runnerWebSocketIngress: true } }] },
    },
  ],
  workers: {
    "test.plugin": { supportedMethods: ["duplexChannelOpen"], configValid: true },
    "runner.plugin": { supportedMethods: ["environmentRunnerIngressEndpoint"] },
  },
  builtinProviders: { fake: { execute: true, supportsReusableLeases: false } },
};

/** Fixture F's request (without operation: the gate sets it), changed by edit. */
function request(edit: (metadata: Record<string, unknown>, r: Record<string, unknown>) => void = () => {}): GateRequest {
  const metadata: Record<string, unknown> = { driver: "sandbox", sandboxProviderPlugin: true, pluginId: "test.plugin", provider: "daytona" };
  const r: Record<string, unknown> = {
    environment: { id: "env-1", driver: "sandbox", config: { provider: "daytona" } },
    lease: { id: "lease-1", companyId: "company-1", leasePolicy: "ephemeral", providerLeaseId: "provider-lease-1", metadata },
    command: ["sh", "-c", "echo hi"],
  };
  edit(metadata, r);
  return r;
}

const DUPLEX_DENIED = "Sandbox lease does not grant the duplex command stream capability.";
const INGRESS_DENIED = "Sandbox lease does not grant runner WebSocket ingress.";

let work: string;
let tcp: Service;
let unix: Service;
let bin: string;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "authz-client-"));
  bin = await buildAuthz(work);
  const factsFile = join(work, "facts.json");
  await writeFile(factsFile, JSON.stringify(facts));
  [tcp, unix] = await Promise.all([
    startServe(bin, ["--addr", "127.0.0.1:0", "--facts", factsFile]),
    startServe(bin, ["--addr", `unix://${join(work, "authz.sock")}`]),
  ]);
  await Promise.all([waitReady(tcp.baseUrl), waitReady(unix.baseUrl)]);
}, { timeout: 600_000 });

after(async () => {
  await Promise.all([tcp?.stop(), unix?.stop()]);
  if (work) await rm(work, { recursive: true, force: true });
});

/** Runs fn and returns the AuthzGateError it must throw. */
async function gateError(fn: () => Promise<unknown>): Promise<AuthzGateError> {
  try {
    await fn();
  } catch (err) {
    assert.ok(err instanceof AuthzGateError, `expected an AuthzGateError, got ${String(err)}`);
    assert.ok(err instanceof Error);
    return err;
  }
  assert.fail("the gate resolved; it must throw");
}

describe("live authz serve on a loopback port", () => {
  test("grant: openDuplexChannelGate resolves with the decision", async () => {
    const doc = await openDuplexChannelGate(request(), { baseUrl: tcp.baseUrl });
    assert.equal(doc.allow, true);
    assert.equal(doc.code, "");
    assert.deepEqual(doc.reasons, []);
    assert.equal(doc.capabilities.duplexCommandStream, true);
    assert.match(doc.decision_id, /^[0-9a-f-]{36}$/);
    assert.match(doc.revision, /^sha256:/);
  });

  test("grant: runnerIngressGate resolves for a plugin that offers runner ingress", async () => {
    const doc = await runnerIngressGate(request((m) => { m["pluginId"] = "runner.plugin"; m["provider"] = "runner"; }), { baseUrl: tcp.baseUrl });
    assert.equal(doc.allow, true);
    assert.equal(doc.capabilities.runnerWebSocketIngress, true);
  });

  const denies: Array<{ name: string; gate: typeof openDuplexChannelGate; req: GateRequest; code: string; message: string; reasons: string[] }> = [
    {
      name: "DUPLEX_CHANNEL_CAPABILITY_DENIED: the lease pins a plugin that is not installed",
      gate: openDuplexChannelGate, req: request((m) => { m["pluginId"] = "missing.plugin"; }),
      code: "DUPLEX_CHANNEL_CAPABILITY_DENIED", message: DUPLEX_DENIED, reasons: ["plugin_not_found"],
    },
    {
      name: "DUPLEX_CHANNEL_CAPABILITY_DENIED: the plugin neither implements nor declares the stream",
      gate: openDuplexChannelGate, req: request((m) => { m["provider"] = "runner"; m["pluginId"] = "runner.plugin"; }),
      code: "DUPLEX_CHANNEL_CAPABILITY_DENIED", message: DUPLEX_DENIED, reasons: ["method_not_verified", "capability_not_declared"],
    },
    {
      name: "DUPLEX_CHANNEL_UNSUPPORTED: the local driver",
      gate: openDuplexChannelGate, req: request((m) => { m["driver"] = "local"; }),
      code: "DUPLEX_CHANNEL_UNSUPPORTED", message: 'Environment driver "local" does not support duplex channels.', reasons: ["operation_unsupported_by_driver"],
    },
    {
      name: "ENVIRONMENT_DRIVER_NOT_REGISTERED: an unknown driver",
      gate: openDuplexChannelGate, req: request((m) => { m["driver"] = "foo"; }),
      code: "ENVIRONMENT_DRIVER_NOT_REGISTERED", message: 'Environment driver "foo" is not registered in the environment runtime yet.', reasons: ["driver_not_registered"],
    },
    {
      name: "RUNNER_INGRESS_CAPABILITY_DENIED: the plugin neither implements nor declares it",
      gate: runnerIngressGate, req: request(),
      code: "RUNNER_INGRESS_CAPABILITY_DENIED", message: INGRESS_DENIED, reasons: ["method_not_verified", "capability_not_declared"],
    },
    {
      name: "RUNNER_INGRESS_UNSUPPORTED: the plugin driver has the capability but not the operation",
      gate: runnerIngressGate, req: request((m) => { m["driver"] = "plugin"; m["pluginId"] = "runner.plugin"; m["driverKey"] = "runner"; }),
      code: "RUNNER_INGRESS_UNSUPPORTED", message: 'Environment driver "plugin" does not support runner ingress.', reasons: ["operation_unsupported_by_driver"],
    },
    {
      name: "ENVIRONMENT_DRIVER_NOT_REGISTERED on the runner ingress gate",
      gate: runnerIngressGate, req: request((m) => { m["driver"] = "Sandbox"; }),
      code: "ENVIRONMENT_DRIVER_NOT_REGISTERED", message: 'Environment driver "Sandbox" is not registered in the environment runtime yet.', reasons: ["driver_not_registered"],
    },
  ];
  for (const c of denies) {
    test(`deny ${c.name}`, async () => {
      const err = await gateError(() => c.gate(c.req, { baseUrl: tcp.baseUrl }));
      assert.equal(err.message, c.message);
      assert.equal(err.code, c.code);
      assert.deepEqual(err.reasons, c.reasons);
      assert.match(err.decisionId, /^[0-9a-f-]{36}$/);
      assert.equal(err.status, 200);
    });
  }

  test("effectiveSandboxCapabilities: the nine booleans of the lease", async () => {
    const caps = await effectiveSandboxCapabilities(request(), { baseUrl: tcp.baseUrl });
    assert.ok(caps !== null);
    assert.deepEqual(Object.keys(caps).sort(), [...CAPABILITY_KEYS].sort());
    assert.equal(caps.duplexCommandStream, true);
    assert.equal(caps.persistentProcessSessions, false);
    const denied = await effectiveSandboxCapabilities(request((m) => { m["driver"] = "local"; }), { baseUrl: tcp.baseUrl });
    assert.ok(denied !== null);
    assert.ok(Object.values(denied).every((v) => v === false));
  });

  test("a bad request is a 400, not a decision: the gate throws AUTHZ_BAD_STATUS, capabilities are null", async () => {
    const bad = request((_, r) => { r["lease"] = null; });
    const err = await gateError(() => openDuplexChannelGate(bad, { baseUrl: tcp.baseUrl }));
    assert.equal(err.code, "AUTHZ_BAD_STATUS");
    assert.equal(err.status, 400);
    assert.equal(err.message, DUPLEX_DENIED);
    assert.match(err.detail, /lease must be an object/);
    assert.equal(await effectiveSandboxCapabilities(bad, { baseUrl: tcp.baseUrl }), null);
  });

  test("a bearer token is accepted by a service that does not ask for one", async () => {
    const doc = await openDuplexChannelGate(request(), { baseUrl: tcp.baseUrl, token: "t0ken" });
    assert.equal(doc.allow, true);
  });
});

describe("live authz serve on a unix socket, with the example driver as a real plugin", () => {
  test("examples/grant.json is granted, examples/deny.json denied", async () => {
    const root = repoRoot();
    const grant = JSON.parse(await readFile(join(root, "examples/grant.json"), "utf8")) as GateRequest;
    const deny = JSON.parse(await readFile(join(root, "examples/deny.json"), "utf8")) as GateRequest;
    assert.match(unix.baseUrl, /^unix:\/\//);
    const doc = await openDuplexChannelGate(grant, { baseUrl: unix.baseUrl });
    assert.equal(doc.allow, true);
    const caps = await effectiveSandboxCapabilities(grant, { baseUrl: unix.baseUrl });
    assert.equal(caps?.duplexCommandStream, true);
    const err = await gateError(() => openDuplexChannelGate(deny, { baseUrl: unix.baseUrl }));
    assert.equal(err.code, "DUPLEX_CHANNEL_CAPABILITY_DENIED");
    assert.equal(err.message, DUPLEX_DENIED);
  });
});

describe("service down", () => {
  test("nothing listens on the port: the gate throws AUTHZ_UNREACHABLE, capabilities are null", async () => {
    // A port that was free a moment ago and on which nothing listens now.
    const port = await new Promise<number>((res) => {
      const s = createServer().listen(0, "127.0.0.1", () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => res(p));
      });
    });
    const baseUrl = `http://127.0.0.1:${port}`;
    const err = await gateError(() => openDuplexChannelGate(request(), { baseUrl }));
    assert.equal(err.code, "AUTHZ_UNREACHABLE");
    assert.equal(err.message, DUPLEX_DENIED);
    assert.deepEqual(err.reasons, []);
    assert.equal(err.decisionId, "");
    assert.equal(await effectiveSandboxCapabilities(request(), { baseUrl }), null);
    const ingress = await gateError(() => runnerIngressGate(request(), { baseUrl }));
    assert.equal(ingress.message, INGRESS_DENIED);
  });

  test("a stopped service: the same client that was granted now fails closed", async () => {
    const factsFile = join(work, "facts.json");
    const svc = await startServe(bin, ["--addr", "127.0.0.1:0", "--facts", factsFile]);
    await waitReady(svc.baseUrl);
    assert.equal((await openDuplexChannelGate(request(), { baseUrl: svc.baseUrl })).allow, true);
    await svc.stop();
    const err = await gateError(() => openDuplexChannelGate(request(), { baseUrl: svc.baseUrl }));
    assert.equal(err.code, "AUTHZ_UNREACHABLE");
    assert.equal(await effectiveSandboxCapabilities(request(), { baseUrl: svc.baseUrl }), null);
  });
});
