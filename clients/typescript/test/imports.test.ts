// The client's modules import each other without a circle: contract.ts holds the words both the
// one-shot calls (index.ts) and the watch (watch.ts) use, so neither has to import the other back.
import { test } from "node:test";
import * as assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";

const SRC = new URL("../../src/", import.meta.url);

/** The local modules each source file imports (`from "./x.js"`, types included). */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of readdirSync(SRC).filter((f) => f.endsWith(".ts"))) {
    const text = readFileSync(new URL(file, SRC), "utf8");
    const targets = [...text.matchAll(/from\s+"\.\/([^"]+)\.js"/g)].map((m) => `${m[1]}.ts`);
    graph.set(file, targets);
  }
  return graph;
}

/** A circle through the graph, as a list of files, or null. */
function findCircle(graph: Map<string, string[]>): string[] | null {
  const state = new Map<string, "open" | "done">();
  const path: string[] = [];
  const visit = (node: string): string[] | null => {
    if (state.get(node) === "done") return null;
    if (state.get(node) === "open") return [...path.slice(path.indexOf(node)), node];
    state.set(node, "open");
    path.push(node);
    for (const next of graph.get(node) ?? []) {
      const circle = visit(next);
      if (circle) return circle;
    }
    path.pop();
    state.set(node, "done");
    return null;
  };
  for (const node of graph.keys()) {
    const circle = visit(node);
    if (circle) return circle;
  }
  return null;
}

test("the client's modules import each other without a circle", () => {
  const graph = importGraph();
  assert.ok(graph.has("index.ts") && graph.has("watch.ts"), "the sources are where the test looks");
  assert.equal(findCircle(graph), null);
});

test("the circle finder finds a circle", () => {
  const circle = findCircle(new Map([["a.ts", ["b.ts"]], ["b.ts", ["a.ts"]]]));
  assert.deepEqual(circle, ["a.ts", "b.ts", "a.ts"]);
});
