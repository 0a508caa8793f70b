// AuthZEN 1.0 interoperability: an enforcement point written from the specification (pep.js)
// against a live `authz serve`, with the request and facts of docs/contract.md (fixture F) in
// the AuthZEN mapping of docs/contract.md, "AuthZEN". No AuthZEN client is published on the
// npm registry this project can reach, so the client is this one, kept to the specification.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { buildAndServe, repoRoot, serve } from "../opa-sdk-test/service.js";
import { discover, PEP } from "./pep.js";

const fixture = join(repoRoot(), "internal", "specexamples");
const request = JSON.parse(await readFile(join(fixture, "request.json"), "utf8"));

/** The AuthZEN form of a request of the contract (section 12): subject = lease, resource = environment. */
function toAuthZEN(req) {
  const { id: leaseId, ...lease } = req.lease;
  const { id: envId, ...env } = req.environment;
  return {
    subject: { type: "lease", id: leaseId, properties: lease },
    resource: { type: "environment", id: envId, properties: env },
    action: { name: req.operation },
    context: { command: req.command },
  };
}

/** Fixture F's request, changed by edit. */
function changed(edit) {
  const r = structuredClone(request);
  edit?.(r);
  return r;
}

const grant = changed();
const unsupported = changed((r) => { r.lease.metadata.driver = "local"; });
const noPlugin = changed((r) => { r.lease.metadata.pluginId = "missing.plugin"; });
const ingress = changed((r) => { r.operation = "getRunnerIngressEndpoint"; });

let work, svc, pep;
before(async () => {
  work = await mkdtemp(join(tmpdir(), "authz-authzen-"));
  svc = await buildAndServe(work, ["--facts", join(fixture, "facts.json")]);
  pep = new PEP(await discover(svc.baseUrl));
}, { timeout: 600_000 });
after(async () => {
  await svc?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

async function authorize(req) {
  const res = await fetch(svc.baseUrl + "/v1/authorize", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req),
    signal: AbortSignal.timeout(5000),
  });
  assert.equal(res.status, 200);
  return res.json();
}

test("metadata: GET /.well-known/authzen-configuration names the endpoints as absolute URLs of the PDP", async () => {
  const meta = pep.meta;
  assert.equal(meta.policy_decision_point, svc.baseUrl);
  assert.equal(meta.access_evaluation_endpoint, svc.baseUrl + "/access/v1/evaluation");
  assert.equal(meta.access_evaluations_endpoint, svc.baseUrl + "/access/v1/evaluations");
  for (const [k, v] of Object.entries(meta)) {
    // Parameters with zero values MUST be omitted.
    assert.ok(v !== null && v !== "" && !(Array.isArray(v) && v.length === 0), `parameter ${k} has no value`);
  }
});

test("Access Evaluation: the contract's fixture F is permitted, with X-Request-ID echoed", async () => {
  const a = await pep.evaluate(toAuthZEN(grant), "bfe9eb29-ab87-4ca3-be83-a1d5d8305716");
  assert.equal(a.status, 200);
  assert.match(a.headers.get("content-type"), /^application\/json/);
  assert.equal(a.headers.get("x-request-id"), "bfe9eb29-ab87-4ca3-be83-a1d5d8305716");
  assert.equal(a.json.decision, true);
  assert.equal(a.permit, true);
  assert.equal(typeof a.json.context, "object", "context is a JSON object");
});

test("Access Evaluation: a denial is 200 with \"decision\": false, never an HTTP error", async () => {
  for (const req of [unsupported, noPlugin, ingress]) {
    const a = await pep.evaluate(toAuthZEN(req));
    assert.equal(a.status, 200, a.text);
    assert.equal(a.json.decision, false);
    assert.equal(a.permit, false);
  }
});

test("Access Evaluation answers what POST /v1/authorize decides for the same request", async () => {
  for (const req of [grant, unsupported, noPlugin, ingress]) {
    const doc = await authorize(req);
    const a = await pep.evaluate(toAuthZEN(req));
    assert.equal(a.json.decision, doc.allow);
    const { allow, decision_id: _a, ...rest } = doc;
    const { decision_id: id, ...context } = a.json.context;
    assert.deepEqual(context, rest);
    assert.match(id, /^[0-9a-f-]{36}$/, "each evaluation is a decision of its own");
  }
});

