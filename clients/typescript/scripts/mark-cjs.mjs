// dist/cjs holds the CommonJS build: a package.json there makes Node (and TypeScript) read its
// .js and .d.ts files as CommonJS, while the package itself is an ES module.
import { writeFileSync } from "node:fs";

writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), JSON.stringify({ type: "commonjs" }) + "\n");
