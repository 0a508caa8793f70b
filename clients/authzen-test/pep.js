// A minimal AuthZEN 1.0 policy enforcement point, written from the specification (OpenID
// AuthZEN Authorization API 1.0, "Policy Decision Point Metadata" and "HTTPS Binding"), with no
// knowledge of authz: it discovers the endpoints, sends JSON with X-Request-ID, and permits
// only a 200 answer whose "decision" is the boolean true.
import { randomUUID } from "node:crypto";

export class AuthZENError extends Error {
  constructor(message, status, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/** Discovers a PDP from its identifier (a URL) by its metadata, and validates it. */
export async function discover(pdp, { timeoutMs = 5000 } = {}) {
  const res = await fetch(new URL("/.well-known/authzen-configuration", pdp), { signal: AbortSignal.timeout(timeoutMs) });
  if (res.status !== 200) throw new AuthZENError(`metadata: status ${res.status}`, res.status, await res.text());
  if (!String(res.headers.get("content-type")).startsWith("application/json")) throw new AuthZENError("metadata: not application/json", res.status);
  const meta = await res.json();
  // "policy_decision_point" MUST be identical to the identifier the metadata was retrieved
  // from; otherwise the metadata MUST NOT be used.
  if (meta.policy_decision_point !== pdp) throw new AuthZENError(`metadata: policy_decision_point ${meta.policy_decision_point} is not ${pdp}`, 200, meta);
  if (typeof meta.access_evaluation_endpoint !== "string") throw new AuthZENError("metadata: no access_evaluation_endpoint", 200, meta);
  return meta;
}

export class PEP {
  /** meta: the PDP's validated metadata; headers: sent with every request (Authorization). */
  constructor(meta, { headers = {}, timeoutMs = 5000 } = {}) {
    this.meta = meta;
    this.headers = headers;
    this.timeoutMs = timeoutMs;
  }

  async #post(url, body, requestId) {
    const res = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Request-ID": requestId, ...this.headers },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(this.timeoutMs),
    });
    const text = await res.text();
    let json;
    try { json = JSON.parse(text); } catch { /* an error message need not be JSON */ }
    return { status: res.status, headers: res.headers, json, text };
  }

  /** Access Evaluation API: the answer, and permit (true only for 200 with "decision": true). */
  async evaluate(request, requestId = randomUUID()) {
    const a = await this.#post(this.meta.access_evaluation_endpoint, request, requestId);
    return { ...a, permit: a.status === 200 && a.json?.decision === true };
  }

  /** Access Evaluations API: the answer, and one permit per evaluation answered. */
  async evaluations(request, requestId = randomUUID()) {
    if (!this.meta.access_evaluations_endpoint) throw new AuthZENError("the PDP has no access_evaluations_endpoint");
    const a = await this.#post(this.meta.access_evaluations_endpoint, request, requestId);
    const list = a.status === 200 && Array.isArray(a.json?.evaluations) ? a.json.evaluations : [];
    return { ...a, permits: list.map((e) => e?.decision === true) };
  }
}