test("Access Evaluations: the specification's boxcar with top-level defaults, answered in order", async () => {
  const top = toAuthZEN(grant);
  const body = {
    subject: top.subject,
    context: top.context,
    action: { name: "openDuplexChannel" },
    evaluations: [
      { resource: top.resource },
      { resource: toAuthZEN(unsupported).resource, subject: toAuthZEN(unsupported).subject },
      { action: { name: "getRunnerIngressEndpoint" }, resource: top.resource },
    ],
  };
  const a = await pep.evaluations(body, "req-boxcar-1");
  assert.equal(a.status, 200, a.text);
  assert.equal(a.headers.get("x-request-id"), "req-boxcar-1");
  assert.deepEqual(a.permits, [true, false, false]);
  assert.equal(a.json.evaluations.length, 3);
  for (const e of a.json.evaluations) assert.equal(typeof e.decision, "boolean");
  assert.equal(a.json.decision, undefined, "RECOMMENDED: no top-level decision beside evaluations");
});

test("Access Evaluations: the three evaluation semantics", async () => {
  const g = toAuthZEN(grant), d = toAuthZEN(unsupported);
  const evaluations = [g, d, g];
  const run = async (semantic) => (await pep.evaluations({ evaluations, options: { evaluations_semantic: semantic } })).permits;
  assert.deepEqual(await run("execute_all"), [true, false, true]);
  assert.deepEqual((await pep.evaluations({ evaluations })).permits, [true, false, true], "execute_all is the default");
  assert.deepEqual(await run("deny_on_first_deny"), [true, false]);
  assert.deepEqual(await run("permit_on_first_permit"), [true]);
});

test("Access Evaluations without an evaluations array is one Access Evaluation (backwards compatible)", async () => {
  const a = await pep.evaluations(toAuthZEN(grant));
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.decision, true);
});

test("an evaluation of a boxcar that is not a valid request is \"decision\": false with an error in its context", async () => {
  const bad = { ...toAuthZEN(grant), subject: { type: "user", id: "alice@acmecorp.com" } };
  const a = await pep.evaluations({ evaluations: [toAuthZEN(grant), bad] });
  assert.equal(a.status, 200, a.text);
  assert.deepEqual(a.permits, [true, false]);
  assert.equal(a.json.evaluations[1].context.code, "BAD_REQUEST");
});

test("errors: the specification's own example request is 400 with a message, never a permit", async () => {
  // The example of the HTTPS binding: a subject of type user, which this PDP does not decide.
  const example = {
    subject: { type: "user", id: "alice@acmecorp.com" },
    resource: { type: "todo", id: "1" },
    action: { name: "can_read" },
    context: { time: "1985-10-26T01:22-07:00" },
  };
  const a = await pep.evaluate(example);
  assert.equal(a.status, 400, a.text);
  assert.equal(a.permit, false);
  assert.ok(a.text.length > 0, "an error message");
  for (const missing of ["subject", "resource", "action"]) {
    const body = toAuthZEN(grant);
    delete body[missing];
    const m = await pep.evaluate(body);
    assert.equal(m.status, 400, `without ${missing}: ${m.text}`);
    assert.equal(m.permit, false);
  }
});

test("the metadata names the address it was asked on, so it validates for each name of the PDP", async () => {
  const byName = svc.baseUrl.replace("127.0.0.1", "localhost");
  const meta = await discover(byName);
  assert.equal(meta.access_evaluation_endpoint, byName + "/access/v1/evaluation");
});

test("HTTPS binding with Authorization: Bearer: 401 without a token, 403 without the decide scope, the metadata open", async () => {
  const decide = "pep-decide-0123456789abcdef", inspect = "ops-inspect-0123456789abcdef";
  const tokens = join(work, "tokens");
  await writeFile(tokens, `${decide} decide\n${inspect} inspect\n`, { mode: 0o600 });
  const secured = await serve(join(work, "authz"), ["--facts", join(fixture, "facts.json"), "--authentication", "token", "--authentication-tokens-file", tokens]);
  try {
    const meta = await discover(secured.baseUrl); // no token needed to discover
    const body = toAuthZEN(grant);
    const none = await new PEP(meta).evaluate(body);
    assert.equal(none.status, 401, none.text);
    assert.equal(none.permit, false);
    const wrongScope = await new PEP(meta, { headers: { Authorization: `Bearer ${inspect}` } }).evaluate(body);
    assert.equal(wrongScope.status, 403, wrongScope.text);
    assert.equal(wrongScope.permit, false);
    const ok = await new PEP(meta, { headers: { Authorization: `Bearer ${decide}` } }).evaluate(body);
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.permit, true);
    const boxcar = await new PEP(meta).evaluations({ evaluations: [body] });
    assert.equal(boxcar.status, 401, boxcar.text);
    assert.deepEqual(boxcar.permits, []);
  } finally {
    await secured.stop();
  }
});
