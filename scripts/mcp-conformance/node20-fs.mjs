// See node20-hooks.mjs: `fs` plus a `globSync` that refuses loudly if ever called.
export * from 'node:fs';
export { default } from 'node:fs';
export function globSync() {
  throw new Error('globSync needs Node 22; it is not used by the server scenarios');
}
