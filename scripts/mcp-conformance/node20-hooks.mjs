// Test harness only (scripts/mcp-conformance.sh). The conformance suite's single
// bundle imports `globSync` from `fs`, which Node gained in 22; Debian 12 ships Node
// 20. The suite uses it only in its results-summary command, never in the server
// scenarios run here, so `fs` is served to that bundle with a stand-in that throws.
export async function resolve(specifier, context, next) {
  if (
    (specifier === 'fs' || specifier === 'node:fs') &&
    context.parentURL?.includes('/@modelcontextprotocol/conformance/')
  ) {
    return { url: new URL('./node20-fs.mjs', import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
