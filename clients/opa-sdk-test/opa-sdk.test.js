// OPA's own TypeScript SDK (@open-policy-agent/opa), unchanged, against a live `authz serve`:
// evaluate() on the decision, on paths inside it and on paths beside it (undefined, as in OPA),
// evaluateBatch() (OPA has no batch API: fallback), evaluateDefault() at POST /.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import * as http from "node:http";
import { join } from "node:path";

import { OPAClient } from "@open-policy-agent/opa";

import { buildAndServe } from "./service.js";

// Fixture F of docs/contract.md (sections 3 and 4).
const facts = {
  plugins: [{
    id: "test.plugin", key: "acme.daytona", status: "ready",
    manifest: { environmentDrivers: [{ driverKey: "daytona", kind: "sandbox_provider", sandboxCapabilities: { duplexCommandStream: true } }] },
  }],
  workers: { "test.plugin": { supportedMethods: ["duplexChannelOpen"], configValid: true } },
};
const grant = {
  operation: "openDuplexChannel",
  environment: { id: "env-1", driver: "sandbox", config: { provider: "daytona" } },
  lease: {
    id: "lease-1", leasePolicy: "ephemeral",
    metadata: { driver: "sandbox", sandboxProviderPlugin: true, pluginId: "test.plugin", provider: "daytona" },
  },
  command: ["sh", "-c", "echo hi"],
};
const deny = structuredClone(grant);
deny.lease.metadata.driver = "local";

let work, svc, opa;
before(async () => {
  work = await mkdtemp(join(tmpdir(), "authz-opa-sdk-"));
  await writeFile(join(work, "facts.json"), JSON.stringify(facts));
  svc = await buildAndServe(work, ["--facts", join(work, "facts.json")]);
  opa = new OPAClient(svc.baseUrl);
}, { timeout: 600_000 });
after(async () => {
  await svc?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

test("evaluate('authz/decision') answers the decision document", async () => {
  const doc = await opa.evaluate("authz/decision", grant);
  assert.equal(doc.allow, true);
  assert.equal(doc.capabilities.duplexCommandStream, true);
  assert.deepEqual(doc.reasons, []);
});

test("evaluate() on paths inside the decision", async () => {
  assert.equal(await opa.evaluate("authz/decision/allow", grant), true);
  assert.equal(await opa.evaluate("authz/decision/allow", deny), false);
  assert.equal(await opa.evaluate("authz/decision/code", deny), "DUPLEX_CHANNEL_UNSUPPORTED");
  assert.equal(await opa.evaluate("authz/decision/message", deny), 'Environment driver "local" does not support duplex channels.');
  assert.deepEqual(await opa.evaluate("authz/decision/reasons", deny), ["operation_unsupported_by_driver"]);
  assert.equal(await opa.evaluate("authz/decision/capabilities/duplexCommandStream", grant), true);
  assert.equal(await opa.evaluate("authz/decision/capabilities/persistentProcessSessions", grant), false);
  const caps = await opa.evaluate("authz/decision/capabilities", grant);
  assert.equal(Object.keys(caps).length, 9);
});

test("evaluate() with fromResult, as OPA users turn a decision into a boolean", async () => {
  const allowed = await opa.evaluate("authz/decision", grant, { fromResult: (r) => r?.allow === true });
  assert.equal(allowed, true);
  const denied = await opa.evaluate("authz/decision", deny, { fromResult: (r) => r?.allow === true });
  assert.equal(denied, false);
});

test("evaluateDefault() is OPA's default decision at POST /: the decision document", async () => {
  const doc = await opa.evaluateDefault(grant);
  assert.equal(doc.allow, true);
  assert.equal(doc.code, "");
  const denied = await opa.evaluateDefault(deny);
  assert.equal(denied.allow, false);
  assert.equal(denied.code, "DUPLEX_CHANNEL_UNSUPPORTED");
});

test("a bad request makes the SDK throw; it never yields a grant", async () => {
  const bad = { ...grant, lease: null };
  await assert.rejects(opa.evaluate("authz/decision/allow", bad), (err) => {
    assert.match(String(err?.message ?? err), /lease must be an object|400/);
    return true;
  });
  await assert.rejects(opa.evaluateDefault(bad));
  await assert.rejects(opa.evaluate("authz/decision/alow", grant));
});

test("a service that never answers: the SDK's sdk.timeoutMs, or an AbortSignal per call, ends the call", async () => {
  const silent = http.createServer(() => {}); // accepts, reads, never answers
  await new Promise((r) => silent.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${silent.address().port}`;
  try {
    // The SDK's per-call timeoutMs is not applied by evaluate(): these two are the ways that work.
    const byClient = new OPAClient(url, { sdk: { timeoutMs: 300 } });
    await assert.rejects(byClient.evaluate("authz/decision", grant), /timed out/i);
    const perCall = new OPAClient(url);
    await assert.rejects(perCall.evaluate("authz/decision", grant, { fetchOptions: { signal: AbortSignal.timeout(300) } }), /timed out|abort/i);
  } finally {
    silent.closeAllConnections();
    await new Promise((r) => silent.close(r));
  }
});

test("evaluate() outside the decision is OPA's undefined document: no result, never a grant", async () => {
  // OPA answers 200 without "result" for a document that is not defined; the SDK yields undefined.
  assert.equal(await opa.evaluate("authz/allow", grant), undefined);
  assert.equal(await opa.evaluate("authz", grant), undefined);
  assert.equal(await opa.evaluate("authz/decisions", grant), undefined);
  // The way OPA users turn a result into a boolean reads undefined as a deny.
  assert.equal(await opa.evaluate("authz/allow", grant, { fromResult: (r) => r === true }), false);
  assert.equal(await opa.evaluate("authz", grant, { fromResult: (r) => r?.decision?.allow === true }), false);
});

test("evaluateBatch(): OPA has no batch API, so without fallback it is OPA's 404, with fallback one decision per input", async () => {
  const inputs = { g: grant, d: deny };
  await assert.rejects(opa.evaluateBatch("authz/decision/allow", inputs), (err) => {
    assert.equal(err?.httpMeta?.response?.status, 404);
    return true;
  });
  const client = new OPAClient(svc.baseUrl);
  // rejectMixed: an answer that is not 200 rejects the batch (without it the SDK turns errors into undefined).
  const strict = { fallback: true, rejectMixed: true };
  const allowed = await client.evaluateBatch("authz/decision/allow", inputs, strict);
  assert.deepEqual(allowed, { g: true, d: false });
  const docs = await client.evaluateBatch("authz/decision", inputs, strict);
  assert.equal(docs.g.allow, true);
  assert.equal(docs.d.code, "DUPLEX_CHANNEL_UNSUPPORTED");
  const outside = await client.evaluateBatch("authz/allow", inputs, strict);
  assert.deepEqual(outside, { g: undefined, d: undefined });
});
